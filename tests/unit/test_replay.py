"""``replay_allocator`` against an independent model of the caching allocator.

Every workload runs through ``tests/support/synth.py`` (the oracle: it tracks the allocator's
own ``allocated_bytes`` / ``reserved_bytes``), is turned into the snapshot dict torch
would dump, loaded by ``snapshot_from_dict`` and replayed. The replay sees only the
snapshot; the oracle's numbers are never derived from it.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import synth
from paths import ROOT
from snapviz.analyses.replay import ReplayResult, live_at, replay_allocator
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.model import A_ALLOC, A_FREE_REQ, A_SNAPSHOT, Snapshot
from synth import GiB, MiB, Sim, random_workload, round_size


def load(d: Any) -> Snapshot:
    return snapshot_from_dict(d, source="<synthetic>")


def replay_sim(sim: Sim, **snap_kw: Any) -> tuple[list[ReplayResult], list[dict[str, Any]]]:
    """Replay every device; return results and the oracle's truth, taken before the dump."""
    truth = []
    for d in range(len(sim.devices)):
        al, rs = sim.trace_series(d)
        wa, wr = sim.window_peaks(d)
        truth.append(
            {
                "peak_allocated": sim.peak_allocated(d),
                "peak_reserved": sim.peak_reserved(d),
                "window_allocated": wa,
                "window_reserved": wr,
                "allocated": al,
                "reserved": rs,
                "live": sim.live_blocks(d),
                "block_sizes": sim.block_sizes(d),
                "missized": sim.missized_orphans(d),
                "peak_requested": sim.peak_requested(d),
            }
        )
    snap = load(sim.snapshot(marker=False, **snap_kw))
    return [replay_allocator(snap, d) for d in range(len(sim.devices))], truth


def assert_exact(res: ReplayResult, t: dict[str, Any], *, from_start: bool = True) -> None:
    """The replay reproduces the oracle to the byte: peaks, both series, block sizes, live set."""
    assert res.unknown_blocks == 0, res.warnings
    if from_start:
        assert res.peak_allocated == t["peak_allocated"], (res.peak_allocated, t["peak_allocated"])
        assert res.peak_reserved == t["peak_reserved"], (res.peak_reserved, t["peak_reserved"])
    assert res.peak_allocated == t["window_allocated"]
    assert res.peak_reserved == t["window_reserved"]
    np.testing.assert_array_equal(res.events["allocated"].to_numpy(), t["allocated"])
    np.testing.assert_array_equal(res.events["reserved"].to_numpy(), t["reserved"])
    ev = res.events
    is_blk = np.isin(ev["action"].to_numpy(), [A_ALLOC, A_FREE_REQ])
    np.testing.assert_array_equal(ev["block_size"].to_numpy()[is_blk], np.asarray(t["block_sizes"])[is_blk])
    # live set at the end: recorded allocs never freed are live blocks of the right size
    still = ev[(ev["action"] == A_ALLOC) & (ev["free_row"] == len(ev))]
    recorded_live = dict(zip(still["addr"].tolist(), still["block_size"].tolist()))
    assert all(t["live"].get(a) == s for a, s in recorded_live.items())
    assert res.final_allocated == sum(t["live"].values())
    if res.orphan_frees == 0:  # nothing allocated before the window was freed in it
        assert res.baseline_allocated + sum(recorded_live.values()) == sum(t["live"].values())
    assert res.end_state_matches is True
    # the peak row and the live set at the peak are consistent
    if res.peak_index >= 0:
        assert int(ev["allocated"].iloc[res.peak_index]) == res.peak_allocated
        live_sum = int(live_at(res, res.peak_index)["block_size"].sum())
        # pre-window blocks freed before the peak left the baseline: subtract them
        orphan_before = ev.iloc[: res.peak_index + 1]
        orphan_before = orphan_before[(orphan_before["action"] == A_FREE_REQ) & (orphan_before["alloc_row"] < 0)]
        assert live_sum + res.baseline_allocated - int(orphan_before["block_size"].sum()) == res.peak_allocated


# ---------------------------------------------------------------- the oracle against real torch

SAMPLES = sorted(glob.glob(str(ROOT / "sample_snapshots" / "*" / "snapshot.pickle.xz")))


@pytest.mark.skipif(not SAMPLES, reason="no sample_snapshots/*/snapshot.pickle.xz (real torch 2.11 dumps)")
@pytest.mark.parametrize("path", SAMPLES, ids=[Path(p).parent.name for p in SAMPLES])
def test_oracle_reproduces_real_torch_snapshots(path: str) -> None:
    """Fed only a real run's requests (sizes, streams, frees, empty_cache) and cudaMalloc's
    addresses, the model must rebuild what torch 2.11 recorded: every trace entry (so every
    placement, split and reuse), the end-state segments and blocks, and the allocator's own
    ``max_memory_allocated`` / ``max_memory_reserved``. This is what makes it an oracle."""
    real = safe_load_pickle(path)
    run = json.loads((Path(path).parent / "run.json").read_text())
    try:
        # the cap and max_split_size the run had (collectors: memory_limit_bytes; scripts that
        # are not ours: allocator.cap); the model reads the recorded roundup_power2_divisions itself
        cap = run.get("memory_limit_bytes") or ((run.get("allocator") or {}).get("cap") or {}).get("bytes")
        split = (real.get("allocator_settings") or {}).get("max_split_size", -1)
        max_split = int(split) if isinstance(split, int) and 0 < split < 1 << 62 else None
        sim = synth.drive_with_trace(real, capacity=cap, max_split_size=max_split)
    except ValueError as exc:
        pytest.skip(str(exc))
    model = sim.snapshot(marker=False)

    def entries(tr: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        # an OOM entry's device_free is what the driver reported, which no model can know
        return [(e["action"], e.get("addr"), e["size"], e["stream"]) for e in tr if e["action"] != "snapshot"]

    for dev, (mt, rt) in enumerate(zip(model["device_traces"], real["device_traces"])):
        assert entries(mt) == entries(rt), f"cuda:{dev}: the model's trace differs from torch's"

    def blocks(segs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (
                sg["device"],
                sg["address"],
                sg["total_size"],
                sg["segment_type"],
                sg["stream"],
                tuple((b["address"], b["size"], b["state"], b["requested_size"]) for b in sg["blocks"]),
            )
            for sg in segs
        ]

    assert blocks(model["segments"]) == blocks(real["segments"])
    alloc = run.get("allocator") or {}
    if "max_memory_allocated" in alloc:
        assert sim.peak_allocated(0) == alloc["max_memory_allocated"]
        assert sim.peak_reserved(0) == alloc["max_memory_reserved"]
    # and the replay, given the real snapshot, agrees with the oracle on every device
    snap = load(real)
    for dev in range(len(real["device_traces"])):
        if real["device_traces"][dev]:
            res = replay_allocator(snap, dev)
            assert (res.peak_allocated, res.peak_reserved) == (sim.peak_allocated(dev), sim.peak_reserved(dev))
            # a ``snapshot`` marker in the real trace (a dump taken mid-run) is no allocator event
            kept = res.events["action"].to_numpy() != A_SNAPSHOT
            np.testing.assert_array_equal(res.events["allocated"].to_numpy()[kept], sim.trace_series(dev)[0])


# ---------------------------------------------------------------- random workloads, exact


@pytest.mark.parametrize("seed", range(10))
def test_plain_workload_exact(seed: int) -> None:
    sim = random_workload(seed, 1500)
    sim.check_consistency()
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert not res.truncated and res.orphan_frees == 0 and res.baseline_allocated == 0
    assert not res.warnings


@pytest.mark.parametrize("seed", range(6))
def test_multi_stream_exact(seed: int) -> None:
    sim = random_workload(100 + seed, 1500, streams=3)
    sim.check_consistency()
    (res,), (t,) = replay_sim(sim)
    assert len(set(res.events["stream"].tolist())) > 1
    assert_exact(res, t)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("empty_cache_every", [None, 70])
def test_expandable_segments_exact(seed: int, empty_cache_every: int | None) -> None:
    sim = random_workload(200 + seed, 1500, expandable=True, streams=2, empty_cache_every=empty_cache_every)
    sim.check_consistency()
    d = sim.snapshot(marker=False)
    actions = {e["action"] for e in d["device_traces"][0]}
    assert "segment_map" in actions and "segment_alloc" not in actions
    if empty_cache_every:
        assert "segment_unmap" in actions
    assert all(s["is_expandable"] for s in d["segments"])
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)


@pytest.mark.parametrize("seed", range(6))
def test_delayed_frees_exact(seed: int) -> None:
    """``record_stream``: free_completed comes later than free_requested; blocks merge only then."""
    sim = random_workload(300 + seed, 1500, streams=2, delayed_frees=True)
    sim.check_consistency()
    d = sim.snapshot(marker=False)
    tr = d["device_traces"][0]
    gaps = [
        i for i in range(len(tr) - 1) if tr[i]["action"] == "free_requested" and tr[i + 1]["action"] != "free_completed"
    ]
    assert gaps, "workload should delay some frees"
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)


@pytest.mark.parametrize("seed", range(6))
def test_empty_cache_mid_run_exact(seed: int) -> None:
    sim = random_workload(400 + seed, 1500, empty_cache_every=60, streams=2, delayed_frees=True)
    sim.check_consistency()
    (res,), (t,) = replay_sim(sim)
    assert (res.events["action"] == 4).any()  # segment_free happened
    assert_exact(res, t)


@pytest.mark.parametrize("seed", range(5))
def test_two_devices_each_exact(seed: int) -> None:
    sim = random_workload(500 + seed, 1600, devices=2, streams=2, delayed_frees=True)
    sim.check_consistency()
    results, truth = replay_sim(sim)
    assert len(results) == 2
    for d, (res, t) in enumerate(zip(results, truth)):
        assert (res.events["device"] == d).all()
        assert_exact(res, t)
    assert results[0].peak_allocated != results[1].peak_allocated  # really separate histories


@pytest.mark.parametrize("seed", range(4))
def test_oom_entries_and_retries_exact(seed: int) -> None:
    """A small GPU: cudaMalloc fails, the allocator frees cached segments, retries, records ``oom``."""
    sim = random_workload(600 + seed, 1500, capacity=6 * GiB, budget=8 * GiB, oom=True)
    sim.check_consistency()
    d = sim.snapshot(marker=False)
    ooms = [e for e in d["device_traces"][0] if e["action"] == "oom"]
    assert ooms and all("addr" not in e and e["device_free"] >= 0 for e in ooms)
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert res.peak_reserved <= 6 * GiB


@pytest.mark.parametrize("seed", range(3))
def test_max_split_size_exact(seed: int) -> None:
    sim = random_workload(700 + seed, 1500, max_split_size=40 * MiB, capacity=5 * GiB, budget=8 * GiB, oom=True)
    sim.check_consistency()
    assert load(sim.snapshot(marker=False)).allocator_settings["max_split_size"] == 40 * MiB
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)


@pytest.mark.parametrize("omit", [("time_us", "user_metadata", "compile_context"), ("frames",)])
def test_older_torch_keys_missing_exact(omit: tuple[str, ...]) -> None:
    sim = random_workload(800, 1200, streams=2, delayed_frees=True)
    (res,), (t,) = replay_sim(sim, omit=omit, settings=False, annotations=False)
    assert_exact(res, t)


def test_snapshot_marker_entries_are_ignored() -> None:
    sim = random_workload(801, 800)
    sim.snapshot()  # records a `snapshot` entry, seen only by the next dump
    (res,), (t,) = replay_sim(sim)
    assert (res.events["action"] == 8).sum() == 1
    assert_exact(res, t)


# ---------------------------------------------------------------- rounding matters


@pytest.mark.parametrize("seed", range(4))
def test_requested_size_replay_differs_from_block_replay(seed: int) -> None:
    """Summing the trace's (requested) sizes is not ``max_memory_allocated``; the block replay is."""
    sim = random_workload(900 + seed, 1500)
    (res,), (t,) = replay_sim(sim)
    ev = res.events
    sign = np.select([ev["action"] == A_ALLOC, ev["action"] == A_FREE_REQ], [1, -1], 0)
    naive_peak = int(np.cumsum(sign * ev["size"].to_numpy()).max())
    assert naive_peak == t["peak_requested"]  # the oracle agrees on what naive means
    assert naive_peak != t["peak_allocated"]  # ... and it is wrong
    assert res.peak_allocated == t["peak_allocated"]  # the replay is right
    assert res.peak_requested == t["peak_requested"]
    rounded_peak = int(np.cumsum(sign * np.array([round_size(int(s)) for s in ev["size"]])).max())
    assert rounded_peak != t["peak_allocated"], "rounding alone is not enough: unsplit blocks matter too"


# ---------------------------------------------------------------- split rules, by hand


@pytest.mark.parametrize("extra, expect_block", [(0, 15 * MiB), (512, 14 * MiB - 512)])
def test_large_pool_split_needs_more_than_1mib_remainder(extra: int, expect_block: int) -> None:
    """A 15 MiB cached block and a request leaving exactly 1 MiB: handed out whole.
    Leaving 1 MiB + 512: split. A replay using ``>=`` or ignoring the rule fails one case."""
    sim, b = synth.handcrafted_split_sim(extra)
    assert b.block_size == expect_block  # the oracle follows c10's shouldSplit
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert int(res.events["block_size"].iloc[-1]) == expect_block
    assert res.peak_allocated == 5 * MiB + expect_block


@pytest.mark.parametrize("extra", [0, 512])
def test_expandable_segments_split_at_512(extra: int) -> None:
    sim, b = synth.handcrafted_split_sim(extra, expandable=True)
    assert b.block_size == 14 * MiB - extra
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert res.peak_reserved == 20 * MiB  # one 20 MiB page of the large pool


def test_small_pool_splits_down_to_512() -> None:
    sim = Sim()
    sim.alloc(1 * MiB)  # 2 MiB small segment: [1 MiB | 1 MiB free]
    b = sim.alloc(1 * MiB - 700)  # rounds to 1 MiB - 512: leaves 512, which is split off
    c = sim.alloc(100)  # takes that 512-byte block exactly
    assert (b.block_size, c.block_size) == (1 * MiB - 512, 512)
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert res.peak_reserved == 2 * MiB


def test_no_merge_across_adjacent_segments() -> None:
    """cudaMalloc may return adjacent ranges; their free blocks never merge."""
    sim = Sim()
    a = sim.alloc(5 * MiB)  # segment 1: 20 MiB, [5 MiB a | 15 MiB free]
    big = sim.alloc(16 * MiB)  # does not fit the 15 MiB: segment 2 (16 MiB), right after
    assert big.addr == a.addr + 20 * MiB, "precondition: the two segments are adjacent"
    sim.free(big)  # segment 2 is wholly free, adjacent to segment 1's free tail
    c = sim.alloc(14 * MiB)  # best fit: the 15 MiB tail; 1 MiB left -> not split
    assert c.addr == a.addr + 5 * MiB and c.block_size == 15 * MiB
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert int(res.events["block_size"].iloc[-1]) == 15 * MiB


def test_pending_free_does_not_merge_before_free_completed() -> None:
    sim = Sim(event_delay=(50, 50))
    a = sim.alloc(5 * MiB)  # [0,5) a
    y = sim.alloc(5 * MiB)  # [5,10) y, [10,20) free
    sim.record_stream(y, synth.SIDE_STREAMS[0])
    sim.free(y)  # pending: stays a boundary
    sim.free(a)  # [0,5) free, not merged with pending y
    c = sim.alloc(4 * MiB)  # best fit [0,5): leaves 1 MiB -> whole 5 MiB block
    assert c.addr == a.addr and c.block_size == 5 * MiB
    d = sim.snapshot(marker=False)
    assert "active_pending_free" in {b["state"] for s in d["segments"] for b in s["blocks"]}
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    sim.empty_cache()  # synchronizes: free_completed, merge, nothing releasable
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)


def test_max_split_size_oversize_block_handed_out_whole() -> None:
    sim = Sim(max_split_size=30 * MiB)
    a = sim.alloc(40 * MiB)
    sim.free(a)
    b = sim.alloc(35 * MiB)  # >= max_split: the 40 MiB block, unsplit (within 20 MiB)
    assert b.addr == a.addr and b.block_size == 40 * MiB
    c = sim.alloc(12 * MiB)  # oversize cached blocks never serve small requests
    assert c.block_size == 12 * MiB
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)


# ---------------------------------------------------------------- history starts late


def test_preexisting_free_space_is_sized_from_the_end_state() -> None:
    """Weights loaded before recording; the window reuses the free tail of their segment."""
    sim = Sim(record=False)
    w = sim.alloc(5 * MiB, label="load")  # 20 MiB segment: [5 MiB w | 15 MiB free]
    sim.start_recording()
    x = sim.alloc(14 * MiB, label="denoise/0")  # the pre-existing 15 MiB block, unsplit
    assert x.block_size == 15 * MiB
    y = sim.alloc(3 * MiB, label="denoise/0")
    sim.free(y)
    (res,), (t,) = replay_sim(sim)
    assert res.baseline_allocated == w.block_size == 5 * MiB
    assert res.baseline_reserved == 20 * MiB
    assert_exact(res, t)
    assert not res.truncated


@pytest.mark.parametrize("seed", range(6))
def test_preexisting_allocations_baseline_exact(seed: int) -> None:
    """Recording starts after the ``load`` stage: weights are live throughout (the baseline)."""
    sim = random_workload(1000 + seed, 1400, record_from=1 / 7, streams=2)
    sim.check_consistency()
    start_alloc = sim.devices[0].before_window[0]
    (res,), (t,) = replay_sim(sim)
    assert start_alloc > 0
    if not t["missized"]:
        assert res.baseline_allocated == start_alloc
        assert_exact(res, t, from_start=False)
    else:  # a weight freed in the window whose unsplit block size cannot be known
        slack = sum(x for _, x in t["missized"])
        assert abs(res.baseline_allocated - start_alloc) <= slack
    assert res.end_state_matches is True and res.unknown_blocks == 0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "kw",
    [
        dict(record_from=0.5),
        dict(record_from=0.4, delayed_frees=True, streams=2),
        dict(record_from=0.5, expandable=True, empty_cache_every=90),
    ],
)
def test_recording_started_mid_run(seed: int, kw: dict[str, Any]) -> None:
    """Frees of blocks allocated before recording: flagged, and exact wherever knowable."""
    sim = random_workload(1100 + seed, 1500, **kw)
    (res,), (t,) = replay_sim(sim)
    assert res.orphan_frees > 0 and res.truncated
    assert any("window" in w for w in res.warnings)
    assert res.unknown_blocks == 0 and res.end_state_matches is True
    assert res.peak_reserved == t["window_reserved"]
    np.testing.assert_array_equal(res.events["reserved"].to_numpy(), t["reserved"])
    slack = sum(x for _, x in t["missized"])
    assert abs(res.peak_allocated - t["window_allocated"]) <= slack
    last = max((i for i, _ in t["missized"]), default=-1)
    # after the last free whose block size had to be guessed, the series is exact
    np.testing.assert_array_equal(
        res.events["allocated"].to_numpy()[last + 1 :], np.asarray(t["allocated"])[last + 1 :]
    )
    if not slack:
        assert res.peak_allocated == t["window_allocated"]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "kw", [dict(), dict(delayed_frees=True, streams=3, empty_cache_every=80), dict(expandable=True)]
)
def test_truncated_ring_buffer(seed: int, kw: dict[str, Any]) -> None:
    sim = random_workload(1200 + seed, 1500, max_entries=700, **kw)
    assert sim.dropped_entries() > 0
    (res,), (t,) = replay_sim(sim)
    assert len(res.events) == 700
    assert res.truncated
    assert any("window" in w for w in res.warnings)
    assert res.unknown_blocks == 0 and res.end_state_matches is True
    assert res.peak_reserved == t["window_reserved"]
    slack = sum(x for _, x in t["missized"])
    assert abs(res.peak_allocated - t["window_allocated"]) <= slack
    if not slack:
        assert res.peak_allocated == t["window_allocated"]
        np.testing.assert_array_equal(res.events["allocated"].to_numpy(), t["allocated"])
    # the peak is "in the recorded window": never above what the allocator really reached
    assert res.peak_allocated <= t["peak_allocated"]


def test_overflow_flag_marks_truncation_even_below_the_limit() -> None:
    sim = random_workload(1300, 900, max_entries=5000)
    assert sim.dropped_entries() == 0
    (res,), _ = replay_sim(sim)
    assert not res.truncated
    snap = load(sim.snapshot(marker=False, overflow_flag=True))
    snap.allocator_settings["trace_alloc_overflowed"] = True
    assert replay_allocator(snap, 0).truncated


def test_wrong_rule_would_be_caught() -> None:
    """Guard for the guards: replaying with ``>= 1 MiB`` instead of ``> 1 MiB`` differs."""
    sim, b = synth.handcrafted_split_sim(0)
    (res,), (t,) = replay_sim(sim)
    wrong_block = 14 * MiB  # what a ">=" rule would hand out
    assert t["peak_allocated"] != 5 * MiB + wrong_block
    assert res.peak_allocated == t["peak_allocated"]


# ---------------------------------------------------------------- roundup_power2_divisions

ROUNDUPS: list[Any] = [4, {256: 1, 512: 2, 1024: 4}, {1: 8, 64: 2}, 16]


@pytest.mark.parametrize("roundup", ROUNDUPS, ids=["4", "per-interval", "small-8", "16"])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"streams": 2, "delayed_frees": True},
        {"expandable": True},
        {"max_split_size": 40 * MiB, "capacity": 5 * GiB, "budget": 8 * GiB, "oom": True},
    ],
    ids=["plain", "delayed", "expandable", "max_split"],
)
def test_roundup_power2_divisions_exact(roundup: Any, kw: dict[str, Any]) -> None:
    """Under ``roundup_power2_divisions`` (one number or per interval) the replay is exact."""
    sim = random_workload(1400 + len(str(roundup)) + len(kw), 1200, roundup_power2_divisions=roundup, **kw)
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert not res.approximate
    assert not any("approximat" in w for w in res.warnings)


def test_roundup_handed_out_blocks_are_the_divisions() -> None:
    """By hand: 5 MiB + 1 B with 4 divisions is a 6 MiB block (steps of 1 MiB above 4 MiB)."""
    sim = Sim(roundup_power2_divisions=4)
    b = sim.alloc(5 * MiB + 1)
    assert b.block_size == 6 * MiB
    (res,), (t,) = replay_sim(sim)
    assert_exact(res, t)
    assert int(res.events["block_size"].iloc[-1]) == 6 * MiB


@pytest.mark.parametrize("seed", range(3))
def test_roundup_rule_matters(seed: int) -> None:
    """Guard for the guards: the same run with its recorded divisions erased is not exact, and
    says so (the layout contradicts the settings) instead of claiming a match."""
    sim = random_workload(1450 + seed, 1200, roundup_power2_divisions=4, expandable=True)
    d = sim.snapshot(marker=False)
    d["allocator_settings"]["roundup_power2_divisions"] = {str(1 << k): 0 for k in range(16)}
    d["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    res = replay_allocator(load(d), 0)
    assert res.peak_allocated != sim.peak_allocated(0)
    sim2 = random_workload(1450 + seed, 1200, roundup_power2_divisions=4)
    d2 = sim2.snapshot(marker=False)
    d2["allocator_settings"]["roundup_power2_divisions"] = {str(1 << k): 0 for k in range(16)}
    d2["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = ""
    res2 = replay_allocator(load(d2), 0)
    assert res2.approximate and any(
        w.startswith("approximate figures: the file's layout contradicts") for w in res2.warnings
    )


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kw", [{}, {"expandable": True}, {"record_from": 0.4}])
def test_no_settings_contradicting_default_rounding_is_approximate(seed: int, kw: dict[str, Any]) -> None:
    """A snapshot without ``allocator_settings`` (torch < 2.3) from a run that rounded by
    divisions: reported approximate with the reason, never as exact; a run with default
    rounding and no settings is not."""
    sim = random_workload(1500 + seed, 1200, roundup_power2_divisions=4, **kw)
    res = replay_allocator(load(sim.snapshot(marker=False, settings=False)), 0)
    assert res.approximate
    assert any(w.startswith("approximate figures: no allocator settings recorded") for w in res.warnings)
    # sizes the layout and the end state prove are used: the figure is never above the allocator's
    # and never below what the file proves
    assert res.peak_allocated <= sim.window_peaks(0)[0]
    assert not _proof_violations(load(sim.snapshot(marker=False, settings=False)), res)
    plain = random_workload(1500 + seed, 1200, **kw)
    res_plain = replay_allocator(load(plain.snapshot(marker=False, settings=False)), 0)
    assert not res_plain.approximate
    assert res_plain.peak_allocated == plain.window_peaks(0)[0]


# ---------------------------------------------------------------- what the layout proves


def _proof_violations(snap: Snapshot, res: ReplayResult) -> list[str]:
    """Independently of the replay's loop: the allocator hands out the front of a free block
    and free neighbours merge, so a block whose right neighbour (same segment, nothing
    non-free between) is allocated at ``b`` is at least ``b - start``. Every block size the
    replay gives (recorded, or of a block from before the window freed in it) must be at
    least that. Outside expandable segments only."""
    if (snap.allocator_settings or {}).get("expandable_segments") or bool(snap.segments["is_expandable"].any()):
        return []
    ev = res.events
    dev = res.device
    segs = snap.segments[snap.segments["device"] == dev]
    seg = {int(a): int(a) + int(s) for a, s in zip(segs["address"], segs["total_size"])}
    acts, addrs, sizes = ev["action"].tolist(), ev["addr"].tolist(), ev["size"].tolist()
    bsz, arow = ev["block_size"].tolist(), ev["alloc_row"].tolist()
    from snapviz.model import A_FREE, A_FREE_DONE, A_SEG_ALLOC, A_SEG_FREE

    for a, ad, sz in zip(acts, addrs, sizes):  # segments freed in the window existed before it
        if a == A_SEG_FREE and ad not in seg:
            seg[ad] = ad + sz
    blocks = snap.blocks[(snap.blocks["device"] == dev) & (snap.blocks["state"] != "inactive")]
    touched = set(addrs)
    size_of: dict[int, int | None] = {
        int(a): int(s) for a, s in zip(blocks["address"], blocks["size"]) if a not in touched
    }
    first: dict[int, int] = {}
    for a, ad in zip(acts, addrs):
        if a in (A_ALLOC, A_FREE_REQ, A_FREE, A_FREE_DONE):
            first.setdefault(ad, a)
    for ad, a in first.items():
        if a != A_ALLOC:
            size_of[ad] = None  # from before the window, freed in it: size unknown until its free
    has_done = A_FREE_DONE in acts
    lb: dict[int, int] = {}
    out: list[str] = []
    for i, (a, ad, sz) in enumerate(zip(acts, addrs, sizes)):
        if a == A_SEG_ALLOC:
            seg[ad] = ad + sz
        elif a == A_SEG_FREE:
            seg.pop(ad, None)
        elif a == A_ALLOC:
            starts = [s for s in seg if s <= ad < seg[s]]
            if starts:
                left = [p for p in size_of if starts[0] <= p < ad]
                if left:
                    p = max(left)
                    s = size_of[p]
                    if s is None:
                        lb[p] = max(lb.get(p, 0), ad - p)
                    elif p + s < ad:
                        out.append(f"row {i}: block at {p} is {s} B but the next allocation proves {ad - p}")
            size_of[ad] = bsz[i]
        elif a in (A_FREE_REQ, A_FREE) and ad in size_of:
            if arow[i] < 0 and bsz[i] < lb.get(ad, 0):
                out.append(f"row {i}: pre-window block at {ad} counted {bsz[i]} B, its neighbours prove {lb[ad]}")
            if a == A_FREE or not has_done:
                size_of.pop(ad, None)
        elif a == A_FREE_DONE:
            size_of.pop(ad, None)
    return out


def test_preexisting_unsplit_block_sized_by_the_gap_to_its_neighbour() -> None:
    """A block from before the recording, handed out unsplit (1 MiB left over), freed in the
    window: no large-pool block is 1 MiB or smaller, so the gap to the segment's end is its."""
    sim = Sim(record=False)
    a = sim.alloc(5 * MiB)  # 20 MiB segment: [a 5 | 15 free]
    p = sim.alloc(14 * MiB)  # the 15 MiB tail, unsplit
    assert p.block_size == 15 * MiB
    sim.start_recording()
    z = sim.alloc(30 * MiB)  # the peak: a + p + z
    sim.free(p)
    (res,), (t,) = replay_sim(sim)
    assert res.baseline_allocated == a.block_size + p.block_size
    assert res.peak_allocated == t["window_allocated"] == 5 * MiB + 15 * MiB + z.block_size
    assert res.raised_blocks == 1 and any("neighbours" in w for w in res.warnings)
    assert not _proof_violations(load(sim.snapshot(marker=False)), res)


def test_preexisting_unsplit_block_sized_by_a_later_allocation() -> None:
    """A block from before the recording, unsplit; in the window an allocation lands 1 MiB
    past its rounded end and is freed again before the block is: the replay counts the
    block at the size that allocation proves, never the rounded request."""
    sim = Sim(record=False)
    x = sim.alloc(40 * MiB)
    sim.free(x)  # a cached 40 MiB segment
    a = sim.alloc(15 * MiB)  # [a 15 | 25 free]
    b = sim.alloc(25 * MiB)  # [a 15 | b 25]
    sim.free(a)  # [15 free | b 25]
    p = sim.alloc(14 * MiB)  # the 15 MiB block, 1 MiB left over: unsplit
    sim.free(b)  # [p 15 | 25 free]
    assert p.block_size == 15 * MiB and p.addr == x.addr
    sim.start_recording()
    c = sim.alloc(10 * MiB)  # lands at p + 15 MiB: one MiB past p's rounded end
    assert c.addr == p.addr + 15 * MiB
    sim.free(c)
    sim.free(p)  # the gap to the next block is 25 MiB: only c proved p's size
    (res,), (t,) = replay_sim(sim)
    assert res.peak_allocated == t["window_allocated"] == 15 * MiB + 10 * MiB
    assert res.baseline_allocated == 15 * MiB
    assert res.raised_blocks == 1
    assert not _proof_violations(load(sim.snapshot(marker=False)), res)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "kw",
    [
        {"record_from": 0.4},
        {"max_entries": 700, "delayed_frees": True},
        {"record_from": 0.3, "roundup_power2_divisions": 4},
    ],
)
def test_replay_never_below_what_the_layout_proves(seed: int, kw: dict[str, Any]) -> None:
    sim = random_workload(1600 + seed, 1500, **kw)
    (res,), (t,) = replay_sim(sim)
    assert not _proof_violations(load(sim.snapshot(marker=False)), res)
    slack = sum(x for _, x in t["missized"])
    assert t["window_allocated"] - slack <= res.peak_allocated <= t["peak_allocated"]


def test_layout_proofs_hold_on_a_third_party_training_snapshot() -> None:
    """Issue 21: a third-party training step recorded after its weights were allocated."""
    from paths import EXTERNAL

    path = EXTERNAL / "cs336_kk_ctx128_fullstep.pickle"
    if not path.exists():
        pytest.skip("../shared/external/cs336_kk_ctx128_fullstep.pickle is not beside the checkout")
    snap = load(safe_load_pickle(str(path)))
    res = replay_allocator(snap, 0)
    assert not _proof_violations(snap, res)
    assert not res.approximate


@pytest.mark.parametrize("divisions, approximate", [(4, True), (None, False)])
def test_no_settings_new_segment_sized_otherwise_is_approximate(divisions: int | None, approximate: bool) -> None:
    """Trace only (no end state), no settings: a 17 MiB + 1 B request that got a 20 MiB segment
    (4 divisions: steps of 4 MiB above 16 MiB) contradicts default rounding (an 18 MiB segment)."""
    sim = Sim(roundup_power2_divisions=divisions)
    b = sim.alloc(17 * MiB + 1)
    assert b.block_size == (20 * MiB if divisions else 18 * MiB)  # an 18 MiB segment, 1 MiB - 512 too little to split
    d = sim.snapshot(marker=False, settings=False)
    d["segments"] = []
    res = replay_allocator(load(d), 0)
    assert res.approximate is approximate
    assert any("new segments sized otherwise" in w for w in res.warnings) is approximate


def test_allocations_in_an_adjacent_segment_prove_nothing() -> None:
    """cudaMalloc put a 2 MiB small-pool segment right after a 20 MiB large one (as in
    cs336_kk_ctx128_fullstep.pickle): allocations in the small segment land past the large
    block's end, but blocks never span segments, so they prove nothing about it."""
    sim = Sim(record=False)
    big = sim.alloc(20 * MiB)  # a 20 MiB segment, wholly this block
    first = sim.alloc(1000)  # the small pool's 2 MiB segment, right after it
    assert first.addr == big.addr + 20 * MiB, "precondition: the two segments are adjacent"
    sim.start_recording()
    lands = sim.alloc(900 * 1024)  # past the large block's end, but in the other segment
    assert lands.addr - (big.addr + 20 * MiB) == 1024
    sim.free(big)  # freed in the window: its size is its rounded request
    (res,), (t,) = replay_sim(sim)
    assert res.raised_blocks == 0 and not res.approximate
    assert res.peak_allocated == t["window_allocated"]
    assert int(res.events["block_size"].iloc[-1]) == 20 * MiB
