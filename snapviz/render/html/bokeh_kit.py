"""The Bokeh kit: sources, figures, axes, formatters and tables shared by every report.

Everything here takes plain columns and returns Bokeh models; nothing is computed from the
analyses. Byte values show in binary units (``1.5 GiB``) on axes and in tooltips.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.models import (
    AdaptiveTicker,
    BoxZoomTool,
    Column,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    CustomJSTickFormatter,
    DataRange1d,
    DataTable,
    InlineStyleSheet,
    Label,
    Legend,
    LegendItem,
    NumeralTickFormatter,
    PanTool,
    PreText,
    Range1d,
    ResetTool,
    SaveTool,
    Span,
    TableColumn,
    UIElement,
    WheelZoomTool,
)
from bokeh.models.text import PlainText
from bokeh.plotting import figure

from snapviz.render.html.page import BYTES_JS, load_asset
from snapviz.render.html.palette import SERIES_COLORS
from snapviz.render.html.view_models import Peak
from snapviz.render.html.x_switch import XAxis, XSwitch

TABLE_WIDTH = 1320  # px: a card's inner width at the page's max width


def bytes_tick_formatter() -> CustomJSTickFormatter:
    """Axis labels in binary units (``1.5 GiB``)."""
    return CustomJSTickFormatter(code=BYTES_JS + "return fmtBytes(tick);")


def bytes_ticker(desired_num_ticks: int = 6) -> AdaptiveTicker:
    """Ticks on powers of two of bytes so labels read 512 MiB, 1 GiB, 1.5 GiB (never 2.15 GiB)."""
    return AdaptiveTicker(base=2, mantissas=[1], min_interval=1, desired_num_ticks=desired_num_ticks, num_minor_ticks=2)


def seconds_tick_formatter() -> CustomJSTickFormatter:
    """Seconds with as many decimals as the tick spacing needs (no 1.000e-3)."""
    return CustomJSTickFormatter(
        code="""
const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
const d = step > 0 ? Math.min(6, Math.max(0, Math.ceil(-Math.log10(step) - 1e-9))) : 0;
return tick.toFixed(d);
"""
    )


def bytes_hover_formatter() -> CustomJSHover:
    return CustomJSHover(code=BYTES_JS + "return fmtBytes(value);")


def lookup_formatter(names: Sequence[str], missing: str = "") -> CustomJSHover:
    return CustomJSHover(
        args={"names": list(names)}, code=f"return (value >= 0 && value < names.length) ? names[value] : {missing!r};"
    )


def plain_text(text: str) -> PlainText:
    """Text for Bokeh annotations that is never parsed as TeX (stage names are user data)."""
    return PlainText(text=text)


def make_source(columns: dict[str, Any]) -> ColumnDataSource:
    data: dict[str, Any] = {}
    for k, v in columns.items():
        if isinstance(v, np.ndarray):
            # Bokeh ships typed arrays in base64; int64 has no JS typed array.
            if v.dtype.kind in "iu":
                v = (
                    v.astype(np.int32)
                    if (len(v) == 0 or (v.min() >= -(2**31) and v.max() < 2**31))
                    else v.astype(np.float64)
                )
            elif v.dtype.kind == "b":
                v = v.astype(np.int8)
        data[k] = v
    return ColumnDataSource(data)


@dataclass
class LineSpec:
    """One series of a timeline: a column of the source, drawn as a step line."""

    field: str
    label: str
    color: str
    width: float = 2.0
    dash: str = "solid"
    alpha: float = 1.0


def base_figure(height: int, x_range: Any = None, title: str | None = None, **kw: Any) -> Any:
    tools = [PanTool(dimensions="width"), WheelZoomTool(dimensions="width"), BoxZoomTool(), ResetTool(), SaveTool()]
    kw["x_range"] = x_range if x_range is not None else DataRange1d(range_padding=0.01)
    fig = figure(height=height, sizing_mode="stretch_width", tools=tools, toolbar_location="above", title=title, **kw)
    fig.toolbar.active_scroll = tools[1]
    fig.toolbar.logo = None
    fig.outline_line_color = None
    fig.grid.grid_line_color = "#eceef2"
    fig.axis.axis_line_color = "#c9ced8"
    fig.axis.major_tick_line_color = "#c9ced8"
    fig.axis.minor_tick_line_color = None
    fig.axis.major_label_text_color = "#4a5263"
    fig.axis.axis_label_text_color = "#4a5263"
    fig.axis.axis_label_text_font_style = "normal"
    fig.min_border_left = 70
    return fig


def bytes_axis(fig: Any, ticks: int = 6) -> None:
    fig.yaxis.formatter = bytes_tick_formatter()
    fig.yaxis.ticker = bytes_ticker(ticks)


def x_tick_formatter(x: str) -> Any:
    """Tick labels for an x column: event rows as integers, anything else as seconds."""
    return NumeralTickFormatter(format="0,0") if x == "index" else seconds_tick_formatter()


def timeline_figure(
    source: ColumnDataSource,
    x: str,
    lines: Sequence[LineSpec],
    *,
    x_label: str,
    bands: Mapping[str, Any] | None = None,
    band_x: tuple[str, str] | None = None,
    peak: Peak | None = None,
    peak_x: float | None = None,
    y_top: float | None = None,
    height: int = 380,
    x_range: Any = None,
    title: str | None = None,
    switch: XSwitch | None = None,
) -> Any:
    """A memory-over-time figure: step lines of ``source`` columns over ``x``, stage
    bands (``bands`` columns ``band_x[0]``/``band_x[1]``, ``name``, ``group``, ``color``,
    ``alpha``) under them, and the peak marked with a span and a label.

    With ``switch``, the figure is drawn on its first axis (``x``, ``x_label``, ``band_x`` and
    ``peak_x`` are taken from it) and records what another axis changes."""
    axes = switch.axes if switch is not None else [XAxis(x, x_label, band_x or ("", ""), "", peak_x)]
    x, x_label, band_x, peak_x = axes[0].field, axes[0].label, axes[0].band, axes[0].peak_x
    top = float(y_top) if y_top else 1.0
    fig = base_figure(height, x_range=x_range, title=title, y_range=Range1d(0, top * 1.12, bounds=(0, None)))
    fig.xaxis.axis_label = x_label
    tick_formatters = [x_tick_formatter(a.field) for a in axes]
    fig.xaxis.formatter = tick_formatters[0]
    if switch is not None:
        switch.set(fig.xaxis[0], "axis_label", [a.label for a in axes])
        switch.set(fig.xaxis[0], "formatter", tick_formatters)
    bytes_axis(fig)
    legend_items: list[LegendItem] = []
    if bands is not None and all(axes[0].band) and len(bands["name"]):
        edges = list(dict.fromkeys(c for a in axes for c in a.band))
        groups = list(dict.fromkeys(bands["group"]))
        for g in groups:
            ix = [i for i, gg in enumerate(bands["group"]) if gg == g]
            cols: dict[str, Any] = {c: np.asarray(bands[c])[ix] for c in edges}
            cols.update(
                {
                    "name": [bands["name"][i] for i in ix],
                    "alpha": [bands["alpha"][i] for i in ix],
                    "top": np.full(len(ix), top * 1.12),
                }
            )
            color = bands["color"][ix[0]]
            r = fig.quad(
                left=band_x[0],
                right=band_x[1],
                bottom=0,
                top="top",
                fill_color=color,
                fill_alpha="alpha",
                line_color=None,
                source=make_source(cols),
                level="underlay",
            )
            # The bands' own alpha is too faint for a legend swatch: add an empty, stronger one.
            sw = fig.quad(left=[], right=[], bottom=[], top=[], fill_color=color, fill_alpha=0.45, line_color=None)
            legend_items.append(LegendItem(label=value(g), renderers=[sw, r]))
    line_items = []
    for spec in lines:
        r = fig.step(
            x=x,
            y=spec.field,
            source=source,
            mode="after",
            line_color=spec.color,
            line_width=spec.width,
            line_dash=spec.dash,
            line_alpha=spec.alpha,
        )
        line_items.append(LegendItem(label=value(spec.label), renderers=[r]))
    if peak is not None:
        line_items += mark_peak(fig, source, peak, axes, switch)
    items = line_items + legend_items
    legend = Legend(
        items=items,
        orientation="horizontal",
        location="top_left",
        click_policy="hide",
        label_text_font_size="12px",
        spacing=14,
        padding=4,
        margin=4,
        border_line_color=None,
        background_fill_alpha=0.0,
        glyph_width=18,
    )
    if len(items) > 12:  # many custom stages: wrap instead of running off the plot
        legend.ncols = 12
    fig.add_layout(legend, "above")
    return fig


def mark_peak(
    fig: Any,
    source: ColumnDataSource,
    peak: Peak,
    axes: Sequence[XAxis],
    switch: XSwitch | None,
    *,
    size: int = 11,
    with_label: bool = True,
) -> list[LegendItem]:
    """The peak as a dashed span, a dot and (``with_label``) a label, on each axis where it has
    a place; the legend item for the dot (none when no axis places it)."""
    where = [a.peak_x if a.peak_x is not None and np.isfinite(a.peak_x) else None for a in axes]
    if all(px is None for px in where):
        return []
    span = Span(
        location=where[0],
        dimension="height",
        line_color=SERIES_COLORS["peak"],
        line_dash="dashed",
        line_width=1.5,
    )
    fig.add_layout(span)
    # The dot's x is a column per axis (NaN where the peak has no place: not drawn), so the
    # switch swaps its field like every line's.
    dot = {a.field: [float("nan") if px is None else float(px)] for a, px in zip(axes, where, strict=True)}
    pr = fig.scatter(
        x=axes[0].field,
        y="y",
        source=ColumnDataSource({**dot, "y": [float(peak.allocated)]}),
        size=size,
        marker="circle",
        fill_color=SERIES_COLORS["peak"],
        line_color="white",
        line_width=2,
    )
    if switch is not None:
        switch.set(span, "location", where)
    if not with_label:
        return [LegendItem(label=value("peak"), renderers=[pr])]
    # Keep the label inside the plot: put it left of the peak when the peak is near the right end.
    right_side = []
    for a, px in zip(axes, where, strict=True):
        xs = np.asarray(source.data.get(a.field, []), dtype=np.float64)
        right_side.append(
            px is not None
            and bool(len(xs))
            and bool(np.isfinite(xs).any())
            and bool((px - np.nanmin(xs)) > 0.7 * max(np.nanmax(xs) - np.nanmin(xs), 1e-12))
        )
    label = Label(
        x=where[0] if where[0] is not None else 0.0,
        y=float(peak.allocated),
        text=plain_text(peak.label),
        x_offset=-8 if right_side[0] else 8,
        y_offset=6,
        text_align="right" if right_side[0] else "left",
        text_font_size="12px",
        text_color=SERIES_COLORS["peak"],
        text_font_style="bold",
        background_fill_color="white",
        background_fill_alpha=0.85,
        visible=where[0] is not None,
    )
    fig.add_layout(label)
    if switch is not None:
        switch.set(label, "x", [0.0 if px is None else px for px in where])
        switch.set(label, "visible", [px is not None for px in where])
        switch.set(label, "x_offset", [-8 if r else 8 for r in right_side])
        switch.set(label, "text_align", ["right" if r else "left" for r in right_side])
    return [LegendItem(label=value("peak"), renderers=[pr])]


def small_title(fig: Any) -> None:
    """A figure title in the quiet style of a sub-plot."""
    fig.title.text_font_size = "12px"
    fig.title.text_font_style = "normal"
    fig.title.text_color = "#4a5263"


def stack_pane(text: str) -> PreText:
    """A text pane for stacks (styled by ``assets/stack_pane.css`` inside Bokeh's shadow DOM)."""
    return PreText(
        text=text,
        sizing_mode="stretch_width",
        disable_math=True,
        stylesheets=[InlineStyleSheet(css=load_asset("stack_pane.css"))],
    )


def table_block(
    columns: dict[str, Any],
    spec: Sequence[tuple[str, str, int]],
    name: str,
    stack_field: str | None,
    hint: str,
    max_height: int = 420,
) -> UIElement:
    # The stacks shown on selection travel as one JSON string on the pane, not as a column:
    # BokehJS decodes string columns value by value when the page opens (see timeline_plots).
    stacks = list(columns[stack_field]) if stack_field is not None else []
    src = make_source({k: v for k, v in columns.items() if k != stack_field})
    # Bokeh 3.9's content-based autosizing fails in the browser ("row is not defined") and
    # force_fit splits the width equally: fixed widths, scaled to the page's usual width.
    scale = max(1.0, TABLE_WIDTH / max(sum(w for _, _, w in spec), 1))
    cols = [TableColumn(field=f, title=t, width=int(w * scale)) for f, t, w in spec]
    n = len(next(iter(columns.values()))) if columns else 0
    table = DataTable(
        source=src,
        columns=cols,
        height=min(max_height, 28 * n + 32),
        sizing_mode="stretch_width",
        index_position=None,
        selectable=True,
        row_height=26,
        name=f"{name}-table",
        autosize_mode="none",
        reorderable=False,
    )  # reordering needs jquery-ui, which Bokeh does not bundle
    if stack_field is None:
        return Column(table, sizing_mode="stretch_width", name=name)
    pane = stack_pane(hint)
    pane.tags = [json.dumps(stacks)]
    src.selected.js_on_change(
        "indices",
        CustomJS(
            args={"pane": pane},
            code="""
const ix = cb_obj.indices;
const texts = pane.sv_texts || (pane.sv_texts = JSON.parse(pane.tags[0]));
if (ix.length && ix[0] < texts.length) pane.text = texts[ix[0]];
""",
        ),
    )
    return Column(table, pane, sizing_mode="stretch_width", name=name)


def compact_legend(items: list[Any]) -> Legend:
    """The small horizontal legend placed above the category and stage-bar plots."""
    return Legend(
        items=items,
        orientation="horizontal",
        location="top_left",
        label_text_font_size="11.5px",
        spacing=12,
        padding=2,
        margin=2,
        border_line_color=None,
        background_fill_alpha=0.0,
        glyph_width=14,
        glyph_height=12,
    )
