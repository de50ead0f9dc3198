"""Turn a snapshot dict (any torch 2.x layout) into the columnar :class:`Snapshot`.

Tolerates schema drift: missing ``frames``/``addr``/``time_us``/``user_metadata``,
unknown keys, ``active_pending_free``/``active_awaiting_free``, ``pool_id``, OOM
entries with ``device_free``, the legacy list-of-segments layout and pre-2.1 blocks
that keep their stack under ``history``.
"""
from __future__ import annotations

import reprlib
from itertools import repeat
from operator import itemgetter
from typing import Any, cast

import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.model import A_OTHER, ACTION_CODE, Snapshot


class _Interner:
    """Frames and stacks interned once. Frame lists, and the frame dicts in them, are shared
    objects in the pickle (c10 symbolizes each distinct frame once), so stacks and frames are
    first looked up by identity (cheap) and only then by value."""

    def __init__(self) -> None:
        self.by_identity: dict[int, int] = {}
        self.frame_by_identity: dict[int, int] = {}
        self.keep_alive: list[Any] = []
        self.stack_by_value: dict[tuple[int, ...], int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self.frame_by_value: dict[tuple[str, str, int], int] = {}
        self.frame_rows: list[tuple[str, str, int]] = []

    def _frame_id(self, fr: Any) -> int:
        """The frame's id by value (-1: not a frame dict, skipped), remembered by identity."""
        fid = -1
        if isinstance(fr, dict):
            fv = (_name(fr.get("name", "?")), _name(fr.get("filename", "")), int(fr.get("line", 0) or 0))
            fid = self.frame_by_value.get(fv, -1)
            if fid < 0:
                fid = len(self.frame_rows)
                self.frame_by_value[fv] = fid
                self.frame_rows.append(fv)
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
        if None in known:
            ids = [self._frame_id(fr) if i is None else i for fr, i in zip(frames, known, strict=True)]
        else:
            ids = cast(list[int], known)
        tup = tuple(i for i in ids if i >= 0) if -1 in ids else tuple(ids)
        sid = self.stack_by_value.get(tup)
        if sid is None:
            sid = len(self.stacks)
            self.stack_by_value[tup] = sid
            self.stacks.append(tup)
        self.by_identity[key] = sid
        self.keep_alive.append(frames)  # ids stay unique only while the object lives
        return sid


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
        return _as_int(block.get("requested_size"), size)
    hist = block.get("history")  # FIX: pre-2.1 blocks keep the request as history[0]["real_size"]
    if isinstance(hist, list) and hist and isinstance(hist[0], dict) and "real_size" in hist[0]:
        return _as_int(hist[0].get("real_size"), size)
    return size


ADDRESS_LIMIT = 1 << 62  # no allocator hands out sizes or addresses at or above 2**62
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxstring, _REPR.maxother = 3, 16, 16, 16, 1000, 200


def _text(v: Any) -> str:
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


def _name(v: Any) -> str:
    """:func:`_text`, cut to :data:`MAX_NAME_CHARS` with the full length stated."""
    t = _text(v)
    return t if len(t) <= MAX_NAME_CHARS else f"{t[:MAX_NAME_CHARS]}… ({len(t):,} chars)"


def _as_int(v: Any, default: int = 0) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _settings(v: Any) -> dict[str, Any]:
    """allocator_settings with scalar values kept and anything nested shown as bounded text
    (it reaches every report; a shared, deeply nested value must not)."""
    if not isinstance(v, dict):
        return {}
    return {_text(k): _flat(x) for k, x in list(v.items())[:200]}


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
    return _text(x)


def _pool_str(v: Any) -> str:
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return f"{_as_int(v[0])},{_as_int(v[1])}"
    return "0,0"


_FAST_KEYS = ("action", "addr", "size", "stream", "time_us")


def _action_code(a: Any, missing: int | None = None) -> int:
    if type(a) is not str:
        if a is None and missing is not None:
            return missing
        raise TypeError(f"a trace action that is not a string ({_text(a)[:40]})")
    return ACTION_CODE.get(a, A_OTHER)


def _metadata_str(v: Any) -> str:
    """user_metadata is a str up to 2.13; newer torch may stamp dicts (unhashable)."""
    return ("" if v is None else _name(v)) if type(v) is not str or len(v) > MAX_NAME_CHARS else v


# Entries the replay cannot do without: an allocation or free with no address or size
# would silently become a 0-byte event and every figure after it would be wrong.
_NEEDS_ADDR_AND_SIZE = frozenset(a for a in ACTION_CODE if a not in ("oom", "snapshot", "other"))


def _require_replay_keys(entries: list[dict[str, Any]]) -> None:
    """Raise ValueError (an input error, exit 2) for an entry the replay cannot use."""
    for i, e in enumerate(entries):
        act = e.get("action")
        if act is None:
            raise ValueError(f"trace entry {i} has no 'action'")
        if act in _NEEDS_ADDR_AND_SIZE:
            for key in ("addr", "size"):
                if e.get(key) is None:
                    raise ValueError(f"trace entry {i} ({act!r}) has no {key!r}")


def _entry_columns(entries: list[dict[str, Any]], interner: _Interner, sid: Any, notes: list[str]) -> dict[str, np.ndarray]:
    """Columns of one device's trace entries.

    The fast path pulls the keys every modern entry has with one C-level ``itemgetter``
    pass; optional keys (frames, metadata) are factorized so each distinct value is
    interned once. Entries missing a key (OOM entries, old torch) take the slow path.
    """
    n = len(entries)
    try:
        # Factorize by identity (pickle memoizes the few action strings): nothing from the
        # file is hashed, so a deeply nested tuple in this column cannot overflow the C stack.
        act = list(map(itemgetter("action"), entries))
        acodes, _ = pd.factorize(np.fromiter(map(id, act), np.int64, n))
        _, first = np.unique(acodes, return_index=True)
        action = np.array([_action_code(act[j]) for j in first.tolist()], dtype=np.int8)[acodes] if n else np.empty(0, np.int8)
        del act
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
        action = np.fromiter((_action_code(e.get("action"), A_OTHER) for e in entries), np.int8, n)
        addr_a = np.fromiter((_as_int(e.get("addr", 0)) for e in entries), np.int64, n)
        size_a = np.fromiter((_as_int(e.get("size", 0)) for e in entries), np.int64, n)
        odd = sum(1 for e in entries for k in ("addr", "size") if k in e and type(e[k]) is not int)
        if odd:
            notes.append(f"{odd:,} trace sizes/addresses are not integers (bool, float, text or missing): read as integers")
        stream_a = np.fromiter((_as_int(e.get("stream", 0)) for e in entries), np.int64, n)
        time_a = np.fromiter((_as_int(e.get("time_us", -1), -1) for e in entries), np.int64, n)
    get = dict.get
    # Frames: factorize by object identity, intern each distinct list once. (map over
    # dict.get with repeated arguments stays in C: no Python frame per entry.)
    frames_col = list(map(get, entries, repeat("frames")))
    fcodes, funiq = pd.factorize(np.fromiter(map(id, frames_col), np.int64, n))
    _, first = np.unique(fcodes, return_index=True)
    stack_of_code = np.array([interner.stack_id(frames_col[j]) for j in first.tolist()], dtype=np.int32)
    stack_id = stack_of_code[fcodes] if n else np.empty(0, np.int32)
    del frames_col

    def interned(key: str, default: str) -> np.ndarray:
        # Factorize by object identity first (pickle memoizes repeated strings, so this is
        # an int factorize), then intern the few distinct objects by value.
        values = list(map(get, entries, repeat(key), repeat(default)))
        codes, _ = pd.factorize(np.fromiter(map(id, values), np.int64, len(values)))
        _, first = np.unique(codes, return_index=True)
        ids = np.array([sid(_metadata_str(values[j])) for j in first.tolist()], dtype=np.int32)
        del values
        return ids[codes] if n else np.empty(0, np.int32)

    device_free = np.fromiter((_as_int(get(e, "device_free", -1), -1) for e in entries), np.int64, n) \
        if (action == ACTION_CODE["oom"]).any() else np.full(n, -1, np.int64)
    return {"time_us": time_a, "action": action, "addr": addr_a, "size": size_a, "stream": stream_a,
            "stack_id": stack_id, "metadata_id": interned("user_metadata", ""),
            "compile_id": interned("compile_context", ""), "device_free": device_free}


def _check_range(source: str, where: str, addr: np.ndarray, size: np.ndarray) -> None:
    """Sizes and addresses an allocator can produce: 0 <= v < 2**62. Anything else is a
    corrupt or hostile file; sums of such values would wrap around in int64 silently."""
    for name, col in (("address", addr), ("size", size)):
        bad = np.flatnonzero((col < 0) | (col >= ADDRESS_LIMIT))
        if len(bad):
            raise InputError(f"{source}: {where}[{int(bad[0])}] has {name} {int(col[bad[0]]):,}, outside what an "
                             f"allocator can produce (0 to 2**62); {len(bad):,} such values")


def snapshot_from_dict(data: Any, source: str) -> Snapshot:
    """Build the model from an unpickled object. Raises InputError if it is not a snapshot."""
    # FIX (tests/unit/test_safe_load.py): hostile or corrupt values (an address beyond 64 bits,
    # a frame name nested 100k deep, a list where a string belongs) crashed with
    # OverflowError / RecursionError / TypeError; they are input errors (exit 2).
    try:
        return _snapshot_from_dict(data, source)
    except InputError:
        raise
    except (OverflowError, RecursionError, MemoryError, TypeError, ValueError, RuntimeError) as exc:
        detail = (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
        raise InputError(f"{source}: malformed snapshot ({type(exc).__name__}: {detail})") from None


def _snapshot_from_dict(data: Any, source: str) -> Snapshot:
    notes: list[str] = []
    if isinstance(data, list):
        if data and not all(isinstance(s, dict) and "blocks" in s for s in data[:50]):
            raise InputError(f"{source}: a valid pickle, but not a CUDA memory snapshot (a list that is not a list of segments)")
        data = {"segments": data, "device_traces": []}
        notes.append("legacy layout (list of segments): no trace history, end state only")
    if not isinstance(data, dict):
        raise InputError(f"{source}: a valid pickle, but not a CUDA memory snapshot (top level is {type(data).__name__})")
    if "segments" not in data and "device_traces" not in data:
        keys = ", ".join(sorted(map(_text, list(data.keys())[:50]))[:6]) or "no keys"
        raise InputError(f"{source}: a valid pickle, but not a CUDA memory snapshot (keys: {keys})")
    segments_raw = data.get("segments") or []
    traces_raw = data.get("device_traces")
    if traces_raw is None:
        traces_raw = data.get("traces") or []  # _memory_viz._read's legacy wrapper key
    if not isinstance(segments_raw, list) or not isinstance(traces_raw, list):
        raise InputError(f"{source}: malformed snapshot ('segments' and 'device_traces' must be lists)")

    interner = _Interner()
    strings: list[str] = [""]
    string_ids: dict[str, int] = {"": 0}

    def sid(s: Any) -> int:
        if s is None:
            return 0
        if type(s) is not str or len(s) > MAX_NAME_CHARS:
            s = _name(s)
        i = string_ids.get(s)
        if i is None:
            i = len(strings)
            string_ids[s] = i
            strings.append(s)
        return i

    ev_cols: dict[str, list[np.ndarray]] = {k: [] for k in (
        "device", "idx", "time_us", "action", "addr", "size", "stream", "stack_id",
        "metadata_id", "compile_id", "device_free")}
    for dev, entries in enumerate(traces_raw):
        if not entries:
            continue
        if not isinstance(entries, list):
            raise InputError(f"{source}: malformed snapshot (device_traces[{dev}] is not a list)")
        if set(map(type, entries)) != {dict}:  # one C-level pass; a copy only when needed
            entries = [e for e in entries if isinstance(e, dict)]
        n = len(entries)
        if n == 0:
            continue
        cols = _entry_columns(entries, interner, sid, notes)
        _check_range(source, f"device_traces[{dev}]", cols["addr"], cols["size"])
        ev_cols["device"].append(np.full(n, dev, dtype=np.int16))
        ev_cols["idx"].append(np.arange(n, dtype=np.int64))
        for k, v in cols.items():
            ev_cols[k].append(v)
    dtypes = {"device": np.int16, "idx": np.int64, "time_us": np.int64, "action": np.int8, "addr": np.int64,
              "size": np.int64, "stream": np.int64, "stack_id": np.int32, "metadata_id": np.int32,
              "compile_id": np.int32, "device_free": np.int64}
    events = pd.DataFrame({k: (np.concatenate(v) if v else np.empty(0, dtypes[k])) for k, v in ev_cols.items()})
    if (events["time_us"] < 0).all() and len(events):
        notes.append("trace entries carry no time_us (torch < 2.2): the time axis is the event index")

    seg_rows: list[tuple[Any, ...]] = []
    blk_rows: list[tuple[Any, ...]] = []
    for seg in segments_raw:
        if not isinstance(seg, dict):
            continue
        addr = _as_int(seg.get("address", 0))
        seg_rows.append((
            _as_int(seg.get("device", 0)), addr, _as_int(seg.get("total_size", 0)),
            _as_int(seg.get("allocated_size", 0)), _as_int(seg.get("requested_size", 0)),
            _as_int(seg.get("stream", 0)), _text(seg.get("segment_type", "large")),
            _pool_str(seg.get("segment_pool_id")), bool(seg.get("is_expandable", False)),
            interner.stack_id(seg.get("frames")),
        ))
        baddr = addr
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict):
                continue
            size = _as_int(b.get("size", 0))
            state = _text(b.get("state", "inactive"))
            if state == "active_awaiting_free":  # the docstring's spelling of the C++ state
                state = "active_pending_free"
            blk_rows.append((
                len(seg_rows) - 1, _as_int(seg.get("device", 0)), _as_int(b.get("address", baddr)), size,
                _block_requested(b, size), state, interner.stack_id(_block_frames(b)),
            ))
            baddr += size
    segments = pd.DataFrame(seg_rows, columns=["device", "address", "total_size", "allocated_size", "requested_size",
                                               "stream", "segment_type", "pool_id", "is_expandable", "stack_id"])
    blocks = pd.DataFrame(blk_rows, columns=["segment", "device", "address", "size", "requested_size", "state", "stack_id"])
    for df, int_cols in ((segments, ("device", "address", "total_size", "allocated_size", "requested_size", "stream", "stack_id")),
                         (blocks, ("segment", "device", "address", "size", "requested_size", "stack_id"))):
        for c in int_cols:
            df[c] = df[c].astype(np.int64)
    _check_range(source, "segments", segments["address"].to_numpy(), segments["total_size"].to_numpy())
    _check_range(source, "blocks", blocks["address"].to_numpy(), blocks["size"].to_numpy())
    blocks["state"] = pd.Categorical(blocks["state"], categories=["active_allocated", "active_pending_free", "inactive"])

    ann_rows = []
    for a in data.get("external_annotations") or []:
        if isinstance(a, dict) and "name" in a:
            ann_rows.append((_as_int(a.get("device", 0)), _as_int(a.get("time_us", -1), -1), _name(a["name"]), _name(a.get("stage", ""))))
    annotations = pd.DataFrame(ann_rows, columns=["device", "time_us", "name", "stage"])
    annotations["time_us"] = annotations["time_us"].astype(np.int64)

    frames = pd.DataFrame(interner.frame_rows, columns=["name", "filename", "line"])
    frames.insert(0, "frame_id", np.arange(len(frames), dtype=np.int32))
    lens = [len(s) for s in interner.stacks]
    stack_frames = pd.DataFrame({
        "stack_id": np.repeat(np.arange(len(interner.stacks), dtype=np.int32), lens),
        "depth": np.concatenate([np.arange(n, dtype=np.int32) for n in lens]) if lens else np.empty(0, np.int32),
        "frame_id": np.fromiter((f for s in interner.stacks for f in s), np.int32, sum(lens)),
    })
    interner.keep_alive.clear()  # identities are no longer looked up
    settings = _settings(data.get("allocator_settings"))
    return Snapshot(source=source, events=events, frames=frames, stack_frames=stack_frames, stacks=interner.stacks,
                    strings=strings, segments=segments, blocks=blocks, annotations=annotations,
                    allocator_settings=dict(settings), format_notes=notes)
