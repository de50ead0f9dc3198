"""The plots of the single-run reports: the memory timeline (with the category area and the
cached-but-unallocated strip under it), peak by stage, and bytes by category.

Each function takes a report's view-model dict and returns one Bokeh root; they draw, they
do not compute.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.events import Tap
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    FactorRange,
    HoverTool,
    Legend,
    LegendItem,
    NumeralTickFormatter,
    PreText,
    Range1d,
    Scatter,
    Span,
    TabPanel,
    Tabs,
    TapTool,
)
from bokeh.models.layouts import Column, UIElement
from bokeh.transform import stack

from snapviz.render.html.bokeh_kit import (
    LineSpec,
    base_figure,
    bytes_axis,
    bytes_hover_formatter,
    bytes_tick_formatter,
    bytes_ticker,
    lookup_formatter,
    make_source,
    seconds_tick_formatter,
    small_title,
    stack_pane,
    timeline_figure,
)
from snapviz.render.html.page import BYTES_JS
from snapviz.render.html.palette import SERIES_COLORS
from snapviz.units import fmt_bytes


def timeline_block(data: dict[str, Any], *, with_points: bool = True) -> UIElement:
    tl = data["timeline"]
    src = make_source(tl)
    peak = data["peak"]
    y_top = float(np.nanmax(tl["reserved"])) if len(tl["reserved"]) else 1.0
    y_top = max(y_top, float(peak["allocated"] or 0), 1.0)
    lines = [LineSpec("reserved", "reserved", SERIES_COLORS["reserved"], 1.6, alpha=0.9),
             LineSpec("allocated", "allocated", SERIES_COLORS["allocated"], 2.0)]
    if "requested" in tl:
        lines.insert(1, LineSpec("requested", "requested", SERIES_COLORS["requested"], 1.2, "dashed", 0.9))
    pane = stack_pane("Click a point on the timeline to see the allocation's stack here.")
    ct = data.get("category_timeline")
    cat_src = _category_source(ct) if ct and ct["categories"] and len(ct["index"]) else None
    views = []
    axes = [("time_s", "time since the first event (s)", ("start_s", "end_s"), "By time")] if data["has_time"] else []
    axes.append(("index", "event index", ("start_index", "end_index"), "By event"))
    for x, x_label, band_x, tab in axes:
        peak_x = peak["time_s"] if x == "time_s" else (peak["index"] if peak["index"] >= 0 else None)
        fig = timeline_figure(src, x, lines, x_label=x_label, bands=data["bands"], band_x=band_x, peak=peak,
                              peak_x=peak_x, y_top=y_top, height=400)
        fig.xaxis.visible = False
        fig.min_border_bottom = 4
        oom = data.get("oom")
        if oom is not None and len(oom["index"]):
            ox = oom["time_s"] if x == "time_s" else oom["index"]
            r = fig.scatter(x=np.asarray(ox, np.float64), y=np.asarray(oom["allocated"], np.float64), marker="x",
                            size=14, line_width=3, line_color=SERIES_COLORS["peak"])
            fig.legend[0].items.append(LegendItem(label=value("CUDA OOM"), renderers=[r]))
        if with_points:
            _add_point_hover(fig, src, x, data, pane)
        area = _category_area(data, cat_src, x, fig.x_range, peak_x) if cat_src is not None else None
        frag = base_figure(150, x_range=fig.x_range, title="cached but not allocated (reserved − allocated)", y_range=Range1d(0, max(float(np.nanmax(tl["fragmentation"])) if len(tl["fragmentation"]) else 1.0, 1.0) * 1.1, bounds=(0, None)))
        frag.varea_step(x=x, y1=0, y2="fragmentation", source=src, step_mode="after",
                        fill_color=SERIES_COLORS["fragmentation"], fill_alpha=0.3)
        frag.step(x=x, y="fragmentation", source=src, mode="after", line_color=SERIES_COLORS["fragmentation"], line_width=1.2)
        frag.xaxis.axis_label = x_label
        frag.xaxis.formatter = NumeralTickFormatter(format="0,0") if x == "index" else seconds_tick_formatter()
        bytes_axis(frag, ticks=3)
        frag.title.text_font_size = "12px"
        frag.title.text_font_style = "normal"
        frag.title.text_color = "#4a5263"
        frag.toolbar_location = None
        parts = [fig, area, frag] if area is not None else [fig, frag]
        views.append(TabPanel(title=tab, child=Column(*parts, sizing_mode="stretch_width", spacing=0)))
    body = Tabs(tabs=views, sizing_mode="stretch_width") if len(views) > 1 else views[0].child
    return Column(*([body, pane] if with_points else [body]), sizing_mode="stretch_width", name="sv-timeline")


def timeline_or_note(data: dict[str, Any], with_points: bool = True) -> str | UIElement:
    if data["decimation"]["total"] == 0:
        return ('<p class="sv-none" id="sv-no-timeline">No trace history in this input (recorded without '
                "<code>_record_memory_history</code>, or an end-state-only dump): nothing to draw over time.</p>")
    return timeline_block(data, with_points=with_points)


def _add_point_hover(fig: Any, src: ColumnDataSource, x: str, data: dict[str, Any], pane: PreText) -> None:
    """Invisible markers on the allocated line: hover shows the event, a click its stack."""
    r = fig.scatter(x=x, y="allocated", source=src, size=8, fill_alpha=0, line_alpha=0)
    # State glyphs need the renderer's own x/y fields: a bare Scatter() reads 'x'/'y', which the
    # source lacks (Bokeh logged "nonexistent field" for each in the browser console).
    r.selection_glyph = Scatter(x=x, y="allocated", fill_color=SERIES_COLORS["peak"], line_color="white", fill_alpha=1, line_alpha=1)
    r.nonselection_glyph = Scatter(x=x, y="allocated", fill_alpha=0, line_alpha=0)
    r.hover_glyph = Scatter(x=x, y="allocated", fill_color=SERIES_COLORS["allocated"], line_color="white", fill_alpha=1, line_alpha=1)
    stacks = data.get("stacks") or {"site": [], "frames": [], "more": [], "frame_text": []}
    nbytes = bytes_hover_formatter()
    tooltips = [("event", "@index{0,0}")]
    if data["has_time"]:
        tooltips.append(("time", "@time_s{0.000} s"))
    tooltips += [("stage", "@stage{custom}"), ("action", "@action{custom}"), ("size", "@size{custom}"),
                 ("site", "@stack{custom}"), ("allocated", "@allocated{custom}"), ("reserved", "@reserved{custom}")]
    fig.add_tools(HoverTool(renderers=[r], mode="vline", tooltips=tooltips, limit=1, attachment="horizontal",
                            formatters={"@stage": lookup_formatter(data["stage_names"]),
                                        "@action": lookup_formatter(data.get("action_names") or []),
                                        "@stack": lookup_formatter(stacks["site"], "(no frames recorded)"),
                                        "@size": nbytes, "@allocated": nbytes, "@reserved": nbytes}))
    # A click anywhere selects the event in force at that x (the step line's value there),
    # so users need not hit a vertex.
    fig.js_on_event(Tap, CustomJS(args={"src": src, "field": x}, code="""
const xs = src.data[field];
let lo = 0, hi = xs.length - 1;
if (hi < 0 || cb_obj.x < xs[0]) return;
while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (xs[mid] <= cb_obj.x) lo = mid; else hi = mid - 1; }
src.selected.indices = [lo];
"""))
    src.selected.js_on_change("indices", CustomJS(
        args={"src": src, "pane": pane, "sites": stacks["site"], "frames": stacks["frames"], "more": stacks["more"],
              "text": stacks["frame_text"], "stages": data["stage_names"], "actions": data.get("action_names") or []},
        code=BYTES_JS + """
const ix = src.selected.indices;
if (!ix.length) return;
const i = ix[0], d = src.data, k = d.stack[i];
const head = "event " + d.index[i].toLocaleString() + " · " + (actions[d.action[i]] || "") + " " + fmtBytes(d.size[i]) +
             " · " + (stages[d.stage[i]] || "") + " · allocated " + fmtBytes(d.allocated[i]);
let body = "(no frames recorded)";
if (k >= 0 && k < frames.length) {
  body = frames[k].map(f => text[f]).join("\\n");
  if (more[k] > 0) body += "\\n... " + more[k] + " more";
}
pane.text = head + "\\n" + body;
"""))


def stage_bar_block(data: dict[str, Any]) -> UIElement:
    b = data["stage_bars"]
    labels = list(b["label"])
    src = make_source({k: b[k] for k in ("label", "name", "group", "color", "peak_allocated", "peak_reserved",
                                      "allocator_peak", "duration_s")})
    finite = np.asarray(b["peak_allocated"], np.float64)
    finite = finite[np.isfinite(finite)]  # stages of a trace without memory events have no peak (NaN)
    top = max([float(finite.max()) if len(finite) else 1.0, 1.0])
    fig = base_figure(320, x_range=FactorRange(*labels) if labels else FactorRange(), y_range=Range1d(0, top * 1.1, bounds=(0, None)))
    fig.toolbar_location = None
    bars = fig.vbar(x="label", top="peak_allocated", width=0.8, source=src, fill_color="color", line_color=None,
                    fill_alpha=0.85)
    nbytes = bytes_hover_formatter()
    tips = [("stage", "@name"), ("peak allocated", "@peak_allocated{custom}"), ("peak reserved", "@peak_reserved{custom}"),
            ("duration", "@duration_s{0.000} s")]
    renderers = [bars]
    if np.isfinite(b["allocator_peak"]).any():
        fig.scatter(x="label", y="allocator_peak", source=src, marker="dash", size=18, line_width=2.5,
                    line_color="#1d2330", legend_label="allocator's own peak")
        tips.append(("allocator's peak", "@allocator_peak{custom}"))
        leg = fig.legend[0]
        leg.orientation = "horizontal"
        leg.label_text_font_size = "11px"
        leg.border_line_color = None
        leg.padding = 2
        fig.add_layout(leg, "above")  # never over a bar
    fig.add_tools(HoverTool(renderers=renderers, tooltips=tips,
                            formatters={"@peak_allocated": nbytes, "@peak_reserved": nbytes, "@allocator_peak": nbytes}))
    bytes_axis(fig)
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.9 if len(labels) > 8 else 0.0
    if len(labels) > 40:
        fig.xaxis.major_label_text_font_size = "8px"
    fig.name = "sv-stage-bars"
    return fig


def category_block(data: dict[str, Any], height: int | None = None) -> UIElement:
    c = data["categories"]
    cats = list(reversed(c["category"]))
    src = make_source({k: (list(reversed(v)) if isinstance(v, list) else v[::-1].copy()) for k, v in c.items()})
    top = float(np.max(c["bytes"])) if len(cats) else 1.0
    fig = base_figure(height or max(320, 40 * len(cats) + 50), y_range=FactorRange(*cats) if cats else FactorRange(),
                       x_range=Range1d(0, top * 1.45, bounds=(0, None)))
    fig.toolbar_location = None
    fig.hbar(y="category", right="bytes", height=0.7, source=src, fill_color="color", line_color=None, fill_alpha=0.85)
    fig.text(x="bytes", y="category", text="label", source=src, x_offset=6, text_baseline="middle",
             text_font_size="12px", text_color="#4a5263")
    fig.xaxis.formatter = bytes_tick_formatter()
    fig.xaxis.ticker = bytes_ticker()
    fig.ygrid.grid_line_color = None
    fig.add_tools(HoverTool(tooltips=[("category", "@category"), ("bytes", "@bytes{custom}"), ("blocks", "@count")],
                            formatters={"@bytes": bytes_hover_formatter()}))
    fig.name = "sv-categories"
    return fig


def _category_source(ct: dict[str, Any]) -> ColumnDataSource:
    """Categories as columns ``c0``… (names may hold spaces or '&'); float32 is exact to
    well under a pixel and halves what the page carries."""
    cols: dict[str, Any] = {"index": ct["index"], "time_s": ct["time_s"], "allocated": ct["allocated"],
                            "stage": ct["stage"]}
    for i, c in enumerate(ct["categories"]):
        cols[f"c{i}"] = np.asarray(ct["bytes"][c], np.float32)
    return make_source(cols)


def _category_area(data: dict[str, Any], src: ColumnDataSource, x: str, x_range: Any, peak_x: float | None) -> Any:
    """Live bytes stacked by category, under the timeline and panned/zoomed with it."""
    ct = data["category_timeline"]
    cats, colors = ct["categories"], ct["colors"]
    top = max(float(np.nanmax(ct["allocated"])) if len(ct["allocated"]) else 1.0, 1.0)
    fig = base_figure(230, x_range=x_range, title=f"live memory by category · {ct['note']}",
                       y_range=Range1d(0, top * 1.1, bounds=(0, None)))
    small_title(fig)
    fig.toolbar_location = None
    fig.xaxis.visible = False
    fig.min_border_bottom = 4
    fields = [f"c{i}" for i in range(len(cats))]
    items = []
    for i, (cat, color) in enumerate(zip(cats, colors, strict=False)):
        r = fig.varea_step(x=x, y1=stack(*fields[:i]) if i else 0, y2=stack(*fields[:i + 1]), step_mode="after",
                           source=src, fill_color=color, fill_alpha=0.85)
        items.append(LegendItem(label=value(cat), renderers=[r]))
    bytes_axis(fig, ticks=4)
    if peak_x is not None and np.isfinite(peak_x):
        fig.add_layout(Span(location=float(peak_x), dimension="height", line_color=SERIES_COLORS["peak"],
                            line_dash="dashed", line_width=1.5))
        fig.scatter(x=[float(peak_x)], y=[float(data["peak"]["allocated"])], size=9, marker="circle",
                    fill_color=SERIES_COLORS["peak"], line_color="white", line_width=2)
    # A thin line on the total: short spikes (a score matrix, the peak itself) stay visible at
    # any zoom. Step glyphs are not hit-tested, so invisible markers carry the hover.
    fig.step(x=x, y="allocated", source=src, mode="after", line_color=SERIES_COLORS["allocated"], line_width=1,
             line_alpha=0.7)
    probe = fig.scatter(x=x, y="allocated", source=src, size=6, fill_alpha=0, line_alpha=0)
    probe.hover_glyph = Scatter(x=x, y="allocated", fill_color=SERIES_COLORS["allocated"], line_color="white", fill_alpha=1, line_alpha=1)
    nbytes = bytes_hover_formatter()
    tips = [("stage", "@stage{custom}"), ("allocated", "@allocated{custom}")]
    tips += [(cat, f"@c{i}{{custom}}") for i, cat in enumerate(cats)]
    formatters: dict[str, Any] = {f"@c{i}": nbytes for i in range(len(cats))}
    formatters.update({"@allocated": nbytes, "@stage": lookup_formatter(data["stage_names"])})
    fig.add_tools(HoverTool(renderers=[probe], mode="vline", tooltips=tips, formatters=formatters, limit=1,
                            attachment="horizontal"))
    legend = Legend(items=items, orientation="horizontal", location="top_left",
                    label_text_font_size="11.5px", spacing=12, padding=2, margin=2, border_line_color=None,
                    background_fill_alpha=0.0, glyph_width=14, glyph_height=12)
    fig.add_layout(legend, "above")
    return fig


def stage_breakdown_block(data: dict[str, Any], height: int, linked: ColumnDataSource | None = None) -> UIElement:
    """One horizontal bar per stage interval: bytes by category at that interval's own peak.
    A click on a bar selects the interval's rows of ``linked`` (a table source with ``interval``)."""
    b = data["stage_breakdown"]
    labels = list(b["label"])
    cats, colors = b["categories"], b["colors"]
    cols: dict[str, Any] = {"label": labels, "name": b["name"], "interval": b["interval"], "total": b["total"],
                            "total_label": [fmt_bytes(t) for t in b["total"]],
                            "allocator_peak": b["allocator_peak"]}
    for i, c in enumerate(cats):
        cols[f"c{i}"] = b["bytes"][c]
        cols[f"s{i}"] = b["share"][c]
    src = make_source(cols)
    top = max(float(np.nanmax(b["total"])) if len(labels) else 1.0, 1.0)
    # Top-to-bottom in run order.
    fig = base_figure(height, y_range=FactorRange(*reversed(labels)) if labels else FactorRange(),
                       x_range=Range1d(0, top * 1.2, bounds=(0, None)))
    fig.toolbar_location = None
    fields = [f"c{i}" for i in range(len(cats))]
    renderers = fig.hbar_stack(fields, y="label", height=0.72, color=colors, source=src, line_color="white",
                               line_width=0.5, fill_alpha=0.9) if cats else []
    nbytes = bytes_hover_formatter()
    for i, (cat, r) in enumerate(zip(cats, renderers, strict=False)):
        tips = [("stage", "@name"), (cat, f"@c{i}{{custom}} (@s{i}{{0%}} of the stage's peak)"),
                ("stage peak", "@total{custom}")]
        fig.add_tools(HoverTool(renderers=[r], tooltips=tips, formatters={f"@c{i}": nbytes, "@total": nbytes}))
    fig.text(x="total", y="label", text="total_label", source=src, x_offset=6, text_baseline="middle",
             text_font_size="11.5px", text_color="#4a5263")
    items = [LegendItem(label=value(c), renderers=[r]) for c, r in zip(cats, renderers, strict=False)]
    if np.isfinite(np.asarray(b["allocator_peak"], np.float64)).any():
        m = fig.scatter(x="allocator_peak", y="label", source=src, marker="dash", angle=np.pi / 2, size=16,
                        line_width=2.5, line_color="#1d2330")
        items.append(LegendItem(label=value("allocator's own peak"), renderers=[m]))
    fig.add_layout(Legend(items=items, orientation="horizontal", location="top_left", label_text_font_size="11.5px",
                          spacing=12, padding=2, margin=2, border_line_color=None, background_fill_alpha=0.0,
                          glyph_width=14, glyph_height=12), "above")
    fig.xaxis.formatter = bytes_tick_formatter()
    fig.xaxis.ticker = bytes_ticker()
    fig.ygrid.grid_line_color = None
    if linked is not None and renderers:
        fig.add_tools(TapTool(renderers=list(renderers)))
        src.selected.js_on_change("indices", CustomJS(args={"bars": src, "table": linked}, code="""
const ix = bars.selected.indices;
if (!ix.length) { table.selected.indices = []; return; }
const iv = bars.data.interval[ix[0]], rows = [];
const col = table.data.interval;
for (let i = 0; i < col.length; i++) if (col[i] == iv) rows.push(i);
table.selected.indices = rows;
"""))
    if len(labels) > 40:
        fig.yaxis.major_label_text_font_size = "9px"
    fig.name = "sv-stage-breakdown"
    return fig
