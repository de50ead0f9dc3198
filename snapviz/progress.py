"""Progress on stderr for long work: a bar with ETA for counted work (runs compared, variants of a
matrix, bytes of a big input read) and a status line for the steps after it.

Drawn only when stderr is an interactive terminal, never with ``-q`` (the verbs pass
``enabled=not quiet``) and never on stdout, so CI logs, pipes and ``--json -`` stay clean.
``SNAPVIZ_PROGRESS=always`` draws it anyway (a forced terminal: tests, ``script`` logs) and
``SNAPVIZ_PROGRESS=never`` turns it off. Plain text, no colour (``NO_COLOR`` has nothing to turn off).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

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


def _offsets(paths: set[str]) -> dict[str, int]:
    """The kernel's read offset of every open file of this process among ``paths`` (Linux
    /proc; empty elsewhere). A compressed input's offset counts compressed bytes, so the
    fraction of the file on disk is right for .gz/.xz/.zst inputs too."""
    out: dict[str, int] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target not in paths:
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                pos = int(next(ln for ln in f if ln.startswith("pos:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue  # closed meanwhile
        out[target] = max(pos, out.get(target, 0))
    return out


@contextmanager
def reading(paths: Sequence[str], label: str, enabled: bool = True, poll_s: float = 0.2) -> Iterator[Bar | None]:
    """A bar of the bytes read from ``paths`` while the body loads them, for inputs of at least
    :data:`BIG_INPUT` bytes (any size when forced). The loader is not touched: a thread reads
    the files' offsets from /proc every ``poll_s`` (no bar where there is no /proc)."""
    real = {os.path.realpath(p): os.path.getsize(p) for p in paths if os.path.isfile(p)}
    total = sum(real.values())
    forced = os.environ.get(ENV, "").strip().lower() == "always"
    if not (real and wanted(enabled) and (total >= BIG_INPUT or forced) and os.path.isdir("/proc/self/fdinfo")):
        yield None
        return
    bar = Bar(total, label, show=True, fmt=fmt_bytes)
    seen: dict[str, int] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(poll_s):
            for path, pos in _offsets(set(real)).items():
                seen[path] = max(pos, seen.get(path, 0))
            bar.set(sum(seen.values()))

    watcher = threading.Thread(target=poll, name="snapviz-progress", daemon=True)
    watcher.start()
    try:
        yield bar
        stop.set()
        watcher.join()
        bar.set(total)  # the body returned: every byte was read (the files are closed, no offsets left)
    finally:
        stop.set()
        watcher.join()
        bar.close()


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
