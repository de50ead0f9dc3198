"""Repetitive record_function ranges become a handful of phases (issue 21, item 6).

torchtitan's FSDP2 wraps every step of every layer in ``FSDP::<step> (<module fqn>)``;
per-layer ranges are ``layers.0``, ``layers.1`` …; 2021 profilers put ``ProfilerStep#N`` in
category ``Operator``. Truth is the names written here, not snapviz: the phases are the
names with their layer index / qualifier taken off, and every range's own name survives
one level down (the interval names in JSON).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_frame_rules import load_dict
from test_trace_generations import T0, _analyze, _exact_events

from snapviz.analyses.document import from_json
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.stages import range_labels, wrapper_range_phase
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from snapviz.render.markdown import render_markdown
from snapviz.render.terminal import render_terminal
from synth import MiB, Sim

STEPS = (
    "all_gather",
    "all_gather_copy_out",
    "pre_forward",
    "post_forward",
    "pre_backward",
    "post_backward",
    "post_backward_reduce",
)
LAYERS = 16


def _fsdp_names() -> list[str]:
    mods = [f"layers.{i}" for i in range(LAYERS)] + ["tok_embeddings", "norm, output"]
    return [f"FSDP::{s} ({m})" for s in STEPS for m in mods] + ["FSDP::root_pre_forward"]


def test_range_labels_group_numbers_and_qualifiers() -> None:
    names = (
        _fsdp_names()
        + [f"layers.{i}" for i in range(LAYERS)]
        + ["conv1", "conv2", "fp8", "## forward ##", "ProfilerStep#3", "Optimizer.step#AdamW.step"]
    )
    lab = range_labels(names)
    assert lab["FSDP::all_gather (layers.3)"] == "FSDP::all_gather/layers.3"
    assert lab["FSDP::pre_forward (norm, output)"] == "FSDP::pre_forward/norm, output"
    assert lab["layers.12"] == "layers/12"
    assert lab["conv2"] == "conv/2"
    assert lab["fp8"] == "fp8"  # no sibling: kept as it is
    assert lab["FSDP::root_pre_forward"] == "FSDP::root_pre_forward"
    assert (
        lab["## forward ##"] == "forward"
        and lab["ProfilerStep#3"] == "step/3"
        and lab["Optimizer.step#AdamW.step"] == "optimizer"
    )
    phases = {v.split("/", 1)[0] for v in lab.values()}
    assert phases == {f"FSDP::{s}" for s in STEPS} | {
        "FSDP::root_pre_forward",
        "layers",
        "conv",
        "fp8",
        "forward",
        "step",
        "optimizer",
    }
    # every distinct name keeps a distinct label (the detail one level down)
    user = [n for n in names if not n.startswith(("ProfilerStep", "Optimizer"))]
    assert len({lab[n] for n in user}) == len(user)


def test_too_many_phases_share_their_leading_name() -> None:
    names = [
        f"FSDP::step_{chr(97 + k)}{chr(97 + j)} (layers.{i})" for k in range(5) for j in range(5) for i in range(2)
    ]
    names += ["warmup"]
    lab = range_labels(names)
    phases = {v.split("/", 1)[0] for v in lab.values()}
    assert phases == {"FSDP", "warmup"}
    assert lab["FSDP::step_ab (layers.1)"] == "FSDP/FSDP::step_ab (layers.1)"


def _fsdp_snapshot() -> tuple[dict[str, Any], int]:
    """Two training steps of a 16-layer FSDP2 model: every range allocates and frees."""
    sim = Sim()
    frames = [{"name": "train_step", "filename": "/home/me/train.py", "line": 10}]
    keep = [sim.alloc(64 * MiB, frames=frames)]
    mods = [f"layers.{i}" for i in range(LAYERS)]
    for step in range(2):
        sim.annotate(f"ProfilerStep#{step}", "START")
        for phase in ("pre_forward", "all_gather", "post_forward", "pre_backward", "post_backward_reduce"):
            for i, m in enumerate(mods):
                name = f"FSDP::{phase} ({m})"
                sim.annotate(name, "START")
                h = sim.alloc((i + 1) * MiB + 512 * step, frames=frames)
                sim.free(h, frames=frames)
                sim.annotate(name, "END")
        sim.annotate(f"ProfilerStep#{step}", "END")
    assert not keep[0].freed
    snap = sim.snapshot()
    return snap, sim.peak_allocated(0)


def test_fsdp_ranges_belong_to_the_training_phases() -> None:
    """FSDP's own ranges are torch's plumbing, not a user's stages (issue 22, item 5): with no
    frames to say the phase, ``FSDP::pre_forward``/``post_forward`` are forward and
    ``FSDP::pre_backward``/``post_backward_reduce`` backward, numbered by ProfilerStep#N; an
    all-gather outside both is communication. No ``FSDP::`` name is a stage."""
    d, peak = _fsdp_snapshot()
    an = analyze_run(Run(source="<synthetic>", label="x", snapshot=load_dict(d), trace=None, run_json=None))
    doc = summary_of(an)
    assert doc["peak"]["allocated_bytes"] == peak
    groups = [s["name"] for s in doc["stages"]]
    assert set(groups) == {"unlabelled", "forward", "backward", "communication"}, groups
    # the peak: the largest allocation, first made in the last layer's pre_forward of step 1
    assert doc["peak"]["stage"] == "forward/1"
    fwd = next(s for s in doc["stages"] if s["name"] == "forward")
    assert {i["name"] for i in fwd["intervals"]} == {"forward/0", "forward/1"}
    md, term = render_markdown(from_json(doc)), render_terminal(from_json(doc))
    assert "FSDP::" not in md and "FSDP::" not in term


def _trace(tmp_path: Path, cat: str) -> Path:
    """A step range in category ``cat`` around memory events (allocations of 1..4 MiB)."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": cat, "name": "ProfilerStep#5", "pid": 1, "tid": 1, "ts": T0 - 5, "dur": 100},
        {
            "ph": "X",
            "cat": "cpu_op" if cat == "user_annotation" else cat,
            "name": "aten::empty",
            "pid": 1,
            "tid": 1,
            "ts": T0 + 1,
            "dur": 2,
        },
    ]
    events += _exact_events(1, 0, [MiB, 2 * MiB, -2 * MiB, 4 * MiB, -4 * MiB, -MiB])
    p = tmp_path / f"{cat}.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return p


@pytest.mark.parametrize("cat", ["Operator", "cpu_op", "user_annotation"])
def test_profiler_step_in_any_category(cat: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, md, term = _analyze(_trace(tmp_path, cat), capsys)
    assert doc["peak"]["allocated_bytes"] == 5 * MiB
    assert doc["peak"]["stage"] == "step/5", doc["peak"]
    assert [s["name"] for s in doc["stages"]] == ["step"]


def test_trace_per_layer_ranges_are_one_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace with a range per layer (``layers.0`` … ``layers.29``): one phase ``layers``,
    each layer one level down; the peak's layer is the one that allocated the most."""
    events: list[dict[str, Any]] = []
    sizes: list[int] = []
    for i in range(30):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"layers.{i}",
                "pid": 1,
                "tid": 1,
                "ts": T0 + 100 * i,
                "dur": 50,
            }
        )
        n = (1 + (i * 7) % 30) * MiB  # layer 17 allocates the most (30 MiB)
        sizes += [n, -n]
    mem = _exact_events(1, 0, sizes)
    for k, e in enumerate(mem):  # two events inside each layer's range
        e["ts"] = T0 + 100 * (k // 2) + 10 + 10 * (k % 2)
    p = tmp_path / "layers.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events + mem}))
    doc, md, term = _analyze(p, capsys)
    assert [s["name"] for s in doc["stages"]] == ["layers"]
    assert doc["peak"]["allocated_bytes"] == 30 * MiB and doc["peak"]["stage"] == "layers/17"


def test_trace_fsdp_ranges_are_the_phases_they_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In a profiler trace, FSDP2's ranges are no stages either: ``FSDP::pre_forward (layers.i)``
    is forward, ``FSDP::post_backward_reduce (layers.i)`` backward, and the ``FSDP::all_gather``
    nested in a pre_forward belongs to it (it was a stage of its own, the innermost range)."""
    events: list[dict[str, Any]] = []
    sizes: list[int] = []
    for i in range(4):
        for k, (name, n) in enumerate((("pre_forward", 2 + i), ("post_backward_reduce", 1 + i))):
            ts = T0 + 1000 * i + 400 * k
            events.append(
                {"ph": "X", "cat": "user_annotation", "name": f"FSDP::{name} (layers.{i})", "pid": 1, "tid": 1}
                | {"ts": ts, "dur": 300}
            )
            if name == "pre_forward":  # the all-gather inside it allocates
                events.append(
                    {"ph": "X", "cat": "user_annotation", "name": f"FSDP::all_gather (layers.{i})", "pid": 1}
                    | {"tid": 1, "ts": ts + 5, "dur": 200}
                )
            sizes += [n * MiB, -n * MiB]
    mem = _exact_events(1, 0, sizes)
    for k, e in enumerate(mem):  # two events inside each range (inside the all-gather for pre_forward)
        e["ts"] = T0 + 1000 * (k // 4) + 400 * ((k // 2) % 2) + 10 + 10 * (k % 2)
    p = tmp_path / "fsdp.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events + mem}))
    doc, md, term = _analyze(p, capsys)
    assert {s["name"] for s in doc["stages"]} == {"forward", "backward"}, [s["name"] for s in doc["stages"]]
    assert doc["peak"]["allocated_bytes"] == 5 * MiB and doc["peak"]["stage"] == "forward"
    assert "FSDP::" not in md and "FSDP::" not in term


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("FSDP::pre_forward (layers.3)", "forward"),
        ("FSDP::root_pre_forward", "forward"),
        ("FSDP::cast_forward_inputs", "forward"),
        ("FSDP::inputs_to_device", "forward"),
        ("FSDP::pre_backward", "backward"),
        ("FSDP::post_backward_reduce (layers.0)", "backward"),
        ("FSDP::backward_prefetch for transformer.h.5", "backward"),
        ("FSDP::root_post_backward_callback", "backward"),
        ("FSDP::all_gather (layers.3)", ""),
        ("FSDP::all_gather_copy_out", ""),
        ("FullyShardedDataParallel._pre_forward", "forward"),
        ("FullyShardedDataParallel._post_backward_hook", "backward"),
        ("FullyShardedDataParallel._reshard", ""),
        ("FullyShardedDataParallel.forward", None),  # the forward range: a phase range of its own
        ("layers.3", None),
        ("## forward ##", None),
    ],
)
def test_wrapper_range_phase(name: str, phase: str | None) -> None:
    """The phase each of FSDP's ranges says: the names FSDP2 (all from the fsdp2 samples) and
    FSDP1 open; "" for the ones that run in either phase; None for every range not FSDP's."""
    assert wrapper_range_phase(name) == phase
