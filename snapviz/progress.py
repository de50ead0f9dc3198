"""A progress bar with ETA for work counted in items (the runs a comparison analyses).

Drawn on stderr only when stderr is an interactive terminal, so CI logs, pipes and ``--json -``
stay clean; plain text, no colour (``NO_COLOR`` has nothing to turn off). click's own bar: no
new dependency.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click


def _no_step(n: int = 1) -> None:
    """The step of a progress that shows nothing."""


@contextmanager
def progress(total: int, label: str, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """``with progress(n, "analysing runs") as step: ... step(1)`` (a no-op when not a TTY)."""
    if not (enabled and total > 1 and sys.stderr.isatty()):
        yield _no_step
        return
    with click.progressbar(length=total, label=label, file=sys.stderr, show_eta=True, show_pos=True) as bar:
        yield bar.update
