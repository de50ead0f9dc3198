"""A simulator of PyTorch's CUDA caching allocator, driven by one snapshot's request stream.

The replay (:mod:`snapviz.analyses.replay`) reads placement from the recorded addresses; the
simulator decides placement itself, so it can answer "what if": other allocator settings, a
smaller card. It takes only the *requests* of a recorded history — each ``alloc`` (requested
size, stream), ``free_requested`` / ``free_completed``, the ``oom`` request, and ``empty_cache``
calls — and decides block sizes, splits, reuse, cudaMalloc/cudaFree, retries and OOM itself.

Every rule follows a function of ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.1-2.13; the
sizing rules themselves live in :mod:`snapviz.analyses.allocator_rules`, shared with the replay):

* ``malloc``: round the request (``round_size``), pick the pool (``get_pool``: small for
  <= 1 MiB, per stream through the pool's ordering), search the cache (``get_free_block``); on a
  miss run ``garbage_collect_cached_blocks`` (only under a memory fraction with
  ``garbage_collection_threshold``), then ``alloc_block``; if that fails
  ``release_available_cached_blocks`` (oversize blocks, only with ``max_split_size``) and try
  again; then ``release_cached_blocks`` (every unsplit cached segment) and try once more — that
  attempt is the one ``num_alloc_retries`` counts; then OOM.
* ``get_free_block``: best fit in a set ordered by (stream, size, address); a request below
  ``max_split_size`` never takes an oversize block, a larger one only a block smaller than
  request + ``max_non_split_rounding`` (``may_take_cached``). With expandable segments the block
  before unmapped space counts the unmapped space in its size for the best fit.
* ``alloc_block``: under a memory fraction (``set_per_process_memory_fraction``) the request's
  *allocation size* must fit below the allowed maximum; otherwise cudaMalloc fails when the card
  is full. ``get_allocation_size`` sizes the segment (2 MiB; 20 MiB below 10 MiB; else rounded
  up to 2 MiB).
* ``alloc_found_block`` / ``should_split``: the front of the block is handed out; the remainder
  stays cached when ``should_split`` says so.
* ``free_block`` / ``try_merge_blocks``: a block returned to the cache merges with its free
  neighbours of the same segment (never across segments).
* ``release_blocks`` / ``release_block``: ``empty_cache`` frees every cached segment that is
  not split; expandable segments unmap every whole page under free blocks (``unmap_block``).
* ``garbage_collect_cached_blocks``: above ``threshold x allowed`` reserved, unsplit cached
  large-pool blocks at least as old as the average (age = free-block searches of the pool since
  the block was cached) are freed, repeatedly, until enough is reclaimed.
* expandable segments (``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``):
  one virtual range per stream and pool, mapped in pages of 2 MiB (small pool) or 20 MiB (large
  pool) at the lowest address where the request fits; every split keeps a remainder >= 512 B.

What the request stream cannot hold, and so is not simulated: CUDA graph pools, streams'
events beyond what the recording shows (a block comes back to the cache at its recorded
``free_completed``), ``cudaMallocAsync``, and memory that predates the recording (its
placement is unknown: the simulator then carries it as an opaque baseline and says so).
``empty_cache`` calls are recognised as bursts of ``segment_free``/``segment_unmap`` entries
with no request between that the allocator itself did not cause (see :func:`request_stream`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from snapviz.analyses.allocator_rules import (
    LARGE_BUFFER,
    NO_LIMIT,
    SMALL_BUFFER,
    AllocatorSettings,
    allocation_size,
    may_take_cached,
    round_size,
    should_split,
)
from snapviz.model import (
    A_ALLOC,
    A_FREE,
    A_FREE_DONE,
    A_FREE_REQ,
    A_OOM,
    A_SEG_ALLOC,
    A_SEG_FREE,
    A_SEG_MAP,
    A_SEG_UNMAP,
)

# Request kinds of the stream the simulator consumes (one row per request).
R_ALLOC, R_FREE_REQ, R_FREE_DONE, R_FREE, R_EMPTY_CACHE, R_OOM = range(6)
# Segment actions the simulator logs, with the model's action codes.
SEGMENT_ACTIONS = (A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP)
_SMALL_MAX = 1 << 20
# Virtual range of one expandable segment when the card is not known. torch reserves 1 1/8 of the
# card's memory (``ExpandableSegment``: ``prop.totalGlobalMem + totalGlobalMem / 8``), whatever
# the memory fraction: the range decides where the unmapped tail ends, and a request that fits no
# hole is mapped at that tail, or, where the tail is too short, in a new segment. Too short a range
# (1 1/8 of a fraction's cap instead of the card) put gpt2-train-varlen-cap-expandable's 785 MiB
# request elsewhere than torch did.
_DEFAULT_VA = 1 << 40
_SYNTHETIC_BASE = 1 << 52  # cudaMalloc addresses the simulator makes up, above any real one


@dataclass(frozen=True)
class Cap:
    """The memory the allocator may hold: ``fraction`` (``set_per_process_memory_fraction``:
    checked by the allocator itself, and the only case where ``garbage_collection_threshold``
    acts) or a card's capacity (cudaMalloc / cuMemCreate fail when it is full). None: no limit."""

    limit: int | None = None
    fraction: bool = False
    card: int | None = None  # the card's memory, when known (an expandable segment's range is 9/8 of it)

    @property
    def virtual_range(self) -> int:
        """Bytes of virtual address space one expandable segment reserves: 9/8 of the card (the
        card is the limit itself when it is a card's capacity, not a memory fraction)."""
        total = self.card if self.card is not None else self.limit if not self.fraction else None
        return total + total // 8 if total else _DEFAULT_VA


@dataclass
class RequestStream:
    """The requests of one device's history, in order (built by :func:`request_stream`)."""

    kind: np.ndarray  # int8 R_* codes
    event: np.ndarray  # int64: the trace entry each request comes from
    addr: np.ndarray  # int64: the recorded address (pairs frees with allocs)
    size: np.ndarray  # int64: requested bytes (the rounded size for an oom request)
    stream: np.ndarray  # int64: the recorded cudaStream_t
    n_events: int
    seg_event: np.ndarray  # recorded segment entries: event index
    seg_action: np.ndarray  # action code
    seg_size: np.ndarray
    seg_addr: np.ndarray
    recorded_reserved: np.ndarray  # per event, the recording's reserved bytes (baseline included)
    baseline_allocated: int = 0
    baseline_reserved: int = 0
    orphan_frees: int = 0
    empty_cache_calls: int = 0
    notes: list[str] = field(default_factory=list)
    derived: dict[str, np.ndarray] = field(default_factory=dict)  # settings-free columns the kernel reuses

    @property
    def complete(self) -> bool:
        """Whether the history starts from an empty allocator (nothing predates the recording)."""
        return self.baseline_reserved == 0 and self.orphan_frees == 0


@dataclass
class OomInfo:
    event_index: int
    requested_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    recorded: bool  # the recording ran out of memory at this request too


@dataclass
class SimResult:
    """One simulated scenario. Series are per trace entry (the state after it)."""

    reserved: np.ndarray
    allocated: np.ndarray
    peak_reserved: int
    peak_allocated: int
    peak_reserved_index: int
    fragmentation: int  # reserved - allocated at the reserved peak
    device_mallocs: int  # cudaMalloc + segment maps
    device_frees: int  # cudaFree + segment unmaps
    retries: int
    oom: OomInfo | None
    stopped_at: int | None  # event index where the simulated program died (its OOM), else None
    seg_event: np.ndarray
    seg_action: np.ndarray
    seg_size: np.ndarray
    survived_recorded_oom: int | None = None  # event of a recorded OOM this scenario does not hit


# --------------------------------------------------------------------------- the allocator


class _Block:
    __slots__ = ("ptr", "size", "stream", "small", "busy", "mapped", "prev", "next", "es", "gc_base")

    def __init__(self, ptr: int, size: int, stream: int, small: bool) -> None:
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.small = small
        self.busy = False  # allocated, or freed but not yet back in the cache
        self.mapped = True
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.es: _Segment | None = None
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        self.prev = before
        if before is not None:
            before.next = self
        self.next = after
        if after is not None:
            after.prev = self


class _Segment:
    """One expandable segment: a virtual range mapped page by page."""

    __slots__ = ("ptr", "page", "size")

    def __init__(self, ptr: int, page: int, size: int) -> None:
        self.ptr, self.page, self.size = ptr, page, size


class _Pool:
    """``BlockPool``: cached blocks ordered by (stream, size, address), unmapped ones by (stream, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}
        self.ukeys: list[tuple[int, int]] = []
        self.unmapped: dict[tuple[int, int], _Block] = {}
        self.calls = 0  # get_free_blocks_call_count (garbage collection ages)

    def insert(self, b: _Block) -> None:  # insert_into_blocks
        k = (b.stream, b.size, b.ptr)
        bisect.insort(self.keys, k)
        self.blocks[k] = b
        b.gc_base = self.calls

    def remove(self, b: _Block) -> None:
        k = (b.stream, b.size, b.ptr)
        del self.blocks[k]
        del self.keys[bisect.bisect_left(self.keys, k)]

    def insert_unmapped(self, b: _Block) -> None:
        k = (b.stream, b.ptr)
        bisect.insort(self.ukeys, k)
        self.unmapped[k] = b

    def remove_unmapped(self, b: _Block) -> None:
        k = (b.stream, b.ptr)
        del self.unmapped[k]
        del self.ukeys[bisect.bisect_left(self.ukeys, k)]


class Allocator:
    """One device's caching allocator under ``settings`` and ``cap``.

    ``addresses``: the recorded cudaMalloc results (address, size) in order; while the
    simulation asks for the same sizes it gets the same addresses (best fit breaks ties by
    address, so this keeps ties as the recording had them), then made-up ones above them.
    """

    def __init__(self, settings: AllocatorSettings, cap: Cap, addresses: list[tuple[int, int]] | None = None) -> None:
        self.s = settings
        self.cap = cap
        self.small = _Pool(True)
        self.large = _Pool(False)
        self.total = 0  # total_allocated_memory: reserved bytes
        self.allocated = 0
        self.mallocs = self.frees = self.retries = 0
        self.log_action: list[int] = []
        self.log_size: list[int] = []
        self.log_event: list[int] = []
        self.event = 0
        self._addresses = addresses or []
        self._next_recorded = 0
        self._next_synthetic = _SYNTHETIC_BASE
        self._next_va = _SYNTHETIC_BASE * 2
        self.gc_active = cap.fraction and cap.limit is not None and settings.garbage_collection_threshold > 0.0

    # ---- bookkeeping
    def _log(self, action: int, size: int) -> None:
        self.log_action.append(action)
        self.log_size.append(size)
        self.log_event.append(self.event)

    def _cuda_malloc(self, size: int) -> int:
        i = self._next_recorded
        if i < len(self._addresses) and self._addresses[i][1] == size:
            self._next_recorded = i + 1
            return self._addresses[i][0]
        self._next_recorded = len(self._addresses)  # diverged: no recorded address fits any more
        ptr = self._next_synthetic
        self._next_synthetic += size
        return ptr

    def _physical_fits(self, nbytes: int) -> bool:
        return self.cap.fraction or self.cap.limit is None or self.total + nbytes <= self.cap.limit

    # ---- malloc
    def malloc(self, orig_size: int, stream: int) -> _Block | None:
        """``malloc``: the block handed out, or None when the allocator runs out of memory."""
        s = self.s
        size = round_size(orig_size, s)
        pool = self.small if size <= _SMALL_MAX else self.large
        alloc_size = allocation_size(size, s)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if self.gc_active:
                self._garbage_collect()
            block = self._alloc_block(pool, size, alloc_size, stream, False)
            if block is None and self._release_available_cached_blocks(pool, size, stream):
                block = self._alloc_block(pool, size, alloc_size, stream, False)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(pool, size, alloc_size, stream, True)
            if block is None:
                return None
        if should_split(block.size, size, s):  # alloc_found_block
            rest = block
            block = _Block(rest.ptr, size, stream, pool.small)
            block.es = rest.es
            block.splice(rest.prev, rest)
            rest.ptr += size
            rest.size -= size
            pool.insert(rest)
        block.busy = True
        self.allocated += block.size
        return block

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        if self.gc_active:
            pool.calls += 1
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        b = pool.blocks[keys[i]]
        if b.es is not None and self.s.expandable_segments:
            # best fit counts the unmapped space after a block of an expandable segment
            def esize(x: _Block) -> int:
                n = x.next
                return x.size + (n.size if n is not None and not n.mapped else 0)

            j = i + 1
            while b.es is not None and j < len(keys) and keys[j][0] == stream:
                c = pool.blocks[keys[j]]
                if esize(c) >= esize(b):
                    break
                b, j = c, j + 1
        if not may_take_cached(size, b.size, self.s):
            return None
        pool.remove(b)
        return b

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int, retry: bool) -> _Block | None:
        if retry:
            self.retries += 1
        cap = self.cap
        if cap.fraction and cap.limit is not None and self.total + alloc_size > cap.limit:
            return None
        if self.s.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._physical_fits(alloc_size):
            return None
        ptr = self._cuda_malloc(alloc_size)
        self.total += alloc_size
        self.mallocs += 1
        self._log(A_SEG_ALLOC, alloc_size)
        return _Block(ptr, alloc_size, stream, pool.small)

    # ---- frees
    def free_requested(self, b: _Block) -> None:
        """``free``: allocated bytes drop now; the block stays busy until :meth:`free_completed`."""
        self.allocated -= b.size

    def free_completed(self, b: _Block) -> None:
        """``free_block``: back to the cache, merged with free neighbours of its segment."""
        b.busy = False
        pool = self.small if b.small else self.large
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert(b)

    def _try_merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> None:
        if src is None or src.busy or dst.mapped != src.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # ---- releasing memory
    def _release_block(self, b: _Block, pool: _Pool) -> None:
        self.frees += 1
        self._log(A_SEG_FREE, b.size)
        self.total -= b.size
        pool.remove(b)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        mss = self.s.max_split_size
        if mss >= NO_LIMIT:
            return False
        key_size = max(size, mss)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, key_size, -1))
        if i < len(keys) and keys[i][0] == stream:
            b = pool.blocks[keys[i]]
            if b.es is None:
                self._release_block(b, pool)
                return True
            return False
        # no single block is large enough: free oversize blocks, largest first
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < key_size:
            b = pool.blocks[keys[i]]
            if b.size < mss or b.stream != stream or b.es is not None:
                break
            released += b.size
            self._release_block(b, pool)
            if i == 0:
                break
            i -= 1
        return released >= key_size

    def release_cached_blocks(self) -> None:
        """``release_cached_blocks`` (``torch.cuda.empty_cache()`` and the last retry of malloc)."""
        self._release_blocks(self.large)
        self._release_blocks(self.small)

    def _release_blocks(self, pool: _Pool) -> None:
        to_unmap = []
        for k in list(pool.keys):
            b = pool.blocks[k]
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b, pool)
        for b in to_unmap:
            self._unmap_block(b, pool)
            if b.prev is None and b.next is None and not b.mapped:
                pool.remove_unmapped(b)  # release_expandable_segment: the whole range is unmapped

    def _garbage_collect(self) -> None:
        limit = self.cap.limit
        assert limit is not None
        threshold = int(self.s.garbage_collection_threshold * limit)
        if self.total <= threshold:
            return
        target = self.total - threshold
        pool = self.large
        calls = pool.calls
        total_age = 0
        count = 0
        for k in pool.keys:
            b = pool.blocks[k]
            if not b.is_split() and b.es is None:
                total_age += calls - b.gc_base
                count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for k in list(pool.keys):
                c = pool.blocks.get(k)
                if c is None or c.is_split() or c.es is not None:
                    continue
                age = calls - c.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += c.size
                    total_age -= age
                    count -= 1
                    self._release_block(c, pool)

    # ---- expandable segments
    def _try_allocate_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        cand = self._find_expandable_block(pool, size, stream)
        if not cand.mapped and not self._map_block(cand, min(cand.size, size), pool):
            return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None
            if not self._map_block(nxt, min(size - cand.size, nxt.size), pool):
                return None
            cand = nxt
        pool.remove(cand)
        return cand

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block:
        def free_run(b: _Block | None) -> bool:
            n = 0
            while n < size and b is not None and not b.busy:
                n += b.size
                b = b.next
            return n >= size

        ukeys = pool.ukeys
        i = bisect.bisect_left(ukeys, (stream, -1))
        while i < len(ukeys) and ukeys[i][0] == stream:
            c = pool.unmapped[ukeys[i]]
            if c.prev is not None and not c.prev.busy:
                c = c.prev
            if free_run(c):
                return c
            i += 1
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        va = self.cap.virtual_range
        va = -(-va // page) * page
        es = _Segment(self._next_va, page, va)
        self._next_va += va + (1 << 30)
        cand = _Block(es.ptr, va, stream, pool.small)
        cand.mapped = False
        cand.es = es
        pool.insert_unmapped(cand)
        return cand

    def _map_block(self, b: _Block, size: int, pool: _Pool) -> bool:
        es = b.es
        assert es is not None
        off = b.ptr - es.ptr
        begin = off // es.page
        end = -(-(off + size) // es.page)
        nbytes = (end - begin) * es.page
        if nbytes == 0 or not self._physical_fits(nbytes):
            return False
        pool.remove_unmapped(b)
        b.mapped = True
        if nbytes < b.size:
            rest = _Block(b.ptr + nbytes, b.size - nbytes, b.stream, b.small)
            rest.mapped = False
            rest.es = es
            rest.splice(b, b.next)
            pool.insert_unmapped(rest)
            b.size = nbytes
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert(b)
        self.total += nbytes
        self.mallocs += 1
        self._log(A_SEG_MAP, nbytes)
        return True

    def _unmap_block(self, b: _Block, pool: _Pool) -> None:
        es = b.es
        assert es is not None
        begin = -(-(b.ptr - es.ptr) // es.page)
        end = (b.ptr + b.size - es.ptr) // es.page
        if begin >= end:
            return
        pool.remove(b)
        uptr = es.ptr + begin * es.page
        usize = (end - begin) * es.page
        before = uptr - b.ptr
        if before > 0:
            bf = _Block(b.ptr, before, b.stream, b.small)
            bf.es = es
            bf.splice(b.prev, b)
            pool.insert(bf)
        after = b.size - before - usize
        if after > 0:
            af = _Block(uptr + usize, after, b.stream, b.small)
            af.es = es
            af.splice(b, b.next)
            pool.insert(af)
        b.ptr, b.size, b.mapped = uptr, usize, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self.total -= usize
        self.frees += 1
        self._log(A_SEG_UNMAP, usize)


# --------------------------------------------------------------------------- the driver


@dataclass
class LoopOut:
    """What the sequential loop returns (the reference and the compiled kernel alike)."""

    res_at: np.ndarray  # reserved after each request (simulation only, no baseline)
    all_at: np.ndarray
    done: int  # requests processed (fewer than all: the program died at request ``done``)
    oom: tuple[int, int, int, int, bool] | None  # event, requested, allocated, reserved, recorded (no baseline)
    survived: int | None
    mallocs: int
    frees: int
    retries: int
    log_event: np.ndarray
    log_action: np.ndarray
    log_size: np.ndarray


def _limit(stream: RequestStream, cap: Cap) -> Cap:
    """The cap left to the simulated requests: memory that predates the recording keeps its share."""
    if cap.limit is None:
        return cap
    # the range an expandable segment reserves is the card's, whatever was in use before the recording
    card = cap.card if cap.card is not None or cap.fraction else cap.limit
    return Cap(max(cap.limit - stream.baseline_reserved, 0), cap.fraction, card)


def _recorded_addresses(stream: RequestStream) -> tuple[np.ndarray, np.ndarray]:
    seg_alloc = stream.seg_action == A_SEG_ALLOC
    return stream.seg_addr[seg_alloc], stream.seg_size[seg_alloc]


def loop_reference(stream: RequestStream, settings: AllocatorSettings, cap: Cap) -> LoopOut:
    """The simulation loop in plain Python over :class:`Allocator` (the reference)."""
    rec_addr, rec_size = _recorded_addresses(stream)
    al = Allocator(settings, _limit(stream, cap), list(zip(rec_addr.tolist(), rec_size.tolist(), strict=True)))
    res_at = np.zeros(len(stream.kind), np.int64)
    all_at = np.zeros(len(stream.kind), np.int64)
    live: dict[int, _Block] = {}
    pending: dict[int, _Block] = {}
    oom: tuple[int, int, int, int, bool] | None = None
    survived: int | None = None
    kinds = stream.kind.tolist()
    events = stream.event.tolist()
    addrs = stream.addr.tolist()
    sizes = stream.size.tolist()
    streams = stream.stream.tolist()
    done = len(kinds)
    for r, k in enumerate(kinds):
        al.event = events[r]
        if k == R_ALLOC or k == R_OOM:
            b = al.malloc(sizes[r], streams[r])
            if b is None:
                if oom is None or k != R_OOM:
                    oom = (events[r], sizes[r], al.allocated, al.total, k == R_OOM)
                if k != R_OOM:  # the program would have died here
                    done = r
                    break
            else:
                live[addrs[r]] = b  # a recorded OOM's block too: freed after it when the program went on
                if k == R_OOM and survived is None:  # the recording ran out of memory here; this scenario does not
                    survived = events[r]
        elif k == R_FREE_REQ or k == R_FREE:
            b = live.pop(addrs[r], None)
            if b is not None:
                al.free_requested(b)
                if k == R_FREE:
                    al.free_completed(b)
                else:
                    pending[addrs[r]] = b
        elif k == R_FREE_DONE:
            b = pending.pop(addrs[r], None)
            if b is None and addrs[r] in live:  # free_requested not recorded (skip_actions)
                b = live.pop(addrs[r])
                al.free_requested(b)
            if b is not None:
                al.free_completed(b)
        elif k == R_EMPTY_CACHE:
            al.release_cached_blocks()
        res_at[r] = al.total
        all_at[r] = al.allocated
    return LoopOut(
        res_at,
        all_at,
        done,
        oom,
        survived,
        al.mallocs,
        al.frees,
        al.retries,
        np.asarray(al.log_event, np.int64),
        np.asarray(al.log_action, np.int8),
        np.asarray(al.log_size, np.int64),
    )


def run(stream: RequestStream, settings: AllocatorSettings, cap: Cap, *, compiled: bool | None = None) -> SimResult:
    """Simulate ``stream`` under ``settings`` and ``cap``. ``compiled``: the numba kernel (None:
    when numba is installed and the stream is long enough to win back its start-up)."""
    from snapviz.analyses import simulate_loop  # noqa: PLC0415 - numba only on demand

    use = simulate_loop.use_compiled(len(stream.kind)) if compiled is None else compiled
    out = simulate_loop.loop_compiled(stream, settings, cap) if use else loop_reference(stream, settings, cap)
    return finish(stream, out)


def _request_at(stream: RequestStream, done: int) -> np.ndarray:
    """Per trace entry, the last of the first ``done`` requests at or before it (-1: none yet),
    up to the entry the program stopped at (``done`` < all requests). The map for the whole stream is built once per stream (``stream.derived``) and shared by a
    sweep's scenarios; a scenario stopped after ``done`` requests clips it at ``done - 1``, which
    is the same map when the requests' entries never go back (checked; else built afresh)."""
    n = len(stream.kind)
    full = stream.derived.get("request_at")
    if full is None:
        full = stream.derived["request_at"] = _build_request_at(stream, n)
        stream.derived["events_sorted"] = np.array(bool(n < 2 or (np.diff(stream.event) >= 0).all()))
    if done == n:
        return full
    m = int(stream.event[done]) + 1  # the program stopped at that entry: nothing after it is needed
    if bool(stream.derived["events_sorted"]):
        return np.minimum(full[:m], done - 1)
    return _build_request_at(stream, done)[:m]


def _build_request_at(stream: RequestStream, done: int) -> np.ndarray:
    n_ev = stream.n_events
    ev = stream.event[:done]
    req_of = np.full(n_ev, -1, np.int64)
    req_of[ev] = np.arange(done, dtype=np.int64)  # several requests at one entry: the last one
    idx = np.where(req_of >= 0, np.arange(n_ev), 0)
    np.maximum.accumulate(idx, out=idx)
    return np.where(np.arange(n_ev) < ev[0], -1, req_of[idx]) if done else req_of


def finish(stream: RequestStream, out: LoopOut) -> SimResult:
    """Per-event series and peaks from the loop's per-request figures (vectorized)."""
    base_a, base_r = stream.baseline_allocated, stream.baseline_reserved
    n_ev = stream.n_events
    res_at, all_at, done = out.res_at, out.all_at, out.done
    oom = None
    if out.oom is not None:
        e, req, a, rsv, recd = out.oom
        oom = OomInfo(int(e), int(req), int(a) + base_a, int(rsv) + base_r, bool(recd))
    stopped = int(stream.event[done]) if done < len(stream.kind) else None
    survived = out.survived
    # per trace entry: the state after the last request at or before it
    if done:
        at = _request_at(stream, done)
        before = at < 0
        reserved = np.where(before, base_r, res_at[at] + base_r)
        allocated = np.where(before, base_a, all_at[at] + base_a)
    else:
        reserved = np.full(n_ev, base_r, np.int64)
        allocated = np.full(n_ev, base_a, np.int64)
    if stopped is not None:  # nothing after the program's death
        reserved = reserved[: stopped + 1]
        allocated = allocated[: stopped + 1]
        if oom is not None:
            reserved[-1] = oom.reserved_bytes
            allocated[-1] = oom.allocated_bytes
    if len(reserved):
        pri = int(np.argmax(reserved))
        peak_r = int(reserved[pri])
        peak_a = int(allocated.max())
    else:
        pri, peak_r, peak_a = -1, base_r, base_a
    frag = peak_r - int(allocated[pri]) if pri >= 0 else base_r - base_a
    return SimResult(
        reserved=reserved,
        allocated=allocated,
        peak_reserved=peak_r,
        peak_allocated=peak_a,
        peak_reserved_index=pri,
        fragmentation=frag,
        device_mallocs=out.mallocs,
        device_frees=out.frees,
        retries=out.retries,
        oom=oom,
        stopped_at=stopped,
        seg_event=out.log_event,
        seg_action=out.log_action,
        seg_size=out.log_size,
        survived_recorded_oom=survived,
    )


# --------------------------------------------------------------------------- from a snapshot

_REQUEST_KIND = {A_ALLOC: R_ALLOC, A_FREE_REQ: R_FREE_REQ, A_FREE_DONE: R_FREE_DONE, A_FREE: R_FREE, A_OOM: R_OOM}


def request_stream(
    actions: np.ndarray,
    addrs: np.ndarray,
    sizes: np.ndarray,
    streams: np.ndarray,
    recorded_reserved: np.ndarray,
    settings: AllocatorSettings,
    cap: Cap,
    *,
    baseline_allocated: int = 0,
    baseline_reserved: int = 0,
    orphan_frees: int = 0,
) -> RequestStream:
    """The requests of one device's recorded history (``actions`` etc. are its trace columns).

    ``empty_cache`` calls: a run of ``segment_free``/``segment_unmap`` entries with no request
    between is the allocator's own doing when it ends in the ``oom`` of a request, or when a
    request that needed new memory follows and, under the recorded ``settings`` and ``cap``,
    the allocator frees before it asks for memory (``max_split_size`` set, garbage collection
    under a fraction, or a cudaMalloc that the cap refuses); otherwise it is an ``empty_cache()``.
    """
    actions = np.asarray(actions)
    n = len(actions)
    kind = np.full(n, -1, np.int8)
    for a, k in _REQUEST_KIND.items():
        kind[actions == a] = k
    if not (actions == A_FREE_DONE).any():
        kind[actions == A_FREE_REQ] = R_FREE  # no free_completed recorded: frees complete at once
    is_free_seg = (actions == A_SEG_FREE) | (actions == A_SEG_UNMAP)
    is_new_seg = (actions == A_SEG_ALLOC) | (actions == A_SEG_MAP)
    calls = 0
    free_rows = np.flatnonzero(is_free_seg)
    if len(free_rows):
        # bursts: maximal runs of segment frees with no request between
        req_rows = np.flatnonzero(kind >= 0)
        owner = np.searchsorted(req_rows, free_rows)  # the first request after each free
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        ends = np.r_[starts[1:], len(free_rows)] - 1
        allocator_frees = settings.max_split_size < NO_LIMIT or (
            cap.fraction and cap.limit is not None and settings.garbage_collection_threshold > 0.0
        )
        for s0, s1 in zip(starts.tolist(), ends.tolist(), strict=True):
            first, last = int(free_rows[s0]), int(free_rows[s1])
            o = int(owner[s0])
            nxt = int(req_rows[o]) if o < len(req_rows) else -1
            own = False
            if nxt >= 0 and actions[nxt] == A_OOM:
                own = True
            elif nxt >= 0 and actions[nxt] == A_ALLOC and is_new_seg[last + 1 : nxt].any():
                before = int(recorded_reserved[first - 1]) if first > 0 else baseline_reserved
                need = allocation_size(round_size(int(sizes[nxt]), settings), settings)
                own = allocator_frees or (cap.limit is not None and before + need > cap.limit)
            if not own:
                kind[last] = R_EMPTY_CACHE
                calls += 1
    rows = np.flatnonzero(kind >= 0)
    seg = np.flatnonzero(is_free_seg | is_new_seg)
    addr_col = np.asarray(addrs, np.int64)[rows]
    size_col = np.asarray(sizes, np.int64)[rows]
    stream_col = np.asarray(streams, np.int64)[rows]
    kind_col, event_col = kind[rows], rows.astype(np.int64)
    oom_at = np.flatnonzero(kind_col == R_OOM)
    # each recorded OOM's block gets an address of its own (the oom entry's is no block's)
    addr_col[oom_at] = -1 - np.arange(len(oom_at), dtype=np.int64)
    allocs = np.flatnonzero(actions == A_ALLOC)
    caught = oom_at[event_col[oom_at] < (allocs[-1] if len(allocs) else -1)]
    if len(caught):
        # an OOM the program went on after (cuDNN's workspace retries): where a scenario serves
        # the request, the program used the memory and gave it back; freed right after it
        at = caught + 1
        kind_col = np.insert(kind_col, at, R_FREE)
        event_col = np.insert(event_col, at, event_col[caught])
        addr_col = np.insert(addr_col, at, addr_col[caught])
        size_col = np.insert(size_col, at, size_col[caught])
        stream_col = np.insert(stream_col, at, stream_col[caught])
    if baseline_reserved == 0 and orphan_frees == 0:
        # nothing was reserved when the recording began, so nothing was allocated either (a
        # non-zero allocated baseline is then the replay's estimate of block sizes it cannot know)
        baseline_allocated = 0
    return RequestStream(
        kind=kind_col,
        event=event_col,
        addr=addr_col,
        size=size_col,
        stream=stream_col,
        n_events=n,
        seg_event=seg.astype(np.int64),
        seg_action=actions[seg].astype(np.int8),
        seg_size=np.asarray(sizes, np.int64)[seg],
        seg_addr=np.asarray(addrs, np.int64)[seg],
        recorded_reserved=np.asarray(recorded_reserved, np.int64),
        baseline_allocated=baseline_allocated,
        baseline_reserved=baseline_reserved,
        orphan_frees=orphan_frees,
        empty_cache_calls=calls,
    )


_VERB = {
    A_SEG_ALLOC: "called cudaMalloc for {}",
    A_SEG_FREE: "called cudaFree on {}",
    A_SEG_MAP: "mapped {}",
    A_SEG_UNMAP: "unmapped {}",
}


@dataclass
class Fidelity:
    """Whether a simulation under the recorded settings reproduced the recording."""

    reproduced: bool
    diverged_at: int | None  # trace entry of the first difference (None: none, or not comparable)
    reason: str  # one sentence: what differed first, or why no comparison is possible


def fidelity(stream: RequestStream, sim: SimResult) -> Fidelity:
    """Compare the simulated segment events and reserved series with the recorded ones.

    Each recorded segment entry belongs to the request it served (the first request at or after
    it); the simulation's are logged at their request. Both sequences of (request, action, size)
    must be equal, and so must the reserved bytes after every request.
    """
    from snapviz.units import fmt_bytes  # noqa: PLC0415 - words only

    if not stream.complete:
        return Fidelity(
            False,
            None,
            "memory predates the recording "
            f"({fmt_bytes(stream.baseline_reserved)} reserved, {fmt_bytes(stream.baseline_allocated)} allocated "
            "when it began): where it lay is unknown, so the simulation cannot be checked event by event",
        )
    req = stream.event
    if len(req):
        pos = np.minimum(np.searchsorted(req, stream.seg_event), len(req) - 1)
        rec_owner = req[pos]
    else:
        rec_owner = stream.seg_event
    m_rec, m_sim = len(rec_owner), len(sim.seg_event)
    m = min(m_rec, m_sim)
    differs = (
        (rec_owner[:m] != sim.seg_event[:m])
        | (stream.seg_action[:m] != sim.seg_action[:m])
        | (stream.seg_size[:m] != sim.seg_size[:m])
    )
    first = int(np.argmax(differs)) if differs.any() else m
    if first < m or m_rec != m_sim:
        from snapviz.units import fmt_bytes as fb  # noqa: PLC0415

        rec = (
            (int(rec_owner[first]), int(stream.seg_action[first]), int(stream.seg_size[first]))
            if first < m_rec
            else None
        )
        sm = (
            (int(sim.seg_event[first]), int(sim.seg_action[first]), int(sim.seg_size[first])) if first < m_sim else None
        )
        at = min(x[0] for x in (rec, sm) if x is not None)
        if rec is not None and sm is not None and rec[0] == sm[0]:
            why = f"the allocator {_VERB[rec[1]].format(fb(rec[2]))}, the simulation {_VERB[sm[1]].format(fb(sm[2]))}"
        elif rec is not None and rec[0] == at:
            why = f"the allocator {_VERB[rec[1]].format(fb(rec[2]))}; the simulation did not"
        else:
            assert sm is not None
            why = f"the simulation {_VERB[sm[1]].format(fb(sm[2]))}; the allocator did not"
        return Fidelity(False, at, f"from event {at:,}: {why}")
    if sim.stopped_at is not None:
        return Fidelity(False, sim.stopped_at, f"from event {sim.stopped_at:,}: the simulation ran out of memory")
    if sim.survived_recorded_oom is not None:
        e = sim.survived_recorded_oom
        return Fidelity(False, e, f"from event {e:,}: the recording ran out of memory, the simulation did not")
    got = sim.reserved[req]
    want = stream.recorded_reserved[req]
    if len(req) and (got != want).any():
        at = int(req[int(np.argmax(got != want))])
        return Fidelity(False, at, f"from event {at:,}: the reserved bytes differ")
    return Fidelity(True, None, "the simulation reproduced every segment event and the reserved series")
