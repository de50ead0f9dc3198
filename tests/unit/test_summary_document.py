"""The ``snapviz.summary/1`` document as code (analyses/document.py): the committed JSON schema
is the one generated from the types, every golden document reads back into the types and
encodes to the same bytes, and a malformed document is refused naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paths import ROOT
from snapviz.analyses.document import (
    ABSENT,
    Interval,
    Peak,
    Summary,
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


def test_open_sections_take_any_json_even_non_finite_numbers() -> None:
    """A file's own settings may hold NaN/inf (the sinks write them as null, safe_text.bounded_doc):
    the open sections are JSON values, checked as JSON, not refused."""
    doc = json.loads(GOLDEN_JSON[0].read_text())
    doc["allocator_settings"] = {"garbage_collection_threshold": float("nan"), "x": [float("inf"), {"y": None}]}
    got = from_json(doc, Summary)
    settings = got.allocator_settings
    assert isinstance(settings, dict) and isinstance(settings["x"], list)
    assert settings["x"][1] == {"y": None}
    with pytest.raises(InputError, match=r"allocator_settings.x: expected a JSON value"):
        from_json({**doc, "allocator_settings": {"x": object()}}, Summary)
