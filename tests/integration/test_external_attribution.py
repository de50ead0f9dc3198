"""Stages, sites and attention on real files from other people's code (../shared/external).

Each fact asserted here was checked by hand against the file (its stacks, annotations and
op names); see the corpus README for where each file comes from. Skipped when the corpus
is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paths import EXTERNAL
from snapviz.analyses import trace_ops
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.replay import live_at
from snapviz.analyses.stages import annotation_intervals, stage_group
from snapviz.analyses.summary import analyze_run
from snapviz.analyses.trace_attention import attention_verdict
from snapviz.load import load
from snapviz.load.trace.chrome_trace import load_chrome_trace

SNAPSHOTS = ["cs336_kk_ctx128_fullstep.pickle", "selectn_llama_snapshot.pickle", "mosaic_test_output.pickle"]
GiB = 1 << 30


def _path(name: str) -> Path:
    p = EXTERNAL / name
    if not p.is_file():
        pytest.skip(f"{p} is absent (the external corpus is not part of the repository)")
    return p


_CACHE: dict[str, tuple[Analysis, dict[str, Any]]] = {}


def analysed(name: str) -> tuple[Analysis, dict[str, Any]]:
    if name not in _CACHE:
        an = analyze_run(load(str(_path(name))))
        _CACHE[name] = (an, summary_of(an))
    return _CACHE[name]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_no_stage_holds_everything_by_default(name: str) -> None:
    an, doc = analysed(name)
    groups = {stage_group(str(x)) for x in an.labels.labels}
    assert "load" not in groups or len(groups) > 1, "everything labelled load"
    if doc["stage_source"] != "none":
        assert len(groups) > 1, (name, doc["stage_source"], groups)
    # the stage table shows the stage that holds the peak, labelled or not
    assert stage_group(doc["peak"]["stage"]) in {s["name"] for s in doc["stages"]}


def test_cs336_training_phases_and_optimizer_step() -> None:
    """C++ frames first in every stack; Optimizer.zero_grad/step profiler ranges; a user
    AdamW subclassing torch.optim.Optimizer; the autograd thread has only C++ frames."""
    an, doc = analysed("cs336_kk_ctx128_fullstep.pickle")
    assert doc["stage_source"] == "phases"
    assert [s["name"] for s in doc["stages"]] == ["forward", "backward", "optimizer"]
    ev = an.replay.events
    t = ev["time_us"].to_numpy()
    assert an.run.snapshot is not None
    iv = annotation_intervals(an.run.snapshot, an.device)
    step = iv[iv["name"].str.startswith("Optimizer.step#")].iloc[0]
    inside = (t >= step["start_us"]) & (t <= step["end_us"])
    assert inside.sum() > 100 and set(an.labels.labels[inside]) == {"optimizer"}
    assert set(an.labels.labels[t < step["start_us"]]) == {"forward", "backward"}
    # the peak is the optimizer step creating AdamW's state, on top of weights and gradients
    assert doc["peak"]["stage"] == "optimizer"


def test_cs336_sites_are_python_lines() -> None:
    an, doc = analysed("cs336_kk_ctx128_fullstep.pickle")
    snap = an.run.snapshot
    assert snap is not None
    for top in doc["top_allocations"]:
        assert "unwind" not in top["site"] and "??" not in top["site"], top["site"]
        assert top["stack"] and "unwind" not in top["stack"][0]
    ev = an.replay.events
    allocs = np.unique(ev.loc[ev["action"] == 0, "stack_id"].to_numpy())
    n_python = 0
    for sid in allocs.tolist():
        site = an.sites.site(int(sid))
        has_python = any(fr["line"] > 0 and fr["filename"].endswith(".py") for fr in snap.stack(int(sid)))
        if has_python:
            n_python += 1
            assert ".py:" in site and not site.startswith("[C++]"), site
        else:  # the autograd engine thread: its node, marked as C++, and the Python line of backward()
            assert site.startswith("[C++] ") and "unwind" not in site and "CachingAllocator" not in site, site
            if "Backward" in site:
                assert site.endswith(
                    "backward() called at cs336-a2-systems/cs336_systems/benchmark.py:229 run_memory_foward_fullstep)"
                ), site
    assert n_python > 50
    opt = next(s for s in doc["stages"] if s["name"] == "optimizer")["intervals"][0]["top_allocations"]
    assert opt[0]["site"] == "assignment1/cs336_basics/optimizers.py:82 step"


def test_cs336_attention_is_the_hand_written_softmax() -> None:
    """cs336's own scaled_dot_product_attention: einsum(q, k) -> bmm, / sqrt(d), masked
    where, then its own softmax: every one a [128·B·H… , 128, 128] fp32 block of 8 MiB."""
    an, doc = analysed("cs336_kk_ctx128_fullstep.pickle")
    att = doc["attention"]
    assert att["materialized"] and att["implementation"].startswith("materialized")
    assert set(att["functions"]) == {"scaled_dot_product_attention"}
    assert set(an.attention["requested_bytes"].tolist()) == {8 << 20}
    assert not an.attention["site"].str.contains("einsum@|unwind").any()


def test_selectn_llama_scores_live_at_the_peak() -> None:
    """LLaMA-7B forward (old transformers, torch <= 2.1): matmul(q, k^T) / sqrt(d) at
    modeling_llama.py:330 leaves two 1 GiB score blocks live at the peak; F.softmax at :346."""
    an, doc = analysed("selectn_llama_snapshot.pickle")
    att = doc["attention"]
    assert att["materialized"] and "softmax over a matmul in forward" in att["implementation"]
    assert att["largest"]["bytes"] == GiB and att["largest"]["site"].endswith("modeling_llama.py:330 forward")
    assert att["largest"]["shape"] is None  # no geometry in the file: the shape is not guessed
    assert att["peak_live_bytes"] == 2 * GiB
    rep = an.replay
    live = live_at(rep, rep.peak_index)
    scores_live = set(an.attention["row"].tolist()) & set(live.index.tolist())
    assert sorted(int(live.loc[r, "block_size"]) for r in scores_live) == [GiB, GiB]
    cats = dict(zip(an.categories["category"], an.categories["bytes"]))
    assert cats["attention scores"] == 2 * GiB
    # the output of probs @ V (line 347) and the MLP are not scores
    assert not an.attention["site"].str.contains(r":34[7-9] |:35\d ").any()


def test_selectn_llama_stages() -> None:
    an, doc = analysed("selectn_llama_snapshot.pickle")
    assert doc["stage_source"] == "phases"
    assert doc["peak"]["stage"] == "forward"
    assert {s["name"] for s in doc["stages"]} == {"unlabelled", "forward"}


def test_mosaic_synthetic_attention_not_determined() -> None:
    _, doc = analysed("mosaic_test_output.pickle")
    assert doc["attention"]["implementation"] == "not determined" and not doc["attention"]["fused"]


@pytest.mark.parametrize(
    "name, verdict",
    [
        ("tracelens_h100_qwen05b.json.gz", "fused (SDPA/flash)"),  # aten::scaled_dot_product_attention -> flash
        (
            "tracelens_mi300_vllm_decode.pt.trace.json.gz",
            "fused (vLLM paged attention)",
        ),  # vllm::unified_attention_with_output
        ("hta_df_index_resolver_rank1.json.gz", "not determined"),  # bmm/baddbmm, no shapes, no softmax, no SDPA
        ("kineto_resnet50_v100_2021.pt.trace.json.gz", "not determined"),  # a CNN
    ],
)
def test_trace_attention_verdicts(name: str, verdict: str) -> None:
    ops = trace_ops.attention_ops(load_chrome_trace(str(_path(name))))
    att = attention_verdict(ops)
    assert att.implementation.startswith(verdict), att
    assert att.count == 0
    if verdict.startswith("fused"):
        assert att.fused_calls > 0
        # only PyTorch's own SDPA ops are counted as SDPA calls (vLLM's paged attention is not)
        assert (att.sdpa_calls > 0) == (verdict == "fused (SDPA/flash)")
    else:
        assert att.sdpa_calls == att.fused_calls == 0


def test_kineto_2021_peak_is_inside_its_profiler_step() -> None:
    """2021 profilers write ProfilerStep#N (and every op) in category ``Operator``; the peak
    lies inside ProfilerStep#5, so its stage is step/5, not "unlabelled"."""
    import gzip
    import json

    from snapviz.api import analyze

    path = _path("kineto_resnet50_v100_2021.pt.trace.json.gz")
    raw = json.load(gzip.open(path))["traceEvents"]
    steps = {
        e["name"]: (e["ts"], e["ts"] + e["dur"])
        for e in raw
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    }
    assert {e.get("cat") for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")} == {"Operator"}
    doc = analyze(path).summary()
    peak = doc["peak"]
    t = peak["time_us"]
    inside = [n for n, (a, b) in steps.items() if a <= t <= b]
    assert inside == ["ProfilerStep#5"], (t, steps)
    assert peak["stage"] == "step/5"
    assert [s["name"] for s in doc["stages"]] == ["step"]
    assert doc["attention"]["implementation"] == "not determined"  # a CNN: its ops are read now, still no attention


def test_codeloc_gnn_node_softmax_is_not_attention() -> None:
    """Qwen3 (SDPA) + a GNN: update_nodes softmaxes a matrix-vector product over its nodes
    (models.py:198 matmul -> mv, 130,220 B; F.softmax at :199). Not attention scores, no
    advice to switch to fused SDPA; nothing in the file proves how Qwen3's attention ran."""
    an, doc = analysed("codeloc_qwen3_dp3gpu_expandable_oom.pickle")
    att = doc["attention"]
    assert att["count"] == 0 and not att["materialized"] and att["implementation"] == "not determined"
    assert "attention scores" not in {c["category"] for c in doc["categories"]}
    assert not any("attention" in a["technique"] for a in doc["advice"])
