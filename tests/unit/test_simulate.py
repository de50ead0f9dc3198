"""The allocator simulator (snapviz.analyses.simulate): fidelity on every bundled sample, the
independent oracle allocator (tests/support/synth.py) on random request streams under other
settings and caps, and hand-made cases for the rules the samples do not exercise."""

from __future__ import annotations

import json

import numpy as np
import pytest

import synth
from paths import SAMPLES
from snapviz.analyses.allocator_rules import parse_alloc_conf, settings_from_record
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.simulate import (
    R_ALLOC,
    R_EMPTY_CACHE,
    R_FREE,
    R_OOM,
    Cap,
    RequestStream,
    fidelity,
    run,
)
from snapviz.analyses.whatif import recorded_cap, replay_stream
from snapviz.load import load
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.model import A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP

MiB = 1 << 20
GiB = 1 << 30
SAMPLE_DIRS = sorted(p for p in SAMPLES.iterdir() if (p / "run.json").is_file())


def _stream(snap, device, cap, rec=None):
    rep = replay_allocator(snap, device)
    settings = settings_from_record(snap.allocator_settings)
    st = replay_stream(rep, settings, cap)  # the what-if driver's own stream of one device
    return rep, settings, st


# Samples the simulator does not reproduce yet (none). gpt2-train-varlen-cap-expandable was one until
# an expandable segment's virtual range followed the card (9/8 of run.json's device total) instead of
# 9/8 of the memory fraction's cap: test_expandable_range_follows_the_card_not_the_fraction.
NOT_YET: set[str] = set()
# Samples whose allocator held memory before the recording began: NCCL's communicator set-up
# reserved a 2 MiB segment (0 B allocated) before train-sd15-ddp-nccl-1rank started recording.
# Where that segment lay is unknown, so the simulation cannot be checked event by event: it must
# say so (approximate), never claim to reproduce the run.
PREDATES_RECORDING = {"train-sd15-ddp-nccl-1rank"}


@pytest.mark.parametrize(
    "sample",
    [pytest.param(p, marks=pytest.mark.xfail(strict=True)) if p.name in NOT_YET else p for p in SAMPLE_DIRS],
    ids=lambda p: p.name,
)
def test_every_sample_is_reproduced_event_by_event(sample):
    """Under the recorded settings and cap the simulated segment events, reserved series and the
    allocator's own peaks (run.json) are the recorded ones (expandable and OOM samples included)."""
    r = load(str(sample))
    rj = json.loads((sample / "run.json").read_text())
    cap = recorded_cap(r)
    assert r.snapshot is not None
    for dev in r.snapshot.devices:
        rep, settings, st = _stream(r.snapshot, dev, cap)
        sim = run(st, settings, cap)
        f = fidelity(st, sim)
        assert st.complete == (sample.name not in PREDATES_RECORDING), (
            "the other samples record from an empty allocator"
        )
        if not st.complete:
            assert st.baseline_reserved > 0 and not f.reproduced
            assert f.reason is not None and "predates the recording" in f.reason
            continue
        assert f.reproduced, f.reason
        seg = np.isin(st.seg_action, [A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP])
        assert seg.all() and len(sim.seg_size) == len(st.seg_size)
        assert (sim.seg_size == st.seg_size).all() and (sim.seg_action == st.seg_action).all()
        assert (sim.reserved[st.event] == rep.events["reserved"].to_numpy()[st.event]).all()
        assert sim.peak_reserved == rep.peak_reserved
        devs = {d["device"]: d for d in rj["allocator"].get("devices") or [rj["allocator"]]}
        if dev in devs:
            assert sim.peak_reserved == devs[dev]["max_memory_reserved"]
            assert sim.peak_allocated == devs[dev]["max_memory_allocated"]
        else:
            assert sim.peak_allocated == rep.peak_allocated
        if (rep.events["action"].to_numpy() == 7).any():  # an oom entry: the simulation runs out there too
            assert sim.oom is not None and sim.oom.recorded and sim.stopped_at is None


def _oracle_check(sim_model: synth.Sim, capacity: int | None, settings_conf: str | None = None) -> None:
    snap = snapshot_from_dict(sim_model.snapshot(marker=False), "synthetic")
    cap = Cap(capacity) if capacity else Cap()
    rep, settings, st = _stream(snap, 0, cap)
    assert st.complete
    res = run(st, settings, cap)
    f = fidelity(st, res)
    assert f.reproduced, f.reason
    _, want_res = sim_model.window_peaks(0)
    assert res.peak_reserved == want_res == sim_model.peak_reserved(0)
    assert res.peak_allocated == sim_model.peak_allocated(0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "kind", ["default", "expandable", "max_split", "streams", "empty_cache", "oom", "oom_expandable"]
)
def test_random_workloads_match_the_oracle(seed, kind):
    """Random diffusion-like request streams through the oracle allocator under several settings;
    the simulator, given only the requests, reproduces every segment event and both peaks."""
    kw: dict = {"n_ops": 700}
    capacity = None
    if kind == "expandable":
        kw["expandable"] = True
    elif kind == "max_split":
        kw["max_split_size"] = [64, 128, 256, 512][seed % 4] * MiB
    elif kind == "streams":
        kw["streams"] = 3
    elif kind == "empty_cache":
        kw["empty_cache_every"] = 37 + seed
    elif kind in ("oom", "oom_expandable"):
        capacity = (3 + seed % 3) * GiB
        kw.update(capacity=capacity, budget=capacity, oom=True, expandable=kind == "oom_expandable")
    model = synth.random_workload(seed, **kw)
    _oracle_check(model, capacity)


def _hand_stream(rows: list[tuple[int, int, int]]) -> RequestStream:
    """A request stream from (kind, addr, size) rows on stream 0, one trace entry each."""
    n = len(rows)
    kind = np.array([r[0] for r in rows], np.int8)
    z = np.zeros(0, np.int64)
    return RequestStream(
        kind=kind,
        event=np.arange(n, dtype=np.int64),
        addr=np.array([r[1] for r in rows], np.int64),
        size=np.array([r[2] for r in rows], np.int64),
        stream=np.zeros(n, np.int64),
        n_events=n,
        seg_event=z,
        seg_action=z.astype(np.int8),
        seg_size=z,
        seg_addr=z,
        recorded_reserved=np.zeros(n, np.int64),
    )


def test_expandable_segments_map_pages_and_unmap_on_empty_cache():
    st = _hand_stream([(R_ALLOC, 1, 30 * MiB), (R_ALLOC, 2, 100), (R_FREE, 1, 0), (R_EMPTY_CACHE, 0, 0)])
    res = run(st, parse_alloc_conf("expandable_segments:True"), Cap())
    # 30 MiB in 20 MiB pages: 40 MiB mapped; 100 B: one 2 MiB small page; then the large pages unmapped
    assert res.seg_action.tolist() == [A_SEG_MAP, A_SEG_MAP, A_SEG_UNMAP]
    assert res.seg_size.tolist() == [40 * MiB, 2 * MiB, 40 * MiB]
    assert res.reserved.tolist() == [40 * MiB, 42 * MiB, 42 * MiB, 2 * MiB]


def test_max_split_size_frees_oversize_blocks_before_the_retry():
    """With max_split_size, a cached oversize block that a smaller request may not take is freed
    (release_available_cached_blocks) when cudaMalloc fails, without counting a retry."""
    rows = [(R_ALLOC, 1, 300 * MiB), (R_FREE, 1, 0), (R_ALLOC, 2, 100 * MiB)]
    res = run(_hand_stream(rows), parse_alloc_conf("max_split_size_mb:200"), Cap(350 * MiB))
    assert res.seg_action.tolist() == [A_SEG_ALLOC, A_SEG_FREE, A_SEG_ALLOC]
    assert res.seg_size.tolist() == [300 * MiB, 300 * MiB, 100 * MiB]
    assert res.retries == 0 and res.oom is None
    # without max_split_size the cached block is reused (split): no new cudaMalloc at all
    res = run(_hand_stream(rows), parse_alloc_conf(""), Cap(350 * MiB))
    assert res.seg_action.tolist() == [A_SEG_ALLOC] and res.peak_reserved == 300 * MiB


def test_a_cap_frees_the_cache_then_runs_out_of_memory():
    rows = [(R_ALLOC, 1, 200 * MiB), (R_ALLOC, 2, 20 * MiB), (R_FREE, 1, 0), (R_ALLOC, 3, 400 * MiB)]
    res = run(_hand_stream(rows), parse_alloc_conf(""), Cap(400 * MiB))
    # the 200 MiB segment is freed (release_cached_blocks), the retry (counted) still cannot fit 400 MiB
    assert res.retries == 1
    assert res.oom is not None and res.oom.event_index == 3 and res.oom.requested_bytes == 400 * MiB
    assert res.stopped_at == 3 and res.oom.reserved_bytes == 20 * MiB and res.oom.allocated_bytes == 20 * MiB


def test_garbage_collection_frees_old_cached_blocks_under_a_fraction():
    """Above threshold x allowed, unsplit cached large blocks are freed before cudaMalloc."""
    rows = [(R_ALLOC, 1, 100 * MiB), (R_FREE, 1, 0), (R_ALLOC, 2, 200 * MiB)]
    conf = parse_alloc_conf("garbage_collection_threshold:0.5")
    res = run(_hand_stream(rows), conf, Cap(1000 * MiB, fraction=True))
    # 100 MiB reserved is below 500 MiB: nothing to collect, the cache stays
    assert res.seg_action.tolist() == [A_SEG_ALLOC, A_SEG_ALLOC]
    res = run(_hand_stream(rows), conf, Cap(150 * MiB, fraction=True))
    # 100 MiB > 75 MiB: the cached block is collected before the cudaMalloc (then 200 MiB > cap: OOM)
    assert res.seg_action.tolist() == [A_SEG_ALLOC, A_SEG_FREE]
    assert res.oom is not None
    # without a fraction garbage collection never runs: the retry frees it instead
    res = run(_hand_stream(rows), conf, Cap(250 * MiB))
    assert res.seg_action.tolist() == [A_SEG_ALLOC, A_SEG_FREE, A_SEG_ALLOC] and res.retries == 1


def test_roundup_power2_divisions_change_block_sizes():
    rows = [(R_ALLOC, 1, 1200 * 1024), (R_ALLOC, 2, 3 * MiB + 1)]
    plain = run(_hand_stream(rows), parse_alloc_conf(""), Cap())
    four = run(_hand_stream(rows), parse_alloc_conf("roundup_power2_divisions:4"), Cap())
    assert plain.peak_allocated == 1200 * 1024 + 3 * MiB + 512
    assert four.peak_allocated == 1280 * 1024 + 3 * MiB + MiB // 2  # 1.17 -> 1.25 MiB, 3 MiB+1 -> 3.5 MiB


def test_incomplete_history_is_said_not_checked():
    model = synth.random_workload(3, n_ops=600, record_from=0.4)
    snap = snapshot_from_dict(model.snapshot(marker=False), "late")
    _, settings, st = _stream(snap, 0, Cap())
    assert not st.complete
    f = fidelity(st, run(st, settings, Cap()))
    assert not f.reproduced and f.diverged_at is None and "predates the recording" in f.reason


@pytest.mark.parametrize(
    "sample", ["sdxl-fp16-oom-10gb", "sd15-fp16-classic-expandable", "train-sd15-amp-fp16", "sd15-fp16-alloc-cap-oom"]
)
def test_compiled_kernel_equals_the_reference(sample):
    """The numba kernel (or, without numba, the kernel's code run by Python) gives the reference's
    per-request figures, segment log and counters under every setting family and cap."""
    from snapviz.analyses import simulate_loop
    from snapviz.analyses.simulate import loop_reference

    snap = load(str(SAMPLES / sample)).snapshot
    _, _, st = _stream(snap, 0, Cap())
    other = simulate_loop.loop_compiled if simulate_loop.KERNEL.compiled() else simulate_loop.loop_python_arrays
    for conf in (
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
        "roundup_power2_divisions:4",
        "garbage_collection_threshold:0.6",
    ):
        for cap in (Cap(), Cap(3 * GiB), Cap(5 * GiB, fraction=True)):
            s = parse_alloc_conf(conf)
            a, b = loop_reference(st, s, cap), other(st, s, cap)
            for f in ("res_at", "all_at", "log_event", "log_action", "log_size"):
                assert np.array_equal(getattr(a, f), getattr(b, f)), (conf, cap, f)
            assert (a.done, a.oom, a.survived, a.mallocs, a.frees, a.retries) == (
                b.done,
                b.oom,
                b.survived,
                b.mallocs,
                b.frees,
                b.retries,
            ), (conf, cap)


@pytest.mark.parametrize("seed", range(4))
def test_entry_to_request_map_matches_its_definition(seed):
    """finish's per-entry series read the last of the first ``done`` requests at the latest entry
    at or before each entry (several requests at one entry: the last), shared by a sweep's
    scenarios and clipped for a stopped one, in sorted and (fallback) unsorted request order,
    up to the entry the program stopped at; entries before the first request's read none."""
    from snapviz.analyses.simulate import _request_at

    rng = np.random.default_rng(seed)
    n, n_ev = 40, 60
    events = np.sort(rng.integers(3, n_ev, n)) if seed % 2 == 0 else rng.integers(3, n_ev, n)
    st = _hand_stream([(R_ALLOC, i, 512) for i in range(n)])
    st = RequestStream(**{**st.__dict__, "event": events.astype(np.int64), "n_events": n_ev, "derived": {}})
    for done in (n, n - 1, n // 2, 1):
        last = n_ev if done == n else int(events[done]) + 1
        want = []
        for i in range(last):
            at = [e for e in events[:done].tolist() if e <= i]
            before = not at or i < events[0]  # before the first request's entry: the baseline
            want.append(-1 if before else max(r for r in range(done) if events[r] == max(at)))
        assert _request_at(st, done).tolist() == want, (seed, done)


def test_a_caught_oom_is_given_back_where_a_scenario_serves_it():
    """sd15-fp16-alloc-cap-oom: cuDNN caught 80 OOMs (workspace retries) before the one that ended
    the run. A scenario that serves such a request gives the block back right after it (the program
    used it and went on); the request that ended the run keeps its block. Without that, 80 workspaces
    of ~100 MiB would stay allocated for ever on a card that has room for them."""
    r = load(str(SAMPLES / "sd15-fp16-alloc-cap-oom"))
    rep, settings, st = _stream(r.snapshot, 0, recorded_cap(r))
    oom = np.flatnonzero(st.kind == R_OOM)
    caught, last = oom[:-1], oom[-1]
    assert len(caught) == 80 and (st.addr[oom] < 0).all() and len(np.unique(st.addr[oom])) == len(oom)
    assert (st.kind[caught + 1] == R_FREE).all() and (st.addr[caught + 1] == st.addr[caught]).all()
    assert (st.event[caught + 1] == st.event[caught]).all()
    assert not (st.addr[last + 1 :] == st.addr[last]).any()  # the fatal one is never given back
    assert fidelity(st, run(st, settings, recorded_cap(r))).reproduced  # the recording is unchanged
    free = run(st, settings, Cap())
    assert free.oom is None and free.survived_recorded_oom == st.event[caught[0]]
    ev = st.event[caught]
    assert (free.allocated[ev] == free.allocated[ev - 1]).all()  # served and given back at once
    # what is left allocated at the end is the recording's plus only the last request's block
    assert (
        free.allocated[-1] - rep.final_allocated == free.allocated[st.event[last]] - free.allocated[st.event[last] - 1]
    )


def test_expandable_range_follows_the_card_not_the_fraction():
    """torch reserves 9/8 of the card's memory for one expandable segment, whatever the memory
    fraction. gpt2-train-varlen-cap-expandable (expandable segments, a 7.33 GiB fraction of a 139.8 GiB
    H200) is reproduced event by event under the card's range; under 9/8 of the cap (what the simulator
    did before) the 785 MiB request at event 18,647 lands elsewhere and the simulation diverges."""
    r = load(str(SAMPLES / "gpt2-train-varlen-cap-expandable"))
    cap = recorded_cap(r)
    rj = json.loads((SAMPLES / "gpt2-train-varlen-cap-expandable" / "run.json").read_text())
    total = rj["allocator"]["cap"]["device_total_bytes"]
    assert cap.fraction and cap.card == total and cap.virtual_range == total + total // 8
    _, settings, st = _stream(r.snapshot, 0, cap)
    assert settings.expandable_segments
    assert fidelity(st, run(st, settings, cap)).reproduced
    short = Cap(cap.limit, True, cap.limit)  # the card taken to be the cap itself
    f = fidelity(st, run(st, settings, short))
    assert not f.reproduced and f.diverged_at == 18_647
    # a card's capacity (no fraction) is the card: its range is 9/8 of the limit
    assert Cap(24 * GiB).virtual_range == 27 * GiB and Cap(24 * GiB, True).virtual_range == Cap().virtual_range
