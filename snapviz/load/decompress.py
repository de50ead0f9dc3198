"""Decompression for every input: gzip, xz, bz2 and zstd undone by magic bytes (not by the
name), bounded by the decompression limits (size and CPU time, :mod:`snapviz.load.limits`),
with decompressor errors as one line. Shared by the snapshot and trace readers."""

from __future__ import annotations

import bz2
import io
import lzma
import os
import time
import zlib
from collections.abc import Callable
from typing import IO, Any

from snapviz.errors import InputError
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.load.opener import open_regular
from snapviz.progress import bytes_read

_GZIP = b"\x1f\x8b"
_XZ = b"\xfd7zXZ\x00"
_BZ2 = b"BZh"
_ZSTD = b"\x28\xb5\x2f\xfd"


def _zstd_reader(raw: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        try:
            from compression import zstd  # type: ignore[import-not-found]  # Python 3.14
        except ImportError as exc:
            raise InputError("the file is zstd-compressed; install 'zstandard' or decompress it first") from exc
        return zstd.ZstdFile(raw)
    return zstandard.ZstdDecompressor().stream_reader(raw)


class _GzipMembers(io.RawIOBase):
    """gzip members one after another (as ``gzip -d``), decompressed by zlib in bounded pieces.

    Replaces :class:`gzip.GzipFile`, which skips the zero padding after a member one byte per
    Python call (100 MiB of padding: 40 s): here padding is dropped a 1 MiB read at a time, and
    ``tick`` (the time bound) is called for every compressed read, producing output or not."""

    _READ = 1 << 20

    def __init__(self, raw: IO[bytes], tick: Callable[[], None]) -> None:
        super().__init__()
        self._raw, self._tick = raw, tick
        self._d: Any = zlib.decompressobj(31)
        self._pending = b""  # compressed bytes not yet given to the decompressor
        self._eof = False

    def readable(self) -> bool:
        return True

    def _read(self) -> bytes:
        self._tick()
        return self._raw.read(self._READ)

    def read1(self, n: int = -1) -> bytes:
        n = n if n and n > 0 else self._READ
        while not self._eof:
            if self._d.eof:  # a member ended: skip zero padding, then the next member (if any)
                rest = (self._d.unused_data + self._pending).lstrip(b"\x00")
                while not rest:
                    chunk = self._read()
                    if not chunk:
                        self._eof = True
                        return b""
                    rest = chunk.lstrip(b"\x00")
                self._d, self._pending = zlib.decompressobj(31), rest
            if not self._pending:
                self._pending = self._read()
                if not self._pending:
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
            out = self._d.decompress(self._pending, n)
            self._pending = self._d.unconsumed_tail
            if out:
                return out
        return b""

    def readinto(self, b: Any) -> int:
        data = self.read1(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


class _DecompressErrors(io.RawIOBase):
    """FIX (tests/unit/test_safe_load.py): a corrupt gzip/xz body raised zlib.error / LZMAError,
    which no caller caught (``load()`` sniffs the first 4 KiB before unpickling). Every
    decompressor error now becomes one InputError line naming the file."""

    def __init__(self, inner: IO[bytes], raw: IO[bytes], path: str, kind: str = "compressed") -> None:
        super().__init__()
        self._inner, self._raw, self._path, self._kind = inner, raw, path, kind

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The compressed file's descriptor (its offset: the progress of the read)."""
        return self._raw.fileno()

    def readinto(self, b: Any) -> int:
        try:
            # read1: one decompressed piece at a time, so the data before a truncation point
            # is delivered before the error (a truncated trace is still recognised as one).
            data = self._inner.read1(len(b))  # type: ignore[attr-defined]
            b[: len(data)] = data
            return len(data)
        except (EOFError, OSError, ValueError, lzma.LZMAError, zlib.error) as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            what = "truncated" if isinstance(exc, EOFError) else "corrupt"
            raise InputError(f"{self._path}: {what} {self._kind} file ({detail})") from None

    def close(self) -> None:
        try:
            self._inner.close()
            self._raw.close()  # GzipFile/LZMAFile leave a passed-in file object open
        finally:
            super().close()


class _Bounded(io.RawIOBase):
    """Counts decompressed bytes as they come and stops a decompression bomb: more than
    ``limits.ratio`` times the file's size (once past ``limits.ratio_floor``) is refused."""

    def __init__(
        self, inner: _DecompressErrors, path: str, file_size: int, limits: Limits, clock: DecompressClock
    ) -> None:
        super().__init__()
        self._inner, self._path = inner, path
        self._budget = max(limits.ratio * file_size, limits.ratio_floor)
        self._ratio = limits.ratio
        self._clock = clock
        self.count = 0

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._inner.fileno()

    def readinto(self, b: Any) -> int:
        with self._clock:
            got = self._inner.readinto(b)
        self.count += got or 0
        if self.count > self._budget:
            raise LimitExceeded(self._path, "ratio", None, self._ratio, "x")
        return got

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


def open_decompressed(
    path: str | os.PathLike[str], what: str = "snapshot file (and not a run directory)", limits: Limits | None = None
) -> IO[bytes]:
    """Open ``path`` for reading, undoing gzip/xz/bz2/zstd by magic bytes, not by extension.

    Only regular files are opened (a FIFO would block, a device never ends), and the
    decompressed stream stops at the decompression limit (:mod:`snapviz.load.limits`).
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        raise InputError(f"{p}: is a directory, not a {what}")
    limits = limits or Limits.from_env()
    raw = open_regular(p)
    head = raw.read(6)
    raw.seek(0)
    inner: IO[bytes]
    kind = {_GZIP: "gzip", _XZ: "xz", _BZ2: "bz2", _ZSTD: "zstd"}.get(
        next((m for m in (_GZIP, _XZ, _BZ2, _ZSTD) if head.startswith(m)), b""), "compressed"
    )
    clock = DecompressClock(p, limits)
    if head.startswith(_GZIP):
        inner = _GzipMembers(raw, clock.check)  # type: ignore[assignment]
    elif head.startswith(_XZ):
        inner = lzma.LZMAFile(raw, "rb")
    elif head.startswith(_BZ2):
        inner = bz2.BZ2File(raw, "rb")
    elif head.startswith(_ZSTD):
        try:
            inner = _zstd_reader(raw)
        except InputError:
            raw.close()
            raise InputError(f"{p}: the file is zstd-compressed; install 'zstandard' or decompress it first") from None
    else:
        return raw
    size = os.fstat(raw.fileno()).st_size
    return io.BufferedReader(_Bounded(_DecompressErrors(inner, raw, p, kind), p, size, limits, clock), 1 << 20)


class DecompressClock:
    """The time bound of one file's decompression: CPU time spent *inside* the decompressor
    (``with clock:`` around each read), not the parser's time between reads nor other processes'
    load; :meth:`check` is also called from within a read (the gzip reader, per compressed read)."""

    def __init__(self, path: str, limits: Limits) -> None:
        self._path, self._limits = path, limits
        self._spent = 0.0
        self._since: float | None = None

    def __enter__(self) -> None:
        self._since = time.process_time()
        self.check()

    def __exit__(self, *exc: object) -> None:
        if self._since is not None:
            self._spent += time.process_time() - self._since
            self._since = None

    def check(self) -> None:
        spent = self._spent + (time.process_time() - self._since if self._since is not None else 0.0)
        if spent > self._limits.decompress_seconds:
            raise LimitExceeded(self._path, "decompress_seconds", None, self._limits.decompress_seconds, " s")


def read_all(f: IO[bytes]) -> bytes:
    """The whole (already bounded) stream as one bytes object, read in 1 MiB steps; a plain
    file in one read into a buffer of its size (no second copy to join the pieces: the
    buffered reader's read-ahead from the magic-byte check would be joined to the rest,
    a copy of the whole file)."""
    raw = getattr(f, "raw", None)
    if isinstance(raw, io.FileIO):
        raw.seek(f.tell())
        data = raw.readall()
        f.seek(0, io.SEEK_END)  # the buffered reader drops its read-ahead and agrees with the file
        bytes_read(f)
        return data
    parts: list[bytes] = []
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        bytes_read(f)
