"""The allocator simulator's loop compiled with numba (the ``simulate`` kernel of :mod:`snapviz.compiled`).

The same contract as :func:`snapviz.analyses.simulate.loop_reference`, the plain-Python
reference (one class per allocator structure), and equal to it on every bundled sample and on
the oracle's random workloads (tests/unit/test_simulate.py). Here every structure is an array:

* blocks: one row per block id in ``blk`` (address, size, stream rank, pool, busy, mapped,
  previous, next, expandable segment, gc base); ids of merged-away blocks are reused;
* each pool's cached blocks: keys ``(stream << 44 | size, address)`` kept sorted, with the block
  id beside them (best fit = lower bound; ``BlockComparatorSize``); unmapped blocks of
  expandable segments likewise by ``(stream, address)`` (``BlockComparatorAddress``);
* requests name blocks by a dense code of their recorded address.

Sizes are rounded before the loop by :func:`snapviz.analyses.allocator_rules.round_sizes` and
segment sizes come from :func:`~snapviz.analyses.allocator_rules.allocation_size` per distinct
size, so the rounding rules have one home; ``should_split`` and ``get_free_block``'s oversize
rules are restated in the kernel (four comparisons) and held equal to the reference by the tests.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from snapviz.analyses.allocator_rules import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    NO_LIMIT,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorSettings,
    allocation_size,
    round_sizes,
)
from snapviz.analyses.simulate import (
    _SYNTHETIC_BASE,
    R_ALLOC,
    R_EMPTY_CACHE,
    R_FREE,
    R_FREE_DONE,
    R_FREE_REQ,
    R_OOM,
    Cap,
    LoopOut,
    RequestStream,
    _limit,
    _recorded_addresses,
)
from snapviz.compiled import kernel, readonly
from snapviz.model import A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP

_SIZE_BITS = 44  # sizes below 16 TiB; stream ranks above them in one int64 key

# blk rows
PTR, SIZE, STREAM, SMALL, BUSY, MAPPED, PREV, NEXT, ES, GC = range(10)
# state slots
(
    TOTAL,
    ALLOCATED,
    MALLOCS,
    FREES,
    RETRIES,
    CALLS_SMALL,
    CALLS_LARGE,
    NEXT_REC,
    NEXT_SYN,
    NEXT_VA,
    FREE_TOP,
    LOG_N,
    EVENT,
    N_ES,
) = range(14)


def use_compiled(n_requests: int) -> bool:
    """Whether ``n_requests`` take the compiled loop (from ``simulate`` requests on, with numba)."""
    return KERNEL.wanted(n_requests)


_HELPERS = (
    "_key1",
    "_lower",
    "_pool_insert",
    "_pool_remove",
    "_insert",
    "_remove",
    "_insert_unmapped",
    "_remove_unmapped",
    "_new_block",
    "_drop_block",
    "_splice",
    "_log",
    "_try_merge",
    "_release_block",
    "_unmap_block",
    "_release_blocks",
    "_release_cached_blocks",
    "_map_block",
    "_find_expandable_block",
    "_free_completed",
    "_release_available",
    "_garbage_collect",
)


def loop_compiled(stream: RequestStream, settings: AllocatorSettings, cap: Cap) -> LoopOut:
    """The numba kernel over array structures; same contract as the reference."""
    compiled = KERNEL.compiled()
    if compiled is None:
        raise RuntimeError("numba is not installed (pip install numba)")
    return _call(compiled, stream, settings, cap)


def _reference(stream: RequestStream, settings: AllocatorSettings, cap: Cap) -> LoopOut:
    """:func:`snapviz.analyses.simulate.loop_reference` (imported on use: that module imports this one)."""
    from snapviz.analyses.simulate import loop_reference  # noqa: PLC0415

    return loop_reference(stream, settings, cap)


def loop_python_arrays(stream: RequestStream, settings: AllocatorSettings, cap: Cap) -> LoopOut:
    """The kernel's own code run by Python (slow): lets the tests check the kernel's logic
    without numba, and with numba check that compiling changes nothing."""
    return _call(_kernel_py, stream, settings, cap)


def _call(kernel: Callable[..., Any], stream: RequestStream, settings: AllocatorSettings, cap: Cap) -> LoopOut:
    lim = _limit(stream, cap)
    sizes = stream.size.astype(np.int64, copy=False)
    if "codes" not in stream.derived:  # the same for every scenario of a sweep: computed once
        stream.derived["codes"] = np.unique(stream.addr, return_inverse=True)[1].reshape(-1).astype(np.int64)
        stream.derived["ranks"] = np.unique(stream.stream, return_inverse=True)[1].reshape(-1).astype(np.int64)
        uniq, inv = np.unique(sizes, return_inverse=True)
        stream.derived["sizes"] = uniq.astype(np.int64, copy=False)
        stream.derived["size_codes"] = inv.reshape(-1).astype(np.intp)
    # rounding and segment sizes depend on the size alone: computed per distinct requested size
    # (a few hundred), then spread over the requests with one take
    uniq, inv = stream.derived["sizes"], stream.derived["size_codes"]
    rounded_u = round_sizes(uniq, settings)
    seg_u = np.array([allocation_size(int(u), settings) for u in rounded_u.tolist()], np.int64)
    rounded = rounded_u[inv]
    seg_sizes = seg_u[inv]
    codes, s_rank = stream.derived["codes"], stream.derived["ranks"]
    n_codes = int(codes.max()) + 1 if len(codes) else 0
    rec_addr, rec_size = _recorded_addresses(stream)
    va = lim.virtual_range
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = kernel(
            readonly(stream.kind.astype(np.int8, copy=False)),
            readonly(stream.event.astype(np.int64, copy=False)),
            readonly(sizes),
            rounded.astype(np.int64, copy=False),
            seg_sizes,
            codes,
            n_codes,
            s_rank,
            readonly(rec_addr.astype(np.int64, copy=False)),
            readonly(rec_size.astype(np.int64, copy=False)),
            bool(settings.expandable_segments),
            int(settings.max_split_size),
            int(settings.max_non_split_rounding_size),
            float(settings.garbage_collection_threshold),
            -1 if lim.limit is None else int(lim.limit),
            bool(lim.fraction),
            int(va),
        )
    res_at, all_at, done, oom_arr, survived, counts, log_e, log_a, log_s = out
    oom = None
    if oom_arr[0] >= 0:
        oom = (int(oom_arr[0]), int(oom_arr[1]), int(oom_arr[2]), int(oom_arr[3]), bool(oom_arr[4]))
    return LoopOut(
        res_at,
        all_at,
        int(done),
        oom,
        None if survived < 0 else int(survived),
        int(counts[0]),
        int(counts[1]),
        int(counts[2]),
        log_e,
        log_a.astype(np.int8),
        log_s,
    )


# ----------------------------------------------------------------------------- the kernel
# Every helper below is the reference's method of the same name (snapviz/analyses/simulate.py).


def _key1(stream: int, size: int) -> int:
    return (stream << _SIZE_BITS) | size


def _lower(pk: np.ndarray, pn: np.ndarray, p: int, a: int, b: int) -> int:
    lo = 0
    hi = pn[p]
    while lo < hi:
        mid = (lo + hi) >> 1
        k1 = pk[p, 0, mid]
        if k1 < a or (k1 == a and pk[p, 1, mid] < b):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _pool_insert(pk: np.ndarray, pn: np.ndarray, p: int, a: int, b: int, bid: int) -> None:
    i = _lower(pk, pn, p, a, b)
    n = pn[p]
    for j in range(n, i, -1):
        pk[p, 0, j] = pk[p, 0, j - 1]
        pk[p, 1, j] = pk[p, 1, j - 1]
        pk[p, 2, j] = pk[p, 2, j - 1]
    pk[p, 0, i] = a
    pk[p, 1, i] = b
    pk[p, 2, i] = bid
    pn[p] = n + 1


def _pool_remove(pk: np.ndarray, pn: np.ndarray, p: int, a: int, b: int) -> None:
    i = _lower(pk, pn, p, a, b)
    n = pn[p] - 1
    for j in range(i, n):
        pk[p, 0, j] = pk[p, 0, j + 1]
        pk[p, 1, j] = pk[p, 1, j + 1]
        pk[p, 2, j] = pk[p, 2, j + 1]
    pn[p] = n


def _insert(blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, st: np.ndarray, b: int) -> None:
    """``insert_into_blocks`` (pool 0 small, 1 large), stamping the gc base."""
    p = 0 if blk[SMALL, b] else 1
    _pool_insert(pk, pn, p, _key1(blk[STREAM, b], blk[SIZE, b]), blk[PTR, b], b)
    blk[GC, b] = st[CALLS_SMALL] if p == 0 else st[CALLS_LARGE]


def _remove(blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, b: int) -> None:
    p = 0 if blk[SMALL, b] else 1
    _pool_remove(pk, pn, p, _key1(blk[STREAM, b], blk[SIZE, b]), blk[PTR, b])


def _insert_unmapped(blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, b: int) -> None:
    p = 2 if blk[SMALL, b] else 3
    _pool_insert(pk, pn, p, blk[STREAM, b], blk[PTR, b], b)


def _remove_unmapped(blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, b: int) -> None:
    p = 2 if blk[SMALL, b] else 3
    _pool_remove(pk, pn, p, blk[STREAM, b], blk[PTR, b])


def _new_block(
    blk: np.ndarray, st: np.ndarray, free_ids: np.ndarray, ptr: int, size: int, stream: int, small: int
) -> int:
    st[FREE_TOP] -= 1
    b = free_ids[st[FREE_TOP]]
    blk[PTR, b] = ptr
    blk[SIZE, b] = size
    blk[STREAM, b] = stream
    blk[SMALL, b] = small
    blk[BUSY, b] = 0
    blk[MAPPED, b] = 1
    blk[PREV, b] = -1
    blk[NEXT, b] = -1
    blk[ES, b] = -1
    blk[GC, b] = 0
    return b


def _drop_block(st: np.ndarray, free_ids: np.ndarray, b: int) -> None:
    free_ids[st[FREE_TOP]] = b
    st[FREE_TOP] += 1


def _splice(blk: np.ndarray, b: int, before: int, after: int) -> None:
    blk[PREV, b] = before
    if before >= 0:
        blk[NEXT, before] = b
    blk[NEXT, b] = after
    if after >= 0:
        blk[PREV, after] = b


def _log(st: np.ndarray, log: np.ndarray, action: int, size: int) -> None:
    n = st[LOG_N]
    log[0, n] = st[EVENT]
    log[1, n] = action
    log[2, n] = size
    st[LOG_N] = n + 1


def _try_merge(
    blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, st: np.ndarray, free_ids: np.ndarray, dst: int, src: int
) -> None:
    if src < 0 or blk[BUSY, src] or blk[MAPPED, dst] != blk[MAPPED, src]:
        return
    if blk[MAPPED, src]:
        _remove(blk, pk, pn, src)
    else:
        _remove_unmapped(blk, pk, pn, src)
    if blk[PREV, dst] == src:
        blk[PTR, dst] = blk[PTR, src]
        blk[PREV, dst] = blk[PREV, src]
        if blk[PREV, dst] >= 0:
            blk[NEXT, blk[PREV, dst]] = dst
    else:
        blk[NEXT, dst] = blk[NEXT, src]
        if blk[NEXT, dst] >= 0:
            blk[PREV, blk[NEXT, dst]] = dst
    blk[SIZE, dst] += blk[SIZE, src]
    _drop_block(st, free_ids, src)


def _release_block(
    blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, st: np.ndarray, free_ids: np.ndarray, log: np.ndarray, b: int
) -> None:
    st[FREES] += 1
    _log(st, log, A_SEG_FREE, blk[SIZE, b])
    st[TOTAL] -= blk[SIZE, b]
    _remove(blk, pk, pn, b)
    _drop_block(st, free_ids, b)


def _unmap_block(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    es: np.ndarray,
    b: int,
) -> None:
    e = blk[ES, b]
    base = es[0, e]
    page = es[1, e]
    begin = -(-(blk[PTR, b] - base) // page)
    end = (blk[PTR, b] + blk[SIZE, b] - base) // page
    if begin >= end:
        return
    _remove(blk, pk, pn, b)
    uptr = base + begin * page
    usize = (end - begin) * page
    before = uptr - blk[PTR, b]
    if before > 0:
        bf = _new_block(blk, st, free_ids, blk[PTR, b], before, blk[STREAM, b], blk[SMALL, b])
        blk[ES, bf] = e
        _splice(blk, bf, blk[PREV, b], b)
        _insert(blk, pk, pn, st, bf)
    after = blk[SIZE, b] - before - usize
    if after > 0:
        af = _new_block(blk, st, free_ids, uptr + usize, after, blk[STREAM, b], blk[SMALL, b])
        blk[ES, af] = e
        _splice(blk, af, b, blk[NEXT, b])
        _insert(blk, pk, pn, st, af)
    blk[PTR, b] = uptr
    blk[SIZE, b] = usize
    blk[MAPPED, b] = 0
    _try_merge(blk, pk, pn, st, free_ids, b, blk[PREV, b])
    _try_merge(blk, pk, pn, st, free_ids, b, blk[NEXT, b])
    _insert_unmapped(blk, pk, pn, b)
    st[TOTAL] -= usize
    st[FREES] += 1
    _log(st, log, A_SEG_UNMAP, usize)


def _release_blocks(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    es: np.ndarray,
    p: int,
    scratch: np.ndarray,
) -> None:
    n = pn[p]
    for i in range(n):
        scratch[i] = pk[p, 2, i]
    m = 0
    for i in range(n):
        b = scratch[i]
        if blk[ES, b] >= 0:
            scratch[m] = b  # to unmap, in pool order (m <= i: not yet read entries are untouched)
            m += 1
        elif blk[PREV, b] < 0 and blk[NEXT, b] < 0:
            _release_block(blk, pk, pn, st, free_ids, log, b)
    for i in range(m):
        b = scratch[i]
        _unmap_block(blk, pk, pn, st, free_ids, log, es, b)
        if blk[PREV, b] < 0 and blk[NEXT, b] < 0 and blk[MAPPED, b] == 0:
            _remove_unmapped(blk, pk, pn, b)
            _drop_block(st, free_ids, b)


def _release_cached_blocks(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    es: np.ndarray,
    scratch: np.ndarray,
) -> None:
    _release_blocks(blk, pk, pn, st, free_ids, log, es, 1, scratch)
    _release_blocks(blk, pk, pn, st, free_ids, log, es, 0, scratch)


def _map_block(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    es: np.ndarray,
    b: int,
    size: int,
    cap_limit: int,
    cap_fraction: bool,
) -> bool:
    e = blk[ES, b]
    base = es[0, e]
    page = es[1, e]
    off = blk[PTR, b] - base
    begin = off // page
    end = -(-(off + size) // page)
    nbytes = (end - begin) * page
    if nbytes == 0 or (not cap_fraction and cap_limit >= 0 and st[TOTAL] + nbytes > cap_limit):
        return False
    _remove_unmapped(blk, pk, pn, b)
    blk[MAPPED, b] = 1
    if nbytes < blk[SIZE, b]:
        rest = _new_block(blk, st, free_ids, blk[PTR, b] + nbytes, blk[SIZE, b] - nbytes, blk[STREAM, b], blk[SMALL, b])
        blk[MAPPED, rest] = 0
        blk[ES, rest] = e
        _splice(blk, rest, b, blk[NEXT, b])
        _insert_unmapped(blk, pk, pn, rest)
        blk[SIZE, b] = nbytes
    _try_merge(blk, pk, pn, st, free_ids, b, blk[PREV, b])
    _try_merge(blk, pk, pn, st, free_ids, b, blk[NEXT, b])
    _insert(blk, pk, pn, st, b)
    st[TOTAL] += nbytes
    st[MALLOCS] += 1
    _log(st, log, A_SEG_MAP, nbytes)
    return True


def _find_expandable_block(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    es: np.ndarray,
    small: int,
    size: int,
    stream: int,
    va: int,
) -> int:
    p = 2 if small else 3
    i = _lower(pk, pn, p, stream, -1)
    while i < pn[p] and pk[p, 0, i] == stream:
        c = pk[p, 2, i]
        pv = blk[PREV, c]
        if pv >= 0 and blk[BUSY, pv] == 0:
            c = pv
        n = 0
        x = c
        while n < size and x >= 0 and blk[BUSY, x] == 0:
            n += blk[SIZE, x]
            x = blk[NEXT, x]
        if n >= size:
            return c
        i += 1
    page = SMALL_BUFFER if small else LARGE_BUFFER
    vsize = -(-va // page) * page
    e = st[N_ES]
    st[N_ES] = e + 1
    es[0, e] = st[NEXT_VA]
    es[1, e] = page
    es[2, e] = vsize
    st[NEXT_VA] += vsize + (1 << 30)
    cand = _new_block(blk, st, free_ids, es[0, e], vsize, stream, small)
    blk[MAPPED, cand] = 0
    blk[ES, cand] = e
    _insert_unmapped(blk, pk, pn, cand)
    return cand


def _kernel_py(
    kind: np.ndarray,
    event: np.ndarray,
    size_req: np.ndarray,
    size_rounded: np.ndarray,
    seg_size: np.ndarray,
    code: np.ndarray,
    n_codes: int,
    srank: np.ndarray,
    rec_addr: np.ndarray,
    rec_size: np.ndarray,
    expandable: bool,
    mss: int,
    nsr: int,
    gc_threshold: float,
    cap_limit: int,
    cap_fraction: bool,
    va: int,
) -> Any:  # pragma: no cover - compiled; run by Python in the tests through loop_python_arrays
    n = len(kind)
    cap = 1024
    blk = np.zeros((10, cap), np.int64)
    free_ids = np.arange(cap - 1, -1, -1).astype(np.int64)
    pk = np.zeros((4, 3, cap), np.int64)
    pn = np.zeros(4, np.int64)
    scratch = np.zeros(cap, np.int64)
    st = np.zeros(14, np.int64)
    st[FREE_TOP] = cap
    st[NEXT_SYN] = _SYNTHETIC_BASE
    st[NEXT_VA] = _SYNTHETIC_BASE * 2
    es = np.zeros((3, 64), np.int64)
    log = np.zeros((3, 1024), np.int64)
    live = np.full(n_codes, -1, np.int64)
    pending = np.full(n_codes, -1, np.int64)
    res_at = np.zeros(n, np.int64)
    all_at = np.zeros(n, np.int64)
    oom = np.full(5, -1, np.int64)
    survived = -1
    gc_active = cap_fraction and cap_limit >= 0 and gc_threshold > 0.0
    done = n
    for r in range(n):
        # room for what one request can create: blocks and log entries at most twice the cached ones + a few
        cached = pn[0] + pn[1] + pn[2] + pn[3]
        need = 2 * cached + 16
        if st[FREE_TOP] < need:
            new_cap = max(2 * cap, cap + need)
            nb = np.zeros((10, new_cap), np.int64)
            nb[:, :cap] = blk
            blk = nb
            nf = np.zeros(new_cap, np.int64)
            nf[: st[FREE_TOP]] = free_ids[: st[FREE_TOP]]
            extra = np.arange(new_cap - 1, cap - 1, -1).astype(np.int64)
            nf[st[FREE_TOP] : st[FREE_TOP] + len(extra)] = extra
            free_ids = nf
            st[FREE_TOP] += len(extra)
            npk = np.zeros((4, 3, new_cap), np.int64)
            npk[:, :, :cap] = pk
            pk = npk
            scratch = np.zeros(new_cap, np.int64)
            cap = new_cap
        if log.shape[1] < st[LOG_N] + need:
            nl = np.zeros((3, 2 * log.shape[1] + need), np.int64)
            nl[:, : st[LOG_N]] = log[:, : st[LOG_N]]
            log = nl
        if st[N_ES] + 4 > es.shape[1]:
            ne = np.zeros((3, 2 * es.shape[1]), np.int64)
            ne[:, : st[N_ES]] = es[:, : st[N_ES]]
            es = ne
        st[EVENT] = event[r]
        k = kind[r]
        if k == R_ALLOC or k == R_OOM:
            # ---- malloc
            size = size_rounded[r]
            stream = srank[r]
            small = 1 if size <= SMALL_SIZE else 0
            p = 0 if small else 1
            alloc_size = seg_size[r]
            # get_free_block
            b = -1
            if gc_active:
                if small:
                    st[CALLS_SMALL] += 1
                else:
                    st[CALLS_LARGE] += 1
            i = _lower(pk, pn, p, _key1(stream, size), -1)
            if i < pn[p] and (pk[p, 0, i] >> _SIZE_BITS) == stream:
                c = pk[p, 2, i]
                if blk[ES, c] >= 0 and expandable:
                    j = i + 1
                    while blk[ES, c] >= 0 and j < pn[p] and (pk[p, 0, j] >> _SIZE_BITS) == stream:
                        d = pk[p, 2, j]
                        nd = blk[NEXT, d]
                        ed = blk[SIZE, d] + (blk[SIZE, nd] if nd >= 0 and blk[MAPPED, nd] == 0 else 0)
                        nc = blk[NEXT, c]
                        ec = blk[SIZE, c] + (blk[SIZE, nc] if nc >= 0 and blk[MAPPED, nc] == 0 else 0)
                        if ed >= ec:
                            break
                        c = d
                        j += 1
                bs = blk[SIZE, c]
                # may_take_cached
                ok = bs >= size
                if size < mss and bs >= mss:
                    ok = False
                if size >= mss and bs >= size + nsr:
                    ok = False
                if ok:
                    _remove(blk, pk, pn, c)
                    b = c
            if b < 0:
                if gc_active:
                    _garbage_collect(blk, pk, pn, st, free_ids, log, gc_threshold, cap_limit, scratch)
                for attempt in range(3):
                    if attempt == 1:
                        # release_available_cached_blocks
                        if not _release_available(blk, pk, pn, st, free_ids, log, p, size, stream, mss):
                            continue
                    elif attempt == 2:
                        _release_cached_blocks(blk, pk, pn, st, free_ids, log, es, scratch)
                        st[RETRIES] += 1
                    # alloc_block
                    if cap_fraction and cap_limit >= 0 and st[TOTAL] + alloc_size > cap_limit:
                        continue
                    if expandable:
                        cand = _find_expandable_block(blk, pk, pn, st, free_ids, es, small, size, stream, va)
                        good = True
                        if blk[MAPPED, cand] == 0:
                            good = _map_block(
                                blk,
                                pk,
                                pn,
                                st,
                                free_ids,
                                log,
                                es,
                                cand,
                                min(blk[SIZE, cand], size),
                                cap_limit,
                                cap_fraction,
                            )
                        while good and blk[SIZE, cand] < size:
                            nx = blk[NEXT, cand]
                            good = _map_block(
                                blk,
                                pk,
                                pn,
                                st,
                                free_ids,
                                log,
                                es,
                                nx,
                                min(size - blk[SIZE, cand], blk[SIZE, nx]),
                                cap_limit,
                                cap_fraction,
                            )
                            cand = nx
                        if good:
                            _remove(blk, pk, pn, cand)
                            b = cand
                            break
                        continue
                    if not cap_fraction and cap_limit >= 0 and st[TOTAL] + alloc_size > cap_limit:
                        continue
                    q = st[NEXT_REC]
                    if q < len(rec_addr) and rec_size[q] == alloc_size:
                        ptr = rec_addr[q]
                        st[NEXT_REC] = q + 1
                    else:
                        st[NEXT_REC] = len(rec_addr)
                        ptr = st[NEXT_SYN]
                        st[NEXT_SYN] += alloc_size
                    st[TOTAL] += alloc_size
                    st[MALLOCS] += 1
                    _log(st, log, A_SEG_ALLOC, alloc_size)
                    b = _new_block(blk, st, free_ids, ptr, alloc_size, stream, small)
                    break
            if b < 0:
                if oom[0] < 0 or k != R_OOM:
                    oom[0] = event[r]
                    oom[1] = size_req[r]
                    oom[2] = st[ALLOCATED]
                    oom[3] = st[TOTAL]
                    oom[4] = 1 if k == R_OOM else 0
                if k != R_OOM:
                    done = r
                    break
            else:
                # alloc_found_block / should_split
                rem = blk[SIZE, b] - size
                if small or expandable:
                    split = rem >= MIN_BLOCK_SIZE
                else:
                    split = size < mss and rem > SMALL_SIZE
                if split:
                    nb2 = _new_block(blk, st, free_ids, blk[PTR, b], size, stream, small)
                    blk[ES, nb2] = blk[ES, b]
                    _splice(blk, nb2, blk[PREV, b], b)
                    blk[PTR, b] += size
                    blk[SIZE, b] -= size
                    _insert(blk, pk, pn, st, b)
                    b = nb2
                blk[BUSY, b] = 1
                st[ALLOCATED] += blk[SIZE, b]
                live[code[r]] = b  # a recorded OOM's block too: freed after it when the program went on
                if k == R_OOM and survived < 0:
                    survived = event[r]
        elif k == R_FREE_REQ or k == R_FREE:
            c = code[r]
            b = live[c]
            if b >= 0:
                live[c] = -1
                st[ALLOCATED] -= blk[SIZE, b]
                if k == R_FREE:
                    _free_completed(blk, pk, pn, st, free_ids, b)
                else:
                    pending[c] = b
        elif k == R_FREE_DONE:
            c = code[r]
            b = pending[c]
            pending[c] = -1
            if b < 0 and live[c] >= 0:
                b = live[c]
                live[c] = -1
                st[ALLOCATED] -= blk[SIZE, b]
            if b >= 0:
                _free_completed(blk, pk, pn, st, free_ids, b)
        elif k == R_EMPTY_CACHE:
            _release_cached_blocks(blk, pk, pn, st, free_ids, log, es, scratch)
        res_at[r] = st[TOTAL]
        all_at[r] = st[ALLOCATED]
    counts = np.array([st[MALLOCS], st[FREES], st[RETRIES]], np.int64)
    m = st[LOG_N]
    return res_at, all_at, done, oom, survived, counts, log[0, :m].copy(), log[1, :m].copy(), log[2, :m].copy()


def _free_completed(
    blk: np.ndarray, pk: np.ndarray, pn: np.ndarray, st: np.ndarray, free_ids: np.ndarray, b: int
) -> None:
    blk[BUSY, b] = 0
    _try_merge(blk, pk, pn, st, free_ids, b, blk[PREV, b])
    _try_merge(blk, pk, pn, st, free_ids, b, blk[NEXT, b])
    _insert(blk, pk, pn, st, b)


def _release_available(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    p: int,
    size: int,
    stream: int,
    mss: int,
) -> bool:
    if mss >= NO_LIMIT:
        return False
    key_size = max(size, mss)
    i = _lower(pk, pn, p, _key1(stream, key_size), -1)
    if i < pn[p] and (pk[p, 0, i] >> _SIZE_BITS) == stream:
        b = pk[p, 2, i]
        if blk[ES, b] < 0:
            _release_block(blk, pk, pn, st, free_ids, log, b)
            return True
        return False
    if i == 0:
        return False
    released = 0
    i -= 1
    while released < key_size:
        b = pk[p, 2, i]
        if blk[SIZE, b] < mss or blk[STREAM, b] != stream or blk[ES, b] >= 0:
            break
        released += blk[SIZE, b]
        _release_block(blk, pk, pn, st, free_ids, log, b)
        if i == 0:
            break
        i -= 1
    return released >= key_size


def _garbage_collect(
    blk: np.ndarray,
    pk: np.ndarray,
    pn: np.ndarray,
    st: np.ndarray,
    free_ids: np.ndarray,
    log: np.ndarray,
    gc_threshold: float,
    cap_limit: int,
    scratch: np.ndarray,
) -> None:
    threshold = int(gc_threshold * cap_limit)
    if st[TOTAL] <= threshold:
        return
    target = st[TOTAL] - threshold
    calls = st[CALLS_LARGE]
    total_age = 0
    count = 0
    for i in range(pn[1]):
        b = pk[1, 2, i]
        if blk[PREV, b] < 0 and blk[NEXT, b] < 0 and blk[ES, b] < 0:
            total_age += calls - blk[GC, b]
            count += 1
    if count == 0:
        return
    reclaimed = 0
    freed = True
    while reclaimed < target and freed and count > 0:
        age_threshold = total_age / count
        freed = False
        m = pn[1]
        for i in range(m):
            scratch[i] = pk[1, 2, i]
        for i in range(m):
            c = scratch[i]
            if blk[PREV, c] >= 0 or blk[NEXT, c] >= 0 or blk[ES, c] >= 0:
                continue
            age = calls - blk[GC, c]
            if age >= age_threshold:
                freed = True
                reclaimed += blk[SIZE, c]
                total_age -= age
                count -= 1
                _release_block(blk, pk, pn, st, free_ids, log, c)


# Its helpers are compiled first and put in place of the Python ones in this module (numba
# resolves the kernel's globals when it compiles it); called from Python they give the same results.
KERNEL = kernel(_kernel_py, reference=_reference, compiled_path=loop_compiled, min_size="simulate", helpers=_HELPERS)
