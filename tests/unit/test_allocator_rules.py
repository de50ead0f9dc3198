"""snapviz.analyses.allocator_rules against a literal transcription of PyTorch's C++ rules.

The ``_c10_*`` functions below are written line by line from c10/cuda/CUDACachingAllocator.cpp
(``round_size``, ``roundup_power2_next_division``) and c10/core/AllocatorConfig.cpp
(``roundup_power2_divisions(size)``, using countLeadingZeros on 64-bit words) so that the module
is checked against the source's own arithmetic, not against a copy of itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapviz.analyses import allocator_rules as ar

U64 = (1 << 64) - 1


def _clz64(x: int) -> int:
    n = 0
    for bit in range(63, -1, -1):
        if x >> bit & 1:
            return n
        n += 1
    return 64


def _c10_divisions(size: int, table: list[int]) -> int:
    log_size = 63 - _clz64(size)
    interval_start = 63 - _clz64(1 << 20)
    index = log_size - interval_start if log_size > interval_start else 0
    index = min(index, 16 - 1)
    return table[index]


def _c10_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:  # llvm::isPowerOf2_64 (size > 0 here)
        return size
    power2_floor = 1 << (63 - _clz64(size))  # llvm::PowerOf2Floor
    power2_division = power2_floor >> (63 - _clz64(divisions))
    if power2_division == 0:
        return power2_floor << 1
    round_size_floor = size & (~(power2_division - 1) & U64)
    return size if round_size_floor == size else round_size_floor + power2_division


def _c10_round_size(size: int, table: list[int]) -> int:
    k_min = 512
    if size < k_min:
        return k_min
    divisions = _c10_divisions(size, table)
    if divisions > 1 and size > k_min * divisions:
        return _c10_next_division(size, divisions)
    return k_min * ((size + k_min - 1) // k_min)


def test_constants_are_the_allocators() -> None:
    assert ar.MIN_BLOCK_SIZE == 512
    assert ar.SMALL_SIZE == 1048576
    assert ar.SMALL_BUFFER == 2097152
    assert ar.MIN_LARGE_ALLOC == 10485760
    assert ar.LARGE_BUFFER == 20971520
    assert ar.ROUND_LARGE == 2097152


def test_hand_cases() -> None:
    four = ar.parse_alloc_conf("roundup_power2_divisions:4")
    # the source's own example: 1200 B with 4 divisions -> 1280 B
    assert ar.roundup_power2_next_division(1200, 4) == 1280
    # ... but round_size applies divisions only above 512 * d = 2048 B: 1200 -> 1536 (512-multiple)
    assert ar.round_size(1200, four) == 1536
    assert ar.round_size(2048, four) == 2048
    assert ar.round_size(2049, four) == 2560
    assert ar.round_size(3000, four) == 3072
    assert ar.round_size(1, four) == 512
    assert ar.round_size(0, four) == 512
    assert ar.round_size(1 << 30, four) == 1 << 30  # a power of two stays
    assert ar.round_size((1 << 30) + 1, four) == (1 << 30) + (1 << 28)
    assert ar.round_size(3 * (1 << 20) + 1, four) == 3 * (1 << 20) + (1 << 19)
    # without divisions, a multiple of 512
    assert ar.round_size((1 << 30) + 1) == (1 << 30) + 512
    assert ar.round_size(511) == 512
    assert ar.round_size(513) == 1024


def test_per_interval_table() -> None:
    s = ar.parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert s.roundup_divisions == (1,) * 9 + (2,) + (4,) * 6
    # a 300 MiB request: interval 256 MiB, 1 division -> 512-byte rounding
    assert ar.round_size(300 * ar.MB + 1, s) == 300 * ar.MB + 512
    # 600 MiB + 1: interval 512 MiB, 2 divisions -> steps of 256 MiB -> 768 MiB
    assert ar.round_size(600 * ar.MB + 1, s) == 768 * ar.MB
    # 1.1 GiB: 4 divisions -> 1.25 GiB
    assert ar.round_size(1100 * ar.MB, s) == 1280 * ar.MB
    # below 1 MiB the first interval's value applies (1 division: none)
    assert ar.round_size(1200, s) == 1536
    only_list = ar.parse_alloc_conf("roundup_power2_divisions:[1:8,64:2]")
    # intervals between two keys keep 0 (only the first key fills below it, only ">" fills above)
    assert only_list.roundup_divisions == (8,) + (0,) * 5 + (2,) + (0,) * 9


def test_conf_string() -> None:
    s = ar.parse_alloc_conf(
        "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:4],"
        "garbage_collection_threshold:0.6"
    )
    assert s.expandable_segments
    assert s.max_split_size == 64 * ar.MB
    assert s.garbage_collection_threshold == 0.6
    assert s.roundup_divisions[10] == 4
    assert ar.parse_alloc_conf("") == ar.DEFAULT_SETTINGS
    assert ar.parse_alloc_conf(" max_non_split_rounding_mb : 40 ").max_non_split_rounding_size == 40 * ar.MB
    assert ar.parse_alloc_conf("pinned_use_cuda_host_register:True,backend:native") == ar.DEFAULT_SETTINGS


@pytest.mark.parametrize(
    "bad",
    [
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[256:3]",
        "roundup_power2_divisions:[300:2]",
        "roundup_power2_divisions:[256:2",
        "max_split_size_mb:10",
        "garbage_collection_threshold:1.5",
        "expandable_segments:yes",
        "no_such_option:1",
        "max_split_size_mb",
    ],
)
def test_conf_string_rejects_what_torch_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        ar.parse_alloc_conf(bad)


def test_settings_from_record() -> None:
    rec = {
        "PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:4,max_non_split_rounding_mb:30",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": {str(1 << k): 4 for k in range(16)},
    }
    s = ar.settings_from_record(rec)
    assert s.recorded and s.rounds_power2 and s.max_split_size == ar.NO_LIMIT
    assert s.max_non_split_rounding_size == 30 * ar.MB
    assert s.roundup_divisions == (4,) * 16
    per = ar.settings_from_record({"roundup_power2_divisions": {"1": 0, "512": 2, "1024": 8}})
    assert per.roundup_divisions[9] == 2 and per.roundup_divisions[10] == 8 and per.roundup_divisions[0] == 0
    assert ar.settings_from_record({"roundup_power2_divisions": 2}).roundup_divisions == (2,) * 16
    assert not ar.settings_from_record(None).recorded
    assert ar.settings_from_record({"roundup_power2_divisions": {"x": 1}}).notes
    assert ar.settings_from_record({"max_split_size": 64 * ar.MB}).max_split_size == 64 * ar.MB


_tables = st.one_of(
    st.sampled_from([0, 1, 2, 4, 8, 16, 32]).map(lambda d: [d] * 16),
    st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 1024]), min_size=16, max_size=16),
)
_sizes = st.one_of(
    st.integers(0, 1 << 14),
    st.integers(0, 1 << 40),
    st.integers(0, 40).map(lambda k: 1 << k),
    st.integers(1, 40).flatmap(lambda k: st.integers((1 << k) - 3, (1 << k) + 3)),
)


@settings(max_examples=400, deadline=None)
@given(table=_tables, sizes=st.lists(_sizes, min_size=1, max_size=40))
def test_round_size_is_c10s_on_random_sizes(table: list[int], sizes: list[int]) -> None:
    s = ar.AllocatorSettings(roundup_divisions=tuple(table))
    want = [_c10_round_size(x, table) for x in sizes]
    assert [ar.round_size(x, s) for x in sizes] == want
    assert ar.round_sizes(np.array(sizes, dtype=np.int64), s).tolist() == want


def test_round_sizes_on_a_large_array() -> None:
    rng = np.random.default_rng(7)
    sizes = np.concatenate(
        [rng.integers(0, 1 << 36, 20_000), 1 << rng.integers(0, 36, 2_000), rng.integers(0, 4096, 2_000)]
    ).astype(np.int64)
    for conf in ("roundup_power2_divisions:4", "roundup_power2_divisions:[1:2,64:8,>:1]", ""):
        s = ar.parse_alloc_conf(conf)
        table = list(s.roundup_divisions)
        want = np.array([_c10_round_size(int(x), table) for x in sizes.tolist()], dtype=np.int64)
        np.testing.assert_array_equal(ar.round_sizes(sizes, s), want)


def test_pool_segment_and_split_rules() -> None:
    d = ar.DEFAULT_SETTINGS
    assert ar.is_small(ar.SMALL_SIZE) and not ar.is_small(ar.SMALL_SIZE + 512)
    assert ar.allocation_size(512) == 2 * ar.MB
    assert ar.allocation_size(ar.SMALL_SIZE + 512) == 20 * ar.MB
    assert ar.allocation_size(10 * ar.MB - 512) == 20 * ar.MB
    assert ar.allocation_size(10 * ar.MB) == 10 * ar.MB
    assert ar.allocation_size(10 * ar.MB + 1) == 12 * ar.MB
    # small pool: any remainder of 512 B or more is split off
    assert not ar.should_split(2 * ar.MB, 2 * ar.MB - 512)  # a large request: 512 B is too little
    assert ar.should_split(ar.MB + 512, ar.MB)
    assert not ar.should_split(ar.MB, ar.MB)
    # large pool: the remainder must exceed 1 MiB
    assert not ar.should_split(4 * ar.MB, 3 * ar.MB)
    assert ar.should_split(4 * ar.MB + 512, 3 * ar.MB)
    assert ar.handed_out(4 * ar.MB, 3 * ar.MB) == 4 * ar.MB
    assert ar.handed_out(20 * ar.MB, 3 * ar.MB) == 3 * ar.MB
    # expandable segments: 512 B is enough in the large pool too
    ex = ar.parse_alloc_conf("expandable_segments:True")
    assert ar.should_split(3 * ar.MB + 512, 3 * ar.MB, ex)
    # max_split_size: requests at or above it never split
    ms = ar.parse_alloc_conf("max_split_size_mb:64")
    assert not ar.should_split(200 * ar.MB, 64 * ar.MB, ms)
    assert ar.should_split(200 * ar.MB, 63 * ar.MB, ms)
    assert not ar.may_take_cached(32 * ar.MB, 64 * ar.MB, ms)  # below max_split never takes an oversize block
    assert ar.may_take_cached(70 * ar.MB, 89 * ar.MB, ms)
    assert not ar.may_take_cached(70 * ar.MB, 90 * ar.MB, ms)  # request + 20 MiB
    assert ar.may_take_cached(32 * ar.MB, 40 * ar.MB, d) and not ar.may_take_cached(32 * ar.MB, 31 * ar.MB, d)


def test_absurd_recorded_values_do_not_break_the_rules() -> None:
    """A hostile or corrupt allocator_settings: huge, negative or non-numeric values."""
    s = ar.settings_from_record(
        {"roundup_power2_divisions": {"1": 10**30, "2": -4, "4": "x"}, "max_split_size": 10**40}
    )
    assert s.notes  # the non-numeric entry is said, not guessed
    s = ar.settings_from_record({"roundup_power2_divisions": {"1": 10**30, "2": -4}, "max_split_size": 10**40})
    assert max(s.roundup_divisions) <= ar.MAX_DIVISIONS and min(s.roundup_divisions) >= 0
    assert s.max_split_size == ar.NO_LIMIT
    sizes = np.array([0, 1, 513, 1 << 20, (1 << 40) + 1], dtype=np.int64)
    assert ar.round_sizes(sizes, s).tolist() == [ar.round_size(int(x), s) for x in sizes]
    big = ar.parse_alloc_conf(f"roundup_power2_divisions:{1 << 80}")
    assert big.roundup_divisions[0] == ar.MAX_DIVISIONS
    assert ar.round_sizes(sizes, big).tolist() == [ar.round_size(int(x), big) for x in sizes]
