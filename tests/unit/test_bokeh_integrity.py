"""Bokeh's own integrity check on every kind of report: the pages skip Bokeh's document
validation when they are written (it only logs, and costs a quarter of the build), so the
check runs here instead and any error it finds (a column of the wrong length, a glyph
naming a column no source has, a renderer no plot holds) fails the test. The documents'
JSON is Bokeh's own ``Document.to_json`` (render/html/bokeh_json.py)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from bokeh.core.validation.check import check_integrity

import snapviz.render.html.bokeh_json as bokeh_json
from paths import SAMPLES
from snapviz.cli import main

SDXL = SAMPLES / "sdxl-fp16" / "snapshot.pickle.xz"
SD15 = SAMPLES / "sd15-fp16-sdpa" / "snapshot.pickle.xz"
PROFILE = SAMPLES / "sd15-fp16-profile-1step"


def _documents_of(args: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], Any]]:
    """Each document the page wrote: (its roots, its JSON as written)."""
    seen: list[tuple[list[Any], Any]] = []
    real = bokeh_json.document_json

    def spy(roots: Any) -> Any:
        ours = real(roots)
        seen.append((list(roots), ours))
        return ours

    monkeypatch.setattr(bokeh_json, "document_json", spy)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(args)
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
    return seen


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
    roots = [r for group, _ in docs for r in group]
    assert roots, "no Bokeh roots reached the page"
    models = set().union(*(r.references() for r in roots))
    issues = check_integrity(models)
    assert not issues.error, [f"{e.code} {e.name}: {e.text}" for e in issues.error]
    for group, written in docs:
        # What the page wrote is Bokeh's document of those roots: every root, by its id.
        assert [r["id"] for r in written["roots"]] == [r.id for r in group]
        assert all(r.document is not None for r in group)
