"""The comparison page: one self-contained HTML file (Bokeh INLINE, works offline).

:func:`compare_report_data` turns a :class:`~snapviz.analyses.compare.Comparison` and its
``snapviz.compare/1`` dict into plain columns (tests assert on these); the renderer only
draws them, reusing the single-run report's pieces from :mod:`snapviz.render.html`.

The timeline's x axis is *stage-normalised*: stage label k (``load``, ``denoise/0``, …)
owns the slot [k, k+1) in every run, and an event's position inside the slot is its rank
among that label's events, so ``denoise/3`` lines up across runs whatever its wall time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from snapviz.render.fmt import fmt_bytes, fmt_delta

# Run colors: the base is dark, others follow Tableau 10 (stage colors stay in the bands).
RUN_COLORS = ("#1d2330", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def run_color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


def _slot_ticks(slots: list[str]) -> tuple[list[float], dict[float, str]]:
    """Tick at every slot centre when few; else only where a stage group starts."""
    ticks: list[float] = []
    labels: dict[float, str] = {}
    prev = None
    for k, s in enumerate(slots):
        g = s.split("/", 1)[0]
        if len(slots) <= 24 or g != prev:
            ticks.append(k + 0.5)
            labels[k + 0.5] = s if len(slots) <= 24 else g
        prev = g
    return ticks, labels


def compare_report_data(cmp: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """Everything the comparison page shows, as plain lists and arrays."""
    from snapviz.analyses.compare import changed_sites
    from snapviz.render.report_data import stage_palette

    labels = cmp.labels
    slots = list(cmp.slots)
    palette = stage_palette(slots)
    groups = [s.split("/", 1)[0] for s in slots]
    shade = [0.16 if k % 2 == 0 else 0.08 for k in range(len(slots))]  # neighbours of one group stay apart
    bands = {"left": np.arange(len(slots), dtype=np.float64), "right": np.arange(1, len(slots) + 1, dtype=np.float64),
             "name": slots, "group": groups, "color": [palette[s] for s in slots], "alpha": shade}
    timelines = []
    tl = cmp.timeline
    for i, lab in enumerate(labels):
        part = tl[tl["run"] == i]
        x = part["x"].to_numpy(np.float64)
        cols = {"allocated": part["allocated"].to_numpy(np.float64), "reserved": part["reserved"].to_numpy(np.float64),
                "stage": np.asarray(part["name"].astype(str).tolist(), dtype=object)}
        # Break the line over stage slots this run does not have (fewer steps, no refiner…).
        gap = np.flatnonzero(np.floor(x[1:]) - np.floor(x[:-1]) > 1) + 1 if len(x) else np.empty(0, np.int64)
        if len(gap):
            x = np.insert(x, gap, np.floor(x[gap - 1]) + 1)
            cols = {k: np.insert(v, gap, "" if k == "stage" else np.nan) for k, v in cols.items()}
        timelines.append({"label": lab, "color": run_color(i), "x": x, "allocated": cols["allocated"],
                          "reserved": cols["reserved"], "stage": [str(v) for v in cols["stage"]]})
    st = cmp.stages
    factors, peak, reserved, colors, delta = [], [], [], [], []
    for name in dict.fromkeys(st["name"].tolist()):
        for r in st[st["name"] == name].sort_values("run").itertuples(index=False):
            factors.append((str(name), str(r.label)))
            peak.append(float(r.peak_allocated_bytes) if not _na(r.peak_allocated_bytes) else np.nan)
            reserved.append(float(r.peak_reserved_bytes) if not _na(r.peak_reserved_bytes) else np.nan)
            delta.append("" if r.run == 0 or _na(r.delta_bytes) else fmt_delta(int(r.delta_bytes)) + _pct(r.delta_ratio))
            colors.append(run_color(int(r.run)))
    bars = {"factors": factors, "peak_allocated": np.array(peak, np.float64), "peak_reserved": np.array(reserved, np.float64),
            "color": colors, "delta": delta}
    runs = []
    for i, r in enumerate(doc["runs"]):
        p = r["peak"]
        runs.append({"label": r["label"], "color": run_color(i), "source": r["source"],
                     "peak": fmt_bytes(p["allocated_bytes"]), "reserved": fmt_bytes(p["reserved_bytes"]), "stage": p["stage"],
                     "delta": "base" if i == 0 else fmt_delta(r["delta_bytes"]) + _pct(r.get("delta_ratio")),
                     "reserved_delta": "" if i == 0 else fmt_delta(r["reserved_delta_bytes"]),
                     "events": r["events"], "stage_source": r["stage_source"]})
    stage_rows = []
    for s in doc["stages"] + doc["steps"]:
        cells = []
        for i in range(len(labels)):
            v = s["peak_allocated_bytes"][i]
            if v is None:
                cells.append("—")
            elif i == 0:
                cells.append(fmt_bytes(v))
            else:
                d = s["delta_bytes"][i]
                cells.append(f"{fmt_bytes(v)} ({'=' if d == 0 else fmt_delta(d) + _pct(s['delta_ratio'][i])})" if d is not None else fmt_bytes(v))
        stage_rows.append({"name": s["name"], "is_step": "step" in s, "cells": cells})
    site_rows = []
    for site in changed_sites(cmp.sites, 40):
        part = cmp.sites[cmp.sites["site"] == site].sort_values("run")
        cells = []
        for r in part.itertuples(index=False):
            if r.run == 0:
                cells.append(f"{fmt_bytes(r.peak_live_bytes)} / {fmt_bytes(r.total_bytes)}")
            elif r.status in ("same", "absent", "n/a"):
                cells.append(r.status)
            else:
                cells.append(f"{r.status} {fmt_delta(r.delta_peak_live_bytes)} / {fmt_delta(r.delta_total_bytes)}")
        site_rows.append({"site": site, "cells": cells})
    warnings = [f"{r['label']}: {w}" for r in doc["runs"] for w in (r.get("warnings") or [])]
    ticks, tick_labels = _slot_ticks(slots)
    y_top = max([float(np.nanmax(t["reserved"])) for t in timelines if len(t["reserved"])] + [1.0])
    return {"title": f"{labels[0]} vs " + ", ".join(labels[1:]), "labels": labels, "verdict": list(doc.get("verdict") or []),
            "runs": runs, "slots": slots, "bands": bands, "ticks": ticks, "tick_labels": tick_labels,
            "timelines": timelines, "y_top": y_top, "bars": bars, "stage_rows": stage_rows, "site_rows": site_rows,
            "warnings": warnings, "fail_over": doc.get("fail_over")}


def _na(v: Any) -> bool:
    try:
        return v is None or bool(np.isnan(v))
    except TypeError:
        return v is None or str(v) == "<NA>"


def _pct(r: Any) -> str:
    return "" if _na(r) else f" ({float(r) * 100:+.1f}%)"


def _table(head: list[str], rows: list[list[str]], ident: str) -> str:
    from snapviz.render.html import esc

    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="sv-cmp" id="{esc(ident)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """<style>
table.sv-cmp { border-collapse: collapse; width: 100%; font-size: 13px; }
table.sv-cmp th { text-align: left; color: var(--muted); font-weight: 600; border-bottom: 1px solid var(--line); padding: 4px 8px; }
table.sv-cmp td { border-top: 1px solid var(--line); padding: 4px 8px; vertical-align: top; font-variant-numeric: tabular-nums; }
table.sv-cmp td:first-child { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; word-break: break-all; }
.sv-swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.sv-cmp-wrap { overflow-x: auto; }
</style>"""


def _card(title: str, hint: str, ident: str) -> str:
    from snapviz.render.html import esc

    return (f'<section class="sv-card" id="{esc(ident)}"><h2>{esc(title)}</h2>'
            + (f'<p class="sv-hint">{esc(hint)}</p>' if hint else ""))


def _hero(data: dict[str, Any]) -> str:
    from snapviz.render.html import esc

    verdict = data["verdict"]
    head = verdict[0] if len(verdict) == 1 else f"{len(verdict)} runs compared with {data['labels'][0]}"
    items = "".join(f"<li>{esc(v)}</li>" for v in (verdict if len(verdict) > 1 else []))
    rows = "".join(
        f'<tr><td><span class="sv-swatch" style="background:{r["color"]}"></span>{esc(r["label"])}</td><td>{esc(r["peak"])}</td>'
        f'<td>{esc(r["delta"])}</td><td>{esc(r["reserved"])}</td><td>{esc(r["reserved_delta"])}</td><td>{esc(str(r["stage"]))}</td>'
        f'<td>{r["events"]:,}</td></tr>' for r in data["runs"])
    gate = ""
    fo = data.get("fail_over")
    if fo is not None:
        cls = "match" if fo["passed"] else "differs"
        gate = f'<div class="sv-badge {cls}">gate --fail-over {fo["percent"]:g}%: {"passed" if fo["passed"] else "FAILED"}</div>'
    return (f'<header class="sv-hero"><p class="sv-kicker">snapviz · GPU memory comparison</p>'
            f'<p class="sv-title">{esc(data["title"])}</p><h1 class="sv-verdict" id="sv-verdict">{esc(head)}</h1>'
            f'{"<ul class=sv-lines>" + items + "</ul>" if items else ""}'
            f'<div class="sv-cmp-wrap"><table class="sv-cmp" id="sv-runs"><thead><tr><th>run</th><th>peak allocated</th>'
            f'<th>Δ vs base</th><th>peak reserved</th><th>Δ reserved</th><th>peak in</th><th>events</th></tr></thead>'
            f'<tbody>{rows}</tbody></table></div>{gate}</header>')


def _timeline(data: dict[str, Any]) -> Any:
    from bokeh.models import DataRange1d, FixedTicker, HoverTool, LegendItem, Range1d
    from bokeh.core.properties import value

    from snapviz.render.html import LineSpec, _source, bytes_hover_formatter, timeline_figure

    tls = [t for t in data["timelines"] if len(t["x"])]
    n_slots = max(len(data["slots"]), 1)
    first = tls[0]
    src0 = _source({"x": first["x"], "allocated": first["allocated"], "reserved": first["reserved"], "stage": first["stage"]})
    fig = timeline_figure(src0, "x", [LineSpec("allocated", first["label"], first["color"], 2.2)],
                          x_label="stage (each stage label has the same width in every run)",
                          bands=data["bands"], band_x=("left", "right"), y_top=data["y_top"], height=420,
                          x_range=Range1d(0, n_slots, bounds=(0, n_slots)))
    legend = fig.legend[0]
    sources = [(first, src0)]
    for t in tls[1:]:
        src = _source({"x": t["x"], "allocated": t["allocated"], "reserved": t["reserved"], "stage": t["stage"]})
        r = fig.step(x="x", y="allocated", source=src, mode="after", line_color=t["color"], line_width=2.0, line_alpha=0.9)
        legend.items.insert(len(sources), LegendItem(label=value(t["label"]), renderers=[r]))
        sources.append((t, src))
    reserved = [fig.step(x="x", y="reserved", source=src, mode="after", line_color=t["color"], line_width=1.0,
                         line_dash="dashed", line_alpha=0.55, visible=False) for t, src in sources]
    legend.items.append(LegendItem(label=value("reserved (dashed, every run)"), renderers=reserved))
    # Autoscale y on the visible lines only (bands and hover markers do not count), from 0.
    lines = [r for r in fig.renderers if getattr(r.glyph, "mode", None) == "after"]
    fig.y_range = DataRange1d(start=0, renderers=lines, only_visible=True, range_padding=0.08)
    hover_renderers = []
    for t, src in sources:
        hover_renderers.append(fig.scatter(x="x", y="allocated", source=src, size=7, fill_alpha=0, line_alpha=0))
    fig.add_tools(HoverTool(renderers=hover_renderers, tooltips=[("stage", "@stage"), ("allocated", "@allocated{custom}"),
                                                                  ("reserved", "@reserved{custom}")],
                            formatters={"@allocated": bytes_hover_formatter(), "@reserved": bytes_hover_formatter()}))
    fig.xaxis.ticker = FixedTicker(ticks=data["ticks"])
    fig.xaxis.major_label_overrides = {float(k): v for k, v in data["tick_labels"].items()}
    if len(data["ticks"]) > 8 or len(data["slots"]) > 24:  # many ticks, or one-slot stages side by side
        fig.xaxis.major_label_orientation = 0.8
    # Many runs: wrap the legend instead of widening the page (~7 px a character at 12 px).
    longest = max(len(str(getattr(it.label, "value", it.label))) for it in legend.items)
    legend.ncols = max(1, min(len(legend.items), 1200 // (7 * longest + 46)))
    fig.name = "sv-cmp-timeline"
    return fig


def _bars(data: dict[str, Any]) -> Any:
    from bokeh.models import FactorRange, HoverTool, Range1d

    from snapviz.render.html import _base_figure, _source, bytes_hover_formatter, bytes_tick_formatter, bytes_ticker

    b = data["bars"]
    top = float(np.nanmax(b["peak_allocated"])) if len(b["factors"]) and np.isfinite(b["peak_allocated"]).any() else 1.0
    src = _source({"x": b["factors"], "peak_allocated": np.nan_to_num(b["peak_allocated"]), "peak_reserved": b["peak_reserved"],
                   "color": b["color"], "delta": b["delta"], "run": [f[1] for f in b["factors"]]})
    fig = _base_figure(340, x_range=FactorRange(*b["factors"]) if b["factors"] else FactorRange(),
                       y_range=Range1d(0, max(top, 1.0) * 1.12, bounds=(0, None)))
    fig.toolbar_location = None
    fig.vbar(x="x", top="peak_allocated", width=0.85, source=src, fill_color="color", line_color=None, fill_alpha=0.85)
    fig.add_tools(HoverTool(tooltips=[("run", "@run"), ("peak allocated", "@peak_allocated{custom}"),
                                      ("peak reserved", "@peak_reserved{custom}"), ("vs base", "@delta")],
                            formatters={"@peak_allocated": bytes_hover_formatter(), "@peak_reserved": bytes_hover_formatter()}))
    fig.yaxis.formatter = bytes_tick_formatter()
    fig.yaxis.ticker = bytes_ticker()
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.9 if len(b["factors"]) > 12 else 0.0
    fig.xaxis.group_label_orientation = 0.0
    fig.name = "sv-cmp-bars"
    return fig


def render_compare_report_data(data: dict[str, Any]) -> str:
    """The page for a :func:`compare_report_data` dict."""
    from snapviz.render.html import bounded_data, build_page, esc

    data = bounded_data(data)

    labels = data["labels"]
    blocks: list[Any] = [_CSS, _hero(data)]
    if data["warnings"]:
        items = "".join(f"<li>{esc(w)}</li>" for w in data["warnings"][:12])
        blocks.append(f'<div class="sv-warn" id="sv-warnings"><h3>⚠ warnings</h3><ul>{items}</ul></div>')
    if any(len(t["x"]) for t in data["timelines"]):
        blocks += [_card("Memory over the pipeline, aligned by stage",
                         "Each stage label (every denoising step too) gets the same width in every run, so steps line "
                         "up whatever their wall time. Solid: allocated; click a legend entry to show reserved (dashed) "
                         "or hide a run. Min/max decimation keeps every stage's peak.", "sv-cmp-timeline-card"),
                   _timeline(data), "</section>"]
    if data["bars"]["factors"]:
        blocks += [_card("Peak allocated per stage", "One bar per run in each stage (the peak over all its intervals and steps).",
                         "sv-cmp-bars-card"), _bars(data), "</section>"]
    head = ["stage"] + [f"{lab} (base)" if i == 0 else lab for i, lab in enumerate(labels)]
    rows = [[r["name"]] + r["cells"] for r in data["stage_rows"]]
    blocks.append(_card("Peak allocated per stage and step", "Δ against the base; — where a run has no such stage.", "sv-cmp-deltas")
                  + f'<div class="sv-cmp-wrap">{_table(head, rows, "sv-delta-table")}</div></section>')
    if data["site_rows"]:
        head = ["allocation site", f"{labels[0]}: live at peak / allocated in total"] + [f"{lab}: Δ" for lab in labels[1:]]
        rows = [[r["site"]] + r["cells"] for r in data["site_rows"]]
        blocks.append(_card("Allocation sites that changed", "Matched by source line; bytes live at each run's peak / bytes "
                            "allocated over the whole run.", "sv-cmp-sites")
                      + f'<div class="sv-cmp-wrap">{_table(head, rows, "sv-site-table")}</div></section>')
    from snapviz import __version__
    blocks.append(f'<footer class="sv-foot" id="sv-footer">Generated by snapviz {esc(__version__)} compare — '
                  "self-contained, works offline.</footer>")
    return build_page(f"snapviz compare: {data['title']}", blocks)


def render_compare_html(cmp: Any, doc: dict[str, Any]) -> str:
    return render_compare_report_data(compare_report_data(cmp, doc))
