"""Array helpers the analyses share."""

from __future__ import annotations

from typing import Any

import numpy as np


def unique(values: Any) -> np.ndarray:
    """The sorted distinct values of ``values`` (as ``np.unique``).

    For integer columns this sorts and keeps each run's first value: numpy 2.3+ finds the
    distinct values of a plain ``np.unique`` with a hash table first, which on this tool's
    columns (addresses, stack and category codes) is several times slower than the sort
    (figures in docs/benchmarks.md, "Measurements behind the code"). Other dtypes (floats:
    NaNs collapse into one; objects) go to ``np.unique``."""
    a = np.asarray(values)
    if a.dtype.kind not in "iub":
        return np.unique(a)
    s = np.sort(a, axis=None)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def isin_sorted(values: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_unique)`` for a test set already sorted and distinct (what
    :func:`unique` returns), by binary search: ``np.isin`` would find the set's distinct
    values again with numpy's hash table (docs/benchmarks.md)."""
    if not len(sorted_unique):
        return np.zeros(np.shape(values), bool)
    at = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[at] == values
