"""``_set_memory_metadata`` labels are per thread: other threads' entries take the label in effect.

A user labels phases on the main thread only; autograd's backward thread records its entries
with no label and no Python frames. The rule (docs/design.md, "Stage labels"): such entries
belong to the label in effect (the last labelled entry, in time order); an unlabelled entry
with Python frames clears it (the user cleared the label); nothing before the first label,
and nothing in a snapshot recorded without Python frames, is guessed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_any_program import training_run
from test_frame_rules import load_dict

from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.stages import label_events
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from snapviz.model import A_ALLOC
from snapviz.vocab import UNLABELLED
from synth import MiB, Sim, make_frames

U = UNLABELLED


def _python(frames: list[dict[str, Any]] | None) -> bool:
    return any(str(fr.get("filename", "")).endswith(".py") for fr in frames or [])


def _labelled_on(d: dict[str, Any], truth: np.ndarray, *, all_threads: bool) -> dict[str, Any]:
    """``d`` with each entry's label as a user sets it: on every thread, or on the main thread only."""
    blanked = 0
    for e, lab in zip(d["device_traces"][0], truth, strict=True):
        keep = all_threads or _python(e.get("frames"))
        e["user_metadata"] = lab if keep else ""
        blanked += not keep
    assert all_threads or blanked > 0, "the synthetic run has no autograd-thread entries"
    return d


def _stages(d: dict[str, Any]) -> list[tuple[str, int, int]]:
    snap = load_dict(d)
    doc = summary_of(analyze_run(Run(source="<synthetic>", label="x", snapshot=snap, trace=None, run_json=None)))
    return [
        (it["name"], it["peak_allocated_bytes"], it["peak_reserved_bytes"])
        for g in doc["stages"]
        for it in g["intervals"]
    ]


@pytest.mark.parametrize("cpp", [False, True], ids=["python", "cpp"])
def test_backward_thread_takes_the_main_threads_label(cpp: bool) -> None:
    d, truth, _ = training_run(steps=2, cpp=cpp)
    main_only = _labelled_on(d, truth, all_threads=False)
    snap = load_dict(main_only)
    got = label_events(snap, snap.device_events(0), 0)
    assert got.source == "user_metadata"
    np.testing.assert_array_equal(got.labels, truth)


def test_stage_peaks_same_as_labelling_every_thread() -> None:
    d, truth, _ = training_run(steps=2, cpp=True)
    every = _stages(_labelled_on(d, truth, all_threads=True))
    d2, truth2, _ = training_run(steps=2, cpp=True)
    assert _stages(_labelled_on(d2, truth2, all_threads=False)) == every
    assert any(name.startswith("backward") for name, _, _ in every)


def test_cleared_label_and_before_labelling_stay_unlabelled() -> None:
    sim = Sim()
    py = make_frames("work", "/home/me/train.py", 10)
    want = []

    def step(label: str, framed: bool, expect: str) -> Any:
        h = sim.alloc(MiB, frames=py if framed else [], label=None if framed else "")
        want.append(expect)
        return h

    step("", False, U)  # another thread, before any label: nothing to inherit
    step("", True, U)  # the main thread, not yet labelling
    sim.set_label("forward/0")
    step("forward/0", True, "forward/0")
    step("", False, "forward/0")  # autograd-style thread while forward/0 is in effect
    sim.set_label("")  # the user clears the label
    step("", True, U)
    step("", False, U)  # after a clear: stays unlabelled
    sim.set_label("backward/0")
    step("backward/0", True, "backward/0")
    step("", False, "backward/0")
    snap = load_dict(sim.snapshot(marker=False))
    ev = snap.device_events(0)
    got = label_events(snap, ev, 0)
    assert got.source == "user_metadata"
    assert got.labels[ev["action"].to_numpy() == A_ALLOC].tolist() == want


def test_no_python_frames_nothing_carried() -> None:
    """Without stacks the labelling thread's cleared entries and other threads' look alike."""
    sim = Sim(context=None)
    sim.set_label("forward/0")
    sim.alloc(MiB)
    sim.alloc(MiB, label="")
    snap = load_dict(sim.snapshot(marker=False))
    ev = snap.device_events(0)
    got = label_events(snap, ev, 0)
    assert got.labels[ev["action"].to_numpy() == A_ALLOC].tolist() == ["forward/0", U]
