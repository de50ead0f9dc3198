"""Turn a snapshot dict (any torch 2.x layout) into the columnar :class:`Snapshot`.

Tolerates schema drift: missing ``frames``/``addr``/``time_us``/``user_metadata``,
unknown keys, ``active_pending_free``/``active_awaiting_free``, ``pool_id``, OOM
entries with ``device_free``, the legacy list-of-segments layout and pre-2.1 blocks
that keep their stack under ``history``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.interning import Interner
from snapviz.load.limits import SharedRows
from snapviz.load.snapshot.columns import (
    ADDRESS_LIMIT,
    MAX_NAME_CHARS,
    StackInterner,
    as_int,
    block_columns,
    bounded_name,
    entry_columns,
    frames_note,
    pool_str,
    settings_dict,
    value_text,
)
from snapviz.model import Snapshot
from snapviz.safe_text import clip


def _check_range(source: str, where: str, addr: np.ndarray, size: np.ndarray) -> None:
    """Sizes and addresses an allocator can produce: 0 <= v < 2**62. Anything else is a
    corrupt or hostile file; sums of such values would wrap around in int64 silently."""
    for name, col in (("address", addr), ("size", size)):
        bad = np.flatnonzero((col < 0) | (col >= ADDRESS_LIMIT))
        if len(bad):
            raise InputError(
                f"{source}: {where}[{int(bad[0])}] has {name} {int(col[bad[0]]):,}, outside what an "
                f"allocator can produce (0 to 2**62); {len(bad):,} such values"
            )


# Per-device event columns given the interner, the string interning function and the notes:
# the unpickled entries' by default, or read from the pickle's tape (snapviz.load.snapshot.columnar).
DeviceColumns = Callable[[StackInterner, Callable[[Any], int], list[str]], Iterable[tuple[int, dict[str, np.ndarray]]]]


def _dict_device_columns(
    traces_raw: list[Any],
    source: str,
    rows: SharedRows,
    interner: StackInterner,
    sid: Callable[[Any], int],
    notes: list[str],
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """The columns of each device's unpickled trace entries (devices with none skipped)."""
    for dev, entries in enumerate(traces_raw):
        if not entries:
            continue
        if not isinstance(entries, list):
            raise InputError(f"{source}: malformed snapshot (device_traces[{dev}] is not a list)")
        if set(map(type, entries)) != {dict}:  # one C-level pass; a copy only when needed
            entries = [e for e in entries if isinstance(e, dict)]
        rows.add(map(id, entries), len(entries))  # before the columns: shared entries are refused
        if entries:
            yield dev, entry_columns(entries, interner, sid, notes)


def _add_dicts(rows: SharedRows, items: list[Any]) -> None:
    """Count the dicts of ``items`` (the rows the reader builds; it skips anything else)."""
    ids = [id(x) for x in items if type(x) is dict]
    rows.add(ids, len(ids))


# The blocks' columns given the segment rows, frames and block lists and the interner:
# block_columns by default, or read from the pickle's tape (snapviz.load.snapshot.columnar).
BlockColumns = Callable[[list[tuple[Any, ...]], list[Any], list[list[Any]], StackInterner], dict[str, Any]]


def snapshot_from_dict(
    data: Any,
    source: str,
    device_columns: DeviceColumns | None = None,
    blocks: BlockColumns | None = None,
    rows: SharedRows | None = None,
) -> Snapshot:
    """Build the model from an unpickled object. Raises InputError if it is not a snapshot.
    ``device_columns``, ``blocks``: the trace entries' and the blocks' columns where they
    were read already (the ``device_traces`` and the segments' blocks in ``data`` are then
    not read). ``rows``: the shared-row count those were checked against, if they were."""
    # FIX (tests/unit/test_safe_load.py): hostile or corrupt values (an address beyond 64 bits,
    # a frame name nested 100k deep, a list where a string belongs) crashed with
    # OverflowError / RecursionError / TypeError; they are input errors (exit 2).
    try:
        return _snapshot_from_dict(data, source, device_columns, blocks, rows or SharedRows(source))
    except InputError:
        raise
    except (OverflowError, RecursionError, MemoryError, TypeError, ValueError, RuntimeError) as exc:
        detail = clip((str(exc).splitlines() or [""])[0], 200) or type(exc).__name__
        raise InputError(f"{source}: malformed snapshot ({type(exc).__name__}: {detail})") from None


def _snapshot_from_dict(
    data: Any, source: str, device_columns: DeviceColumns | None, blocks_fn: BlockColumns | None, rows: SharedRows
) -> Snapshot:
    notes: list[str] = []
    if isinstance(data, list):
        if data and not all(isinstance(s, dict) and "blocks" in s for s in data[:50]):
            raise InputError(
                f"{source}: a valid pickle, but not a CUDA memory snapshot (a list that is not a list of segments)"
            )
        data = {"segments": data, "device_traces": []}
        notes.append("legacy layout (list of segments): no trace history, end state only")
    if not isinstance(data, dict):
        raise InputError(
            f"{source}: a valid pickle, but not a CUDA memory snapshot (top level is {type(data).__name__})"
        )
    if "segments" not in data and "device_traces" not in data:
        keys = ", ".join(sorted(map(value_text, list(data.keys())[:50]))[:6]) or "no keys"
        raise InputError(f"{source}: a valid pickle, but not a CUDA memory snapshot (keys: {keys})")
    segments_raw = data.get("segments") or []
    traces_raw = data.get("device_traces")
    if traces_raw is None:
        traces_raw = data.get("traces") or []  # _memory_viz._read's legacy wrapper key
    if not isinstance(segments_raw, list) or not isinstance(traces_raw, list):
        raise InputError(f"{source}: malformed snapshot ('segments' and 'device_traces' must be lists)")

    interner = StackInterner()
    string_codes: Interner[str] = Interner([""])  # code 0: no string

    def sid(s: Any) -> int:
        if s is None:
            return 0
        if type(s) is not str or len(s) > MAX_NAME_CHARS:
            s = bounded_name(s)
        return string_codes(s)

    ev_cols: dict[str, list[np.ndarray]] = {
        k: []
        for k in (
            "device",
            "idx",
            "time_us",
            "action",
            "addr",
            "size",
            "stream",
            "stack_id",
            "metadata_id",
            "compile_id",
            "device_free",
        )
    }
    columns = device_columns or functools.partial(_dict_device_columns, traces_raw, source, rows)
    for dev, cols in columns(interner, sid, notes):
        n = len(cols["addr"])
        _check_range(source, f"device_traces[{dev}]", cols["addr"], cols["size"])
        ev_cols["device"].append(np.full(n, dev, dtype=np.int16))
        ev_cols["idx"].append(np.arange(n, dtype=np.int64))
        for k, v in cols.items():
            ev_cols[k].append(v)
    dtypes = {
        "device": np.int16,
        "idx": np.int64,
        "time_us": np.int64,
        "action": np.int8,
        "addr": np.int64,
        "size": np.int64,
        "stream": np.int64,
        "stack_id": np.int32,
        "metadata_id": np.int32,
        "compile_id": np.int32,
        "device_free": np.int64,
    }
    events = pd.DataFrame(
        {k: (np.concatenate(v) if v else np.empty(0, dtypes[k])) for k, v in ev_cols.items()}, copy=False
    )
    ev_cols.clear()  # the frame owns the concatenated columns; the per-device pieces can go
    if (events["time_us"] < 0).all() and len(events):
        notes.append("trace entries carry no time_us (torch < 2.2): the time axis is the event index")

    seg_rows: list[tuple[Any, ...]] = []
    seg_frames: list[Any] = []
    seg_blocks: list[list[Any]] = []
    _add_dicts(rows, segments_raw)
    for seg in segments_raw:
        if not isinstance(seg, dict):
            continue
        seg_rows.append(
            (
                as_int(seg.get("device", 0)),
                as_int(seg.get("address", 0)),
                as_int(seg.get("total_size", 0)),
                as_int(seg.get("allocated_size", 0)),
                as_int(seg.get("requested_size", 0)),
                as_int(seg.get("stream", 0)),
                value_text(seg.get("segment_type", "large")),
                pool_str(seg.get("segment_pool_id")),
                bool(seg.get("is_expandable", False)),
            )
        )
        seg_frames.append(seg.get("frames"))
        blocks_raw = seg.get("blocks") or []
        if type(blocks_raw) is not list:
            blocks_raw = list(blocks_raw)
        _add_dicts(rows, blocks_raw)
        seg_blocks.append(blocks_raw)
    blk_cols = (blocks_fn or block_columns)(seg_rows, seg_frames, seg_blocks, interner)
    seg_stack = blk_cols.pop("segment_stack_id")
    segments = pd.DataFrame(
        seg_rows,
        columns=[
            "device",
            "address",
            "total_size",
            "allocated_size",
            "requested_size",
            "stream",
            "segment_type",
            "pool_id",
            "is_expandable",
        ],
    )
    segments["stack_id"] = seg_stack
    blocks = pd.DataFrame(blk_cols)
    for df, int_cols in (
        (segments, ("device", "address", "total_size", "allocated_size", "requested_size", "stream", "stack_id")),
        (blocks, ("segment", "device", "address", "size", "requested_size", "stack_id")),
    ):
        for c in int_cols:
            df[c] = df[c].astype(np.int64)
    _check_range(source, "segments", segments["address"].to_numpy(), segments["total_size"].to_numpy())
    _check_range(source, "blocks", blocks["address"].to_numpy(), blocks["size"].to_numpy())
    blocks["state"] = pd.Categorical(
        blocks["state"], categories=["active_allocated", "active_pending_free", "inactive"]
    )

    ann_rows = []
    ann_raw = data.get("external_annotations") or []
    if isinstance(ann_raw, list):
        _add_dicts(rows, ann_raw)
    for a in ann_raw:  # the common types tested inline (the helpers only for an odd value): ~2x faster
        if isinstance(a, dict) and "name" in a:
            get = a.get
            dev, t, name, stage = get("device", 0), get("time_us", -1), a["name"], get("stage", "")
            ann_rows.append(
                (
                    dev if type(dev) is int else as_int(dev),
                    t if type(t) is int else as_int(t, -1),
                    name if type(name) is str and len(name) <= MAX_NAME_CHARS else bounded_name(name),
                    stage if type(stage) is str and len(stage) <= MAX_NAME_CHARS else bounded_name(stage),
                )
            )
    annotations = pd.DataFrame(ann_rows, columns=["device", "time_us", "name", "stage"])
    annotations["time_us"] = annotations["time_us"].astype(np.int64)

    if interner.beyond >= 0:
        notes.append(frames_note(interner.max_frames))
    frames = pd.DataFrame(interner.frame_rows, columns=["name", "filename", "line"])
    frames.insert(0, "frame_id", np.arange(len(frames), dtype=np.int32))
    stacks = interner.stacks
    lens = [len(s) for s in stacks]
    stack_frames = pd.DataFrame(
        {
            "stack_id": np.repeat(np.arange(len(stacks), dtype=np.int32), lens),
            "depth": np.concatenate([np.arange(n, dtype=np.int32) for n in lens]) if lens else np.empty(0, np.int32),
            "frame_id": np.fromiter((f for s in stacks for f in s), np.int32, sum(lens)),
        }
    )
    interner.keep_alive.clear()  # identities are no longer looked up
    settings = settings_dict(data.get("allocator_settings"))
    return Snapshot(
        source=source,
        events=events,
        frames=frames,
        stack_frames=stack_frames,
        stacks=stacks,
        strings=string_codes.values,
        segments=segments,
        blocks=blocks,
        annotations=annotations,
        allocator_settings=dict(settings),
        format_notes=notes,
    )
