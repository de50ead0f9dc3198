"""A snapshot whose allocator settings the replay cannot honour is reported approximate in
every sink, never as exact: terminal, Markdown, JSON, HTML and the picture's title."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import synth
from snapviz.analyses.pipeline import document_of, summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.cli import main
from snapviz.load import load
from snapviz.render.picture import picture_data


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A torch-before-2.3 snapshot (no ``allocator_settings``) of a run that rounded by 4 divisions."""
    tmp = tmp_path_factory.mktemp("approx")
    sim = synth.random_workload(1500, 600, roundup_power2_divisions=4)
    src = tmp / "old.pickle"
    src.write_bytes(pickle.dumps(sim.snapshot(settings=False)))
    return {"src": src, "tmp": tmp, "sim": sim}


def test_every_sink_says_approximate(outputs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    tmp: Path = outputs["tmp"]
    with pytest.raises(SystemExit) as ei:
        main(
            [
                "analyze",
                str(outputs["src"]),
                "--json",
                str(tmp / "s.json"),
                "--markdown",
                str(tmp / "s.md"),
                "-o",
                str(tmp / "r.html"),
            ]
        )
    assert (ei.value.code or 0) == 0
    term = capsys.readouterr().out
    doc = json.loads((tmp / "s.json").read_text())
    reason = next(w for w in doc["warnings"] if w.startswith("approximate figures:"))
    assert doc["peak"]["approximate"] is True
    assert "no allocator settings recorded" in reason
    assert "peak allocated about " in term and "approximate figures:" in term
    md = (tmp / "s.md").read_text()
    assert "(approximate)" in md and "**about " in md and "approximate figures:" in md
    html = (tmp / "r.html").read_text()
    assert "Peak about " in html and "approximate figures:" in html
    an = analyze_run(load(str(outputs["src"])))
    assert picture_data(an, document_of(an))["title"].split(": peak ", 1)[1].startswith("about ")


def test_exact_snapshot_says_nothing_of_the_kind(outputs: dict[str, Any]) -> None:
    sim = synth.random_workload(1500, 600)
    src = outputs["tmp"] / "plain.pickle"
    src.write_bytes(pickle.dumps(sim.snapshot(settings=False)))
    doc = summary_of(analyze_run(load(str(src))))
    assert "approximate" not in doc["peak"]
    assert not any(w.startswith("approximate figures:") for w in doc["warnings"])
    assert doc["peak"]["allocated_bytes"] == sim.peak_allocated(0)
