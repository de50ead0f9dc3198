"""The trace entries of a snapshot read straight from the pickle's tape into columns.

:mod:`snapviz.load.snapshot.pickle_vm` runs the pickle into arrays without making Python objects;
here the trace entries (a dict per event, ~97% of a big file) become the event columns
with compiled loops, and only the rest of the file (segments, blocks, settings, the
distinct frames) becomes Python objects, which :func:`snapviz.load.snapshot.builder.snapshot_from_dict`
reads as it reads any unpickled snapshot. The result equals the unpickled route's exactly
(``tests/unit/test_columnar.py`` compares every frame on every sample and external file).

This path takes only the shape torch writes: every entry a dict whose action is a string,
addr/size/stream/time_us machine integers, frames a list of frame dicts (or none), metadata
strings or None. Anything else (old layouts, odd types, a frame list split over pickle
batches) raises :class:`Fallback`, and the caller unpickles the file and takes the route
that copes with every layout and says what it had to assume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from snapviz.load.limits import SharedRows
from snapviz.load.snapshot.builder import BlockColumns, snapshot_from_dict
from snapviz.load.snapshot.columnar_segments import annotation_dicts, segments
from snapviz.load.snapshot.columns import NEEDS_ADDR_AND_SIZE, StackInterner, action_code, metadata_str
from snapviz.load.snapshot.pickle_vm import (
    K_DICT,
    K_INT,
    K_LIST,
    K_NONE,
    K_STR,
)
from snapviz.load.snapshot.tape import Tape, run_tape
from snapviz.load.snapshot.tape_read import Fallback, Objects, entry_fields, field_index, group_spans, stack_ids
from snapviz.model import ACTION_CODE, Snapshot

FIELDS = ("action", "addr", "size", "stream", "time_us", "frames", "user_metadata", "compile_context", "device_free")
F_ACTION, F_ADDR, F_SIZE, F_STREAM, F_TIME, F_FRAMES, F_META, F_COMPILE, F_DEVICE_FREE = range(len(FIELDS))


def columnar_snapshot(data: bytes, source: str) -> Callable[[], Snapshot | None] | None:
    """The tape of ``data`` (already through the safety scan) and a function making the
    snapshot from it without ``data``: None from either where this path does not apply (no
    numba, or a shape it leaves to the unpickler)."""
    tape = run_tape(data, 0)
    if tape is None:
        return None

    def finish() -> Snapshot | None:
        try:
            return _build(tape, source)
        except (Fallback, UnicodeDecodeError, RecursionError):
            return None

    return finish


def _build(tape: Tape, source: str) -> Snapshot:
    if tape.root_kind != K_DICT:
        raise Fallback
    m = Objects(tape)
    rows = SharedRows(source)  # counted by container number (negative: never an id() of the dict reader's)
    data: dict[Any, Any] = {}
    traces: tuple[int, int] | None = None
    blocks: BlockColumns | None = None
    root = m.items(tape.root)
    for (kk, kp), (vk, vp) in zip(root[::2], root[1::2], strict=True):
        key = m.value(kk, kp, 0)
        if key == "device_traces":
            traces = (vk, vp)
            data[key] = []
        elif key == "segments":
            data[key], blocks = segments(m, vk, vp, rows)
        elif key == "external_annotations":
            data[key] = annotation_dicts(m, vk, vp, rows)
        else:
            data[key] = m.value(vk, vp, 0)
    if traces is None or traces[0] != K_LIST:
        raise Fallback
    field_of = field_index(tape, FIELDS)
    devices = m.items(traces[1])

    def device_columns(
        interner: StackInterner, sid: Callable[[Any], int], notes: list[str]
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        for dev, (k, c) in enumerate(devices):
            if k == K_NONE:
                continue
            if k != K_LIST:
                raise Fallback
            kinds, ids = m.item_arrays(c)
            if len(ids) == 0:
                continue
            entries = ids[kinds == K_DICT]
            rows.add((-1 - entries).tolist(), len(entries))  # before the columns, as the dict reader
            cols = _device_columns(m, entries, field_of, interner, sid)
            if cols is not None:
                yield dev, cols

    return snapshot_from_dict(data, source, device_columns, blocks, rows)


def _device_columns(
    m: Objects, entries: np.ndarray, field_of: np.ndarray, interner: StackInterner, sid: Callable[[Any], int]
) -> dict[str, np.ndarray] | None:
    """One device's event columns, as :func:`snapviz.load.snapshot.columns.entry_columns` makes them."""
    n = len(entries)
    if n == 0:
        return None
    t = m.tape
    fk, fp = entry_fields(
        entries, t.c_first, t.b_next, t.b_start, t.b_len, t.r_kind, t.r_pay, t.ints, field_of, len(FIELDS)
    )
    if not (fk[F_ACTION] == K_STR).all():
        raise Fallback
    acodes, astr = pd.factorize(fp[F_ACTION])
    names = [m.text(s) for s in astr.tolist()]
    action = np.array([action_code(a) for a in names], np.int8)[acodes]
    for f in (F_ADDR, F_SIZE, F_STREAM, F_TIME):
        if not (fk[f] == K_INT).all():
            _defaults(fk, fp, f, np.array([a in NEEDS_ADDR_AND_SIZE for a in names])[acodes])
    return {
        "time_us": fp[F_TIME],  # views: the model's concatenation copies them
        "action": action,
        "addr": fp[F_ADDR],
        "size": fp[F_SIZE],
        "stream": fp[F_STREAM],
        "stack_id": stack_ids(m, fk[F_FRAMES], fp[F_FRAMES], interner),
        "metadata_id": _interned(m, fk[F_META], fp[F_META], sid),
        "compile_id": _interned(m, fk[F_COMPILE], fp[F_COMPILE], sid),
        "device_free": _device_free(action, fk[F_DEVICE_FREE], fp[F_DEVICE_FREE]),
    }


def _defaults(fk: np.ndarray, fp: np.ndarray, f: int, needs_addr: np.ndarray) -> None:
    """Fill a key some entries lack as the dict reader's careful path does (OOM entries
    have no address: 0; a missing time is -1) where that path would not stop or note it;
    anything else (a value of another type, an allocation without its address) goes to
    that path."""
    absent = fk[f] < 0
    if not ((fk[f] == K_INT) | absent).all() or (f in (F_ADDR, F_SIZE) and (absent & needs_addr).any()):
        raise Fallback
    fp[f][absent] = -1 if f == F_TIME else 0


def _interned(m: Objects, kinds: np.ndarray, pays: np.ndarray, sid: Callable[[Any], int]) -> np.ndarray:
    """String ids of a metadata column, interned in the order their values first occur.
    torch writes a new string object per entry (a 1M-event file: 34k objects for 6 texts),
    so strings are first made one per distinct byte content (compiled)."""
    is_str = kinds == K_STR
    if not (is_str | (kinds == K_NONE) | (kinds < 0)).all():
        raise Fallback
    t = m.tape
    codes, objs = pd.factorize(np.where(is_str, pays, -1))  # string objects, first-seen order
    real = objs >= 0
    off = np.full(len(objs), -1, np.int64)
    off[real] = t.s_off[objs[real]]
    length = np.zeros(len(objs), np.int64)
    length[real] = t.s_len[objs[real]]
    got = group_spans(off, length, t.sbuf)  # by content
    assert got is not None
    texts, first = got
    values = [m.text(s) for s in objs[first].tolist()] + [None]  # a None object: group -1, the last
    ids = np.array([sid(metadata_str(v)) for v in values], np.int32)
    return ids[texts[codes]]


def _device_free(action: np.ndarray, kinds: np.ndarray, pays: np.ndarray) -> np.ndarray:
    if not (action == ACTION_CODE["oom"]).any():
        return np.full(len(action), -1, np.int64)
    if not np.isin(kinds, (K_INT, K_NONE, -1)).all():
        raise Fallback
    return np.where(kinds == K_INT, pays, -1).astype(np.int64)
