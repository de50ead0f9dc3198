"""Untrusted snapshot values to columns: the interning of frames and strings, the coercion of
every value a hostile file could hold (huge ints, nested names, wrong types) and the one pass
from the unpickled trace entries to the event columns. :mod:`snapviz.load.snapshot.builder` builds the
model from these."""

from __future__ import annotations

import reprlib
from itertools import repeat
from operator import itemgetter
from typing import Any, cast

import numpy as np
import pandas as pd

from snapviz.interning import Interner
from snapviz.load.limits import ENV, Limits
from snapviz.model import A_OTHER, ACTION_CODE
from snapviz.safe_text import clip

# The frame that stands for the frames past SNAPVIZ_MAX_INPUT_FRAMES (name, file, line).
FRAMES_BEYOND = ("<frames beyond limit>", "", 0)


def frames_note(limit: int) -> str:
    """The warning for a snapshot whose distinct frames went past the bound."""
    return (
        f"more than {limit:,} distinct stack frames: frames met after the first {limit:,} are grouped as "
        f"'{FRAMES_BEYOND[0]}' ({ENV['frames']}={limit:,}; docs/security.md)"
    )


class StackInterner:
    """Frames and stacks interned once. Frame lists, and the frame dicts in them, are shared
    objects in the pickle (c10 symbolizes each distinct frame once), so stacks and frames are
    first looked up by identity (cheap) and only then by value. At most ``max_frames`` distinct
    frames (SNAPVIZ_MAX_INPUT_FRAMES) are interned, in order of first appearance; every frame
    object met after them is the one :data:`FRAMES_BEYOND` (docs/security.md, "Limits")."""

    def __init__(self, max_frames: int | None = None) -> None:
        self.by_identity: dict[int, int] = {}
        self.frame_by_identity: dict[int, int] = {}
        self.keep_alive: list[Any] = []
        self.frames: Interner[tuple[str, str, int]] = Interner()
        self.stack_codes: Interner[tuple[int, ...]] = Interner()
        self.max_frames = max(Limits.from_env().frames if max_frames is None else max_frames, 1)
        self.beyond = -1  # the id of FRAMES_BEYOND once a frame past max_frames was met

    @property
    def full(self) -> bool:
        """Whether ``max_frames`` distinct frames were interned: a frame object not met yet is
        then :data:`FRAMES_BEYOND`, without reading it (:meth:`beyond_id`)."""
        return self.beyond >= 0 or len(self.frames) >= self.max_frames

    def beyond_id(self) -> int:
        """The id of :data:`FRAMES_BEYOND`, the one frame that stands for every frame object met
        after ``max_frames`` distinct ones. Nothing is remembered per such object: a hostile file
        of 15M distinct frames would cost ~250 bytes and ~10-40 µs each (docs/security.md)."""
        if self.beyond < 0:
            self.beyond = self.frames(FRAMES_BEYOND)
        return self.beyond

    @property
    def frame_rows(self) -> list[tuple[str, str, int]]:
        """The distinct frames (name, filename, line), in frame-id order."""
        return self.frames.values

    @property
    def stacks(self) -> list[tuple[int, ...]]:
        """The distinct stacks (tuples of frame ids), in stack-id order."""
        return self.stack_codes.values

    def frame_id(self, fr: Any) -> int:
        """The frame's id by value (-1: not a frame dict, skipped), remembered by identity; past
        ``max_frames`` distinct frames, a frame dict not met yet is :data:`FRAMES_BEYOND`."""
        fid = self.frame_by_identity.get(id(fr))
        if fid is not None:  # met earlier in the list being interned
            return fid
        fid = -1
        if self.full and isinstance(fr, dict):
            return self.beyond_id()
        if isinstance(fr, dict):
            fv = (bounded_name(fr.get("name", "?")), bounded_name(fr.get("filename", "")), int(fr.get("line", 0) or 0))
            fid = self.frames(fv)
        self.frame_by_identity[id(fr)] = fid  # alive as long as its list, kept below
        return fid

    def stack_id(self, frames: Any) -> int:
        if not frames:
            return -1
        key = id(frames)
        sid = self.by_identity.get(key)
        if sid is not None:
            return sid
        known = list(map(self.frame_by_identity.get, map(id, frames)))
        # frame objects not seen before are interned by value, in order (ids stay first-seen)
        if None in known and self.full:  # every new frame object is the one beyond the bound
            b, one = self.beyond_id(), self.frame_id
            ids: list[int]
            if set(map(type, frames)) == {dict}:  # C-level: None -> b, an id stays itself
                beyond: dict[int | None, int] = {None: b}
                ids = cast(list[int], list(map(beyond.get, known, known)))
            else:
                ids = [
                    i if i is not None else b if type(fr) is dict else one(fr)
                    for fr, i in zip(frames, known, strict=True)
                ]
        elif None in known:
            ids = [self.frame_id(fr) if i is None else i for fr, i in zip(frames, known, strict=True)]
        else:
            ids = cast(list[int], known)
        sid = self.stack_of(tuple(i for i in ids if i >= 0) if -1 in ids else tuple(ids))
        self.by_identity[key] = sid
        self.keep_alive.append(frames)  # ids stay unique only while the object lives
        return sid

    def stack_of(self, frame_ids: tuple[int, ...]) -> int:
        """The id of the stack of these frames, a new one where no stack had them yet."""
        return self.stack_codes(frame_ids)

    def stack_ids(self, lists: list[Any]) -> list[int]:
        """:meth:`stack_id` of many distinct frame lists. torch writes one list object per
        trace entry (two entries in three hold a list of their own), so a 1M-event file holds
        ~660k lists over a few hundred stacks: walking every list by value costs ~9 s. Lists
        are bucketed by length and their first frames' identities, and a list equal (C-level
        ``==``, identical elements compare in a pointer test) to a bucket's representative
        takes its stack; only a list equal to none is interned by value. Exact: only lists of
        plain frames (str name and filename) represent a bucket, and a list equal to one of
        those has the same names, files and lines, so the same stack."""
        out: list[int] = []
        buckets: dict[tuple[int, ...], list[tuple[list[Any], int]]] = {}
        app, one = out.append, self.stack_id
        for fl in lists:
            if type(fl) is not list or not fl:
                app(one(fl))
                continue
            key = (len(fl), *map(id, fl[:4]))
            reps = buckets.get(key)
            if reps is None:
                sid = one(fl)
                if _plain_frames(fl):
                    buckets[key] = [(fl, sid)]
            elif reps[0][0] == fl:  # the last list matched in this bucket: the common case
                sid = reps[0][1]
            else:
                j = next((j for j, (rep, _) in enumerate(reps) if rep == fl), -1)
                if j >= 0:
                    reps[0], reps[j] = reps[j], reps[0]  # move to front
                    sid = reps[0][1]
                else:
                    sid = one(fl)
                    if _plain_frames(fl):
                        reps.insert(0, (fl, sid))
            app(sid)
        return out


def _plain_frames(frames: list[Any]) -> bool:
    """Every frame a dict whose name and filename are str, as torch writes them: a list equal
    to this one then names the same frames (``1 == 1.0`` cannot turn into another name)."""
    if not frames:
        return True
    if set(map(type, frames)) != {dict}:  # C-level passes: a hostile file holds millions of frames
        return False
    return {
        *map(type, map(dict.get, frames, repeat("name"))),
        *map(type, map(dict.get, frames, repeat("filename"))),
    } == {str}


def _block_frames(block: dict[str, Any]) -> Any:
    fr = block.get("frames")
    if fr:
        return fr
    hist = block.get("history")  # pre-2.1: [{"real_size", "frames"?}, ...]
    # FIX: c10 prepends to the history chain, so history[0] is the current allocation
    # (torch/cuda/_memory_viz.py::_block_extra_legacy reads [0] too).
    if isinstance(hist, list) and hist and isinstance(hist[0], dict):
        return hist[0].get("frames")
    return None


def _block_requested(block: dict[str, Any], size: int) -> int:
    if "requested_size" in block:
        return as_int(block.get("requested_size"), size)
    hist = block.get("history")  # FIX: pre-2.1 blocks keep the request as history[0]["real_size"]
    if isinstance(hist, list) and hist and isinstance(hist[0], dict) and "real_size" in hist[0]:
        return as_int(hist[0].get("real_size"), size)
    return size


def block_columns(
    seg_rows: list[tuple[Any, ...]], seg_frames: list[Any], seg_blocks: list[list[Any]], interner: StackInterner
) -> dict[str, Any]:
    """The blocks of every segment as columns, plus ``segment_stack_id`` (one per segment).

    Each block's values are read once with the common types tested inline (the helpers run
    only for an odd value); stacks are interned in bulk, in the order a walk of the file
    meets them (a segment's frames, then its blocks'), so their ids are numbered as before.
    """
    frames: list[Any] = []
    seg_at: list[int] = []
    seg_col: list[int] = []
    dev_col: list[int] = []
    addr_col: list[int] = []
    size_col: list[int] = []
    req_col: list[int] = []
    state_col: list[str] = []
    for k, (row, sfr, blocks) in enumerate(zip(seg_rows, seg_frames, seg_blocks, strict=True)):
        dev, baddr = row[0], row[1]
        seg_at.append(len(frames))
        frames.append(sfr)
        for b in blocks:
            if type(b) is not dict:
                continue
            get = b.get
            size = get("size", 0)
            if type(size) is not int:
                size = as_int(size)
            addr = get("address", baddr)
            req = get("requested_size")
            state = get("state", "inactive")
            if type(state) is not str or len(state) > MAX_NAME_CHARS:
                state = value_text(state)
            seg_col.append(k)
            dev_col.append(dev)
            addr_col.append(addr if type(addr) is int else as_int(addr))
            size_col.append(size)
            req_col.append(req if type(req) is int else _block_requested(b, size))
            # the docstring's spelling of the C++ state
            state_col.append("active_pending_free" if state == "active_awaiting_free" else state)
            frames.append(get("frames") or _block_frames(b))
            baddr += size
    codes, distinct = _factorize(frames, by_value=False)
    stack = np.array(interner.stack_ids(distinct), dtype=np.int64)[codes] if frames else np.empty(0, np.int64)
    is_seg = np.zeros(len(frames), bool)
    is_seg[seg_at] = True
    return {
        "segment_stack_id": stack[is_seg],
        "segment": seg_col,
        "device": dev_col,
        "address": addr_col,
        "size": size_col,
        "requested_size": req_col,
        "state": state_col,
        "stack_id": stack[~is_seg],
    }


ADDRESS_LIMIT = 1 << 62  # no allocator hands out sizes or addresses at or above 2**62
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxstring, _REPR.maxother = 3, 16, 16, 16, 1000, 200


def value_text(v: Any) -> str:
    """A file value as text without walking it: strings as they are, scalars by ``str``,
    containers by a depth- and length-bounded repr (a list shared a billion times over
    must not turn into gigabytes of text)."""
    if type(v) is str:
        return v
    if v is None or isinstance(v, (bool, int, float)):
        try:
            return str(v)
        except ValueError:  # an int of more than 4300 digits
            return "<int>"
    return _REPR.repr(v) if isinstance(v, (dict, list, tuple)) else f"<{type(v).__name__}>"


# Names in frames, labels and annotations: the longest in any real file seen is about 2 KB.
# Longer ones are cut here, once, so no later step hashes, copies or prints megabytes per row.
MAX_NAME_CHARS = 4096


def bounded_name(v: Any) -> str:
    """:func:`value_text`, cut to :data:`MAX_NAME_CHARS` with the full length stated."""
    t = value_text(v)
    return clip(t, MAX_NAME_CHARS)


def as_int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def settings_dict(v: Any) -> dict[str, Any]:
    """allocator_settings with scalar values kept and anything nested shown as bounded text
    (it reaches every report; a shared, deeply nested value must not)."""
    if not isinstance(v, dict):
        return {}
    return {value_text(k): _flat(x) for k, x in list(v.items())[:200]}


_SCALARS = (str, int, float, bool, type(None))


def _flat(x: Any) -> Any:
    """A scalar, or a dict/list of at most 1000 scalars (e.g. roundup_power2_divisions), kept
    as a copy; anything deeper becomes bounded text."""
    if type(x) in _SCALARS:
        return x
    if type(x) is dict and len(x) <= 1000 and all(type(k) in _SCALARS and type(y) in _SCALARS for k, y in x.items()):
        return dict(x)
    if type(x) in (list, tuple) and len(x) <= 1000 and all(type(y) in _SCALARS for y in x):
        return list(x)
    return value_text(x)


def pool_str(v: Any) -> str:
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return f"{as_int(v[0])},{as_int(v[1])}"
    return "0,0"


_FAST_KEYS = ("action", "addr", "size", "stream", "time_us")


def action_code(a: Any, missing: int | None = None) -> int:
    if type(a) is not str:
        if a is None and missing is not None:
            return missing
        raise TypeError(f"a trace action that is not a string ({value_text(a)[:40]})")
    return ACTION_CODE.get(a, A_OTHER)


def metadata_str(v: Any) -> str:
    """user_metadata is a str up to 2.13; newer torch may stamp dicts (unhashable)."""
    return ("" if v is None else bounded_name(v)) if type(v) is not str or len(v) > MAX_NAME_CHARS else v


# Entries the replay cannot do without: an allocation or free with no address or size
# would silently become a 0-byte event and every figure after it would be wrong.
NEEDS_ADDR_AND_SIZE = frozenset(a for a in ACTION_CODE if a not in ("oom", "snapshot", "other"))


def _require_replay_keys(entries: list[dict[str, Any]]) -> None:
    """Raise ValueError (an input error, exit 2) for an entry the replay cannot use."""
    for i, e in enumerate(entries):
        act = e.get("action")
        if act is None:
            raise ValueError(f"trace entry {i} has no 'action'")
        if act in NEEDS_ADDR_AND_SIZE:
            for key in ("addr", "size"):
                if e.get(key) is None:
                    raise ValueError(f"trace entry {i} ({act!r}) has no {key!r}")


def _first_positions(codes: np.ndarray) -> np.ndarray:
    """Where each code first occurs, for codes numbered in order of first appearance (as
    ``pd.factorize`` numbers them): the places where the running maximum grows. O(n), no sort."""
    if not len(codes):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)


_STR_OR_NONE = frozenset((str, type(None)))


def _factorize(values: list[Any], by_value: bool = True) -> tuple[np.ndarray, list[Any]]:
    """Codes (first-seen order) and the distinct values of one column of untrusted values.

    Strings (and None) are factorized by value in one C-level dict pass. Anything else is
    factorized by object identity (pickle memoizes repeated values), so nothing from the file
    but a string is ever hashed: a deeply nested tuple cannot overflow the C stack.
    ``by_value=False`` skips the type test for columns that hold containers (frame lists).
    """
    n = len(values)
    if values.count(None) == n:  # a key no entry has (compile_context, mostly): one C-level pass
        return np.zeros(n, np.int64), [None] if n else []
    if by_value and set(map(type, values)) <= _STR_OR_NONE:
        index = dict.fromkeys(values)
        for i, k in enumerate(index):
            index[k] = i
        return np.fromiter(map(index.__getitem__, values), np.int64, n), list(index)
    codes, _ = pd.factorize(np.fromiter(map(id, values), np.int64, n))
    return codes, [values[j] for j in _first_positions(codes).tolist()]


def entry_columns(
    entries: list[dict[str, Any]], interner: StackInterner, sid: Any, notes: list[str]
) -> dict[str, np.ndarray]:
    """Columns of one device's trace entries.

    The fast path pulls the keys every modern entry has with one C-level ``itemgetter``
    pass; the rest (action, frames, metadata) are factorized (:func:`_factorize`) so each
    distinct value is interpreted once. Entries missing a key (OOM entries, old torch) take
    the slow path.
    """
    n = len(entries)
    get = dict.get
    try:
        acodes, acts = _factorize(list(map(get, entries, repeat("action"))))
        action = np.array([action_code(a) for a in acts], dtype=np.int8)[acodes] if n else np.empty(0, np.int8)
        del acodes
        addr_v, size_v = list(map(itemgetter("addr"), entries)), list(map(itemgetter("size"), entries))
        if not set(map(type, addr_v)) | set(map(type, size_v)) <= {int}:
            raise TypeError("a size or address that is not an integer")  # the slow path notes it
        addr_a = np.fromiter(addr_v, np.int64, n)
        size_a = np.fromiter(size_v, np.int64, n)
        del addr_v, size_v
        stream_a = np.fromiter(map(itemgetter("stream"), entries), np.int64, n)
        time_a = np.fromiter(map(itemgetter("time_us"), entries), np.int64, n)
    except (KeyError, TypeError, ValueError, OverflowError):
        _require_replay_keys(entries)
        action = np.fromiter((action_code(e.get("action"), A_OTHER) for e in entries), np.int8, n)
        addr_a = np.fromiter((as_int(e.get("addr", 0)) for e in entries), np.int64, n)
        size_a = np.fromiter((as_int(e.get("size", 0)) for e in entries), np.int64, n)
        odd = sum(1 for e in entries for k in ("addr", "size") if k in e and type(e[k]) is not int)
        if odd:
            notes.append(
                f"{odd:,} trace sizes/addresses are not integers (bool, float, text or missing): read as integers"
            )
        stream_a = np.fromiter((as_int(e.get("stream", 0)) for e in entries), np.int64, n)
        time_a = np.fromiter((as_int(e.get("time_us", -1), -1) for e in entries), np.int64, n)
    # Frames: lists are factorized by identity (map over dict.get with repeated arguments
    # stays in C), then each distinct list is interned by the interner's bulk path.
    fcodes, flists = _factorize(list(map(get, entries, repeat("frames"))), by_value=False)
    stack_id = np.array(interner.stack_ids(flists), dtype=np.int32)[fcodes] if n else np.empty(0, np.int32)
    del fcodes, flists

    def interned(key: str) -> np.ndarray:
        codes, distinct = _factorize(list(map(get, entries, repeat(key))))
        ids = np.array([sid(metadata_str(v)) for v in distinct], dtype=np.int32)
        return ids[codes] if n else np.empty(0, np.int32)

    device_free = (
        np.fromiter((as_int(get(e, "device_free", -1), -1) for e in entries), np.int64, n)
        if (action == ACTION_CODE["oom"]).any()
        else np.full(n, -1, np.int64)
    )
    return {
        "time_us": time_a,
        "action": action,
        "addr": addr_a,
        "size": size_a,
        "stream": stream_a,
        "stack_id": stack_id,
        "metadata_id": interned("user_metadata"),
        "compile_id": interned("compile_context"),
        "device_free": device_free,
    }
