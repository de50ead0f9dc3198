"""A batch of ``traceEvents`` decoded by a numba kernel (the ``fast`` extra) straight into
rows of numbers and string ids: no Python object per event.

The kernel walks one JSON array text (:func:`snapviz.load.json_stream.array_item_docs`)
byte by byte, validating the whole grammar (strings as strict UTF-8, numbers, literals,
nesting) and keeping, per kept event, what :meth:`Columns.add` keeps. Strings it keeps
(names, raw ``Input Dims`` / ``Input type`` texts) are interned in the kernel by their raw
bytes: each distinct one is decoded once in Python. A ``ts``/``dur`` whose text is not
exactly representable by the fast path (Clinger: at most 2**53 and a power of ten up to
1e22) is read by Python's ``float`` of its text, correctly rounded as every JSON parser here.

It takes only a strict subset of JSON on which the reference's result is plain: anything
else (a key or ``cat`` with escapes, a surrogate escape, an id that is not a small integer,
a non-number time, ``args`` that is not an object, a duplicated key we read, ...) makes it
give the batch back (``DEFER``) to the typed msgspec decode and, behind that, the reference.
``tests/unit/test_trace_kernel.py`` compares it with the reference on every trace we have,
generated events and damaged texts.

This module imports numba at import time: import it only when a kernel is wanted.
"""

from __future__ import annotations

import numpy as np

from snapviz.load.json_kernel import eq, inline, jit, number, scalar_end, string_end, unescaped_eq, value_end, ws

OK, DEFER, FULL = 0, 1, 2  # FULL: an output array is too small; grow it and decode the batch again
# Row layout of the integer output (``ints[field, row]``) and the float output.
KIND, NAME, TID, PID, DIMS, TYPES, DTYPE, DID, BYTES, ADDR, ALLOC, RES, HAS_TOTALS = range(13)
N_INT_FIELDS = 13
TS, DUR = 0, 1
# Event kinds, in the reference's order of tests.
OP, PYTHON, ANNOTATION, MEMORY = 1, 2, 3, 4


_POW10 = np.array([10.0**k for k in range(23)])  # exact doubles
_K_CAT = np.frombuffer(b"cat", np.uint8)
_K_NAME = np.frombuffer(b"name", np.uint8)
_K_PH = np.frombuffer(b"ph", np.uint8)
_K_TS = np.frombuffer(b"ts", np.uint8)
_K_DUR = np.frombuffer(b"dur", np.uint8)
_K_TID = np.frombuffer(b"tid", np.uint8)
_K_PID = np.frombuffer(b"pid", np.uint8)
_K_ARGS = np.frombuffer(b"args", np.uint8)
_K_DIMS = np.frombuffer(b"Input Dims", np.uint8)
_K_TYPES = np.frombuffer(b"Input type", np.uint8)
_K_DTYPE = np.frombuffer(b"Device Type", np.uint8)
_K_DID = np.frombuffer(b"Device Id", np.uint8)
_K_BYTES = np.frombuffer(b"Bytes", np.uint8)
_K_ADDR = np.frombuffer(b"Addr", np.uint8)
_K_ALLOC = np.frombuffer(b"Total Allocated", np.uint8)
_K_RES = np.frombuffer(b"Total Reserved", np.uint8)
_V_CPU_OP = np.frombuffer(b"cpu_op", np.uint8)
_V_PYTHON = np.frombuffer(b"python_function", np.uint8)
_V_ANNOTATION = np.frombuffer(b"user_annotation", np.uint8)
_V_MEMORY = np.frombuffer(b"[memory]", np.uint8)
_V_X = np.frombuffer(b"X", np.uint8)


@inline
def _small_int(b: np.ndarray, i: int, n: int) -> tuple[int, int, bool]:
    """(end, value, present) of an id: an integer literal of up to 18 digits (so never
    -2**63, which ``to_int`` refuses), or null (not present). End -1 for anything else."""
    if b[i] == 110:
        return scalar_end(b, i, n), 0, False
    end, is_int, neg, m, _ = number(b, i, n)
    if end < 0 or not is_int or m < 0:
        return -1, 0, False
    return end, -m if neg else m, True


@inline
def _time(
    b: np.ndarray, i: int, n: int, hard: np.ndarray, text: np.ndarray, nh: int, nt: int, row: int, field: int
) -> tuple[int, float, int, int]:
    """(end, value, hard numbers, their text's length) of a ``ts``/``dur`` number (end -1:
    not one the kernel reads, -3: ``hard`` or ``text`` is full). A value the fast path cannot give exactly (Clinger's: a
    mantissa up to 2**53 times an exact power of ten) is left to Python: its row and
    field go to ``hard`` and its text, comma-separated, to ``text``."""
    if b[i] != 45 and not (48 <= b[i] <= 57):
        return -1, 0.0, nh, nt
    end, is_int, neg, m, exp = number(b, i, n)
    if end < 0 or (is_int and neg and m == 0):  # the integer -0 reads 0 in some parsers, -0.0 in others
        return -1, 0.0, nh, nt
    if 0 <= m <= 9007199254740992 and -22 <= exp <= 22:  # exact operands: one correctly rounded operation
        v = float(m) * _POW10[exp] if exp >= 0 else float(m) / _POW10[-exp]
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
def _intern(b: np.ndarray, s: int, e: int, esc: int, reps: np.ndarray, nr: int, table: np.ndarray) -> tuple[int, int]:
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
def _key(b: np.ndarray, i: int, n: int) -> tuple[int, int, int]:
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
def _next_member(b: np.ndarray, i: int, n: int) -> tuple[int, bool]:
    """(position after the comma or the closing brace, whether the object goes on); -1: neither."""
    i = ws(b, i, n)
    if i < n and b[i] == 44:
        return ws(b, i + 1, n), True
    if i < n and b[i] == 125:
        return i + 1, False
    return -1, False


@inline
def _args(
    b: np.ndarray, i: int, n: int, stack: np.ndarray
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
        ks, ke, i = _key(b, i, n)
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
            i = value_end(b, i, n, stack)
            if i >= 0 and b[s] != 110:  # null: not recorded, as when absent
                if key == 1:
                    dims_s, dims_e = s, i
                else:
                    types_s, types_e = s, i
        elif key:
            i, v, present = _small_int(b, i, n)
            if i < 0:
                odd = 1
                i = value_end(b, s, n, stack)
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
            i = value_end(b, i, n, stack)
        if i < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        i, more = _next_member(b, i, n)
        if i < 0:
            return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
    return i, odd, dims_s, dims_e, types_s, types_e, dtype, did, nbytes, addr, alloc, res, has_totals


@jit
def decode_batch(
    b: np.ndarray,
    ints: np.ndarray,
    floats: np.ndarray,
    hard: np.ndarray,
    text: np.ndarray,
    reps: np.ndarray,
    table: np.ndarray,
    stack: np.ndarray,
) -> tuple[int, int, int, int, int, int]:
    """(status, items, rows, hard numbers, their text's length, distinct spans) of one JSON array of events.
    Rows: the kept events, their fields in ``ints``/``floats`` (layout above), string
    fields as ids of distinct spans (``reps``: start, end, escaped, hash slot)."""
    n = len(b)
    items = rows = nh = nt = nr = 0
    i = ws(b, 0, n)
    if i >= n or b[i] != 91:
        return DEFER, 0, 0, 0, 0, 0
    i = ws(b, i + 1, n)
    more = True
    if i < n and b[i] == 93:
        i, more = i + 1, False
    while more:
        if i >= n:
            return DEFER, 0, 0, 0, 0, 0
        items += 1
        if b[i] != 123:
            i = value_end(b, i, n, stack)  # not an object: counted, not kept (as the reference)
            if i < 0:
                return DEFER, 0, 0, 0, 0, 0
        else:
            # ---- one event object: the keys we read, each at most once
            seen = odd = 0  # odd: a value of a kind the kernel does not convert
            cat_s = cat_e = name_s = name_e = -1
            name_esc = 0
            ph_x = False
            ts = dur = 0.0
            tid = pid = -1
            dims_s = dims_e = types_s = types_e = -1
            dtype, did, nbytes, addr, alloc, res, has_totals = 0, -1, 0, 0, 0, 0, 0
            nh0, nt0 = nh, nt
            i = ws(b, i + 1, n)
            obj_more = True
            if i < n and b[i] == 125:
                i, obj_more = i + 1, False
            while obj_more:
                ks, ke, i = _key(b, i, n)
                if i < 0:
                    return DEFER, 0, 0, 0, 0, 0
                c = b[i]
                key = 0
                klen = ke - ks
                if klen == 2:
                    key = 3 if eq(b, ks, ke, _K_PH) else (4 if eq(b, ks, ke, _K_TS) else 0)
                elif klen == 3:
                    if eq(b, ks, ke, _K_CAT):
                        key = 1
                    elif eq(b, ks, ke, _K_DUR):
                        key = 5
                    elif eq(b, ks, ke, _K_TID):
                        key = 6
                    elif eq(b, ks, ke, _K_PID):
                        key = 7
                elif klen == 4:
                    key = 2 if eq(b, ks, ke, _K_NAME) else (8 if eq(b, ks, ke, _K_ARGS) else 0)
                if key:
                    if seen & (1 << key):
                        return DEFER, 0, 0, 0, 0, 0
                    seen |= 1 << key
                s = i
                if key == 0:
                    i = value_end(b, i, n, stack)
                elif key <= 3:  # cat, name, ph: strings; null reads as absent for cat and ph
                    if c == 34:
                        i, esc = string_end(b, i, n)
                        if i >= 0 and esc and key != 2:  # an escaped cat or ph might read a kept one
                            return DEFER, 0, 0, 0, 0, 0
                        if key == 1:
                            cat_s, cat_e = s + 1, i - 1
                        elif key == 2:
                            name_s, name_e, name_esc = s + 1, i - 1, esc
                        else:
                            ph_x = eq(b, s + 1, i - 1, _V_X)
                    else:
                        if key == 2 or c != 110:
                            odd = 1
                        i = value_end(b, i, n, stack)
                elif key <= 5:
                    i, v, nh, nt = _time(b, i, n, hard, text, nh, nt, rows, key - 4)
                    if i == -3:
                        return FULL, 0, 0, 0, 0, 0
                    if i < 0:
                        odd = 1
                        i = value_end(b, s, n, stack)
                    elif key == 4:
                        ts = v
                    else:
                        dur = v
                elif key <= 7:
                    i, v_int, present = _small_int(b, i, n)
                    if i < 0:
                        odd = 1
                        i = value_end(b, s, n, stack)
                    elif key == 6:
                        tid = v_int if present else -1
                    else:
                        pid = v_int if present else -1
                elif c == 123:
                    i, a_odd, dims_s, dims_e, types_s, types_e, dtype, did, nbytes, addr, alloc, res, has_totals = (
                        _args(b, i + 1, n, stack)
                    )
                    odd |= a_odd
                else:  # args that is not an object
                    odd = 1
                    i = value_end(b, i, n, stack)
                if i < 0:
                    return DEFER, 0, 0, 0, 0, 0
                i, obj_more = _next_member(b, i, n)
                if i < 0:
                    return DEFER, 0, 0, 0, 0, 0
            # ---- the kind, tested in the reference's order
            kind = 0
            if cat_s >= 0 and eq(b, cat_s, cat_e, _V_CPU_OP):
                kind = OP
            elif cat_s >= 0 and eq(b, cat_s, cat_e, _V_PYTHON):
                kind = PYTHON
            elif name_s >= 0 and (
                unescaped_eq(b, name_s, name_e, _V_MEMORY) if name_esc else eq(b, name_s, name_e, _V_MEMORY)
            ):
                kind = MEMORY
            elif ph_x and cat_s >= 0 and eq(b, cat_s, cat_e, _V_ANNOTATION):
                kind = ANNOTATION
            if kind == 0:
                nh, nt = nh0, nt0  # its hard numbers are not needed
            elif odd:  # a kept event with a value the reference converts its own way
                return DEFER, 0, 0, 0, 0, 0
            elif rows == ints.shape[1]:
                return FULL, 0, 0, 0, 0, 0
            else:
                ints[KIND, rows] = kind
                ints[TID, rows] = tid
                floats[TS, rows] = ts
                if kind == MEMORY:
                    ints[DTYPE, rows] = dtype
                    ints[DID, rows] = did
                    ints[BYTES, rows] = nbytes
                    ints[ADDR, rows] = addr
                    ints[ALLOC, rows] = alloc
                    ints[RES, rows] = res
                    ints[HAS_TOTALS, rows] = has_totals
                else:
                    if name_s < 0:  # absent: the empty name (an empty span at the event's end)
                        name_s = name_e = i
                    r, nr = _intern(b, name_s, name_e, name_esc, reps, nr, table)
                    ints[NAME, rows] = r
                    floats[DUR, rows] = dur
                    ints[PID, rows] = pid
                    r_dims = r_types = -1
                    if kind == OP and dims_s >= 0:
                        r_dims, nr = _intern(b, dims_s, dims_e, 0, reps, nr, table)
                    if kind == OP and types_s >= 0:
                        r_types, nr = _intern(b, types_s, types_e, 0, reps, nr, table)
                    if r < 0 or (kind == OP and ((dims_s >= 0 and r_dims < 0) or (types_s >= 0 and r_types < 0))):
                        return FULL, 0, 0, 0, 0, 0
                    ints[DIMS, rows] = r_dims
                    ints[TYPES, rows] = r_types
                rows += 1
        i = ws(b, i, n)
        if i < n and b[i] == 44:
            i = ws(b, i + 1, n)
        elif i < n and b[i] == 93:
            i, more = i + 1, False
        else:
            return DEFER, 0, 0, 0, 0, 0
    if ws(b, i, n) != n:
        return DEFER, 0, 0, 0, 0, 0
    for r in range(nr):  # leave the table empty for the next batch
        table[reps[3, r]] = 0
    return OK, items, rows, nh, nt, nr
