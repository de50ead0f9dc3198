"""One batch of ``traceEvents`` into :class:`~snapviz.load.trace.columns.Columns`.

With ``msgspec`` installed (the ``fast`` extra) a batch is decoded straight into small typed
structs holding only the fields the loader reads: msgspec skips every other key in C
without building its value, so no dict per event exists. The structs are then sorted by
kind and copied column by column (``map`` over attribute getters, one array call per
column): Python statements run per distinct name or shape text and per kept
``user_annotation`` range (a few per trace), not per event.

The types are strict on purpose: a batch they refuse (a string ``ts``, a non-object item,
bad JSON...) goes the reference way, a plain parse (orjson or the stdlib) and
:meth:`Columns.add` one dict at a time, which keeps what it can and says what it cannot.
So the typed decode only ever handles batches whose result it gives exactly as the
reference does; ``tests/unit/test_trace_decode.py`` compares the two on every trace we have.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter
from typing import Any, Literal

import numpy as np

from snapviz.interning import Interner
from snapviz.load.trace.columns import MEMORY_EVENT_NAME, Columns
from snapviz.load.trace.json_items import load_value, parse_items

try:
    import msgspec

    _HAVE_MSGSPEC = True
except ImportError:  # pragma: no cover - exercised where msgspec is absent
    _HAVE_MSGSPEC = False

# The Chrome trace event phases: as a Literal, msgspec hands back one shared string per phase
# instead of a new one per event (an unknown phase sends the batch the reference way).
_Phase = Literal[
    "B", "E", "X", "I", "i", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")"
]

if _HAVE_MSGSPEC:

    class _Args(msgspec.Struct, frozen=True, gc=False):
        """The ``args`` keys we read. Shapes stay raw JSON text: parsed once per distinct value."""

        input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
        input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw())
        device_type: Any = msgspec.field(name="Device Type", default=None)
        device_id: Any = msgspec.field(name="Device Id", default=None)
        nbytes: Any = msgspec.field(name="Bytes", default=None)
        addr: Any = msgspec.field(name="Addr", default=None)
        total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
        total_reserved: Any = msgspec.field(name="Total Reserved", default=None)

    class _Event(msgspec.Struct, gc=False):
        """The event keys we read; ids stay ``Any`` (kineto writes some as strings)."""

        cat: str | None = None
        name: str = ""
        ph: _Phase | None = None
        ts: float = 0.0
        dur: float = 0.0
        tid: Any = None
        pid: Any = None
        args: _Args = _Args()  # one shared instance (frozen); ``"args": null`` goes the reference way

    _DECODER: Any = msgspec.json.Decoder(list[_Event])
    _REFUSED: tuple[type[Exception], ...] = (msgspec.MsgspecError,)
else:  # pragma: no cover
    _DECODER = None
    _REFUSED = ()

TYPED = "msgspec typed decode"
DICTS = "orjson/json dicts"
READERS = (DICTS, TYPED)


def trace_reader() -> str:
    """The one choice of trace decoder: msgspec's typed decode where msgspec is installed
    (a batch its types refuse still goes the dicts way), else dicts from orjson or the stdlib."""
    return TYPED if _DECODER is not None else DICTS


_KIND = {"cpu_op": 1, "Operator": 1, "python_function": 2, "user_annotation": 3}  # Operator: cpu_op of 2021
_CAT, _NAME, _TS, _DUR, _TID, _PID, _ARGS = map(attrgetter, ("cat", "name", "ts", "dur", "tid", "pid", "args"))
_DIMS, _TYPES = attrgetter("input_dims"), attrgetter("input_type")
_MEMORY_ARGS = {
    "Device Type": attrgetter("device_type"),
    "Device Id": attrgetter("device_id"),
    "Bytes": attrgetter("nbytes"),
    "Addr": attrgetter("addr"),
    "Total Allocated": attrgetter("total_allocated"),
    "Total Reserved": attrgetter("total_reserved"),
}


def add_batch(cols: Columns, doc: bytes, skip: int, path: str) -> None:
    """Add the events of ``doc`` (one JSON array; its first ``skip`` items are not events),
    typed where the typed decode takes the batch, else as dicts."""
    if _DECODER is not None:
        try:
            events = _DECODER.decode(doc)
        except _REFUSED:
            pass  # the reference below parses it again and keeps or refuses exactly as it always did
        else:
            add_events(cols, events[skip:])
            return
    cols.add(parse_items(doc, path)[skip:])


def add_events(cols: Columns, events: list[Any]) -> None:
    """Typed events (see ``_Event``) into the columns, kind by kind, as :meth:`Columns.add` would."""
    cols.count += len(events)
    if not events:
        return
    kind = np.fromiter(map(_KIND.get, map(_CAT, events), repeat(0)), np.int8, len(events))
    # [memory] goes by name, after cpu_op and python_function (its cat is cpu_instant_event).
    maybe_memory = np.flatnonzero((kind == 0) | (kind == 3))
    is_memory = np.zeros(len(events), bool)
    names = list(map(_NAME, _take(events, maybe_memory)))
    is_memory[maybe_memory] = np.fromiter(map(MEMORY_EVENT_NAME.__eq__, names), bool, len(names))

    ops = _take(events, np.flatnonzero(kind == 1))
    if ops:
        args = list(map(_ARGS, ops))
        cols.extend_ops(
            list(map(_NAME, ops)),
            list(map(_TS, ops)),
            list(map(_DUR, ops)),
            list(map(_TID, ops)),
            _json_codes(cols.o_dims_s, list(map(_DIMS, args))),
            _json_codes(cols.o_types_s, list(map(_TYPES, args))),
        )
    py = _take(events, np.flatnonzero(kind == 2))
    if py:
        cols.extend_python(list(map(_NAME, py)), list(map(_TS, py)), list(map(_DUR, py)), list(map(_TID, py)))
    mem = _take(events, np.flatnonzero(is_memory))
    if mem:
        args = list(map(_ARGS, mem))
        fields = {key: list(map(get, args)) for key, get in _MEMORY_ARGS.items()}
        cols.extend_memory(list(map(_TS, mem)), list(map(_TID, mem)), fields)
    ann = [e for e in _take(events, np.flatnonzero((kind == 3) & ~is_memory)) if e.ph == "X"]  # a few per trace
    if ann:
        cols.extend_annotations(
            list(map(_NAME, ann)),
            list(map(_TS, ann)),
            list(map(_DUR, ann)),
            list(map(_TID, ann)),
            list(map(_PID, ann)),
        )


def _take(events: list[Any], idx: np.ndarray) -> list[Any]:
    return list(map(events.__getitem__, idx.tolist()))


def _json_codes(interner: Interner, raws: list[Any]) -> np.ndarray:
    """Codes of raw JSON values in ``interner``, keyed like the reference: by the ``repr`` of
    the parsed value (an absent value and JSON ``null`` are the 'not recorded' code 0, as
    there). Each distinct text is parsed once per trace, in order of first appearance."""
    texts = list(map(bytes, raws))
    codes = interner.raw
    for text in dict.fromkeys(texts):
        if text not in codes:
            codes[text] = 0 if text in (b"", b"null") else interner(repr(load_value(text)))
    return np.fromiter(map(codes.__getitem__, texts), np.int32, len(texts))
