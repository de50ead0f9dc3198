"""Process RSS for the recorder: the memory number of CPU runs (no caching allocator there)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


class RssSampler:
    """Process RSS, sampled at stage boundaries and by a light background thread."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import psutil

            proc = psutil.Process()
            self._read: Callable[[], int] = lambda: proc.memory_info().rss
        except ImportError:  # Linux fallback
            page = os.sysconf("SC_PAGE_SIZE")

            def read_statm() -> int:
                with open("/proc/self/statm") as fh:
                    return int(fh.read().split()[1]) * page

            self._read = read_statm

    def start(self) -> None:
        self._peak = self._read()
        self._thread = threading.Thread(target=self._loop, name="snapviz-rss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self._read()
            if rss > self._peak:
                self._peak = rss

    def read_and_reset(self) -> tuple[int, int]:
        """Return (current rss, peak since the last reset) and start a new peak window."""
        rss = self._read()
        peak = max(self._peak, rss)
        self._peak = rss
        return rss, peak

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
