"""The columns a Chrome trace load fills: the kept fields of each event kind as arrays of C
scalars and interned string codes, never one Python object per event.

Two ways in, with the same results: :meth:`Columns.add` takes parsed event dicts one by one
(the reference, used with orjson or the stdlib's ``json``), and the ``extend_*`` methods take
one batch's fields as lists (the typed decode in :mod:`snapviz.load.trace.decode`), converting
each column in a few C calls. Both go through the same interners, so a trace whose batches
take different ways still gets one set of codes.
"""

from __future__ import annotations

import ast
import json
from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from snapviz.interning import Interner

MEMORY_EVENT_NAME = "[memory]"  # torch.autograd.profiler_util.MEMORY_EVENT_NAME
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    """An event's ``args``; anything but an object (a list, a number: other writers' files)
    reads as no arguments rather than failing the whole trace."""
    args = ev.get("args")
    return args if type(args) is dict else {}


def to_int(v: Any, default: int = -1) -> int:
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


def ints(values: list[Any], default: int = -1) -> np.ndarray:
    """:func:`to_int` of each value as int64: one C call when all are ints in range (the
    usual case; ``fromlist`` leaves the array unchanged when any is not)."""
    if not values:
        return np.zeros(0, np.int64)
    out = array("q")
    try:
        out.fromlist(values)
    except (TypeError, OverflowError):
        return np.array([to_int(v, default) for v in values], np.int64)
    col = np.frombuffer(out, np.int64)
    if col.min() == _INT64_MIN:  # to_int refuses -2**63
        return np.array([to_int(v, default) for v in values], np.int64)
    return col


def _extend(column: array, values: np.ndarray) -> None:
    column.frombytes(np.ascontiguousarray(values, dtype=column.typecode).tobytes())


def _floats(values: list[float]) -> np.ndarray:
    """A list of event times as float64, as ``array('d').fromlist`` converts them."""
    out = array("d")
    out.fromlist(values)
    return np.frombuffer(out, np.float64) if len(out) else np.zeros(0, np.float64)


class Columns:
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
        self.a_names: Interner[str] = Interner()
        # ops
        self.o_name, self.o_ts, self.o_dur, self.o_tid = array("i"), array("d"), array("d"), array("q")
        self.o_dims, self.o_types = array("i"), array("i")
        self.o_names: Interner[str] = Interner()
        self.o_dims_s: Interner[str] = Interner([""])  # code 0: shapes not recorded
        self.o_types_s: Interner[str] = Interner([""])
        # python functions
        self.p_name, self.p_ts, self.p_dur, self.p_tid = array("i"), array("d"), array("d"), array("q")
        self.p_names: Interner[str] = Interner()
        self.count = 0

    # ----------------------------------------------------------------- reference: one dict at a time

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
            if cat == "cpu_op" or cat == "Operator":  # "Operator": the 2021 profilers' name for cpu_op
                args = _args(ev)
                dims = args.get("Input Dims")
                types = args.get("Input type")
                o_name(o_names(str(ev.get("name", ""))))
                o_ts(ev.get("ts", 0.0))
                o_dur(ev.get("dur", 0.0))
                o_tid(to_int(ev.get("tid")))
                # repr() is ~5x cheaper than json.dumps; the few distinct values become
                # JSON text once, when the categorical is built.
                o_dims(0 if dims is None else o_dims_s(repr(dims)))
                o_types(0 if types is None else o_types_s(repr(types)))
            elif cat == "python_function":
                p_name(p_names(str(ev.get("name", ""))))
                p_ts(ev.get("ts", 0.0))
                p_dur(ev.get("dur", 0.0))
                p_tid(to_int(ev.get("tid")))
            elif ev.get("name") == MEMORY_EVENT_NAME:  # by name: its cat is cpu_instant_event
                self._add_memory(ev)
            elif cat == "user_annotation" and ev.get("ph") == "X":
                # gpu_user_annotation copies (pid 0, tid = stream) are skipped on purpose.
                self.a_name.append(self.a_names(str(ev.get("name", ""))))
                self.a_ts.append(ev.get("ts", 0.0))
                self.a_dur.append(ev.get("dur", 0.0))
                self.a_tid.append(to_int(ev.get("tid")))
                self.a_pid.append(to_int(ev.get("pid")))
        self.count += n

    def _add_memory(self, ev: dict[str, Any]) -> None:
        args = _args(ev)
        self.m_ts.append(ev.get("ts", 0.0))
        self.m_dtype.append(max(-128, min(127, to_int(args.get("Device Type"), 0))))
        self.m_did.append(max(-32768, min(32767, to_int(args.get("Device Id"), -1))))
        self.m_bytes.append(to_int(args.get("Bytes"), 0))
        self.m_addr.append(to_int(args.get("Addr"), 0))
        total = args.get("Total Allocated")
        self.m_has_totals.append(total is not None)
        self.m_alloc.append(to_int(total, 0))
        self.m_res.append(to_int(args.get("Total Reserved"), 0))
        self.m_tid.append(to_int(ev.get("tid")))

    # ----------------------------------------------------------------- one batch's fields as lists

    def extend_ops(
        self, names: list[str], ts: list[float], dur: list[float], tids: list[Any], dims: np.ndarray, types: np.ndarray
    ) -> None:
        """``dims``/``types``: codes of ``o_dims_s``/``o_types_s`` (0: not recorded)."""
        self.put_ops(self.o_names.many(names), _floats(ts), _floats(dur), ints(tids), dims, types)

    def extend_python(self, names: list[str], ts: list[float], dur: list[float], tids: list[Any]) -> None:
        self.put_python(self.p_names.many(names), _floats(ts), _floats(dur), ints(tids))

    def extend_annotations(
        self, names: list[str], ts: list[float], dur: list[float], tids: list[Any], pids: list[Any]
    ) -> None:
        self.put_annotations(self.a_names.many(names), _floats(ts), _floats(dur), ints(tids), ints(pids))

    def extend_memory(self, ts: list[float], tids: list[Any], args: dict[str, list[Any]]) -> None:
        """``args``: the memory fields by their trace name, one list each."""
        total = args["Total Allocated"]
        self.put_memory(
            _floats(ts),
            ints(tids),
            ints(args["Device Type"], 0),
            ints(args["Device Id"], -1),
            ints(args["Bytes"], 0),
            ints(args["Addr"], 0),
            ints(total, 0),
            ints(args["Total Reserved"], 0),
            np.array([t is not None for t in total], bool),
        )

    # ----------------------------------------------------------------- one batch's fields as arrays

    def put_ops(
        self, names: np.ndarray, ts: np.ndarray, dur: np.ndarray, tids: np.ndarray, dims: np.ndarray, types: np.ndarray
    ) -> None:
        """``names``: codes of ``o_names``; ids already converted as :func:`to_int` does."""
        _extend(self.o_name, names)
        _extend(self.o_ts, ts)
        _extend(self.o_dur, dur)
        _extend(self.o_tid, tids)
        _extend(self.o_dims, dims)
        _extend(self.o_types, types)

    def put_python(self, names: np.ndarray, ts: np.ndarray, dur: np.ndarray, tids: np.ndarray) -> None:
        _extend(self.p_name, names)
        _extend(self.p_ts, ts)
        _extend(self.p_dur, dur)
        _extend(self.p_tid, tids)

    def put_annotations(
        self, names: np.ndarray, ts: np.ndarray, dur: np.ndarray, tids: np.ndarray, pids: np.ndarray
    ) -> None:
        _extend(self.a_name, names)
        _extend(self.a_ts, ts)
        _extend(self.a_dur, dur)
        _extend(self.a_tid, tids)
        _extend(self.a_pid, pids)

    def put_memory(
        self,
        ts: np.ndarray,
        tids: np.ndarray,
        device_type: np.ndarray,
        device_id: np.ndarray,
        nbytes: np.ndarray,
        addr: np.ndarray,
        total_allocated: np.ndarray,
        total_reserved: np.ndarray,
        has_totals: np.ndarray,
    ) -> None:
        """Device type and id are clamped to their int8/int16 columns here, as :meth:`_add_memory` does."""
        _extend(self.m_ts, ts)
        _extend(self.m_dtype, np.clip(device_type, -128, 127))
        _extend(self.m_did, np.clip(device_id, -32768, 32767))
        _extend(self.m_bytes, nbytes)
        _extend(self.m_addr, addr)
        _extend(self.m_has_totals, has_totals)
        _extend(self.m_alloc, total_allocated)
        _extend(self.m_res, total_reserved)
        _extend(self.m_tid, tids)

    # ----------------------------------------------------------------- tables

    def frames(self, base_us: float) -> dict[str, pd.DataFrame]:
        """The four tables, with ``ts`` turned into absolute µs. This is the columns' last
        use: each table's sources are let go as it is built, so the next one is built in
        their room (the peak of a large load is here)."""

        def take(name: str) -> np.ndarray:
            a = getattr(self, name)
            setattr(self, name, array(a.typecode))
            return np.frombuffer(a, dtype=a.typecode) if len(a) else np.zeros(0, a.typecode)

        m_time = take("m_ts") + base_us
        order = np.argsort(m_time, kind="stable")
        memory = pd.DataFrame(
            {
                "time_us": m_time[order],
                "device_type": take("m_dtype")[order],
                "device_id": take("m_did")[order],
                "bytes": take("m_bytes")[order],
                "addr": take("m_addr")[order],
                "total_allocated": take("m_alloc")[order],
                "total_reserved": take("m_res")[order],
                "has_totals": take("m_has_totals")[order].astype(bool),
                "tid": take("m_tid")[order],
            }
        )
        del m_time, order

        def ranges(names: Interner, kind: str) -> dict[str, Any]:
            # ts + dur on the relative axis first: one rounding at ~2e15 µs (0.25 µs ulp), not two.
            rel = take(f"{kind}_ts")
            return {
                "name": names.categorical(take(f"{kind}_name")),
                "start_us": rel + base_us,
                "end_us": (rel + take(f"{kind}_dur")) + base_us,
            }

        annotations = pd.DataFrame({**ranges(self.a_names, "a"), "tid": take("a_tid"), "pid": take("a_pid")})
        ops = pd.DataFrame(
            {
                **ranges(self.o_names, "o"),
                "tid": take("o_tid"),
                "input_dims": self.o_dims_s.categorical(take("o_dims"), _repr_to_json),
                "input_types": self.o_types_s.categorical(take("o_types"), _repr_to_json),
            }
        )
        python_functions = pd.DataFrame({**ranges(self.p_names, "p"), "tid": take("p_tid")})
        return {"memory": memory, "annotations": annotations, "ops": ops, "python_functions": python_functions}


def _repr_to_json(text: str) -> str:
    """JSON text for the ``repr`` of a parsed JSON value (run once per distinct value)."""
    return json.dumps(ast.literal_eval(text)) if text else ""
