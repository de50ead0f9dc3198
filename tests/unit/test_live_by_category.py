"""``_live_by_category`` (prefix sums read with searchsorted) against one mask per row."""

from __future__ import annotations

import numpy as np

from snapviz.analyses.live_sets import _live_by_category


def test_prefix_sums_equal_masks_on_random_histories() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(0, 400))
        alloc_rows = np.sort(rng.choice(5000, size=n, replace=False)).astype(np.int64)
        # frees after the allocation, never (a large sentinel), or odd ones (-1, the same row)
        frees = alloc_rows + rng.integers(1, 800, size=n)
        frees[rng.random(n) < 0.2] = 10**9
        frees[rng.random(n) < 0.05] = -1
        same = rng.random(n) < 0.05
        frees[same] = alloc_rows[same]
        sizes = rng.integers(1, 1 << 40, size=n).astype(np.int64)
        k = int(rng.integers(1, 6))
        codes = rng.integers(0, k, size=n)
        rows = rng.integers(-5, 5100, size=int(rng.integers(0, 30))).astype(np.int64)
        count, total = _live_by_category(alloc_rows, frees, sizes, codes, k, rows)
        for q, r in enumerate(rows.tolist()):
            alive = (alloc_rows <= r) & (frees > r)
            assert count[q].tolist() == np.bincount(codes[alive], minlength=k).tolist()
            assert total[q].tolist() == [int(sizes[alive & (codes == c)].sum()) for c in range(k)]
