"""The one analysis pipeline (analyses/pipeline.py): the snapshot/trace choice is made there
only, and both analyses it returns satisfy the one RunAnalysis protocol and yield one typed
document."""

from __future__ import annotations

import re

import pytest

from paths import ROOT
from snapviz.analyses.document import Summary
from snapviz.analyses.pipeline import RunAnalysis, analyze_input, digest_of, document_of, summary_of
from snapviz.load import load

SAMPLE = ROOT / "sample_snapshots" / "sd15-fp16-profile-1step"


def _calls(name: str) -> set[str]:
    pat = re.compile(rf"\b{name}\(")
    out = set()
    for base in ("snapviz", "collectors"):
        for p in (ROOT / base).rglob("*.py"):
            text = p.read_text()
            if pat.search(text.replace(f"def {name}(", "")):
                out.add(str(p.relative_to(ROOT)))
    return out


def test_the_snapshot_or_trace_choice_is_made_in_the_pipeline_only() -> None:
    # trim needs a snapshot's replay (it refuses traces before any work): its one direct call
    assert _calls("analyze_run") <= {"snapviz/analyses/pipeline.py", "snapviz/cli/trim.py"}
    assert _calls("analyze_trace_run") == {"snapviz/analyses/pipeline.py"}
    # one summary builder, for both kinds, reached through the pipeline only
    assert _calls("build_summary") == {"snapviz/analyses/pipeline.py"}
    assert _calls("summary_dict") == _calls("trace_summary_dict") == set()
    assert _calls("stage_at") == set()  # the former trace labeller: stages.label_by_intervals is the one


@pytest.mark.parametrize("path, kind", [(SAMPLE, "snapshot"), (SAMPLE / "trace.json.gz", "trace")])
def test_one_protocol_one_document_for_both_kinds(path, kind: str) -> None:
    an = analyze_input(load(str(path)))
    assert isinstance(an, RunAnalysis) and an.kind == kind
    doc = document_of(an)
    assert isinstance(doc, Summary) and doc.is_trace == (kind == "trace")
    assert doc.peak.allocated_bytes == summary_of(an)["peak"]["allocated_bytes"] > 0
    # the stage holding the peak is the one the labeller puts the peak's moment in
    assert doc.peak.stage in {s.name for s in doc.stages} | {iv.name for s in doc.stages for iv in s.intervals}
    d = digest_of(an, "x")
    assert d.peak_allocated == doc.peak.allocated_bytes


def _plain_json(v: object, path: str = "") -> list[str]:
    """Paths in ``v`` holding anything but a plain JSON value (a numpy scalar, a tuple…)."""
    if isinstance(v, dict):
        return [
            p
            for k, x in v.items()
            for p in ([f"{path}.{k}: key"] if type(k) is not str else []) + _plain_json(x, f"{path}.{k}")
        ]
    if isinstance(v, list):
        return [p for i, x in enumerate(v) for p in _plain_json(x, f"{path}[{i}]")]
    return [] if type(v) in (str, int, float, bool, type(None)) else [f"{path}: {type(v).__name__}"]


@pytest.mark.parametrize(
    "path",
    [
        SAMPLE,
        SAMPLE / "trace.json.gz",
        ROOT / "sample_snapshots" / "sdxl-fp16-oom-10gb",
        ROOT / "sample_snapshots" / "mlp-train-plain",  # training section, training advice
    ],
)
def test_the_one_builder_yields_a_document_its_own_loader_reads_back_unchanged(path) -> None:
    # built directly as typed parts, each section by the analysis that computes it (no JSON round
    # trip on the way): what --json writes must be plain JSON (no numpy scalar slipped into a typed
    # field), and reading it back must give the same document
    from snapviz.analyses.document import from_json, to_json

    doc = document_of(analyze_input(load(str(path))))
    plain = to_json(doc)
    assert _plain_json(plain) == []
    assert from_json(plain, Summary) == doc
