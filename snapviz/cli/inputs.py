"""The inputs of the verbs that take several runs (compare, check, the notebook helpers): their
labels, and each one loaded and analysed into a summary dict or a small digest."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from snapviz.load import labels as load_labels
from snapviz.progress import progress

if TYPE_CHECKING:  # the analyses (pandas) load when a verb runs, not for --help
    from snapviz.analyses.digest import RunDigest
    from snapviz.analyses.summary import Analysis
    from snapviz.api import RunAnalysis


def unique_labels(paths: Sequence[str], given: Sequence[str]) -> list[str]:
    """``--label`` values in input order; the rest from file or directory names, made unique."""
    return load_labels.unique_labels(paths, given, what="--label values")


def _analyze_input(path: str, label: str | None, stage_source: str) -> RunAnalysis:
    """The API's analysis of one input, named ``label``: the replayed allocator for a snapshot,
    the profiler's totals for a trace-only run."""
    from snapviz.api import analyze
    from snapviz.load import load

    return analyze(load(path, label), stages_from=stage_source)


def summarize_input(
    path: str, label: str | None = None, stage_source: str = "auto"
) -> tuple[dict[str, Any], Analysis | None]:
    """Load one input: the ``snapviz.summary/1`` dict and the Analysis (None for trace-only runs)."""
    from snapviz.analyses.summary import Analysis

    an = _analyze_input(path, label, stage_source)
    return an.summary(), (an if isinstance(an, Analysis) else None)


def digest_input(path: str, label: str, stage_source: str = "auto", points_per_label: int = 200) -> RunDigest:
    """One input reduced to a :class:`~snapviz.analyses.digest.RunDigest` (the analysis is dropped)."""
    from snapviz.analyses.digest import digest_run, digest_trace
    from snapviz.analyses.summary import Analysis

    an = _analyze_input(path, label, stage_source)
    if isinstance(an, Analysis):
        return digest_run(an, label, points_per_label=points_per_label)
    return digest_trace(an, label, points_per_label=points_per_label)


def digest_inputs(
    items: list[tuple[str, str]], stage_source: str, points_per_label: int, jobs: int | None, show_progress: bool = True
) -> list[Any]:
    """Digest every input, ``jobs`` at a time in worker processes (each run is loaded,
    analysed and reduced independently; only the small digests come back)."""
    n = min(len(items), jobs if jobs else min(os.cpu_count() or 1, 4))
    with progress(len(items), "snapviz: analysing runs", enabled=show_progress) as step:
        if n <= 1:
            out = []
            for p, lab in items:
                out.append(digest_input(p, lab, stage_source, points_per_label))
                step(1)
            return out
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(digest_input, p, lab, stage_source, points_per_label) for p, lab in items]
            for _ in as_completed(futures):
                step(1)
            return [f.result() for f in futures]
