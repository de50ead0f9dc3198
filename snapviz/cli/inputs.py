"""The inputs of the verbs that take several runs (compare, check, the notebook helpers): their
labels, and each one loaded and analysed into a summary dict or a small digest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from snapviz.errors import InputError
from snapviz.load import labels as load_labels

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
    from snapviz.analyses.pipeline import digest_of

    return digest_of(_analyze_input(path, label, stage_source), label, points_per_label=points_per_label)


def digest_inputs(
    items: list[tuple[str, str]],
    stage_source: str,
    points_per_label: int,
    jobs: int | None,
    show_progress: bool = True,
    scheduler: str | None = None,
) -> list[Any]:
    """Digest every input, ``jobs`` at a time in worker processes or on a Dask cluster
    (:func:`snapviz.engine.run_tasks`: each run is loaded, analysed and reduced independently;
    only the small digests come back). The first input that fails is this call's error."""
    from snapviz.engine import TaskFailed, run_tasks

    out = run_tasks(
        digest_input,
        [p for p, _ in items],
        [(p, lab, stage_source, points_per_label) for p, lab in items],
        jobs=jobs,
        scheduler=scheduler,
        show_progress=show_progress,
    )
    for r in out:
        if isinstance(r, TaskFailed):
            raise InputError(r.reason)
    return out


FLEET_SITES = 5  # sites a fleet digest keeps (the table shows the top one)


def fleet_digest(source: str, label: str, stage_source: str = "auto") -> RunDigest:
    """One run of a fleet (``ranks``, ``history``) digested where it runs: a local path or a URL
    fetched to a temporary copy; stage peaks, OOMs and the top sites only (no timeline)."""
    from snapviz.load.fleet import local_copy

    with local_copy(source) as path:
        d = digest_input(path, label, stage_source, points_per_label=2)
    d.source = source
    d.timeline = d.timeline.iloc[:0]
    d.sites = d.sites.head(FLEET_SITES).reset_index(drop=True)
    return d
