"""snapviz.compiled: a kernel compiles where numba's cache misses and loads from the cache
after that, through numba's public ``njit(cache=True)`` alone (no patch on numba's cache, no
module placed in ``sys.modules``). Each case runs in a fresh interpreter, since what is being
checked is what a process imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

# A kernel written to a module of its own (numba caches by source file), called, and what the
# process imported reported back.
_MODULE = """
import numpy as np

def total(a):
    s = 0
    for i in range(a.shape[0]):
        s += a[i] * 2
    return s, np.searchsorted(np.cumsum(a), 7) + np.empty(3).shape[0]
"""

_RUN = """
import json, sys
import numpy as np
sys.path.insert(0, {where!r})
before = set(sys.modules)
from snapviz.compiled import njit_cached
import kern
fn = njit_cached(kern.total)
result = list(fn(np.arange(10, dtype=np.int64)))
fake = [name for name, mod in sys.modules.items() if name not in before and getattr(mod, "__spec__", None) is None
        and name.split(".")[0] in ("scipy", "numba", "llvmlite")]
print(json.dumps({{"result": result, "fake_modules": fake,
                   "hits": sum(fn.stats.cache_hits.values()), "misses": sum(fn.stats.cache_misses.values())}}))
"""


def _run(where: Path, cache: Path) -> dict[str, object]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN.format(where=str(where)))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_miss_compiles_then_hit_loads_from_numbas_cache(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(_MODULE)
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first["result"] == [90, 7]
    assert first["misses"] == 1 and first["hits"] == 0
    assert first["fake_modules"] == []

    second = _run(tmp_path, cache)
    assert second["result"] == [90, 7]  # an array made inside the kernel: the runtime is up
    assert second["hits"] == 1 and second["misses"] == 0
    assert second["fake_modules"] == []
