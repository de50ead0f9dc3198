"""Min/max decimation for timelines too long to draw point by point.

The x range is cut into equal-width buckets; every bucket keeps, for each series, the
row of its minimum and of its maximum, so spikes survive (the global peak is always a
bucket's maximum) and the envelope of each series is exact at the bucket resolution.
The first and last rows are always kept. Vectorized: one ``reduceat`` per series and
reduction, so a million rows take tens of milliseconds.
"""

from __future__ import annotations

import warnings

import numpy as np

from snapviz.arrays import unique
from snapviz.compiled import kernel, readonly


def was_decimated(n: int, max_points: int) -> bool:
    """Whether :func:`decimate_minmax` drops rows from a series of ``n`` rows."""
    return max_points > 0 and n > max_points


def _bucket_argext(
    y_lo: np.ndarray, y_hi: np.ndarray, starts: np.ndarray, n: int, bucket_of: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Row of the first minimum of ``y_lo`` and of the first maximum of ``y_hi`` in each bucket
    (``starts``: each bucket's first row, increasing; ``bucket_of``: each row's bucket, None
    where the compiled loop runs)."""
    if bucket_of is not None:
        return _bucket_argext_numpy(y_lo, y_hi, starts, bucket_of)
    return _argext_compiled(y_lo, y_hi, starts, n)


def _argext_compiled(y_lo: np.ndarray, y_hi: np.ndarray, starts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The compiled loop's extremes (the ``decimate`` kernel of :mod:`snapviz.compiled`)."""
    compiled = KERNEL.compiled()
    if compiled is None:
        raise RuntimeError("numba is not installed (pip install numba)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mins, maxs = compiled(readonly(y_lo), readonly(y_hi), readonly(starts.astype(np.int64, copy=False)), n)
    return mins, maxs


def _argext_reference(y_lo: np.ndarray, y_hi: np.ndarray, starts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_bucket_argext_numpy` with the same arguments as the compiled loop."""
    return _bucket_argext_numpy(y_lo, y_hi, starts, np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n))))


def _argext_py(
    y_lo: np.ndarray, y_hi: np.ndarray, starts: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """:func:`_bucket_argext_numpy` as one loop: the first row holding each bucket's extreme."""
    nb = len(starts)
    mins = np.empty(nb, np.int64)
    maxs = np.empty(nb, np.int64)
    for b in range(nb):
        a = starts[b]
        e = starts[b + 1] if b + 1 < nb else n
        lo_at = a
        hi_at = a
        lo = y_lo[a]
        hi = y_hi[a]
        for i in range(a + 1, e):
            if y_lo[i] < lo:
                lo = y_lo[i]
                lo_at = i
            if y_hi[i] > hi:
                hi = y_hi[i]
                hi_at = i
        mins[b] = lo_at
        maxs[b] = hi_at
    return mins, maxs


def _bucket_argext_numpy(
    y_lo: np.ndarray, y_hi: np.ndarray, starts: np.ndarray, bucket_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: one ``reduceat`` per reduction, then each bucket's first row holding it."""
    out = []
    for reduce, y in ((np.minimum, y_lo), (np.maximum, y_hi)):
        ext = reduce.reduceat(y, starts)
        hit = np.flatnonzero(y == ext[bucket_of])
        # The first hit of each bucket: hits are sorted, so a bucket change marks it.
        first = np.ones(len(hit), bool)
        first[1:] = bucket_of[hit[1:]] != bucket_of[hit[:-1]]
        out.append(hit[first])
    return out[0], out[1]


def decimate_minmax(x: np.ndarray, *ys: np.ndarray, max_points: int) -> np.ndarray:
    """Sorted unique row indices that keep every bucket's min and max of each of ``ys``.

    ``x`` must be non-decreasing (event index or time); buckets are equal-width in x.
    Returns at most ``max_points`` indices (all rows when there are no more than that).
    NaN in a series are ignored for its extremes (those rows may still be kept for others).
    """
    x = np.asarray(x)
    n = len(x)
    if not was_decimated(n, max_points):
        return np.arange(n, dtype=np.int64)
    series = [np.asarray(y) for y in ys] or [np.zeros(n)]
    for y in series:
        if len(y) != n:
            raise ValueError(f"series of length {len(y)} does not match x of length {n}")
    per_bucket = 2 * len(series)
    nb = max(1, (max_points - 2) // per_bucket)
    xf = x.astype(np.float64, copy=False)
    lo, hi = float(xf[0]), float(xf[-1])
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo or np.any(np.diff(xf) < 0):
        xf = np.arange(n, dtype=np.float64)  # no usable x: buckets of equal row counts
        lo, hi = 0.0, float(n - 1)
    best = _decimate(xf, lo, hi, series, nb)
    # Extremes of several series often share rows: spend the unused budget on finer buckets.
    for _ in range(3):
        if len(best) > max_points * 0.8:
            break
        nb = int(nb * max_points / max(len(best), 1) * 0.95)
        trial = _decimate(xf, lo, hi, series, nb)
        if len(trial) > max_points:
            break
        best = trial
    return best


def _decimate(xf: np.ndarray, lo: float, hi: float, series: list[np.ndarray], nb: int) -> np.ndarray:
    n = len(xf)
    edges = np.linspace(lo, hi, nb + 1)[:-1]
    starts = unique(np.searchsorted(xf, edges, side="left"))
    starts = starts[starts < n]
    compiled = KERNEL.wanted(n)
    bucket_of = None if compiled else np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    keep = [np.array([0, n - 1], np.int64)]
    for y in series:
        if y.dtype.kind == "f":
            nan = np.isnan(y)
            if nan.any():
                # NaN never wins a min or a max: stand in the series' opposite extreme.
                ok = ~nan
                y_min = float(np.min(y[ok])) if ok.any() else 0.0
                y_max = float(np.max(y[ok])) if ok.any() else 0.0
                mins, maxs = _bucket_argext(np.where(nan, y_max, y), np.where(nan, y_min, y), starts, n, bucket_of)
                keep += [mins, maxs]
                continue
        mins, maxs = _bucket_argext(y, y, starts, n, bucket_of)
        keep += [mins, maxs]
    return unique(np.concatenate(keep)).astype(np.int64)


# From ``decimate`` rows on (snapviz.compiled.MIN_SIZE) the buckets' extremes are found by a
# compiled loop: one pass per series instead of the vectorised form's several.
KERNEL = kernel(_argext_py, reference=_argext_reference, compiled_path=_argext_compiled, min_size="decimate")
