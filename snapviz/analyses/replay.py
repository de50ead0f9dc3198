"""Exact replay of the CUDA caching allocator over a snapshot's trace.

Trace entries carry the *requested* size; ``max_memory_allocated`` counts the size of
the block really handed out. Blocks are rounded as the recorded ``allocator_settings`` say
(:func:`snapviz.analyses.allocator_rules.round_size`: ``< 512 -> 512``, power-of-two
divisions where ``roundup_power2_divisions`` asks for them, else up to a multiple of 512)
and a cached block is split only when the remainder is big enough (>= 512 in
the small pool or with expandable segments; > 1 MiB in the large pool, and only below
``max_split_size``); otherwise the whole cached block is handed out. Since every alloc
names its address and the allocator always hands out the front of a free block, and
free neighbours of one segment always merge, the cached block runs from the alloc's
address to the next allocated-or-pending block of the segment (or the segment's end).

``allocated`` drops at ``free_requested``; the block returns to the cache (merging with
free neighbours of the same segment) at ``free_completed``. ``reserved`` moves with
``segment_alloc/free`` and ``segment_map/unmap``. Memory that existed before the history
began is the end-state ``segments`` minus the trace's net (the *baseline*).

The layout checks each block size: a new block's left neighbour (same segment, nothing
non-free between) must end exactly at its address. A recorded block proven larger is grown;
a block from before the window whose free is recorded counts at least what its neighbours
prove (its size is never taken below that). Where the settings are not recorded (torch
before 2.3) and the layout or the end state contradicts default rounding, or the settings
cannot be honoured, the result is marked ``approximate`` with the reason in ``warnings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from snapviz.analyses.allocator_rules import (
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_SIZE,
    AllocatorSettings,
    round_sizes,
    settings_from_record,
)
from snapviz.analyses.replay_loop import LoopInput, block_loop
from snapviz.arrays import isin_sorted, unique
from snapviz.model import (
    A_ALLOC,
    A_FREE,
    A_FREE_DONE,
    A_FREE_REQ,
    A_SEG_ALLOC,
    A_SEG_FREE,
    A_SEG_MAP,
    A_SEG_UNMAP,
    Snapshot,
)


@dataclass
class ReplayResult:
    """Per-device replay. Series are aligned with ``events`` (one row per trace entry)."""

    device: int
    events: pd.DataFrame  # the device's trace entries, plus replay columns
    baseline_allocated: int  # bytes allocated before the first recorded entry
    baseline_reserved: int
    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    peak_index: int  # row in ``events`` after which allocated is at its peak (-1: before any)
    peak_reserved_index: int
    final_allocated: int  # from the end-state segments
    final_reserved: int
    orphan_frees: int  # frees of blocks never allocated in the window
    unknown_blocks: int  # allocs whose cached block was not known (pre-existing segments)
    end_state_matches: bool | None  # replayed live set == end-state active blocks (None: no end state)
    truncated: bool
    warnings: list[str] = field(default_factory=list)
    approximate: bool = False  # the allocator's rules could not be honoured: figures are not exact
    raised_blocks: int = 0  # blocks from before the window counted above their rounded request

    @property
    def allocated(self) -> np.ndarray:
        return self.events["allocated"].to_numpy()

    def __repr__(self) -> str:
        return (
            f"<ReplayResult device {self.device}: {len(self.events):,} events, peak allocated "
            f"{self.peak_allocated:,} B at event {self.peak_index:,}, peak reserved {self.peak_reserved:,} B"
            f"{', truncated history' if self.truncated else ''}>"
        )


def expandable_segments(snap: Snapshot, device: int, settings: AllocatorSettings | None = None) -> bool:
    """Whether the device's segments are expandable (the setting, or the end state says so)."""
    settings = settings if settings is not None else settings_from_record(snap.allocator_settings)
    segs = snap.segments
    if len(segs):
        return settings.expandable_segments or bool(segs.loc[segs["device"] == device, "is_expandable"].any())
    return settings.expandable_segments


def replay_allocator(snap: Snapshot, device: int) -> ReplayResult:
    """Replay ``device``'s trace; see the module docstring for the rules honoured."""
    ev = snap.device_events(device)
    n = len(ev)
    actions = ev["action"].to_numpy()
    addrs = ev["addr"].to_numpy()
    sizes = ev["size"].to_numpy()
    settings = settings_from_record(snap.allocator_settings)
    max_split = settings.max_split_size
    expandable_mode = expandable_segments(snap, device, settings)
    # segment_map/unmap only exist with expandable segments (settings absent before 2.3)
    expandable_mode = expandable_mode or bool(((actions == A_SEG_MAP) | (actions == A_SEG_UNMAP)).any())

    blocks = snap.blocks
    dev_blocks = blocks[blocks["device"] == device] if len(blocks) else blocks
    live_end = dev_blocks[dev_blocks["state"] == "active_allocated"] if len(dev_blocks) else dev_blocks
    final_live_size: dict[int, int] = (
        dict(zip(live_end["address"].tolist(), live_end["size"].tolist(), strict=True)) if len(live_end) else {}
    )
    segs = snap.segments
    dev_segs = segs[segs["device"] == device] if len(segs) else segs
    final_allocated = int(live_end["size"].sum()) if len(live_end) else 0
    final_requested = int(live_end["requested_size"].sum()) if len(live_end) else 0
    final_reserved = int(dev_segs["total_size"].sum()) if len(dev_segs) else 0

    # FIX (tests/unit/test_replay.py, pre-existing + truncated cases): free blocks are never
    # tracked. Free blocks of a segment always merge with their free neighbours, so the
    # cached block an alloc takes runs from its address to the start of the next *non-free*
    # block (allocated or pending) of the same segment, or to the segment's end. Those
    # boundaries are known even for memory that predates the recording: the end state
    # names every segment and every live block, and a free whose alloc was not recorded
    # names a block that was live since the window began. (The former free-block map
    # could not see pre-existing free space: it mis-sized reuse of it by up to ~100 MiB,
    # and overlapping inserts crashed with KeyError.)
    blk = (actions == A_ALLOC) | (actions == A_FREE_REQ) | (actions == A_FREE_DONE) | (actions == A_FREE)
    b_addr = addrs[blk]
    touched, first = np.unique(b_addr, return_index=True)
    first_is_free = actions[blk][first] != A_ALLOC
    nonfree_a = touched[first_is_free]  # live (or pending) when the window began
    if len(dev_blocks):
        busy_end = dev_blocks.loc[dev_blocks["state"] != "inactive", "address"].to_numpy(np.int64)
        # sorted arrays, no set of millions
        nonfree_a = unique(np.concatenate([nonfree_a, busy_end[~isin_sorted(busy_end, touched)]]))
    sg = (actions == A_SEG_ALLOC) | (actions == A_SEG_FREE)
    s_addr = addrs[sg]
    s_touched, s_first = np.unique(s_addr, return_index=True)
    s_act, s_size = actions[sg], sizes[sg]
    seg_end: dict[int, int] = {}
    for a0, fi in zip(s_touched.tolist(), s_first.tolist(), strict=True):
        if s_act[fi] == A_SEG_FREE:  # freed in the window, allocated before it
            seg_end[a0] = a0 + int(s_size[fi])
    s_touched_set = set(s_touched.tolist())
    if len(dev_segs):
        for a0, tot in zip(dev_segs["address"].tolist(), dev_segs["total_size"].tolist(), strict=True):
            if a0 not in s_touched_set:
                seg_end[a0] = a0 + tot
    rounded = round_sizes(sizes, settings)
    # The loop only decides block sizes and pairs allocs with frees (compiled when numba is
    # installed); the series are cumulative sums of per-event deltas, computed vectorized here.
    loop = block_loop(
        LoopInput(
            actions=actions,
            addrs=addrs,
            sizes=sizes,
            rounded=rounded,
            nonfree=nonfree_a.astype(np.int64, copy=False),
            seg_end=seg_end,
            final_live_size=final_live_size,
            expandable=expandable_mode,
            max_split=max_split,
            has_free_done=bool((actions == A_FREE_DONE).any()),
        )
    )
    orphans, unknown = loop.orphans, loop.unknown
    delta, rdelta, block_size, free_row, alloc_row = (
        loop.delta,
        loop.rdelta,
        loop.block_size,
        loop.free_row,
        loop.alloc_row,
    )
    short = _grow_to_end_state(actions, addrs, delta, block_size, free_row, final_live_size)

    allocated_s = np.cumsum(delta) if n else np.zeros(0, np.int64)
    requested_s = np.cumsum(rdelta) if n else np.zeros(0, np.int64)
    seg_sign = np.select(
        [(actions == A_SEG_ALLOC) | (actions == A_SEG_MAP), (actions == A_SEG_FREE) | (actions == A_SEG_UNMAP)],
        [1, -1],
        0,
    )
    reserved_s = np.cumsum(seg_sign * sizes) if n else np.zeros(0, np.int64)
    allocated = int(allocated_s[-1]) if n else 0
    reserved = int(reserved_s[-1]) if n else 0

    baseline_alloc = final_allocated - allocated if len(snap.segments) else 0
    baseline_res = final_reserved - reserved if len(snap.segments) else 0
    warnings: list[str] = []
    recorded = snap.allocator_settings or {}
    max_entries = recorded.get("trace_alloc_max_entries")
    truncated = bool(recorded.get("trace_alloc_overflowed", False)) or (
        isinstance(max_entries, int) and max_entries > 1 and n >= max_entries
    )
    if truncated:
        warnings.append(
            f"history wrapped: the ring buffer kept only the last {n:,} entries; peaks are for the recorded window"
        )
    if orphans:
        warnings.append(
            f"history incomplete: {orphans:,} frees of blocks allocated before the recorded window "
            "(ring buffer wrapped or recording started late); peaks are for the recorded window"
        )
        truncated = True
    if unknown:
        warnings.append(
            f"{unknown:,} allocations do not fit the segments and live blocks the history implies; "
            "their sizes come from the end state or from rounding"
        )
    if baseline_alloc < 0:
        warnings.append(
            f"replay ends {-baseline_alloc:,} bytes above the end state: the trace is inconsistent "
            "with the segments (allocations after the dump?); baseline clamped to 0"
        )
        baseline_alloc = 0
    if baseline_res < 0:
        baseline_res = 0
    # Blocks from before the recording have their own requested_size in the end state: the
    # requested baseline is that, not their block sizes (which would overstate "requested").
    baseline_req = final_requested - int(requested_s[-1]) if n else final_requested
    baseline_req = min(max(baseline_req, 0), baseline_alloc) if len(snap.segments) else 0
    if loop.raised:
        warnings.append(
            f"{loop.raised:,} blocks allocated before the recording are counted at the size their neighbours "
            "prove (handed out unsplit), above their rounded request"
        )

    # The live set the replay ends with must be the end-state active blocks.
    end_ok: bool | None = None
    if len(snap.segments) and n:
        replay_live = loop.live
        if short:  # the loop's live set, with the blocks the end state proved larger
            replay_live = {
                **replay_live,
                **{a: final_live_size[a] for a in replay_live if final_live_size.get(a, 0) > replay_live[a]},
            }
        if baseline_alloc == 0 and not orphans:
            end_ok = replay_live == final_live_size
        else:
            end_ok = all(final_live_size.get(a) == s for a, s in replay_live.items())
        if not end_ok:
            warnings.append(
                _end_state_difference(replay_live, final_live_size, complete=baseline_alloc == 0 and not orphans)
            )

    off_rules = 0
    if not settings.recorded:
        off_rules = _end_state_off_rules(live_end, settings, expandable_mode)
        off_rules += _segments_off_rules(actions, addrs, sizes, rounded)
    approx = _approximate_reasons(settings, loop.grown + short, loop.conflicts, off_rules, end_ok)
    warnings.extend(approx)

    tot_alloc = allocated_s + baseline_alloc
    tot_res = reserved_s + baseline_res
    if n:
        pi = int(np.argmax(tot_alloc))
        peak = int(tot_alloc[pi])
        if baseline_alloc >= peak:
            pi, peak = -1, baseline_alloc
        pri = int(np.argmax(tot_res))
        peak_res = max(int(tot_res[pri]), baseline_res)
        peak_req = max(int((requested_s + baseline_req).max()), baseline_req)
        over = tot_alloc - tot_res
        if len(snap.segments) and int(over.max()) > 0:
            k = int(np.argmax(over))
            warnings.append(
                f"the file contradicts itself: after event {k:,}, {int(tot_alloc[k]):,} bytes are allocated "
                f"but its segments reserve only {int(tot_res[k]):,} (live blocks always lie inside reserved "
                "segments); the peaks are this file's arithmetic, not what an allocator did"
            )
    else:
        pi, peak, pri, peak_res, peak_req = -1, final_allocated, -1, final_reserved, final_requested
    if final_allocated > final_reserved:
        warnings.append(
            f"the file contradicts itself: its end state holds {final_allocated:,} bytes of live blocks "
            f"in {final_reserved:,} bytes of segments"
        )
    out = ev.assign(
        allocated=tot_alloc,
        reserved=tot_res,
        requested=requested_s + baseline_req,
        block_size=block_size,
        free_row=free_row,
        alloc_row=alloc_row,
    )
    return ReplayResult(
        device=device,
        events=out,
        baseline_allocated=baseline_alloc,
        baseline_reserved=baseline_res,
        peak_allocated=peak,
        peak_reserved=peak_res,
        peak_requested=peak_req,
        peak_index=pi,
        peak_reserved_index=pri,
        final_allocated=final_allocated,
        final_reserved=final_reserved,
        orphan_frees=orphans,
        unknown_blocks=unknown,
        end_state_matches=end_ok,
        truncated=truncated,
        warnings=warnings,
        approximate=bool(approx),
        raised_blocks=loop.raised,
    )


def _end_state_difference(replay_live: dict[int, int], end_live: dict[int, int], complete: bool) -> str:
    """One line saying how the replay's final live set differs from the end state's."""
    wrong_size = sum(1 for a, s in replay_live.items() if a in end_live and end_live[a] != s)
    not_in_end = sum(1 for a in replay_live if a not in end_live)
    parts = [f"{not_in_end:,} blocks the replay leaves live are not live in it"] if not_in_end else []
    if wrong_size:
        parts.append(f"{wrong_size:,} have another size there")
    if complete:
        missing = sum(1 for a in end_live if a not in replay_live)
        if missing:
            parts.append(f"{missing:,} live there were never allocated in the history")
    return (
        "the replay does not reproduce the snapshot's end state ("
        + "; ".join(parts or ["live sets differ"])
        + "): the history and the end state disagree, so numbers may be off"
    )


def _grow_to_end_state(
    actions: np.ndarray,
    addrs: np.ndarray,
    delta: np.ndarray,
    block_size: np.ndarray,
    free_row: np.ndarray,
    final_live_size: dict[int, int],
) -> int:
    """Recorded blocks never freed whose end-state block is larger count at that size (in place).

    The end state holds the size the allocator handed out; the rules give less only when they
    are not the run's (e.g. unrecorded settings). Returns how many blocks were grown.
    """
    n = len(actions)
    rows = np.flatnonzero((actions == A_ALLOC) & (free_row == n))
    if not len(rows) or not final_live_size:
        return 0
    end = np.fromiter((final_live_size.get(a, -1) for a in addrs[rows].tolist()), np.int64, len(rows))
    gap = end - block_size[rows]
    grow = rows[gap > 0]
    delta[grow] += gap[gap > 0]
    block_size[grow] += gap[gap > 0]
    return len(grow)


def _segments_off_rules(actions: np.ndarray, addrs: np.ndarray, sizes: np.ndarray, rounded: np.ndarray) -> int:
    """New segments whose size is not ``allocation_size`` of the request that made them.

    The allocation that needed a new segment is recorded right after its ``segment_alloc``,
    at the segment's address. Only requests of 10 MiB and more are checked: their segment is
    the rounded request rounded up to 2 MiB (smaller ones get a configurable 20 MiB).
    """
    if len(actions) < 2:
        return 0
    i = np.flatnonzero(actions[:-1] == A_SEG_ALLOC)
    i = i[(actions[i + 1] == A_ALLOC) & (addrs[i + 1] == addrs[i])]
    r = rounded[i + 1]
    big = r >= MIN_LARGE_ALLOC
    want = (r + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
    return int((big & (sizes[i] != want)).sum())


def _end_state_off_rules(live_end: pd.DataFrame, settings: AllocatorSettings, expandable: bool) -> int:
    """End-state live blocks whose size the rules cannot give for their requested size.

    Small-pool blocks and blocks of expandable segments are always exactly the rounded
    request; a large-pool block is at least that and, below ``max_split_size``, at most
    1 MiB more (a larger remainder is split off).
    """
    if not len(live_end):
        return 0
    req = live_end["requested_size"].to_numpy(np.int64)
    size = live_end["size"].to_numpy(np.int64)
    known = req > 0
    r = round_sizes(req, settings)
    exact = (r <= SMALL_SIZE) | expandable
    extra = size - r
    bad = np.where(exact, extra != 0, (extra < 0) | ((r < settings.max_split_size) & (extra > SMALL_SIZE)))
    return int((bad & known).sum())


def _approximate_reasons(
    settings: AllocatorSettings, grown: int, conflicts: int, off_rules: int, end_ok: bool | None
) -> list[str]:
    """Why the replay's block sizes cannot be taken as the allocator's (empty: they can).

    Each reason starts with "approximate figures:" so a shortened line still says it.
    """
    out: list[str] = []
    if settings.backend != "native":
        out.append(
            f"approximate figures: the allocator backend is {settings.backend}, "
            "not the caching allocator whose rules the replay follows"
        )
    out.extend(f"approximate figures: {note}" for note in settings.notes)
    evidence = []
    if grown:
        evidence.append(f"{grown:,} blocks end before the next allocation")
    if conflicts:
        evidence.append(f"{conflicts:,} allocations land inside the block before them")
    if off_rules:
        evidence.append(f"{off_rules:,} end-state blocks or new segments sized otherwise")
    if end_ok is False and not settings.recorded:
        evidence.append("end state not reproduced")
    if evidence and not settings.recorded:
        out.append(
            "approximate figures: no allocator settings recorded (torch before 2.3) and the file contradicts "
            f"default rounding ({'; '.join(evidence)}); PYTORCH_CUDA_ALLOC_CONF probably set roundup_power2_divisions"
        )
    elif evidence and (grown or conflicts):
        out.append(
            f"approximate figures: the file's layout contradicts the recorded allocator settings ({'; '.join(evidence)})"
        )
    return out


def live_at(result: ReplayResult, row: int) -> pd.DataFrame:
    """Allocations live just after ``row`` (recorded ones only; the baseline is separate)."""
    ev = result.events
    if row < 0:
        return ev.iloc[0:0]
    is_alloc = ev["action"].to_numpy() == A_ALLOC
    rows = np.arange(len(ev))
    mask = is_alloc & (rows <= row) & (ev["free_row"].to_numpy() > row)
    return ev[mask]
