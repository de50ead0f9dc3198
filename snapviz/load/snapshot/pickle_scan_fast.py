"""The pickle scan's fast path: a grammar check for big pickles, in Python and compiled.

The exact scan (:mod:`snapviz.load.snapshot.pickle_scan`) costs about 1 µs per opcode in Python, ten
times the unpickler. Big pickles (over FULL_SCAN_BYTES) first try a grammar check instead:
the opcodes ``pickle.dump`` writes for plain data with protocol 4/5 (memo by MEMOIZE only,
strings under 256 bytes inline). On that grammar the unpickler cannot be hurt: no sets, no
memo indices to inflate, and every tuple is checked to hold only fresh scalars, so no hash
ever recurses. Anything outside the grammar falls back to the exact scan. Depth and
reference expansion are not counted on this path: they cannot harm the unpickler, and the
snapshot reader never walks the structure beyond its schema.

Two implementations of one contract: :func:`fast_scan`, a regex (C) over runs of grammar
tokens and the reference, and :func:`fast_scan_compiled`, a numba kernel (the ``fast``
extra) that walks the same tokens over the bytes one by one, about twenty times faster.
Their verdicts and messages are equal on every bundled and external pickle, every hostile
input and randomized damage of a real one (tests/unit/test_pickle_scan_compiled.py). One
difference by design: the reference leaves a pickle longer than the object limit (in bytes)
to the exact scan, since it cannot count; the kernel counts the objects made as the exact scan
does, so a 10M-event snapshot (1.4 GB) stays on the fast path.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from snapviz.compiled import kernel
from snapviz.load.limits import LimitExceeded, Limits

FULL_SCAN_BYTES = 1 << 20
_A = rb"[\s\S]"


def _counted(op: bytes) -> bytes:
    return op + b"(?:" + b"|".join(re.escape(bytes([k])) + (_A + b"{%d}" % k if k else b"") for k in range(256)) + b")"


_HOT = (
    rb"(?:h"
    + _A
    + rb"|j"
    + _A
    + rb"{4}|\x94|[(ue}\]saN\x88\x89]|K"
    + _A
    + rb"|M"
    + _A
    + rb"{2}|J"
    + _A
    + rb"{4}|G"
    + _A
    + rb"{8}|\x95"
    + _A
    + rb"{8}|"
    + _counted(rb"\x8c")
    + b"|"
    + _counted(rb"\x8a")
    + b")"
)
_RUN_TOKENS = 256  # tokens per regex run; a tuple's items are looked for in the last two runs
_RUN = re.compile(_HOT + rb"{0,%d}" % _RUN_TOKENS)
_SCALAR_OPS = frozenset(b"KMJGN\x88\x89\x8c\x8a")
_TOKEN_LEN = {ord("h"): 2, ord("j"): 5, 0x94: 1, ord("K"): 2, ord("M"): 3, ord("J"): 5, ord("G"): 9, 0x95: 9}
_SHORT_MAX = 255  # the longest string a counted (inline) token holds
_COUNTED = (0x8C, 0x8A)  # SHORT_BINUNICODE, LONG1: a length byte, then that many bytes
_LONG_STRINGS = {0x58: 4, 0x42: 4, 0x8D: 8, 0x8E: 8}  # BINUNICODE, BINBYTES (+8-byte forms): width of the length


def _tokens(data: bytes, start: int, end: int) -> list[int]:
    """Opcodes of the hot-grammar tokens in ``data[start:end]`` (already matched by _RUN)."""
    ops = []
    i = start
    while i < end:
        op = data[i]
        ops.append(op)
        i += data[i + 1] + 2 if op in _COUNTED else _TOKEN_LEN.get(op, 1)
    return ops


def _start(data: bytes) -> int:
    """Offset of the first opcode after a leading PROTO."""
    return 2 if data[:1] == b"\x80" else 0


def _string_length(data: bytes, i: int) -> int:
    """The length argument of the long-string opcode at ``i`` (read from what is there when truncated)."""
    w = _LONG_STRINGS[data[i]]
    return int.from_bytes(data[i + 1 : i + 1 + w], "little")


def _too_long(path: str, k: int, limits: Limits) -> LimitExceeded:
    return LimitExceeded(path, "string_length", k, limits.string_length, " bytes")


def _may_count_over(data: bytes, limits: Limits) -> bool:
    """True when the object or string-byte counts could exceed their limits, or a string under
    256 bytes the length limit (the grammar takes short strings unchecked): only the exact scan knows."""
    return len(data) > limits.objects or len(data) > limits.string_bytes or limits.string_length < _SHORT_MAX


def fast_scan(data: bytes, path: str, limits: Limits) -> bool:
    """True when ``data`` is in the fast-path grammar (safe to unpickle); False when the
    exact scan must decide. Raises for a string over the length limit. The reference."""
    if _may_count_over(data, limits):
        return False
    n = len(data)
    i = _start(data)
    starts = [i, i]  # the last two run starts: known token boundaries
    while i < n:
        m = _RUN.match(data, i)
        assert m is not None  # {0,256}: it matches the empty string at worst
        j = m.end()
        if j > i:
            starts = [starts[1], i]
            i = j
            continue
        op = data[i]
        if op == 0x2E:  # STOP
            return True
        if op in (0x85, 0x86, 0x87):  # TUPLE1-3: items must be fresh scalars
            items = [t for t in _tokens(data, starts[0], i) if t != 0x94][-(op - 0x84) :]
            if len(items) != op - 0x84 or not all(t in _SCALAR_OPS for t in items):
                return False
            i += 1
        elif op == 0x29:  # EMPTY_TUPLE
            i += 1
        elif op in _LONG_STRINGS:
            k = _string_length(data, i)
            if k > limits.string_length:
                raise _too_long(path, k, limits)
            i += 1 + _LONG_STRINGS[op] + k
        else:
            return False
        starts = [i, i]  # tokens before a handled opcode are not hot-grammar tokens: never re-read them
    return False  # no STOP: the exact scan says where it ends


# --------------------------------------------------------------------------- compiled

_SAFE, _OUTSIDE, _TOO_LONG = 1, 0, 2  # the kernel's verdicts


def _token_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per opcode byte: its token length (0: not a grammar token, -1: counted), and 1 for scalars."""
    length = np.zeros(256, np.int64)
    for op, k in _TOKEN_LEN.items():
        length[op] = k
    for op in b"(ue}]saN\x88\x89":
        length[op] = 1
    for op in _COUNTED:
        length[op] = -1
    scalar = np.zeros(256, np.int64)
    scalar[list(_SCALAR_OPS)] = 1
    return length, scalar


_TOKEN_LENGTH, _IS_SCALAR = _token_tables()
# Opcodes that make an object, as the exact scan counts them (pickle_scan._scan): memo
# puts and gets, marks, frames, fills and the singletons make none.
_MAKES_OBJECT = np.zeros(256, np.int64)
_MAKES_OBJECT[
    list(
        b"\x8c\x8a\x43\x55\x4b\x4a\x4d\x7d\x5d\x47\x58\x42\x8b\x54\x8d\x8e\x96\x85\x86\x87\x29\x74\x64\x6c\x49\x4c\x46\x53\x56"
    )
] = 1


def fast_scan_compiled(data: bytes, path: str, limits: Limits) -> bool:
    """:func:`fast_scan` by the numba kernel: same verdict, same exception."""
    compiled = KERNEL.compiled()
    if compiled is None:
        raise RuntimeError("numba is not installed (pip install numba)")
    if len(data) > limits.string_bytes or limits.string_length < _SHORT_MAX:  # see _may_count_over
        return False
    max_str = min(limits.string_length, np.iinfo(np.int64).max)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict, at, made = compiled(
            np.frombuffer(data, np.uint8), _start(data), max_str, _TOKEN_LENGTH, _IS_SCALAR, _MAKES_OBJECT
        )
    if verdict == _TOO_LONG:
        raise _too_long(path, _string_length(data, at), limits)
    # The kernel counts the objects as the exact scan does, so a pickle longer in bytes than
    # the object limit need not take the exact scan to know: within the grammar the exact
    # scan would stop at the same limit (at its first object over it, the count reported).
    if verdict == _SAFE and made > limits.objects:
        raise LimitExceeded(path, "objects", limits.objects + 1, limits.objects)
    return bool(verdict == _SAFE)


def _kernel_py(
    buf: np.ndarray, start: int, max_str: int, token_length: np.ndarray, is_scalar: np.ndarray, makes: np.ndarray
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """(verdict, offset of the over-long string, objects made) for the opcodes in ``buf`` from ``start``.

    Token by token what :func:`fast_scan`'s regex matches run by run; a tuple looks for its
    items where the reference does: among the tokens of the last two 256-token runs since
    the last opcode outside the grammar (``tok`` counts them)."""
    n = len(buf)
    i = start
    tok = 0
    made = 0  # objects the unpickler would make, counted as the exact scan counts them
    # opcode and token index of the last three tokens other than MEMOIZE (index -1: none)
    op1 = op2 = op3 = 0
    t1 = t2 = t3 = -1
    while i < n:
        op = buf[i]
        k = token_length[op]
        if k != 0:
            if k < 0:  # counted: a length byte, then that many bytes
                k = 2 + buf[i + 1] if i + 1 < n else n
            if k > n - i:
                return _OUTSIDE, 0, made  # an incomplete token: the run ends before it, where no handler applies
            if op != 0x94:
                op3, t3, op2, t2, op1, t1 = op2, t2, op1, t1, op, tok
            tok += 1
            made += makes[op]
            i += k
            continue
        made += makes[op]
        if op == 0x2E:  # STOP
            return _SAFE, 0, made
        if op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1-3: items must be fresh scalars
            last_run = (tok - 1) // _RUN_TOKENS
            window = _RUN_TOKENS * (last_run - 1) if last_run > 1 else 0
            arity = op - 0x84
            first = t1 if arity == 1 else (t2 if arity == 2 else t3)  # token index of the first item (-1: none)
            if first < window or is_scalar[op1] == 0:
                return _OUTSIDE, 0, made
            if (arity >= 2 and is_scalar[op2] == 0) or (arity == 3 and is_scalar[op3] == 0):
                return _OUTSIDE, 0, made
            i += 1
        elif op == 0x29:  # EMPTY_TUPLE
            i += 1
        elif op == 0x58 or op == 0x42 or op == 0x8D or op == 0x8E:  # BINUNICODE, BINBYTES (+8-byte forms)
            w = 4 if op == 0x58 or op == 0x42 else 8
            length = np.uint64(0)
            for b in range(min(w, n - i - 1) - 1, -1, -1):  # little-endian, short when truncated
                length = (length << np.uint64(8)) | np.uint64(buf[i + 1 + b])
            if length > np.uint64(max_str):
                return _TOO_LONG, i, made
            if np.int64(length) >= n - i - 1 - w:
                return _OUTSIDE, 0, made  # it ends at or past the end: no STOP
            i += 1 + w + np.int64(length)
        else:
            return _OUTSIDE, 0, made
        tok = 0  # tokens before a handled opcode are never items of a later tuple
        t1 = t2 = t3 = -1
    return _OUTSIDE, 0, made


# From ``pickle_scan`` bytes on (snapviz.compiled.MIN_SIZE; the reasons in docs/benchmarks.md)
# the compiled check runs where numba is installed.
KERNEL = kernel(_kernel_py, reference=fast_scan, compiled_path=fast_scan_compiled, min_size="pickle_scan")
