"""The inputs of the verbs that take several runs (compare, check, the notebook helpers): their
labels, and each one loaded and analysed into a summary dict or a small digest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from snapviz.errors import InputError
from snapviz.load import labels as load_labels

if TYPE_CHECKING:  # the analyses (pandas) load when a verb runs, not for --help
    from snapviz.analyses.analysis import Analysis
    from snapviz.analyses.digest import RunDigest
    from snapviz.analyses.document import Summary


def unique_labels(paths: Sequence[str], given: Sequence[str]) -> list[str]:
    """``--label`` values in input order; the rest from file or directory names, made unique."""
    return load_labels.unique_labels(paths, given, what="--label values")


def _analyze_input(path: str, label: str | None, stage_source: str) -> Analysis:
    """The API's analysis of one input, named ``label``: the replayed allocator for a snapshot,
    the profiler's totals for a trace-only run."""
    from snapviz.api import analyze
    from snapviz.load import load

    return analyze(load(path, label), stages_from=stage_source)


SUMMARY_JSON_MAX_BYTES = 256 << 20


def read_summary_json(path: str) -> Summary | None:
    """A ``snapviz.summary/1`` document written by ``analyze --json`` (this version or an
    older one), read back and checked field by field against the types; None when ``path``
    is not such a file (then it is a run, loaded as usual). A file that says it is one but is
    malformed is an :class:`InputError` naming the field (exit 2)."""
    import json
    import os

    from snapviz.analyses.document import load_summary
    from snapviz.vocab import SUMMARY_SCHEMA

    if not (os.path.isfile(path) and path.lower().endswith(".json")):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(256)
            # analyze --json writes the schema first; anything else (a trace) is left to the loader
            if SUMMARY_SCHEMA.encode() not in head:
                return None
            if os.path.getsize(path) > SUMMARY_JSON_MAX_BYTES:
                raise InputError(f"{path}: a {SUMMARY_SCHEMA} document over {SUMMARY_JSON_MAX_BYTES >> 20} MiB")
            f.seek(0)
            obj = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not readable as a {SUMMARY_SCHEMA} document ({type(e).__name__})") from None
    return load_summary(obj, path)


def document_input(path: str, label: str | None = None, stage_source: str = "auto") -> Summary:
    """The typed summary of one input: a summary JSON read back, or a run analysed."""
    from snapviz.analyses.pipeline import document_of

    doc = read_summary_json(path)
    return doc if doc is not None else document_of(_analyze_input(path, label, stage_source))


def digest_input(path: str, label: str, stage_source: str = "auto", points_per_label: int = 200) -> RunDigest:
    """One input reduced to a :class:`~snapviz.analyses.digest.RunDigest` (the analysis is dropped)."""
    from snapviz.analyses.pipeline import digest_of

    if (doc := read_summary_json(path)) is not None:  # an earlier analyze --json: stages and peaks
        from snapviz.analyses.digest import digest_summary

        return digest_summary(doc, label)
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
