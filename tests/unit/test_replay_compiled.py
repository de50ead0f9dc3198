"""The compiled replay loop (numba) equals the reference loop, to the byte.

Every call ``replay_allocator`` makes to the loop runs both implementations on the same
input and compares every output: per-event block sizes, deltas and alloc/free pairs, the
orphan and unknown counts, and the live set left at the end. Inputs: every bundled
sample, the third-party snapshots beside the checkout, and the randomized oracle workloads
of tests/unit/test_replay.py in each allocator configuration.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paths import EXTERNAL, ROOT
from snapviz.analyses import replay as replay_mod
from snapviz.analyses.replay_loop import LoopInput, LoopResult, block_loop_compiled, block_loop_reference
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from synth import GiB, MiB, random_workload

pytest.importorskip("numba")

SAMPLES = sorted(glob.glob(str(ROOT / "sample_snapshots" / "*" / "snapshot.pickle.xz")))
EXTERNAL_SNAPSHOTS = sorted(glob.glob(str(EXTERNAL / "*.pickle")))


def assert_same(ref: LoopResult, fast: LoopResult) -> None:
    for name in ("delta", "rdelta", "block_size", "free_row", "alloc_row"):
        a, b = getattr(ref, name), getattr(fast, name)
        assert a.dtype == b.dtype == np.int64, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert (ref.orphans, ref.unknown, ref.grown, ref.conflicts, ref.raised) == (
        fast.orphans,
        fast.unknown,
        fast.grown,
        fast.conflicts,
        fast.raised,
    )
    assert ref.live == fast.live


def replay_both(data: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    """Replay every device with both loops compared; the number of loop calls."""
    calls: list[int] = []

    def both(inp: LoopInput) -> LoopResult:
        ref = block_loop_reference(inp)
        assert_same(ref, block_loop_compiled(inp))
        calls.append(len(inp.actions))
        return ref

    monkeypatch.setattr(replay_mod, "block_loop", both)
    snap = snapshot_from_dict(data, source="<test>")
    for dev in snap.devices or [0]:
        replay_mod.replay_allocator(snap, dev)
    return len(calls)


@pytest.mark.skipif(not SAMPLES, reason="no bundled samples")
@pytest.mark.parametrize("path", SAMPLES, ids=[Path(p).parent.name for p in SAMPLES])
def test_compiled_equals_reference_on_samples(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert replay_both(safe_load_pickle(path), monkeypatch) >= 1


@pytest.mark.skipif(not EXTERNAL_SNAPSHOTS, reason="no ../shared/external snapshots")
@pytest.mark.parametrize("path", EXTERNAL_SNAPSHOTS, ids=[Path(p).name for p in EXTERNAL_SNAPSHOTS])
def test_compiled_equals_reference_on_external_snapshots(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert replay_both(safe_load_pickle(path), monkeypatch) >= 1


WORKLOADS: dict[str, dict[str, Any]] = {
    "plain": {},
    "multi_stream": {"streams": 3},
    "expandable": {"expandable": True, "streams": 2, "empty_cache_every": 50},
    "delayed_frees": {"streams": 2, "delayed_frees": True},
    "empty_cache": {"empty_cache_every": 60, "streams": 2, "delayed_frees": True},
    "two_devices": {"devices": 2, "streams": 2, "delayed_frees": True},
    "oom": {"capacity": 6 * GiB, "budget": 8 * GiB, "oom": True},
    "max_split": {"max_split_size": 40 * MiB, "capacity": 5 * GiB, "budget": 8 * GiB, "oom": True},
    "preexisting": {"record_from": 1 / 7, "streams": 2},
    "mid_run_delayed": {"record_from": 0.4, "delayed_frees": True, "streams": 2},
    "truncated": {"max_entries": 700, "delayed_frees": True},
    "truncated_expandable": {"max_entries": 700, "expandable": True},
    "roundup": {"roundup_power2_divisions": 4, "streams": 2, "delayed_frees": True},
    "roundup_per_interval": {"roundup_power2_divisions": {1: 8, 64: 2, 512: 4}, "record_from": 0.4},
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_compiled_equals_reference_on_oracle_workloads(kind: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = random_workload(3000 + 31 * seed + len(kind), 1500, **WORKLOADS[kind])
    assert replay_both(sim.snapshot(marker=False), monkeypatch) >= 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kw", [{}, {"record_from": 0.4, "delayed_frees": True, "streams": 2}])
def test_compiled_equals_reference_when_the_layout_corrects_sizes(
    seed: int, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings not recorded, the run rounded with 4 divisions: blocks are grown by their
    neighbours' addresses and pre-window blocks raised, in both loops alike."""
    sim = random_workload(3100 + seed, 1500, roundup_power2_divisions=4, **kw)
    calls: list[tuple[int, int, int]] = []

    def both(inp: LoopInput) -> LoopResult:
        ref = block_loop_reference(inp)
        assert_same(ref, block_loop_compiled(inp))
        calls.append((ref.grown, ref.conflicts, ref.raised))
        return ref

    monkeypatch.setattr(replay_mod, "block_loop", both)
    replay_mod.replay_allocator(snapshot_from_dict(sim.snapshot(marker=False, settings=False), source="<t>"), 0)
    assert calls and calls[0][0] > 0  # the growing path ran


def test_compiled_equals_reference_on_an_inconsistent_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocs that do not fit any known segment, a double alloc, frees of unknown blocks and a
    free_completed without its request: the fallbacks must agree too."""
    big = 8 * MiB
    trace = [
        {"action": "segment_alloc", "addr": 1 << 30, "size": 4 * big, "stream": 0},
        {"action": "alloc", "addr": 1 << 30, "size": 3 * MiB, "stream": 0},
        {"action": "alloc", "addr": 1 << 30, "size": 3 * MiB, "stream": 0},  # double alloc
        {"action": "alloc", "addr": (1 << 31) + 512, "size": 5 * MiB, "stream": 0},  # outside every segment
        {"action": "free_requested", "addr": 1 << 29, "size": 700, "stream": 0},  # never allocated
        {"action": "free_completed", "addr": 1 << 29, "size": 700, "stream": 0},
        {"action": "free_completed", "addr": 1 << 30, "size": 3 * MiB, "stream": 0},  # request skipped
        {"action": "segment_free", "addr": 1 << 30, "size": 4 * big, "stream": 0},
        {"action": "segment_free", "addr": 1 << 28, "size": big, "stream": 0},  # allocated before
        {"action": "alloc", "addr": (1 << 28) + 4096, "size": 2 * MiB, "stream": 0},
    ]
    data = {
        "segments": [
            {
                "device": 0,
                "address": 1 << 32,
                "total_size": big,
                "allocated_size": big,
                "requested_size": big,
                "stream": 0,
                "segment_type": "large",
                "blocks": [{"address": 1 << 32, "size": big, "requested_size": big, "state": "active_allocated"}],
            }
        ],
        "device_traces": [trace],
    }
    assert replay_both(data, monkeypatch) == 1
