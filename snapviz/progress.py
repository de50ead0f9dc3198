"""Progress on stderr for long work: a bar with ETA for counted work (runs compared, variants of a
matrix; :class:`Bar`), the bytes of a big input read (``click.progressbar``, fed by the loader's
readers through :func:`bytes_read`) and a status line for the steps after it.

Drawn only when stderr is an interactive terminal, never with ``-q`` (the verbs pass
``enabled=not quiet``) and never on stdout, so CI logs, pipes and ``--json -`` stay clean.
``SNAPVIZ_PROGRESS=always`` draws it anyway (a forced terminal: tests, ``script`` logs) and
``SNAPVIZ_PROGRESS=never`` turns it off. Plain text, no colour (``NO_COLOR`` has nothing to turn off).
"""

from __future__ import annotations

import io
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, TextIO, cast

from snapviz.units import fmt_bytes

ENV = "SNAPVIZ_PROGRESS"
BIG_INPUT = 32 << 20  # bytes on disk: about 400k trace entries, a few seconds of work
_CLEAR = "\r\033[K"
_WIDTH = 24  # characters of the bar itself
_REDRAW_S = 0.1  # at most ten redraws a second: a fast loop must not spend its time drawing


def wanted(enabled: bool = True) -> bool:
    """Whether to draw: asked for (not ``-q``), not turned off, and a terminal (or forced)."""
    mode = os.environ.get(ENV, "auto").strip().lower()
    if not enabled or mode == "never":
        return False
    if sys.stderr is None:  # closed when Python started (2>&-): nothing to show progress on
        return False
    return mode == "always" or sys.stderr.isatty()


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Bar:
    """``label [#####-----] done/total  pct%  eta mm:ss`` on one stderr line, redrawn in place;
    :meth:`note` prints a line above it. Safe to update from worker threads. When not
    :func:`wanted`, only the notes are printed."""

    def __init__(
        self,
        total: float,
        label: str,
        show: bool,
        fmt: Callable[[float], str] = lambda n: f"{n:,.0f}",
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.label, self.show, self.fmt = max(float(total), 1.0), label, show, fmt
        self.done = 0.0
        self._stream = stream
        self._t0 = time.monotonic()
        self._drawn_at = 0.0
        self._last = ""
        self._lock = threading.Lock()

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr  # looked up late: pytest's capsys swaps sys.stderr

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far; None until there is a rate to go by."""
        elapsed = time.monotonic() - self._t0
        if self.done <= 0 or elapsed < 1.0:
            return None
        return max(0.0, elapsed * (self.total - self.done) / self.done)

    def line(self) -> str:
        frac = min(1.0, self.done / self.total)
        filled = int(frac * _WIDTH)
        eta = self.eta_s()
        return (
            f"{self.label} [{'#' * filled}{'-' * (_WIDTH - filled)}] {self.fmt(self.done)}/{self.fmt(self.total)}"
            f"  {frac * 100:3.0f}%" + (f"  eta {_clock(eta)}" if eta is not None else "")
        )

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.show and (force or now - self._drawn_at >= _REDRAW_S):
            line = self.line()
            if line == self._last and not force:
                return  # a poll that found no new bytes: nothing to redraw
            self._drawn_at, self._last = now, line
            self.stream.write(_CLEAR + line)
            self.stream.flush()

    def set(self, done: float) -> None:
        with self._lock:
            self.done = min(float(done), self.total)
            self._draw(force=self.done >= self.total)

    def update(self, n: float = 1) -> None:
        with self._lock:
            self.done = min(self.done + n, self.total)
            self._draw(force=self.done >= self.total)

    def note(self, text: str) -> None:
        """A line printed above the bar (the bar is redrawn under it)."""
        with self._lock:
            self.stream.write((_CLEAR if self.show else "") + text + "\n")
            self._draw(force=True)
            self.stream.flush()

    def close(self) -> None:
        with self._lock:
            if self.show:
                self.stream.write(_CLEAR)
                self.stream.flush()
            self.show = False


def _no_step(n: int = 1) -> None:
    """The step of a progress that shows nothing."""


@contextmanager
def progress(total: int, label: str, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """``with progress(n, "analysing runs") as step: ... step(1)`` (a no-op when not drawn)."""
    if not (total > 1 and wanted(enabled)):
        yield _no_step
        return
    bar = Bar(total, label, show=True)
    try:
        yield bar.update
    finally:
        bar.close()


# ----------------------------------------------------------------------------- bytes read

# Where the loader's readers report the bytes they read (see :func:`bytes_read`); set by :func:`reading`.
_SINK: ContextVar[Callable[[IO[bytes]], None] | None] = ContextVar("snapviz_bytes_read", default=None)


def bytes_read(f: IO[bytes]) -> None:
    """Called by the loader's readers after each chunk they read of an input file (``f``: the
    stream they read, decompressing or not): the file's offset on disk feeds the bar of
    :func:`reading`, if one is drawn. A compressed input's offset counts compressed bytes, so
    the fraction of the file on disk is right for .gz/.xz/.zst inputs too."""
    sink = _SINK.get()
    if sink is not None:
        sink(f)


def _position(f: IO[bytes]) -> tuple[tuple[int, int], int] | None:
    """(device, inode) of the file under ``f`` and the descriptor's offset; None where unknown."""
    try:
        fd = f.fileno()
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino), os.lseek(fd, 0, os.SEEK_CUR)
    except (AttributeError, OSError, ValueError):  # no descriptor (an in-memory stream), or closed
        return None


class _Terminal(io.TextIOBase):
    """stderr, said to be a terminal: ``SNAPVIZ_PROGRESS=always`` draws the bar where click
    would only print its label (click draws on terminals only)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextmanager
def reading(paths: Sequence[str], label: str, enabled: bool = True) -> Iterator[Any]:
    """A bar (``click.progressbar``) of the bytes the loader reads of ``paths`` while the body
    loads them, for inputs of at least :data:`BIG_INPUT` bytes (any size when forced); None
    when no bar is drawn. The loader's readers report what they read through :func:`bytes_read`."""
    sizes: dict[tuple[int, int], int] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    total = sum(sizes.values())
    forced = os.environ.get(ENV, "").strip().lower() == "always"
    if not (sizes and wanted(enabled) and (total >= BIG_INPUT or forced)):
        yield None
        return
    import click  # noqa: PLC0415 - the loader imports this module; click only where a bar is drawn

    seen: dict[tuple[int, int], int] = {}
    stream = sys.stderr if sys.stderr.isatty() else cast(TextIO, _Terminal(sys.stderr))
    bar: Any = click.progressbar(
        length=max(total, 1),
        label=label,
        file=stream,
        show_percent=True,
        item_show_func=lambda _: f"{fmt_bytes(min(bar.pos, total))}/{fmt_bytes(total)}",
        width=_WIDTH,
        bar_template="%(label)s [%(bar)s]  %(info)s",  # as the other bars: label [####----]  info
    )

    def advance(f: IO[bytes]) -> None:
        at = _position(f)
        if at is not None and at[0] in sizes and at[1] > seen.get(at[0], 0):
            before = sum(seen.values())
            seen[at[0]] = min(at[1], sizes[at[0]])
            bar.update(sum(seen.values()) - before)

    token = _SINK.set(advance)
    try:
        with bar:
            yield bar
            bar.update(total - bar.pos)  # the body returned: every byte was read
    finally:
        _SINK.reset(token)


class Steps:
    """``snapviz: replaying the allocator… (3.2 s)``: one status line for the steps of a long
    analysis that have no count (after the bytes are read)."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self._t0 = time.monotonic()

    def step(self, what: str) -> None:
        if self.show:
            sys.stderr.write(f"{_CLEAR}snapviz: {what}… ({time.monotonic() - self._t0:.1f} s)")
            sys.stderr.flush()

    def done(self) -> None:
        if self.show:
            sys.stderr.write(_CLEAR)
            sys.stderr.flush()
