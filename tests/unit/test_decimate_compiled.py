"""The compiled bucket extremes equal the numpy reference: values with ties, NaNs (replaced as
decimate_minmax replaces them), ints and floats, buckets of one row, and whole decimations."""

from __future__ import annotations

import numpy as np
import pytest

from snapviz.analyses import decimate

pytest.importorskip("numba")


def _starts(rng: np.random.Generator, n: int) -> np.ndarray:
    cut = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 60))), replace=False))
    return np.r_[0, cut].astype(np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_kernel_equals_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    starts = _starts(rng, n) if n > 1 else np.zeros(1, np.int64)
    bucket_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    ints = rng.integers(0, 4, n).astype(np.int64)  # many ties
    floats = rng.normal(size=n).round(1)
    floats[rng.random(n) < 0.2] = np.nan
    nan = np.isnan(floats)
    lo, hi = (
        np.where(nan, np.nanmax(floats) if (~nan).any() else 0.0, floats),
        np.where(nan, np.nanmin(floats) if (~nan).any() else 0.0, floats),
    )
    kernel = decimate.KERNEL.compiled()
    assert kernel is not None
    for y_lo, y_hi in ((ints, ints), (lo, hi)):
        want = decimate._bucket_argext_numpy(y_lo, y_hi, starts, bucket_of)
        got = kernel(y_lo, y_hi, starts, n)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_whole_decimation_is_the_same_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    n = 300_000
    x = np.cumsum(rng.integers(0, 3, n))
    a = np.cumsum(rng.integers(-5, 6, n)).astype(np.int64)
    r = a + 100
    q = a.astype(np.float64)
    q[rng.random(n) < 0.01] = np.nan
    compiled = decimate.decimate_minmax(x, a, r, q, max_points=5000)
    monkeypatch.setenv("SNAPVIZ_KERNEL_MIN_SIZE", f"decimate={n + 1}")
    reference = decimate.decimate_minmax(x, a, r, q, max_points=5000)
    np.testing.assert_array_equal(compiled, reference)
    assert int(np.argmax(a)) in set(compiled.tolist())
