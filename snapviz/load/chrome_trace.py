"""torch.profiler Chrome traces (plain or gzip JSON) as columnar tables.

The parser streams: the ``traceEvents`` array is read 1 MiB at a time, each read's
complete events parsed in one C call (``orjson`` when installed, else the stdlib's
``json``; see :func:`snapviz.load.json_stream.array_item_batches`), we copy the few fields
we need into ``array.array`` columns and interned string codes, and drop the dicts. A 500 MB trace therefore never exists as a
list of Python dicts (``json.load`` would need several times its size in RSS); see
``benchmarks/bench_trace.py`` for the measured speed and peak RSS.

Time axis (docs/design.md, "Format facts"): ``ts`` is µs relative to ``baseTimeNanoseconds``;
every ``*_us`` column here is absolute Unix µs, ``ts + base_us``, the same clock as a
snapshot's ``time_us``. Traces without ``baseTimeNanoseconds`` carry absolute ``ts``.
"""

from __future__ import annotations

import ast
import json
import os
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.load import paused_gc
from snapviz.load.json_stream import (
    TapReader,
    TopLevel,
    array_item_batches,
    one_line,
    open_json,
    scan_top_level,
)
from snapviz.load.limits import Limits

__all__ = ["ChromeTrace", "TopLevel", "load_chrome_trace", "looks_like_chrome_trace", "scan_top_level"]

MEMORY_EVENT_NAME = "[memory]"  # torch.autograd.profiler_util.MEMORY_EVENT_NAME
TAIL_WINDOW_BYTES = 4 << 20  # keys after the events array must fit in this window
_INT64_MAX = (1 << 63) - 1


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
    * ``ops``: ``cat == "cpu_op"``: ``name``, ``start_us``, ``end_us``, ``tid``,
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


# --------------------------------------------------------------------------- columns


class _Interner:
    """String -> dense int code; the strings become a categorical's categories."""

    __slots__ = ("codes",)

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        code = self.codes.get(s)
        if code is None:
            code = self.codes[s] = len(self.codes)
        return code

    def categorical(self, codes: array, to_text: Callable[[str], str] | None = None) -> pd.Categorical:
        cats = [to_text(c) for c in self.codes] if to_text else list(self.codes)
        return pd.Categorical.from_codes(
            np.frombuffer(codes, dtype=np.int32) if len(codes) else np.zeros(0, np.int32),
            categories=pd.Index(cats, dtype=object),
        )


def _int(v: Any, default: int = -1) -> int:
    """Event ids (pid/tid/args) as int64; kineto sometimes writes strings."""
    if type(v) is not int:
        try:
            v = int(v)
        except (TypeError, ValueError, OverflowError):
            return default
    if -_INT64_MAX <= v <= _INT64_MAX:
        return v
    # Addresses above 2**63 keep their bit pattern (as a C uint64 -> int64 cast would).
    return v - (1 << 64) if _INT64_MAX < v < (1 << 64) else default


class _Columns:
    """Append-only columns for the event kinds we keep (arrays of C scalars, no objects)."""

    def __init__(self) -> None:
        # memory
        self.m_ts, self.m_dtype, self.m_did = array("d"), array("b"), array("h")
        self.m_bytes, self.m_addr, self.m_alloc, self.m_res, self.m_tid = (array("q") for _ in range(5))
        self.m_has_totals = array("b")
        # annotations
        self.a_name, self.a_ts, self.a_dur, self.a_tid, self.a_pid = (
            array("i"),
            array("d"),
            array("d"),
            array("q"),
            array("q"),
        )
        self.a_names = _Interner()
        # ops
        self.o_name, self.o_ts, self.o_dur, self.o_tid = array("i"), array("d"), array("d"), array("q")
        self.o_dims, self.o_types = array("i"), array("i")
        self.o_names, self.o_dims_s, self.o_types_s = _Interner(), _Interner(), _Interner()
        self.o_dims_s("")
        self.o_types_s("")
        # python functions
        self.p_name, self.p_ts, self.p_dur, self.p_tid = array("i"), array("d"), array("d"), array("q")
        self.p_names = _Interner()
        self.count = 0

    def add(self, events: Iterable[Any]) -> None:
        """Keep the fields we need from parsed event dicts, dropping each dict at once."""
        # Bound methods as locals: this loop runs once per event (millions of times).
        o_name, o_ts, o_dur, o_tid, o_dims, o_types = (
            self.o_name.append,
            self.o_ts.append,
            self.o_dur.append,
            self.o_tid.append,
            self.o_dims.append,
            self.o_types.append,
        )
        o_names, o_dims_s, o_types_s = self.o_names, self.o_dims_s, self.o_types_s
        p_name, p_ts, p_dur, p_tid, p_names = (
            self.p_name.append,
            self.p_ts.append,
            self.p_dur.append,
            self.p_tid.append,
            self.p_names,
        )
        n = 0
        for ev in events:
            n += 1
            if type(ev) is not dict:
                continue
            cat = ev.get("cat")
            if cat == "cpu_op":
                args = ev.get("args") or {}
                dims = args.get("Input Dims")
                types = args.get("Input type")
                o_name(o_names(str(ev.get("name", ""))))
                o_ts(ev.get("ts", 0.0))
                o_dur(ev.get("dur", 0.0))
                o_tid(_int(ev.get("tid")))
                # repr() is ~5x cheaper than json.dumps; the few distinct values become
                # JSON text once, when the categorical is built.
                o_dims(0 if dims is None else o_dims_s(repr(dims)))
                o_types(0 if types is None else o_types_s(repr(types)))
            elif cat == "python_function":
                p_name(p_names(str(ev.get("name", ""))))
                p_ts(ev.get("ts", 0.0))
                p_dur(ev.get("dur", 0.0))
                p_tid(_int(ev.get("tid")))
            elif ev.get("name") == MEMORY_EVENT_NAME:  # by name: its cat is cpu_instant_event
                self._add_memory(ev)
            elif cat == "user_annotation" and ev.get("ph") == "X":
                # gpu_user_annotation copies (pid 0, tid = stream) are skipped on purpose.
                self.a_name.append(self.a_names(str(ev.get("name", ""))))
                self.a_ts.append(ev.get("ts", 0.0))
                self.a_dur.append(ev.get("dur", 0.0))
                self.a_tid.append(_int(ev.get("tid")))
                self.a_pid.append(_int(ev.get("pid")))
        self.count += n

    def _add_memory(self, ev: dict[str, Any]) -> None:
        args = ev.get("args") or {}
        self.m_ts.append(ev.get("ts", 0.0))
        self.m_dtype.append(max(-128, min(127, _int(args.get("Device Type"), 0))))
        self.m_did.append(max(-32768, min(32767, _int(args.get("Device Id"), -1))))
        self.m_bytes.append(_int(args.get("Bytes"), 0))
        self.m_addr.append(_int(args.get("Addr"), 0))
        total = args.get("Total Allocated")
        self.m_has_totals.append(total is not None)
        self.m_alloc.append(_int(total, 0))
        self.m_res.append(_int(args.get("Total Reserved"), 0))
        self.m_tid.append(_int(ev.get("tid")))

    def frames(self, base_us: float) -> dict[str, pd.DataFrame]:
        """The four tables, with ``ts`` turned into absolute µs."""

        def f64(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0, np.float64)

        def i64(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)

        m_time = f64(self.m_ts) + base_us
        order = np.argsort(m_time, kind="stable")
        memory = pd.DataFrame(
            {
                "time_us": m_time[order],
                "device_type": (
                    np.frombuffer(self.m_dtype, dtype=np.int8) if len(self.m_dtype) else np.zeros(0, np.int8)
                )[order],
                "device_id": (np.frombuffer(self.m_did, dtype=np.int16) if len(self.m_did) else np.zeros(0, np.int16))[
                    order
                ],
                "bytes": i64(self.m_bytes)[order],
                "addr": i64(self.m_addr)[order],
                "total_allocated": i64(self.m_alloc)[order],
                "total_reserved": i64(self.m_res)[order],
                "has_totals": (
                    np.frombuffer(self.m_has_totals, dtype=np.int8) if len(self.m_has_totals) else np.zeros(0, np.int8)
                )[order].astype(bool),
                "tid": i64(self.m_tid)[order],
            }
        )

        def ranges(names: _Interner, codes: array, ts: array, dur: array) -> dict[str, Any]:
            # ts + dur on the relative axis first: one rounding at ~2e15 µs (0.25 µs ulp), not two.
            rel = f64(ts)
            return {"name": names.categorical(codes), "start_us": rel + base_us, "end_us": (rel + f64(dur)) + base_us}

        annotations = pd.DataFrame(
            {**ranges(self.a_names, self.a_name, self.a_ts, self.a_dur), "tid": i64(self.a_tid), "pid": i64(self.a_pid)}
        )
        ops = pd.DataFrame(
            {
                **ranges(self.o_names, self.o_name, self.o_ts, self.o_dur),
                "tid": i64(self.o_tid),
                "input_dims": self.o_dims_s.categorical(self.o_dims, _repr_to_json),
                "input_types": self.o_types_s.categorical(self.o_types, _repr_to_json),
            }
        )
        python_functions = pd.DataFrame(
            {**ranges(self.p_names, self.p_name, self.p_ts, self.p_dur), "tid": i64(self.p_tid)}
        )
        return {"memory": memory, "annotations": annotations, "ops": ops, "python_functions": python_functions}


def _repr_to_json(text: str) -> str:
    """JSON text for the ``repr`` of a parsed JSON value (run once per distinct value)."""
    return json.dumps(ast.literal_eval(text)) if text else ""


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
    cols = _Columns()
    try:
        # The cyclic GC paused (see paused_gc): each batch is thousands of fresh dicts,
        # which would trigger collections over everything parsed so far; events hold no cycles.
        with reader.stream, paused_gc():
            cols.add(chain.from_iterable(array_item_batches(reader, p)))
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
    return ChromeTrace(source=p, meta=meta, base_us=base_us, event_count=cols.count, notes=notes, **tables)
