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

import functools
import json
import warnings
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from typing import Any, Literal, NamedTuple

import numpy as np

from snapviz.load.trace.columns import MEMORY_EVENT_NAME, Columns, Interner
from snapviz.load.trace.json_items import ItemDecoder, ItemsRead, load_value, parse_items

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


@functools.cache
def compiled_kernel() -> Any:
    """The kernel module (:mod:`snapviz.load.trace.trace_kernel`), or None without numba."""
    try:  # imported here: numba costs about 0.3 s and 100 MiB, paid only by long traces
        from snapviz.load.trace import trace_kernel  # noqa: PLC0415
    except ImportError:
        return None
    return trace_kernel


def kernel_batches(depth: int = 514) -> KernelBatches | None:
    """A compiled decoder for one load, or None without numba. ``depth``: the nesting the
    stream guard allows (the events array sits at depth 2); it must leave an event room
    for ``args`` and one container in it."""
    kernel = compiled_kernel()
    return None if kernel is None or depth < 5 else KernelBatches(kernel, depth)


class Decoded(NamedTuple):
    """What :meth:`KernelBatches.decode` read of a text (see ``trace_kernel.decode_items``)."""

    text: bytes
    items: int
    rows: int
    n_hard: int
    n_text: int
    n_reps: int
    cut: int  # the text before it was read: whole items, up to the end of a container item or the ']'
    done: bool  # the array's ']' is at ``cut``
    opens: int  # containers opened at or after ``base`` before ``cut``
    last: int  # the end of the last container item read (0: none)


class KernelBatches:
    """The compiled decode of a load's batches (:mod:`snapviz.load.trace.trace_kernel`): its
    output buffers, grown to the largest batch and reused, and the conversion of its rows
    into :class:`Columns` (per distinct string and per kind, never per event)."""

    def __init__(self, kernel: Any, depth: int = 514) -> None:
        self.kernel = kernel
        # Nesting room of an item (the array is at depth 2), a value in an event, one in its args.
        room = min(depth, 514) - 2
        self.stacks = (np.zeros(room, np.uint8), np.zeros(room - 1, np.uint8), np.zeros(room - 2, np.uint8))
        self._size(1 << 12)

    def _size(self, cap: int) -> None:
        """Outputs for ``cap`` kept events (a 1 MiB read holds about 2,000-4,000 of them)."""
        self.cap = cap
        self.ints = np.zeros((self.kernel.N_INT_FIELDS, cap), np.int64)
        self.floats = np.zeros((2, cap), np.float64)
        self.hard = np.zeros((2, cap), np.int64)
        self.text = np.zeros(cap * 24, np.uint8)  # hard numbers' texts, comma-separated
        self.reps = np.zeros((4, cap), np.int64)  # distinct spans: start, end, escaped, hash slot
        self.table = np.zeros(1 << (2 * cap).bit_length(), np.int32)  # load factor under 1/2

    def add(self, cols: Columns, doc: bytes, skip: int) -> bool:
        """Add the events of ``doc``, one JSON array text, as :meth:`Columns.add` would; False
        (nothing added) where the kernel gives the batch back."""
        at = len(doc) - len(doc.lstrip(b" \t\n\r"))
        if doc[at : at + 1] != b"[":
            return False
        got = self.decode(doc[at + 1 :], True, 0)
        if got is None or not got.done or got.text[got.cut + 1 :].strip(b" \t\n\r"):
            return False
        self.commit(cols, got, skip)
        return True

    def items(self, cols: Columns) -> ItemDecoder:
        """The decoder :func:`~snapviz.load.trace.json_items.array_item_docs` takes, into ``cols``."""

        def read(text: bytes, first: bool, base: int) -> ItemsRead | None:
            got = self.decode(text, first, base)
            if got is None:
                return None
            return ItemsRead(got.cut, got.done, got.opens, got.last, functools.partial(self.commit, cols, got))

        return read

    def decode(self, text: bytes, first: bool, base: int) -> Decoded | None:
        """Read the whole items at the start of ``text``, a piece of the events array (just
        after its ``[`` when ``first``, else from a comma); None where the kernel gives it
        back. Its rows stay in the output buffers until :meth:`commit` (or the next decode)."""
        k = self.kernel
        b = np.frombuffer(text, np.uint8)
        while True:
            with warnings.catch_warnings():  # numba's own (at its first compile) are no business of the user's
                warnings.simplefilter("ignore")
                status, items, rows, n_hard, n_text, n_reps, cut, done, opens, last = k.decode_items(
                    b, first, base, self.ints, self.floats, self.hard, self.text, self.reps, self.table, *self.stacks
                )
            if status == k.OK:
                return Decoded(text, items, rows, n_hard, n_text, n_reps, cut, bool(done), opens, last)
            if status == k.DEFER:
                self.table.fill(0)
                return None
            self._size(2 * self.cap)  # FULL: decode it again with room to spare

    def commit(self, cols: Columns, got: Decoded, skip: int = 0) -> None:
        """Add the rows of ``got`` (the last decode) to ``cols``; its first ``skip`` items are not events."""
        k = self.kernel
        ints, floats = self.ints[:, : got.rows], self.floats[:, : got.rows]
        if got.n_hard:  # parsed by numpy as Python's float() parses (correctly rounded), in one call
            values = np.fromstring(self.text[: got.n_text - 1].tobytes(), np.float64, sep=",")
            floats[self.hard[1, : got.n_hard], self.hard[0, : got.n_hard]] = values
        doc = got.text
        texts = [doc[s:e] for s, e in self.reps[:2, : got.n_reps].T.tolist()]
        escaped = self.reps[2, : got.n_reps]
        cols.count += got.items - skip
        kind = ints[k.KIND]
        for which, fill in (
            (k.OP, self._ops),
            (k.PYTHON, self._python),
            (k.MEMORY, self._memory),
            (k.ANNOTATION, self._annotations),
        ):
            sel = np.flatnonzero(kind == which)
            if len(sel):
                fill(cols, ints[:, sel], floats[:, sel], texts, escaped)

    def _ops(self, cols: Columns, ints: np.ndarray, floats: np.ndarray, texts: list[bytes], esc: np.ndarray) -> None:
        k = self.kernel
        cols.put_ops(
            _string_codes(cols.o_names, ints[k.NAME], texts, esc),
            floats[k.TS],
            floats[k.DUR],
            ints[k.TID],
            _raw_codes(cols.o_dims_s, ints[k.DIMS], texts),
            _raw_codes(cols.o_types_s, ints[k.TYPES], texts),
        )

    def _python(self, cols: Columns, ints: np.ndarray, floats: np.ndarray, texts: list[bytes], esc: np.ndarray) -> None:
        k = self.kernel
        cols.put_python(_string_codes(cols.p_names, ints[k.NAME], texts, esc), floats[k.TS], floats[k.DUR], ints[k.TID])

    def _annotations(
        self, cols: Columns, ints: np.ndarray, floats: np.ndarray, texts: list[bytes], esc: np.ndarray
    ) -> None:
        k = self.kernel
        codes = _string_codes(cols.a_names, ints[k.NAME], texts, esc)
        cols.put_annotations(codes, floats[k.TS], floats[k.DUR], ints[k.TID], ints[k.PID])

    def _memory(self, cols: Columns, ints: np.ndarray, floats: np.ndarray, texts: list[bytes], esc: np.ndarray) -> None:
        k = self.kernel
        cols.put_memory(
            floats[k.TS],
            ints[k.TID],
            ints[k.DTYPE],
            ints[k.DID],
            ints[k.BYTES],
            ints[k.ADDR],
            ints[k.ALLOC],
            ints[k.RES],
            ints[k.HAS_TOTALS].astype(bool),
        )


def _span_codes(interner: Interner, ids: np.ndarray, texts: list[bytes], new_code: Callable[[int], int]) -> np.ndarray:
    """Interner codes of the kernel's span ids (-1: absent, code 0), looked up by the span's
    bytes in ``interner.raw``: a dict lookup per distinct span of the batch, and spans not
    seen before get ``new_code(id)`` in order of first appearance, as the reference codes them."""
    lut = np.zeros(len(texts) + 1, np.int32)  # lut[-1]: code 0
    present = np.zeros(len(texts) + 1, bool)
    present[ids] = True
    present[-1] = False
    known = interner.raw
    new = []
    for r in np.flatnonzero(present).tolist():
        code = known.get(texts[r])
        if code is None:
            new.append(r)
        else:
            lut[r] = code
    if new:  # rare after the first batches: order them by first appearance
        uniq, first = np.unique(ids, return_index=True)
        at = dict(zip(uniq.tolist(), first.tolist(), strict=True))
        for r in sorted(new, key=at.__getitem__):
            text = texts[r]
            code = known.get(text)  # two spans of one batch may read alike (escapes, spacing)
            lut[r] = known[text] = new_code(r) if code is None else code
    return lut[ids]


def _string_codes(interner: Interner, ids: np.ndarray, texts: list[bytes], esc: np.ndarray) -> np.ndarray:
    """Interner codes of the kernel's string ids (raw spans: decoded once per distinct one)."""
    return _span_codes(
        interner, ids, texts, lambda r: interner(json.loads(b'"' + texts[r] + b'"') if esc[r] else texts[r].decode())
    )


def _raw_codes(interner: Interner, ids: np.ndarray, texts: list[bytes]) -> np.ndarray:
    """Codes of raw JSON values (id -1: absent or null, code 0) as :func:`_json_codes` gives them."""
    return _span_codes(interner, ids, texts, lambda r: interner(repr(load_value(texts[r]))))
