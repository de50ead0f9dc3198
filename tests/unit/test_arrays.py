"""snapviz.arrays.unique: the same values and dtype as np.unique on every kind of column."""

from __future__ import annotations

import numpy as np
import pytest

from snapviz.arrays import isin_sorted, unique


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, np.bool_])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize("distinct", [1, 3, 10_000])
def test_integer_columns_equal_numpy(dtype: type, n: int, distinct: int) -> None:
    rng = np.random.default_rng(n * 31 + distinct)
    a: np.ndarray = rng.integers(0, distinct, n).astype(dtype)
    got, want = unique(a), np.unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_two_dimensional_and_list_inputs_flatten() -> None:
    a = np.array([[5, 1, 5], [1, -3, 9]], np.int64)
    np.testing.assert_array_equal(unique(a), [-3, 1, 5, 9])
    np.testing.assert_array_equal(unique([3, 3, 1]), [1, 3])


def test_extreme_values_keep_their_order() -> None:
    a = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max], np.int64)
    np.testing.assert_array_equal(unique(a), np.unique(a))


def test_floats_and_objects_are_numpy_s() -> None:
    f = np.array([np.nan, 1.0, np.nan, 0.5])
    np.testing.assert_array_equal(unique(f), np.unique(f))  # NaNs collapse, as numpy does
    assert len(unique(f)) == 3
    o = np.array(["b", "a", "b"], dtype=object)
    assert unique(o).tolist() == ["a", "b"]


@pytest.mark.parametrize("n_set", [0, 1, 5, 3000])
def test_isin_sorted_equals_isin(n_set: int) -> None:
    rng = np.random.default_rng(n_set)
    s = unique(rng.integers(-50, 10_000, n_set).astype(np.int64))
    v = rng.integers(-100, 10_100, 5000).astype(np.int64)  # duplicates, values below and above the set
    np.testing.assert_array_equal(isin_sorted(v, s), np.isin(v, s))
    assert isin_sorted(np.empty(0, np.int64), s).shape == (0,)
