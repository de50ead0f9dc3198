"""Kernels compiled with numba, an optional dependency (the ``fast`` extra).

numba is imported only when a kernel is first wanted: with its first kernel it costs about
1.0-1.5 s of CPU and ~130 MiB, which only long inputs win back, so callers ask for a kernel
only above a size threshold and keep a pure-Python reference that tests compare against.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any


@functools.cache
def _numba() -> Any:
    """numba, its CPU target made ready once (None without numba).

    Making the target ready imports numba's implementations, and one of them checks that
    a BLAS exists for ``np.dot`` by importing ``scipy.linalg`` when scipy is installed: about
    0.3-0.4 s of CPU (scipy's array-API and f2py modules) that no kernel of ours uses. While
    the target loads, that one module is a placeholder when scipy is installed, which gives
    the check the answer it would get anyway (scipy present: BLAS available), and it is
    removed right after, so any later import gets the real module."""
    try:
        import numba  # noqa: PLC0415 - optional and slow to import
    except ImportError:
        return None
    blas = "scipy.linalg.cython_blas"
    placeholder = blas not in sys.modules and importlib.util.find_spec("scipy") is not None
    if placeholder:
        sys.modules[blas] = types.ModuleType(blas)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            numba.core.registry.cpu_target.target_context.refresh()
            numba.core.registry.cpu_target.typing_context.refresh()
    finally:
        if placeholder:
            sys.modules.pop(blas, None)
    return numba


def njit_cached(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by numba (None without numba): compiled once per machine and loaded
    from numba's cache after that, or compiled in every process where no cache is writable."""
    numba = _numba()
    if numba is None:
        return None
    with warnings.catch_warnings():  # numba's own warnings are no business of the user's
        warnings.simplefilter("ignore")
        try:
            return numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # no writable cache location
            return numba.njit(nogil=True)(fn)
