"""Stages, sites and attention for programs the built-in rules do not know.

Truth: a synthetic training loop on the oracle allocator (tests/support/synth.py) that labels every
trace entry with the phase it runs in (``user_metadata``, stripped before analysis) and
knows which allocations are score matrices. Frames mirror a hand-written model: a user
``attention`` that builds ``q @ k.T`` and calls the user's own ``softmax``, a loss outside
any module, ``Tensor.backward``, an optimizer and ``zero_grad``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_frame_rules import SP, load_dict

from paths import ROOT
from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.frame_rules import load_rules
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stages import label_events
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from snapviz.model import A_ALLOC
from synth import MiB, Sim

USER = "/home/me/"
UNWIND = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
        "filename": "CUDACachingAllocator.cpp",
        "line": 0,
    },
]


def f(name: str, path: str, line: int) -> dict[str, Any]:
    return {"name": name, "filename": path if path.startswith("/") else SP + path, "line": line}


def training_run(
    steps: int = 2,
    cpp: bool = False,
    sdpa: bool = False,
    annotate: bool = False,
    torch_optimizer: bool = True,
    att_fn: str = "forward",
) -> tuple[dict[str, Any], np.ndarray, list[int]]:
    """(snapshot dict, the phase label of every trace entry, the score matrix sizes allocated).

    ``cpp``: stacks="all" (unwinder and allocator frames first, the autograd thread's C++
    stacks); ``sdpa``: attention through F.scaled_dot_product_attention's flash kernel;
    ``annotate``: ``ProfilerStep#<5+i>`` and ``Optimizer.step#…`` ranges;
    ``torch_optimizer``: the optimizer subclasses torch.optim.Optimizer (its frames show).
    """
    sim = Sim()
    cache: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def S(*frames: dict[str, Any], op: str = "at::_ops::empty::call(...)") -> list[dict[str, Any]]:
        key = (tuple(tuple(sorted(x.items())) for x in frames), op)
        if key not in cache:
            cache[key] = (
                ([*UNWIND, {"name": op, "filename": "", "line": 0}] if cpp else [])
                + list(frames)
                + ([{"name": "_start", "filename": "??", "line": 0}] if cpp else [])
            )
        return cache[key]

    main = [f("train", USER + "train.py", 20), f("<module>", USER + "train.py", 50)]
    call = [
        f("_call_impl", "torch/nn/modules/module.py", 1750),
        f("_wrapped_call_impl", "torch/nn/modules/module.py", 1739),
    ]
    fwd = [f("forward", USER + "model.py", 80), *call, *main]
    att = [f(att_fn, USER + "model.py", 60), *call, f("forward", USER + "model.py", 78), *call, *fwd]
    soft = f("softmax", USER + "model.py", 12)
    opt = (
        [f("step", USER + "optim.py", 40), f("wrapper", "torch/optim/optimizer.py", 493)]
        if torch_optimizer
        else [f("step", USER + "optim.py", 40)]
    ) + [f("train", USER + "train.py", 26), main[1]]
    bwd = [
        f("_engine_run_backward", "torch/autograd/graph.py", 825),
        f("backward", "torch/autograd/__init__.py", 347),
        f("backward", "torch/_tensor.py", 581),
        f("train", USER + "train.py", 24),
        main[1],
    ]
    zg = [f("zero_grad", "torch/optim/optimizer.py", 950), f("train", USER + "train.py", 27), main[1]]
    engine = [
        {
            "name": "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
            "filename": "??",
            "line": 0,
        },
        {"name": "torch::autograd::Engine::evaluate_function(...)", "filename": "??", "line": 0},
        {"name": "torch::autograd::Engine::thread_main(...)", "filename": "??", "line": 0},
    ]
    B, H, L, D = 4, 8, 512, 64
    score = B * H * L * L * 2
    scores: list[int] = []
    weights = sim.alloc(
        64 * MiB,
        frames=S(f("_apply", "torch/nn/modules/module.py", 900), f("to", "torch/nn/modules/module.py", 1160), *main),
        label="load",
    )
    grads: list[Any] = []
    state: list[Any] = []
    for i in range(steps):
        tag = f"/{5 + i}" if annotate else (f"/{i}" if steps > 1 else "")
        if annotate:
            sim.annotate(f"ProfilerStep#{5 + i}", "START")
        sim.set_label("forward" + tag)
        x = sim.alloc(B * L * 512 * 2, frames=S(*fwd))
        acts = []
        for layer in range(2):
            q = sim.alloc(B * H * L * D * 2, frames=S(f(att_fn, USER + "model.py", 55), *att[1:]))
            if sdpa:
                o = sim.alloc(
                    B * H * L * D * 2, frames=S(*att, op="at::_ops::_scaled_dot_product_flash_attention::call(...)")
                )
            else:
                s_ = sim.alloc(
                    score, frames=S(f(att_fn, USER + "model.py", 61), *att[1:], op="at::_ops::bmm::call(...)")
                )
                p = sim.alloc(
                    score,
                    frames=S(soft, f(att_fn, USER + "model.py", 62), *att[1:], op="at::_ops::div_Tensor::call(...)"),
                )
                sim.free(s_, frames=S(f(att_fn, USER + "model.py", 62), *att[1:]))
                scores += [score, score]
                o = sim.alloc(
                    B * H * L * D * 2,
                    frames=S(f(att_fn, USER + "model.py", 63), *att[1:], op="at::_ops::bmm::call(...)"),
                )
                acts.append(p)  # kept for backward
            sim.free(q, frames=S(*att))
            acts.append(o)
        loss = sim.alloc(512, frames=S(f("cross_entropy", USER + "train.py", 22), main[1]))  # outside any module
        sim.set_label("backward" + tag)
        g0 = sim.alloc(512, frames=S(f("_make_grads", "torch/autograd/__init__.py", 90), *bwd[1:]))
        for a in acts:
            g = sim.alloc(B * H * L * D * 2, frames=S(*engine) if cpp else [])  # the autograd thread: no Python
            sim.free(a, frames=S(*engine) if cpp else [])
            grads.append(g)
        sim.free(g0, frames=S(*bwd))
        sim.free(loss, frames=S(*bwd))
        sim.free(x, frames=S(*bwd))
        if annotate:
            sim.annotate("Optimizer.step#AdamW.step", "START")
        sim.set_label("optimizer" + tag)
        if not state:
            state = [sim.alloc(32 * MiB, frames=S(*opt)) for _ in range(2)]
        tmp = sim.alloc(8 * MiB, frames=S(*opt))
        sim.free(tmp, frames=S(*opt))
        if annotate:
            sim.annotate("Optimizer.step#AdamW.step", "END")
        sim.set_label("zero_grad" + tag)
        for g in grads:
            sim.free(g, frames=S(*zg))
        grads = []
        if annotate:
            sim.annotate(f"ProfilerStep#{5 + i}", "END")
    assert not weights.freed
    d = sim.snapshot(marker=False)
    truth = np.array([e["user_metadata"] for e in d["device_traces"][0]], dtype=object)
    for e in d["device_traces"][0]:
        e["user_metadata"] = ""
    return d, truth, scores


def analyse(d: dict[str, Any], rules: str | None = None) -> Any:
    snap = load_dict(d)
    return analyze_run(
        Run(source="<synthetic>", label="x", snapshot=snap, trace=None, run_json=None), rules=load_rules(rules)
    )


# --- stages -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpp", [False, True], ids=["python", "cpp"])
def test_training_phases_for_an_unknown_model(cpp: bool) -> None:
    d, truth, _ = training_run(cpp=cpp)
    snap = load_dict(d)
    assert label_from_frames(snap, snap.device_events(0)) is None  # not a pipeline the rules know
    got = label_events(snap, snap.device_events(0), 0)
    assert got.source == "phases"
    np.testing.assert_array_equal(got.labels, truth)


def test_profiler_ranges_name_the_optimizer_and_number_the_steps() -> None:
    """A user optimizer outside torch.optim shows no optimizer frame: Optimizer.step#… says
    it; ProfilerStep#N numbers the steps with the profiler's own N."""
    d, truth, _ = training_run(annotate=True, torch_optimizer=False)
    snap = load_dict(d)
    got = label_events(snap, snap.device_events(0), 0)
    assert got.source == "phases"
    np.testing.assert_array_equal(got.labels, truth)
    assert {"optimizer/5", "optimizer/6", "forward/6"} <= set(got.labels)


def test_nothing_recognised_is_unlabelled_not_load() -> None:
    sim = Sim()
    fr = [f("bar", "/path/to/foo.py", 10), f("<module>", "/path/to/main.py", 1)]
    hs = [sim.alloc(MiB * (k + 1), frames=fr) for k in range(4)]
    for h in hs:
        sim.free(h, frames=fr)
    doc = summary_of(analyse(sim.snapshot(marker=False)))
    assert doc["stage_source"] == "none"
    assert [s["name"] for s in doc["stages"]] == ["unlabelled"]
    assert doc["peak"]["stage"] == "unlabelled"
    assert any("do not recognise" in w for w in doc["warnings"])


def test_stage_table_holds_the_peak_stage() -> None:
    doc = summary_of(analyse(training_run()[0]))
    names = [s["name"] for s in doc["stages"]]
    assert doc["peak"]["stage"].split("/")[0] in names
    assert {"forward", "backward", "optimizer", "zero_grad"} <= set(names)
    peak = max(s["peak_allocated_bytes"] for s in doc["stages"])
    assert peak == doc["peak"]["allocated_bytes"]


# --- sites --------------------------------------------------------------------------------------------


def test_sites_skip_cpp_frames_to_the_python_line() -> None:
    d, _, _ = training_run(cpp=True)
    an = analyse(d)
    snap, ev = an.run.snapshot, an.replay.events
    sites = SiteNamer(snap)
    allocs = ev[ev["action"] == A_ALLOC]
    for sid in set(allocs["stack_id"].tolist()):
        site = sites.site(int(sid))
        frames = snap.stack(int(sid))
        if any(fr["line"] > 0 for fr in frames):
            assert not site.startswith("[C++]") and ".py:" in site and "torch/" not in site, site
        else:  # the autograd thread: the node, marked as C++, and the line that ran backward()
            assert site == (
                "[C++] torch::autograd::generated::BmmBackward0::apply "
                "(autograd thread, backward() called at home/me/train.py:24 train)"
            ), site
    q_stack = next(i for i, st in enumerate(snap.stacks) if any(snap.stack(i)[k]["line"] == 55 for k in range(len(st))))
    assert snap.stack(q_stack)[0]["name"] == "torch::unwind::unwind()"
    assert sites.site(q_stack) == "home/me/model.py:55 forward"  # not the unwinder, not torch's _call_impl
    assert sites.stack_text(q_stack).splitlines()[0] == "home/me/model.py:55 forward"


# --- attention ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cpp, att_fn", [(True, "forward"), (False, "attention")], ids=["cpp-qk-producer", "python-attention-function"]
)
def test_hand_written_attention_is_materialized(cpp: bool, att_fn: str) -> None:
    """The evidence that the softmax is attention's: the bmm (Q·K^T) that built its input
    (C++ frames), or a function named for attention (Python frames only)."""
    d, _, scores = training_run(cpp=cpp, att_fn=att_fn)
    an = analyse(d)
    s = an.attention_summary
    assert s.materialized and s.count == len(scores)
    assert sorted(an.attention["requested_bytes"].tolist()) == sorted(scores)
    assert f"softmax over a matmul in {att_fn}" in s.implementation
    assert s.largest.shape is None  # no geometry to factor the size: not guessed


def test_softmax_without_attention_evidence_is_not_scores() -> None:
    """Python frames only, a softmax in a plain ``forward``: nothing says its input is Q·K^T
    (no product op is visible, no attention name), so nothing is called scores."""
    d, _, scores = training_run(cpp=False)
    s = analyse(d).attention_summary
    assert scores and s.count == 0 and not s.materialized
    assert s.implementation == "not determined"


def test_sdpa_frames_say_fused() -> None:
    s = analyse(training_run(cpp=True, sdpa=True)[0]).attention_summary
    assert s.count == 0 and s.fused and s.implementation.startswith("fused (SDPA/flash)")


def test_no_evidence_is_not_determined() -> None:
    s = analyse(training_run(sdpa=True)[0]).attention_summary  # Python frames only: the kernel is invisible
    assert s.count == 0 and not s.fused and s.implementation == "not determined"


# --- rules are explicit -------------------------------------------------------------------------------


def test_rules_do_not_leak_between_analyses(tmp_path: Path) -> None:
    """A rules file used for one analysis of a snapshot is not silently reused by the next."""
    d, _, _ = training_run()
    rules = tmp_path / "r.json"
    rules.write_text(
        json.dumps(
            {
                "schema": "snapviz.rules/1",
                "extends": "builtin",
                "rules": [{"name": "denoise", "function": "^forward$", "file": "model\\.py$", "priority": 100}],
            }
        )
    )
    snap = load_dict(d)
    run = Run(source="<synthetic>", label="x", snapshot=snap, trace=None, run_json=None)
    with_rules = analyze_run(run, rules=load_rules(str(rules)))
    assert with_rules.labels.source == "frames" and any(str(x).startswith("denoise/") for x in with_rules.labels.labels)
    plain = analyze_run(run)
    assert plain.labels.source == "phases" and not any(str(x).startswith("denoise") for x in plain.labels.labels)


def test_bad_rules_schema_exits_2_with_one_line(tmp_path: Path) -> None:
    d, _, _ = training_run(steps=1)
    import pickle

    snap_path = tmp_path / "s.pickle"
    snap_path.write_bytes(pickle.dumps(d))
    rules = tmp_path / "r.json"
    rules.write_text(json.dumps({"schema": "snapviz.rules/9", "rules": []}))
    out = tmp_path / "o.json"
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(snap_path), "--rules", str(rules), "--json", str(out), "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "schema" in p.stderr
    assert not out.exists()


def test_compile_context_is_the_compile_stage() -> None:
    """Entries recorded while torch.compile compiles carry a compile_context: their own stage."""
    sim = Sim()
    fwd = [
        f("forward", USER + "model.py", 80),
        f("_call_impl", "torch/nn/modules/module.py", 1750),
        f("<module>", USER + "run.py", 3),
    ]
    want = []
    for ctx, n in (("N/A", 2), ("[0/0]", 3), ("N/A", 2)):
        sim.compile_context = ctx
        for _ in range(n):
            h = sim.alloc(MiB, frames=fwd)
            sim.free(h, frames=fwd)
            want += ["forward" if ctx == "N/A" else "compile"] * 3
    d = sim.snapshot(marker=False)
    snap = load_dict(d)
    ev = snap.device_events(0)
    got = label_events(snap, ev, 0)
    keep = ev["action"].isin([0, 1, 2]).to_numpy()
    assert got.source == "phases" and list(got.labels[keep]) == want


def test_profiler_ranges_do_not_relabel_a_recognised_pipeline() -> None:
    """A diffusers run profiled with a schedule: ProfilerStep#N counts pipeline calls, so
    the pipeline's own stages and denoising steps stay as the rules found them."""
    from test_frame_rules import diffusion_run

    pr = diffusion_run("sd15", steps=3)
    d = pr.snapshot_dict(labels=False)
    tr = d["device_traces"][0]
    d["external_annotations"] = [
        {"stage": "START", "name": "ProfilerStep#7", "device": 0, "time_us": tr[0]["time_us"] - 1},
        {"stage": "START", "name": "Optimizer.step#SGD.step", "device": 0, "time_us": tr[len(tr) // 2]["time_us"]},
        {"stage": "END", "name": "Optimizer.step#SGD.step", "device": 0, "time_us": tr[len(tr) // 2 + 5]["time_us"]},
        {"stage": "END", "name": "ProfilerStep#7", "device": 0, "time_us": tr[-1]["time_us"] + 1},
    ]
    snap = load_dict(d)
    got = label_events(snap, snap.device_events(0), 0)
    assert got.source == "frames"
    np.testing.assert_array_equal(got.labels, pr.truth_labels())
