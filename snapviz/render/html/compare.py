"""The comparison page: one self-contained HTML file (Bokeh INLINE, works offline), drawn
from :func:`~snapviz.render.html.compare_data.compare_report_data` with the page and Bokeh kits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from bokeh.core.properties import value
from bokeh.models import DataRange1d, FactorRange, FixedTicker, HoverTool, LegendItem, Range1d, UIElement

from snapviz import __version__
from snapviz.render.html.bokeh_kit import (
    LineSpec,
    base_figure,
    bytes_hover_formatter,
    bytes_tick_formatter,
    bytes_ticker,
    make_source,
    timeline_figure,
)
from snapviz.render.html.compare_data import CompareReport, compare_report_data
from snapviz.render.html.page import build_page, card, card_open, chrome, table_css, warnings_html, wide_table
from snapviz.render.html.view_models import bounded

if TYPE_CHECKING:
    from snapviz.analyses.compare import Comparison
    from snapviz.analyses.compare_document import CompareDocument


def _hero(data: CompareReport) -> str:
    verdict = data.verdict
    head = verdict[0] if len(verdict) == 1 else f"{len(verdict)} runs compared with {data.labels[0]}"
    extra = chrome("compare_runs", runs=list(data.runs))
    fo = data.fail_over
    if fo is not None:
        status = "match" if fo.passed else "differs"
        text = f"gate --fail-over {fo.percent:g}%: {'passed' if fo.passed else 'FAILED'}"
        extra += chrome("badge", status=status, text=text)
    return chrome(
        "hero",
        kicker=f"snapviz · {data.kind} comparison",
        title=data.title,
        verdict=head,
        lines=list(verdict) if len(verdict) > 1 else [],
        extra=extra,
    )


def _timeline(data: CompareReport) -> Any:
    tls = [t for t in data.timelines if len(t.x)]
    n_slots = max(len(data.slots), 1)
    first = tls[0]
    src0 = make_source({"x": first.x, "allocated": first.allocated, "reserved": first.reserved, "stage": first.stage})
    fig = timeline_figure(
        src0,
        "x",
        [LineSpec("allocated", first.label, first.color, 2.2)],
        x_label="stage (each stage label has the same width in every run)",
        bands=vars(data.bands),
        band_x=("left", "right"),
        y_top=data.y_top,
        height=420,
        x_range=Range1d(0, n_slots, bounds=(0, n_slots)),
    )
    legend = fig.legend[0]
    sources = [(first, src0)]
    for t in tls[1:]:
        src = make_source({"x": t.x, "allocated": t.allocated, "reserved": t.reserved, "stage": t.stage})
        r = fig.step(x="x", y="allocated", source=src, mode="after", line_color=t.color, line_width=2.0, line_alpha=0.9)
        legend.items.insert(len(sources), LegendItem(label=value(t.label), renderers=[r]))
        sources.append((t, src))
    reserved = [
        fig.step(
            x="x",
            y="reserved",
            source=src,
            mode="after",
            line_color=t.color,
            line_width=1.0,
            line_dash="dashed",
            line_alpha=0.55,
            visible=False,
        )
        for t, src in sources
    ]
    legend.items.append(LegendItem(label=value("reserved (dashed, every run)"), renderers=reserved))
    # Autoscale y on the visible lines only (bands and hover markers do not count), from 0.
    lines = [r for r in fig.renderers if getattr(r.glyph, "mode", None) == "after"]
    fig.y_range = DataRange1d(start=0, renderers=lines, only_visible=True, range_padding=0.08)
    hover_renderers = []
    for _t, src in sources:
        hover_renderers.append(fig.scatter(x="x", y="allocated", source=src, size=7, fill_alpha=0, line_alpha=0))
    fig.add_tools(
        HoverTool(
            renderers=hover_renderers,
            tooltips=[("stage", "@stage"), ("allocated", "@allocated{custom}"), ("reserved", "@reserved{custom}")],
            formatters={"@allocated": bytes_hover_formatter(), "@reserved": bytes_hover_formatter()},
        )
    )
    fig.xaxis.ticker = FixedTicker(ticks=data.ticks)
    fig.xaxis.major_label_overrides = {float(k): v for k, v in data.tick_labels.items()}
    if len(data.ticks) > 8 or len(data.slots) > 24:  # many ticks, or one-slot stages side by side
        fig.xaxis.major_label_orientation = 0.8
    # Many runs: wrap the legend instead of widening the page (~7 px a character at 12 px).
    longest = max(len(str(getattr(it.label, "value", it.label))) for it in legend.items)
    legend.ncols = max(1, min(len(legend.items), 1200 // (7 * longest + 46)))
    fig.name = "sv-cmp-timeline"
    return fig


def _bars(data: CompareReport) -> Any:
    b = data.bars
    top = float(np.nanmax(b.peak_allocated)) if len(b.factors) and np.isfinite(b.peak_allocated).any() else 1.0
    src = make_source(
        {
            "x": b.factors,
            "peak_allocated": np.nan_to_num(b.peak_allocated),
            "peak_reserved": b.peak_reserved,
            "color": b.color,
            "delta": b.delta,
            "run": [f[1] for f in b.factors],
        }
    )
    fig = base_figure(
        340,
        x_range=FactorRange(*b.factors) if b.factors else FactorRange(),
        y_range=Range1d(0, max(top, 1.0) * 1.12, bounds=(0, None)),
    )
    fig.toolbar_location = None
    fig.vbar(x="x", top="peak_allocated", width=0.85, source=src, fill_color="color", line_color=None, fill_alpha=0.85)
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("run", "@run"),
                ("peak allocated", "@peak_allocated{custom}"),
                ("peak reserved", "@peak_reserved{custom}"),
                ("vs base", "@delta"),
            ],
            formatters={"@peak_allocated": bytes_hover_formatter(), "@peak_reserved": bytes_hover_formatter()},
        )
    )
    fig.yaxis.formatter = bytes_tick_formatter()
    fig.yaxis.ticker = bytes_ticker()
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.9 if len(b.factors) > 12 else 0.0
    fig.xaxis.group_label_orientation = 0.0
    fig.name = "sv-cmp-bars"
    return fig


def render_compare_report_data(data: CompareReport, lead: Sequence[str | UIElement] = ()) -> str:
    """The page for a :func:`compare_report_data` dict. ``lead``: blocks (escaped HTML or
    Bokeh models) placed right after the header, before the comparison's own cards; a report
    built on a comparison (the technique matrix) puts its card there."""
    data = bounded(data)

    labels = data.labels
    blocks: list[Any] = [table_css(), _hero(data), *lead]
    blocks.append(warnings_html(data.warnings[:12], "⚠ warnings"))
    if any(len(t.x) for t in data.timelines):
        blocks += [
            card_open(
                "Memory over the pipeline, aligned by stage",
                "Each stage label (every denoising step too) gets the same width in every run, so steps line "
                "up whatever their wall time. Solid: allocated; click a legend entry to show reserved (dashed) "
                "or hide a run. Min/max decimation keeps every stage's peak.",
                "sv-cmp-timeline-card",
            ),
            _timeline(data),
            "</section>",
        ]
    if data.bars.factors:
        blocks += [
            card_open(
                "Peak allocated per stage",
                "One bar per run in each stage (the peak over all its intervals and steps).",
                "sv-cmp-bars-card",
            ),
            _bars(data),
            "</section>",
        ]
    head = ["stage"] + [f"{lab} (base)" if i == 0 else lab for i, lab in enumerate(labels)]
    rows = [[r.name, *r.cells] for r in data.stage_rows]
    blocks.append(
        card(
            "Peak allocated per stage and step",
            wide_table(head, rows, "sv-delta-table"),
            "Δ against the base; — where a run has no such stage.",
            "sv-cmp-deltas",
        )
    )
    if data.site_rows:
        head = ["allocation site", f"{labels[0]}: live at peak / allocated in total"] + [
            f"{lab}: Δ" for lab in labels[1:]
        ]
        rows = [[r.name, *r.cells] for r in data.site_rows]
        blocks.append(
            card(
                "Allocation sites that changed",
                wide_table(head, rows, "sv-site-table"),
                "Matched by source line; bytes live at each run's peak / bytes allocated over the whole run.",
                "sv-cmp-sites",
            )
        )
    blocks.append(chrome("footer", text=f"Generated by snapviz {__version__} compare — self-contained, works offline."))
    return build_page(f"snapviz compare: {data.title}", blocks)


def render_compare_html(cmp: Comparison, doc: CompareDocument, lead: Sequence[str | UIElement] = ()) -> str:
    """The comparison page of ``cmp`` and its typed ``snapviz.compare/1`` document (``lead``: see
    :func:`render_compare_report_data`)."""
    return render_compare_report_data(compare_report_data(cmp, doc), lead)
