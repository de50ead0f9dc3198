"""A pre-pass over a pickle's opcodes that bounds what the C unpickler will build.

``pickle.Unpickler`` (C) is fast and, with globals refused, runs no code, but it builds
whatever the opcodes describe: a dict keyed by a tuple nested 100,000 deep (its hash
recurses in C and overflows the stack: SIGSEGV), memo indices near 2**31 (it zero-fills
a 16 GiB memo table), lists that reference one list a billion times over ("billion
laughs": fine for the unpickler, fatal for anything that later walks the result). This
scan simulates the unpickler's stack without building anything: for every container it
tracks its nesting depth and its tree size (memo references counted in full), and it
refuses what a memory snapshot never contains (sets, dict keys that are not scalars,
containers modified after they were referenced, out-of-order memo indices) before the
real unpickler sees the first byte. Linear time, constant work per opcode; it does not
recurse. Pickles over FULL_SCAN_BYTES first try a much faster grammar check
(:mod:`snapviz.load.snapshot.pickle_scan_fast`) and come here only when it cannot decide.

Opcodes and their argument layouts: ``pickletools`` (Lib/pickletools.py), protocol 0-5.
"""

from __future__ import annotations

from operator import itemgetter
from struct import Struct
from struct import error as struct_error

from snapviz.errors import InputError
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.load.snapshot.pickle_scan_fast import FULL_SCAN_BYTES, KERNEL, fast_scan, fast_scan_compiled

_U4, _I4, _U8, _U2 = Struct("<I"), Struct("<i"), Struct("<Q"), Struct("<H")
_DEPTH, _SIZE = itemgetter(0), itemgetter(1)
_LIST, _DICT, _TUPLE, _ATOM = 0, 1, 2, 3
# Record of a value on the simulated stack: [depth, tree size, referenced, kind]. All
# scalars share one record; containers get their own, so the memo sees later fills.
_SCALAR = [0, 1, True, _ATOM]
# Opcodes whose only job is to fetch a global or a persistent id: the real unpickler's
# find_class / persistent_load refuses them with a message naming what was asked for,
# and everything before them has passed this scan, so the scan stops there.
_DEFER = frozenset(b"ci\x93PQ")
_REFUSED = {
    0x8F: "a set",
    0x90: "a set",
    0x91: "a frozenset",
    0x82: "an extension code",
    0x83: "an extension code",
    0x84: "an extension code",
    0x97: "an out-of-band buffer",
    0x98: "an out-of-band buffer",
    ord("R"): "a call (REDUCE)",
    ord("b"): "object state (BUILD)",
    ord("o"): "an object (OBJ)",
    0x81: "an object (NEWOBJ)",
    0x92: "an object (NEWOBJ_EX)",
}


class _Malformed(Exception):
    """Internal: the opcode stream is not a well-formed pickle (the message says why)."""


def scan_pickle(data: bytes, path: str, limits: Limits, exact: bool = False) -> dict[str, int] | None:
    """Raise :class:`InputError` (a :class:`LimitExceeded` for limits) unless ``data`` is a
    pickle of plain data within ``limits``; return when the C unpickler may run: the
    exact scan's counts (objects, string_bytes, depth, expansion), None after the fast path."""
    if not exact and len(data) > FULL_SCAN_BYTES:
        # The grammar check (snapviz.load.snapshot.pickle_scan_fast), compiled for big pickles when numba is there.
        fast = fast_scan_compiled if KERNEL.wanted(len(data)) else fast_scan
        try:
            if fast(data, path, limits):
                return None
        except (IndexError, ValueError):
            pass  # a malformed tail: the exact scan says what is wrong
    try:
        return _scan(data, path, limits)
    except _Malformed as exc:
        raise InputError(f"{path}: not a readable snapshot pickle ({exc})") from None
    except (IndexError, ValueError, struct_error) as exc:  # stack underflow, bad number text, short argument
        if isinstance(exc, struct_error) or (isinstance(exc, IndexError) and not str(exc).startswith("list")):
            raise InputError(f"{path}: truncated or incomplete snapshot pickle ({exc})") from None
        raise InputError(f"{path}: not a readable snapshot pickle ({type(exc).__name__}: {exc})") from None


def _line(data: bytes, i: int) -> tuple[bytes, int]:
    """The text argument starting at ``i`` (protocol 0) and the offset after its newline."""
    j = data.find(b"\n", i)
    if j < 0:
        raise _Malformed("truncated: a text argument has no end of line")
    return data[i:j], j + 1


def _scan(data: bytes, path: str, limits: Limits) -> dict[str, int] | None:
    n = len(data)
    max_depth, max_size, max_str, max_objects = limits.depth, limits.expansion, limits.string_length, limits.objects
    stack: list[list] = []
    push = stack.append
    marks: list[int] = []
    memo: dict[int, list] = {}
    objects = 0  # objects the unpickler would create
    strbytes = 0  # bytes of strings, bytes and long integers it would create
    scalar = _SCALAR
    u4, i4, u8 = _U4.unpack_from, _I4.unpack_from, _U8.unpack_from
    i = 0
    while i < n:
        op = data[i]
        i += 1
        if op == 0x68:  # BINGET
            rec = memo.get(data[i])
            i += 1
            if rec is None:
                raise _Malformed("a memo reference to nothing")
            rec[2] = True
            push(rec)
        elif op == 0x6A:  # LONG_BINGET
            rec = memo.get(u4(data, i)[0])
            i += 4
            if rec is None:
                raise _Malformed("a memo reference to nothing")
            rec[2] = True
            push(rec)
        elif op == 0x94:  # MEMOIZE
            memo[len(memo)] = stack[-1]
        elif (
            op == 0x8C or op == 0x8A or op == 0x43 or op == 0x55
        ):  # SHORT_BINUNICODE, LONG1, SHORT_BINBYTES, SHORT_BINSTRING
            k = data[i]
            if k > max_str:  # the limit holds for every string, however short (a limit under 256)
                raise LimitExceeded(path, "string_length", k, max_str, " bytes")
            i += 1 + k
            strbytes += k
            objects += 1
            push(scalar)
        elif op == 0x4B:  # BININT1
            i += 1
            objects += 1
            push(scalar)
        elif op == 0x4A:  # BININT
            i += 4
            objects += 1
            push(scalar)
        elif op == 0x4D:  # BININT2
            i += 2
            objects += 1
            push(scalar)
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            if len(marks) > max_depth:
                raise LimitExceeded(path, "depth", len(marks), max_depth)
        elif op == 0x75 or op == 0x65:  # SETITEMS, APPENDS
            m = marks.pop()
            items = stack[m:]
            del stack[m:]
            _fill(stack[-1], items, op == 0x75, path, max_depth, max_size)
        elif op == 0x7D or op == 0x5D:  # EMPTY_DICT, EMPTY_LIST
            objects += 1
            push([1, 1, False, _DICT if op == 0x7D else _LIST])
        elif op == 0x73 or op == 0x61:  # SETITEM, APPEND
            k = 2 if op == 0x73 else 1
            items = stack[-k:]
            if len(items) != k:
                raise _Malformed("stack underflow")
            del stack[-k:]
            _fill(stack[-1], items, op == 0x73, path, max_depth, max_size)
        elif op == 0x95:  # FRAME
            if u8(data, i)[0] > n - i - 8:
                raise _Malformed("truncated: a frame runs past the end of the data")
            i += 8
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            push(scalar)
        elif op == 0x47:  # BINFLOAT
            i += 8
            objects += 1
            push(scalar)
        elif op == 0x58 or op == 0x42 or op == 0x8B or op == 0x54:  # BINUNICODE, BINBYTES, LONG4, BINSTRING
            k = u4(data, i)[0] if op in (0x58, 0x42) else i4(data, i)[0]
            if k < 0:
                raise _Malformed("a negative length")
            if k > max_str:
                raise LimitExceeded(path, "string_length", k, max_str, " bytes")
            i += 4 + k
            strbytes += k
            objects += 1
            push(scalar)
        elif op == 0x8D or op == 0x8E or op == 0x96:  # BINUNICODE8, BINBYTES8, BYTEARRAY8
            k = u8(data, i)[0]
            if k > max_str:
                raise LimitExceeded(path, "string_length", k, max_str, " bytes")
            i += 8 + k
            strbytes += k
            objects += 1
            push(scalar)
        elif op == 0x85 or op == 0x86 or op == 0x87 or op == 0x29 or op == 0x74:  # TUPLE1-3, EMPTY_TUPLE, TUPLE
            if op == 0x29:
                k = 0
            elif op == 0x74:
                k = len(stack) - marks.pop()
            else:
                k = op - 0x84
            items = stack[len(stack) - k :] if k else []
            if len(items) != k:
                raise _Malformed("stack underflow")
            del stack[len(stack) - k :]
            objects += 1
            push(_container(items, _TUPLE, path, max_depth, max_size))
        elif op == 0x71 or op == 0x72 or op == 0x70:  # BINPUT, LONG_BINPUT, PUT
            if op == 0x71:
                idx = data[i]
                i += 1
            elif op == 0x72:
                idx = u4(data, i)[0]
                i += 4
            else:
                text, i = _line(data, i)
                idx = int(text)
            # The unpickler sizes its memo table by the largest index: bound it by what exists.
            if idx > len(memo) + objects + 1024:
                raise _Malformed(f"memo index {idx} out of sequence")
            memo[idx] = stack[-1]
        elif op == 0x67:  # GET
            text, i = _line(data, i)
            rec = memo.get(int(text))
            if rec is None:
                raise _Malformed("a memo reference to nothing")
            rec[2] = True
            push(rec)
        elif op == 0x32:  # DUP
            rec = stack[-1]
            rec[2] = True
            push(rec)
        elif op == 0x30:  # POP
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
        elif op == 0x31:  # POP_MARK
            del stack[marks.pop() :]
        elif op == 0x64 or op == 0x6C:  # DICT, LIST (protocol 0/1: items since MARK)
            m = marks.pop()
            items = stack[m:]
            del stack[m:]
            objects += 1
            rec = [1, 1, False, _DICT if op == 0x64 else _LIST]
            _fill(rec, items, op == 0x64, path, max_depth, max_size)
            push(rec)
        elif op == 0x49 or op == 0x4C or op == 0x46 or op == 0x53 or op == 0x56:  # INT, LONG, FLOAT, STRING, UNICODE
            text, i = _line(data, i)
            if len(text) > max_str:
                raise LimitExceeded(path, "string_length", len(text), max_str, " bytes")
            strbytes += len(text)
            objects += 1
            push(scalar)
        elif op == 0x80:  # PROTO
            i += 1
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or marks:
                raise _Malformed("the stack is not a single value at STOP")
            break
        elif op in _DEFER:
            return None  # the unpickler refuses it (find_class / persistent_load) after this same prefix
        elif op in _REFUSED:
            raise InputError(
                f"refusing to load: the pickle builds {_REFUSED[op]}, which memory snapshots never contain"
            )
        else:
            raise _Malformed(f"invalid opcode 0x{op:02x} at byte {i - 1}")
        if objects > max_objects:
            raise LimitExceeded(path, "objects", objects, max_objects)
    else:
        raise InputError(f"{path}: truncated or incomplete snapshot pickle (it ends before its STOP opcode)")
    if i > n:
        raise InputError(f"{path}: truncated or incomplete snapshot pickle (an argument runs past the end)")
    if strbytes > limits.string_bytes:
        raise LimitExceeded(path, "string_bytes", strbytes, limits.string_bytes, " bytes")
    return {"objects": objects, "string_bytes": strbytes, "depth": stack[0][0], "expansion": stack[0][1]}


def _fill(target: list, items: list[list], pairs: bool, path: str, max_depth: int, max_size: int) -> None:
    """Put ``items`` into the container ``target`` (APPEND(S) / SETITEM(S) / DICT / LIST)."""
    if target[3] != (_DICT if pairs else _LIST):
        raise _Malformed("items added to something that is not a " + ("dict" if pairs else "list"))
    if target[2]:
        # Filled after it was referenced: a cycle, or a container that changes after its
        # depth and size were counted into another. c10's pickles never do this.
        raise _Malformed("a container modified after it was referenced (a cycle?)")
    if not items:
        return
    if pairs:
        if len(items) & 1:
            raise _Malformed("a dict item without a value")
        keys = items[0::2]
        if keys.count(_SCALAR) != len(keys):
            raise InputError(
                "refusing to load: a dict key that is a tuple or container, which memory snapshots never contain"
            )
    depth = 1 + max(map(_DEPTH, items))
    if depth > target[0]:
        if depth > max_depth:
            raise LimitExceeded(path, "depth", depth, max_depth)
        target[0] = depth
    target[1] += sum(map(_SIZE, items))
    if target[1] > max_size:
        raise LimitExceeded(path, "expansion", target[1], max_size)


def _container(items: list[list], kind: int, path: str, max_depth: int, max_size: int) -> list:
    depth = 1 + max(map(_DEPTH, items), default=0)
    if depth > max_depth:
        raise LimitExceeded(path, "depth", depth, max_depth)
    size = 1 + sum(map(_SIZE, items))
    if size > max_size:
        raise LimitExceeded(path, "expansion", size, max_size)
    return [depth, size, True, kind]
