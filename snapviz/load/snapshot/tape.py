"""The tape of a pickle: :func:`run_tape` runs :mod:`snapviz.load.snapshot.pickle_vm`'s machine over
a file's bytes into arrays sized from the file's length and gives back a :class:`Tape`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from snapviz.compiled import kernel
from snapviz.load.snapshot.pickle_vm import FULL, OK, vm_py


@dataclass
class Tape:
    """The file's values as arrays (see the module doc). ``c_first[c]`` is container ``c``'s
    first batch (-1: none), ``b_next`` chains its batches in file order; a batch's rows are
    ``b_start[b]`` to ``b_start[b] + b_len[b]`` (dict batches: key row, value row, ...)."""

    root_kind: int
    root: int
    r_kind: np.ndarray
    r_pay: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    b_next: np.ndarray
    c_type: np.ndarray
    c_first: np.ndarray
    s_off: np.ndarray
    s_len: np.ndarray
    s_ascii: np.ndarray
    s_key: np.ndarray
    ints: np.ndarray
    sbuf: np.ndarray

    def raw(self, s: int) -> bytes:
        o = int(self.s_off[s])
        return bytes(self.sbuf[o : o + int(self.s_len[s])])

    def text(self, s: int) -> str:
        """String ``s`` as the unpickler decodes it (UnicodeDecodeError where it would fail)."""
        return self.raw(s).decode("utf-8", "surrogatepass")

    def batches(self, c: int) -> list[tuple[int, int]]:
        """(first row, rows) of each batch of container ``c``, in file order."""
        out = []
        b = int(self.c_first[c])
        while b >= 0:
            out.append((int(self.b_start[b]), int(self.b_len[b])))
            b = int(self.b_next[b])
        return out


def available() -> bool:
    """Whether numba is there to run the machine."""
    return KERNEL.compiled() is not None


_MARK_DEPTH = 4096
# name, dtype, the count that sizes it exactly (see vm_py; -1: marks, _MARK_DEPTH) and a
# first guess per byte of pickle: about twice what torch's snapshots hold (rows 0.27 per
# byte; containers, batches, memo slots 0.013; ints 0.035; strings fewer), so one run
# mostly suffices. Only the pages written count against memory, not the length.
_ARRAYS = (
    ("st_k", np.int8, 0, 0.0),
    ("st_p", np.int32, 0, 0.0),
    ("marks", np.int64, -1, 0.0),
    ("memo_k", np.int8, 2, 1 / 16),
    ("memo_p", np.int32, 2, 1 / 16),
    ("r_k", np.int8, 3, 1 / 2),
    ("r_p", np.int32, 3, 1 / 2),
    ("b_s", np.int32, 4, 1 / 16),
    ("b_n", np.int32, 4, 1 / 16),
    ("b_next", np.int32, 4, 1 / 16),
    ("c_t", np.int8, 5, 1 / 16),
    ("c_first", np.int32, 5, 1 / 16),
    ("c_last", np.int32, 5, 1 / 16),
    ("s_off", np.int64, 6, 1 / 16),
    ("s_len", np.int64, 6, 1 / 16),
    ("s_ascii", np.uint8, 6, 1 / 16),
    ("s_key", np.uint8, 6, 1 / 16),
    ("ints", np.int64, 7, 1 / 8),
    ("sbuf", np.uint8, 8, 1.0),
)
_STACK = 1 << 16


def run_tape(data: bytes, start: int) -> Tape | None:
    """The tape of ``data`` (opcodes from ``start``), or None where the machine cannot run it
    (an opcode outside plain data, a malformed stream) or numba is missing.

    The arrays are sized by a guess from the file's length; where one is too short the
    machine stops (FULL), a dry run counts what each array must hold (the stack's and the
    marks' greatest depth, memo slots, rows, batches, containers, strings, ints, string
    bytes) and the run is repeated with exactly that. Arrays grown inside the loop made it
    four times slower (numba then reloads and counts references to them on every opcode)."""
    if not available():
        return None
    try:
        return _tape_compiled(np.frombuffer(data, np.uint8), start)
    except MemoryError:  # arrays the machine cannot get: the unpickler's way, which says so if it fails too
        return None


def _run(kernel: Callable[..., Any], buf: np.ndarray, start: int) -> Tape | None:
    n = len(buf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arrays = [
            np.empty(_MARK_DEPTH if w < 0 else (_STACK if w == 0 else int(n * per) + 1024), dt)
            for _, dt, w, per in _ARRAYS
        ]
        status, root_kind, root, counts = kernel(buf, start, False, *arrays)
        if status == FULL:
            arrays = [np.empty(_MARK_DEPTH if w < 0 else 1, dt) for _, dt, w, _ in _ARRAYS]
            status, _, _, counts = kernel(buf, start, True, *arrays)
            if status != OK:
                return None
            arrays = [np.empty(max(int(counts[w]), 1) if w >= 0 else _MARK_DEPTH, dt) for _, dt, w, _ in _ARRAYS]
            status, root_kind, root, counts = kernel(buf, start, False, *arrays)
    if status != OK:
        return None
    a = dict(zip([name for name, _, _, _ in _ARRAYS], arrays, strict=True))
    nr, nb, nc, ns, ni, nsb = (int(counts[k]) for k in (3, 4, 5, 6, 7, 8))
    return Tape(
        int(root_kind),
        int(root),
        a["r_k"][:nr],
        a["r_p"][:nr],
        a["b_s"][:nb],
        a["b_n"][:nb],
        a["b_next"][:nb],
        a["c_t"][:nc],
        a["c_first"][:nc],
        a["s_off"][:ns],
        a["s_len"][:ns],
        a["s_ascii"][:ns],
        a["s_key"][:ns],
        a["ints"][:ni],
        a["sbuf"][:nsb],
    )


def _tape_compiled(buf: np.ndarray, start: int) -> Tape | None:
    """The machine compiled (the ``pickle_tape`` kernel)."""
    compiled = KERNEL.compiled()
    if compiled is None:
        raise RuntimeError("numba is not installed (pip install numba)")
    return _run(compiled, buf, start)


def _tape_python(buf: np.ndarray, start: int) -> Tape | None:
    """The machine's own code run by Python (slow): the reference the compiled machine equals."""
    return _run(vm_py, buf, start)


# Used from ``pickle_tape`` bytes on (snapviz.compiled.MIN_SIZE; snapviz.load.snapshot.reader decides).
KERNEL = kernel(vm_py, reference=_tape_python, compiled_path=_tape_compiled, min_size="pickle_tape")
