"""The interactive HTML report: one self-contained file (Bokeh INLINE, no network).

Renders the plain columns of :mod:`snapviz.render.report_data` and computes nothing.
Static parts (verdict, warnings, what would help, run metadata) are plain HTML, readable
even where JavaScript is off; the plots and tables are Bokeh roots of one document, so
their sources, ranges and selections are linked (the category area pans with the
timeline; a click on a stage's bar selects that stage's blocks in its table). Shared pieces for other reports (the
comparison report): :func:`build_page`, :func:`timeline_figure`, :func:`stage_palette`,
:func:`bytes_tick_formatter`, :func:`bytes_hover_formatter`, :data:`PAGE_CSS`.
"""
from __future__ import annotations

import html as _html
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from bokeh.core.properties import value
from bokeh.events import Tap
from bokeh.embed import file_html
from bokeh.models import (AdaptiveTicker, BoxZoomTool, ColumnDataSource, CustomJS, CustomJSHover,
                          CustomJSTickFormatter, DataRange1d, DataTable, FactorRange, HoverTool, Label, Legend, LegendItem,
                          NumeralTickFormatter, PanTool, PreText, Range1d, ResetTool, SaveTool, Scatter, Span,
                          TableColumn, TabPanel, Tabs, TapTool, WheelZoomTool)
from bokeh.models.layouts import Column, UIElement
from bokeh.models.text import PlainText
from bokeh.plotting import figure
from bokeh.resources import INLINE
from bokeh.transform import stack

from snapviz import __version__
from snapviz.render.fmt import fmt_bytes
from snapviz.safe_text import bound
from snapviz.render.report_data import (SERIES_COLORS, category_palette, report_data,  # noqa: F401 (re-exported)
                                        stage_palette, trace_report_data)

__all__ = ["render_html", "render_trace_html", "build_page", "timeline_figure", "stage_palette", "category_palette",
           "LineSpec",
           "bytes_tick_formatter", "bytes_hover_formatter", "bytes_ticker", "seconds_tick_formatter", "esc", "PAGE_CSS",
           "fmt_bytes"]

esc = _html.escape
TABLE_WIDTH = 1320  # px: a card's inner width at the page's max width

# Binary units, trimmed: 1536 MiB -> "1.5 GiB". Shared by axes and tooltips.
_BYTES_JS = """
function fmtBytes(b) {
  if (b == null || isNaN(b)) return "n/a";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(b), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  let s = i === 0 ? v.toFixed(0) : (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  if (s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\\.$/, "");
  return (b < 0 ? "-" : "") + s + " " + units[i];
}
"""

PAGE_CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #e3e6ec; --bg: #f6f7f9; --card: #ffffff;
        --accent: #1f3b73; --warn-bg: #fff6e0; --warn-line: #f0c36d; --ok: #1e7d32; --bad: #b3261e; }
html, body { background: var(--bg); color: var(--fg); height: auto; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "DejaVu Sans", sans-serif; }
.sv-page { max-width: 1440px; margin: 0 auto; padding: 18px 24px 40px; }
.sv-hero { background: var(--card); border: 1px solid var(--line); border-left: 6px solid var(--accent);
           border-radius: 8px; padding: 16px 20px; margin-bottom: 14px; }
.sv-kicker { color: var(--muted); font-size: 12px; letter-spacing: .04em; text-transform: uppercase; margin: 0 0 4px; }
.sv-title { font-size: 15px; font-weight: 600; margin: 0 0 6px; color: var(--muted); }
.sv-verdict { font-size: 24px; font-weight: 650; margin: 0 0 8px; line-height: 1.25; }
.sv-verdict b { color: var(--accent); }
.sv-lines { margin: 0; padding-left: 18px; color: var(--fg); }
.sv-lines li { margin: 2px 0; }
.sv-badge { display: inline-block; border-radius: 12px; padding: 2px 10px; font-size: 12.5px; margin-top: 8px;
            border: 1px solid var(--line); }
.sv-badge.match { color: var(--ok); border-color: #9fd3a5; background: #eef8ef; }
.sv-badge.close { color: #8a5a00; border-color: var(--warn-line); background: var(--warn-bg); }
.sv-badge.differs { color: var(--bad); border-color: #f1a7a1; background: #fdeeed; }
.sv-warn { background: var(--warn-bg); border: 1px solid var(--warn-line); border-radius: 8px; padding: 10px 16px;
           margin-bottom: 14px; }
.sv-warn h3 { margin: 0 0 4px; font-size: 14px; }
.sv-warn ul { margin: 0; padding-left: 18px; }
.sv-card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px 14px;
           margin-bottom: 14px; }
.sv-card h2 { font-size: 16px; margin: 0 0 2px; }
.sv-hint { color: var(--muted); font-size: 12.5px; margin: 0 0 8px; }
.sv-grid { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 14px; }
.sv-grid > .sv-card { margin-bottom: 0; }
.sv-grid + * { margin-top: 14px; }
@media (max-width: 1000px) { .sv-grid { grid-template-columns: minmax(0, 1fr); } }
.sv-meta { display: grid; grid-template-columns: max-content minmax(0, 1fr) max-content minmax(0, 1fr);
           column-gap: 14px; font-size: 13px; margin-top: 6px; }
.sv-meta > div { border-top: 1px solid var(--line); padding: 4px 0; }
.sv-meta .k { color: var(--muted); white-space: nowrap; }
.sv-meta .v { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px;
              overflow-wrap: anywhere; padding-right: 18px; }
@media (max-width: 1000px) { .sv-meta { grid-template-columns: max-content minmax(0, 1fr); } }
.sv-none { color: var(--muted); margin: 6px 0; }
.sv-advice { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px 14px;
             margin-bottom: 14px; }
.sv-advice h2 { font-size: 16px; margin: 0 0 2px; }
.sv-fixes { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 10px; margin-top: 8px; }
.sv-fix { border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; background: #fbfcfd;
          display: flex; flex-direction: column; gap: 4px; min-width: 0; }
.sv-fix-head { display: flex; justify-content: space-between; align-items: baseline; gap: 10px; }
.sv-fix-name { font-weight: 650; font-size: 14.5px; }
.sv-fix-save { font-weight: 650; color: var(--ok); white-space: nowrap; }
.sv-fix-save.unknown { font-weight: 400; color: var(--muted); font-size: 12.5px; }
.sv-meter { height: 5px; background: #edf0f4; border-radius: 3px; overflow: hidden; }
.sv-meter > span { display: block; height: 100%; background: var(--ok); opacity: .75; }
.sv-fix-why { color: var(--muted); font-size: 13px; }
.sv-fix code { display: block; background: #f2f4f7; border: 1px solid var(--line); border-radius: 5px;
               padding: 4px 7px; white-space: pre-wrap; overflow-wrap: anywhere; }
.sv-foot { color: var(--muted); font-size: 12.5px; text-align: center; margin-top: 18px; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
"""

# Stylesheet for Bokeh's shadow-DOM widgets (the stack panes).
_PRE_CSS = """
:host { width: 100%; }
pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; line-height: 1.4;
      background: #f6f7f9; border: 1px solid #e3e6ec; border-radius: 6px; padding: 8px 10px; margin: 6px 0 0;
      white-space: pre-wrap; word-break: break-all; max-height: 260px; overflow: auto; }
"""

_TEMPLATE = """
{% from macros import embed %}
{% block preamble %}<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="snapviz {{ version }}">
<style>{{ page_css }}</style>{% endblock %}
{% block contents %}<div class="sv-page">
{% for kind, value in blocks %}{% if kind == "html" %}{{ value }}{% else %}{{ embed(roots[value]) }}{% endif %}
{% endfor %}</div>{% endblock %}
"""


def bytes_tick_formatter() -> CustomJSTickFormatter:
    """Axis labels in binary units (``1.5 GiB``)."""
    return CustomJSTickFormatter(code=_BYTES_JS + "return fmtBytes(tick);")


def bytes_ticker(desired_num_ticks: int = 6) -> AdaptiveTicker:
    """Ticks on powers of two of bytes so labels read 512 MiB, 1 GiB, 1.5 GiB (never 2.15 GiB)."""
    return AdaptiveTicker(base=2, mantissas=[1], min_interval=1, desired_num_ticks=desired_num_ticks, num_minor_ticks=2)


def seconds_tick_formatter() -> CustomJSTickFormatter:
    """Seconds with as many decimals as the tick spacing needs (no 1.000e-3)."""
    return CustomJSTickFormatter(code="""
const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
const d = step > 0 ? Math.min(6, Math.max(0, Math.ceil(-Math.log10(step) - 1e-9))) : 0;
return tick.toFixed(d);
""")


def bytes_hover_formatter() -> CustomJSHover:
    return CustomJSHover(code=_BYTES_JS + "return fmtBytes(value);")


def _lookup_formatter(names: Sequence[str], missing: str = "") -> CustomJSHover:
    return CustomJSHover(args={"names": list(names)},
                         code=f"return (value >= 0 && value < names.length) ? names[value] : {missing!r};")


def _plain(text: str) -> PlainText:
    """Text for Bokeh annotations that is never parsed as TeX (stage names are user data)."""
    return PlainText(text=text)


def _source(columns: dict[str, Any]) -> ColumnDataSource:
    data: dict[str, Any] = {}
    for k, v in columns.items():
        if isinstance(v, np.ndarray):
            # Bokeh ships typed arrays in base64; int64 has no JS typed array.
            if v.dtype.kind in "iu":
                v = v.astype(np.int32) if (len(v) == 0 or (v.min() >= -2**31 and v.max() < 2**31)) else v.astype(np.float64)
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


def _base_figure(height: int, x_range: Any = None, title: str | None = None, **kw: Any) -> Any:
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


def _bytes_axis(fig: Any, ticks: int = 6) -> None:
    fig.yaxis.formatter = bytes_tick_formatter()
    fig.yaxis.ticker = bytes_ticker(ticks)


def timeline_figure(source: ColumnDataSource, x: str, lines: Sequence[LineSpec], *, x_label: str,
                    bands: dict[str, Any] | None = None, band_x: tuple[str, str] | None = None,
                    peak: dict[str, Any] | None = None, peak_x: float | None = None, y_top: float | None = None,
                    height: int = 380, x_range: Any = None, title: str | None = None) -> Any:
    """A memory-over-time figure: step lines of ``source`` columns over ``x``, stage
    bands (``bands`` columns ``band_x[0]``/``band_x[1]``, ``name``, ``group``, ``color``,
    ``alpha``) under them, and the peak marked with a span and a label."""
    top = float(y_top) if y_top else 1.0
    fig = _base_figure(height, x_range=x_range, title=title, y_range=Range1d(0, top * 1.12, bounds=(0, None)))
    fig.xaxis.axis_label = x_label
    fig.xaxis.formatter = NumeralTickFormatter(format="0,0") if x == "index" else seconds_tick_formatter()
    _bytes_axis(fig)
    legend_items: list[LegendItem] = []
    if bands is not None and band_x is not None and len(bands["name"]):
        groups = list(dict.fromkeys(bands["group"]))
        for g in groups:
            ix = [i for i, gg in enumerate(bands["group"]) if gg == g]
            src = _source({"left": np.asarray(bands[band_x[0]])[ix], "right": np.asarray(bands[band_x[1]])[ix],
                           "name": [bands["name"][i] for i in ix], "alpha": [bands["alpha"][i] for i in ix],
                           "top": np.full(len(ix), top * 1.12)})
            color = bands["color"][ix[0]]
            r = fig.quad(left="left", right="right", bottom=0, top="top", fill_color=color, fill_alpha="alpha",
                         line_color=None, source=src, level="underlay")
            # The bands' own alpha is too faint for a legend swatch: add an empty, stronger one.
            sw = fig.quad(left=[], right=[], bottom=[], top=[], fill_color=color, fill_alpha=0.45, line_color=None)
            legend_items.append(LegendItem(label=value(g), renderers=[sw, r]))
    line_items = []
    for spec in lines:
        r = fig.step(x=x, y=spec.field, source=source, mode="after", line_color=spec.color, line_width=spec.width,
                     line_dash=spec.dash, line_alpha=spec.alpha)
        line_items.append(LegendItem(label=value(spec.label), renderers=[r]))
    if peak is not None and peak_x is not None and np.isfinite(peak_x):
        fig.add_layout(Span(location=float(peak_x), dimension="height", line_color=SERIES_COLORS["peak"],
                            line_dash="dashed", line_width=1.5))
        pr = fig.scatter(x=[float(peak_x)], y=[float(peak["allocated"])], size=11, marker="circle",
                         fill_color=SERIES_COLORS["peak"], line_color="white", line_width=2)
        line_items.append(LegendItem(label=value("peak"), renderers=[pr]))
        # Keep the label inside the plot: put it left of the peak when the peak is near the right end.
        xs = np.asarray(source.data.get(x, []), dtype=np.float64)
        right_side = bool(len(xs)) and np.isfinite(xs).any() and \
            (float(peak_x) - np.nanmin(xs)) > 0.7 * max(np.nanmax(xs) - np.nanmin(xs), 1e-12)
        fig.add_layout(Label(x=float(peak_x), y=float(peak["allocated"]), text=_plain(peak["label"]),
                             x_offset=-8 if right_side else 8, y_offset=6, text_align="right" if right_side else "left",
                             text_font_size="12px", text_color=SERIES_COLORS["peak"], text_font_style="bold",
                             background_fill_color="white", background_fill_alpha=0.85))
    items = line_items + legend_items
    legend = Legend(items=items, orientation="horizontal", location="top_left",
                    click_policy="hide", label_text_font_size="12px", spacing=14, padding=4, margin=4,
                    border_line_color=None, background_fill_alpha=0.0, glyph_width=18)
    if len(items) > 12:  # many custom stages: wrap instead of running off the plot
        legend.ncols = 12
    fig.add_layout(legend, "above")
    return fig


def build_page(title: str, blocks: Sequence[str | UIElement]) -> str:
    """One self-contained HTML page: ``blocks`` are raw HTML strings (already escaped by the
    caller) and Bokeh models, in order. All models share one document, so sources,
    ranges and selections may be linked across blocks."""
    roots: list[UIElement] = []
    items: list[tuple[str, str]] = []
    for b in blocks:
        if isinstance(b, str):
            items.append(("html", b))
        else:
            if not b.name or any(r.name == b.name for r in roots):
                b.name = f"sv-root-{len(roots)}"
            roots.append(b)
            items.append(("root", b.name))
    if not roots:  # file_html needs a document; an empty one still loads BokehJS
        filler = PreText(text="", visible=False, name="sv-empty")
        roots.append(filler)
        items.append(("root", filler.name))
    return file_html(roots, resources=INLINE, title=title, template=_TEMPLATE,
                     template_variables={"blocks": items, "page_css": PAGE_CSS, "version": __version__})


# ---------------------------------------------------------------------------------------
# Page sections
# ---------------------------------------------------------------------------------------

def _hero(data: dict[str, Any], kicker: str) -> str:
    h = data["headline"]
    truth = h.get("truth")
    badge = f'<div class="sv-badge {esc(truth["status"])}">{esc(truth["text"])}</div>' if truth else ""
    lines = "".join(f"<li>{esc(x)}</li>" for x in h.get("lines") or [])
    return (f'<header class="sv-hero"><p class="sv-kicker">{esc(kicker)}</p>'
            f'<p class="sv-title">{esc(h["title"])}</p>'
            f'<h1 class="sv-verdict" id="sv-verdict">{esc(h["verdict"])}</h1>'
            f'{"<ul class=sv-lines>" + lines + "</ul>" if lines else ""}{badge}</header>')


def _warnings(data: dict[str, Any]) -> str:
    ws = data.get("warnings") or []
    if not ws:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in ws)
    return f'<div class="sv-warn" id="sv-warnings"><h3>⚠ {len(ws)} warning{"s" if len(ws) > 1 else ""}</h3><ul>{items}</ul></div>'


def _card_open(title: str, hint: str = "", ident: str = "") -> str:
    return (f'<section class="sv-card"{f" id={esc(ident)!r}" if ident else ""}><h2>{esc(title)}</h2>'
            + (f'<p class="sv-hint">{esc(hint)}</p>' if hint else ""))


def _metadata_html(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f'<div class="k">{esc(k)}</div><div class="v">{esc(v)}</div>' for k, v in rows)
    return _card_open("Run", ident="sv-metadata") + f'<div class="sv-meta">{body}</div></section>'


def _footer(data: dict[str, Any]) -> str:
    return (f'<footer class="sv-foot" id="sv-footer">Timeline {esc(data["decimation"]["note"])}. '
            f'Generated by snapviz {esc(__version__)} — self-contained, works offline.</footer>')


def _stack_pane(text: str) -> PreText:
    from bokeh.models import InlineStyleSheet
    return PreText(text=text, sizing_mode="stretch_width", disable_math=True,
                   stylesheets=[InlineStyleSheet(css=_PRE_CSS)])


def _timeline_block(data: dict[str, Any], *, with_points: bool = True) -> UIElement:
    tl = data["timeline"]
    src = _source(tl)
    peak = data["peak"]
    y_top = float(np.nanmax(tl["reserved"])) if len(tl["reserved"]) else 1.0
    y_top = max(y_top, float(peak["allocated"] or 0), 1.0)
    lines = [LineSpec("reserved", "reserved", SERIES_COLORS["reserved"], 1.6, alpha=0.9),
             LineSpec("allocated", "allocated", SERIES_COLORS["allocated"], 2.0)]
    if "requested" in tl:
        lines.insert(1, LineSpec("requested", "requested", SERIES_COLORS["requested"], 1.2, "dashed", 0.9))
    pane = _stack_pane("Click a point on the timeline to see the allocation's stack here.")
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
        frag = _base_figure(150, x_range=fig.x_range, title="cached but not allocated (reserved − allocated)", y_range=Range1d(0, max(float(np.nanmax(tl["fragmentation"])) if len(tl["fragmentation"]) else 1.0, 1.0) * 1.1, bounds=(0, None)))
        frag.varea_step(x=x, y1=0, y2="fragmentation", source=src, step_mode="after",
                        fill_color=SERIES_COLORS["fragmentation"], fill_alpha=0.3)
        frag.step(x=x, y="fragmentation", source=src, mode="after", line_color=SERIES_COLORS["fragmentation"], line_width=1.2)
        frag.xaxis.axis_label = x_label
        frag.xaxis.formatter = NumeralTickFormatter(format="0,0") if x == "index" else seconds_tick_formatter()
        _bytes_axis(frag, ticks=3)
        frag.title.text_font_size = "12px"
        frag.title.text_font_style = "normal"
        frag.title.text_color = "#4a5263"
        frag.toolbar_location = None
        parts = [fig, area, frag] if area is not None else [fig, frag]
        views.append(TabPanel(title=tab, child=Column(*parts, sizing_mode="stretch_width", spacing=0)))
    body = Tabs(tabs=views, sizing_mode="stretch_width") if len(views) > 1 else views[0].child
    return Column(*([body, pane] if with_points else [body]), sizing_mode="stretch_width", name="sv-timeline")


def _timeline_or_note(data: dict[str, Any], with_points: bool = True) -> str | UIElement:
    if data["decimation"]["total"] == 0:
        return ('<p class="sv-none" id="sv-no-timeline">No trace history in this input (recorded without '
                "<code>_record_memory_history</code>, or an end-state-only dump): nothing to draw over time.</p>")
    return _timeline_block(data, with_points=with_points)


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
                            formatters={"@stage": _lookup_formatter(data["stage_names"]),
                                        "@action": _lookup_formatter(data.get("action_names") or []),
                                        "@stack": _lookup_formatter(stacks["site"], "(no frames recorded)"),
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
        code=_BYTES_JS + """
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


def _stage_bar_block(data: dict[str, Any]) -> UIElement:
    b = data["stage_bars"]
    labels = list(b["label"])
    src = _source({k: b[k] for k in ("label", "name", "group", "color", "peak_allocated", "peak_reserved",
                                      "allocator_peak", "duration_s")})
    finite = np.asarray(b["peak_allocated"], np.float64)
    finite = finite[np.isfinite(finite)]  # stages of a trace without memory events have no peak (NaN)
    top = max([float(finite.max()) if len(finite) else 1.0, 1.0])
    fig = _base_figure(320, x_range=FactorRange(*labels) if labels else FactorRange(), y_range=Range1d(0, top * 1.1, bounds=(0, None)))
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
    _bytes_axis(fig)
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.9 if len(labels) > 8 else 0.0
    if len(labels) > 40:
        fig.xaxis.major_label_text_font_size = "8px"
    fig.name = "sv-stage-bars"
    return fig


def _category_block(data: dict[str, Any], height: int | None = None) -> UIElement:
    c = data["categories"]
    cats = list(reversed(c["category"]))
    src = _source({k: (list(reversed(v)) if isinstance(v, list) else v[::-1].copy()) for k, v in c.items()})
    top = float(np.max(c["bytes"])) if len(cats) else 1.0
    fig = _base_figure(height or max(320, 40 * len(cats) + 50), y_range=FactorRange(*cats) if cats else FactorRange(),
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
    return _source(cols)


def _small_title(fig: Any) -> None:
    fig.title.text_font_size = "12px"
    fig.title.text_font_style = "normal"
    fig.title.text_color = "#4a5263"


def _category_area(data: dict[str, Any], src: ColumnDataSource, x: str, x_range: Any, peak_x: float | None) -> Any:
    """Live bytes stacked by category, under the timeline and panned/zoomed with it."""
    ct = data["category_timeline"]
    cats, colors = ct["categories"], ct["colors"]
    top = max(float(np.nanmax(ct["allocated"])) if len(ct["allocated"]) else 1.0, 1.0)
    fig = _base_figure(230, x_range=x_range, title=f"live memory by category · {ct['note']}",
                       y_range=Range1d(0, top * 1.1, bounds=(0, None)))
    _small_title(fig)
    fig.toolbar_location = None
    fig.xaxis.visible = False
    fig.min_border_bottom = 4
    fields = [f"c{i}" for i in range(len(cats))]
    items = []
    for i, (cat, color) in enumerate(zip(cats, colors)):
        r = fig.varea_step(x=x, y1=stack(*fields[:i]) if i else 0, y2=stack(*fields[:i + 1]), step_mode="after",
                           source=src, fill_color=color, fill_alpha=0.85)
        items.append(LegendItem(label=value(cat), renderers=[r]))
    _bytes_axis(fig, ticks=4)
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
    formatters.update({"@allocated": nbytes, "@stage": _lookup_formatter(data["stage_names"])})
    fig.add_tools(HoverTool(renderers=[probe], mode="vline", tooltips=tips, formatters=formatters, limit=1,
                            attachment="horizontal"))
    legend = Legend(items=items, orientation="horizontal", location="top_left",
                    label_text_font_size="11.5px", spacing=12, padding=2, margin=2, border_line_color=None,
                    background_fill_alpha=0.0, glyph_width=14, glyph_height=12)
    fig.add_layout(legend, "above")
    return fig


def _stage_breakdown_block(data: dict[str, Any], height: int, linked: ColumnDataSource | None = None) -> UIElement:
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
    src = _source(cols)
    top = max(float(np.nanmax(b["total"])) if len(labels) else 1.0, 1.0)
    # Top-to-bottom in run order.
    fig = _base_figure(height, y_range=FactorRange(*reversed(labels)) if labels else FactorRange(),
                       x_range=Range1d(0, top * 1.2, bounds=(0, None)))
    fig.toolbar_location = None
    fields = [f"c{i}" for i in range(len(cats))]
    renderers = fig.hbar_stack(fields, y="label", height=0.72, color=colors, source=src, line_color="white",
                               line_width=0.5, fill_alpha=0.9) if cats else []
    nbytes = bytes_hover_formatter()
    for i, (cat, r) in enumerate(zip(cats, renderers)):
        tips = [("stage", "@name"), (cat, f"@c{i}{{custom}} (@s{i}{{0%}} of the stage's peak)"),
                ("stage peak", "@total{custom}")]
        fig.add_tools(HoverTool(renderers=[r], tooltips=tips, formatters={f"@c{i}": nbytes, "@total": nbytes}))
    fig.text(x="total", y="label", text="total_label", source=src, x_offset=6, text_baseline="middle",
             text_font_size="11.5px", text_color="#4a5263")
    items = [LegendItem(label=value(c), renderers=[r]) for c, r in zip(cats, renderers)]
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


def _advice_html(data: dict[str, Any]) -> str:
    advice = data.get("advice") or []
    if not advice:
        return ('<section class="sv-advice" id="sv-advice"><h2>What would help</h2><p class="sv-none">Nothing from '
                "the standard toolbox (SDPA, VAE tiling, fp16, offload, expandable segments) stands out for this "
                "run's peak.</p></section>")
    tiles = []
    for a in advice[:4]:
        share = a.get("share")
        save_cls = "sv-fix-save" if a.get("saves_up_to_bytes") else "sv-fix-save unknown"
        if share and share > 1:  # e.g. cached memory beyond the peak: no share of it to show
            share = None
        meter = (f'<div class="sv-meter" title="{share:.0%} of the peak"><span style="width:{share * 100:.1f}%">'
                 "</span></div>" if share else "")
        save = esc(a["saves"]) + (f" · {share:.0%} of the peak" if share else "")
        tiles.append(f'<div class="sv-fix"><div class="sv-fix-head"><span class="sv-fix-name">{esc(a["technique"])}'
                     f'</span><span class="{save_cls}">{save}</span></div>{meter}'
                     f'<div class="sv-fix-why">{esc(a["why"])}</div><code>{esc(a["how"])}</code></div>')
    return ('<section class="sv-advice" id="sv-advice"><h2>What would help</h2><p class="sv-hint">Fixes from the '
            "standard toolbox, ranked by what this run's own live set at the peak says they can remove.</p>"
            f'<div class="sv-fixes">{"".join(tiles)}</div></section>')


def _table_block(columns: dict[str, Any], spec: Sequence[tuple[str, str, int]], name: str, stack_field: str | None,
                 hint: str, max_height: int = 420) -> UIElement:
    src = _source(columns)
    # Bokeh 3.9's content-based autosizing fails in the browser ("row is not defined") and
    # force_fit splits the width equally: fixed widths, scaled to the page's usual width.
    scale = max(1.0, TABLE_WIDTH / max(sum(w for _, _, w in spec), 1))
    cols = [TableColumn(field=f, title=t, width=int(w * scale)) for f, t, w in spec]
    n = len(next(iter(columns.values()))) if columns else 0
    table = DataTable(source=src, columns=cols, height=min(max_height, 28 * n + 32), sizing_mode="stretch_width",
                      index_position=None, selectable=True, row_height=26, name=f"{name}-table",
                      autosize_mode="none", reorderable=False)  # reordering needs jquery-ui, which Bokeh does not bundle
    if stack_field is None:
        return Column(table, sizing_mode="stretch_width", name=name)
    pane = _stack_pane(hint)
    src.selected.js_on_change("indices", CustomJS(args={"src": src, "pane": pane, "field": stack_field}, code="""
const ix = src.selected.indices;
if (ix.length) pane.text = src.data[field][ix[0]];
"""))
    return Column(table, pane, sizing_mode="stretch_width", name=name)


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------

def bounded_data(data: dict[str, Any]) -> dict[str, Any]:
    """Report data with every string from the input clipped (columns stay whole and aligned):
    a page's size follows its rows, not the longest frame name in the snapshot."""
    return bound(data, max_list=None, json_numbers=False)


def render_report_data(data: dict[str, Any]) -> str:
    """The page for a :func:`~snapviz.render.report_data.report_data` dict."""
    data = bounded_data(data)
    blocks: list[str | UIElement] = [_hero(data, "snapviz · GPU memory report"), _warnings(data), _advice_html(data)]
    blocks += [_card_open("Memory over time",
                          "allocated = blocks handed out (what max_memory_allocated counts) · reserved = cudaMalloc'd "
                          "segments · requested = what tensors asked for; below, the same allocated memory by "
                          "category. Drag to pan, scroll to zoom (the plots move together), click a point for its "
                          "stack; click legend entries to hide lines.", "sv-timeline-card"),
               _timeline_or_note(data), "</section>"]
    stage_top, linked = _stage_top_blocks(data)
    blocks += _breakdown_blocks(data, linked)
    top = data["top_allocations"]
    hint = (f"The {len(top['size'])} largest blocks live at the peak (event {data['peak']['index']:,}). "
            "Select a row to see where it was allocated." if len(top["size"]) else "")
    if top.get("has_ops"):
        hint += " The op and its input shapes come from the run's profiler trace."
    blocks.append(_card_open("Live at the peak", hint, "sv-top"))
    if len(top["size"]):
        spec = [("size", "size", 90), ("stage", "stage", 120), ("site", "allocated at", 900), ("event_index", "event", 80)]
        fields = ["size", "bytes", "stage", "site", "event_index", "stack_text"]
        if top.get("has_ops"):
            spec[2] = ("site", "allocated at", 520)
            spec[3:3] = [("op", "op (trace)", 200), ("op_input_dims", "op input shapes", 260)]
            fields += ["op", "op_input_dims"]
        blocks.append(_table_block({k: top[k] for k in fields}, spec, "sv-top-allocations", "stack_text",
                                   "Select a row to see its stack."))
    else:
        blocks.append('<p class="sv-none">No recorded allocation was live at the peak: the peak is memory '
                      "allocated before the recorded history (see the categories).</p>" if data["peak"]["index"] < 0
                      else '<p class="sv-none">No recorded allocation was live at the peak.</p>')
    blocks.append("</section>")
    blocks += stage_top
    blocks += _attention_blocks(data)
    blocks += [_metadata_html(data["metadata"]), _footer(data)]
    return build_page(f"snapviz: {data['title']}", blocks)


def _breakdown_blocks(data: dict[str, Any], linked: ColumnDataSource | None = None) -> list[str | UIElement]:
    """Per stage interval, bytes by category at its peak, beside the global peak's categories."""
    b = data["stage_breakdown"]
    n = len(b["label"])
    if not n:
        return ['<section class="sv-card" id="sv-stages"><h2>Peak by stage</h2><p class="sv-none">No stage '
                "intervals: there is no trace history to attribute.</p></section>",
                _card_open("At the peak, by category", f"What the {fmt_bytes(data['peak']['allocated'])} live at "
                           "the peak is made of", "sv-categories-card"), _category_block(data), "</section>"]
    height = max(300, 26 * n + 90)
    hint = b["note"] or ("Each bar is one stage interval (each denoising step separately) at its own peak, split by "
                         "what was live then. Hover a segment for its bytes")
    hint += "; click a bar for the stage's largest blocks (below)." if linked is not None else "."
    stages = [_card_open("Peak by stage, by category", hint, "sv-stages"), _stage_breakdown_block(data, height, linked),
              "</section>"]
    cats = [_card_open("At the peak, by category", f"What the {fmt_bytes(data['peak']['allocated'])} live at the "
                       "peak is made of", "sv-categories-card"),
            _category_block(data, height if n <= 14 else None), "</section>"]
    if n <= 14:
        return ['<div class="sv-grid">', *stages, *cats, "</div>"]
    return [*stages, *cats]  # a tall chart of many steps gets the full width


def _stage_top_blocks(data: dict[str, Any]) -> tuple[list[str | UIElement], ColumnDataSource | None]:
    """The "largest blocks each stage allocated" card, and its table's source (for linking)."""
    t = data["stage_top"]
    if not len(t["size"]):
        return [], None
    hint = ("For each stage interval, the largest blocks it allocated itself that were still live at its own peak "
            "(what the stage adds on top of what it inherited). Select a row to see its stack.")
    table = _table_block({k: t[k] for k in ("interval", "stage", "size", "bytes", "site", "event_index", "stack_text")},
                         [("stage", "stage", 130), ("size", "size", 90), ("site", "allocated at", 900),
                          ("event_index", "event", 80)],
                         "sv-stage-top-table", "stack_text", "Select a row to see its stack.", max_height=330)
    src = table.children[0].source
    return [_card_open("Largest blocks each stage allocated", hint, "sv-stage-top"), table, "</section>"], src


def _attention_blocks(data: dict[str, Any]) -> list[str | UIElement]:
    att = data["attention"]
    s = att.get("summary") or {}
    out: list[str | UIElement] = [_card_open("Attention score matrices", ident="sv-attention")]
    if att.get("rows") is None:
        impl = s.get("implementation") or "unknown"
        out += [f'<p class="sv-none" id="sv-attention-none">No attention score matrices were materialized. '
                f'Implementation: {esc(impl)}.</p>', "</section>"]
        return out
    lg = s.get("largest") or {}
    summary = (f"{s.get('count', 0):,} score matrices materialized; largest {fmt_bytes(lg.get('bytes'))}; up to "
               f"{fmt_bytes(s.get('peak_live_bytes'))} live at once. Implementation: {s.get('implementation', 'unknown')}. "
               "SDPA (the diffusers default) computes attention without materializing them.")
    if att.get("note"):
        summary += f" ({att['note']})"
    out.append(f'<p class="sv-hint">{esc(summary)}</p>')
    rows = att["rows"]
    out.append(_table_block(
        {k: rows[k] for k in ("size", "bytes", "shape", "dtype", "stage", "site", "event_index", "lifetime", "stack_text")},
        [("size", "size", 90), ("shape", "shape [b·h, q, k]", 140), ("dtype", "dtype", 90), ("stage", "stage", 110),
         ("site", "allocated at", 520), ("event_index", "event", 80), ("lifetime", "freed after", 170)],
        "sv-attention-table", "stack_text", "Select a row to see its stack.", max_height=300))
    out.append("</section>")
    return out


def render_html(an: Any, doc: dict[str, Any], max_points: int = 20000) -> str:
    """The interactive report of one analysed snapshot (see :func:`report_data`)."""
    return render_report_data(report_data(an, doc, max_points=max_points))


def render_trace_report_data(data: dict[str, Any]) -> str:
    data = bounded_data(data)
    blocks: list[str | UIElement] = [_hero(data, "snapviz · GPU memory report (profiler trace)"), _warnings(data)]
    blocks += [_card_open("Memory over time", "From the trace's memory events. Drag to pan, scroll to zoom.",
                          "sv-timeline-card"), _timeline_or_note(data, with_points=False), "</section>"]
    if len(data["stage_bars"]["label"]):
        blocks += [_card_open("Peak by stage", "Peak allocated in each stage interval", "sv-stages"),
                   _stage_bar_block(data), "</section>"]
    live = data.get("live_table") or {}
    if live.get("rows"):
        blocks.append(_card_open("Live at the peak", live.get("note", ""), "sv-live"))
        cols = {f"c{i}": [r[i] for r in live["rows"]] for i in range(len(live["columns"]))}
        widths = (90, 110, 520, 200, 360)
        blocks.append(_table_block(cols, [(f"c{i}", c, widths[i]) for i, c in enumerate(live["columns"])],
                                   "sv-live-table", None, "", max_height=360))
        blocks.append("</section>")
    ops = data["attention_ops"]
    blocks.append(_card_open("Attention ops", ops.get("note", ""), "sv-attention"))
    if ops["rows"]:
        cols = {f"c{i}": [r[i] for r in ops["rows"]] for i in range(len(ops["columns"]))}
        blocks.append(_table_block(cols, [(f"c{i}", c, 120) for i, c in enumerate(ops["columns"])],
                                   "sv-attention-table", None, "", max_height=300))
    else:
        impl = (data.get("attention_summary") or {}).get("implementation")
        blocks.append(f'<p class="sv-none" id="sv-attention-none">No attention ops found in the trace.'
                      f'{" Implementation: " + esc(impl) + "." if impl else ""}</p>')
    blocks.append("</section>")
    blocks += [_metadata_html(data["metadata"]), _footer(data)]
    return build_page(f"snapviz: {data['title']}", blocks)


def render_trace_html(tan: Any, doc: dict[str, Any], max_points: int = 20000) -> str:
    """The report of a trace-only run (duck-typed ``tan``: see :func:`trace_report_data`)."""
    return render_trace_report_data(trace_report_data(tan, doc, max_points=max_points))
