"""torch.profiler Chrome traces (plain or gzip JSON) as columnar tables.

The parser streams: ``ijson`` (C backend ``yajl2_c`` when installed) builds one event
dict at a time, we copy the few fields we need into ``array.array`` columns and
interned string codes, and drop the dict. A 500 MB trace therefore never exists as a
list of Python dicts (``json.load`` would need several times its size in RSS); see
``benchmarks/bench_trace.py`` for the measured speed and peak RSS.

Time axis (reference §2.6, §5.1): ``ts`` is µs relative to ``baseTimeNanoseconds``;
every ``*_us`` column here is absolute Unix µs, ``ts + base_us``, the same clock as a
snapshot's ``time_us``. Traces without ``baseTimeNanoseconds`` carry absolute ``ts``.
"""
from __future__ import annotations

import ast
import gzip
import lzma
import json
import os
import zlib
from array import array
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterable

import ijson
import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.load.safe_pickle import open_decompressed

__all__ = ["ChromeTrace", "load_chrome_trace", "looks_like_chrome_trace"]

MEMORY_EVENT_NAME = "[memory]"   # torch.autograd.profiler_util.MEMORY_EVENT_NAME
CHUNK_BYTES = 64 << 10           # yajl2_c read size; measured faster than 1 MiB (cache-friendly)
HEAD_LIMIT_BYTES = 64 << 20      # "traceEvents" must start within this many bytes
TAIL_WINDOW_BYTES = 4 << 20      # keys after the events array must fit in this window
_GZIP_MAGIC = b"\x1f\x8b"
_TRACE_EVENTS_KEY = b'"traceEvents"'
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


def _one_line(exc: BaseException) -> str:
    """yajl's messages span several lines with a caret diagram; keep the first."""
    text = str(exc).strip()
    if text.startswith(("b'", 'b"')):
        text = text[2:]
    text = text.replace("\\n", "\n").splitlines()[0] if text else type(exc).__name__
    return text.strip().rstrip(".")


def _open(path: str) -> IO[bytes]:
    """The decompressed byte stream; compression is recognised by its magic, not the suffix."""
    return open_decompressed(path, what="Chrome trace file")


class _TapReader:
    """File-like wrapper handed to ijson: maps I/O damage to InputError and watches the
    bytes go by (first byte, head up to ``"traceEvents"``, a tail window), so the
    document is read once and the top-level keys come without a second pass.
    """

    def __init__(self, path: str, stream: IO[bytes]) -> None:
        self.path = path
        self.stream = stream
        self.started = False
        self.offset = 0                       # bytes handed to the parser so far
        self.head = bytearray()
        self.head_meta: dict[str, Any] | None = None
        self.head_resume = 0                  # where in head the key search goes on
        self.events_at = -1                   # offset of the events array's '['
        self.tail: list[bytes] = []           # the last chunks, >= TAIL_WINDOW_BYTES of them
        self.tail_bytes = 0

    def read(self, size: int = -1) -> bytes:
        try:
            chunk = self.stream.read(size)
        except EOFError:  # gzip stream cut short
            raise InputError(f"{self.path}: truncated gzip file (compressed stream ended early)") from None
        except lzma.LZMAError as exc:
            raise InputError(f"{self.path}: corrupt xz file ({_one_line(exc)})") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise InputError(f"{self.path}: corrupt gzip file ({_one_line(exc)})") from None
        if not chunk:
            return chunk
        if not self.started:
            chunk = chunk.removeprefix(b"\xef\xbb\xbf")  # yajl rejects a UTF-8 BOM
            first = chunk.lstrip()[:1]
            if not first:
                chunk = b" "  # whitespace so far; b"" would mean end of file to ijson
            else:
                self.started = True
                if first == b"[":
                    raise InputError(f"{self.path}: a JSON array, not a Chrome trace object with a traceEvents list")
                if first != b"{":
                    raise InputError(f"{self.path}: not JSON (does not start with '{{')")
        if self.head_meta is None:
            self._scan_head(chunk)
        self.offset += len(chunk)
        self.tail.append(chunk)
        self.tail_bytes += len(chunk)
        while self.tail_bytes - len(self.tail[0]) >= TAIL_WINDOW_BYTES:
            self.tail_bytes -= len(self.tail.pop(0))
        return chunk

    def _scan_head(self, chunk: bytes) -> None:
        self.head += chunk
        found, self.head_resume = _head_meta(self.head, self.head_resume)  # no copy: heads can be MBs
        if found is not None:
            meta, bracket = found
            if bracket < 0:
                raise InputError(f"{self.path}: not a Chrome trace (traceEvents is not a list)")
            self.head_meta = meta
            self.events_at = self.offset + len(chunk) - len(self.head) + bracket
            self.head = bytearray()
        elif len(self.head) > HEAD_LIMIT_BYTES:
            raise InputError(f"{self.path}: not a Chrome trace (no traceEvents in the first {HEAD_LIMIT_BYTES >> 20} MiB)")

    def after_events_start(self) -> bytes:
        """The tail window, cut to start inside the events array (never in the head)."""
        window = b"".join(self.tail)
        window_at = self.offset - len(window)
        return window[max(0, self.events_at + 1 - window_at, len(window) - TAIL_WINDOW_BYTES):]


def looks_like_chrome_trace(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` (optionally gzipped) starts like a Chrome trace JSON object.

    Sniffs the first 64 KiB (decompressed as far as they go, so a truncated gzip trace
    still counts and then gets its precise error from :func:`load_chrome_trace`): a
    ``{`` first, then ``"traceEvents"`` or ``"schemaVersion"``. Never raises.
    """
    try:
        with open(os.fspath(path), "rb") as f:
            head = f.read(64 << 10)
        if head[:2] == _GZIP_MAGIC:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 64 << 10)
    except (OSError, zlib.error):
        return False
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return head[:1] == b"{" and (b'"traceEvents"' in head or b'"schemaVersion"' in head)


# --------------------------------------------------------------------------- meta


def _head_meta(head: bytes | bytearray, start: int = 0) -> tuple[tuple[dict[str, Any], int] | None, int]:
    """Top-level keys before ``"traceEvents"`` and the offset in ``head`` of its ``[``.

    Returns ``(found, resume)``: ``found`` is ``(meta, offset)`` (offset -1 when the
    value is not a list) or ``None`` while more input is needed, and ``resume`` is where
    the next call should search from, so a long head is scanned once, not per chunk.
    An occurrence of the string inside an earlier value is skipped: the text before it
    is not then a complete object's member list.
    """
    while True:
        pos = head.find(_TRACE_EVENTS_KEY, start)
        if pos < 0:
            return None, max(start, len(head) - len(_TRACE_EVENTS_KEY) + 1)
        rest = head[pos + len(_TRACE_EVENTS_KEY):].lstrip()
        if not rest[1:].lstrip():
            return None, pos  # the ':' or the value's first byte is in the next chunk
        start = pos + 1
        members = head[:pos].rstrip()
        if members.endswith(b","):
            members = members[:-1]
        try:
            meta = json.loads(members + b"}")
        except ValueError:
            continue
        if not isinstance(meta, dict) or rest[:1] != b":":
            continue  # a nested '"traceEvents"' or a string value: keep looking
        value = rest[1:].lstrip()
        return (meta, (len(head) - len(value)) if value[:1] == b"[" else -1), pos


def _tail_meta(tail: bytes) -> dict[str, Any] | None:
    """Top-level keys after the events array, from the last bytes of the document.

    The array ends at the earliest ``]`` whose remainder parses as the rest of an
    object (``, "k": v ... }``); a ``]`` inside the last events leaves unbalanced
    brackets behind it and fails. ``None`` when no candidate fits in the window.
    """
    best: dict[str, Any] | None = None
    misses = 0
    pos = len(tail)
    # Walk backwards: the true end is usually within the last few hundred bytes.
    # Keep the earliest fitting candidate; stop after a long run of misses (inside events).
    while misses < 256:
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            break
        rest = tail[pos + 1:].lstrip()
        if rest[:1] == b",":
            text = b"{" + rest[1:]
        elif rest[:1] == b"}":
            text = b"{" + rest  # traceEvents was the last key: nothing after it
        else:
            misses += 1
            continue
        try:
            val = json.loads(text)
        except ValueError:
            misses += 1
            continue
        if isinstance(val, dict) and "traceEvents" not in val:
            best, misses = val, 0
    return best


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
        return pd.Categorical.from_codes(np.frombuffer(codes, dtype=np.int32) if len(codes) else np.zeros(0, np.int32), categories=pd.Index(cats, dtype=object))


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
        self.a_name, self.a_ts, self.a_dur, self.a_tid, self.a_pid = array("i"), array("d"), array("d"), array("q"), array("q")
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
        o_name, o_ts, o_dur, o_tid, o_dims, o_types = (self.o_name.append, self.o_ts.append, self.o_dur.append,
                                                       self.o_tid.append, self.o_dims.append, self.o_types.append)
        o_names, o_dims_s, o_types_s = self.o_names, self.o_dims_s, self.o_types_s
        p_name, p_ts, p_dur, p_tid, p_names = (self.p_name.append, self.p_ts.append, self.p_dur.append,
                                               self.p_tid.append, self.p_names)
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
        memory = pd.DataFrame({
            "time_us": m_time[order],
            "device_type": (np.frombuffer(self.m_dtype, dtype=np.int8) if len(self.m_dtype) else np.zeros(0, np.int8))[order],
            "device_id": (np.frombuffer(self.m_did, dtype=np.int16) if len(self.m_did) else np.zeros(0, np.int16))[order],
            "bytes": i64(self.m_bytes)[order],
            "addr": i64(self.m_addr)[order],
            "total_allocated": i64(self.m_alloc)[order],
            "total_reserved": i64(self.m_res)[order],
            "has_totals": (np.frombuffer(self.m_has_totals, dtype=np.int8) if len(self.m_has_totals) else np.zeros(0, np.int8))[order].astype(bool),
            "tid": i64(self.m_tid)[order],
        })

        def ranges(names: _Interner, codes: array, ts: array, dur: array) -> dict[str, Any]:
            # ts + dur on the relative axis first: one rounding at ~2e15 µs (0.25 µs ulp), not two.
            rel = f64(ts)
            return {"name": names.categorical(codes), "start_us": rel + base_us, "end_us": (rel + f64(dur)) + base_us}

        annotations = pd.DataFrame({**ranges(self.a_names, self.a_name, self.a_ts, self.a_dur),
                                    "tid": i64(self.a_tid), "pid": i64(self.a_pid)})
        ops = pd.DataFrame({**ranges(self.o_names, self.o_name, self.o_ts, self.o_dur), "tid": i64(self.o_tid),
                            "input_dims": self.o_dims_s.categorical(self.o_dims, _repr_to_json),
                            "input_types": self.o_types_s.categorical(self.o_types, _repr_to_json)})
        python_functions = pd.DataFrame({**ranges(self.p_names, self.p_name, self.p_ts, self.p_dur),
                                         "tid": i64(self.p_tid)})
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
    reader = _TapReader(p, _open(p))
    cols = _Columns()
    try:
        with reader.stream:
            # ijson.items over a file object stays in C between reads; its coroutine
            # API (items_coro) measured ~3x slower on the same input.
            cols.add(ijson.items(reader, "traceEvents.item", use_float=True, buf_size=CHUNK_BYTES))
    except ijson.JSONError as exc:  # IncompleteJSONError included
        if not reader.started:
            raise InputError(f"{p}: empty file") from None
        raise InputError(f"{p}: not valid JSON ({_one_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not valid JSON (bad UTF-8: {_one_line(exc)})") from None
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a string where ts should be a number
        raise InputError(f"{p}: malformed trace event ({_one_line(exc)})") from None
    if not reader.started:
        raise InputError(f"{p}: empty file")
    if reader.head_meta is None:
        raise InputError(f"{p}: not a Chrome trace (no traceEvents list)")

    meta = dict(reader.head_meta)
    notes: list[str] = []
    after = _tail_meta(reader.after_events_start())
    if after is None:
        notes.append(f"keys after traceEvents not read (beyond the last {TAIL_WINDOW_BYTES >> 20} MiB)")
    else:
        meta.update(after)
    base_ns = meta.get("baseTimeNanoseconds")
    # int / 1000 rounds once, correctly; float(base_ns) first could round twice.
    base_us = base_ns / 1000 if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) else 0.0
    tables = cols.frames(base_us)
    return ChromeTrace(source=p, meta=meta, base_us=base_us, event_count=cols.count, notes=notes, **tables)
