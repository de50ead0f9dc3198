"""One story in every output (issue 22): the JSON document, the Markdown, the terminal text, the
HTML view model and the PNG legend of one training run and one inference run list the same
category names, in the same order of the vocabulary where they stack, with the same bytes at
the peak, and those bytes add up to the peak.

Each output is read back the way a reader sees it (the Markdown's and the terminal's words are
parsed, the picture's legend entries and the HTML area are read at the peak's sample), never
from the analysis' own tables.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import numpy as np
import pytest

from paths import ROOT, SAMPLES
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import from_json
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.report_view import report_view
from snapviz.analyses.summary import analyze_run
from snapviz.category_vocab import CATEGORY_COLORS, CATEGORY_ORDER, canonical_category, order_categories
from snapviz.load import load
from snapviz.render.fmt import fmt_bytes
from snapviz.render.html.snapshot_data import report_data
from snapviz.render.markdown import render_markdown
from snapviz.render.picture import picture_data
from snapviz.render.terminal import render_terminal

RUNS = ["train-sd15-amp-fp16", "sd15-fp16-classic"]


@cache
def analysed(name: str) -> tuple[Analysis, dict[str, Any]]:
    an = analyze_run(load(str(SAMPLES / name)))
    return an, summary_of(an)


def _words(line: str) -> dict[str, str]:
    """``parameter 3.22 GiB, attention scores 1.00 GiB`` -> {name: formatted bytes}."""
    out = {}
    for part in line.split(", "):
        m = re.fullmatch(r"(.+) (\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB))", part.strip())
        assert m, part
        out[m.group(1)] = m.group(2)
    return out


def _line(text: str, prefix: str) -> str:
    hits = [ln.split(prefix, 1)[1] for ln in text.splitlines() if prefix in ln]
    assert len(hits) == 1, (prefix, text)
    return hits[0].rstrip()


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_every_output_tells_the_same_categories(name: str) -> None:
    an, doc = analysed(name)
    peak = doc["peak"]["allocated_bytes"]
    # JSON: the categories at the peak add up to the peak, memory from before the recording included
    js = {c["category"]: int(c["bytes"]) for c in doc["categories"] if c["bytes"]}
    assert sum(js.values()) == peak == an.replay.peak_allocated
    assert all(canonical_category(c) == c for c in js), "only the vocabulary's names (and a rule's own)"
    shown = {c: fmt_bytes(b) for c, b in js.items()}
    # Markdown and terminal: the same names, the same bytes (as each prints them)
    md = re.sub(r"\\(.)", r"\1", _line(render_markdown(from_json(doc)), "By category at the peak: "))  # as rendered
    assert _words(md) == shown
    assert _words(_line(render_terminal(from_json(doc)), "by category at the peak: ")) == shown
    # HTML view model: the categories table and the stacked area at the peak's sample
    data = report_data(an, from_json(doc), report_view(an, 20000))
    assert dict(zip(data.categories.category, map(int, data.categories.bytes), strict=True)) == js
    ct = data.category_timeline
    j = int(np.flatnonzero(ct.index == an.replay.peak_index)[0])
    area = {c: int(ct.bytes[c][j]) for c in ct.categories if ct.bytes[c][j]}
    assert area == _merged(js)
    assert ct.categories == order_categories(ct.categories), "the vocabulary's stacking order"
    # PNG legend: entries in the same order and colours, read at the peak's point
    pic = picture_data(an, from_json(doc))
    names = [c["name"] for c in pic["categories"]]
    assert names == ct.categories and names == order_categories(names)
    k = int(np.flatnonzero((pic["x"] == pic["peak"]["x"]) & (pic["allocated"] == peak))[0])
    legend = {c["name"]: int(c["bytes"][k]) for c in pic["categories"] if c["bytes"][k]}
    assert legend == area
    colors = {c["name"]: c["color"] for c in pic["categories"]}
    assert all(colors[c] == data.category_colors[c] == CATEGORY_COLORS[c] for c in colors if c in CATEGORY_ORDER)
    # a training run's phases and steps speak the same vocabulary, and add up to their peaks
    tr = doc.get("training")
    assert (tr is not None) == name.startswith("train")
    if tr is not None:
        worst = max(tr["steps"], key=lambda s: s["peak_allocated_bytes"])
        assert {c: b for c, b in worst["categories_at_peak"].items() if b} == _merged(js)
        for p in tr["phases"]:
            assert sum(p["categories_at_peak"].values()) == p["peak_allocated_bytes"], p["name"]
        assert {"parameter", "gradient", "optimizer state"} <= set(js)
        assert "gradients & optimizer" not in tr["categories"] + list(js)


def _merged(cats: dict[str, int]) -> dict[str, int]:
    """``before recording: parameter`` (the JSON itemises memory from before the recording by its
    frames where the end state kept them) counts as ``before recording`` in a stacked area."""
    out: dict[str, int] = {}
    for c, b in cats.items():
        k = "before recording" if c.startswith("before recording: ") else c
        out[k] = out.get(k, 0) + b
    return out


def test_old_names_compare_with_new_ones() -> None:
    """A summary written before the one vocabulary (``weights``, ``activations``, ``weights: T5``)
    compares with today's: the same category on both sides, not two."""
    from snapviz.analyses.digest import digest_summary

    old = json.loads((ROOT / "tests" / "data" / "golden" / "sd15-fp16-classic.json").read_text())
    old["categories"] = [
        {"category": "weights", "bytes": 10, "count": 1},
        {"category": "weights: T5", "bytes": 5, "count": 1},
        {"category": "activations", "bytes": 8, "count": 1},
        {"category": "saved activations", "bytes": 2, "count": 1},
        {"category": "gradients & optimizer", "bytes": 5, "count": 1},
    ]
    got = digest_summary(from_json(old), "old").categories
    assert dict(zip(got["category"], got["bytes"], strict=True)) == {
        "parameter": 10,
        "parameter: T5": 5,
        "activation": 10,
        "gradients & optimizer": 5,
    }
    assert canonical_category("before recording: weights") == "before recording: parameter"
    assert canonical_category("my cache") == "my cache"
