"""Where the per-file tasks of the verbs over many inputs run (``compare``, ``ranks``,
``history``): one task per input, each returning a small digest, on an existing engine:

* a local process pool (:mod:`concurrent.futures`), the default;
* a **Dask distributed** cluster, given its scheduler's address (``--scheduler`` or
  ``SNAPVIZ_DASK_SCHEDULER``; ``pip install 'snapviz[fleet]'``). Dask places, retries and
  balances the tasks; nothing here schedules anything.

A task that raises becomes a :class:`TaskFailed` row (the input and why), never an error of
the whole run, and progress advances once per finished input (``snapviz.progress``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from snapviz.errors import InputError
from snapviz.progress import progress

SCHEDULER_ENV = "SNAPVIZ_DASK_SCHEDULER"
DASK_INSTALL = "pip install 'snapviz[fleet]'"
CONNECT_TIMEOUT_S = 20


@dataclass(frozen=True)
class TaskFailed:
    """One input that could not be digested, and why (one line, from the error)."""

    source: str
    reason: str


def _reason(exc: BaseException) -> str:
    if isinstance(exc, InputError):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def guarded(fn: Callable[..., Any], source: str, args: tuple[Any, ...]) -> Any:
    """``fn(*args)``, or a :class:`TaskFailed` saying why it raised (runs on the worker, so a
    bad file costs one row, not the run; MemoryError included: one analysis too big)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - every failure of one file is that file's row
        return TaskFailed(source, _reason(exc))


def scheduler_address(option: str | None) -> str | None:
    """``--scheduler`` if given, else ``SNAPVIZ_DASK_SCHEDULER``, else None (local processes)."""
    addr = option if option is not None else os.environ.get(SCHEDULER_ENV)
    addr = (addr or "").strip()
    return addr or None


def local_workers(jobs: int | None, n_tasks: int) -> int:
    """Worker processes for ``n_tasks``: ``jobs``, else the CPUs (at most 4), never more than tasks."""
    return max(1, min(n_tasks, jobs if jobs else min(os.cpu_count() or 1, 4)))


def run_tasks(
    fn: Callable[..., Any],
    sources: Sequence[str],
    args: Sequence[tuple[Any, ...]],
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    show_progress: bool = True,
    label: str = "snapviz: analysing runs",
) -> list[Any]:
    """``fn(*args[i])`` for every input, in input order; a failed one is a :class:`TaskFailed`.

    ``scheduler`` is a Dask scheduler address (``tcp://host:8786``); without one, ``jobs``
    local processes run the tasks (1: in this process)."""
    if len(sources) != len(args):
        raise ValueError("one source per task")
    if not args:
        return []
    with progress(len(args), label, enabled=show_progress) as step:
        if scheduler:
            return _on_dask(fn, sources, args, scheduler, step)
        n = local_workers(jobs, len(args))
        if n <= 1:
            out = []
            for src, a in zip(sources, args, strict=True):
                out.append(guarded(fn, src, a))
                step(1)
            return out
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(guarded, fn, src, a) for src, a in zip(sources, args, strict=True)]
            for _ in as_completed(futures):
                step(1)
            return [_result(f, src) for f, src in zip(futures, sources, strict=True)]


def _result(future: Any, source: str) -> Any:
    """A finished future's value; a worker that died (killed for memory, a crash) fails its input only."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - BrokenProcessPool, KilledWorker, ...
        return TaskFailed(source, "the worker running it died: " + _reason(exc))


def _on_dask(
    fn: Callable[..., Any],
    sources: Sequence[str],
    args: Sequence[tuple[Any, ...]],
    address: str,
    step: Callable[[int], None],
) -> list[Any]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise InputError(f"--scheduler needs Dask distributed: {DASK_INSTALL}") from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(f"cannot reach the Dask scheduler at {address}: {_reason(exc)}") from None
    with client:
        # pure=False: the same path twice is two tasks (files change between runs); names
        # are left to Dask. The inputs are paths or URLs, so only they travel to the workers.
        futures = client.map(guarded, [fn] * len(args), list(sources), list(args), pure=False)
        for _ in as_completed(futures, loop=client.loop):
            step(1)
        return [_result(f, src) for f, src in zip(futures, sources, strict=True)]
