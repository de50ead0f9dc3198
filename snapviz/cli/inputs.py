"""The inputs of the verbs that take several runs (compare, check, the notebook helpers): their
labels, and each one loaded and analysed into a summary dict or a small digest."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from snapviz.errors import InputError
from snapviz.load import labels as load_labels
from snapviz.progress import progress


def unique_labels(paths: Sequence[str], given: Sequence[str]) -> list[str]:
    """``--label`` values in input order; the rest from file or directory names, made unique."""
    return load_labels.unique_labels(paths, given, what="--label values")


def _analyze_input(path: str, label: str | None, stage_source: str) -> tuple[Any, dict[str, Any] | None]:
    """(Analysis, None) for a snapshot; (None, summary dict) for a trace-only run."""
    from snapviz.load import load

    run = load(path, label)
    if run.snapshot is None:
        try:
            from snapviz.analyses.trace_summary import analyze_trace_run, trace_summary_dict
        except ImportError:
            raise InputError(
                f"{path}: a trace without a memory snapshot; this snapviz build needs a snapshot here"
            ) from None
        return None, trace_summary_dict(analyze_trace_run(run))
    from snapviz.analyses.summary import analyze_run

    return analyze_run(run, stage_source=stage_source), None


def summarize_input(path: str, label: str | None = None, stage_source: str = "auto") -> tuple[dict[str, Any], Any]:
    """Load one input: the ``snapviz.summary/1`` dict and the Analysis (None for trace-only runs)."""
    an, doc = _analyze_input(path, label, stage_source)
    if an is None:
        assert doc is not None
        return doc, None
    from snapviz.analyses.summary import summary_dict

    return summary_dict(an), an


def digest_input(path: str, label: str, stage_source: str = "auto", points_per_label: int = 200) -> Any:
    """One input reduced to a :class:`~snapviz.analyses.digest.RunDigest` (the analysis is dropped)."""
    from snapviz.analyses.digest import digest_run, digest_summary

    an, doc = _analyze_input(path, label, stage_source)
    if an is None:
        assert doc is not None
        return digest_summary(doc, label)
    return digest_run(an, label, points_per_label=points_per_label)


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
