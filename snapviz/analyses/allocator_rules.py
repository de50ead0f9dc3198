"""The CUDA caching allocator's sizing rules: the one home shared by the replay and the simulator.

Each function follows one function of PyTorch's source, named in its docstring:
``c10/cuda/CUDACachingAllocator.cpp`` (``round_size``, ``roundup_power2_next_division``,
``get_pool``, ``get_allocation_size``, ``should_split``, ``get_free_block``) and the settings
parser ``c10/core/AllocatorConfig.cpp`` (``AcceleratorAllocatorConfig::parseArgs``,
``parseRoundUpPower2Divisions``, ``roundup_power2_divisions(size)``; before torch 2.9 the same
code lived in ``c10/cuda/CUDAAllocatorConfig.cpp``). Sizes are bytes; "size" below is the
request already rounded by :func:`round_size` unless said otherwise.

Settings come either from a snapshot's ``allocator_settings`` (torch >= 2.3 records the
divisions per power-of-two interval as ``{'1': d, '2': d, ..., '32768': d}``, keys in MiB)
or from a ``PYTORCH_CUDA_ALLOC_CONF`` string. No torch import: the analyzer never needs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

# c10/core/AllocatorConfig.h / CUDACachingAllocator.cpp constants
MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least this
SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" request (1 MiB)
SMALL_BUFFER = 2 << 20  # kSmallBuffer: segment size of the small pool (2 MiB)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests below this get a large_segment_size segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: default large_segment_size and max_non_split_rounding (20 MiB)
ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests' segments are rounded to this (2 MiB)
MB = 1 << 20

ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB, one per power of two
ROUNDUP_FIRST_LOG2 = 20  # log2(kRoundUpPowerOfTwoStart = 1 MiB)
NO_LIMIT = (1 << 63) - 1  # max_split_size unset (SIZE_MAX in torch; kept inside int64 for numpy/numba)
# Division counts are kept at most this (a count that large leaves every real size at 512-byte
# rounding anyway), so a file's absurd value cannot overflow the int64 table.
MAX_DIVISIONS = 1 << 32

_KNOWN_KEYS = frozenset(
    {
        "backend",
        "expandable_segments",
        "garbage_collection_threshold",
        "graph_capture_record_stream_reuse",
        "large_segment_size_mb",
        "max_non_split_rounding_mb",
        "max_split_size_mb",
        "pinned_num_register_threads",
        "pinned_reserve_segment_size_mb",
        "pinned_use_background_threads",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "roundup_power2_divisions",
    }
)


@dataclass(frozen=True)
class AllocatorSettings:
    """The settings that change block sizes and placement (defaults = no PYTORCH_CUDA_ALLOC_CONF).

    ``recorded`` is False when built without any information (e.g. a snapshot from before
    torch 2.3, which has no ``allocator_settings``): the defaults are then an assumption.
    """

    roundup_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS  # per interval, index = log2(MiB)
    max_split_size: int = NO_LIMIT
    max_non_split_rounding_size: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    backend: str = "native"  # "cudaMallocAsync": the caching allocator is not in use
    recorded: bool = True
    notes: tuple[str, ...] = field(default=(), compare=False)  # settings read but not understood

    @property
    def rounds_power2(self) -> bool:
        """Whether ``roundup_power2_divisions`` changes any size (a division count above 1)."""
        return any(d > 1 for d in self.roundup_divisions)

    @property
    def divisions_table(self) -> np.ndarray:
        """The 16 per-interval division counts as an int64 array."""
        return np.asarray(self.roundup_divisions, dtype=np.int64)


DEFAULT_SETTINGS = AllocatorSettings()


# ---- sizes ---------------------------------------------------------------------------


def _log2_floor(x: int) -> int:
    return x.bit_length() - 1


def divisions_for(size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> int:
    """``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``: the interval's division count.

    The interval index is ``clamp(floor(log2(size)) - 20, 0, 15)``: everything below 2 MiB uses
    the first interval's value, everything from 32 GiB up the last one's.
    """
    index = min(max(_log2_floor(size) - ROUNDUP_FIRST_LOG2, 0), ROUNDUP_INTERVALS - 1)
    return settings.roundup_divisions[index]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: up to the next of ``divisions`` equal steps between powers of two.

    A power of two stays as it is. The step is ``power2_floor(size) >> floor(log2(divisions))``
    (a count that is not a power of two acts as the power of two below it); a zero step rounds
    to the next power of two. E.g. 1200 B with 4 divisions: steps 1024, 1280, 1536, 1792 -> 1280.
    """
    if size <= 0 or size & (size - 1) == 0:
        return size
    if divisions < 2:
        raise ValueError("Only 2 or more divisions are supported")
    power2_floor = 1 << _log2_floor(size)
    step = power2_floor >> _log2_floor(divisions)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> int:
    """``round_size``: the block size the allocator hands out for a request of ``size`` bytes.

    Below 512 B -> 512 B. Otherwise, when the request's interval has ``d > 1`` divisions and
    ``size > 512 * d``, :func:`roundup_power2_next_division`; else up to a multiple of 512 B.
    """
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    d = divisions_for(size, settings)
    if d > 1 and size > MIN_BLOCK_SIZE * d:
        return roundup_power2_next_division(size, d)
    return (size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE


_POW2 = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))  # 1, 2, 4, ..., 2**62


def log2_floor_array(values: np.ndarray) -> np.ndarray:
    """``floor(log2(v))`` for positive int64 values, exactly (no float rounding near powers of two)."""
    return np.searchsorted(_POW2, values, side="right").astype(np.int64) - 1


def round_sizes(sizes: np.ndarray, settings: AllocatorSettings = DEFAULT_SETTINGS) -> np.ndarray:
    """:func:`round_size` over an int64 array, vectorized; equal to it element by element."""
    s = np.asarray(sizes, dtype=np.int64)
    out = np.maximum((s + (MIN_BLOCK_SIZE - 1)) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE, MIN_BLOCK_SIZE)
    if not settings.rounds_power2 or not len(s):
        return out
    pos = np.maximum(s, 1)
    lg = log2_floor_array(pos)
    d = settings.divisions_table[np.clip(lg - ROUNDUP_FIRST_LOG2, 0, ROUNDUP_INTERVALS - 1)]
    pick = (s >= MIN_BLOCK_SIZE) & (d > 1) & (s > MIN_BLOCK_SIZE * d) & ((s & (s - 1)) != 0)
    if pick.any():
        sp, lp, dp = s[pick], lg[pick], d[pick]
        step = np.right_shift(np.left_shift(np.int64(1), lp), log2_floor_array(dp))
        zero = step == 0
        safe = np.where(zero, 1, step)
        floor = sp & ~(safe - 1)
        up = np.where(floor == sp, sp, floor + safe)
        out[pick] = np.where(zero, np.left_shift(np.int64(1), lp + 1), up)
    # a power of two above 512 * d stays as it is: already a multiple of 512, so ``out`` holds it
    return out


def is_small(size: int) -> bool:
    """``get_pool``: a (rounded) request of at most 1 MiB goes to the small pool."""
    return size <= SMALL_SIZE


def allocation_size(size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a (rounded) request that no cached block fits.

    Small requests get a 2 MiB segment; requests below 10 MiB a ``large_segment_size``
    (20 MiB unless ``large_segment_size_mb`` is set); larger ones their size rounded up to 2 MiB.
    """
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return settings.large_segment_size
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def should_split(block_size: int, size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> bool:
    """``should_split``: whether a cached block of ``block_size`` taken for ``size`` keeps a free remainder.

    The pool is the request's (:func:`is_small`). Small pool or expandable segments: a
    remainder of at least 512 B is split off. Large pool: only when ``size`` is below
    ``max_split_size`` and the remainder exceeds 1 MiB; otherwise the whole block is handed out.
    """
    remaining = block_size - size
    if is_small(size) or settings.expandable_segments:
        return remaining >= MIN_BLOCK_SIZE
    return size < settings.max_split_size and remaining > SMALL_SIZE


def handed_out(block_size: int, size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> int:
    """The block size a request of (rounded) ``size`` gets from a cached block of ``block_size``."""
    return size if should_split(block_size, size, settings) else block_size


def may_take_cached(size: int, block_size: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> bool:
    """``get_free_block``'s oversize rules: may a (rounded) request take this best-fit cached block?

    A request below ``max_split_size`` never takes a block at or above it; a request at or
    above it takes one only if the block is smaller than the request + ``max_non_split_rounding``.
    """
    if block_size < size:
        return False
    if size < settings.max_split_size and block_size >= settings.max_split_size:
        return False
    return not (size >= settings.max_split_size and block_size >= size + settings.max_non_split_rounding_size)


# ---- settings ------------------------------------------------------------------------


def _lex(text: str) -> list[str]:
    """``lexArgs`` / ``ConfigTokenizer``: split on ``, : [ ]`` (kept as tokens), dropping spaces."""
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _uint(tok: str, what: str) -> int:
    if not tok.isdigit():
        raise ValueError(f"{what}: expected a whole number, got {tok!r}")
    return int(tok)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def parse_roundup_divisions(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``parseRoundUpPower2Divisions``: ``4`` (every interval) or ``[256:1,512:2,>:4]`` (per interval).

    In the list form keys are MiB interval starts (powers of two); the first key's value also
    fills every interval below it; ``>`` fills every interval after the last key. Divisions
    must be powers of two (0 disables rounding in the list form); intervals between two keys
    keep 0. Releases before the tokenizer rewrite let ``>`` also overwrite the last key's own
    interval; a snapshot's recorded table is what its allocator used, so the replay reads that
    (:func:`settings_from_record`) and this parser serves only conf strings. Returns (table, last token).
    """
    table = [0] * ROUNDUP_INTERVALS
    if i >= len(tokens):
        raise ValueError("roundup_power2_divisions: expecting a value")
    if tokens[i] != "[":
        value = _uint(tokens[i], "roundup_power2_divisions")
        if not _is_pow2(value):
            raise ValueError("roundup_power2_divisions: the divisions have to be a power of 2")
        return (min(value, MAX_DIVISIONS),) * ROUNDUP_INTERVALS, i
    first, last_index = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError("roundup_power2_divisions: expected ':' after an interval")
        value = _uint(tokens[i + 2], "roundup_power2_divisions")
        if value != 0 and not _is_pow2(value):
            raise ValueError("roundup_power2_divisions: the divisions have to be a power of 2 or 0")
        value = min(value, MAX_DIVISIONS)
        if key == ">":
            for k in range(last_index + 1, ROUNDUP_INTERVALS):
                table[k] = value
        else:
            boundary = _uint(key, "roundup_power2_divisions interval")
            if not _is_pow2(boundary):
                raise ValueError("roundup_power2_divisions: the intervals have to be powers of 2 (MiB)")
            index = min(_log2_floor(boundary), ROUNDUP_INTERVALS - 1)
            if first:
                table[:index] = [value] * index
                first = False
            table[index] = value
            last_index = index
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise ValueError("roundup_power2_divisions: expected a closing ']'")
    return tuple(table), i


def _bool(tok: str, key: str) -> bool:
    if tok not in ("True", "False"):
        raise ValueError(f"{key}: expected True or False, got {tok!r}")
    return tok == "True"


def parse_alloc_conf(text: str) -> AllocatorSettings:
    """``parseArgs``: a ``PYTORCH_CUDA_ALLOC_CONF`` string as settings; ValueError on what torch rejects.

    Options that do not change sizes or placement (pinned memory, lock release) are accepted
    and ignored, as torch accepts them.
    """
    tokens = _lex(text)
    s = AllocatorSettings()
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if key not in _KNOWN_KEYS:
            raise ValueError(f"unrecognized allocator option {key!r}")
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError(f"{key}: expected ':' and a value")
        i += 2
        tok = tokens[i]
        if key == "roundup_power2_divisions":
            table, i = parse_roundup_divisions(tokens, i)
            s = replace(s, roundup_divisions=table)
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb"):
            mb = _uint(tok, key)
            if key != "large_segment_size_mb" and mb < LARGE_BUFFER // MB:
                raise ValueError(f"{key} too small, must be >= {LARGE_BUFFER // MB}")
            val = min(mb * MB, NO_LIMIT)
            if key == "max_split_size_mb":
                s = replace(s, max_split_size=val)
            elif key == "max_non_split_rounding_mb":
                s = replace(s, max_non_split_rounding_size=val)
            else:
                s = replace(s, large_segment_size=val)
        elif key == "garbage_collection_threshold":
            try:
                g = float(tok)
            except ValueError:
                raise ValueError(f"{key}: expected a number, got {tok!r}") from None
            if not 0.0 < g < 1.0:
                raise ValueError("garbage_collection_threshold must be in (0.0, 1.0)")
            s = replace(s, garbage_collection_threshold=g)
        elif key == "expandable_segments":
            s = replace(s, expandable_segments=_bool(tok, key))
        elif key == "backend":
            if tok not in ("native", "cudaMallocAsync", "hipMallocAsync"):
                raise ValueError(f"unknown allocator backend {tok!r}")
            s = replace(s, backend=tok)
        # other known options do not change block sizes: their value is skipped
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"expected ',' after {key}")
            i += 1
    return s


def _int_or_none(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _clamp_divisions(d: int) -> int:
    return min(max(d, 0), MAX_DIVISIONS)


def _divisions_from_record(v: object) -> tuple[tuple[int, ...] | None, str | None]:
    """A recorded ``roundup_power2_divisions``: a map of MiB interval starts, a list of 16, or one number."""
    one = _int_or_none(v)
    if one is not None:
        return (_clamp_divisions(one),) * ROUNDUP_INTERVALS, None
    if isinstance(v, (list, tuple)) and len(v) == ROUNDUP_INTERVALS:
        vals = [_int_or_none(x) for x in v]
        if all(x is not None for x in vals):
            return tuple(_clamp_divisions(x or 0) for x in vals), None
    if isinstance(v, Mapping):
        table = [0] * ROUNDUP_INTERVALS
        for k, val in v.items():
            mib, d = _int_or_none(k), _int_or_none(val)
            if mib is None or d is None or not _is_pow2(mib):
                return None, "roundup_power2_divisions is recorded in a form snapviz does not read"
            table[min(_log2_floor(mib), ROUNDUP_INTERVALS - 1)] = _clamp_divisions(d)
        return tuple(table), None
    return None, "roundup_power2_divisions is recorded in a form snapviz does not read"


def settings_from_record(record: Mapping[str, object] | None) -> AllocatorSettings:
    """Settings from a snapshot's ``allocator_settings`` (None or empty: defaults, ``recorded=False``).

    The ``PYTORCH_CUDA_ALLOC_CONF`` string it holds is read first (it alone carries
    ``max_non_split_rounding_mb`` and ``large_segment_size_mb``); the structured fields then
    win, as they are what the allocator used. What cannot be read is listed in ``notes``.
    """
    if not record:
        return replace(DEFAULT_SETTINGS, recorded=False)
    notes: list[str] = []
    s = AllocatorSettings()
    conf = record.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(conf, str) and conf.strip():
        try:
            s = parse_alloc_conf(conf)
        except ValueError:
            notes.append("the recorded PYTORCH_CUDA_ALLOC_CONF could not be read")
    if "roundup_power2_divisions" in record:
        table, note = _divisions_from_record(record["roundup_power2_divisions"])
        if table is not None:
            s = replace(s, roundup_divisions=table)
        if note:
            notes.append(note)
    mss = _int_or_none(record.get("max_split_size"))
    if mss is not None:
        s = replace(s, max_split_size=NO_LIMIT if mss <= 0 else min(mss, NO_LIMIT))
    if "expandable_segments" in record:
        s = replace(s, expandable_segments=bool(record.get("expandable_segments")))
    gc = record.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and not isinstance(gc, bool):
        s = replace(s, garbage_collection_threshold=float(gc))
    return replace(s, notes=tuple(notes))
