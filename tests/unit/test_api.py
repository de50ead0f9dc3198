"""The public API (snapviz.analyze / compare / check): its docstring examples, trace-only runs,
typed frozen results, and no state hidden on the loaded run."""

from __future__ import annotations

import dataclasses
import doctest
import shutil
from pathlib import Path

import pandas as pd
import pytest

import snapviz
import snapviz.api
from paths import ROOT, SAMPLES
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.frame_rules import load_rules

CLASSIC = SAMPLES / "sd15-fp16-classic"
SDPA = SAMPLES / "sd15-fp16-sdpa"
PROFILED = SAMPLES / "sd15-fp16-profile-1step"
CLASSIC_PEAK = 3324129280  # run.json: torch.cuda.max_memory_allocated() of that run
SDPA_PEAK = 2831357440


@pytest.fixture(scope="module")
def classic() -> Analysis:
    an = snapviz.analyze(str(CLASSIC))
    assert isinstance(an, Analysis)
    return an


@pytest.fixture
def trace_run_dir(tmp_path: Path) -> Path:
    """A collector's run directory that holds a trace and no snapshot (a CPU run, say)."""
    for name in ("run.json", "trace.json.gz"):
        shutil.copy(PROFILED / name, tmp_path / name)
    return tmp_path


def test_docstring_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the examples name bundled samples relative to the repository
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(snapviz.api) if t.examples]
    assert {t.name.rsplit(".", 1)[-1] for t in tests} == {"analyze", "compare", "check"}
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


def test_public_names_resolve_to_the_api() -> None:
    assert snapviz.analyze is snapviz.api.analyze and snapviz.check is snapviz.api.check
    assert snapviz.compare is snapviz.api.compare
    assert all(getattr(snapviz, name) is not None for name in snapviz.__all__)  # every exported name resolves
    assert snapviz.Analysis is Analysis
    with pytest.raises(AttributeError):
        snapviz.timeline  # noqa: B018 - a name the package does not have stays an AttributeError


def test_trace_only_run_directory_is_analysed(trace_run_dir: Path) -> None:
    run = snapviz.load(str(trace_run_dir))
    assert run.snapshot is None and run.trace is not None and run.run_json is not None
    an = snapviz.analyze(run)
    assert isinstance(an, Analysis) and an.kind == "trace"
    doc = an.summary()
    assert doc["kind"] == "trace" and doc["source"] == str(trace_run_dir)
    # The profiler's own totals: the summary's peak is the timeline's maximum.
    assert doc["peak"]["allocated_bytes"] == int(an.timeline["allocated"].max()) > 0
    assert len(an.stages) and set(doc["run"]) >= {"pipeline", "steps"}


def test_analysis_attributes_named_in_docs_exist(classic: Analysis) -> None:
    ev = classic.events
    assert list(ev[["time_us", "allocated", "reserved", "stage"]].columns) == [
        "time_us",
        "allocated",
        "reserved",
        "stage",
    ]
    assert int(ev["allocated"].max()) == classic.replay.peak_allocated == CLASSIC_PEAK
    for table in (classic.stages, classic.top_allocations, classic.attention, classic.categories):
        assert isinstance(table, pd.DataFrame) and len(table)
    assert classic.summary()["peak"]["stage"] == classic.peak_stage == "denoise/1"


def test_results_are_frozen(classic: Analysis) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        classic.device = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        classic.run.label = "x"  # type: ignore[misc]


def test_run_json_is_held_once_and_nothing_is_forwarded(classic: Analysis) -> None:
    run = classic.run
    assert run.run_json is not None and run.run_json["allocator"]["max_memory_allocated"] == CLASSIC_PEAK
    assert not hasattr(run.snapshot, "run")  # the snapshot is the file's content only
    assert not hasattr(run, "events")  # a Run does not pose as its snapshot


def test_rules_given_as_a_file_or_a_ruleset_alike(classic: Analysis, tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text('{"schema": "snapviz.rules/1", "extends": "builtin", "rules": []}')
    by_path = snapviz.analyze(str(CLASSIC), rules=str(rules))
    by_set = snapviz.analyze(str(CLASSIC), rules=load_rules(str(rules)))
    assert by_path.summary() == by_set.summary() == classic.summary()


def test_bad_options_are_input_errors(classic: Analysis) -> None:
    with pytest.raises(snapviz.InputError, match="stages_from"):
        snapviz.analyze(classic.run, stages_from="guess")
    with pytest.raises(snapviz.InputError, match="nothing to check"):
        snapviz.check(classic)
    with pytest.raises(snapviz.InputError, match="go together"):
        snapviz.check(classic, baseline=str(SDPA))
    with pytest.raises(snapviz.InputError, match="max_peak"):
        snapviz.check(classic, max_peak="12G")  # ambiguous unit, as on the command line
    with pytest.raises(snapviz.InputError, match="'decode' is not in"):
        snapviz.check(classic, max_stage_peak={"decode": 1})
    with pytest.raises(snapviz.InputError, match="3 labels for 2 inputs"):
        snapviz.compare(classic, str(SDPA), labels=["a", "b", "c"])


def test_check_against_a_baseline(classic: Analysis) -> None:
    result = snapviz.check(classic, baseline=str(SDPA), max_increase="5%")
    (gate,) = result.gates
    assert (gate.actual, gate.limit) == (CLASSIC_PEAK, int(SDPA_PEAK * 1.05))
    assert not result.passed and result.failures == (gate,) and gate.name == "increase_over_baseline"
    ok = snapviz.check(str(SDPA), baseline=classic, max_increase=0, max_peak=SDPA_PEAK)
    assert ok.passed and [g.actual for g in ok.gates] == [SDPA_PEAK, SDPA_PEAK]


def test_compare_takes_paths_runs_and_analyses_alike(classic: Analysis) -> None:
    by_path = snapviz.compare(str(CLASSIC), str(SDPA))
    mixed = snapviz.compare(classic, snapviz.load(str(SDPA)))
    assert mixed.labels == by_path.labels == ["sd15-fp16-classic", "sd15-fp16-sdpa"]
    assert mixed.summary() == by_path.summary()
    runs = by_path.runs.set_index("label")["peak_allocated_bytes"].to_dict()
    assert runs == {"sd15-fp16-classic": CLASSIC_PEAK, "sd15-fp16-sdpa": SDPA_PEAK}
    named = snapviz.compare(classic, str(SDPA), labels=["classic", "sdpa"])
    assert named.labels == ["classic", "sdpa"]


def test_compare_with_a_trace_only_run(classic: Analysis, trace_run_dir: Path) -> None:
    cmp = snapviz.compare(classic, str(trace_run_dir))
    trace_peak = snapviz.analyze(str(trace_run_dir)).summary()["peak"]["allocated_bytes"]
    assert cmp.runs["peak_allocated_bytes"].tolist() == [CLASSIC_PEAK, trace_peak]


def test_loaded_objects_print_short() -> None:
    """Issue 21: ``print(run)`` dumped ~60,000 characters of tables. Every loaded or analysed object
    prints one short line that says what it is: kind, source, devices, events, peak."""
    import snapviz
    from paths import ROOT

    sample = ROOT / "sample_snapshots" / "sd15-fp16-profile-1step"
    run = snapviz.load(str(sample))
    assert run.snapshot is not None and run.trace is not None
    an = snapviz.analyze(str(sample))
    assert isinstance(an, Analysis), "a snapshot's run"
    cmp = snapviz.compare(str(sample), str(ROOT / "sample_snapshots" / "sd15-fp16-sdpa"))
    peak = an.replay.peak_allocated
    for obj, kind, facts in (
        (run, "Run", ["trace entries", "memory events", "run.json"]),
        (run.snapshot, "Snapshot", ["devices [0]", f"{len(run.snapshot.events):,} trace entries"]),
        (run.trace, "ChromeTrace", [f"{run.trace.event_count:,} events"]),
        (an, "Analysis", ["cuda:0", f"({peak:,} B)", an.peak_stage]),
        (an.replay, "ReplayResult", [f"peak allocated {peak:,} B"]),
        (cmp, "Comparison", ["1 other run(s)", "sd15-fp16-sdpa"]),
        (
            snapviz.analyze(str(sample / "trace.json.gz")),
            "Analysis",
            ["trace", "cuda:0", "memory events", "peak allocated"],
        ),
    ):
        text = repr(obj)
        assert text.startswith(f"<{kind} ") and "\n" not in text and len(text) < 600, text
        assert all(f in text for f in facts), (kind, text)
        assert str(obj) == text
