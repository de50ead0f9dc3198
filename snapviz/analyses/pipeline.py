"""The one analysis pipeline: a loaded run in, one :class:`~snapviz.analyses.analysis.Analysis`
out, then its summary document and its compare digest.

The snapshot/trace choice is made here, once: a run with a snapshot is replayed
(:func:`snapviz.analyses.summary.analyze_run`, exact allocator blocks), a trace-only run is
read from the profiler's own totals (:func:`snapviz.analyses.trace_summary.analyze_trace_run`);
both yield the one ``Analysis`` type, its ``kind`` and ``capabilities`` saying which.
Every caller (the API, the CLI verbs, the notebook helpers, the collectors) goes through
:func:`analyze_input`, :func:`summary_of` and :func:`digest_of`, never through the two
analyses directly.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from snapviz.analyses.frame_rules import RuleSet
from snapviz.errors import InputError
from snapviz.load import Run

if TYPE_CHECKING:
    from snapviz.analyses.digest import RunDigest
    from snapviz.analyses.document import Summary

from snapviz.analyses.analysis import Analysis, Kind

__all__ = ["Analysis", "Kind", "analyze_input", "digest_of", "document_of", "summary_of"]


def analyze_input(
    run: Run, device: int | None = None, stage_source: str = "auto", rules: RuleSet | None = None
) -> Analysis:
    """The analysis of one loaded run on one device: replayed when it holds a snapshot, read
    from the profiler's totals when it holds only a trace (``stage_source`` and ``rules``
    apply to snapshots; a trace takes its stages from its ranges or run.json)."""
    if run.snapshot is not None:
        from snapviz.analyses.summary import analyze_run

        return analyze_run(run, device=device, stage_source=stage_source, rules=rules)
    if run.trace is None:
        raise InputError(f"{run.source}: neither a snapshot nor a trace to analyse")
    from snapviz.analyses.trace_summary import analyze_trace_run

    return analyze_trace_run(run, device=device)


def summary_of(an: Analysis) -> dict[str, Any]:
    """The ``snapviz.summary/1`` document of any analysis as plain JSON (what ``--json`` writes):
    :func:`document_of`, encoded."""
    from snapviz.analyses.document import to_json

    return typing.cast(dict[str, Any], to_json(document_of(an)))


def document_of(an: Analysis) -> Summary:
    """The typed ``snapviz.summary/1`` document of any analysis, from the one builder
    (:func:`snapviz.analyses.summary_builder.build_summary`): what the gate and every renderer
    take. A section that does not match its type is snapviz's bug, reported as such."""
    from snapviz.analyses.summary_builder import build_summary

    try:
        return build_summary(an)
    except InputError as e:  # a section's JSON, not the user's input: a bug to report
        raise RuntimeError(f"snapviz built a summary that does not match its types: {e}") from None


def digest_of(an: Analysis, label: str, points_per_label: int = 200) -> RunDigest:
    """Any analysis reduced to what a comparison needs."""
    from snapviz.analyses.digest import digest_run, digest_trace

    if an.kind == "snapshot":
        return digest_run(an, label, points_per_label=points_per_label)
    return digest_trace(an, label, points_per_label=points_per_label)
