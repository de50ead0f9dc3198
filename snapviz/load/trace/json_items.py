"""The items of a JSON document's top-level array (a Chrome trace's ``traceEvents``), read
through the bounding guard of :mod:`snapviz.load.trace.json_stream` one read at a time, as one
JSON array text per read for a C parser (msgspec's typed decode, else orjson or the stdlib).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from snapviz.errors import InputError
from snapviz.load.trace.json_stream import TapReader, one_line

try:  # a C parser faster than the stdlib's on event arrays; optional
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _fast_loads = json.loads

BATCH_READ_BYTES = 1 << 20  # reads of the batched array parse: one C parse call per read


def array_item_docs(reader: TapReader, path: str) -> Iterator[tuple[bytes, int]]:
    """The items of the top-level array the reader's guard watches (``traceEvents``), as one
    JSON array text per read, with how many items at its start are not events (0 or 1). The
    guard has bounded each read (depth, string length, values) and says where its last item
    ends, so the complete items of a read are one JSON array for a C parser: no Python work
    per byte or per JSON token, and memory of one read plus one unfinished item. The rest of
    the document is still read through the guard (the tail window)."""
    guard = reader.guard
    carry: list[bytes | memoryview] = []  # unparsed item text from earlier reads
    first = True  # the next text starts right after the array's '['
    opened = done = False
    while True:
        chunk = reader.read(BATCH_READ_BYTES)
        if not chunk:
            break
        start = guard.offset - len(chunk)
        if done:
            continue
        lo = 0
        if not opened:
            if guard.watch_start < start:  # not open yet (or whitespace before the document)
                continue
            opened, lo = True, guard.watch_start + 1 - start
        if guard.watch_end >= start:
            cut, done = guard.watch_end - start, True
        elif guard.last_item_end >= start + lo:
            cut = guard.last_item_end + 1 - start
        else:
            carry.append(chunk[lo:])
            continue
        view = memoryview(chunk)
        # Later texts open with the comma after the previous item: a leading {} makes them an
        # array too (skipped by the caller), and a missing or extra comma stays a parse error.
        doc = b"".join([b"[" if first else b"[{}", *carry, view[lo:cut], b"]"])
        carry = [view[cut:]]
        yield doc, 0 if first else 1
        first = False
    if opened and not done:
        raise InputError(f"{path}: not valid JSON (it ends inside the traceEvents list)")


def parse_items(doc: bytes, path: str) -> list[Any]:
    """A JSON array text (one of :func:`array_item_docs`) parsed with orjson, else the stdlib."""
    try:
        items = load_value(doc)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError included
        raise InputError(f"{path}: not valid JSON ({one_line(exc)})") from None
    return items if isinstance(items, list) else []


def load_value(text: bytes) -> Any:
    """orjson's parse, or the stdlib's where orjson refuses (integers beyond 64 bits in some
    versions, which the stdlib reads)."""
    try:
        return _fast_loads(text)
    except ValueError:
        return json.loads(text)
