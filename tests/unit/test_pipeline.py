"""The one analysis pipeline (analyses/pipeline.py): the snapshot/trace choice is made there
only, and it returns one ``Analysis`` type for both kinds, with the same parts and one typed
document."""

from __future__ import annotations

import re

import pytest

from paths import ROOT
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import Summary
from snapviz.analyses.pipeline import analyze_input, digest_of, document_of, summary_of
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
    # one result type: no other analysis class, no protocol over two
    classes = {
        m.group(1)
        for p in (ROOT / "snapviz").rglob("*.py")
        for m in re.finditer(r"^class (\w*Analysis\w*)\b", p.read_text(), re.M)
    }
    assert classes == {"Analysis"}


def test_one_kind_evidence_is_refused_by_the_other() -> None:
    """What only a replay has is not silently empty on a trace analysis (and the reverse)."""
    snap, trace = (analyze_input(load(str(p))) for p in (SAMPLE, SAMPLE / "trace.json.gz"))
    assert snap.replay.peak_allocated == document_of(snap).peak.allocated_bytes
    assert len(trace.trace.timeline) == len(trace.timeline)
    with pytest.raises(AttributeError, match="only a replayed snapshot"):
        trace.replay  # noqa: B018
    with pytest.raises(AttributeError, match="snapshot analysis has no 'trace'"):
        snap.trace  # noqa: B018


@pytest.mark.parametrize("path, kind", [(SAMPLE, "snapshot"), (SAMPLE / "trace.json.gz", "trace")])
def test_one_analysis_one_document_for_both_kinds(path, kind: str) -> None:
    an = analyze_input(load(str(path)))
    assert type(an) is Analysis and an.kind == kind
    # the same parts, whichever the input: a timeline with one stage per event, one stage table
    ev = an.events
    assert {"time_us", "allocated", "reserved", "stage"} <= set(ev.columns) and len(ev) == len(an.labels.labels) > 0
    assert {"name", "group", "start_us", "end_us", "peak_allocated_bytes", "peak_reserved_bytes"} <= set(an.stages)
    assert set(an.stage_groups()["name"]) == set(an.stages["group"])
    # what the input can tell: blocks only from a replay; this trace records the allocator's totals
    assert an.capabilities.exact_blocks == (kind == "snapshot")
    assert an.capabilities.reserved_recorded and an.capabilities.exact_totals
    doc = document_of(an)
    assert doc.peak.stage == an.peak_stage and doc.peak.event_index == an.peak_index
    assert doc.peak.allocated_bytes == int(ev["allocated"].iat[an.peak_index])
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


T0 = 1_796_000_000_000_000  # absolute Unix µs


def _trace_run(d, memory: list[tuple[int, int]], ranges: list[tuple[str, int, int]], run_stages=()) -> str:
    """A run directory with a CUDA profiler trace: ``memory`` is (µs, signed bytes) per
    ``[memory]`` event, ``ranges`` its record_function ranges, ``run_stages`` run.json's."""
    import json

    events: list[dict] = [
        {"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": T0 + a, "dur": b - a}
        for n, a, b in ranges
    ]
    total = 0
    for k, (ts, nbytes) in enumerate(memory):
        total += nbytes
        args = {"Total Reserved": 1 << 30, "Total Allocated": total, "Bytes": nbytes, "Device Id": 0}
        args |= {"Device Type": 1, "Addr": 0x1000 * (k + 1)}
        events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": T0 + ts, "args": args})
    d.mkdir()
    (d / "trace.json").write_text(json.dumps({"traceEvents": events}))
    stages = [{"name": n, "start_us": T0 + a, "end_us": T0 + b} for n, a, b in run_stages]
    (d / "run.json").write_text(json.dumps({"schema": "snapviz.run/1", "stages": stages}))
    return str(d)


def test_a_trace_report_and_summary_use_the_analysis_one_labelling(tmp_path) -> None:
    """No ranges in the trace: the stages are run.json's, and say so; a moment inside two stages
    with the same start is in the shorter (the one rule), in the summary and the report alike."""
    from snapviz.render.html.trace_data import trace_report_data

    path = _trace_run(
        tmp_path / "run",
        [(150, 1 << 20), (250, 2 << 20), (600, 8 << 20), (700, -(8 << 20))],
        [],
        [("denoise/0", 100, 400), ("denoise", 100, 800)],  # the step listed first
    )
    an = analyze_input(load(path))
    assert an.kind == "trace" and an.labels.source == "run.json"
    assert list(an.labels.labels) == ["denoise/0", "denoise/0", "denoise", "denoise"]
    doc = document_of(an)
    assert doc.stage_source == "run.json" and doc.peak.stage == an.peak_stage == "denoise"
    view = trace_report_data(an, doc, max_points=100)
    shown = [view.stage_names[c] for c in view.timeline.stage]
    assert shown == list(an.labels.labels)


def test_a_trace_without_memory_events_claims_nothing_exact(tmp_path) -> None:
    an = analyze_input(load(_trace_run(tmp_path / "run", [], [("denoise", 0, 100)])))
    caps = an.capabilities
    assert not (caps.exact_blocks or caps.reserved_recorded or caps.exact_totals)
    doc = document_of(an)
    assert doc.peak.exact is False and doc.history.baseline_exact is False and an.peak_index == -1
