"""torch.profiler Chrome traces (plain or gzip JSON) as columnar tables.

The parser streams: the ``traceEvents`` array is read 1 MiB at a time through the bounding
guard (:mod:`snapviz.load.trace.json_stream`, :mod:`snapviz.load.trace.json_items`), each read's complete
events decoded in one C call (typed structs with ``msgspec``, else dicts from ``orjson`` or
the stdlib's ``json``; see :mod:`snapviz.load.trace.decode`), and the few fields we need are
copied into ``array.array`` columns and interned string codes
(:mod:`snapviz.load.trace.columns`). A 500 MB trace
therefore never exists as a list of Python objects (``json.load`` would need several times
its size in RSS); see ``benchmarks/bench_speed.py`` for the measured speed and peak RSS.

Time axis (docs/design.md, "Format facts"): ``ts`` is µs relative to ``baseTimeNanoseconds``;
every ``*_us`` column here is absolute Unix µs, ``ts + base_us``, the same clock as a
snapshot's ``time_us``. Traces without ``baseTimeNanoseconds`` carry absolute ``ts``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from snapviz.errors import InputError
from snapviz.load import paused_gc
from snapviz.load.limits import Limits
from snapviz.load.trace.columns import Columns
from snapviz.load.trace.decode import add_batch, trace_reader
from snapviz.load.trace.json_items import array_item_docs
from snapviz.load.trace.json_stream import TapReader, TopLevel, one_line, open_json, scan_top_level
from snapviz.safe_text import short_repr

__all__ = ["ChromeTrace", "TopLevel", "load_chrome_trace", "looks_like_chrome_trace", "scan_top_level"]

TAIL_WINDOW_BYTES = 4 << 20  # keys after the events array must fit in this window


@dataclass
class ChromeTrace:
    """A loaded Chrome trace; all times are absolute Unix µs (``ts + base_us``).

    Tables:

    * ``memory``: ``[memory]`` instant events, sorted by time (stable): ``time_us``,
      ``device_type`` (int8, c10::DeviceType: 0 CPU, 1 CUDA, 6 HIP, 12 XPU, 13 MPS,
      19 MTIA, 20 PrivateUse1, ...), ``device_id`` (int16, -1 for CPU), ``bytes``
      (int64, negative on free), ``addr``, ``total_allocated``, ``total_reserved``,
      ``has_totals`` (bool: the event carried ``Total Allocated``; profilers of about
      2021 wrote ``Bytes`` only, and their totals read 0 here), ``tid`` (int64; the
      allocating thread).
    * ``annotations``: ``record_function`` ranges (``cat == "user_annotation"``):
      ``name`` (categorical), ``start_us``, ``end_us``, ``tid``, ``pid``.
    * ``ops``: ``cat == "cpu_op"`` (``"Operator"`` in 2021 traces): ``name``, ``start_us``, ``end_us``, ``tid``,
      ``input_dims`` and ``input_types`` (categoricals of the JSON text of
      ``Input Dims`` / ``Input type``, ``""`` when shapes were not recorded).
    * ``python_functions``: ``cat == "python_function"``: ``name``, ``start_us``,
      ``end_us``, ``tid``.

    ``meta`` holds every top-level key except ``traceEvents``; ``event_count`` is the
    number of entries in ``traceEvents`` (kept or not).
    """

    source: str
    meta: dict[str, Any]
    base_us: float
    memory: pd.DataFrame
    annotations: pd.DataFrame
    ops: pd.DataFrame
    python_functions: pd.DataFrame
    event_count: int = 0
    notes: list[str] = field(default_factory=list)
    reader: str = ""  # the decoder (snapviz.load.trace.decode.READERS); the same columns either way

    def __repr__(self) -> str:
        mem = self.memory
        pairs = mem[["device_type", "device_id"]].drop_duplicates() if len(mem) else mem.iloc[:0]
        devices = sorted(map(tuple, pairs.to_numpy().tolist()))
        return short_repr(
            "ChromeTrace",
            self.source,
            f"{self.event_count:,} events",
            f"{len(mem):,} memory events",
            f"devices (type, id) {devices[:8]}{'…' if len(devices) > 8 else ''}",
            f"{len(self.annotations):,} annotations",
            f"{len(self.ops):,} ops",
        )


# --------------------------------------------------------------------------- input


def looks_like_chrome_trace(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` (optionally compressed) is a JSON object with a ``traceEvents``
    (or ``schemaVersion``) key at the top level, found by streaming its keys: a large
    ``metadata`` object first does not matter. A truncated gzip trace still counts (and
    then gets its precise error from :func:`load_chrome_trace`). Never raises.
    """
    try:
        top = scan_top_level(os.fspath(path))
    except InputError:
        return False
    return top.has_events or "schemaVersion" in top.meta


# --------------------------------------------------------------------------- meta


def _tail_meta(after_end: bytes) -> dict[str, Any] | None:
    """Top-level keys after the events array, from the bytes after its closing bracket."""
    rest = after_end.lstrip()
    if rest[:1] == b"}":
        return {}  # traceEvents was the last key: nothing after it
    text = b"{" + rest[1:] if rest[:1] == b"," else rest
    try:
        val = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return val if isinstance(val, dict) else None


# --------------------------------------------------------------------------- load


def load_chrome_trace(path: str | os.PathLike[str]) -> ChromeTrace:
    """Stream-parse a torch.profiler Chrome trace (plain or gzip JSON) into tables.

    Only ``[memory]`` events, ``user_annotation`` / ``cpu_op`` / ``python_function``
    ranges and the top-level keys are kept. Any unusable input (missing file, not
    JSON, truncated gzip, JSON without a ``traceEvents`` list) raises
    :class:`snapviz.errors.InputError` with one line.
    """
    p = os.fspath(path)
    limits = Limits.from_env()
    top = scan_top_level(p, limits)
    if not top.has_events:
        raise InputError(f"{p}: not a Chrome trace (no traceEvents list)")
    if not top.events_is_list:
        raise InputError(f"{p}: not a Chrome trace (traceEvents is not a list)")
    reader = TapReader(p, open_json(p, limits), limits, watch=top.events_index, keep_tail=TAIL_WINDOW_BYTES)
    cols = Columns()
    try:
        # The cyclic GC paused (see paused_gc): each batch is thousands of fresh objects,
        # which would trigger collections over everything parsed so far; events hold no cycles.
        with reader.stream, paused_gc():
            for doc, skip in array_item_docs(reader, p):
                add_batch(cols, doc, skip, p)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a string where ts should be a number
        raise InputError(f"{p}: malformed trace event ({one_line(exc)})") from None

    meta = dict(top.meta)
    notes: list[str] = []
    after_end = reader.after(reader.guard.watch_end + 1) if reader.guard.watch_end >= 0 else None
    after = _tail_meta(after_end) if after_end is not None else None
    if after is None:
        notes.append(f"keys after traceEvents not read (beyond the last {TAIL_WINDOW_BYTES >> 20} MiB)")
    else:
        meta.update(after)
    base_ns = meta.get("baseTimeNanoseconds")
    # int / 1000 rounds once, correctly; float(base_ns) first could round twice.
    base_us = base_ns / 1000 if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) else 0.0
    tables = cols.frames(base_us)
    return ChromeTrace(
        source=p, meta=meta, base_us=base_us, event_count=cols.count, notes=notes, reader=trace_reader(), **tables
    )
