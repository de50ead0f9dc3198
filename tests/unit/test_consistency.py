"""Snapshots that contradict themselves are analysed and called out; memory from before
the recording counts its requested bytes as recorded in the end state."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import synth
from snapviz.analyses.replay import replay_allocator
from snapviz.load.snapshot.builder import snapshot_from_dict


def _replay(d: dict[str, Any]):  # type: ignore[no-untyped-def]
    return replay_allocator(snapshot_from_dict(d, source="<synthetic>"), 0)


@pytest.fixture(scope="module")
def sim() -> synth.Sim:
    return synth.random_workload(seed=11, n_ops=300)


def test_consistent_snapshot_has_no_such_warning(sim: synth.Sim) -> None:
    res = _replay(sim.snapshot(marker=False))
    assert res.end_state_matches is True
    assert not [w for w in res.warnings if "contradicts" in w or "end state" in w]


def test_live_blocks_beyond_reserved_segments(sim: synth.Sim) -> None:
    """An allocation no segment holds (what Mosaic's generated file does, 2.1 GB in 250 MB)."""
    d = copy.deepcopy(sim.snapshot(marker=False))
    tr = d["device_traces"][0]
    reserved = sum(s["total_size"] for s in d["segments"])
    tr.append({**tr[-1], "action": "alloc", "addr": 0x10, "size": reserved + (1 << 30), "frames": []})
    res = _replay(d)
    msg = [w for w in res.warnings if "contradicts itself" in w]
    assert msg and f"{res.events['allocated'].iat[-1]:,}" in msg[0]


def test_end_state_not_reproduced(sim: synth.Sim) -> None:
    """The end state loses a live block the history says is live: say so, with the count."""
    d = copy.deepcopy(sim.snapshot(marker=False))
    seg = next(s for s in d["segments"] if any(b["state"] == "active_allocated" for b in s["blocks"]))
    blk = next(b for b in seg["blocks"] if b["state"] == "active_allocated")
    blk["state"] = "inactive"
    res = _replay(d)
    assert res.end_state_matches is False
    assert any("does not reproduce the snapshot's end state" in w and "1 blocks" in w for w in res.warnings)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_requested_peak_with_memory_from_before_the_recording(seed: int) -> None:
    """Recording starts after 40% of the work: the requested baseline is the end state's
    requested_size of those blocks, not their (rounded) block sizes."""
    s = synth.random_workload(seed=seed, n_ops=500, record_from=0.4)
    res = _replay(s.snapshot(marker=False))
    assert res.baseline_allocated > 0
    assert res.peak_requested == s.peak_requested(0)
    assert res.peak_requested < res.peak_allocated
