"""A reference model of PyTorch's CUDA caching allocator that writes snapshot dicts.

This is the *oracle* for snapviz's tests: an independent re-implementation of c10's
``CUDACachingAllocator`` (native backend, torch 2.x semantics, no CUDA graphs) that
produces exactly what ``torch.cuda.memory._snapshot()`` returns on torch 2.11, and
tracks the allocator's own statistics (``allocated_bytes`` / ``reserved_bytes`` and
their peaks since ``reset_peak()``) as ground truth. It shares no code with
``snapviz.analyses.replay`` on purpose: the replay sees only the snapshot, this model
sees the allocator's real state (linked blocks, pools, events, expandable segments).

What is modelled (see c10/cuda/CUDACachingAllocator.cpp):

* ``round_size``: ``< 512 -> 512``; with ``roundup_power2_divisions`` giving d > 1 for
  the request's power-of-two interval (intervals: 1 MiB, 2 MiB, ... 32 GiB; smaller
  sizes use the first, larger the last) and size > 512 * d, up to the next of d equal
  steps between the surrounding powers of two (a power of two stays); else up to a
  multiple of 512.
* pools: rounded size ``<= 1 MiB`` -> small pool (2 MiB ``cudaMalloc``), else large
  pool (``< 10 MiB`` -> 20 MiB segment, else rounded up to 2 MiB).
* best fit: the smallest free block ``>= size`` of the same pool *and stream*, ties by
  address (``BlockComparatorSize`` orders by stream, size, address); oversize rules
  for ``max_split_size``.
* split: small pool or expandable segments -> remainder ``>= 512``; large pool ->
  request ``< max_split_size`` and remainder ``> 1 MiB``. The allocation always takes
  the *front* of the cached block.
* free: ``allocated_bytes`` drops at ``free_requested``; with ``record_stream`` uses
  the block waits for events (``active_pending_free``) and is returned to the cache
  (``free_completed``) by the ``process_events`` at the start of a later ``malloc``
  or by ``empty_cache``. Merging happens only then, only with free neighbours of the
  same segment (``prev``/``next`` links never cross segments, even when cudaMalloc
  hands out adjacent ranges, which this model does on purpose).
* ``cudaMalloc`` failure -> ``release_available_cached_blocks`` (oversize blocks) ->
  ``release_cached_blocks`` (``empty_cache``) -> retry -> ``oom`` trace entry.
* ``expandable_segments``: one virtual range per stream and pool, mapped in pages of
  2 MiB (small pool) / 20 MiB (large pool, ``kLargeBuffer``) with ``segment_map`` /
  ``segment_unmap``; best fit counts the unmapped tail; every split at ``>= 512``.
* the trace ring buffer (``max_entries``), recording started late, ``_set_memory_
  metadata`` labels, ``record_function`` annotations, ``snapshot`` marker entries,
  older layouts (list of segments; pre-2.1 ``history`` blocks; missing keys).

Typical use::

    sim = Sim()
    a = sim.alloc(1280, frames=F, label="denoise/0")
    sim.free(a)
    sim.empty_cache()
    snap = sim.snapshot()            # the dict torch would pickle
    sim.peak_allocated(0)            # ground truth
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
# the device memory a Sim has when not told otherwise (an H200's 140 GiB)
DEFAULT_CAPACITY = 140 * GiB

kMinBlockSize = 512
kSmallSize = 1 * MiB
kSmallBuffer = 2 * MiB
kLargeBuffer = 20 * MiB
kMinLargeAlloc = 10 * MiB
kRoundLarge = 2 * MiB
SIZE_MAX = (1 << 64) - 1

SIDE_STREAMS = (225574976, 94324237402112, 94324237426688)  # raw cudaStream_t values


def divisions_table(setting: int | dict[int, int] | list[int] | None) -> list[int]:
    """16 division counts, one per power-of-two interval starting at 1 MiB.

    ``setting``: one number for every interval, a list of 16, or ``{MiB start: d}`` read as
    torch reads ``[256:1,512:2]``: the first interval named also sets every interval below
    it; intervals after it that are not named keep 0.
    """
    if setting is None:
        return [0] * 16
    if isinstance(setting, int):
        return [setting] * 16
    if isinstance(setting, list):
        assert len(setting) == 16
        return list(setting)
    table = [0] * 16
    for n, (mib, d) in enumerate(setting.items()):
        idx = min(int(mib).bit_length() - 1, 15)
        if n == 0:
            table[:idx] = [d] * idx
        table[idx] = d
    return table


def round_size(size: int, divisions: list[int] | None = None) -> int:
    if size < kMinBlockSize:
        return kMinBlockSize
    if divisions:
        octave = size.bit_length() - 1  # 2**octave <= size < 2**(octave + 1)
        d = divisions[max(0, min(octave - 20, 15))]
        if d > 1 and size > kMinBlockSize * d:
            if size == 1 << octave:
                return size
            step = (1 << octave) // (1 << (d.bit_length() - 1))
            if step == 0:
                return 1 << (octave + 1)
            return -(-size // step) * step
    return kMinBlockSize * ((size + kMinBlockSize - 1) // kMinBlockSize)


def allocation_size(size: int) -> int:
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return kRoundLarge * ((size + kRoundLarge - 1) // kRoundLarge)


class SimOOM(Exception):
    """The modelled allocator ran out of memory (an ``oom`` entry was recorded)."""


class _Block:
    __slots__ = (
        "device",
        "stream",
        "size",
        "requested_size",
        "pool",
        "ptr",
        "allocated",
        "mapped",
        "prev",
        "next",
        "event_count",
        "stream_uses",
        "ctx",
        "seg_ctx",
        "es",
        "uid",
    )
    _next_uid = 0

    def __init__(self, device: int, stream: int, size: int, pool: _Pool, ptr: int) -> None:
        self.device = device
        self.stream = stream
        self.size = size
        self.requested_size = 0
        self.pool = pool
        self.ptr = ptr
        self.allocated = False
        self.mapped = True
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.event_count = 0
        self.stream_uses: set[int] = set()
        self.ctx: list[dict[str, Any]] | None = None  # context_when_allocated
        self.seg_ctx: list[dict[str, Any]] | None = None  # context_when_segment_allocated
        self.es: _ExpandableSegment | None = None
        _Block._next_uid += 1
        self.uid = _Block._next_uid

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        if before is not None:
            assert before.next is after
            before.next = self
        self.prev = before
        if after is not None:
            assert after.prev is before
            after.prev = self
        self.next = after

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        st = "A" if self.allocated else ("P" if self.event_count else ("U" if not self.mapped else "F"))
        return f"<{st} {self.ptr:#x}+{self.size}>"


class _Pool:
    """``BlockPool``: free blocks ordered by (stream, size, ptr); unmapped by (stream, ptr)."""

    def __init__(self, small: bool) -> None:
        self.is_small = small
        self.keys: list[tuple[int, int, int]] = []
        self.by_key: dict[tuple[int, int, int], _Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []
        self.unmapped: dict[tuple[int, int], _Block] = {}

    def insert(self, b: _Block) -> None:
        k = (b.stream, b.size, b.ptr)
        assert k not in self.by_key
        bisect.insort(self.keys, k)
        self.by_key[k] = b

    def remove(self, b: _Block) -> None:
        k = (b.stream, b.size, b.ptr)
        assert self.by_key.pop(k) is b
        i = bisect.bisect_left(self.keys, k)
        assert self.keys[i] == k
        del self.keys[i]

    def contains(self, b: _Block) -> bool:
        return self.by_key.get((b.stream, b.size, b.ptr)) is b

    def insert_unmapped(self, b: _Block) -> None:
        k = (b.stream, b.ptr)
        bisect.insort(self.unmapped_keys, k)
        self.unmapped[k] = b

    def remove_unmapped(self, b: _Block) -> None:
        k = (b.stream, b.ptr)
        assert self.unmapped.pop(k) is b
        i = bisect.bisect_left(self.unmapped_keys, k)
        del self.unmapped_keys[i]


class _ExpandableSegment:
    def __init__(self, ptr: int, page: int, n_pages: int, stream: int) -> None:
        self.ptr = ptr
        self.page = page
        self.size = page * n_pages
        self.stream = stream


class _AddressSpace:
    """Virtual addresses ``cudaMalloc`` hands out: first fit, 2 MiB aligned, so consecutive
    segments are usually *adjacent* (the case where merging across segments would be wrong)."""

    def __init__(self, base: int, size: int, gap: int = 0) -> None:
        self.free: list[tuple[int, int]] = [(base, size)]  # (start, size), address order
        self.gap = gap

    def malloc(self, size: int) -> int:
        need = size + self.gap
        for i, (s, n) in enumerate(self.free):
            if n >= need:
                if n == need:
                    del self.free[i]
                else:
                    self.free[i] = (s + need, n - need)
                return s
        raise MemoryError("synthetic address space exhausted")

    def release(self, ptr: int, size: int) -> None:
        size += self.gap
        i = bisect.bisect_left(self.free, (ptr, 0))
        self.free.insert(i, (ptr, size))
        # coalesce with neighbours
        if i + 1 < len(self.free) and self.free[i][0] + self.free[i][1] == self.free[i + 1][0]:
            self.free[i] = (self.free[i][0], self.free[i][1] + self.free[i + 1][1])
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == self.free[i][0]:
            self.free[i - 1] = (self.free[i - 1][0], self.free[i - 1][1] + self.free[i][1])
            del self.free[i]


@dataclass
class _Entry:
    action: str
    addr: int
    size: int
    stream: int
    ctx: list[dict[str, Any]] | None
    time_us: int
    label: str
    compile_context: str
    allocated_after: int  # ground truth: allocator's allocated_bytes after this entry
    reserved_after: int
    requested_after: int
    block_size: int = 0  # ground truth: the block behind an alloc/free entry


@dataclass
class _Device:
    index: int
    capacity: int
    small: _Pool = field(default_factory=lambda: _Pool(True))
    large: _Pool = field(default_factory=lambda: _Pool(False))
    active: set[_Block] = field(default_factory=set)
    outstanding: dict[int, deque[tuple[int, _Block]]] = field(default_factory=dict)
    expandable: list[_ExpandableSegment] = field(default_factory=list)
    va: _AddressSpace | None = None
    es_va: _AddressSpace | None = None
    total_reserved: int = 0
    allocated: int = 0
    reserved: int = 0
    requested: int = 0  # requested bytes of allocated blocks (not torch's active-based stat)
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_requested: int = 0
    trace: deque[_Entry] = field(default_factory=deque)
    dropped: int = 0  # entries that fell out of the ring buffer
    before_window: tuple[int, int, int] = (0, 0, 0)  # (alloc, res, req) just before trace[0]
    # running values used to stamp entries; kept apart from the stats on purpose so a
    # wrong delta shows up in check_consistency()
    t_alloc: int = 0
    t_res: int = 0
    t_req: int = 0


class Handle:
    """What ``Sim.alloc`` returns: the address, and the model's block behind it."""

    __slots__ = ("addr", "device", "nbytes", "block", "freed")

    def __init__(self, block: _Block, nbytes: int) -> None:
        self.block = block
        self.addr = block.ptr
        self.device = block.device
        self.nbytes = nbytes
        self.freed = False

    @property
    def block_size(self) -> int:
        return self.block.size

    def __repr__(self) -> str:
        return f"Handle(dev={self.device}, addr={self.addr:#x}, nbytes={self.nbytes}, block={self.block.size})"


def make_frames(
    name: str, filename: str = "/work/pipeline.py", line: int = 1, depth: int = 4, cpp: bool = False
) -> list[dict[str, Any]]:
    """A plausible stack, innermost first (``frames[0]`` is the allocation site)."""
    fr = [{"filename": filename, "line": line, "name": name}]
    outer = [
        ("forward", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1750),
        ("__call__", "/usr/lib/python3/site-packages/diffusers/pipelines/pipeline.py", 980),
        ("run", "/work/run.py", 40),
        ("<module>", "/work/run.py", 77),
    ]
    fr.extend({"filename": f, "line": ln, "name": n} for n, f, ln in outer[: max(0, depth - 1)])
    if cpp:  # stacks="all": C++ frames interleaved, filename '??' or '', line 0
        fr.insert(0, {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::malloc"})
        fr.insert(1, {"filename": "", "line": 0, "name": "at::native::empty_cuda"})
        fr.append({"filename": "??", "line": 0, "name": "_start"})
    return fr


class Sim:
    """The allocator of one process: one caching allocator per device, one trace each.

    ``context``: ``"all"`` (frames on every entry), ``"alloc"`` (frees reuse the alloc
    stack, as c10 does) or ``None`` (no frames at all). ``max_entries``: ring buffer size
    per device. ``record=False`` starts with history off (turn it on with
    ``start_recording``, e.g. after loading weights).
    """

    def __init__(
        self,
        *,
        devices: int = 1,
        capacity: int = DEFAULT_CAPACITY,
        expandable: bool = False,
        max_split_size: int | None = None,
        record: bool = True,
        max_entries: int | None = None,
        context: str | None = "all",
        event_delay: tuple[int, int] = (1, 6),
        seed: int = 0,
        segment_gap: int = 0,
        start_time_us: int = 1_796_003_367_980_133,
        cuda_malloc: Any = None,
        roundup_power2_divisions: int | dict[int, int] | list[int] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        # ``cuda_malloc(device, size) -> address``: where cudaMalloc puts a segment (default:
        # first fit in a synthetic address space). Replaying a real trace passes the real ones.
        self.cuda_malloc = cuda_malloc
        self.expandable = expandable
        self.max_split = SIZE_MAX if not max_split_size else int(max_split_size)
        self.max_non_split_rounding = kLargeBuffer
        self.roundup_setting = roundup_power2_divisions
        self.divisions = divisions_table(roundup_power2_divisions)
        self.context = context
        self.recording = False
        self.max_entries: int | None = None
        self.event_delay = event_delay
        self.now_us = start_time_us
        self.label = ""
        self.compile_context = "N/A"
        self.n_malloc = 0
        self.annotations: list[dict[str, Any]] = []
        self.pending_snapshot_marker: dict[int, int] = {}
        self.devices: list[_Device] = []
        for d in range(devices):
            base = 0x7F0000000000 + d * 0x40000000000 + 0x1A200000
            dev = _Device(index=d, capacity=capacity)
            dev.va = _AddressSpace(base, 1 << 41, gap=segment_gap)
            dev.es_va = _AddressSpace(base + (1 << 41), 1 << 41)
            self.devices.append(dev)
        if record:
            self.start_recording(max_entries=max_entries, context=context)

    # ------------------------------------------------------------------ recording
    def start_recording(
        self, max_entries: int | None = None, context: str | None = "all", clear: bool = True, reset_peak: bool = True
    ) -> None:
        """``_record_memory_history(enabled="all", max_entries=...)``; also resets peaks so
        ``peak_*`` is "since recording began" (what a collector does)."""
        self.recording = True
        self.context = context
        self.max_entries = max_entries
        for dev in self.devices:
            if clear:
                dev.trace.clear()
                dev.dropped = 0
                dev.before_window = (dev.allocated, dev.reserved, dev.requested)
            if max_entries is not None:
                while len(dev.trace) > max_entries:
                    self._drop_oldest(dev)
        if clear:
            self.annotations.clear()
        if reset_peak:
            self.reset_peak()

    def stop_recording(self) -> None:
        self.recording = False

    def reset_peak(self, device: int | None = None) -> None:
        for dev in self.devices if device is None else [self.devices[device]]:
            dev.peak_allocated = dev.allocated
            dev.peak_reserved = dev.reserved
            dev.peak_requested = dev.requested

    def set_label(self, label: str) -> None:
        """``torch.cuda.memory._set_memory_metadata(label)``."""
        self.label = label

    def annotate(self, name: str, stage: str, device: int = 0) -> None:
        """One ``record_function`` START/END annotation (what ``external_annotations`` holds)."""
        if self.recording:
            self.annotations.append({"stage": stage, "name": name, "device": device, "time_us": self._tick()})

    def stage(self, name: str, device: int = 0) -> _StageCtx:
        """``with sim.stage("denoise/3"):`` labels entries and records START/END."""
        return _StageCtx(self, name, device)

    def _tick(self) -> int:
        self.now_us += self.rng.randint(1, 40)
        return self.now_us

    def _drop_oldest(self, dev: _Device) -> None:
        e = dev.trace.popleft()
        dev.dropped += 1
        dev.before_window = (e.allocated_after, e.reserved_after, e.requested_after)

    def _record(
        self,
        dev: _Device,
        action: str,
        addr: int,
        size: int,
        stream: int,
        ctx: list[dict[str, Any]] | None,
        d_alloc: int = 0,
        d_res: int = 0,
        d_req: int = 0,
        block_size: int = 0,
    ) -> None:
        dev.t_alloc += d_alloc
        dev.t_res += d_res
        dev.t_req += d_req
        if not self.recording:
            return
        if self.context is None or self.context == "state":
            ctx = None
        e = _Entry(
            action,
            addr,
            size,
            stream,
            ctx,
            self._tick(),
            self.label,
            self.compile_context,
            dev.t_alloc,
            dev.t_res,
            dev.t_req,
            block_size,
        )
        dev.trace.append(e)
        if self.max_entries is not None and len(dev.trace) > self.max_entries:
            self._drop_oldest(dev)

    # ------------------------------------------------------------------ stats
    def _stat_alloc(self, dev: _Device, delta: int, req: int = 0) -> None:
        dev.allocated += delta
        dev.requested += req
        dev.peak_allocated = max(dev.peak_allocated, dev.allocated)
        dev.peak_requested = max(dev.peak_requested, dev.requested)

    def _stat_res(self, dev: _Device, delta: int) -> None:
        dev.reserved += delta
        dev.peak_reserved = max(dev.peak_reserved, dev.reserved)

    def allocated(self, device: int = 0) -> int:
        return self.devices[device].allocated

    def reserved(self, device: int = 0) -> int:
        return self.devices[device].reserved

    def peak_allocated(self, device: int = 0) -> int:
        """``torch.cuda.max_memory_allocated(device)`` since the last ``reset_peak``."""
        return self.devices[device].peak_allocated

    def peak_reserved(self, device: int = 0) -> int:
        return self.devices[device].peak_reserved

    def peak_requested(self, device: int = 0) -> int:
        """Peak of the sum of *requested* bytes of allocated blocks (what a naive replay sees)."""
        return self.devices[device].peak_requested

    def live_blocks(self, device: int = 0) -> dict[int, int]:
        """Allocated blocks now: address -> block size."""
        return {b.ptr: b.size for b in self.devices[device].active if b.allocated}

    def trace_series(self, device: int = 0) -> tuple[list[int], list[int]]:
        """Ground truth allocated / reserved bytes after each *recorded* entry."""
        tr = self.devices[device].trace
        return [e.allocated_after for e in tr], [e.reserved_after for e in tr]

    def window_peaks(self, device: int = 0) -> tuple[int, int]:
        """Peak allocated / reserved over the recorded window (incl. the state just before it)."""
        dev = self.devices[device]
        a0, r0, _ = dev.before_window
        al, rs = self.trace_series(device)
        return max([a0, *al]), max([r0, *rs])

    def missized_orphans(self, device: int = 0) -> list[tuple[int, int]]:
        """Frees in the recorded window whose alloc is not in it (ring buffer wrapped or
        recording started late) and whose block is bigger than ``round_size(request)``:
        (entry index, bytes by which a replay that can only guess the size is short)."""
        out = []
        seen: set[int] = set()
        for i, e in enumerate(self.devices[device].trace):
            if e.action == "alloc":
                seen.add(e.addr)
            elif e.action == "free_requested":
                if e.addr not in seen and e.block_size != round_size(e.size, self.divisions):
                    out.append((i, e.block_size - round_size(e.size, self.divisions)))
                seen.discard(e.addr)
        return out

    def block_sizes(self, device: int = 0) -> list[int]:
        """Ground truth block size behind each recorded entry (0 for segment entries)."""
        return [e.block_size for e in self.devices[device].trace]

    def dropped_entries(self, device: int = 0) -> int:
        return self.devices[device].dropped

    def check_consistency(self) -> None:
        """Internal invariants of the model (tests call it so a broken oracle fails loudly)."""
        for dev in self.devices:
            assert dev.t_alloc == dev.allocated, (dev.t_alloc, dev.allocated)
            assert dev.t_res == dev.reserved == dev.total_reserved, (dev.t_res, dev.reserved, dev.total_reserved)
            assert dev.allocated == sum(b.size for b in dev.active if b.allocated)
            segs = self._segments(dev)
            assert sum(s["total_size"] for s in segs) == dev.reserved
            for s in segs:
                assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
                assert all(b["size"] % kMinBlockSize == 0 for b in s["blocks"])
            for pool in (dev.small, dev.large):
                for b in pool.by_key.values():
                    assert not b.allocated and b.mapped and b.event_count == 0
                    # free neighbours must have been merged
                    for nb in (b.prev, b.next):
                        assert nb is None or nb.allocated or nb.event_count or not nb.mapped, (b, nb)

    # ------------------------------------------------------------------ public API
    def alloc(
        self,
        nbytes: int,
        stream: int = 0,
        device: int = 0,
        frames: list[dict[str, Any]] | None = None,
        label: str | None = None,
    ) -> Handle:
        """``torch.empty(nbytes, dtype=uint8, device=f"cuda:{device}")`` on ``stream``."""
        old = self.label
        if label is not None:
            self.label = label
        if not (self.recording and self.context):
            frames = None  # no recorder installed: c10 gathers no context at all
        try:
            b = self._malloc(self.devices[device], int(nbytes), stream, frames)
        finally:
            self.label = old
        return Handle(b, int(nbytes))

    def free(self, h: Handle, frames: list[dict[str, Any]] | None = None, label: str | None = None) -> None:
        assert not h.freed, "double free"
        h.freed = True
        old = self.label
        if label is not None:
            self.label = label
        try:
            self._free(self.devices[h.device], h.block, frames)
        finally:
            self.label = old

    def free_all(self, device: int | None = None) -> None:
        """Free every allocated block (the end of a pipeline call), lowest address first."""
        for dev in self.devices if device is None else [self.devices[device]]:
            for b in sorted((b for b in dev.active if b.allocated), key=lambda b: b.ptr):
                self._free(dev, b, None)

    def record_stream(self, h: Handle, stream: int) -> None:
        """``tensor.record_stream(stream)``: the free waits for work queued on ``stream``."""
        b = h.block
        if stream != b.stream:
            b.stream_uses.add(stream)

    def empty_cache(self, frames: list[dict[str, Any]] | None = None) -> None:
        """``torch.cuda.empty_cache()``: every device."""
        for dev in self.devices:
            self._release_cached_blocks(dev, frames)

    def snapshot(
        self,
        *,
        layout: str = "dict",
        omit: tuple[str, ...] = (),
        settings: bool = True,
        annotations: bool = True,
        marker: bool = True,
        overflow_flag: bool = False,
    ) -> Any:
        """What ``torch.cuda.memory._snapshot()`` returns now.

        ``layout``: ``"dict"`` (2.11), ``"segments"`` (a bare list of segments, as
        ``memory_snapshot()`` / very old dumps) or ``"history"`` (pre-2.1 blocks carrying
        ``history`` instead of ``frames``/``requested_size``). ``omit``: trace-entry keys
        to leave out, to mimic older torch (``time_us``, ``user_metadata``, ``frames``,
        ``compile_context``). ``marker``: like torch, record a ``snapshot`` entry that
        shows up in the *next* snapshot.
        """
        segments: list[dict[str, Any]] = []
        for dev in self.devices:
            segs = self._segments(dev)
            if layout == "history":
                for s in segs:
                    for b in s["blocks"]:
                        fr = b.pop("frames")
                        req = b.pop("requested_size")
                        if b["state"] != "inactive":
                            h: dict[str, Any] = {"addr": b["address"], "real_size": req}
                            if fr:
                                h["frames"] = fr
                            b["history"] = [h]
                    s.pop("requested_size", None)
            segments.extend(segs)
        if layout == "segments":
            return segments
        traces = [[self._entry_dict(e, omit) for e in dev.trace] for dev in self.devices]
        out: dict[str, Any] = {"segments": segments, "device_traces": traces}
        if settings and layout == "dict":
            out["allocator_settings"] = self.allocator_settings(overflow_flag)
        if annotations and layout == "dict":
            out["external_annotations"] = [dict(a) for a in self.annotations]
        if marker and self.recording:
            for dev in self.devices:
                total_active = sum(b.size for b in dev.active)
                self._record(dev, "snapshot", 0, total_active, 0, None)
        return out

    def allocator_settings(self, overflow_flag: bool = False) -> dict[str, Any]:
        conf = []
        if self.expandable:
            conf.append("expandable_segments:True")
        if self.max_split != SIZE_MAX:
            conf.append(f"max_split_size_mb:{self.max_split // MiB}")
        rs = self.roundup_setting
        if isinstance(rs, int):
            conf.append(f"roundup_power2_divisions:{rs}")
        elif isinstance(rs, dict):
            conf.append("roundup_power2_divisions:[" + ",".join(f"{k}:{v}" for k, v in rs.items()) + "]")
        s: dict[str, Any] = {
            "PYTORCH_CUDA_ALLOC_CONF": ",".join(conf),
            "max_split_size": -1 if self.max_split == SIZE_MAX else self.max_split,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": self.expandable,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "graph_capture_record_stream_reuse": False,
            "roundup_power2_divisions": {str(1 << i): self.divisions[i] for i in range(16)},
        }
        if self.max_entries is not None:
            s["trace_alloc_max_entries"] = self.max_entries
            if overflow_flag:
                s["trace_alloc_overflowed"] = any(d.dropped for d in self.devices)
        return s

    def _entry_dict(self, e: _Entry, omit: tuple[str, ...]) -> dict[str, Any]:
        d: dict[str, Any] = {"action": e.action}
        if e.action == "oom":
            d["device_free"] = e.addr
        else:
            d["addr"] = e.addr
        d["size"] = e.size
        d["stream"] = e.stream
        if e.ctx is not None and "frames" not in omit:
            d["frames"] = e.ctx  # the shared list object itself, as c10 dedups tracebacks
        if "time_us" not in omit:
            d["time_us"] = e.time_us
        if "compile_context" not in omit:
            d["compile_context"] = e.compile_context
        if "user_metadata" not in omit:
            d["user_metadata"] = e.label
        return d

    # ------------------------------------------------------------------ snapshot()
    def _segments(self, dev: _Device) -> list[dict[str, Any]]:
        all_blocks: list[_Block] = [dev.small.by_key[k] for k in dev.small.keys]
        all_blocks += [dev.large.by_key[k] for k in dev.large.keys]
        all_blocks += sorted(dev.active, key=lambda b: b.ptr)
        out = []
        for head in all_blocks:
            # expandable segments: one segment per contiguous mapped range
            if head.prev is not None and head.prev.mapped:
                continue
            seg: dict[str, Any] = {
                "device": dev.index,
                "address": head.ptr,
                "total_size": 0,
                "allocated_size": 0,
                "active_size": 0,
                "requested_size": 0,
                "stream": head.stream,
                "segment_type": "small" if head.pool.is_small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": head.es is not None,
                "frames": head.seg_ctx if (head.seg_ctx is not None and self.context) else [],
                "blocks": [],
            }
            b: _Block | None = head
            addr = head.ptr
            while b is not None and b.mapped:
                active = b.allocated or b.event_count > 0 or bool(b.stream_uses)
                state = "active_allocated" if b.allocated else ("active_pending_free" if active else "inactive")
                seg["blocks"].append(
                    {
                        "address": addr,
                        "size": b.size,
                        "requested_size": b.requested_size,
                        "state": state,
                        "frames": b.ctx if (b.ctx is not None and self.context) else [],
                    }
                )
                seg["total_size"] += b.size
                if b.allocated:
                    seg["allocated_size"] += b.size
                if active:
                    seg["active_size"] += b.size
                    seg["requested_size"] += b.requested_size
                addr += b.size
                b = b.next
            out.append(seg)
        out.sort(key=lambda s: s["address"])
        return out

    # ------------------------------------------------------------------ the allocator
    def _malloc(self, dev: _Device, orig_size: int, stream: int, ctx: list[dict[str, Any]] | None) -> _Block:
        self.n_malloc += 1
        self._process_events(dev, ctx)
        size = round_size(orig_size, self.divisions)
        pool = dev.small if size <= kSmallSize else dev.large
        alloc_size = allocation_size(size)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            block = self._alloc_block(dev, pool, size, alloc_size, stream, ctx)
            if block is None and self._release_available_cached_blocks(dev, pool, size, stream, ctx):
                block = self._alloc_block(dev, pool, size, alloc_size, stream, ctx)
            if block is None:
                self._release_cached_blocks(dev, ctx)
                block = self._alloc_block(dev, pool, size, alloc_size, stream, ctx)
        if block is None:
            device_free = dev.capacity - dev.total_reserved
            self._record(dev, "oom", device_free, size, stream, ctx)
            raise SimOOM(f"cuda:{dev.index}: tried to allocate {size} bytes, {device_free} free")
        return self._alloc_found_block(dev, pool, block, size, orig_size, stream, ctx)

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.expandable:
            return remaining >= kMinBlockSize
        return size < self.max_split and remaining > kSmallSize

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        b = pool.by_key[keys[i]]
        if b.es is not None:
            # best fit counts the unmapped address space right after a block
            def esize(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            j = i + 1
            while (
                pool.by_key[keys[i]].es is not None
                and j < len(keys)
                and keys[j][0] == stream
                and esize(pool.by_key[keys[j]]) < esize(pool.by_key[keys[i]])
            ):
                i, j = j, j + 1
            b = pool.by_key[keys[i]]
        if size < self.max_split and b.size >= self.max_split:
            return None
        if size >= self.max_split and b.size >= size + self.max_non_split_rounding:
            return None
        pool.remove(b)
        return b

    def _alloc_block(
        self, dev: _Device, pool: _Pool, size: int, alloc_size: int, stream: int, ctx: list[dict[str, Any]] | None
    ) -> _Block | None:
        if self.expandable:
            return self._try_allocate_expandable_block(dev, pool, size, stream, ctx)
        if dev.total_reserved + alloc_size > dev.capacity:
            return None  # cudaErrorMemoryAllocation
        assert dev.va is not None
        ptr = self.cuda_malloc(dev.index, alloc_size) if self.cuda_malloc else dev.va.malloc(alloc_size)
        dev.total_reserved += alloc_size
        b = _Block(dev.index, stream, alloc_size, pool, ptr)
        self._stat_res(dev, alloc_size)
        self._record(dev, "segment_alloc", ptr, alloc_size, stream, ctx, d_res=alloc_size)
        b.seg_ctx = ctx
        return b

    def _alloc_found_block(
        self,
        dev: _Device,
        pool: _Pool,
        block: _Block,
        size: int,
        orig_size: int,
        stream: int,
        ctx: list[dict[str, Any]] | None,
    ) -> _Block:
        if self._should_split(block, size):
            remaining = block
            block = _Block(dev.index, stream, size, pool, remaining.ptr)
            block.es = remaining.es
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated = True
        block.requested_size = orig_size
        block.ctx = ctx
        self._record(
            dev,
            "alloc",
            block.ptr,
            orig_size,
            block.stream,
            ctx,
            d_alloc=block.size,
            d_req=orig_size,
            block_size=block.size,
        )
        dev.active.add(block)
        self._stat_alloc(dev, block.size, orig_size)
        return block

    def _free(self, dev: _Device, block: _Block, ctx: list[dict[str, Any]] | None) -> None:
        assert block.allocated
        block.allocated = False
        self._stat_alloc(dev, -block.size, -block.requested_size)
        fctx = ctx if (ctx is not None and self.context == "all") else block.ctx
        self._record(
            dev,
            "free_requested",
            block.ptr,
            block.requested_size,
            block.stream,
            fctx,
            d_alloc=-block.size,
            d_req=-block.requested_size,
            block_size=block.size,
        )
        if block.stream_uses:
            streams = sorted(block.stream_uses)
            block.stream_uses = set()
            block.event_count += len(streams)
            for s in streams:
                ready = self.n_malloc + self.rng.randint(*self.event_delay)
                dev.outstanding.setdefault(s, deque()).append((ready, block))
        else:
            self._free_block(dev, block, fctx)

    def _free_block(self, dev: _Device, block: _Block, ctx: list[dict[str, Any]] | None) -> None:
        assert not block.allocated and block.event_count == 0 and not block.stream_uses
        self._record(
            dev,
            "free_completed",
            block.ptr,
            block.requested_size,
            block.stream,
            ctx if ctx is not None else block.ctx,
            block_size=block.size,
        )
        block.ctx = None
        for cand in (block.prev, block.next):
            self._try_merge(block, cand)
        dev.active.discard(block)
        block.pool.insert(block)

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        if src is None or src.allocated or src.event_count > 0 or src.stream_uses or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            src.pool.remove(src)
        else:
            src.pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            dst.seg_ctx = src.seg_ctx
        else:
            assert dst.next is src
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _process_events(self, dev: _Device, ctx: list[dict[str, Any]] | None) -> None:
        for s in list(dev.outstanding):
            q = dev.outstanding[s]
            while q:
                ready, b = q[0]
                if ready > self.n_malloc:
                    break
                b.event_count -= 1
                if b.event_count == 0:
                    self._free_block(dev, b, ctx)
                q.popleft()
            if not q:
                del dev.outstanding[s]

    def _synchronize_and_free_events(self, dev: _Device, ctx: list[dict[str, Any]] | None) -> None:
        for s in list(dev.outstanding):
            for _, b in dev.outstanding[s]:
                b.event_count -= 1
                if b.event_count == 0:
                    self._free_block(dev, b, ctx)
        dev.outstanding.clear()

    def _release_block(self, dev: _Device, b: _Block, ctx: list[dict[str, Any]] | None) -> None:
        assert b.es is None
        self._record(dev, "segment_free", b.ptr, b.size, b.stream, ctx if ctx is not None else b.seg_ctx, d_res=-b.size)
        assert dev.va is not None
        if not self.cuda_malloc:
            dev.va.release(b.ptr, b.size)
        dev.total_reserved -= b.size
        self._stat_res(dev, -b.size)
        b.pool.remove(b)

    def _release_blocks(self, dev: _Device, pool: _Pool, ctx: list[dict[str, Any]] | None) -> None:
        to_unmap = []
        for k in list(pool.keys):
            b = pool.by_key.get(k)
            if b is None:
                continue
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(dev, b, ctx)
        for b in to_unmap:
            self._unmap_block(dev, b, ctx)
            if b.prev is None and b.next is None:
                # the whole virtual range is unmapped again: give it back
                assert not b.mapped and b.es is not None and b.size == b.es.size
                b.pool.remove_unmapped(b)
                dev.expandable.remove(b.es)
                assert dev.es_va is not None
                dev.es_va.release(b.es.ptr, b.es.size)

    def _release_cached_blocks(self, dev: _Device, ctx: list[dict[str, Any]] | None) -> bool:
        self._synchronize_and_free_events(dev, ctx)
        self._release_blocks(dev, dev.large, ctx)
        self._release_blocks(dev, dev.small, ctx)
        return True

    def _release_available_cached_blocks(
        self, dev: _Device, pool: _Pool, size: int, stream: int, ctx: list[dict[str, Any]] | None
    ) -> bool:
        if self.max_split == SIZE_MAX:
            return False
        key_size = max(size, self.max_split)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, key_size, -1))
        if i == len(keys) or keys[i][0] != stream or pool.by_key[keys[i]].es is not None:
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key_size and i >= 0:
                b = pool.by_key[keys[i]]
                if b.size < self.max_split or b.stream != stream:
                    break
                is_first = i == 0
                if not is_first:
                    i -= 1  # removing keys[i + 1] below leaves keys[i] in place
                if b.es is None:
                    released += b.size
                    self._release_block(dev, b, ctx)
                if is_first:
                    break
            return released >= key_size
        self._release_block(dev, pool.by_key[keys[i]], ctx)
        return True

    # -- expandable segments
    def _allocatable(self, b: _Block | None) -> bool:
        return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

    def _find_expandable_block(self, dev: _Device, pool: _Pool, stream: int, size: int) -> _Block:
        def has_space(b: _Block | None) -> bool:
            n = 0
            while n < size and self._allocatable(b):
                assert b is not None
                n += b.size
                b = b.next
            return n >= size

        i = bisect.bisect_left(pool.unmapped_keys, (stream, -1))
        while i < len(pool.unmapped_keys) and pool.unmapped_keys[i][0] == stream:
            c = pool.unmapped[pool.unmapped_keys[i]]
            if self._allocatable(c.prev):
                c = c.prev  # type: ignore[assignment]
            if has_space(c):
                return c
            i += 1
        page = kSmallBuffer if pool.is_small else kLargeBuffer
        n_pages = -(-(dev.capacity + dev.capacity // 8) // page)
        assert dev.es_va is not None
        es = _ExpandableSegment(dev.es_va.malloc(page * n_pages), page, n_pages, stream)
        dev.expandable.append(es)
        cand = _Block(dev.index, stream, es.size, pool, es.ptr)
        cand.mapped = False
        cand.es = es
        pool.insert_unmapped(cand)
        return cand

    def _try_allocate_expandable_block(
        self, dev: _Device, pool: _Pool, size: int, stream: int, ctx: list[dict[str, Any]] | None
    ) -> _Block | None:
        cand = self._find_expandable_block(dev, pool, stream, size)
        if not cand.mapped and not self._map_block(dev, cand, min(cand.size, size), ctx):
            return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(dev, nxt, min(size - cand.size, nxt.size), ctx):
                return None
            cand = nxt
        pool.remove(cand)
        return cand

    def _map_block(self, dev: _Device, to_map: _Block, size: int, ctx: list[dict[str, Any]] | None) -> bool:
        es = to_map.es
        assert es is not None and not to_map.mapped and size <= to_map.size
        off = to_map.ptr - es.ptr
        assert off % es.page == 0
        begin = off // es.page
        end = -(-(off + size) // es.page)
        nbytes = (end - begin) * es.page
        if dev.total_reserved + nbytes > dev.capacity:
            return False  # cuMemCreate: out of memory (partial handles are released)
        pool = to_map.pool
        pool.remove_unmapped(to_map)
        to_map.mapped = True
        mapped_ptr = to_map.ptr
        if nbytes < to_map.size:
            rem = _Block(dev.index, to_map.stream, to_map.size - nbytes, pool, to_map.ptr + nbytes)
            rem.mapped = False
            rem.es = es
            rem.splice(to_map, to_map.next)
            pool.insert_unmapped(rem)
            to_map.size = nbytes
        self._try_merge(to_map, to_map.prev)
        self._try_merge(to_map, to_map.next)
        pool.insert(to_map)
        dev.total_reserved += nbytes
        self._stat_res(dev, nbytes)
        self._record(dev, "segment_map", mapped_ptr, nbytes, to_map.stream, ctx, d_res=nbytes)
        if to_map.prev is None and to_map.seg_ctx is None:
            to_map.seg_ctx = ctx
        return True

    def _unmap_block(self, dev: _Device, b: _Block, ctx: list[dict[str, Any]] | None) -> None:
        es = b.es
        assert es is not None
        begin = -(-(b.ptr - es.ptr) // es.page)
        end = (b.ptr + b.size - es.ptr) // es.page
        if begin >= end:
            return
        pool = b.pool
        pool.remove(b)
        uptr = es.ptr + begin * es.page
        usize = (end - begin) * es.page
        before = uptr - b.ptr
        if before > 0:
            bf = _Block(dev.index, b.stream, before, pool, b.ptr)
            bf.es = es
            bf.splice(b.prev, b)
            pool.insert(bf)
        after = b.size - (before + usize)
        if after > 0:
            af = _Block(dev.index, b.stream, after, pool, uptr + usize)
            af.es = es
            af.splice(b, b.next)
            pool.insert(af)
        b.ptr = uptr
        b.size = usize
        b.mapped = False
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        pool.insert_unmapped(b)
        dev.total_reserved -= usize
        self._stat_res(dev, -usize)
        self._record(dev, "segment_unmap", uptr, usize, b.stream, ctx if ctx is not None else b.seg_ctx, d_res=-usize)


class _StageCtx:
    def __init__(self, sim: Sim, name: str, device: int) -> None:
        self.sim, self.name, self.device = sim, name, device

    def __enter__(self) -> Sim:
        self.prev = self.sim.label
        self.sim.set_label(self.name)
        self.sim.annotate(self.name, "START", self.device)
        return self.sim

    def __exit__(self, *exc: object) -> None:
        self.sim.annotate(self.name, "END", self.device)
        self.sim.set_label(self.prev)


# ---------------------------------------------------------------------- workloads
def _odd(rng: random.Random, lo: int, hi: int) -> int:
    """A size in [lo, hi] that is usually *not* a multiple of 512 (bias, odd channels)."""
    n = rng.randint(lo, hi)
    if rng.random() < 0.25:
        n = max(lo, n - n % 512)  # sometimes exact
    return n


def diffusion_size(rng: random.Random, attention: bool = True) -> int:
    """A request size with the mix of a diffusion UNet/VAE: mostly small, some MiB-sized
    activations, a few hundred-MiB buffers, and rare 1 GiB attention-score matrices."""
    r = rng.random()
    if r < 0.50:
        if rng.random() < 0.3:
            return rng.choice((4, 8, 1280, 2560, 5120, 320 * 4, 77 * 768 * 2, 2 * 1280 * 2))
        return _odd(rng, 1, kSmallSize)
    if r < 0.55:  # just around the pool / rounding thresholds
        return rng.choice(
            (
                kSmallSize,
                kSmallSize + 1,
                kSmallSize + 511,
                2 * MiB,
                10 * MiB - 1,
                10 * MiB,
                10 * MiB + 1,
                20 * MiB - 512,
                20 * MiB,
                19 * MiB + 1,
                12 * MiB + 1536,
            )
        )
    if r < 0.80:
        return _odd(rng, kSmallSize + 1, 10 * MiB)
    if r < 0.97:
        # log-uniform 10 MiB .. 500 MiB, often a tensor shape product
        n = int(10 * MiB * (50 ** rng.random()))
        return n if rng.random() < 0.5 else max(10 * MiB, n - n % (2 * 320 * 2))
    if attention and r < 0.985:
        return rng.choice((GiB, GiB // 2, 3 * GiB // 4 + 4096))  # [32,4096,4096] fp16 scores etc.
    return _odd(rng, 100 * MiB, 600 * MiB)  # VAE decoder feature maps


def random_workload(
    seed: int,
    n_ops: int = 1500,
    *,
    devices: int = 1,
    streams: int = 1,
    expandable: bool = False,
    delayed_frees: bool = False,
    empty_cache_every: int | None = None,
    max_entries: int | None = None,
    record_from: float = 0.0,
    capacity: int = DEFAULT_CAPACITY,
    budget: int = 24 * GiB,
    max_split_size: int | None = None,
    attention: bool = True,
    context: str | None = "all",
    cpp_frames: bool = False,
    segment_gap: int = 0,
    oom: bool = False,
    roundup_power2_divisions: int | dict[int, int] | None = None,
) -> Sim:
    """Run a diffusion-like random workload and return the model (call ``.snapshot()``).

    ``record_from``: fraction of the ops after which recording starts (and peaks are
    reset): everything before is pre-existing state. ``oom``: let allocations fail
    (``capacity`` small) and carry on, as a pipeline that catches OOM would.
    """
    rng = random.Random(seed * 7919 + 17)
    sim = Sim(
        devices=devices,
        capacity=capacity,
        expandable=expandable,
        max_split_size=max_split_size,
        record=record_from <= 0,
        max_entries=max_entries,
        context=context,
        seed=seed,
        segment_gap=segment_gap,
        roundup_power2_divisions=roundup_power2_divisions,
    )
    stream_ids = [0, *SIDE_STREAMS][: max(1, streams)]
    sites = [
        make_frames(f"op{i}", f"/work/models/unet_{i % 5}.py", 10 + i, depth=rng.randint(1, 5), cpp=cpp_frames)
        for i in range(24)
    ]
    free_sites = [make_frames(f"free{i}", "/work/pipeline.py", 200 + i) for i in range(4)]
    live: list[list[Handle]] = [[] for _ in range(devices)]
    persistent: set[int] = set()
    live_bytes = [0] * devices
    n_steps = 4
    stages = ["load", "text_encode"] + [f"denoise/{i}" for i in range(n_steps)] + ["vae_decode"]
    per_stage = max(1, n_ops // len(stages))
    start_at = int(n_ops * record_from)
    op = 0
    for st in stages:
        sim.set_label(st)
        sim.annotate(st, "START")
        for _ in range(per_stage):
            if op == start_at and not sim.recording:
                sim.start_recording(max_entries=max_entries, context=context)
                sim.annotate(st, "START")
            op += 1
            dev = rng.randrange(devices)
            lv = live[dev]
            r = rng.random()
            want_free = lv and (live_bytes[dev] > budget or r < (0.12 if st == "load" else 0.45))
            if empty_cache_every and op % empty_cache_every == 0:
                sim.empty_cache()
            if want_free:
                # mostly LIFO (activations), sometimes random
                cand = [i for i in range(len(lv)) if id(lv[i]) not in persistent] or [len(lv) - 1]
                idx = cand[-1] if rng.random() < 0.6 else rng.choice(cand)
                h = lv.pop(idx)
                persistent.discard(id(h))
                if delayed_frees and rng.random() < 0.3 and len(stream_ids) > 1:
                    sim.record_stream(h, rng.choice(stream_ids[1:]))
                elif delayed_frees and rng.random() < 0.15:
                    sim.record_stream(h, SIDE_STREAMS[0])
                sim.free(h, frames=rng.choice(free_sites))
                live_bytes[dev] -= h.nbytes
            else:
                n = diffusion_size(rng, attention=attention)
                s = stream_ids[0] if rng.random() < 0.75 else rng.choice(stream_ids)
                try:
                    h = sim.alloc(n, stream=s, device=dev, frames=rng.choice(sites))
                except SimOOM:
                    if not oom:
                        raise
                    continue
                lv.append(h)
                live_bytes[dev] += n
                if st == "load":
                    persistent.add(id(h))
            if st.startswith("denoise") and attention and rng.random() < 0.01:
                # a classic-attention score matrix, allocated and dropped within the op
                try:
                    h = sim.alloc(GiB, device=dev, frames=sites[0])
                    sim.free(h)
                except SimOOM:
                    if not oom:
                        raise
        sim.annotate(st, "END")
    sim.set_label("")
    return sim


def drive_with_trace(snapshot: dict[str, Any], capacity: int | None = None, max_split_size: int | None = None) -> Sim:
    """Re-run a real snapshot's history through the model: only the *requests* (alloc
    sizes and streams, frees, ``empty_cache`` bursts) and cudaMalloc's addresses go in;
    block sizes, splits, reuse, placement and the trace come out of the model, so they
    can be checked against what torch recorded. Needs a complete, non-expandable history
    whose frees complete at once (no ``record_stream``). ``capacity``: the memory limit the
    run had (``set_per_process_memory_fraction``), so the model runs out where torch did;
    ``max_split_size``: the run's ``max_split_size_mb`` in bytes (None: unlimited)."""
    traces = snapshot.get("device_traces") or []
    pending: dict[int, list[tuple[int, int]]] = {d: [] for d in range(len(traces))}
    # a segment of the end state that no recorded cudaMalloc made existed before the recording
    # (NCCL's set-up on train-sd15-ddp-nccl-1rank): the model cannot know where it lay
    if any(e.get("action") in ("segment_map", "segment_unmap") for tr in traces for e in tr):
        raise ValueError("expandable segments: cudaMalloc addresses cannot be injected")
    made = {(d, e.get("addr")) for d, tr in enumerate(traces) for e in tr if e.get("action") == "segment_alloc"}
    before = [sg for sg in snapshot.get("segments") or [] if (sg.get("device", 0), sg.get("address")) not in made]
    if before:
        raise ValueError(f"{len(before)} segment(s) predate the recording: a history that starts empty is needed")

    def cuda_malloc(device: int, size: int) -> int:
        if not pending[device]:
            raise AssertionError(f"cuda:{device}: the model asks cudaMalloc for {size} bytes; torch did not")
        addr, real_size = pending[device].pop(0)
        if real_size != size:
            raise AssertionError(f"cuda:{device}: the model's segment is {size} bytes, torch's {real_size}")
        return addr

    # the run's recorded divisions (torch's per-interval map, keys are MiB interval starts) and,
    # unless given, its max_split_size; garbage collection is not modelled
    settings = snapshot.get("allocator_settings") or {}
    if float(settings.get("garbage_collection_threshold") or 0) > 0:
        raise ValueError("garbage_collection_threshold is not modelled")
    recorded = settings.get("roundup_power2_divisions")
    divisions = [int(recorded.get(str(1 << k), 0)) for k in range(16)] if isinstance(recorded, dict) else None
    mss = settings.get("max_split_size")
    if max_split_size is None and isinstance(mss, int) and 0 < mss < 1 << 62:
        max_split_size = mss
    sim = Sim(
        devices=max(1, len(traces)),
        cuda_malloc=cuda_malloc,
        capacity=capacity or DEFAULT_CAPACITY,
        max_split_size=max_split_size,
        roundup_power2_divisions=divisions,
    )
    for dev, tr in enumerate(traces):
        live: dict[int, Handle] = {}
        in_burst = False
        for i, e in enumerate(tr):
            a = e["action"]
            if a in ("segment_map", "segment_unmap"):
                raise ValueError("expandable segments: cudaMalloc addresses cannot be injected")
            if a == "segment_alloc":
                pending[dev].append((e["addr"], e["size"]))
            elif a == "alloc":
                live[e["addr"]] = sim.alloc(
                    e["size"], stream=e["stream"], device=dev, frames=e.get("frames"), label=e.get("user_metadata")
                )
            elif a == "free_requested":
                if e["addr"] not in live:
                    raise ValueError("history incomplete (a free without its alloc)")
                nxt = tr[i + 1] if i + 1 < len(tr) else None
                if not (nxt and nxt["action"] == "free_completed" and nxt["addr"] == e["addr"]):
                    raise ValueError("delayed frees (record_stream) are not driven")
                sim.free(live.pop(e["addr"]), frames=e.get("frames"), label=e.get("user_metadata"))
            elif a == "oom":
                try:
                    sim.alloc(
                        e["size"], stream=e["stream"], device=dev, frames=e.get("frames"), label=e.get("user_metadata")
                    )
                except SimOOM:
                    pass
                else:
                    raise AssertionError(f"cuda:{dev}: torch ran out of memory at entry {i}; the model did not")
            elif a == "segment_free" and not in_burst:
                sim.empty_cache()  # empty_cache() or the OOM retry: both release every free segment
            in_burst = a == "segment_free"
    return sim


def handcrafted_split_sim(remainder_plus: int, *, expandable: bool = False) -> tuple[Sim, Handle]:
    """A 20 MiB large-pool segment with a 15 MiB free tail, then a request that leaves
    ``1 MiB + remainder_plus`` of it: split only if the remainder is *more* than 1 MiB."""
    sim = Sim(expandable=expandable)
    sim.alloc(5 * MiB)  # new 20 MiB segment, split: [5 MiB | 15 MiB free]
    b = sim.alloc(14 * MiB - remainder_plus)  # best fit: the 15 MiB tail
    return sim, b
