"""The items of a JSON document's top-level array (a Chrome trace's ``traceEvents``), read
through the bounding guard of :mod:`snapviz.load.trace.json_stream` one read at a time: as one
JSON array text per read for a C parser, or, where a compiled decoder is given, decoded
straight from the read without the guard scanning what the decoder read whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from snapviz.errors import InputError
from snapviz.load.trace.json_stream import TapReader, one_line

try:  # a C parser faster than the stdlib's on event arrays; optional
    import orjson

    _fast_loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _fast_loads = json.loads

BATCH_READ_BYTES = 1 << 20  # reads of the batched array parse: one C parse call per read
# Longest unread item text handed to a compiled decoder: each read decodes the unread text
# again from its start, so an item longer than this goes the plain way (linear) instead.
DECODE_CARRY_BYTES = 4 << 20


class ItemsRead(NamedTuple):
    """What a compiled decoder read of a text (see :func:`array_item_docs`)."""

    cut: int  # the text before it was read: whole items, up to the end of a container item or the ']'
    done: bool  # the array's ']' is at ``cut``
    opens: int  # containers opened at or after ``base`` before ``cut`` (as the guard counts them)
    last: int  # end of the last container item read (0: none)
    commit: Callable[[], None]  # adds what was read to the load


# A compiled decoder: (text, first, base) -> what it read, or None where it gives the text back.
ItemDecoder = Callable[[bytes, bool, int], ItemsRead | None]


def array_item_docs(
    reader: TapReader, path: str, decoder: Callable[[int], ItemDecoder | None] | None = None
) -> Iterator[tuple[bytes, int]]:
    """The items of the top-level array the reader's guard watches (``traceEvents``), as one
    JSON array text per read, with how many items at its start are not events (0 or 1). The
    guard has bounded each read (depth, string length, values) and says where its last item
    ends, so the complete items of a read are one JSON array for a C parser: no Python work
    per byte or per JSON token, and memory of one read plus one unfinished item. The rest of
    the document is still read through the guard (the tail window).

    ``decoder(offset)``: the compiled decoder for a read from ``offset`` on, if any. It reads
    the whole items of the unread text and the read; the guard then skips what it read (it
    already checked every bound the guard checks) and scans only the rest of the read, so
    the guard's state and every error stay what they would be without it. A read it gives
    back goes the plain way."""
    guard = reader.guard
    carry: list[bytes | memoryview] = []  # unparsed item text from earlier reads
    carry_bytes = 0
    first = True  # the next text starts right after the array's '['
    opened = done = False
    while True:
        decode = decoder(guard.offset) if decoder is not None and opened and not done else None
        chunk = reader.read(BATCH_READ_BYTES, guarded=decode is None)
        if not chunk:
            break
        start = guard.offset - (len(chunk) if decode is None else 0)
        if decode is not None:
            got = _decoded(reader, decode, chunk, b"".join([*carry, chunk]) if carry else chunk, first)
            if got is not None:
                rest = chunk[got.cut - carry_bytes :]
                if rest:
                    guard.feed(rest)
                carry, carry_bytes, first, done = [rest], len(rest), False, got.done
                continue
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
            carry_bytes += len(chunk) - lo
            continue
        view = memoryview(chunk)
        # Later texts open with the comma after the previous item: a leading {} makes them an
        # array too (skipped by the caller), and a missing or extra comma stays a parse error.
        doc = b"".join([b"[" if first else b"[{}", *carry, view[lo:cut], b"]"])
        carry, carry_bytes = [view[cut:]], len(chunk) - cut
        yield doc, 0 if first else 1
        first = False
    if opened and not done:
        raise InputError(f"{path}: not valid JSON (it ends inside the traceEvents list)")


def _decoded(reader: TapReader, decode: ItemDecoder, chunk: bytes, text: bytes, first: bool) -> ItemsRead | None:
    """Decode the whole items of ``text`` (the unread text, then the read ``chunk``) and let
    the guard skip what was read; None, with the read fed to the guard, where the decoder
    gives it back, reads no item that ends in the read, or the read would pass the value limit."""
    guard, limits = reader.guard, reader.limits
    base = len(text) - len(chunk)
    got = decode(text, first, base) if len(text) <= min(limits.string_length, DECODE_CARRY_BYTES) else None
    if got is not None and (got.cut > base or got.done):
        at = got.cut - base
        # Commas anywhere (in strings too), as the guard counts them; numpy's count is ~8x bytes.count's speed.
        values = got.opens + int(np.count_nonzero(np.frombuffer(text, np.uint8, got.cut - base, base) == 44))
        if guard.values + values <= limits.objects:  # else the guard stops at this read, as it would
            got.commit()
            guard.skip(at, values, guard.offset + got.last - base - 1 if got.last > base else -1)
            return got
    guard.feed(chunk)
    return None


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
