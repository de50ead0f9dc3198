"""The field readers of the compiled trace decode (:mod:`snapviz.load.trace.trace_kernel`): ids,
times, interned string spans, keys, the ``args`` object, and the test that tells an item cut
by the end of a read from one that is whole. Compiled inside the decode kernel (inline).

This module imports numba at import time: import it only when a kernel is wanted.
"""

from __future__ import annotations

import math

import numpy as np

from snapviz.load.trace.json_kernel import eq, inline, number, scalar_end, string_end, value_end, ws

_POW10 = np.array([10.0**k for k in range(23)])  # exact doubles
_K_DIMS = np.frombuffer(b"Input Dims", np.uint8)
_K_TYPES = np.frombuffer(b"Input type", np.uint8)
_K_DTYPE = np.frombuffer(b"Device Type", np.uint8)
_K_DID = np.frombuffer(b"Device Id", np.uint8)
_K_BYTES = np.frombuffer(b"Bytes", np.uint8)
_K_ADDR = np.frombuffer(b"Addr", np.uint8)
_K_ALLOC = np.frombuffer(b"Total Allocated", np.uint8)
_K_RES = np.frombuffer(b"Total Reserved", np.uint8)


@inline
def small_int(b: np.ndarray, i: int, n: int) -> tuple[int, int, bool]:
    """(end, value, present) of an id: an integer literal of up to 18 digits (so never
    -2**63, which ``to_int`` refuses), or null (not present). End -1 for anything else."""
    if b[i] == 110:
        return scalar_end(b, i, n), 0, False
    end, is_int, neg, m, _ = number(b, i, n)
    if end < 0 or not is_int or m < 0:
        return -1, 0, False
    return end, -m if neg else m, True


_POW10_INT = np.array([10**k for k in range(20)], np.uint64)
_LOW32 = np.uint64(0xFFFFFFFF)
_U0, _U1, _U32, _U64 = np.uint64(0), np.uint64(1), np.uint64(32), np.uint64(64)
_HIDDEN = np.uint64(1 << 52)  # the lowest 53-bit mantissa (a power of two)


@inline
def _mul128(a: np.uint64, b: np.uint64) -> tuple[np.uint64, np.uint64]:
    """(high, low) 64-bit words of the 128-bit product ``a * b``."""
    a0, a1, b0, b1 = a & _LOW32, a >> _U32, b & _LOW32, b >> _U32
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> _U32) + (p01 & _LOW32) + (p10 & _LOW32)
    return a1 * b1 + (p01 >> _U32) + (p10 >> _U32) + (mid >> _U32), (p00 & _LOW32) | (mid << _U32)


@inline
def _above(m: np.uint64, s: int, h: np.uint64, p: np.uint64) -> int:
    """Sign of ``m * 2**s - h * p`` (``0 <= s <= 65``, ``m < 2**63``: both sides fit 128 bits)."""
    if s >= 64:
        lhi, llo = m << np.uint64(s - 64), _U0
    elif s == 0:
        lhi, llo = _U0, m
    else:
        lhi, llo = m >> np.uint64(64 - s), m << np.uint64(s)
    rhi, rlo = _mul128(h, p)
    if lhi != rhi:
        return 1 if lhi > rhi else -1
    if llo != rlo:
        return 1 if llo > rlo else -1
    return 0


@inline
def quotient(m: int, k: int) -> float:
    """``m / 10**k`` correctly rounded (half to even), as ``float()`` of its text, for
    ``0 < m < 2**63`` and ``1 <= k <= 19``; -1.0 where the result is too small or too large
    for the 128-bit test. The quotient of the two doubles is within an ulp or two of it;
    the true value is then compared with the midpoints to the neighbouring doubles in exact
    integer arithmetic, and the candidate moved until it lies between them."""
    mu = np.uint64(m)
    p = _POW10_INT[k]
    r = float(m) / _POW10[k]
    for _ in range(4):
        frac, ex = math.frexp(r)
        big_m = np.uint64(frac * 9007199254740992.0)  # r = big_m * 2**e exactly, 2**52 <= big_m < 2**53
        e = ex - 53
        s = 1 - e  # m / p vs the midpoint (2 big_m + 1) * 2**(e - 1): m * 2**s vs (2 big_m + 1) * p
        if s < 0 or s > 64:
            return -1.0
        odd = (big_m & _U1) == _U1
        c = _above(mu, s, big_m + big_m + _U1, p)
        if c > 0 or (c == 0 and odd):
            r = math.ldexp(float(big_m + _U1), e)
            continue
        if big_m == _HIDDEN:  # the double below has half the spacing
            c = _above(mu, s + 1, big_m * np.uint64(4) - _U1, p)
            below = math.ldexp(9007199254740991.0, e - 1)
        else:
            c = _above(mu, s, big_m + big_m - _U1, p)
            below = math.ldexp(float(big_m - _U1), e)
        if c < 0 or (c == 0 and odd):
            r = below
            continue
        return r
    return -1.0


@inline
def read_time(
    b: np.ndarray, i: int, n: int, hard: np.ndarray, text: np.ndarray, nh: int, nt: int, row: int, field: int
) -> tuple[int, float, int, int]:
    """(end, value, hard numbers, their text's length) of a ``ts``/``dur`` number (end -1:
    not one the kernel reads, -3: ``hard`` or ``text`` is full). Values are read exactly
    (Clinger's fast path, else :func:`quotient`); the rest (over 18 digits, beyond 1e19 or
    below 1e-19) is left to Python: its row and field go to ``hard`` and its text,
    comma-separated, to ``text``."""
    if b[i] != 45 and not (48 <= b[i] <= 57):
        return -1, 0.0, nh, nt
    end, is_int, neg, m, exp = number(b, i, n)
    if end < 0 or (is_int and neg and m == 0):  # the integer -0 reads 0 in some parsers, -0.0 in others
        return -1, 0.0, nh, nt
    if 0 <= m <= 9007199254740992 and -22 <= exp <= 22:  # exact operands: one correctly rounded operation
        v = float(m) * _POW10[exp] if exp >= 0 else float(m) / _POW10[-exp]
        return end, -v if neg else v, nh, nt
    if m > 0 and exp == 0:  # an integer below 2**63: one correctly rounded conversion
        v = float(m)
        return end, -v if neg else v, nh, nt
    if m > 0 and -19 <= exp < 0:  # up to 18 digits with decimals: most profiler times, made exact below
        v = quotient(m, -exp)
        if v >= 0:
            return end, -v if neg else v, nh, nt
    if nh >= hard.shape[1] or nt + end - i >= len(text):
        return -3, 0.0, nh, nt
    hard[0, nh] = row
    hard[1, nh] = field
    for k in range(i, end):
        text[nt] = b[k]
        nt += 1
    text[nt] = 44
    return end, 0.0, nh + 1, nt + 1


@inline
def intern(b: np.ndarray, s: int, e: int, esc: int, reps: np.ndarray, nr: int, table: np.ndarray) -> tuple[int, int]:
    """(id, distinct spans so far) of the byte span ``b[s:e]`` among this batch's distinct
    spans (id -1: ``reps`` is full): open addressing on an FNV-1a hash, equality by the bytes (no collision can merge two)."""
    h = np.uint64(14695981039346656037)
    for k in range(s, e):
        h = (h ^ np.uint64(b[k])) * np.uint64(1099511628211)
    mask = len(table) - 1
    slot = np.int64(h & np.uint64(mask))
    while True:
        r = table[slot] - 1
        if r < 0:
            if nr == reps.shape[1]:
                return -1, nr  # full
            reps[0, nr] = s
            reps[1, nr] = e
            reps[2, nr] = esc
            reps[3, nr] = slot
            table[slot] = nr + 1
            return nr, nr + 1
        rs = reps[0, r]
        if reps[1, r] - rs == e - s:
            same = True
            for k in range(e - s):
                if b[rs + k] != b[s + k]:
                    same = False
                    break
            if same:
                return r, nr
        slot = (slot + 1) & mask


@inline
def member_key(b: np.ndarray, i: int, n: int) -> tuple[int, int, int]:
    """(key start, key end, start of its value) of the member at ``i``; -1 if it is not a
    plain key: one with an escape might spell a key we read, so it is not guessed at."""
    if i >= n or b[i] != 34:
        return -1, -1, -1
    end, esc = string_end(b, i, n)
    if end < 0 or esc:
        return -1, -1, -1
    j = ws(b, end, n)
    if j >= n or b[j] != 58:
        return -1, -1, -1
    j = ws(b, j + 1, n)
    if j >= n:
        return -1, -1, -1
    return i + 1, end - 1, j


@inline
def next_member(b: np.ndarray, i: int, n: int) -> tuple[int, bool]:
    """(position after the comma or the closing brace, whether the object goes on); -1: neither."""
    i = ws(b, i, n)
    if i < n and b[i] == 44:
        return ws(b, i + 1, n), True
    if i < n and b[i] == 125:
        return i + 1, False
    return -1, False


@inline
def read_args(
    b: np.ndarray, i: int, n: int, stack: np.ndarray, opens: np.ndarray, base: int
) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]:
    """The ``args`` object at ``i`` (just after its brace): (end, odd, Input Dims span,
    Input type span, Device Type, Device Id, Bytes, Addr, Total Allocated, Total Reserved,
    has totals). End -1: give the batch back. odd: a memory field is not an integer or null."""
    odd = 0
    dims_s = dims_e = types_s = types_e = -1
    dtype, did, nbytes, addr, alloc, res, has_totals = 0, -1, 0, 0, 0, 0, 0
    seen = 0
    i = ws(b, i, n)
    more = True
    if i < n and b[i] == 125:
        i, more = i + 1, False
    while more:
        ks, ke, i = member_key(b, i, n)
        if i < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        key = 0
        klen = ke - ks
        if klen == 10:
            key = 1 if eq(b, ks, ke, _K_DIMS) else (2 if eq(b, ks, ke, _K_TYPES) else 0)
        elif klen == 11 and eq(b, ks, ke, _K_DTYPE):
            key = 3
        elif klen == 9 and eq(b, ks, ke, _K_DID):
            key = 4
        elif klen == 5 and eq(b, ks, ke, _K_BYTES):
            key = 5
        elif klen == 4 and eq(b, ks, ke, _K_ADDR):
            key = 6
        elif klen == 15 and eq(b, ks, ke, _K_ALLOC):
            key = 7
        elif klen == 14 and eq(b, ks, ke, _K_RES):
            key = 8
        if key:
            if seen & (1 << key):  # a duplicated key: the last one wins in some parsers only
                return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            seen |= 1 << key
        s = i
        if key == 1 or key == 2:
            i = value_end(b, i, n, stack, opens, base)
            if i >= 0 and b[s] != 110:  # null: not recorded, as when absent
                if key == 1:
                    dims_s, dims_e = s, i
                else:
                    types_s, types_e = s, i
        elif key:
            i, v, present = small_int(b, i, n)
            if i < 0:
                odd = 1
                i = value_end(b, s, n, stack, opens, base)
            elif key == 3:
                dtype = v if present else 0
            elif key == 4:
                did = v if present else -1
            elif key == 5:
                nbytes = v if present else 0
            elif key == 6:
                addr = v if present else 0
            elif key == 7:
                alloc = v if present else 0
                has_totals = 1 if present else 0
            else:
                res = v if present else 0
        else:
            i = value_end(b, i, n, stack, opens, base)
        if i < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        i, more = next_member(b, i, n)
        if i < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
    return i, odd, dims_s, dims_e, types_s, types_e, dtype, did, nbytes, addr, alloc, res, has_totals


@inline
def truncated(b: np.ndarray, s: int, n: int) -> bool:
    """Whether no container item ends in ``b`` from ``s`` on, brackets counted as the stream
    guard counts them (any closing bracket outside strings; a backslash and the byte after it
    never structural): then the plain reading would not parse the item at ``s`` in this read
    either, and it is left for the next. Otherwise the item at ``s`` is whole, and if the
    decode could not read it, the read goes the plain way."""
    depth = 0
    in_string = False
    i = s
    while i < n:
        c = b[i]
        if c == 92:
            i += 2
            continue
        if c == 34:
            in_string = not in_string
        elif not in_string:
            if c == 91 or c == 123:
                depth += 1
            elif c == 93 or c == 125:
                if depth <= 1:
                    return False
                depth -= 1
        i += 1
    return True
