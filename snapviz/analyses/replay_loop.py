"""The allocator replay's sequential loop: block sizes and alloc/free pairs, event by event.

Two implementations of one contract (see :mod:`snapviz.analyses.replay` for the allocator
rules): :func:`block_loop_reference`, plain Python and the reference, and a numba-compiled
kernel (registered in :mod:`snapviz.compiled` as ``replay``) used for long histories where
numba is installed. Their outputs are equal to the byte on every bundled sample and on the
randomized oracle workloads (tests/unit/test_replay_compiled.py, tests/unit/test_kernels.py).
:func:`block_loop` picks one.

The compiled kernel replaces the reference's dicts keyed by address with arrays indexed
by a dense code per distinct address (``np.unique``: codes sort as addresses do), its
sorted multiset of non-free addresses with a count per code plus a bitmap of the codes
present (next non-free block = next set bit, scanned word by word up to the segment's
end), and keeps the few segments in sorted arrays; no Python object per event.
"""

from __future__ import annotations

import bisect
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from snapviz.analyses.allocator_rules import MIN_BLOCK_SIZE as MIN_BLOCK
from snapviz.analyses.allocator_rules import SMALL_SIZE
from snapviz.arrays import unique
from snapviz.compiled import kernel, readonly
from snapviz.model import A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, A_SEG_ALLOC, A_SEG_FREE, A_SEG_UNMAP

__all__ = ["MIN_BLOCK", "SMALL_SIZE", "LoopInput", "LoopResult", "block_loop"]


@dataclass
class LoopResult:
    """Per-event outputs (aligned with the device's events) and the live set left at the end."""

    delta: np.ndarray  # allocated delta (block bytes)
    rdelta: np.ndarray  # requested delta
    block_size: np.ndarray
    free_row: np.ndarray  # for allocs: row of the free that ends them (n: never)
    alloc_row: np.ndarray  # for frees: row of the matching alloc (-1: none)
    orphans: int  # frees of blocks never allocated in the window
    unknown: int  # allocs whose cached block was not known
    live: dict[int, int]  # addr -> block size, live at the end
    grown: int  # recorded blocks the next allocation proved larger than the rules gave (then grown)
    conflicts: int  # allocations landing inside the block the replay gave their neighbour
    raised: int  # blocks from before the window whose size the layout proved above the rounded request


@dataclass
class LoopInput:
    """What the loop starts from (built by replay_allocator from the events and end state)."""

    actions: np.ndarray  # int8 action codes
    addrs: np.ndarray  # int64
    sizes: np.ndarray  # int64
    rounded: np.ndarray  # int64: round_size of each event's size under the recorded settings
    nonfree: np.ndarray  # int64, sorted and distinct: blocks live or pending when the window began
    seg_end: dict[int, int]  # segment start -> end, for segments existing at the start
    final_live_size: dict[int, int]  # end-state active blocks: addr -> size
    expandable: bool
    max_split: int
    has_free_done: bool


def block_loop(inp: LoopInput) -> LoopResult:
    """The compiled kernel for long histories when numba is installed, else the reference."""
    result: LoopResult = KERNEL.run(len(inp.actions), inp)
    return result


def block_loop_reference(inp: LoopInput) -> LoopResult:
    """The reference: plain Python over lists, dicts and bisect.

    Besides the rules of :mod:`snapviz.analyses.replay`, each allocation is checked against
    its left neighbour (outside expandable segments): the allocator hands out the front of
    a free block and free neighbours merge, so the non-free block just below the new one
    (same segment, nothing non-free between) ends exactly at the new address. A recorded
    block that ends below it was handed out larger (unsplit, or rounded otherwise) and is
    grown to that size (``grown``); one that ends above it is a ``conflict``. A block from
    before the window gets the distance as a lower bound, used when its free is recorded.
    """
    actions = inp.actions
    n = len(actions)
    nonfree = inp.nonfree.tolist()
    seg_end = dict(inp.seg_end)
    seg_starts = sorted(seg_end)
    final_live_size, expandable_mode, max_split = inp.final_live_size, inp.expandable, inp.max_split
    live: dict[int, tuple[int, int, int]] = {}  # addr -> (block size, requested, alloc row)
    pending: dict[int, tuple[int, int, int]] = {}
    pre_lb: dict[int, int] = {}  # block from before the window -> least size its right neighbour proves
    delta = [0] * n
    rdelta = [0] * n
    block_size = [0] * n
    free_row = [n] * n
    alloc_row = [-1] * n
    orphans = unknown = grown = conflicts = raised = 0
    acts = actions.tolist()
    ad = inp.addrs.tolist()
    sz = inp.sizes.tolist()
    rnd = inp.rounded.tolist()
    bisect_right, insort = bisect.bisect_right, bisect.insort

    def release(addr: int) -> None:
        j = bisect.bisect_left(nonfree, addr)
        if j < len(nonfree) and nonfree[j] == addr:
            del nonfree[j]

    def segment(addr: int) -> tuple[int, int]:
        """(start, end) of the known segment holding ``addr``; (-1, 0) when none."""
        j = bisect_right(seg_starts, addr) - 1
        if j < 0:
            return -1, 0
        return seg_starts[j], seg_end[seg_starts[j]]

    for i in np.flatnonzero((actions <= A_SEG_UNMAP) | (actions == A_FREE)).tolist():
        a = acts[i]
        if a == A_ALLOC:
            addr = ad[i]
            req = sz[i]
            r = rnd[i]
            k = bisect_right(nonfree, addr)
            if expandable_mode:
                sstart, send = -1, 0
            else:
                j = bisect_right(seg_starts, addr) - 1
                sstart = seg_starts[j] if j >= 0 else -1
                send = seg_end[sstart] if j >= 0 else 0
            if k > 0 and (p := nonfree[k - 1]) != addr and p >= sstart >= 0 and addr < send:
                # the left neighbour ends exactly here (fronts of free blocks; free neighbours merge)
                held = live.get(p)
                pend = held is None
                if pend:
                    held = pending.get(p)
                if held is not None and held[2] >= 0:
                    gap = addr - p - held[0]
                    if gap > 0:
                        grown += 1
                        row = held[2]
                        delta[row] += gap
                        block_size[row] += gap
                        if pend:
                            pending[p] = (held[0] + gap, held[1], row)
                            delta[free_row[row]] -= gap
                            block_size[free_row[row]] += gap
                        else:
                            live[p] = (held[0] + gap, held[1], row)
                    elif gap < 0:
                        conflicts += 1
                elif held is None and addr - p > pre_lb.get(p, 0):
                    pre_lb[p] = addr - p
            if r <= SMALL_SIZE or expandable_mode:
                # remainders are multiples of 512, so ">= 512 splits" always hands out r
                bsize = r
            else:
                end_ = min(nonfree[k], send) if k < len(nonfree) else send
                if addr >= send or end_ - addr < r or (k > 0 and nonfree[k - 1] == addr):
                    bsize = final_live_size.get(addr, r)  # inconsistent history
                    unknown += 1
                elif r < max_split and end_ - addr - r > SMALL_SIZE:
                    bsize = r
                else:
                    bsize = end_ - addr
            insort(nonfree, addr)
            live[addr] = (bsize, req, i)
            block_size[i] = bsize
            delta[i] = bsize
            rdelta[i] = req
        elif a == A_FREE_REQ or a == A_FREE:
            addr = ad[i]
            b = live.pop(addr, None)
            if b is None:
                orphans += 1
                r = rnd[i]
                bs = max(r, pre_lb.pop(addr, 0))
                if r > SMALL_SIZE and not expandable_mode:
                    # no large-pool block is 1 MiB or smaller: a gap that small up to the next
                    # non-free block belongs to this one (handed out unsplit)
                    sstart, send = segment(addr)
                    k = bisect_right(nonfree, addr)
                    end_ = min(nonfree[k], send) if k < len(nonfree) else send
                    if sstart >= 0 and addr < send and k > 0 and nonfree[k - 1] == addr:
                        if r <= end_ - addr <= r + SMALL_SIZE and end_ - addr > bs:
                            bs = end_ - addr
                if bs > r:
                    raised += 1
                b = (bs, sz[i], -1)
            else:
                free_row[b[2]] = i
                alloc_row[i] = b[2]
            block_size[i] = b[0]
            delta[i] = -b[0]
            rdelta[i] = -b[1]
            if a == A_FREE or not inp.has_free_done:
                release(addr)
            else:
                pending[addr] = b
        elif a == A_FREE_DONE:
            addr = ad[i]
            b = pending.pop(addr, None)
            if b is None:
                b = live.pop(addr, None)  # free_requested skipped (skip_actions) or lost
                if b is not None:
                    free_row[b[2]] = i
                    alloc_row[i] = b[2]
                    delta[i] = -b[0]
                    rdelta[i] = -b[1]
                else:
                    orphans += 1
            if b is not None:
                block_size[i] = b[0]
            release(addr)
        elif a == A_SEG_ALLOC:
            if ad[i] not in seg_end:
                insort(seg_starts, ad[i])
            seg_end[ad[i]] = ad[i] + sz[i]
        elif a == A_SEG_FREE:
            if seg_end.pop(ad[i], None) is not None:
                del seg_starts[bisect.bisect_left(seg_starts, ad[i])]

    def i64(v: list[int]) -> np.ndarray:
        return np.array(v, dtype=np.int64) if n else np.zeros(0, np.int64)

    return LoopResult(
        delta=i64(delta),
        rdelta=i64(rdelta),
        block_size=i64(block_size),
        free_row=i64(free_row),
        alloc_row=i64(alloc_row),
        orphans=orphans,
        unknown=unknown,
        live={a: b[0] for a, b in live.items()},
        grown=grown,
        conflicts=conflicts,
        raised=raised,
    )


def block_loop_compiled(inp: LoopInput) -> LoopResult:
    """The numba kernel over dense address codes; same contract as the reference."""
    kernel = KERNEL.compiled()
    if kernel is None:
        raise RuntimeError("numba is not installed (pip install numba)")
    n = len(inp.actions)
    uniq = unique(np.concatenate([inp.addrs.astype(np.int64, copy=False), inp.nonfree]))
    codes = np.searchsorted(uniq, inp.addrs)
    fl_addr = np.fromiter(inp.final_live_size.keys(), np.int64, len(inp.final_live_size))
    fl_size = np.fromiter(inp.final_live_size.values(), np.int64, len(inp.final_live_size))
    final_by_code = np.full(len(uniq), -1, np.int64)  # end-state size of each event address (-1: none)
    if len(fl_addr) and len(uniq):
        pos = np.minimum(np.searchsorted(uniq, fl_addr), len(uniq) - 1)
        hit = uniq[pos] == fl_addr
        final_by_code[pos[hit]] = fl_size[hit]
    seg_starts = np.array(sorted(inp.seg_end), dtype=np.int64)
    seg_ends = np.array([inp.seg_end[a] for a in seg_starts.tolist()], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = kernel(
            readonly(inp.actions.astype(np.int8, copy=False)),  # the model's dtypes already: no copies
            readonly(inp.addrs.astype(np.int64, copy=False)),
            readonly(inp.sizes.astype(np.int64, copy=False)),
            readonly(inp.rounded.astype(np.int64, copy=False)),
            codes.astype(np.int64, copy=False),
            uniq,
            np.searchsorted(uniq, inp.nonfree),
            seg_starts,
            seg_ends,
            final_by_code,
            inp.expandable,
            inp.max_split,
            inp.has_free_done,
        )
    delta, rdelta, block_size, free_row, alloc_row, live_code, live_bsize, counts = out
    live = dict(zip(uniq[live_code].tolist(), live_bsize.tolist(), strict=True))
    assert len(delta) == n
    return LoopResult(
        delta=delta,
        rdelta=rdelta,
        block_size=block_size,
        free_row=free_row,
        alloc_row=alloc_row,
        orphans=int(counts[0]),
        unknown=int(counts[1]),
        live=live,
        grown=int(counts[2]),
        conflicts=int(counts[3]),
        raised=int(counts[4]),
    )


def _kernel_py(
    acts: np.ndarray,
    ad: np.ndarray,
    sz: np.ndarray,
    rnd: np.ndarray,
    code: np.ndarray,
    uniq: np.ndarray,
    nonfree0: np.ndarray,
    seg_starts0: np.ndarray,
    seg_ends0: np.ndarray,
    final_by_code: np.ndarray,
    expandable: bool,
    max_split: int,
    has_free_done: bool,
) -> Any:  # pragma: no cover - compiled
    n = len(acts)
    n_codes = len(uniq)
    delta = np.zeros(n, np.int64)
    rdelta = np.zeros(n, np.int64)
    block_size = np.zeros(n, np.int64)
    free_row = np.full(n, n, np.int64)
    alloc_row = np.full(n, -1, np.int64)
    # live / pending blocks by address code: row -1 means absent (block size, requested, alloc row)
    live_row = np.full(n_codes, -1, np.int64)
    live_b = np.zeros(n_codes, np.int64)
    live_r = np.zeros(n_codes, np.int64)
    pend_row = np.full(n_codes, -1, np.int64)
    pend_b = np.zeros(n_codes, np.int64)
    pend_r = np.zeros(n_codes, np.int64)
    pre_lb = np.zeros(n_codes, np.int64)  # blocks from before the window: least size proven
    # The reference's sorted multiset of non-free addresses, by code (codes sort as addresses
    # do): a count per code and a bitmap of codes with a non-zero count, for successor queries.
    count = np.zeros(n_codes, np.int64)
    bits = np.zeros(n_codes // 64 + 1, np.uint64)
    for c in nonfree0:
        count[c] += 1
        bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
    n_seg = 0
    for i in range(n):
        if acts[i] == A_SEG_ALLOC:
            n_seg += 1
    starts = np.empty(len(seg_starts0) + n_seg + 1, np.int64)
    ends = np.empty(len(seg_starts0) + n_seg + 1, np.int64)
    ns = len(seg_starts0)
    starts[:ns] = seg_starts0
    ends[:ns] = seg_ends0
    orphans = 0
    unknown = 0
    grown = 0
    conflicts = 0
    raised = 0
    for i in range(n):
        a = acts[i]
        if a == A_ALLOC:
            addr = ad[i]
            req = sz[i]
            c = code[i]
            r = rnd[i]
            j = np.searchsorted(starts[:ns], addr, side="right") - 1
            sstart = starts[j] if j >= 0 else -1
            send = ends[j] if j >= 0 else 0
            if not expandable and j >= 0 and addr < send and count[c] == 0 and c > 0:
                # the previous non-free code below c, among the codes at or above the segment's start
                lo = np.searchsorted(uniq, sstart, side="left")
                prv = -1
                if c - 1 >= lo:
                    w = (c - 1) >> 6
                    sh = np.uint64((c - 1) & 63)
                    word = bits[w] & ((np.uint64(1) << sh) | ((np.uint64(1) << sh) - np.uint64(1)))
                    while True:
                        if word != 0:
                            b = 63
                            while (word >> np.uint64(b)) & np.uint64(1) == 0:
                                b -= 1
                            prv = (w << 6) + b
                            prv = prv if prv >= lo else -1
                            break
                        if w <= lo >> 6:
                            break
                        w -= 1
                        word = bits[w]
                if prv >= 0:
                    p = uniq[prv]
                    if live_row[prv] >= 0 or pend_row[prv] >= 0:
                        is_pend = live_row[prv] < 0
                        held = pend_b[prv] if is_pend else live_b[prv]
                        row = pend_row[prv] if is_pend else live_row[prv]
                        gap = addr - p - held
                        if gap > 0:
                            grown += 1
                            delta[row] += gap
                            block_size[row] += gap
                            if is_pend:
                                pend_b[prv] += gap
                                delta[free_row[row]] -= gap
                                block_size[free_row[row]] += gap
                            else:
                                live_b[prv] += gap
                        elif gap < 0:
                            conflicts += 1
                    elif pend_row[prv] == -1 and addr - p > pre_lb[prv]:
                        pre_lb[prv] = addr - p
            if r <= SMALL_SIZE or expandable:
                bsize = r
            else:
                # the next non-free code after c among the addresses below the segment's end
                hi = np.searchsorted(uniq, send, side="left")
                nxt = -1
                if c + 1 < hi:
                    w = (c + 1) >> 6
                    word = bits[w] & ~((np.uint64(1) << np.uint64((c + 1) & 63)) - np.uint64(1))
                    while True:
                        if word != 0:
                            b = 0
                            while (word >> np.uint64(b)) & np.uint64(1) == 0:
                                b += 1
                            nxt = (w << 6) + b
                            nxt = nxt if nxt < hi else -1
                            break
                        w += 1
                        if w > (hi - 1) >> 6:
                            break
                        word = bits[w]
                end_ = min(uniq[nxt], send) if nxt >= 0 else send
                if addr >= send or end_ - addr < r or count[c] > 0:
                    fb = final_by_code[c]
                    bsize = fb if fb >= 0 else r
                    unknown += 1
                elif r < max_split and end_ - addr - r > SMALL_SIZE:
                    bsize = r
                else:
                    bsize = end_ - addr
            count[c] += 1
            bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
            live_row[c] = i
            live_b[c] = bsize
            live_r[c] = req
            block_size[i] = bsize
            delta[i] = bsize
            rdelta[i] = req
        elif a == A_FREE_REQ or a == A_FREE:
            c = code[i]
            if live_row[c] < 0:
                orphans += 1
                r = rnd[i]
                bb = max(r, pre_lb[c])
                pre_lb[c] = 0
                if r > SMALL_SIZE and not expandable and count[c] > 0:
                    addr = ad[i]
                    j = np.searchsorted(starts[:ns], addr, side="right") - 1
                    send = ends[j] if j >= 0 else 0
                    if j >= 0 and addr < send:
                        hi = np.searchsorted(uniq, send, side="left")
                        nxt = -1
                        if c + 1 < hi:
                            w = (c + 1) >> 6
                            word = bits[w] & ~((np.uint64(1) << np.uint64((c + 1) & 63)) - np.uint64(1))
                            while True:
                                if word != 0:
                                    b = 0
                                    while (word >> np.uint64(b)) & np.uint64(1) == 0:
                                        b += 1
                                    nxt = (w << 6) + b
                                    nxt = nxt if nxt < hi else -1
                                    break
                                w += 1
                                if w > (hi - 1) >> 6:
                                    break
                                word = bits[w]
                        end_ = min(uniq[nxt], send) if nxt >= 0 else send
                        if r <= end_ - addr <= r + SMALL_SIZE and end_ - addr > bb:
                            bb = end_ - addr
                if bb > r:
                    raised += 1
                br = sz[i]
                brow = -1
            else:
                bb, br, brow = live_b[c], live_r[c], live_row[c]
                live_row[c] = -1
                free_row[brow] = i
                alloc_row[i] = brow
            block_size[i] = bb
            delta[i] = -bb
            rdelta[i] = -br
            if a == A_FREE or not has_free_done:
                if count[c] > 0:  # released: one occurrence less
                    count[c] -= 1
                    if count[c] == 0:
                        bits[c >> 6] &= ~(np.uint64(1) << np.uint64(c & 63))
            else:
                pend_row[c] = brow if brow >= 0 else -2  # -2: pending, allocated before the window
                pend_b[c] = bb
                pend_r[c] = br
        elif a == A_FREE_DONE:
            c = code[i]
            if pend_row[c] != -1:
                block_size[i] = pend_b[c]
                pend_row[c] = -1
            elif live_row[c] >= 0:  # free_requested skipped (skip_actions) or lost
                brow = live_row[c]
                live_row[c] = -1
                free_row[brow] = i
                alloc_row[i] = brow
                delta[i] = -live_b[c]
                rdelta[i] = -live_r[c]
                block_size[i] = live_b[c]
            else:
                orphans += 1
            if count[c] > 0:  # released
                count[c] -= 1
                if count[c] == 0:
                    bits[c >> 6] &= ~(np.uint64(1) << np.uint64(c & 63))
        elif a == A_SEG_ALLOC:
            addr = ad[i]
            j = np.searchsorted(starts[:ns], addr, side="left")
            if not (j < ns and starts[j] == addr):
                for m in range(ns, j, -1):
                    starts[m] = starts[m - 1]
                    ends[m] = ends[m - 1]
                starts[j] = addr
                ns += 1
            ends[j] = addr + sz[i]
        elif a == A_SEG_FREE:
            addr = ad[i]
            j = np.searchsorted(starts[:ns], addr, side="left")
            if j < ns and starts[j] == addr:
                for m in range(j, ns - 1):
                    starts[m] = starts[m + 1]
                    ends[m] = ends[m + 1]
                ns -= 1
    live_code = np.flatnonzero(live_row >= 0)
    counts = np.array([orphans, unknown, grown, conflicts, raised], np.int64)
    return delta, rdelta, block_size, free_row, alloc_row, live_code, live_b[live_code], counts


KERNEL = kernel(_kernel_py, reference=block_loop_reference, compiled_path=block_loop_compiled, min_size="replay")
