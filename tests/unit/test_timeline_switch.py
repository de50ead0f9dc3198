"""The timeline's x-axis tabs: one set of figures whose x columns the tabs switch.

The browser side (the click, the re-fitted range) is checked in test_browser.py; here the
models are checked: what a click on "By event" sets must leave no glyph, span or axis on the
time axis, and "By time" must restore the page as built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from bokeh.models import Column, GlyphRenderer, Label, Model, NumeralTickFormatter, Span, Tabs

import synth
from sdrun import _analyse, write_run
from snapviz.render.html.timeline_plots import timeline_blocks
from snapviz.render.html.view_models import SnapshotReport

TIME_COLS = {"time_s", "start_s", "end_s"}
EVENT_COLS = {"index", "start_index", "end_index"}


def _report(an: Any, doc: dict[str, Any]) -> SnapshotReport:
    from snapviz.analyses.document import from_json
    from snapviz.analyses.report_view import report_view
    from snapviz.render.html.snapshot_data import report_data

    return report_data(an, from_json(doc), report_view(an, 300), max_points=300)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> SnapshotReport:
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run
    from snapviz.load import load

    an = analyze_run(load(write_run(str(tmp_path_factory.mktemp("run") / "sd"), steps=3, filler=30, oom=False)))
    return _report(an, summary_of(an))


def _figures(main: Any, below: Column) -> list[Any]:
    """The plots of the timeline's roots (the tabs above them left out)."""
    return [
        c
        for c in [*(main.children if isinstance(main, Column) else [main]), *below.children]
        if hasattr(c, "renderers")
    ]


def _x_columns(figs: list[Any]) -> set[str]:
    """Every column a drawn glyph (any of its state glyphs) reads for x."""
    cols: set[str] = set()
    for fig in figs:
        for r in fig.renderers:
            if not isinstance(r, GlyphRenderer) or not any(len(v) for v in r.data_source.data.values()):
                continue  # the legend's empty swatches
            for slot in ("glyph", "selection_glyph", "nonselection_glyph", "hover_glyph"):
                g = getattr(r, slot)
                for attr in ("x", "left", "right"):
                    v = getattr(g, attr, None) if isinstance(g, Model) else None
                    if isinstance(v, str):
                        cols.add(v)
    return cols


def _swaps(main: Column) -> list[list[Any]]:
    tabs = main.children[0]
    assert isinstance(tabs, Tabs)
    (cb,) = tabs.js_property_callbacks["change:active"]
    return cb.args["swaps"]


def _apply(swaps: list[list[Any]], axis: int) -> None:
    for model, attr, _kind, values in swaps:
        setattr(model, attr, values[axis])


def _annotations(figs: list[Any], kind: type) -> list[Any]:
    return [a for f in figs for a in f.center + f.above if isinstance(a, kind)]


def test_one_set_of_figures_serves_both_axes(data: SnapshotReport) -> None:
    main, below, _pane = timeline_blocks(data)
    figs = _figures(main, below)
    assert [p.title for p in main.children[0].tabs] == ["By time", "By event"]
    assert len(figs) == 3, "the lines, the category area and the strip, once"
    assert sum(type(m).__name__ == "figure" for m in main.references() | below.references()) == 3
    built = _x_columns(figs)
    assert built and built <= TIME_COLS
    swaps = _swaps(main)

    _apply(swaps, 1)
    assert _x_columns(figs) == {"index", "start_index", "end_index"}
    assert [s.location for s in _annotations(figs, Span)] == [data.peak.index, data.peak.index]
    (label,) = _annotations(figs, Label)
    assert label.x == data.peak.index and label.visible
    strip_axis = figs[-1].xaxis[0]
    assert strip_axis.axis_label == "event index" and isinstance(strip_axis.formatter, NumeralTickFormatter)
    dots = [r for f in figs for r in f.renderers if isinstance(r, GlyphRenderer) and "y" in r.data_source.data]
    assert [r.data_source.data[r.glyph.x][0] for r in dots] == [data.peak.index] * 2, "the peak's dot moves too"

    _apply(swaps, 0)
    assert _x_columns(figs) == built
    assert [s.location for s in _annotations(figs, Span)] == [data.peak.time_s] * 2
    assert strip_axis.axis_label.startswith("time")


def test_a_peak_without_an_event_row_is_hidden_on_that_axis(data: SnapshotReport) -> None:
    no_row = dataclasses.replace(data, peak=dataclasses.replace(data.peak, index=-1))
    main, below, _pane = timeline_blocks(no_row)
    figs = _figures(main, below)
    _apply(_swaps(main), 1)
    assert [s.location for s in _annotations(figs, Span)] == [None, None]
    (label,) = _annotations(figs, Label)
    assert not label.visible
    _apply(_swaps(main), 0)
    assert label.visible and label.x == data.peak.time_s


def test_without_times_the_event_axis_alone() -> None:
    sim = synth.random_workload(seed=1, n_ops=200)
    d = _report(*_analyse(sim.snapshot(omit=("time_us",), marker=False)))
    main, below, _pane = timeline_blocks(d)
    assert not isinstance(main, Column), "no tabs for a single axis"
    assert _x_columns(_figures(main, below)) <= EVENT_COLS
