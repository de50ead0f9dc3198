"""The memory timeline of the single-run reports: allocated/reserved/requested over time (tabs
switch the x axis), the category area and the cached-but-unallocated strip under it, and the
stack pane a click fills. Draws a view-model; computes nothing.

The stacks a click can show are handed to the page once, as one JSON string on the timeline's
source (``tags[0]``), parsed on the first click or hover: BokehJS decodes plain arrays value by
value, which made loading them the largest part of opening a report. The stack pane is a root
of its own that shares no model with the plots (a click finds it by name), so the document
drawn first holds only models of BokehJS's core bundle: the widgets bundle the pane needs is
compiled after the first screen (``assets/lazy_embed.js``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.events import Tap
from bokeh.models import (
    Column,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    HoverTool,
    LegendItem,
    Range1d,
    Scatter,
    UIElement,
)
from bokeh.transform import stack

from snapviz.render.html.bokeh_kit import (
    LineSpec,
    base_figure,
    bytes_axis,
    bytes_hover_formatter,
    compact_legend,
    lookup_formatter,
    make_source,
    mark_peak,
    small_title,
    stack_pane,
    timeline_figure,
    x_tick_formatter,
)
from snapviz.render.html.page import BYTES_JS
from snapviz.render.html.palette import SERIES_COLORS
from snapviz.render.html.view_models import SingleRunReport, SnapshotReport
from snapviz.render.html.x_switch import XAxis, XSwitch

PANE_NAME = "sv-timeline-pane"
# The stacks, parsed once per page (the source's tags[0] is their JSON).
_STACKS_JS = "const st = src.sv_stacks || (src.sv_stacks = JSON.parse(src.tags[0]));\n"


def timeline_blocks(data: SingleRunReport, *, with_points: bool = True) -> list[UIElement]:
    """The timeline as Bokeh roots: the memory lines (under tabs that switch every plot's x axis
    between time and event index, :mod:`.x_switch`), then the category area and the
    fragmentation strip under them, then the stack pane (where points are clickable). The later ones are roots of their own so the page can draw them after the first
    (they sit below the first screen): the lines are what the reader sees first. The plots share
    one document, so they still pan and zoom together."""
    tl = data.timeline
    src = make_source(tl.columns())
    peak = data.peak
    y_top = float(np.nanmax(tl.reserved)) if len(tl.reserved) else 1.0
    y_top = max(y_top, float(peak.allocated or 0), 1.0)
    lines = [
        LineSpec("reserved", "reserved", SERIES_COLORS["reserved"], 1.6, alpha=0.9),
        LineSpec("allocated", "allocated", SERIES_COLORS["allocated"], 2.0),
    ]
    if tl.requested is not None:
        lines.insert(1, LineSpec("requested", "requested", SERIES_COLORS["requested"], 1.2, "dashed", 0.9))
    snap = data if isinstance(data, SnapshotReport) else None
    if snap is not None:
        st = snap.stacks
        src.tags = [json.dumps({"site": st.site, "frames": st.frames, "more": st.more, "text": st.frame_text})]
    ct = snap.category_timeline if snap is not None else None
    cat_src = (
        _category_source(snap) if snap is not None and ct is not None and ct.categories and len(ct.index) else None
    )
    axes = [XAxis("time_s", "time since the first event (s)", ("start_s", "end_s"), "By time", peak.time_s)]
    axes = axes if data.has_time else []
    axes.append(
        XAxis("index", "event index", ("start_index", "end_index"), "By event", peak.index if peak.index >= 0 else None)
    )
    switch = XSwitch(axes)
    x = axes[0].field
    fig = timeline_figure(
        src, x, lines, x_label="", bands=vars(data.bands), peak=peak, y_top=y_top, height=400, switch=switch
    )
    fig.xaxis.visible = False
    fig.min_border_bottom = 4
    if snap is not None and len(snap.oom.index):
        _oom_markers(fig, x, snap)
    if with_points and snap is not None:
        _add_point_hover(fig, src, x, snap)
    area = _category_area(snap, cat_src, fig.x_range, switch) if snap is not None and cat_src else None
    strip = _fragmentation(src, fig.x_range, tl.fragmentation, switch)
    switch.fields([p for p in (fig, area, strip) if p is not None])
    below = Column(
        *[p for p in (area, strip) if p is not None], sizing_mode="stretch_width", spacing=0, name="sv-timeline-detail"
    )
    if len(axes) == 1:
        main = fig
    else:
        main = Column(switch.tabs(fig.x_range), fig, sizing_mode="stretch_width", spacing=0)
    main.name = "sv-timeline"
    if not (with_points and snap is not None):
        return [main, below]
    pane = stack_pane("Click a point on the timeline to see the allocation's stack here.")
    pane.name = PANE_NAME
    return [main, below, pane]


def _oom_markers(fig: Any, x: str, data: SnapshotReport) -> None:
    """The OOM markers, with a hover of their own that names the failed request: the point hover
    (vline, first point) would show whichever event shares the marker's x."""
    oom = data.oom
    cols: dict[str, Any] = {
        k: np.asarray(v, np.float64)
        for k, v in {
            "time_s": oom.time_s,
            "index": oom.index,
            "allocated": oom.allocated,
            "oom_request": oom.requested,  # a name no other source has (tests find the markers by it)
        }.items()
    }
    cols["site"] = list(oom.site)
    cols["stage"] = list(oom.stage)
    r = fig.scatter(
        x=x,
        y="allocated",
        source=ColumnDataSource(cols),
        marker="x",
        size=14,
        line_width=3,
        line_color=SERIES_COLORS["peak"],
    )
    fig.legend[0].items.append(LegendItem(label=value("CUDA OOM"), renderers=[r]))
    nbytes = bytes_hover_formatter()
    fig.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("CUDA OOM", "request of @oom_request{custom} failed"),
                ("requested", "@oom_request{0,0} B"),
                ("at", "@site"),
                ("stage", "@stage"),
                ("allocated then", "@allocated{custom}"),
                ("event", "@index{0,0}"),
            ],
            formatters={"@oom_request": nbytes, "@allocated": nbytes},
            name="sv-oom-hover",
        )
    )


def _fragmentation(src: ColumnDataSource, x_range: Any, frag: np.ndarray, switch: XSwitch) -> Any:
    top = max(float(np.nanmax(frag)) if len(frag) else 1.0, 1.0)
    fig = base_figure(
        150,
        x_range=x_range,
        title="cached but not allocated (reserved − allocated)",
        y_range=Range1d(0, top * 1.1, bounds=(0, None)),
    )
    x = switch.axes[0].field
    fig.varea_step(
        x=x,
        y1=0,
        y2="fragmentation",
        source=src,
        step_mode="after",
        fill_color=SERIES_COLORS["fragmentation"],
        fill_alpha=0.3,
    )
    fig.step(
        x=x, y="fragmentation", source=src, mode="after", line_color=SERIES_COLORS["fragmentation"], line_width=1.2
    )
    tick_formatters = [x_tick_formatter(a.field) for a in switch.axes]
    fig.xaxis.axis_label = switch.axes[0].label
    fig.xaxis.formatter = tick_formatters[0]
    switch.set(fig.xaxis[0], "axis_label", [a.label for a in switch.axes])
    switch.set(fig.xaxis[0], "formatter", tick_formatters)
    bytes_axis(fig, ticks=3)
    small_title(fig)
    fig.toolbar_location = None
    return fig


def timeline_or_note(data: SingleRunReport, with_points: bool = True) -> list[str | UIElement]:
    if data.decimation.total == 0:
        return [
            '<p class="sv-none" id="sv-no-timeline">No trace history in this input (recorded without '
            "<code>_record_memory_history</code>, or an end-state-only dump): nothing to draw over time.</p>"
        ]
    return [*timeline_blocks(data, with_points=with_points)]


def _site_formatter(src: ColumnDataSource) -> CustomJSHover:
    """The allocation site of a timeline point's stack, from the stacks on ``src``."""
    return CustomJSHover(
        args={"src": src},
        code=_STACKS_JS
        + """
return (value >= 0 && value < st.site.length) ? st.site[value] : "(no frames recorded)";
""",
    )


def _add_point_hover(fig: Any, src: ColumnDataSource, x: str, data: SnapshotReport) -> None:
    """Invisible markers on the allocated line: hover shows the event, a click its stack."""
    r = fig.scatter(x=x, y="allocated", source=src, size=8, fill_alpha=0, line_alpha=0)
    # State glyphs need the renderer's own x/y fields: a bare Scatter() reads 'x'/'y', which the
    # source lacks (Bokeh logged "nonexistent field" for each in the browser console).
    r.selection_glyph = Scatter(
        x=x, y="allocated", fill_color=SERIES_COLORS["peak"], line_color="white", fill_alpha=1, line_alpha=1
    )
    r.nonselection_glyph = Scatter(x=x, y="allocated", fill_alpha=0, line_alpha=0)
    r.hover_glyph = Scatter(
        x=x, y="allocated", fill_color=SERIES_COLORS["allocated"], line_color="white", fill_alpha=1, line_alpha=1
    )
    nbytes = bytes_hover_formatter()
    tooltips = [("event", "@index{0,0}")]
    if data.has_time:
        tooltips.append(("time", "@time_s{0.000} s"))
    tooltips += [
        ("stage", "@stage{custom}"),
        ("action", "@action{custom}"),
        ("size", "@size{custom}"),
        ("site", "@stack{custom}"),
        ("allocated", "@allocated{custom}"),
        ("reserved", "@reserved{custom}"),
    ]
    fig.add_tools(
        HoverTool(
            renderers=[r],
            mode="vline",
            tooltips=tooltips,
            limit=1,
            attachment="horizontal",
            formatters={
                "@stage": lookup_formatter(data.stage_names),
                "@action": lookup_formatter(data.action_names),
                "@stack": _site_formatter(src),
                "@size": nbytes,
                "@allocated": nbytes,
                "@reserved": nbytes,
            },
        )
    )
    # A click anywhere selects the event in force at that x (the step line's value there),
    # so users need not hit a vertex.
    fig.js_on_event(
        Tap,
        CustomJS(
            args={"src": src, "marker": r.glyph},
            code="""
const xs = src.data[marker.x.field];  // the x axis shown now (the tabs switch it)
let lo = 0, hi = xs.length - 1;
if (hi < 0 || cb_obj.x < xs[0]) return;
while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (xs[mid] <= cb_obj.x) lo = mid; else hi = mid - 1; }
src.selected.indices = [lo];
""",
        ),
    )
    src.selected.js_on_change(
        "indices",
        CustomJS(
            args={"src": src, "name": PANE_NAME, "stages": data.stage_names, "actions": data.action_names},
            code=BYTES_JS
            + _STACKS_JS
            + """
const ix = src.selected.indices;
if (!ix.length) return;
const i = ix[0], d = src.data, k = d.stack[i];
const head = "event " + d.index[i].toLocaleString() + " · " + (actions[d.action[i]] || "") + " " + fmtBytes(d.size[i]) +
             " · " + (stages[d.stage[i]] || "") + " · allocated " + fmtBytes(d.allocated[i]);
let body = "(no frames recorded)";
if (k >= 0 && k < st.frames.length) {
  body = st.frames[k].map(f => st.text[f]).join("\\n");
  if (st.more[k] > 0) body += "\\n... " + st.more[k] + " more";
}
// The pane is a root of a document of its own (drawn after the first screen): found by name.
const pane = Bokeh.documents.map((doc) => doc.get_model_by_name(name)).find((m) => m != null);
if (pane != null) pane.text = head + "\\n" + body;
""",
        ),
    )


def _category_source(data: SnapshotReport) -> ColumnDataSource:
    """Categories as columns ``c0``… (names may hold spaces or '&'); float32 is exact to
    well under a pixel and halves what the page carries."""
    ct = data.category_timeline
    cols: dict[str, Any] = {
        "index": ct.index,
        "time_s": ct.time_s,
        "allocated": ct.allocated,
        "stage": data.category_stage,
    }
    for i, c in enumerate(ct.categories):
        cols[f"c{i}"] = np.asarray(ct.bytes[c], np.float32)
    return make_source(cols)


def _category_area(data: SnapshotReport, src: ColumnDataSource, x_range: Any, switch: XSwitch) -> Any:
    """Live bytes stacked by category, under the timeline and panned/zoomed with it."""
    x = switch.axes[0].field
    ct = data.category_timeline
    cats = ct.categories
    colors = [data.category_colors[c] for c in cats]
    top = max(float(np.nanmax(ct.allocated)) if len(ct.allocated) else 1.0, 1.0)
    fig = base_figure(
        230,
        x_range=x_range,
        title=f"live memory by category · {ct.note}",
        y_range=Range1d(0, top * 1.1, bounds=(0, None)),
    )
    small_title(fig)
    fig.toolbar_location = None
    fig.xaxis.visible = False
    fig.min_border_bottom = 4
    fields = [f"c{i}" for i in range(len(cats))]
    items = []
    for i, (cat, color) in enumerate(zip(cats, colors, strict=False)):
        r = fig.varea_step(
            x=x,
            y1=stack(*fields[:i]) if i else 0,
            y2=stack(*fields[: i + 1]),
            step_mode="after",
            source=src,
            fill_color=color,
            fill_alpha=0.85,
        )
        items.append(LegendItem(label=value(cat), renderers=[r]))
    bytes_axis(fig, ticks=4)
    mark_peak(fig, src, data.peak, switch.axes, switch, size=9, with_label=False)
    # A thin line on the total: short spikes (a score matrix, the peak itself) stay visible at
    # any zoom. Step glyphs are not hit-tested, so invisible markers carry the hover.
    fig.step(
        x=x,
        y="allocated",
        source=src,
        mode="after",
        line_color=SERIES_COLORS["allocated"],
        line_width=1,
        line_alpha=0.7,
    )
    probe = fig.scatter(x=x, y="allocated", source=src, size=6, fill_alpha=0, line_alpha=0)
    probe.hover_glyph = Scatter(
        x=x, y="allocated", fill_color=SERIES_COLORS["allocated"], line_color="white", fill_alpha=1, line_alpha=1
    )
    nbytes = bytes_hover_formatter()
    tips = [("stage", "@stage{custom}"), ("allocated", "@allocated{custom}")]
    tips += [(cat, f"@c{i}{{custom}}") for i, cat in enumerate(cats)]
    formatters: dict[str, Any] = {f"@c{i}": nbytes for i in range(len(cats))}
    formatters.update({"@allocated": nbytes, "@stage": lookup_formatter(data.stage_names)})
    fig.add_tools(
        HoverTool(
            renderers=[probe], mode="vline", tooltips=tips, formatters=formatters, limit=1, attachment="horizontal"
        )
    )
    legend = compact_legend(items)
    fig.add_layout(legend, "above")
    return fig
