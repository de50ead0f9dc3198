"""The stage and category plots of the single-run reports: peak by stage, bytes by category at
the peak, and bytes by category at each stage interval's own peak. Each function takes a
report's view-model and returns one Bokeh root; they draw, they do not compute.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    FactorRange,
    HoverTool,
    LegendItem,
    Range1d,
    TapTool,
    UIElement,
)

from snapviz.render.html.bokeh_kit import (
    base_figure,
    bytes_axis,
    bytes_hover_formatter,
    bytes_tick_formatter,
    bytes_ticker,
    compact_legend,
    make_source,
)
from snapviz.render.html.view_models import SingleRunReport, SnapshotReport
from snapviz.units import fmt_bytes


def stage_bar_block(data: SingleRunReport) -> UIElement:
    b = data.stage_bars
    labels = list(b.label)
    src = make_source(
        {
            k: getattr(b, k)
            for k in (
                "label",
                "name",
                "group",
                "color",
                "peak_allocated",
                "peak_reserved",
                "allocator_peak",
                "duration_s",
            )
        }
    )
    finite = np.asarray(b.peak_allocated, np.float64)
    finite = finite[np.isfinite(finite)]  # stages of a trace without memory events have no peak (NaN)
    top = max([float(finite.max()) if len(finite) else 1.0, 1.0])
    fig = base_figure(
        320, x_range=FactorRange(*labels) if labels else FactorRange(), y_range=Range1d(0, top * 1.1, bounds=(0, None))
    )
    fig.toolbar_location = None
    bars = fig.vbar(
        x="label", top="peak_allocated", width=0.8, source=src, fill_color="color", line_color=None, fill_alpha=0.85
    )
    nbytes = bytes_hover_formatter()
    tips = [
        ("stage", "@name"),
        ("peak allocated", "@peak_allocated{custom}"),
        ("peak reserved", "@peak_reserved{custom}"),
        ("duration", "@duration_s{0.000} s"),
    ]
    renderers = [bars]
    if np.isfinite(b.allocator_peak).any():
        fig.scatter(
            x="label",
            y="allocator_peak",
            source=src,
            marker="dash",
            size=18,
            line_width=2.5,
            line_color="#1d2330",
            legend_label="allocator's own peak",
        )
        tips.append(("allocator's peak", "@allocator_peak{custom}"))
        leg = fig.legend[0]
        leg.orientation = "horizontal"
        leg.label_text_font_size = "11px"
        leg.border_line_color = None
        leg.padding = 2
        fig.add_layout(leg, "above")  # never over a bar
    fig.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=tips,
            formatters={"@peak_allocated": nbytes, "@peak_reserved": nbytes, "@allocator_peak": nbytes},
        )
    )
    bytes_axis(fig)
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.9 if len(labels) > 8 else 0.0
    if len(labels) > 40:
        fig.xaxis.major_label_text_font_size = "8px"
    fig.name = "sv-stage-bars"
    return fig


def category_block(data: SnapshotReport, height: int | None = None) -> UIElement:
    c = data.categories
    cats = list(reversed(c.category))
    cols = {k: getattr(c, k) for k in ("category", "bytes", "count", "share", "label", "color")}
    src = make_source({k: (list(reversed(v)) if isinstance(v, list) else v[::-1].copy()) for k, v in cols.items()})
    top = float(np.max(c.bytes)) if len(cats) else 1.0
    fig = base_figure(
        height or max(320, 40 * len(cats) + 50),
        y_range=FactorRange(*cats) if cats else FactorRange(),
        x_range=Range1d(0, top * 1.45, bounds=(0, None)),
    )
    fig.toolbar_location = None
    fig.hbar(y="category", right="bytes", height=0.7, source=src, fill_color="color", line_color=None, fill_alpha=0.85)
    fig.text(
        x="bytes",
        y="category",
        text="label",
        source=src,
        x_offset=6,
        text_baseline="middle",
        text_font_size="12px",
        text_color="#4a5263",
    )
    fig.xaxis.formatter = bytes_tick_formatter()
    fig.xaxis.ticker = bytes_ticker()
    fig.ygrid.grid_line_color = None
    fig.add_tools(
        HoverTool(
            tooltips=[("category", "@category"), ("bytes", "@bytes{custom}"), ("blocks", "@count")],
            formatters={"@bytes": bytes_hover_formatter()},
        )
    )
    fig.name = "sv-categories"
    return fig


def stage_breakdown_block(data: SnapshotReport, height: int, linked: ColumnDataSource | None = None) -> UIElement:
    """One horizontal bar per stage interval: bytes by category at that interval's own peak.
    A click on a bar selects the interval's rows of ``linked`` (a table source with ``interval``)."""
    b = data.stage_breakdown
    labels = list(b.label)
    cats, colors = b.categories, b.colors
    cols: dict[str, Any] = {
        "label": labels,
        "name": b.name,
        "interval": b.interval,
        "total": b.total,
        "total_label": [fmt_bytes(t) for t in b.total],
        "allocator_peak": b.allocator_peak,
    }
    for i, c in enumerate(cats):
        cols[f"c{i}"] = b.bytes[c]
        cols[f"s{i}"] = b.share[c]
    src = make_source(cols)
    top = max(float(np.nanmax(b.total)) if len(labels) else 1.0, 1.0)
    # Top-to-bottom in run order.
    fig = base_figure(
        height,
        y_range=FactorRange(*reversed(labels)) if labels else FactorRange(),
        x_range=Range1d(0, top * 1.2, bounds=(0, None)),
    )
    fig.toolbar_location = None
    fields = [f"c{i}" for i in range(len(cats))]
    renderers = (
        fig.hbar_stack(
            fields, y="label", height=0.72, color=colors, source=src, line_color="white", line_width=0.5, fill_alpha=0.9
        )
        if cats
        else []
    )
    nbytes = bytes_hover_formatter()
    for i, (cat, r) in enumerate(zip(cats, renderers, strict=False)):
        tips = [
            ("stage", "@name"),
            (cat, f"@c{i}{{custom}} (@s{i}{{0%}} of the stage's peak)"),
            ("stage peak", "@total{custom}"),
        ]
        fig.add_tools(HoverTool(renderers=[r], tooltips=tips, formatters={f"@c{i}": nbytes, "@total": nbytes}))
    fig.text(
        x="total",
        y="label",
        text="total_label",
        source=src,
        x_offset=6,
        text_baseline="middle",
        text_font_size="11.5px",
        text_color="#4a5263",
    )
    items = [LegendItem(label=value(c), renderers=[r]) for c, r in zip(cats, renderers, strict=False)]
    if np.isfinite(np.asarray(b.allocator_peak, np.float64)).any():
        m = fig.scatter(
            x="allocator_peak",
            y="label",
            source=src,
            marker="dash",
            angle=np.pi / 2,
            size=16,
            line_width=2.5,
            line_color="#1d2330",
        )
        items.append(LegendItem(label=value("allocator's own peak"), renderers=[m]))
    fig.add_layout(compact_legend(items), "above")
    fig.xaxis.formatter = bytes_tick_formatter()
    fig.xaxis.ticker = bytes_ticker()
    fig.ygrid.grid_line_color = None
    if linked is not None and renderers:
        fig.add_tools(TapTool(renderers=list(renderers)))
        src.selected.js_on_change(
            "indices",
            CustomJS(
                args={"bars": src, "table": linked},
                code="""
const ix = bars.selected.indices;
if (!ix.length) { table.selected.indices = []; return; }
const iv = bars.data.interval[ix[0]], rows = [];
const col = table.data.interval;
for (let i = 0; i < col.length; i++) if (col[i] == iv) rows.push(i);
table.selected.indices = rows;
""",
            ),
        )
    if len(labels) > 40:
        fig.yaxis.major_label_text_font_size = "9px"
    fig.name = "sv-stage-breakdown"
    return fig
