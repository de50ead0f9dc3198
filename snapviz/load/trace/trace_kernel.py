"""Pieces of ``traceEvents`` decoded by a numba kernel (the ``fast`` extra) straight into
rows of numbers and string ids: no Python object per event.

The kernel walks the text of the array's items, one read at a time with the unread end of
the last (:func:`snapviz.load.trace.json_items.array_item_docs`), byte by byte, validating the
whole grammar (strings as strict UTF-8, numbers, literals, nesting within the guard's depth
limit) and keeping, per kept event, what :meth:`Columns.add` keeps. It stops where the
stream guard would cut the read (after the last whole container item) and counts the values
the guard counts, so the guard need not scan what it read. Strings it keeps (names, raw
``Input Dims`` / ``Input type`` texts) are interned in the kernel by their raw bytes: each
distinct one is decoded once in Python. A ``ts``/``dur`` whose text is not exactly
representable by the fast path (Clinger: at most 2**53 and a power of ten up to 1e22) is
read by Python's ``float`` of its text, correctly rounded as every JSON parser here.

It takes only a strict subset of JSON on which the reference's result is plain: anything
else (a key or ``cat`` with escapes, a surrogate escape, an id that is not a small integer,
a non-number time, ``args`` that is not an object, a duplicated key we read, ...) makes it
give the read back (``DEFER``) to the guard, the typed msgspec decode and, behind that, the
reference. ``tests/unit/test_trace_kernel.py`` compares it with the reference on every trace
we have, generated events and damaged texts, and the guard's state at every read.

Its helpers (:mod:`snapviz.load.trace.json_kernel`, :mod:`snapviz.load.trace.trace_kernel_fields`) are
compiled into it: numba's on-disk cache is keyed by this file only, so a change to them
must come with a change here (a fresh install rewrites every file).

This module imports numba at import time: import it only when a kernel is wanted.
"""

from __future__ import annotations

import numpy as np

from snapviz.load.trace.json_kernel import eq, jit, string_end, unescaped_eq, value_end, ws
from snapviz.load.trace.trace_kernel_fields import (
    intern,
    member_key,
    next_member,
    read_args,
    read_time,
    small_int,
    truncated,
)

OK, DEFER, FULL = 0, 1, 2  # FULL: an output array is too small; grow it and decode the batch again
# Row layout of the integer output (``ints[field, row]``) and the float output.
KIND, NAME, TID, PID, DIMS, TYPES, DTYPE, DID, BYTES, ADDR, ALLOC, RES, HAS_TOTALS = range(13)
N_INT_FIELDS = 13
TS, DUR = 0, 1
# Event kinds, in the reference's order of tests.
OP, PYTHON, ANNOTATION, MEMORY = 1, 2, 3, 4


_K_CAT = np.frombuffer(b"cat", np.uint8)
_K_NAME = np.frombuffer(b"name", np.uint8)
_K_PH = np.frombuffer(b"ph", np.uint8)
_K_TS = np.frombuffer(b"ts", np.uint8)
_K_DUR = np.frombuffer(b"dur", np.uint8)
_K_TID = np.frombuffer(b"tid", np.uint8)
_K_PID = np.frombuffer(b"pid", np.uint8)
_K_ARGS = np.frombuffer(b"args", np.uint8)
_V_CPU_OP = np.frombuffer(b"cpu_op", np.uint8)
_V_OPERATOR = np.frombuffer(b"Operator", np.uint8)  # the 2021 profilers' name for cpu_op
_V_PYTHON = np.frombuffer(b"python_function", np.uint8)
_V_ANNOTATION = np.frombuffer(b"user_annotation", np.uint8)
_V_MEMORY = np.frombuffer(b"[memory]", np.uint8)
_V_X = np.frombuffer(b"X", np.uint8)


@jit
def decode_items(
    b: np.ndarray,
    first: bool,
    base: int,
    ints: np.ndarray,
    floats: np.ndarray,
    hard: np.ndarray,
    text: np.ndarray,
    reps: np.ndarray,
    table: np.ndarray,
    stack_item: np.ndarray,
    stack_member: np.ndarray,
    stack_arg: np.ndarray,
) -> tuple[int, int, int, int, int, int, int, int, int, int]:
    """Decode the whole items at the start of ``b``, a piece of the ``traceEvents`` array: just
    after its ``[`` (``first``), else from the comma before the next item.

    Returns (status, items, rows, hard numbers, their text's length, distinct spans, cut,
    done, opens, last). The items read are those before ``cut``: the end of the last
    container item whose end is in ``b`` (``last``, 0: none; where the stream guard cuts
    too), or, with ``done``, the array's ``]``. Items after ``last`` wait for the next read
    (as the guard's cut leaves them); an item that is whole but outside the subset the
    kernel reads gives the piece back (``DEFER``). Rows: the kept events, their fields in ``ints``/``floats`` (layout above),
    string fields as ids of distinct spans (``reps``: start, end, escaped, hash slot).
    ``opens``: containers opened at or after ``base`` before ``cut``. The stacks' lengths are
    the nesting an item, a value in an event and a value in its ``args`` may have."""
    n = len(b)
    items = rows = nh = nt = nr = 0
    opens = np.zeros(1, np.int64)
    # The state after the last container item: what is returned when the read ends in an item.
    c_cut = c_items = c_rows = c_nh = c_nt = c_opens = 0
    done = False
    i = ws(b, 0, n)
    if i < n and b[i] == 93:
        done = True
    elif not first and i < n:
        if b[i] != 44:
            return DEFER, 0, 0, 0, 0, 0, 0, 0, 0, 0
        i = ws(b, i + 1, n)
    while not done:
        if i >= n:
            break
        s = i
        items += 1
        bad = False  # the item could not be read: cut short, or outside the subset
        if b[i] != 123:
            i = value_end(b, i, n, stack_item, opens, base)  # not an object: counted, not kept (as the reference)
            bad = i < 0
        else:
            # ---- one event object: the keys we read, each at most once
            if i >= base:
                opens[0] += 1
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
                ks, ke, i = member_key(b, i, n)
                if i < 0:
                    break
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
                    if seen & (1 << key):  # a duplicated key: the last one wins in some parsers only
                        i = -1
                        break
                    seen |= 1 << key
                s_val = i
                if key == 0:
                    i = value_end(b, i, n, stack_member, opens, base)
                elif key <= 3:  # cat, name, ph: strings; null reads as absent for cat and ph
                    if c == 34:
                        i, esc = string_end(b, i, n)
                        if i >= 0 and esc and key != 2:  # an escaped cat or ph might read a kept one
                            i = -1
                        elif key == 1:
                            cat_s, cat_e = s_val + 1, i - 1
                        elif key == 2:
                            name_s, name_e, name_esc = s_val + 1, i - 1, esc
                        else:
                            ph_x = eq(b, s_val + 1, i - 1, _V_X)
                    else:
                        if key == 2 or c != 110:
                            odd = 1
                        i = value_end(b, i, n, stack_member, opens, base)
                elif key <= 5:
                    i, v, nh, nt = read_time(b, i, n, hard, text, nh, nt, rows, key - 4)
                    if i == -3:
                        return FULL, 0, 0, 0, 0, 0, 0, 0, 0, 0
                    if i < 0:
                        odd = 1
                        i = value_end(b, s_val, n, stack_member, opens, base)
                    elif key == 4:
                        ts = v
                    else:
                        dur = v
                elif key <= 7:
                    i, v_int, present = small_int(b, i, n)
                    if i < 0:
                        odd = 1
                        i = value_end(b, s_val, n, stack_member, opens, base)
                    elif key == 6:
                        tid = v_int if present else -1
                    else:
                        pid = v_int if present else -1
                elif c == 123:
                    if i >= base:
                        opens[0] += 1
                    i, a_odd, dims_s, dims_e, types_s, types_e, dtype, did, nbytes, addr, alloc, res, has_totals = (
                        read_args(b, i + 1, n, stack_arg, opens, base)
                    )
                    odd |= a_odd
                else:  # args that is not an object
                    odd = 1
                    i = value_end(b, i, n, stack_member, opens, base)
                if i < 0:
                    break
                i, obj_more = next_member(b, i, n)
                if i < 0:
                    break
            bad = i < 0
            if not bad:
                # ---- the kind, tested in the reference's order
                kind = 0
                if cat_s >= 0 and (eq(b, cat_s, cat_e, _V_CPU_OP) or eq(b, cat_s, cat_e, _V_OPERATOR)):
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
                    return DEFER, 0, 0, 0, 0, 0, 0, 0, 0, 0
                elif rows == ints.shape[1]:
                    return FULL, 0, 0, 0, 0, 0, 0, 0, 0, 0
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
                        r, nr = intern(b, name_s, name_e, name_esc, reps, nr, table)
                        ints[NAME, rows] = r
                        floats[DUR, rows] = dur
                        ints[PID, rows] = pid
                        r_dims = r_types = -1
                        if kind == OP and dims_s >= 0:
                            r_dims, nr = intern(b, dims_s, dims_e, 0, reps, nr, table)
                        if kind == OP and types_s >= 0:
                            r_types, nr = intern(b, types_s, types_e, 0, reps, nr, table)
                        if r < 0 or (kind == OP and ((dims_s >= 0 and r_dims < 0) or (types_s >= 0 and r_types < 0))):
                            return FULL, 0, 0, 0, 0, 0, 0, 0, 0, 0
                        ints[DIMS, rows] = r_dims
                        ints[TYPES, rows] = r_types
                    rows += 1
        if bad:
            if truncated(b, s, n):
                break
            return DEFER, 0, 0, 0, 0, 0, 0, 0, 0, 0
        if b[s] == 123 or b[s] == 91:  # a container item: the guard's cut
            c_cut, c_items, c_rows, c_nh, c_nt, c_opens = i, items, rows, nh, nt, opens[0]
        i = ws(b, i, n)
        if i >= n:
            break
        if b[i] == 44:
            i = ws(b, i + 1, n)
        elif b[i] == 93:
            done = True
        else:
            return DEFER, 0, 0, 0, 0, 0, 0, 0, 0, 0
    for r in range(nr):  # leave the table empty for the next batch
        table[reps[3, r]] = 0
    if done:
        return OK, items, rows, nh, nt, nr, i, 1, opens[0], c_cut
    return OK, c_items, c_rows, c_nh, c_nt, nr, c_cut, 0, c_opens, c_cut
