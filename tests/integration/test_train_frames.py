"""Training phases from frames alone: the H200 training samples with their labels and profiler
annotations taken out (tests/support/strip.py), and an LLM training step someone else recorded.

The truth is run.json's allocator peaks per phase (max_memory_allocated after a reset at each
phase's start), which the labelled analysis matches to the byte (test_train_samples.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paths import EXTERNAL, SAMPLES
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.stages import annotation_intervals
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.model import A_ALLOC
from strip import strip_labels

TRAIN = sorted(p.parent for p in SAMPLES.glob("train-*/snapshot.pickle*"))
PHASES = ("forward", "backward", "optimizer", "zero_grad")


def _unlabelled(path: Path) -> tuple[dict, Analysis]:
    """The raw snapshot, and the analysis of its stripped copy (no run.json either)."""
    raw = safe_load_pickle(path)
    snap = snapshot_from_dict(strip_labels(raw), str(path))
    return raw, analyze_run(Run(source=str(path), label=path.name, snapshot=snap, trace=None, run_json=None))


def test_strip_labels_takes_out_labels_and_annotations_only() -> None:
    raw: dict[str, Any] = {
        "segments": [],
        "external_annotations": [{"stage": "START", "name": "x", "time_us": 1}],
        "device_traces": [
            [{"action": "alloc", "addr": 0, "size": 512, "user_metadata": "forward/0", "time_us": 2, "frames": []}]
        ],
    }
    out = strip_labels(raw)
    assert "external_annotations" not in out and out["segments"] == []
    assert out["device_traces"] == [[{"action": "alloc", "addr": 0, "size": 512, "time_us": 2, "frames": []}]]
    assert raw["device_traces"][0][0]["user_metadata"] == "forward/0"  # the input is left alone


@pytest.mark.slow
@pytest.mark.parametrize("sample", TRAIN, ids=lambda p: p.name)
def test_phases_from_frames_alone_match_the_allocator(sample: Path) -> None:
    """Every phase run.json measured is found, under its own name (micro-batch numbers for
    forward/backward, step numbers for optimizer/zero_grad), with its peak within 3%."""
    rj = json.loads((sample / "run.json").read_text())
    _, an = _unlabelled(next(sample.glob("snapshot.pickle*")))
    assert an.labels.source == "phases"
    found = {r.name: int(r.peak_allocated_bytes) for r in an.stages.itertuples() if r.group in PHASES}
    truth = {s["name"]: s for s in rj["stages"] if s["name"].split("/")[0] in PHASES}
    assert set(found) <= set(truth), sorted(set(found) - set(truth))
    for name, st in truth.items():
        if name not in found:
            # no allocator event in it (fused AdamW once its state exists; zero_grad that zeroes in
            # place): the allocator agrees nothing happened there
            assert st["peak_allocated_bytes"] == st["allocated_at_start"] == st["allocated_at_end"], name
            continue
        assert found[name] == pytest.approx(st["peak_allocated_bytes"], rel=0.03), name
    # every step's backward is found: checkpointing's recomputation is not taken for a new forward
    n_backward = rj["steps"] * rj["train"]["accumulate"]
    assert sum(1 for n in found if n.startswith("backward/")) == n_backward


def test_llm_training_step_optimizer_found_from_frames() -> None:
    """cs336 (a user AdamW subclassing torch.optim.Optimizer, C++ frames first in every stack):
    without its profiler ranges the optimizer step is still found, and it is exactly the events
    the Optimizer.step#AdamW.step range held; its allocations are the optimizer's state."""
    path = EXTERNAL / "cs336_kk_ctx128_fullstep.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the external corpus is not part of the repository)")
    raw, an = _unlabelled(path)
    assert an.labels.source == "phases"
    assert list(an.stages["group"]) == ["forward", "backward", "optimizer"]
    full = snapshot_from_dict(raw, str(path))
    ranges = annotation_intervals(full, an.device)
    step = ranges[ranges["name"].str.startswith("Optimizer.step#")].iloc[0]
    ev = an.replay.events
    t = ev["time_us"].to_numpy()
    in_step = (t >= step["start_us"]) & (t <= step["end_us"])
    is_opt = an.labels.labels == "optimizer"
    assert in_step.sum() > 100 and np.array_equal(is_opt, in_step)
    allocs = np.flatnonzero(is_opt & (ev["action"].to_numpy() == A_ALLOC))
    snap = an.run.snapshot
    assert snap is not None
    for sid in np.unique(ev["stack_id"].to_numpy()[allocs]).tolist():
        files = [fr["filename"] for fr in snap.stack(int(sid))]
        assert any(f.endswith(("cs336_basics/optimizers.py", "torch/optim/optimizer.py")) for f in files), files
