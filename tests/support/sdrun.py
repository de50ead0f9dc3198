"""A synthetic SD-like run on the oracle allocator (synth.py) with diffusers-shaped frames, so
attention and sites are recognised; and a duck-typed trace-only analysis. Shared by the HTML,
Markdown and browser tests."""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import numpy as np
import pandas as pd

import synth
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import History, Peak, Summary, TraceAttention, TraceScoreMatrix
from snapviz.load import Run

GiB = 1 << 30
MiB = 1 << 20


# --------------------------------------------------------------------------------------
# A synthetic diffusion run on the reference allocator model (tests/support/synth.py): weights,
# text encoding, denoising steps with attention score matrices, a VAE decode; frames
# shaped like diffusers' so attention and sites are recognised.
# --------------------------------------------------------------------------------------


def _frame(name: str, filename: str, line: int) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


SP = "/usr/lib/python3/site-packages/"
STACKS = {
    "weights": [
        _frame("_apply", SP + "torch/nn/modules/module.py", 900),
        _frame("load_model_dict_into_meta", SP + "diffusers/models/model_loading_utils.py", 231),
        _frame("from_pretrained", SP + "diffusers/pipelines/pipeline_utils.py", 812),
        _frame("<module>", "/home/u/run_sd.py", 12),
    ],
    "text": [
        _frame("forward", SP + "transformers/models/clip/modeling_clip.py", 310),
        _frame("encode_prompt", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 420),
        _frame("__call__", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 960),
        _frame("<module>", "/home/u/run_sd.py", 20),
    ],
    "act": [
        _frame("forward", SP + "diffusers/models/resnet.py", 372),
        _frame("_call_impl", SP + "torch/nn/modules/module.py", 1750),
        _frame("forward", SP + "diffusers/models/unets/unet_2d_blocks.py", 1281),
        _frame("forward", SP + "diffusers/models/unets/unet_2d_condition.py", 1216),
        _frame("__call__", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 1030),
        _frame("<module>", "/home/u/run_sd.py", 20),
    ],
    "attn": [
        _frame("get_attention_scores", SP + "diffusers/models/attention_processor.py", 719),
        _frame("__call__", SP + "diffusers/models/attention_processor.py", 1510),
        _frame("forward", SP + "diffusers/models/attention_processor.py", 560),
        _frame("forward", SP + "diffusers/models/attention.py", 1003),
        _frame("forward", SP + "diffusers/models/transformers/transformer_2d.py", 427),
        _frame("forward", SP + "diffusers/models/unets/unet_2d_condition.py", 1216),
        _frame("__call__", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 1030),
        _frame("<module>", "/home/u/run_sd.py", 20),
    ],
    "latents": [
        _frame("prepare_latents", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 700),
        _frame("__call__", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 990),
        _frame("<module>", "/home/u/run_sd.py", 20),
    ],
    "vae": [
        _frame("forward", SP + "diffusers/models/autoencoders/vae.py", 330),
        _frame("decode", SP + "diffusers/models/autoencoders/autoencoder_kl.py", 290),
        _frame("__call__", SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py", 1080),
        _frame("<module>", "/home/u/run_sd.py", 20),
    ],
    # A hostile site: the report must escape it everywhere.
    "evil": [_frame("<script>alert(1)</script>", "/home/u/<b>evil</b>.py", 7)],
}


def make_run(
    steps: int = 4,
    filler: int = 0,
    with_attention: bool = True,
    evil: bool = False,
    oom: bool = False,
    seed: int = 0,
    max_entries: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(snapshot dict, run.json dict) of a small SD-like run on ``synth.Sim`` (the
    reference allocator model). ``filler`` adds that many short-lived activations per
    step (about 3 trace events each); ``evil`` an allocation whose frames hold HTML."""
    rng = np.random.default_rng(seed)
    sim = synth.Sim(seed=seed, capacity=(12 * GiB if oom else 140 * GiB), max_entries=max_entries)
    stages: list[dict[str, Any]] = []

    pace = [0]

    def stage(name: str, seconds: float, ops: int = 1) -> Any:
        """Start a stage whose ``ops`` allocations are spread over ``seconds`` of wall time."""
        if stages:
            stages[-1]["end_us"] = sim.now_us
            stages[-1]["peak_allocated_bytes"] = sim.peak_allocated()
            stages[-1]["peak_reserved_bytes"] = sim.peak_reserved()
        sim.set_label(name)
        sim.reset_peak()
        stages.append({"name": name, "start_us": sim.now_us + 1})
        pace[0] = int(seconds * 1e6 / max(ops, 1))

    def alloc(n: int, key: str) -> Any:
        sim.now_us += pace[0]
        return sim.alloc(int(n), frames=STACKS[key])

    stage("load", 3.0, 40)
    weights = [alloc(int(rng.integers(2, 60)) * MiB + 1000, "weights") for _ in range(40)]
    stage("text_encode", 0.15, 12)
    emb = alloc(2 * 77 * 768 * 2, "text")
    for h in [alloc(int(rng.integers(1, 20)) * MiB, "text") for _ in range(10)]:
        sim.free(h)
    lat = alloc(2 * 4 * 64 * 64 * 2, "latents")
    if evil:
        alloc(300 * MiB, "evil")
    for step in range(steps):
        stage(f"denoise/{step}", 0.25, 15 + filler)
        acts = [alloc(int(rng.choice([40, 80, 160, 320])) * MiB + 4096, "act") for _ in range(12)]
        for _ in range(filler):
            sim.free(alloc(int(rng.integers(1, 16 * 1024)) * 1024 + 100, "act"))
        if with_attention:
            for _ in range(3):
                sim.free(alloc(16 * 4096 * 4096 * 2, "attn"))  # [16, 4096, 4096] fp16 = 512 MiB
        for h in acts:
            sim.free(h)
    stage("vae_decode", 0.6, 6)
    bufs = [alloc(int(rng.choice([128, 256, 384])) * MiB, "vae") for _ in range(6)]
    if oom:
        try:
            alloc(16 * GiB, "vae")  # recorded as an 'oom' entry; the pipeline carries on
        except synth.SimOOM:
            pass
    for h in bufs:
        sim.free(h)
    sim.free(lat)
    sim.free(emb)
    stage("other", 0.0)
    stages.pop()
    snap = sim.snapshot(marker=False)
    run = {
        "schema": "snapviz.run/1",
        "pipeline": "sd15",
        "size": "full",
        "techniques": ["fp16", "classic-attention"],
        "height": 512,
        "width": 512,
        "steps": steps,
        "batch": 1,
        "dtype": "fp16",
        "device_name": "NVIDIA H200",
        "torch_version": "2.11.0+cu128",
        "diffusers_version": "0.42.1",
        "command": "python -m collectors.record --pipeline sd15 --technique fp16",
        "allocator": {
            "max_memory_allocated": max(s["peak_allocated_bytes"] for s in stages),
            "max_memory_reserved": max(s["peak_reserved_bytes"] for s in stages),
        },
        "stages": stages,
    }
    del weights
    return snap, run


def write_run(dirpath: str, **kw: Any) -> str:
    """A run directory (run.json + snapshot.pickle) built by :func:`make_run`."""
    snap, run = make_run(**kw)
    os.makedirs(dirpath, exist_ok=True)
    with open(os.path.join(dirpath, "snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f, protocol=4)
    with open(os.path.join(dirpath, "run.json"), "w") as f:
        json.dump(run, f)
    return dirpath


def _analyse(
    snap: dict[str, Any], run: dict[str, Any] | None = None, source: str = "snap"
) -> tuple[Any, dict[str, Any]]:
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run
    from snapviz.load.snapshot.builder import snapshot_from_dict

    sn = snapshot_from_dict(snap, source)
    an = analyze_run(Run(source=source, label=source, snapshot=sn, trace=None, run_json=run))
    return an, summary_of(an)


def fake_trace_analysis(n: int = 5000) -> tuple[Analysis, Summary]:
    """A trace-only run's analysis made from synthetic tables (the frames the trace report
    reads: timeline, stages, attention ops) and its ``snapviz.summary/1`` document."""
    from snapviz.analyses.analysis import Capabilities, TraceEvidence
    from snapviz.analyses.stages import StageLabels, label_by_intervals
    from snapviz.analyses.trace_ops import TraceTables

    rng = np.random.default_rng(0)
    t = 1_796_000_000_000_000 + np.cumsum(rng.integers(1, 200, n))
    alloc = np.abs(np.cumsum(rng.integers(-50, 51, n))).astype(np.int64) * MiB
    timeline = pd.DataFrame({"time_us": t, "allocated": alloc, "reserved": alloc + 64 * MiB})
    cuts = np.linspace(0, n - 1, 5).astype(int)
    names = ["text_encode", "denoise/0", "denoise/1", "vae_decode"]
    stages = pd.DataFrame(
        {
            "name": names,
            "start_us": t[cuts[:-1]],
            "end_us": t[cuts[1:]],
            "peak_allocated_bytes": [int(alloc[a : b + 1].max()) for a, b in zip(cuts[:-1], cuts[1:])],
        }
    )
    ops = pd.DataFrame(
        {
            "name": ["aten::_scaled_dot_product_flash_attention"] * 3,
            "stage": names[1:],
            "shape": [[2, 8, 4096, 64]] * 3,
            "dur_us": [120.5, 118.0, 119.25],
        }
    )
    pi = int(np.argmax(alloc))
    doc = Summary(
        schema="snapviz.summary/1",
        source="trace.json.gz",
        kind="trace",
        device="cuda:0",
        device_kind="CUDA GPU memory",
        stage_source="trace",
        peak=Peak(
            allocated_bytes=int(alloc[pi]),
            reserved_bytes=int(alloc[pi] + 64 * MiB),
            requested_bytes=None,
            event_index=pi,
            time_us=int(t[pi]),
            stage=None,
            within_recorded_window=False,
        ),
        history=History(events=n, truncated=False, baseline_allocated_bytes=0),
        devices=[],
        stages=[],
        attention=TraceAttention(
            count=0,
            peak_live_bytes=0,
            largest=TraceScoreMatrix(bytes=0, shape=None),
            source="ops",
            sdpa_calls=1,
            fused_calls=1,
            implementation="fused (SDPA)",
        ),
        top_allocations=[],
        allocator_truth=None,
        run=None,
        warnings=["trace has no snapshot"],
        not_recorded=None,
    )
    assert isinstance(doc.attention, TraceAttention)
    trace = TraceTables(device=(1, 0), devices=pd.DataFrame(), timeline=timeline, stages=stages, attention_ops=ops)
    an = Analysis(
        run=Run(source="trace.json.gz", label="trace", snapshot=None, trace=None, run_json=None),
        device=0,
        capabilities=Capabilities(exact_blocks=False, reserved_recorded=True, exact_totals=True),
        evidence=TraceEvidence(trace=trace),
        labels=StageLabels(label_by_intervals(t.astype(np.float64), stages, default="unlabelled"), "annotations"),
        stages=stages,
        top_allocations=pd.DataFrame(),
        attention=ops,
        attention_summary=doc.attention,
        warnings=doc.warnings,
    )
    return an, doc
