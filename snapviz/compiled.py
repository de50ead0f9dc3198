"""The compiled kernels: one registry of every loop snapviz compiles with numba.

Each kernel is registered with :func:`kernel`: its Python source (what numba compiles), its
pure reference (the path that runs without numba, with the same contract as the compiled
path), the compiled path itself, the size from which the compiled path is taken and the test
of equality between the two paths' results. tests/unit/test_kernels.py runs every registered
kernel against its reference.

numba is a dependency where it ships wheels (CPython on x86-64 and ARM64) and is imported
only when a kernel is first wanted: its import and a kernel's load from numba's cache cost
about a second of CPU (docs/benchmarks.md), which only long inputs win back. Hence the size
thresholds, all in :data:`MIN_SIZE`, overridable per kernel by ``SNAPVIZ_KERNEL_MIN_SIZE``
(``replay=0,decimate=1000``; ``*=`` sets every kernel; ``never`` keeps a kernel off).
Without numba, or below its threshold, a kernel's reference runs, with the same results.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from snapviz.errors import InputError

ENV = "SNAPVIZ_KERNEL_MIN_SIZE"
NEVER = math.inf

# From this size on (in each kernel's unit) the compiled path runs where numba is installed.
# The reasons for each figure, with its measurements, are in docs/benchmarks.md ("Kernel
# thresholds").
MIN_SIZE: dict[str, float] = {
    "replay": 200_000,  # events of the allocator replay (analyses/replay_loop.py)
    "simulate": 100_000,  # requests of the allocator simulator (analyses/simulate_loop.py)
    "decimate": 200_000,  # rows of a timeline decimated for drawing (analyses/decimate.py)
    "pickle_scan": 24 << 20,  # bytes of pickle checked for safety (load/snapshot/pickle_scan_fast.py)
    "pickle_tape": 24 << 20,  # bytes of pickle read straight into columns (load/snapshot/tape.py, tape_read.py)
}

# The modules that register kernels (imported by :func:`registered`, for tests and docs).
MODULES = (
    "snapviz.analyses.replay_loop",
    "snapviz.analyses.simulate_loop",
    "snapviz.analyses.decimate",
    "snapviz.load.snapshot.pickle_scan_fast",
    "snapviz.load.snapshot.tape",
    "snapviz.load.snapshot.tape_read",
)


@functools.cache
def _overrides(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or (name != "*" and name not in MIN_SIZE):
            raise InputError(f"{ENV}: {item!r} is not NAME=SIZE with NAME one of {', '.join(sorted(MIN_SIZE))} or *")
        if value.lower() == "never":
            out[name] = NEVER
        elif value.isdigit():
            out[name] = int(value)
        else:
            raise InputError(f"{ENV}: {item!r}: the size is a whole number or 'never'")
    return out


def min_size(name: str) -> float:
    """The size from which kernel ``name`` runs compiled: :data:`MIN_SIZE`, or the environment's."""
    over = _overrides(os.environ.get(ENV, ""))
    return over.get(name, over.get("*", MIN_SIZE[name]))


@functools.cache
def _numba() -> Any:
    """numba, imported (None without numba)."""
    try:
        import numba  # noqa: PLC0415 - slow to import: only when a kernel is wanted
    except ImportError:
        return None
    return numba


def njit_cached(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by numba (None without numba): compiled once per machine and loaded from
    numba's cache after that, or compiled in every process where no cache is writable."""
    numba = _numba()
    if numba is None:
        return None
    with warnings.catch_warnings():  # numba's own warnings are no business of the user's
        warnings.simplefilter("ignore")
        try:
            return numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError:  # no writable cache location
            return numba.njit(nogil=True)(fn)


def same(a: Any, b: Any) -> bool:
    """Equal to the byte: arrays element by element (NaN equal to NaN) and of one dtype kind,
    containers and dataclasses field by field; the default equality test of a kernel."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or (a.dtype.kind in "fc") != (b.dtype.kind in "fc"):
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@dataclasses.dataclass(eq=False)
class Kernel:
    """One compiled loop: see the module's docstring and :func:`kernel`."""

    name: str
    row: str  # its row of MIN_SIZE
    source: Callable[..., Any]
    reference: Callable[..., Any]
    compiled_path: Callable[..., Any]
    equal: Callable[[Any, Any], bool] = same
    helpers: tuple[str, ...] = ()

    def compiled(self) -> Callable[..., Any] | None:
        """The source compiled by numba, once per process (None without numba). The helpers
        it calls are compiled first and put in place of the Python ones in the source's
        module (numba resolves a kernel's globals when it compiles it); called from Python
        they give the same results."""
        return _compile(self)

    def min_size(self) -> float:
        return min_size(self.row)

    def wanted(self, size: int) -> bool:
        """Whether an input of ``size`` (the kernel's unit) takes the compiled path."""
        return size >= self.min_size() and self.compiled() is not None

    def run(self, size: int, *args: Any, **kwargs: Any) -> Any:
        """The compiled path where :meth:`wanted` for ``size``, else the reference."""
        path = self.compiled_path if self.wanted(size) else self.reference
        return path(*args, **kwargs)


@functools.cache
def _compile(k: Kernel) -> Callable[..., Any] | None:
    if _numba() is None:
        return None
    module = k.source.__globals__
    for name in k.helpers:
        if not hasattr(module[name], "py_func"):
            module[name] = njit_cached(module[name])
    return njit_cached(k.source)


REGISTRY: dict[str, Kernel] = {}


def kernel(
    source: Callable[..., Any],
    *,
    reference: Callable[..., Any],
    compiled_path: Callable[..., Any],
    min_size: str,
    name: str | None = None,
    equal: Callable[[Any, Any], bool] = same,
    helpers: tuple[str, ...] = (),
) -> Kernel:
    """Register ``source`` as a kernel, compiled from its row ``min_size`` of :data:`MIN_SIZE`
    on (named so unless ``name`` says otherwise): ``compiled_path`` runs it compiled,
    ``reference`` is the pure path with the same arguments and results (by ``equal``);
    ``helpers`` names functions of the source's module that it calls, compiled with it."""
    if min_size not in MIN_SIZE:
        raise KeyError(f"no threshold for kernel {min_size!r} in snapviz.compiled.MIN_SIZE")
    name = name or min_size
    if name in REGISTRY:
        raise KeyError(f"kernel {name!r} registered twice")
    k = Kernel(name, min_size, source, reference, compiled_path, equal, helpers)
    REGISTRY[name] = k
    return k


def registered() -> dict[str, Kernel]:
    """Every kernel, its module imported."""
    import importlib  # noqa: PLC0415

    for module in MODULES:
        importlib.import_module(module)
    return dict(REGISTRY)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``. numba types read-only and writable arrays apart, so a kernel
    given a pandas column (read-only: pandas copies on write) and, another time, a fresh array
    would be compiled twice; kernels that only read an input take it this way every time."""
    view = a.view()
    view.flags.writeable = False
    return view
