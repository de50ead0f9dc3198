"""Reading values off a pickle's tape (:mod:`snapviz.load.snapshot.pickle_vm`): Python objects for the
few values that need to be objects (each container made once, shared as in the file), the
values of named keys across many dicts at once, and the grouping of frame lists and strings
by content, compiled. :mod:`snapviz.load.snapshot.columnar` builds the snapshot with these."""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from snapviz.compiled import kernel
from snapviz.load.snapshot.columns import StackInterner
from snapviz.load.snapshot.pickle_vm import (
    K_BIG,
    K_DICT,
    K_FALSE,
    K_FLOAT,
    K_INT,
    K_LIST,
    K_NONE,
    K_STR,
    K_TRUE,
    K_TUPLE,
    OK,
)
from snapviz.load.snapshot.tape import Tape

MAX_KEY_STRINGS = 100_000  # more distinct key strings than this: keys are not memoized, not torch's layout
MAX_DEPTH = 64  # values nested deeper than this (outside the entries) go the unpickler's way


class Fallback(Exception):
    """The file is not in the shape this path reads: unpickle it instead."""


def field_index(tape: Tape, names: tuple[str, ...]) -> np.ndarray:
    """Per string: the index in ``names`` of the dict key it spells (-1: another string)."""
    keys = np.flatnonzero(tape.s_key)
    if len(keys) > MAX_KEY_STRINGS:
        raise Fallback
    out = np.full(len(tape.s_key), -1, np.int8)
    pos = {f: i for i, f in enumerate(names)}
    for s in keys.tolist():
        out[s] = pos.get(tape.text(s), -1)
    return out


def key_values(m: Objects, ids: np.ndarray, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    t = m.tape
    return entry_fields(
        ids, t.c_first, t.b_next, t.b_start, t.b_len, t.r_kind, t.r_pay, t.ints, field_index(t, names), len(names)
    )


def group_spans(
    off: np.ndarray, length: np.ndarray, data: np.ndarray, kinds: np.ndarray | None = None, need: int = -1
) -> tuple[np.ndarray, np.ndarray] | None:
    """Spans ``data[off:off + length]`` grouped by content (compiled hash and compare): the
    group of each span in the order groups first occur (-1 where ``off`` < 0) and each
    group's first span. None where ``need`` >= 0 and an item's kind in ``kinds`` is not it."""
    status, gcode, first = _groups_compiled(off, length, data, np.empty(0, np.int8) if kinds is None else kinds, need)
    return None if status != OK else (gcode, first)


def stack_ids(m: Objects, kinds: np.ndarray, pays: np.ndarray, interner: StackInterner) -> np.ndarray:
    """Stack ids of the entries' frame lists: lists holding the same frame objects are one
    group, and each group's first list is interned by value in the order the groups first
    occur, as the interner would meet them one by one. A frame list over more than one
    pickle batch, or holding anything but frame dicts, is left to the dict reader."""
    if not (np.isin(kinds, (K_LIST, K_NONE)) | (kinds < 0)).all():
        raise Fallback
    t = m.tape
    lists = np.where(kinds == K_LIST, pays, -1)
    b = np.full(len(lists), -1, np.int64)
    b[lists >= 0] = t.c_first[lists[lists >= 0]]
    has = b >= 0  # an empty list has no batch: no stack
    if (t.b_next[b[has]] >= 0).any():
        raise Fallback
    off = np.full(len(lists), -1, np.int64)
    off[has] = t.b_start[b[has]]
    length = np.zeros(len(lists), np.int64)
    length[has] = t.b_len[b[has]]
    got = group_spans(off, length, t.r_pay, t.r_kind, K_DICT)
    if got is None:
        raise Fallback
    gcode, first = got
    reps = lists[first].tolist()
    sids = np.array([interner.stack_of(m.frame_ids(interner, c)) for c in reps] + [-1], np.int32)
    return sids[gcode]  # gcode -1 (no frames): the appended -1


class Objects:
    """Python objects for values of the tape, each container made once (shared as in the file)."""

    def __init__(self, tape: Tape) -> None:
        self.tape = tape
        self._made: dict[int, Any] = {}
        self._texts: dict[int, str] = {}
        self._frame_ids: dict[int, int] = {}

    def text(self, s: int) -> str:
        v = self._texts.get(s)
        if v is None:
            v = self._texts[s] = self.tape.text(s)
        return v

    def item_arrays(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Kinds and payloads of container ``c``'s rows, in order."""
        t = self.tape
        parts = t.batches(c)
        if len(parts) == 1:
            (a, k) = parts[0]
            return t.r_kind[a : a + k], t.r_pay[a : a + k]
        if not parts:
            return np.empty(0, np.int8), np.empty(0, np.int64)
        return (
            np.concatenate([t.r_kind[a : a + k] for a, k in parts]),
            np.concatenate([t.r_pay[a : a + k] for a, k in parts]),
        )

    def items(self, c: int) -> list[tuple[int, int]]:
        kinds, pays = self.item_arrays(c)
        return list(zip(kinds.tolist(), pays.tolist(), strict=True))

    def value(self, kind: int, pay: int, depth: int) -> Any:
        if kind == K_STR:
            return self.text(pay)
        if kind == K_INT:
            return int(self.tape.ints[pay])
        if kind == K_NONE:
            return None
        if kind == K_TRUE or kind == K_FALSE:
            return kind == K_TRUE
        if kind == K_FLOAT:
            return struct.unpack(">d", struct.pack(">q", int(self.tape.ints[pay])))[0]
        if kind == K_BIG:
            return int.from_bytes(self.tape.raw(pay), "little", signed=True)
        made = self._made.get(pay)
        if made is not None:
            return made
        if depth > MAX_DEPTH:
            raise Fallback
        kinds, pays = self.item_arrays(pay)
        if kind == K_TUPLE:
            made = self._made[pay] = tuple(self._values(kinds, pays, depth))
        elif kind == K_LIST:
            made = self._made[pay] = []  # made before its items: a list may hold itself
            made.extend(self._values(kinds, pays, depth))
        else:
            made = self._made[pay] = {}
            vals = self._values(kinds, pays, depth)
            made.update(zip(vals[::2], vals[1::2], strict=True))  # a key set twice keeps its last value
        return made

    def _values(self, kinds: np.ndarray, pays: np.ndarray, depth: int) -> list[Any]:
        """The values of a container's rows. A frame list (all dicts made already, the
        common case once the entries' frames are read) is one C-level lookup."""
        pl = pays.tolist()
        if len(pl) > 1 and (kinds == K_DICT).all():
            got = list(map(self._made.get, pl))
            if got.count(None) == 0:
                return got
        texts, made, ints = self._texts, self._made, self.tape.ints
        out = []
        for k, p in zip(kinds.tolist(), pl, strict=True):
            v = texts.get(p) if k == K_STR else (int(ints[p]) if k == K_INT else made.get(p) if k >= K_LIST else None)
            out.append(self.value(k, p, depth + 1) if v is None else v)
        return out

    def frame_ids(self, interner: StackInterner, c: int) -> tuple[int, ...]:
        """The frame ids of frame list ``c`` (every item a frame dict: the grouping checked)."""
        pays = self.item_arrays(c)[1].tolist()
        known = list(map(self._frame_ids.get, pays))
        if None not in known:
            return tuple(cast(list[int], known))
        if interner.full:
            # past SNAPVIZ_MAX_INPUT_FRAMES a new frame is neither made (a dict, ~40 µs) nor remembered
            b = interner.beyond_id()
            return tuple(b if i is None else i for i in known)
        out = []
        for f in pays:
            fid = self._frame_ids.get(f)
            if fid is None and interner.full:  # the bound reached inside this list
                fid = interner.beyond_id()
            elif fid is None:
                # the frame object stays alive in self._made: the interner remembers it by identity
                fid = self._frame_ids[f] = interner.frame_id(self.value(K_DICT, f, 0))
            out.append(fid)
        return tuple(out)


def compiled() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The two compiled loops (fields of many dicts, spans grouped by content); None without numba."""
    fields, group = FIELDS.compiled(), GROUPS.compiled()
    return None if fields is None or group is None else (fields, group)


def entry_fields(*args: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_fields_py` compiled (the ``tape_fields`` kernel)."""
    fields = FIELDS.compiled()
    assert fields is not None  # the tape exists, so numba does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out: tuple[np.ndarray, np.ndarray] = fields(*args)
    return out


def _groups_compiled(*args: Any) -> tuple[int, np.ndarray, np.ndarray]:
    """:func:`_group_spans_py` compiled (the ``tape_groups`` kernel)."""
    group = GROUPS.compiled()
    assert group is not None  # the tape exists, so numba does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out: tuple[int, np.ndarray, np.ndarray] = group(*args)
    return out


def _fields_py(
    entries: np.ndarray,
    c_first: np.ndarray,
    b_next: np.ndarray,
    b_start: np.ndarray,
    b_len: np.ndarray,
    r_kind: np.ndarray,
    r_pay: np.ndarray,
    ints: np.ndarray,
    field_of: np.ndarray,
    nf: int,
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Per field and entry, the kind (-1: absent) and payload of the entry dict's value for
    that key (an INT's payload: its value); a key set twice keeps its last value, as the
    unpickler's dict does."""
    n = len(entries)
    fk = np.full((nf, n), -1, np.int8)
    fp = np.zeros((nf, n), np.int64)
    for e in range(n):
        b = c_first[entries[e]]
        while b >= 0:
            for j in range(b_start[b], b_start[b] + b_len[b], 2):
                if r_kind[j] == K_STR:
                    f = field_of[r_pay[j]]
                    if f >= 0:
                        k = r_kind[j + 1]
                        fk[f, e] = k
                        fp[f, e] = ints[r_pay[j + 1]] if k == K_INT else r_pay[j + 1]
            b = b_next[b]
    return fk, fp


def _group_spans_py(
    off: np.ndarray, length: np.ndarray, data: np.ndarray, kinds: np.ndarray, need: int
) -> tuple[int, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """See :func:`group_spans`: (status, group per span, first span of each group)."""
    n = len(off)
    gcode = np.full(n, -1, np.int64)
    cap = 1024
    while cap < 4 * n:
        cap *= 2
    table = np.full(cap, -1, np.int64)  # group ids, open addressing on the content's hash
    g_hash = np.empty(n, np.uint64)
    g_first = np.empty(n, np.int64)
    ng = 0
    for e in range(n):
        lo = off[e]
        if lo < 0:
            continue
        k = length[e]
        h = np.uint64(k) * np.uint64(0x9E3779B97F4A7C15)
        for j in range(lo, lo + k):
            if need >= 0 and kinds[j] != need:
                return 1, gcode, g_first[:0]
            h = (h ^ np.uint64(data[j])) * np.uint64(0x100000001B3)
        slot = np.int64(h & np.uint64(cap - 1))
        while True:
            g = table[slot]
            if g < 0:
                table[slot] = ng
                g_hash[ng] = h
                g_first[ng] = e
                gcode[e] = ng
                ng += 1
                break
            if g_hash[g] == h and length[g_first[g]] == k:
                rlo = off[g_first[g]]
                same = True
                for j in range(k):
                    if data[rlo + j] != data[lo + j]:
                        same = False
                        break
                if same:
                    gcode[e] = g
                    break
            slot = (slot + 1) & (cap - 1)
    return 0, gcode, g_first[:ng]


# The tape's loops run wherever the tape does (from ``pickle_tape`` bytes on); their references
# are their own code run by Python.
FIELDS = kernel(
    _fields_py, name="tape_fields", reference=_fields_py, compiled_path=entry_fields, min_size="pickle_tape"
)
GROUPS = kernel(
    _group_spans_py,
    name="tape_groups",
    reference=_group_spans_py,
    compiled_path=_groups_compiled,
    min_size="pickle_tape",
)
