"""A pickle machine that builds no Python objects: the opcodes of a plain-data pickle run
into flat arrays (a *tape*), compiled with numba.

Unpickling a 1M-event snapshot makes ~30M Python objects (a dict per trace entry, a list of
frame references per entry), and reading them back into columns costs more than making
them. The tape holds the same values as numbers: every value is a (kind, payload) pair,
containers are numbered, and each ``APPENDS``/``SETITEMS`` (a *batch*) appends its items to
one row array, chained per container. :mod:`snapviz.load.snapshot.columnar` reads the trace entries
straight from it and makes Python objects only for the small rest of the file.

Only the opcodes ``pickle.dump`` writes for plain data (protocols 2-5: dicts, lists, tuples,
str, int, float, bool, None, memo puts and gets) are run; anything else stops the machine
with :data:`UNSUPPORTED` and the caller unpickles the file the usual way. Strings stay
bytes in the file (offset, length) until someone reads them. The machine is bounded by the
file: each opcode adds at most one row, batch, string or container, so memory and time are
linear in its length, and it never calls into Python. The tape keeps copies of the string
bytes, not the file, so the file's bytes can go once the tape is made.
"""

from __future__ import annotations

import numpy as np

# Value kinds on the tape. Payloads (int32): INT and FLOAT an index in the int table (the
# value, the float's bits), STR and BIG a string index (BIG: the int's bytes, made into an
# int in Python when read), containers their index.
K_NONE, K_FALSE, K_TRUE, K_INT, K_FLOAT, K_STR, K_BIG, K_LIST, K_DICT, K_TUPLE = range(10)
K_EMPTY = 127  # a memo slot never written
OK, UNSUPPORTED, FULL = 0, 1, 2  # FULL: an array was too short (the run is repeated with exact sizes)


def vm_py(
    buf: np.ndarray,
    start: int,
    dry: bool,
    st_k: np.ndarray,
    st_p: np.ndarray,
    marks: np.ndarray,
    memo_k: np.ndarray,
    memo_p: np.ndarray,
    r_k: np.ndarray,
    r_p: np.ndarray,
    b_s: np.ndarray,
    b_n: np.ndarray,
    b_next: np.ndarray,
    c_t: np.ndarray,
    c_first: np.ndarray,
    c_last: np.ndarray,
    s_off: np.ndarray,
    s_len: np.ndarray,
    s_ascii: np.ndarray,
    s_key: np.ndarray,
    ints: np.ndarray,
    sbuf: np.ndarray,
) -> tuple[int, int, int, np.ndarray]:  # pragma: no cover - compiled
    """Run the opcodes of ``buf`` from ``start`` to STOP into the arrays (see :class:`snapviz.load.snapshot.tape.Tape`):
    (status, root kind, root payload, counts). Counts: the greatest stack and mark depths,
    memo slots, rows, batches, containers, strings. ``dry``: count only, store nothing (the
    arrays but the marks may be of length 1); a dry run's counts bound the real run's."""
    n = len(buf)
    sp = 0
    nm = 0
    nmemo = 0
    nr = 0
    nb = 0
    nc = 0
    ns = 0
    ni = 0  # int table entries
    nsb = 0  # string bytes
    max_sp = 0
    max_nm = 0
    i = start
    status = UNSUPPORTED
    root_k = K_NONE
    root_p = 0
    while i < n:
        op = buf[i]
        if (op == 0x6A or op == 0x68) and not dry and i + 4 < n:
            # LONG_BINGET / BINGET, most of the opcodes of a snapshot (frame and key references):
            # the common case first, without the general path's branches; anything else below
            if op == 0x6A:
                idx = np.int64(buf[i + 1]) | (np.int64(buf[i + 2]) << 8) | (np.int64(buf[i + 3]) << 16)
                idx |= np.int64(buf[i + 4]) << 24
                nxt = i + 5
            else:
                idx = np.int64(buf[i + 1])
                nxt = i + 2
            if idx < nmemo and sp < len(st_k) and memo_k[idx] != K_EMPTY:
                st_k[sp] = memo_k[idx]
                st_p[sp] = memo_p[idx]
                sp += 1
                if sp > max_sp:
                    max_sp = sp
                i = nxt
                continue
        vk = -1  # the kind of the value this opcode pushes (-1: none)
        vp = 0
        iv = np.int64(0)  # an INT's value or a FLOAT's bits, kept in the int table
        fresh = False
        span = -1  # where the bytes of a string (or a big int) this opcode reads start (-1: none)
        span_len = 0
        if op == 0x94:  # MEMOIZE
            if sp == 0:
                break
            if not dry:
                if nmemo == len(memo_k):
                    status = FULL
                    break
                memo_k[nmemo] = st_k[sp - 1]
                memo_p[nmemo] = st_p[sp - 1]
            nmemo += 1
            i += 1
        elif op == 0x68 or op == 0x6A or op == 0x71 or op == 0x72:  # BINGET, LONG_BINGET, BINPUT, LONG_BINPUT
            w = 1 if op == 0x68 or op == 0x71 else 4
            if i + w >= n:
                break
            idx = 0
            for b in range(w - 1, -1, -1):
                idx = (idx << 8) | np.int64(buf[i + 1 + b])
            i += 1 + w
            if op == 0x68 or op == 0x6A:
                if idx >= nmemo:
                    break
                if not dry:
                    if memo_k[idx] == K_EMPTY:
                        break
                    vk = memo_k[idx]
                    vp = memo_p[idx]
                else:
                    vk = K_NONE
            else:
                if sp == 0 or idx > n:  # a memo index beyond the file's length: not a plain dump
                    break
                if not dry:
                    if idx >= len(memo_k):
                        status = FULL
                        break
                    for j in range(nmemo, idx):
                        memo_k[j] = K_EMPTY  # slots skipped by a BINPUT stay empty
                    memo_k[idx] = st_k[sp - 1]
                    memo_p[idx] = st_p[sp - 1]
                nmemo = max(nmemo, idx + 1)
        elif op == 0x8C or op == 0x58 or op == 0x8D:  # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
            w = 1 if op == 0x8C else (4 if op == 0x58 else 8)
            if i + w >= n:
                break
            length = 0
            for b in range(w - 1, -1, -1):
                length = (length << 8) | np.int64(buf[i + 1 + b])
            if length < 0 or length > n - i - 1 - w:
                break
            o = i + 1 + w
            vk = K_STR
            span = o
            span_len = length
            i = o + length
        elif op == 0x4B:  # BININT1
            if i + 1 >= n:
                break
            fresh = True
            vk = K_INT
            iv = np.int64(buf[i + 1])
            i += 2
        elif op == 0x4D:  # BININT2
            if i + 2 >= n:
                break
            fresh = True
            vk = K_INT
            iv = np.int64(buf[i + 1]) | (np.int64(buf[i + 2]) << 8)
            i += 3
        elif op == 0x4A:  # BININT: signed 32-bit
            if i + 4 >= n:
                break
            v = np.int64(0)
            for b in range(3, -1, -1):
                v = (v << 8) | np.int64(buf[i + 1 + b])
            if v >= 1 << 31:
                v -= 1 << 32
            fresh = True
            vk = K_INT
            iv = v
            i += 5
        elif op == 0x8A:  # LONG1: a little-endian two's complement of k bytes
            if i + 1 >= n:
                break
            k = np.int64(buf[i + 1])
            if i + 1 + k >= n:
                break
            if k > 8:  # its bytes are kept like a string's; Python makes the int when it is read
                vk = K_BIG
                span = i + 2
                span_len = k
            else:
                u = np.uint64(0)
                for b in range(k - 1, -1, -1):
                    u = (u << np.uint64(8)) | np.uint64(buf[i + 2 + b])
                v = np.int64(u)
                if 0 < k < 8 and buf[i + 1 + k] >= 0x80:
                    v -= np.int64(1) << (8 * k)
                fresh = True
                vk = K_INT
                iv = v
            i += 2 + k
        elif op == 0x47:  # BINFLOAT
            if i + 8 >= n:
                break
            fresh = True
            vk = K_FLOAT
            v = np.int64(0)
            for b in range(8):  # big-endian: the float's bits, as an int64
                v = (v << 8) | np.int64(buf[i + 1 + b])
            iv = v
            i += 9
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            vk = K_NONE if op == 0x4E else (K_TRUE if op == 0x88 else K_FALSE)
            i += 1
        elif op == 0x7D or op == 0x5D or op == 0x29:  # EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
            vk = K_DICT if op == 0x7D else (K_LIST if op == 0x5D else K_TUPLE)
            if not dry:
                if nc == len(c_t):
                    status = FULL
                    break
                c_t[nc] = vk
                c_first[nc] = -1
                c_last[nc] = -1
            vp = nc
            nc += 1
            i += 1
        elif op == 0x28:  # MARK
            if nm == len(marks):
                break  # marks nest as deep as the containers: more than _MARK_DEPTH is not a snapshot
            marks[nm] = sp
            nm += 1
            max_nm = max(max_nm, nm)
            i += 1
        elif (
            op == 0x65 or op == 0x61 or op == 0x75 or op == 0x73 or op == 0x85 or op == 0x86 or op == 0x87 or op == 0x74
        ):
            # APPENDS, APPEND, SETITEMS, SETITEM, TUPLE1-3, TUPLE: items from ``lo`` up move into a container
            if op == 0x65 or op == 0x75 or op == 0x74:
                if nm == 0:
                    break
                nm -= 1
                lo = marks[nm]
            elif op == 0x61:
                lo = sp - 1
            elif op == 0x73:
                lo = sp - 2
            else:
                lo = sp - (op - 0x84)
            if lo < 0 or lo > sp:
                break
            is_tuple = op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87
            want = K_TUPLE
            if is_tuple:
                target = nc
                if not dry:
                    if nc == len(c_t):
                        status = FULL
                        break
                    c_t[nc] = K_TUPLE
                    c_first[nc] = -1
                    c_last[nc] = -1
                nc += 1
            else:
                if lo == 0 and not dry:
                    break
                want = K_DICT if op == 0x75 or op == 0x73 else K_LIST
                target = 0
                if not dry:
                    if st_k[lo - 1] != want:
                        break  # appends to a non-list, items set on a non-dict: not plain data
                    target = st_p[lo - 1]
            cnt = sp - lo
            if want == K_DICT and not dry:
                if cnt % 2:
                    break
                bad = False
                for j in range(lo, sp, 2):  # keys: hashable scalars only (a container key fails in pickle)
                    kk = st_k[j]
                    if kk == K_LIST or kk == K_DICT or kk == K_TUPLE:
                        bad = True
                    elif kk == K_STR:
                        s_key[st_p[j]] = 1
                if bad:
                    break
            if cnt > 0:
                if not dry:
                    if nr + cnt > len(r_k) or nb == len(b_s):
                        status = FULL
                        break
                    r_k[nr : nr + cnt] = st_k[lo:sp]
                    r_p[nr : nr + cnt] = st_p[lo:sp]
                    b_s[nb] = nr
                    b_n[nb] = cnt
                    b_next[nb] = -1
                    if c_first[target] < 0:
                        c_first[target] = nb
                    else:
                        b_next[c_last[target]] = nb
                    c_last[target] = nb
                nb += 1
                nr += cnt
            sp = lo
            if is_tuple:
                vk = K_TUPLE
                vp = target
            i += 1
        elif op == 0x80:  # PROTO
            i += 2
        elif op == 0x95:  # FRAME
            i += 9
        elif op == 0x2E:  # STOP
            if sp == 1 and nm == 0:
                status = OK
                if not dry:
                    root_k = st_k[0]
                    root_p = st_p[0]
            break
        else:
            break
        if span >= 0:  # a string's (or a big int's) bytes, copied into the tape: payload, its string index
            if not dry:
                if ns == len(s_off) or nsb + span_len > len(sbuf):
                    status = FULL
                    break
                s_off[ns] = nsb
                s_len[ns] = span_len
                s_key[ns] = 0
                asc = 1 if vk == K_STR else 0
                for b in range(span_len):
                    c = buf[span + b]
                    sbuf[nsb + b] = c
                    if c >= 0x80:
                        asc = 0
                s_ascii[ns] = asc
            vp = ns
            ns += 1
            nsb += span_len
        if vk >= 0:
            if fresh:  # a value just read, not a memo's: its payload is its place in the int table
                if not dry:
                    if ni == len(ints):
                        status = FULL
                        break
                    ints[ni] = iv
                vp = ni
                ni += 1
            if not dry:
                if sp == len(st_k):
                    status = FULL
                    break
                st_k[sp] = vk
                st_p[sp] = vp
            sp += 1
            max_sp = max(max_sp, sp)
    if max(nr, nc, ns, ni, nmemo) >= 1 << 31 and status == OK:
        status = UNSUPPORTED  # payloads are int32: beyond 2**31 of anything, unpickle the usual way
    counts = np.array([max_sp, max_nm, nmemo, nr, nb, nc, ns, ni, nsb], np.int64)
    return status, root_k, root_p, counts
