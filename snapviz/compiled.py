"""Kernels compiled with numba, an optional dependency (the ``fast`` extra).

numba is imported only when a kernel is first wanted: with its first kernel it costs about
1.0-1.5 s of CPU and ~130 MiB, which only long inputs win back, so callers ask for a kernel
only above a size threshold and keep a pure-Python reference that tests compare against.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def njit_cached(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by numba (None without numba): compiled once per machine and loaded
    from numba's cache after that, or compiled in every process where no cache is writable."""
    try:
        import numba  # noqa: PLC0415 - optional and slow to import
    except ImportError:
        return None
    with warnings.catch_warnings():  # numba's own warnings are no business of the user's
        warnings.simplefilter("ignore")
        try:
            return numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # no writable cache location
            return numba.njit(nogil=True)(fn)
