"""The ``snapviz.summary/1`` document as code (analyses/document.py): the committed JSON schema
is the one generated from the types, every golden document reads back into the types and
encodes to the same bytes, and a malformed document is refused naming its field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from snapviz.analyses.document import (
    ABSENT,
    Advice,
    Attention,
    EndState,
    Interval,
    Oom,
    OomSimulation,
    Peak,
    RunInfo,
    SimulatedAdvice,
    Summary,
    TraceAttention,
    Training,
    TrainingAdvice,
    from_json,
    json_schema,
    load_summary,
    schema_text,
    to_json,
)
from snapviz.errors import InputError

GOLDEN_JSON = sorted((ROOT / "tests" / "data" / "golden").glob("*.json"))


def test_committed_schema_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "summary.schema.json").read_text()
    assert committed == schema_text(), "regenerate: python -m snapviz.analyses.document > docs/summary.schema.json"


def test_schema_describes_the_types() -> None:
    s = json_schema()
    assert s["title"] == "snapviz.summary/1" and s["additionalProperties"] is False
    assert "kind" not in s["required"] and {"schema", "peak", "stages", "warnings"} <= set(s["required"])
    peak = s["$defs"]["Peak"]
    assert peak["properties"]["allocated_bytes"] == {"type": "integer"}
    assert "approximate" not in peak["required"] and "allocated_bytes" in peak["required"]


@pytest.mark.parametrize("path", GOLDEN_JSON, ids=lambda p: p.stem)
def test_golden_documents_round_trip_byte_for_byte(path: Path) -> None:
    text = path.read_text()
    doc = load_summary(json.loads(text), str(path))
    assert isinstance(doc, Summary) and isinstance(doc.peak, Peak)
    assert json.dumps(to_json(doc), indent=2) + "\n" == text


@pytest.mark.parametrize("path", GOLDEN_JSON[:6], ids=lambda p: p.stem)
def test_golden_documents_validate_against_the_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(path.read_text()), json_schema())


def test_absent_fields_are_left_out_and_none_written_as_null() -> None:
    iv = Interval(name="denoise/0", step="0", peak_allocated_bytes=5, peak_reserved_bytes=None, start_us=1, end_us=2)
    assert to_json(iv) == {
        "name": "denoise/0",
        "step": "0",
        "peak_allocated_bytes": 5,
        "peak_reserved_bytes": None,
        "start_us": 1,
        "end_us": 2,
    }
    assert from_json(to_json(iv), Interval) == iv and from_json(to_json(iv), Interval).duration_s is ABSENT


def test_malformed_documents_are_refused_with_the_field() -> None:
    doc = json.loads(GOLDEN_JSON[0].read_text())
    with pytest.raises(InputError, match=r"^x: not a snapviz.summary/1 document"):
        load_summary({**doc, "schema": "snapviz.summary/2"}, "x")
    with pytest.raises(
        InputError,
        match=r"^x: malformed snapviz.summary/1 document: top_allocations\[0\].bytes: expected an integer, got true/false$",
    ):
        bad = json.loads(json.dumps(doc))
        bad["top_allocations"][0]["bytes"] = True
        load_summary(bad, "x")
    with pytest.raises(InputError, match=r"history: missing field 'events'"):
        bad = json.loads(json.dumps(doc))
        del bad["history"]["events"]
        load_summary(bad, "x")
    with pytest.raises(InputError, match=r"stages\[0\].intervals\[0\].duration_s: expected a number, got a string$"):
        bad = json.loads(json.dumps(doc))
        bad["stages"][0]["intervals"][0]["duration_s"] = "long"
        load_summary(bad, "x")


def test_the_users_own_json_values_take_any_json_even_non_finite_numbers() -> None:
    """A file's own settings may hold NaN/inf (the sinks write them as null, safe_text.bounded_doc):
    they are JSON values, checked as JSON, not refused."""
    doc = json.loads(GOLDEN_JSON[0].read_text())
    doc["allocator_settings"] = {"garbage_collection_threshold": float("nan"), "x": [float("inf"), {"y": None}]}
    got = from_json(doc, Summary)
    settings = got.allocator_settings
    assert isinstance(settings, dict) and isinstance(settings["x"], list)
    assert settings["x"][1] == {"y": None}
    with pytest.raises(InputError, match=r"allocator_settings.x: expected a JSON value"):
        from_json({**doc, "allocator_settings": {"x": object()}}, Summary)


def _golden(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "tests" / "data" / "golden" / f"{name}.json").read_text())


def test_sections_are_typed() -> None:
    """attention, oom, end_state, training, advice, run: dataclasses, not JSON objects."""
    oom_doc = from_json(_golden("gpt2-train-varlen-cap-oom"), Summary)
    assert isinstance(oom_doc.attention, Attention) and isinstance(oom_doc.end_state, EndState)
    assert isinstance(oom_doc.oom, Oom) and isinstance(oom_doc.oom.simulation, OomSimulation)
    assert oom_doc.oom.headline.startswith("CUDA out of memory")
    assert isinstance(oom_doc.training, Training) and oom_doc.training.steps
    kinds = {type(a) for a in oom_doc.advice} if isinstance(oom_doc.advice, list) else set()
    assert kinds == {SimulatedAdvice, TrainingAdvice}
    plain = from_json(_golden("sd15-fp16-classic"), Summary)
    assert isinstance(plain.advice, list) and Advice in {type(a) for a in plain.advice}
    assert isinstance(plain.run, RunInfo) and plain.run.pipeline == "sd15"
    assert plain.oom is None and plain.training is ABSENT


def test_trace_attention_is_its_own_type() -> None:
    from snapviz.analyses.pipeline import analyze_input, document_of
    from snapviz.load import load

    doc = document_of(analyze_input(load(str(ROOT / "tests" / "data" / "traces" / "edge_cases.json.gz"))))
    assert doc.is_trace and isinstance(doc.attention, TraceAttention)
    assert to_json(from_json(to_json(doc))) == to_json(doc)


def test_an_oom_written_before_the_simulator_still_loads() -> None:
    """Documents of the first typed version had no ``oom.simulation`` nor ``oom.card``."""
    doc = _golden("sdxl-fp16-oom-10gb")
    del doc["oom"]["simulation"], doc["oom"]["card"]
    got = load_summary(doc)
    assert isinstance(got.oom, Oom) and got.oom.simulation is ABSENT and got.oom.card is ABSENT
    assert to_json(got) == doc and list(to_json(got)["oom"]) == list(doc["oom"])


def test_sections_refuse_unknown_and_malformed_keys() -> None:
    doc = _golden("sdxl-fp16-oom-10gb")
    with pytest.raises(InputError, match=r"oom: unknown field 'nope'"):
        load_summary({**doc, "oom": {**doc["oom"], "nope": 1}})
    with pytest.raises(InputError, match=r"end_state.by_category.x: expected an integer, got a string"):
        load_summary({**doc, "end_state": {**doc["end_state"], "by_category": {"x": "y"}}})
    with pytest.raises(InputError, match=r"attention"):
        load_summary({**doc, "attention": {"count": 1}})


def test_run_values_stay_as_the_file_has_them() -> None:
    """run.json is the user's: its values are JSON, not checked against a type."""
    doc = _golden("sd15-fp16-classic")
    doc["run"] = {**doc["run"], "height": "tall", "techniques": {"odd": [1.5, None]}}
    got = load_summary(doc)
    assert isinstance(got.run, RunInfo) and got.run.height == "tall" and to_json(got) == doc
