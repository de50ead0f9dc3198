"""snapviz.compiled: kernels load from numba's cache without readying numba's whole target,
and compile as usual where the cache misses. Each case runs in a fresh interpreter, since
what is being checked is what a process imports."""

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
from numba.core import base
sys.path.insert(0, {where!r})
from snapviz.compiled import njit_cached
if {broken!r}:  # the shortcut's first try fails (internals that differ); numba's own load works
    from numba.core import caching
    _load, calls = caching.Cache._load_overload, []
    def broken(self, sig, target_context):
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("changed")
        return _load(self, sig, target_context)
    caching.Cache._load_overload = broken
refreshes = []
_refresh = base.BaseContext.refresh
def counted(self):
    refreshes.append(1)
    return _refresh(self)
base.BaseContext.refresh = counted
import kern
fn = njit_cached(kern.total)
print(json.dumps({{"result": list(fn(np.arange(10, dtype=np.int64))),
                   "refreshes": len(refreshes),
                   "scipy_linalg": "scipy.linalg" in sys.modules,
                   "hits": sum(fn.stats.cache_hits.values()), "misses": sum(fn.stats.cache_misses.values())}}))
"""


def _run(where: Path, cache: Path, broken: bool = False) -> dict[str, object]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN.format(where=str(where), broken=broken))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_miss_compiles_then_hit_loads_without_the_registries(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(_MODULE)
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first["result"] == [90, 7]
    assert first["misses"] == 1 and first["hits"] == 0
    assert first["refreshes"] > 0  # compiling readied the whole target
    assert not first["scipy_linalg"]  # ... with the BLAS check answered by the placeholder

    second = _run(tmp_path, cache)
    assert second["result"] == [90, 7]  # an array made inside the kernel: the runtime is up
    assert second["hits"] == 1 and second["misses"] == 0
    assert second["refreshes"] == 0
    assert not second["scipy_linalg"]  # the load imports numpy functions' module, which checks for a BLAS


def test_a_numba_whose_cache_internals_differ_loads_its_own_way(tmp_path: Path) -> None:
    (tmp_path / "kern.py").write_text(_MODULE)
    cache = tmp_path / "cache"
    assert _run(tmp_path, cache)["misses"] == 1
    got = _run(tmp_path, cache, broken=True)
    assert got["result"] == [90, 7]
    assert got["refreshes"] > 0  # numba's own load, which readies the target first
