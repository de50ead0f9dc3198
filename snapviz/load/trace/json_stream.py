"""Streaming JSON with bounds: the guard every Chrome trace byte passes through, and the
scan of a JSON object's top-level keys that decides whether a file is a trace.

Both read through :class:`TapReader`, so I/O damage, the first byte, nesting depth,
string lengths and value counts are handled in one place (limits: :mod:`snapviz.load.limits`).
"""

from __future__ import annotations

import gzip
import lzma
import re
import zlib
from dataclasses import dataclass
from typing import IO, Any

import ijson
import numpy as np

from snapviz.errors import InputError
from snapviz.load.decompress import open_decompressed
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.progress import bytes_read

CHUNK_BYTES = 64 << 10  # yajl2_c read size; measured faster than 1 MiB (cache-friendly)


def one_line(exc: BaseException) -> str:
    """yajl's messages span several lines with a caret diagram; keep the first."""
    text = str(exc).strip()
    if text.startswith(("b'", 'b"')):
        text = text[2:]
    text = text.replace("\\n", "\n").splitlines()[0] if text else type(exc).__name__
    return text.strip().rstrip(".")


def open_json(path: str, limits: Limits) -> IO[bytes]:
    """The decompressed byte stream; compression is recognised by its magic, not the suffix."""
    return open_decompressed(path, what="Chrome trace file", limits=limits)


# The guard works on the chunk with bytes.translate / re / numpy, never a Python loop per byte.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')  # deleted: leaves quotes and brackets
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # bracket -> +1 / -1 (int8)
_IS_BRACKET = np.zeros(256, bool)
_IS_BRACKET[list(b"[]{}")] = True
_IS_STRUCTURE = _IS_BRACKET.copy()
_IS_STRUCTURE[34] = True  # the bytes _NOT_STRUCTURE keeps
_ESCAPE = re.compile(rb"\\[\s\S]")


class _JsonGuard:
    """Bounds a JSON byte stream while it is read, a chunk at a time with numpy (no Python
    work per byte): nesting depth, the length of one string, and the number of values
    (commas and openings), before ijson builds anything from them. yajl buffers a string
    that spans reads and re-scans it on every read (quadratic in its length), and ijson
    builds a deeply nested item in full, so both are stopped here first.

    It also records where the ``watch``-th top-level container closes (the end of the
    ``traceEvents`` list), so the keys after it are parsed once, not searched for.
    """

    def __init__(self, path: str, limits: Limits, watch: int = -1) -> None:
        self.path, self.limits, self.watch = path, limits, watch
        self.offset = 0  # bytes fed so far
        self.depth = 0
        self.in_string = False
        self.string_len = 0  # length so far of the open string
        self.pending_escape = False
        self.values = 0
        self.top_closed = 0  # top-level containers closed so far
        self.top_opened = 0
        self.watch_start = -1  # offset of the watched container's opening bracket
        self.watch_end = -1  # offset of the watched container's closing bracket
        self.last_item_end = -1  # offset of the last bracket closing an item of a top-level array

    def feed(self, chunk: bytes) -> None:
        if self.pending_escape and chunk:  # the byte after a backslash at the end of the last read
            chunk = b"_" + chunk[1:]
            self.pending_escape = False
        if b"\\" in chunk:
            chunk = _ESCAPE.sub(b"__", chunk)  # same length: offsets stay true
            if chunk.endswith(b"\\"):
                self.pending_escape = True
        started_in_string = self.in_string
        # Brackets outside strings: keep quotes and brackets, drop what is between quote pairs.
        kept = np.frombuffer(chunk.translate(_STEP, _NOT_STRUCTURE), np.int8)
        is_quote = kept == 34
        if len(chunk) <= self.limits.string_length:
            # Only a string that spans reads can be over the limit: its ends are the first and
            # last quote of a chunk, so two finds replace the positions of every quote.
            self._string_ends(chunk, int(np.count_nonzero(is_quote)))
        else:
            a = np.frombuffer(chunk, np.uint8)
            self._strings(np.flatnonzero(a == 34), len(a))
        # A bracket is outside strings when the quotes before it (and the open string the
        # chunk started in) are even: the parity of a uint8 running count (wrapping keeps it).
        is_bracket = (np.cumsum(is_quote, dtype=np.uint8) & 1) == int(started_in_string)
        is_bracket &= ~is_quote
        step = kept[is_bracket]  # +1 / -1 per bracket outside strings
        # Values: containers plus commas (commas inside strings count too: an over-estimate).
        self.values += int(np.count_nonzero(step == 1)) + int(np.count_nonzero(np.frombuffer(chunk, np.uint8) == 44))
        if len(step):
            depth = self.depth + np.cumsum(step, dtype=np.int64)
            top = int(depth.max())
            if top > self.limits.depth:
                raise LimitExceeded(self.path, "depth", top, self.limits.depth)
            if self.watch >= self.top_closed:
                if self.watch >= self.top_opened:
                    opens = np.flatnonzero((step == 1) & (depth == 2))
                    k = self.watch - self.top_opened
                    if k < len(opens):
                        self.watch_start = self.offset + _bracket_offset(chunk, started_in_string, int(opens[k]))
                    self.top_opened += len(opens)
                closes = np.flatnonzero((step == -1) & (depth == 1))
                k = self.watch - self.top_closed
                if k < len(closes):
                    self.watch_end = self.offset + _bracket_offset(chunk, started_in_string, int(closes[k]))
                self.top_closed += len(closes)
                # The last item end of a top-level array (a container closing at depth 3 -> 2).
                ends = np.flatnonzero((step == -1) & (depth == 2))
                if len(ends):
                    # Counted from the end of the read: brackets after it, then quotes and
                    # brackets after it, then its byte offset.
                    kept_after = len(kept) - 1 - _nth_hit_from_end(is_bracket, len(step) - 1 - int(ends[-1]))
                    at = _nth_hit_from_end(np.frombuffer(chunk, np.uint8), kept_after, _IS_STRUCTURE)
                    self.last_item_end = self.offset + at
            self.depth = int(depth[-1])
        if self.values > self.limits.objects:
            raise LimitExceeded(self.path, "objects", self.values, self.limits.objects)
        self.offset += len(chunk)

    def _string_ends(self, chunk: bytes, n_quotes: int) -> None:
        """Open-string state and the length of strings that cross this chunk's edges."""
        longest = 0
        if not n_quotes:
            if self.in_string:
                self.string_len += len(chunk)
                longest = self.string_len
        else:
            if self.in_string:
                longest = self.string_len + chunk.find(b'"')
            if (n_quotes + self.in_string) % 2:  # a string opens at the last quote
                self.in_string = True
                self.string_len = len(chunk) - chunk.rfind(b'"') - 1
                longest = max(longest, self.string_len)
            else:
                self.in_string = False
        if longest > self.limits.string_length:
            raise LimitExceeded(self.path, "string_length", longest, self.limits.string_length, " bytes")

    def _strings(self, quotes: np.ndarray, n: int) -> None:
        """Update the open-string state and check every string's length in this chunk."""
        longest = 0
        q = quotes
        if self.in_string:
            if not len(q):
                self.string_len += n
                longest = self.string_len
            else:
                longest = self.string_len + int(q[0])
                q = q[1:]
        if len(q):
            closed = q[: len(q) // 2 * 2]
            if len(closed):
                longest = max(longest, int((closed[1::2] - closed[0::2]).max()) - 1)
            if len(q) % 2:
                self.string_len = n - int(q[-1]) - 1
                longest = max(longest, self.string_len)
                self.in_string = True
            else:
                self.in_string = False
        elif self.in_string and len(quotes):
            self.in_string = False
        if longest > self.limits.string_length:
            raise LimitExceeded(self.path, "string_length", longest, self.limits.string_length, " bytes")


def _nth_hit_from_end(a: np.ndarray, n: int, table: np.ndarray | None = None) -> int:
    """Index of the ``n``-th hit of ``a`` counted from its end (0: the last), a hit being a
    True of ``a`` or of ``table[a]``. It looks at a window at the end, widened until it
    holds enough hits, so the usual case (an item ending near the end of a read) costs a
    few hundred elements, not a pass over the whole read."""
    width = 512
    while True:
        lo = max(0, len(a) - width)
        hits = np.flatnonzero(a[lo:] if table is None else table[a[lo:]])
        if len(hits) > n or lo == 0:
            return lo + int(hits[len(hits) - 1 - n])
        width *= 8


def _bracket_offset(chunk: bytes, started_in_string: bool, k: int) -> int:
    """Offset in the chunk of its ``k``-th bracket outside strings (twice per file)."""
    a = np.frombuffer(chunk, np.uint8)
    pos = np.flatnonzero(_IS_BRACKET[a])
    outside = (np.searchsorted(np.flatnonzero(a == 34), pos) + int(started_in_string)) % 2 == 0
    return int(pos[outside][k])


class TapReader:
    """File-like wrapper handed to ijson: maps I/O damage to InputError, checks the first
    byte, runs every chunk through :class:`_JsonGuard` and keeps a tail window, so the
    document is read once and the keys after the events come without a second pass.
    """

    def __init__(self, path: str, stream: IO[bytes], limits: Limits, watch: int = -1, keep_tail: int = 0) -> None:
        self.path = path
        self.stream = stream
        self.limits = limits
        self.started = False
        self.guard = _JsonGuard(path, limits, watch)
        self.keep_tail = keep_tail  # bytes of tail window to keep (0: none)
        self.tail: list[bytes] = []  # the last chunks, >= keep_tail bytes of them
        self.tail_bytes = 0

    def read(self, size: int = -1) -> bytes:
        """The next bytes, fed to the guard."""
        try:
            chunk = self.stream.read1(size) if hasattr(self.stream, "read1") else self.stream.read(size)
        except EOFError:  # gzip stream cut short
            raise InputError(f"{self.path}: truncated gzip file (compressed stream ended early)") from None
        except lzma.LZMAError as exc:
            raise InputError(f"{self.path}: corrupt xz file ({one_line(exc)})") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise InputError(f"{self.path}: corrupt gzip file ({one_line(exc)})") from None
        if not chunk:
            return chunk
        bytes_read(self.stream)
        if not self.started:
            if self.guard.offset == 0:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")  # yajl rejects a UTF-8 BOM
            first = chunk.lstrip()[:1]
            if not first:
                if self.guard.offset + len(chunk) > self.limits.header_bytes:
                    raise LimitExceeded(self.path, "header_bytes", None, self.limits.header_bytes, " bytes")
                self.guard.offset += len(chunk)
                return b" "  # whitespace so far; b"" would mean end of file to ijson
            self.started = True
            if first == b"[":
                raise InputError(f"{self.path}: a JSON array, not a Chrome trace object with a traceEvents list")
            if first != b"{":
                raise InputError(f"{self.path}: not JSON (does not start with '{{')")
        self.guard.feed(chunk)
        if self.keep_tail:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= self.keep_tail:
                self.tail_bytes -= len(self.tail.pop(0))
        return chunk

    def after(self, offset: int) -> bytes | None:
        """The document's bytes after ``offset``, or None when they left the tail window."""
        window = b"".join(self.tail)
        window_at = self.guard.offset - len(window)
        if offset < window_at or len(window) - (offset - window_at) > self.keep_tail:
            return None
        return window[offset - window_at :]


@dataclass
class TopLevel:
    """The top-level keys of a JSON object up to ``traceEvents`` (streamed, not searched)."""

    meta: dict[str, Any]
    has_events: bool = False  # a "traceEvents" key was reached
    events_is_list: bool = False
    events_index: int = -1  # how many top-level container values come before it


def scan_top_level(path: str, limits: Limits | None = None) -> TopLevel:
    """Stream the top-level members of a JSON object until ``traceEvents``, however large the
    values before it, within the header limit. Linear: ijson's events, each looked at once."""
    limits = limits or Limits.from_env()
    reader = TapReader(path, open_json(path, limits), limits)
    top = TopLevel(meta={})
    containers = 0
    with reader.stream:
        events = ijson.parse(reader, buf_size=CHUNK_BYTES, use_float=True)
        try:
            for prefix, event, key in events:
                if reader.guard.offset > limits.header_bytes:
                    raise LimitExceeded(path, "header_bytes", reader.guard.offset, limits.header_bytes, " bytes")
                if event != "map_key" or prefix != "":
                    continue
                _, first, value = next(events)
                if key == "traceEvents":
                    top.has_events, top.events_is_list, top.events_index = True, first == "start_array", containers
                    return top
                if first in ("start_map", "start_array"):
                    containers += 1
                    builder = ijson.ObjectBuilder()
                    builder.event(first, value)
                    level = 1
                    while level:
                        _, ev, val = next(events)
                        level += ev in ("start_map", "start_array")
                        level -= ev in ("end_map", "end_array")
                        builder.event(ev, val)
                    top.meta[key] = builder.value
                else:
                    top.meta[key] = value
        except ijson.JSONError as exc:
            if not reader.started:
                raise InputError(f"{path}: empty file") from None
            raise InputError(f"{path}: not valid JSON ({one_line(exc)})") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not valid JSON (bad UTF-8: {one_line(exc)})") from None
        except StopIteration:
            raise InputError(f"{path}: not valid JSON (it ends inside a value)") from None
    if not reader.started:
        raise InputError(f"{path}: empty file")
    return top
