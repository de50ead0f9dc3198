"""Kernels compiled with numba, an optional dependency (the ``fast`` extra).

numba is imported only when a kernel is first wanted: with its first kernel loaded from the
cache it costs about 0.45-0.5 s of CPU and ~100 MiB, which only long inputs win back, so callers ask for a kernel
only above a size threshold and keep a pure-Python reference that tests compare against.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


@functools.cache
def _numba() -> Any:
    """numba, imported (None without numba)."""
    try:
        import numba  # noqa: PLC0415 - optional and slow to import
    except ImportError:
        return None
    return numba


@contextlib.contextmanager
def _blas_placeholder() -> Iterator[None]:
    """While numba imports its implementations (to compile, or to load a cached kernel whose
    globals live in them, e.g. ``numba.np.arraymath``), one of them checks that a BLAS exists
    for ``np.dot`` by importing ``scipy.linalg`` when scipy is installed: about 0.4-0.6 s of
    CPU (scipy's array-API and f2py modules) that no kernel of ours uses. Meanwhile that one
    module is a placeholder when scipy is installed, which gives the check the answer it
    would get anyway (scipy present: BLAS available); it is removed right after, so any
    later import gets the real module."""
    blas = "scipy.linalg.cython_blas"
    placeholder = blas not in sys.modules and importlib.util.find_spec("scipy") is not None
    if placeholder:
        sys.modules[blas] = types.ModuleType(blas)
    try:
        yield
    finally:
        if placeholder:
            sys.modules.pop(blas, None)


@functools.cache
def _target_ready() -> None:
    """Make numba's CPU target ready, once, as numba does before it compiles: it imports and
    registers every typing and lowering implementation numba has."""
    numba = _numba()
    with _blas_placeholder(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        numba.core.registry.cpu_target.target_context.refresh()
        numba.core.registry.cpu_target.typing_context.refresh()


def _load_cached(cache: Any, sig: Any, target_context: Any) -> Any:
    """numba's ``Cache.load_overload`` without its first step, a refresh of the whole target.

    That refresh (:func:`_target_ready`, 0.35-0.4 s of CPU, ~90 modules) only compiling
    needs: a cached kernel is machine code already, and loading it needs the runtime (NRT,
    for arrays made inside a kernel), which is started here as the refresh would start it.
    On a miss (no cache, or a stale one) the target is made ready and numba compiles; where
    this shortcut fails (a numba whose internals differ), numba's own load runs instead."""
    try:
        from numba.core.runtime import rtsys  # noqa: PLC0415 - numba is optional

        rtsys.initialize(target_context)
        with _blas_placeholder(), cache._guard_against_spurious_io_errors():
            cres = cache._load_overload(sig, target_context)
    except Exception:  # noqa: BLE001 - a numba whose internals differ: its own way, below
        _target_ready()
        return type(cache).load_overload(cache, sig, target_context)
    if cres is None:
        _target_ready()
    return cres


def njit_cached(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by numba (None without numba): compiled once per machine and loaded
    from numba's cache after that, or compiled in every process where no cache is writable."""
    numba = _numba()
    if numba is None:
        return None
    with warnings.catch_warnings():  # numba's own warnings are no business of the user's
        warnings.simplefilter("ignore")
        try:
            kernel = numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # no writable cache location
            _target_ready()
            return numba.njit(nogil=True)(fn)
    cache: Any = getattr(kernel, "_cache", None)
    if cache is not None and all(hasattr(cache, a) for a in ("_load_overload", "_guard_against_spurious_io_errors")):
        cache.load_overload = functools.partial(_load_cached, cache)
    else:  # a numba whose cache is shaped otherwise loads its own way, placeholder first
        _target_ready()
    return kernel


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``. numba types read-only and writable arrays apart, so a kernel
    given a pandas column (read-only: pandas copies on write) and, another time, a fresh array
    would be compiled twice; kernels that only read an input take it this way every time."""
    view = a.view()
    view.flags.writeable = False
    return view
