"""Exact replay of the CUDA caching allocator over a snapshot's trace.

Trace entries carry the *requested* size; ``max_memory_allocated`` counts the size of
the block really handed out. Blocks are rounded (``< 512 -> 512``, else up to a multiple
of 512) and a cached block is split only when the remainder is big enough (>= 512 in
the small pool or with expandable segments; > 1 MiB in the large pool, and only below
``max_split_size``); otherwise the whole cached block is handed out. Since every alloc
names its address, the simulation only needs the free blocks of each segment, keyed by
address: the allocator always hands out the front of a free block.

``allocated`` drops at ``free_requested``; the block returns to the cache (merging with
free neighbours of the same segment) at ``free_completed``. ``reserved`` moves with
``segment_alloc/free`` and ``segment_map/unmap``. Memory that existed before the history
began is the end-state ``segments`` minus the trace's net (the *baseline*).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from snapviz.model import (A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP,
                           A_SEG_UNMAP, Snapshot)

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to 1 MiB go to the small pool
EXPANDABLE_SEG = -1   # all mapped ranges of expandable segments may merge when contiguous


def round_size(size: int) -> int:
    """The allocator's ``round_size`` without ``roundup_power2_divisions``."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


@dataclass
class ReplayResult:
    """Per-device replay. Series are aligned with ``events`` (one row per trace entry)."""

    device: int
    events: pd.DataFrame          # the device's trace entries, plus replay columns
    baseline_allocated: int        # bytes allocated before the first recorded entry
    baseline_reserved: int
    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    peak_index: int                # row in ``events`` after which allocated is at its peak (-1: before any)
    peak_reserved_index: int
    final_allocated: int           # from the end-state segments
    final_reserved: int
    orphan_frees: int              # frees of blocks never allocated in the window
    unknown_blocks: int            # allocs whose cached block was not known (pre-existing segments)
    end_state_matches: bool | None # replayed live set == end-state active blocks (None: no end state)
    truncated: bool
    warnings: list[str] = field(default_factory=list)

    @property
    def allocated(self) -> np.ndarray:
        return self.events["allocated"].to_numpy()


def _allocator_options(snap: Snapshot, device: int) -> tuple[bool, int]:
    s = snap.allocator_settings or {}
    expandable = bool(s.get("expandable_segments", False))
    segs = snap.segments
    if len(segs):
        expandable = expandable or bool(segs.loc[segs["device"] == device, "is_expandable"].any())
    mss = s.get("max_split_size", -1)
    max_split = (1 << 62) if (not isinstance(mss, int) or mss <= 0) else int(mss)
    return expandable, max_split


def replay_allocator(snap: Snapshot, device: int) -> ReplayResult:
    """Replay ``device``'s trace; see the module docstring for the rules honoured."""
    ev = snap.device_events(device)
    n = len(ev)
    actions = ev["action"].to_numpy()
    addrs = ev["addr"].to_numpy()
    sizes = ev["size"].to_numpy()
    expandable_mode, max_split = _allocator_options(snap, device)

    blocks = snap.blocks
    dev_blocks = blocks[blocks["device"] == device] if len(blocks) else blocks
    live_end = dev_blocks[dev_blocks["state"] == "active_allocated"] if len(dev_blocks) else dev_blocks
    final_live_size: dict[int, int] = dict(zip(live_end["address"].tolist(), live_end["size"].tolist())) if len(live_end) else {}
    segs = snap.segments
    dev_segs = segs[segs["device"] == device] if len(segs) else segs
    final_allocated = int(live_end["size"].sum()) if len(live_end) else 0
    final_reserved = int(dev_segs["total_size"].sum()) if len(dev_segs) else 0

    free_start: dict[int, tuple[int, int]] = {}   # start -> (size, segment key)
    free_end: dict[int, int] = {}                 # end -> start
    live: dict[int, tuple[int, int, int, int]] = {}   # addr -> (block size, requested, seg, alloc row)
    pending: dict[int, tuple[int, int, int, int]] = {}

    # Segments that predate the trace, for allocs whose cached block is unknown.
    seg_starts = dev_segs["address"].to_numpy() if len(dev_segs) else np.empty(0, np.int64)
    seg_order = np.argsort(seg_starts)
    seg_starts = seg_starts[seg_order]
    seg_ends = seg_starts + (dev_segs["total_size"].to_numpy()[seg_order] if len(dev_segs) else 0)

    def seg_of(addr: int) -> int:
        j = int(np.searchsorted(seg_starts, addr, side="right")) - 1
        if j >= 0 and addr < seg_ends[j]:
            return -(int(seg_order[j]) + 2)
        return 0

    def insert_free(start: int, size: int, seg: int) -> None:
        # Merge with the free neighbours of the same segment (never across segments).
        nxt = free_start.get(start + size)
        if nxt is not None and nxt[1] == seg:
            del free_start[start + size]
            del free_end[start + size + nxt[0]]
            size += nxt[0]
        prv = free_end.get(start)
        if prv is not None:
            pb = free_start[prv]
            if pb[1] == seg:
                del free_end[start]
                start, size = prv, pb[0] + size
        free_start[start] = (size, seg)
        free_end[start + size] = start

    def take_free(start: int) -> tuple[int, int] | None:
        fb = free_start.pop(start, None)
        if fb is not None:
            del free_end[start + fb[0]]
        return fb

    def carve(start: int, size: int) -> None:
        """Remove [start, start+size) from the free blocks (segment_unmap of part of a block)."""
        end = start + size
        for fs, (fsz, seg) in list(free_start.items()):
            fe = fs + fsz
            if fe <= start or fs >= end:
                continue
            take_free(fs)
            if fs < start:
                free_start[fs] = (start - fs, seg)
                free_end[start] = fs
            if fe > end:
                free_start[end] = (fe - end, seg)
                free_end[fe] = end

    # The loop only decides block sizes and pairs allocs with frees; the series are
    # cumulative sums of per-event deltas, computed vectorized afterwards.
    delta = [0] * n          # allocated delta (block bytes)
    rdelta = [0] * n         # requested delta
    block_size = [0] * n
    free_row = [n] * n       # for allocs: row of the free that ends them (n: never)
    alloc_row = [-1] * n     # for frees: row of the matching alloc
    orphans = unknown = 0
    next_key = 1
    acts = actions.tolist()
    ad = addrs.tolist()
    sz = sizes.tolist()
    small_or_exp = expandable_mode
    for i in np.flatnonzero((actions <= A_SEG_UNMAP) | (actions == A_FREE)).tolist():
        a = acts[i]
        if a == A_ALLOC:
            addr = ad[i]; req = sz[i]
            r = MIN_BLOCK if req < MIN_BLOCK else (req + 511) // 512 * 512
            fb = free_start.pop(addr, None)
            if fb is not None:
                fsize, seg = fb
                del free_end[addr + fsize]
                remaining = fsize - r
                if r <= SMALL_SIZE or small_or_exp or seg == EXPANDABLE_SEG:
                    split = remaining >= MIN_BLOCK
                else:
                    split = r < max_split and remaining > SMALL_SIZE
                if split:
                    bsize = r
                    # The remainder keeps the back of the block; its far neighbour was
                    # already merged, so no merge is needed: insert directly.
                    rs = addr + r
                    free_start[rs] = (remaining, seg)
                    free_end[rs + remaining] = rs
                else:
                    bsize = fsize
            else:
                # No known cached block: a pre-existing segment, or history that lost the
                # segment's allocation. The end state knows live blocks exactly.
                bsize = final_live_size.get(addr, r)
                seg = seg_of(addr)
                unknown += 1
            live[addr] = (bsize, req, seg, i)
            block_size[i] = bsize
            delta[i] = bsize
            rdelta[i] = req
        elif a == A_FREE_REQ or a == A_FREE:
            addr = ad[i]
            b = live.pop(addr, None)
            if b is None:
                orphans += 1
                b = (round_size(sz[i]), sz[i], 0, -1)
            else:
                free_row[b[3]] = i
                alloc_row[i] = b[3]
            block_size[i] = b[0]
            delta[i] = -b[0]
            rdelta[i] = -b[1]
            if a == A_FREE:
                if b[2] != 0:
                    insert_free(addr, b[0], b[2])
            else:
                pending[addr] = b
        elif a == A_FREE_DONE:
            addr = ad[i]
            b = pending.pop(addr, None)
            if b is None:
                b = live.pop(addr, None)   # free_requested skipped (skip_actions) or lost
                if b is not None:
                    free_row[b[3]] = i
                    alloc_row[i] = b[3]
                    delta[i] = -b[0]
                    rdelta[i] = -b[1]
                else:
                    orphans += 1
            if b is not None:
                block_size[i] = b[0]
                if b[2] != 0:
                    insert_free(addr, b[0], b[2])
        elif a == A_SEG_ALLOC:
            key = next_key; next_key += 1
            insert_free(ad[i], sz[i], key)
        elif a == A_SEG_FREE:
            fb = take_free(ad[i])
            if fb is None or fb[0] != sz[i]:
                carve(ad[i], sz[i])
        elif a == A_SEG_MAP:
            insert_free(ad[i], sz[i], EXPANDABLE_SEG)
        elif a == A_SEG_UNMAP:
            carve(ad[i], sz[i])

    allocated_s = np.cumsum(np.array(delta, dtype=np.int64)) if n else np.zeros(0, np.int64)
    requested_s = np.cumsum(np.array(rdelta, dtype=np.int64)) if n else np.zeros(0, np.int64)
    seg_sign = np.select([(actions == A_SEG_ALLOC) | (actions == A_SEG_MAP), (actions == A_SEG_FREE) | (actions == A_SEG_UNMAP)], [1, -1], 0)
    reserved_s = np.cumsum(seg_sign * sizes) if n else np.zeros(0, np.int64)
    allocated = int(allocated_s[-1]) if n else 0
    reserved = int(reserved_s[-1]) if n else 0
    block_size = np.array(block_size, dtype=np.int64)
    free_row = np.array(free_row, dtype=np.int64)
    alloc_row = np.array(alloc_row, dtype=np.int64)

    baseline_alloc = final_allocated - allocated if len(snap.segments) else 0
    baseline_res = final_reserved - reserved if len(snap.segments) else 0
    warnings: list[str] = []
    settings = snap.allocator_settings or {}
    max_entries = settings.get("trace_alloc_max_entries")
    truncated = bool(settings.get("trace_alloc_overflowed", False)) or (
        isinstance(max_entries, int) and max_entries > 1 and n >= max_entries)
    if truncated:
        warnings.append(f"history wrapped: the ring buffer kept only the last {n:,} entries; peaks are for the recorded window")
    if orphans:
        warnings.append(
            f"history incomplete: {orphans:,} frees of blocks allocated before the recorded window "
            "(ring buffer wrapped or recording started late); peaks are for the recorded window")
        truncated = True
    if unknown:
        warnings.append(f"{unknown:,} allocations reused cached blocks that predate the recording; "
                        "their sizes come from the end state or from rounding")
    if baseline_alloc < 0:
        warnings.append(f"replay ends {-baseline_alloc:,} bytes above the end state: the trace is inconsistent "
                        "with the segments (allocations after the dump?); baseline clamped to 0")
        baseline_alloc = 0
    if baseline_res < 0:
        baseline_res = 0
    roundup = settings.get("roundup_power2_divisions")
    if isinstance(roundup, dict) and any(_nonzero(v) for v in roundup.values()):
        warnings.append("roundup_power2_divisions is set: block sizes above 512-byte rounding are approximated")

    # The live set the replay ends with must be the end-state active blocks.
    end_ok: bool | None = None
    if len(snap.segments) and n:
        replay_live = {a: b[0] for a, b in live.items()}
        if baseline_alloc == 0 and not orphans:
            end_ok = replay_live == final_live_size
        else:
            end_ok = all(final_live_size.get(a) == s for a, s in replay_live.items())
        if not end_ok:
            warnings.append("the replayed live set differs from the snapshot's end state; numbers may be off")

    tot_alloc = allocated_s + baseline_alloc
    tot_res = reserved_s + baseline_res
    if n:
        pi = int(np.argmax(tot_alloc)); peak = int(tot_alloc[pi])
        if baseline_alloc >= peak:
            pi, peak = -1, baseline_alloc
        pri = int(np.argmax(tot_res)); peak_res = max(int(tot_res[pri]), baseline_res)
        peak_req = int((requested_s + baseline_alloc).max())
    else:
        pi, peak, pri, peak_res, peak_req = -1, final_allocated, -1, final_reserved, final_allocated
    out = ev.assign(allocated=tot_alloc, reserved=tot_res, requested=requested_s + baseline_alloc,
                    block_size=block_size, free_row=free_row, alloc_row=alloc_row)
    return ReplayResult(device=device, events=out, baseline_allocated=baseline_alloc, baseline_reserved=baseline_res,
                        peak_allocated=peak, peak_reserved=peak_res, peak_requested=peak_req, peak_index=pi,
                        peak_reserved_index=pri, final_allocated=final_allocated, final_reserved=final_reserved,
                        orphan_frees=orphans, unknown_blocks=unknown, end_state_matches=end_ok,
                        truncated=truncated, warnings=warnings)


def _nonzero(v: object) -> bool:
    try:
        return int(v) > 1  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False


def live_at(result: ReplayResult, row: int) -> pd.DataFrame:
    """Allocations live just after ``row`` (recorded ones only; the baseline is separate)."""
    ev = result.events
    if row < 0:
        return ev.iloc[0:0]
    is_alloc = ev["action"].to_numpy() == A_ALLOC
    rows = np.arange(len(ev))
    mask = is_alloc & (rows <= row) & (ev["free_row"].to_numpy() > row)
    return ev[mask]
