"""Bokeh's own integrity check on every kind of report: the pages skip Bokeh's document
validation when they are written (it only logs, and costs a quarter of the build), so the
check runs here instead and any error it finds (a column of the wrong length, a glyph
naming a column no source has, a renderer no plot holds) fails the test. The documents'
JSON, which the page writes with its own serializer (render/html/bokeh_json.py), is compared
with what Bokeh's ``Document.to_json`` writes for the same documents."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from bokeh.core.validation.check import check_integrity
from bokeh.document import Document
from paths import SAMPLES

import snapviz.render.html.bokeh_json as bokeh_json
from snapviz.cli import main

SDXL = SAMPLES / "sdxl-fp16" / "snapshot.pickle.xz"
SD15 = SAMPLES / "sd15-fp16-sdpa" / "snapshot.pickle.xz"
PROFILE = SAMPLES / "sd15-fp16-profile-1step"


def _documents_of(args: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], Any, Any]]:
    """Each document the page wrote: (its roots, its JSON as written, what Bokeh's
    ``Document.to_json`` writes for a document of those roots)."""
    seen: list[tuple[list[Any], Any, Any]] = []
    real = bokeh_json.document_json

    def spy(roots: Any) -> Any:
        ours = real(roots)
        doc = Document()
        for r in roots:
            doc.add_root(r)
        seen.append((list(roots), ours, doc.to_json(deferred=False)))
        return ours

    monkeypatch.setattr(bokeh_json, "document_json", spy)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(args)
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
    return seen


def _without_ids(rep: Any) -> Any:
    if isinstance(rep, dict):
        return {k: _without_ids(v) for k, v in rep.items() if k != "id"}
    return [_without_ids(v) for v in rep] if isinstance(rep, list) else rep


@pytest.mark.parametrize(
    "kind",
    ["snapshot", "profiled run", "trace", "compare"],
)
def test_every_report_passes_bokehs_integrity_check(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "r.html")
    args = {
        "snapshot": ["analyze", str(SDXL), "-o", out, "-q"],
        "profiled run": ["analyze", str(PROFILE), "-o", out, "-q"],
        "trace": ["analyze", str(PROFILE / "trace.json.gz"), "-o", out, "-q"],
        "compare": ["compare", str(SD15), str(SDXL), "-o", out, "-q"],
    }[kind]
    docs = _documents_of(args, monkeypatch)
    roots = [r for group, _, _ in docs for r in group]
    assert roots, "no Bokeh roots reached the page"
    models = set().union(*(r.references() for r in roots))
    issues = check_integrity(models)
    assert not issues.error, [f"{e.code} {e.name}: {e.text}" for e in issues.error]
    for group, ours, bokehs in docs:
        # Each document has configuration models of its own: the same but for their ids.
        assert ours["config"]["id"] != bokehs["config"]["id"]
        assert _without_ids(ours["config"]) == _without_ids(bokehs["config"])
        ours["config"] = bokehs["config"]
        a, b = json.dumps(ours), json.dumps(bokehs)
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        same = a == b  # not compared inside the assert: pytest's diff of two 2 MB strings takes minutes
        assert same, f"the document of {[r.name for r in group]} differs from Bokeh's at {at}: {a[at - 80 : at + 80]!r}"


def test_other_bokeh_releases_write_through_bokeh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a Bokeh release the serializer was not checked against, Bokeh writes the page."""
    monkeypatch.setattr(bokeh_json, "FAST_RELEASES", ("0.0.",))
    def refuse(self: Any, obj: Any) -> Any:
        raise AssertionError("the fast serializer ran")

    monkeypatch.setattr(bokeh_json._Serializer, "_encode", refuse)
    out = tmp_path / "r.html"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["analyze", str(SDXL), "-o", str(out), "-q"])
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
    page = out.read_text()
    assert page.count('type="application/json"') >= 1 and '"roots"' in page
