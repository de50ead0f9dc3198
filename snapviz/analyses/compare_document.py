"""The ``snapviz.compare/1`` document as code: frozen dataclasses, their JSON form, their loader
and their JSON schema, through the machinery of :mod:`snapviz.analyses.document`.

* :class:`CompareDocument` is what a comparison yields
  (:func:`snapviz.analyses.compare.build_compare`, ``Comparison.document()``) and what the
  Markdown, terminal, HTML and picture renderers take; ``compare --json`` only encodes it
  (:func:`~snapviz.analyses.document.to_json`), key for key in field order.
* :func:`load_compare` reads one back (a ``compare --json`` file, the ``compare`` object of a
  ``snapviz.matrix/1`` document), checking every typed field.
* :func:`json_schema` is its JSON schema (``docs/compare.schema.json`` is generated from it:
  ``python -m snapviz.analyses.compare_document > docs/compare.schema.json``; a test keeps the
  two equal).

Arrays of the per-run columns run base first, one entry per run (``None`` where a run has no
such stage or step). ``compare BASE --whatif CONF`` with one input writes only ``schema``,
``runs`` (empty) and ``whatif``: the comparison's other parts are then absent. ``whatif`` is
the what-if module's twin table (BASE beside its simulated twins, part of ``snapviz.whatif/1``'s
vocabulary), carried as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from snapviz.analyses.document import ABSENT, Absent, document_schema, from_json, load_document, to_json
from snapviz.analyses.whatif_document import WhatIfTwins
from snapviz.vocab import COMPARE_SCHEMA

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RunPeak:
    """A run's peak: allocated and reserved bytes, and the stage label it happened in."""

    allocated_bytes: int
    reserved_bytes: int
    stage: str


@dataclass(frozen=True, kw_only=True)
class CompareRun:
    """One run compared with the base (run 0: the base itself, its deltas 0)."""

    label: str
    source: str
    peak: RunPeak
    delta_bytes: int
    delta_ratio: float | None  # None: the base's peak is 0, or the run measured another kind of memory
    reserved_delta_bytes: int
    events: int
    truncated: bool
    stage_source: str
    memory_kind: str  # "CUDA GPU memory" for a snapshot, the trace's device kind otherwise
    verdict: str | None  # None: the base
    warnings: list[str]


@dataclass(frozen=True, kw_only=True)
class CompareStage:
    """A stage group (``denoise``): its peaks in every run and their change against the base."""

    name: str
    peak_allocated_bytes: list[int | None]
    peak_reserved_bytes: list[int | None]
    delta_bytes: list[int | None]
    delta_ratio: list[float | None]
    reserved_delta_bytes: list[int | None]


@dataclass(frozen=True, kw_only=True)
class CompareStep(CompareStage):
    """A numbered step (``denoise/3``), aligned by step number: its stage and step."""

    stage: str
    step: str


@dataclass(frozen=True, kw_only=True)
class CompareSite:
    """An allocation site that changed in some run, matched by source line."""

    site: str
    status: list[str]  # "base", then "same", "grew", "shrank", "appeared", "vanished", "absent" or "n/a"
    allocs: list[int]
    total_bytes: list[int]
    peak_live_bytes: list[int]
    delta_total_bytes: list[int]
    delta_peak_live_bytes: list[int]


@dataclass(frozen=True, kw_only=True)
class CompareAttention:
    """Attention score matrices per run, and their change against the base."""

    count: list[int]
    peak_live_bytes: list[int]
    total_bytes: list[int]
    largest_bytes: list[int]
    delta_count: list[int]
    delta_peak_live_bytes: list[int]
    delta_largest_bytes: list[int]


@dataclass(frozen=True, kw_only=True)
class CompareCategory:
    """Bytes of one category live at each run's own peak."""

    name: str
    bytes: list[int]
    delta_bytes: list[int]


@dataclass(frozen=True, kw_only=True)
class FailOver:
    """``--fail-over PCT``: whether every other run's peak stays within PCT of the base's."""

    percent: float
    passed: bool
    failures: list[str]  # one FAIL line per run over the limit


@dataclass(frozen=True, kw_only=True)
class CompareDocument:
    """The ``snapviz.compare/1`` document: every run against the base (run 0)."""

    schema: Literal["snapviz.compare/1"]
    base: str | Absent = ABSENT  # absent: one input with --whatif (no runs compared)
    runs: list[CompareRun]
    stages: list[CompareStage] | Absent = ABSENT
    steps: list[CompareStep] | Absent = ABSENT
    sites: list[CompareSite] | Absent = ABSENT
    attention: CompareAttention | Absent = ABSENT
    categories: list[CompareCategory] | Absent = ABSENT
    verdict: list[str] | Absent = ABSENT  # verdict[i] is about run i + 1
    fail_over: FailOver | Absent = ABSENT  # only with --fail-over
    whatif: WhatIfTwins | Absent = ABSENT  # only with --whatif: BASE beside its simulated twins
    warnings: list[str] | Absent = ABSENT  # what the sinks clipped or replaced (bounded_compare)


def listed(value: list[T] | Absent) -> list[T]:
    """A list part of the document, ``[]`` where it is absent."""
    return [] if isinstance(value, Absent) else value


def bounded_compare(doc: CompareDocument) -> CompareDocument:
    """The document every text sink gets: strings from the inputs clipped and stripped of
    control characters, non-finite numbers null, what was cut noted in ``warnings``
    (:func:`snapviz.safe_text.bounded_doc`), typed again."""
    from snapviz.safe_text import bounded_doc

    return from_json(bounded_doc(to_json(doc)), CompareDocument)


def load_compare(obj: object, source: str = "document") -> CompareDocument:
    """A ``snapviz.compare/1`` document read back from JSON: its schema string, then every typed
    field; one line in :class:`~snapviz.errors.InputError` when malformed."""
    return load_document(obj, CompareDocument, COMPARE_SCHEMA, source)


def json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :class:`CompareDocument`, generated from its type hints."""
    return document_schema(
        CompareDocument,
        "urn:snapviz:schema:compare-1",
        COMPARE_SCHEMA,
        "The document `snapviz compare --json` writes (generated from snapviz/analyses/compare_document.py).",
    )


def schema_text() -> str:
    """``docs/compare.schema.json`` as it must read (regenerate:
    ``python -m snapviz.analyses.compare_document > docs/compare.schema.json``)."""
    from snapviz.analyses.document import schema_text as text_of

    return text_of(json_schema())


if __name__ == "__main__":  # writes docs/compare.schema.json's text to stdout
    import sys

    sys.stdout.write(schema_text())
