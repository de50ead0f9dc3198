"""Segments and blocks read off a pickle's tape for :mod:`snapviz.load.snapshot.columnar`: segments as
dicts of only the keys the snapshot reader looks up, and the blocks straight into the columns
:func:`snapviz.load.snapshot.columns.block_columns` makes, where they are in torch's shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from snapviz.load.limits import SharedRows
from snapviz.load.snapshot.builder import BlockColumns
from snapviz.load.snapshot.columns import MAX_NAME_CHARS, StackInterner
from snapviz.load.snapshot.pickle_vm import K_DICT, K_INT, K_LIST, K_NONE, K_STR
from snapviz.load.snapshot.tape_read import Objects, key_values, stack_ids

# The keys the snapshot reader looks up in segments and blocks (snapviz.load.snapshot.builder,
# snapviz.load.snapshot.columns.block_columns): it reads nothing else from them.
SEG_FIELDS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)
BLOCK_FIELDS = ("address", "size", "requested_size", "state", "frames", "history")
ANNOTATION_FIELDS = ("device", "time_us", "name", "stage")  # what the reader takes from an annotation
_ABSENT = object()


def segments(m: Objects, kind: int, pay: int, rows: SharedRows) -> tuple[Any, BlockColumns | None]:
    """The segments as dicts of only the keys the reader looks up (the same values it would
    get from the unpickled ones), read a field at a time, and where every block is in
    torch's shape, the blocks' columns read straight from the tape (``block_columns``'s
    result, without ~100k block dicts): the second item, None where the blocks are dicts.
    Anything but a list of dicts is made as it is. Segments and blocks are counted in
    ``rows`` (by container number, as negative ids) before any is made."""
    if kind != K_LIST:
        return m.value(kind, pay, 0), None
    kinds, segs = m.item_arrays(pay)
    if not (kinds == K_DICT).all():
        return m.value(kind, pay, 0), None
    rows.add((-1 - segs).tolist(), len(segs))
    sk, sp = key_values(m, segs, SEG_FIELDS)
    f_blocks = SEG_FIELDS.index("blocks")
    per_seg: list[Any] = []
    block_ids: list[np.ndarray] = []
    for k, p in zip(sk[f_blocks].tolist(), sp[f_blocks].tolist(), strict=True):
        items = m.item_arrays(p) if k == K_LIST else None
        if items is not None and (items[0] == K_DICT).all():
            rows.add((-1 - items[1]).tolist(), len(items[1]))
            per_seg.append(len(items[1]))
            block_ids.append(items[1])
        else:  # absent, None or an odd value: made as it is (the reader copes)
            per_seg.append(_ABSENT if k < 0 else m.value(k, p, 1))
    ids = np.concatenate(block_ids) if block_ids else np.empty(0, np.int64)
    bk, bp = key_values(m, ids, BLOCK_FIELDS)
    if all(type(x) is int for x in per_seg):
        fast = _block_columns(m, sk, sp, np.array(per_seg, np.int64), bk, bp)
        if fast is not None:
            keep = [f for f in range(len(SEG_FIELDS)) if f != f_blocks]
            return slim_dicts(m, tuple(SEG_FIELDS[f] for f in keep), sk[keep], sp[keep], {}), fast
    blocks = slim_dicts(m, BLOCK_FIELDS, bk, bp, {})
    it = iter(blocks)
    col = [[next(it) for _ in range(x)] if type(x) is int else x for x in per_seg]
    return slim_dicts(m, SEG_FIELDS, sk, sp, {f_blocks: col}), None


def annotation_dicts(m: Objects, kind: int, pay: int, rows: SharedRows) -> Any:
    """``external_annotations`` as dicts of only the keys the reader looks up, read a field at
    a time (made one by one, 500,000 annotations took 34 s); counted in ``rows`` first.
    Anything but a list of dicts is made as it is."""
    if kind != K_LIST:
        return m.value(kind, pay, 0)
    kinds, ids = m.item_arrays(pay)
    if not (kinds == K_DICT).all():
        return m.value(kind, pay, 0)
    rows.add((-1 - ids).tolist(), len(ids))
    fk, fp = key_values(m, ids, ANNOTATION_FIELDS)
    return slim_dicts(m, ANNOTATION_FIELDS, fk, fp, {})


def _block_columns(
    m: Objects, sk: np.ndarray, sp: np.ndarray, per_seg: np.ndarray, bk: np.ndarray, bp: np.ndarray
) -> BlockColumns | None:
    """:func:`snapviz.load.snapshot.columns.block_columns` from the tape, for blocks in torch's shape
    (int size, address and requested size, a state string, a frame list or none, no pre-2.1
    history); None for anything else, which the dict reader handles."""
    f = {name: i for i, name in enumerate(BLOCK_FIELDS)}
    seg_frames = sk[SEG_FIELDS.index("frames")]
    if (
        not (bk[f["size"]] == K_INT).all()
        or not np.isin(bk[f["address"]], (K_INT, -1)).all()
        or not np.isin(bk[f["requested_size"]], (K_INT, -1)).all()
        or not np.isin(bk[f["state"]], (K_STR, -1)).all()
        or not np.isin(bk[f["frames"]], (K_LIST, K_NONE, -1)).all()
        or not (bk[f["history"]] < 0).all()
        or not np.isin(seg_frames, (K_LIST, K_NONE, -1)).all()
    ):
        return None
    size = bp[f["size"]]
    nseg = len(per_seg)
    seg_col = np.repeat(np.arange(nseg, dtype=np.int64), per_seg)
    first = np.cumsum(per_seg) - per_seg  # each segment's first block
    codes, distinct = pd.factorize(np.where(bk[f["state"]] == K_STR, bp[f["state"]], -1))
    texts = ["inactive" if s < 0 else m.text(s) for s in distinct.tolist()]
    if any(len(x) > MAX_NAME_CHARS for x in texts):
        return None
    texts = ["active_pending_free" if x == "active_awaiting_free" else x for x in texts]
    state = list(map(texts.__getitem__, codes.tolist()))
    # frame lists in the order the dict reader meets them: a segment's, then its blocks'
    walk = np.full(nseg + len(size), -1, np.int64)
    seg_at = first + np.arange(nseg)
    is_seg = np.zeros(len(walk), bool)
    is_seg[seg_at] = True
    walk[seg_at] = np.where(seg_frames == K_LIST, sp[SEG_FIELDS.index("frames")], -1)
    walk[~is_seg] = np.where(bk[f["frames"]] == K_LIST, bp[f["frames"]], -1)

    def columns(
        seg_rows: list[tuple[Any, ...]], seg_frames: list[Any], seg_blocks: list[list[Any]], interner: StackInterner
    ) -> dict[str, Any]:
        base = np.array([r[1] for r in seg_rows], np.int64)
        dev = np.array([r[0] for r in seg_rows], np.int64)
        # addresses default to the segment's base plus the sizes of the blocks before
        run = np.cumsum(size) - size
        default_addr = base[seg_col] + run - run[first[seg_col]]
        addr = np.where(bk[f["address"]] == K_INT, bp[f["address"]], default_addr)
        stack = stack_ids(m, np.where(walk >= 0, K_LIST, -1).astype(np.int8), walk, interner)
        return {
            "segment_stack_id": stack[is_seg].astype(np.int64),
            "segment": seg_col,
            "device": dev[seg_col],
            "address": addr,
            "size": size,
            "requested_size": np.where(bk[f["requested_size"]] == K_INT, bp[f["requested_size"]], size),
            "state": state,
            "stack_id": stack[~is_seg].astype(np.int64),
        }

    return columns


def slim_dicts(
    m: Objects, names: tuple[str, ...], fk: np.ndarray, fp: np.ndarray, given: dict[int, list[Any]]
) -> list[dict[str, Any]]:
    """One dict per column of ``fk``/``fp`` holding the keys in ``names`` that the original
    has, with its values (``given``: whole columns made by the caller, _ABSENT where absent)."""
    cols: list[list[Any]] = []
    for f in range(len(names)):
        kinds, pays = fk[f], fp[f]
        if f in given:
            cols.append(given[f])
        elif (kinds == K_INT).all():
            cols.append(pays.tolist())  # the fields kernel gives an INT's value
        elif (kinds == K_STR).all():
            codes, distinct = pd.factorize(pays)
            cols.append(list(map([m.text(s) for s in distinct.tolist()].__getitem__, codes.tolist())))
        else:
            cols.append(
                [_ABSENT if k < 0 else m.value(k, p, 1) for k, p in zip(kinds.tolist(), pays.tolist(), strict=True)]
            )
    if (fk >= 0).all():
        return [dict(zip(names, row, strict=True)) for row in zip(*cols, strict=True)]
    return [{k: v for k, v in zip(names, row, strict=True) if v is not _ABSENT} for row in zip(*cols, strict=True)]
