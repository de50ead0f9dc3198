"""The ``snapviz.compare/1`` document as code (analyses/compare_document.py): the committed JSON
schema is the one generated from the types, a built document encodes in field order and reads
back into the types unchanged, and a malformed one is refused naming its field."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

import snapviz
from paths import ROOT
from snapviz.analyses.compare import Comparison
from snapviz.analyses.compare_document import (
    CompareDocument,
    CompareStage,
    CompareStep,
    FailOver,
    bounded_compare,
    json_schema,
    load_compare,
    schema_text,
)
from snapviz.analyses.document import ABSENT, to_json
from snapviz.analyses.whatif import twin_document, what_if
from snapviz.analyses.whatif_document import WhatIfTwins
from snapviz.errors import InputError
from snapviz.load import load

SAMPLES = ROOT / "sample_snapshots"


@pytest.fixture(scope="module")
def twin() -> WhatIfTwins:  # BASE beside its simulated twin, as ``compare --whatif`` makes it
    w = what_if(
        load(str(SAMPLES / "sd15-fp16-alloc-default")), alloc_confs=["expandable_segments:True"], gpu_memories=[]
    )
    return twin_document(w, "base")


@pytest.fixture(scope="module")
def cmp() -> Comparison:
    return snapviz.compare(str(SAMPLES / "sd15-fp16-alloc-default"), str(SAMPLES / "sd15-fp16-alloc-cap102"))


def test_committed_schema_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "compare.schema.json").read_text()
    assert committed == schema_text(), (
        "regenerate: python -m snapviz.analyses.compare_document > docs/compare.schema.json"
    )


def test_schema_describes_the_types() -> None:
    s = json_schema()
    assert s["title"] == "snapviz.compare/1" and s["additionalProperties"] is False
    assert s["required"] == ["schema", "runs"]  # one input with --whatif writes only these and whatif
    step = s["$defs"]["CompareStep"]
    assert {"name", "stage", "step", "delta_bytes"} <= set(step["required"])
    assert step["properties"]["delta_ratio"] == {
        "type": "array",
        "items": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    }


def test_built_document_encodes_in_order_and_reads_back(cmp: Comparison) -> None:
    doc = cmp.document(fail_over=5.0)
    assert isinstance(doc.steps, list) and all(isinstance(s, CompareStep) for s in doc.steps)
    assert isinstance(doc.stages, list) and not any(isinstance(s, CompareStep) for s in doc.stages)
    plain = to_json(doc)
    assert list(plain) == [
        "schema",
        "base",
        "runs",
        "stages",
        "steps",
        "sites",
        "attention",
        "categories",
        "verdict",
        "fail_over",
    ]
    assert list(plain["steps"][0])[-2:] == ["stage", "step"]
    assert plain == cmp.summary(fail_over=5.0)
    text = json.dumps(plain, indent=2)
    back = load_compare(json.loads(text), "cmp.json")
    assert back == doc and json.dumps(to_json(back), indent=2) == text
    assert doc.fail_over == FailOver(percent=5.0, passed=True, failures=[])


def test_document_validates_against_the_schema(cmp: Comparison, twin: WhatIfTwins) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(to_json(cmp.document(fail_over=1.0)), json_schema())
    twin_only = CompareDocument(schema="snapviz.compare/1", runs=[], whatif=twin)
    jsonschema.validate(to_json(twin_only), json_schema())


def test_whatif_only_document_leaves_the_comparison_out(twin: WhatIfTwins) -> None:
    doc = CompareDocument(schema="snapviz.compare/1", runs=[], whatif=twin)
    assert to_json(doc) == {"schema": "snapviz.compare/1", "runs": [], "whatif": to_json(twin)}
    assert load_compare(to_json(doc)) == doc


def test_bounded_compare_notes_what_it_replaced(cmp: Comparison) -> None:
    doc = cmp.document()
    assert isinstance(doc.stages, list)
    bad = CompareStage(**{**vars(doc.stages[0]), "delta_ratio": [0.0, math.inf]})
    out = bounded_compare(replace(doc, stages=[bad, *doc.stages[1:]]))
    assert isinstance(out.stages, list) and out.stages[0].delta_ratio == [0.0, None]
    assert out.warnings == ["stages[0].delta_ratio[1]: inf is not a JSON number; written as null"]
    assert list(to_json(out))[-1] == "warnings"
    assert bounded_compare(doc) == doc and doc.warnings is ABSENT


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": "snapviz.summary/1"}, "x.json: not a snapviz.compare/1 document (schema 'snapviz.summary/1')"),
        ({"runs": None}, "x.json: malformed snapviz.compare/1 document: runs: expected a list, got null"),
        (
            {"stages": [{"name": "load"}]},
            "x.json: malformed snapviz.compare/1 document: stages[0]: missing field 'peak_allocated_bytes'",
        ),
        (
            {"fail_over": {"percent": "5%", "passed": True, "failures": []}},
            "x.json: malformed snapviz.compare/1 document: fail_over.percent: expected a finite number, got a string",
        ),
        ({"extra": 1}, "x.json: malformed snapviz.compare/1 document: document: unknown field 'extra'"),
    ],
)
def test_malformed_documents_are_refused_naming_the_field(
    cmp: Comparison, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError) as e:
        load_compare({**cmp.summary(), **change}, "x.json")
    assert str(e.value) == message
    with pytest.raises(InputError, match="a JSON object expected"):
        load_compare([], "x.json")
