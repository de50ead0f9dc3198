"""Static pictures (PNG/SVG) of a timeline, for bug tickets and PR comments.

GitHub renders an issue at about 900 px wide, so a picture is 900 px wide at 100 dpi
(SVG: the same 9 in) and says everything in itself: the title carries the peak, stages
are shaded and named (names that do not fit side by side take a second row, or are left
out), memory is stacked by category, the peak is a red marker whose words sit above the
data on a leader line (:func:`callout`), the legend is below the axes. The x axis is the
stage axis of :func:`stage_axis`, not time: each stage readable, the peak's stage widened.
A trace-only run is drawn the same way from its memory events (:func:`trace_picture_data`).

:func:`picture_data` (one run) and :func:`compare_picture_data` (runs overlaid on the
stage-aligned axis of :mod:`snapviz.analyses.compare`) hold every number drawn; the
``render_*`` functions only draw them with matplotlib's Agg backend (no display needed).
matplotlib is an optional extra (``snapviz[picture]``): nothing else in snapviz needs it.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.compare import Comparison
from snapviz.analyses.compare_document import CompareDocument
from snapviz.analyses.document import Oom, Summary
from snapviz.model import A_OOM
from snapviz.render.fmt import fmt_peak_bound
from snapviz.safe_text import bound, clip
from snapviz.units import fmt_bytes
from snapviz.vocab import END_STATE, END_STATE_ONLY, stage_group

WIDTH_IN, HEIGHT_IN, DPI = 9.0, 4.4, 100  # 900 x 440 px
PEAK_COLOR = "#d62728"
ALLOCATED_COLOR = "#1f3b73"
RESERVED_COLOR = "#e8710a"
MAX_POINTS = 3000  # per series; min/max decimation keeps the peak
GIB = float(1 << 30)
TITLE_CHARS = 120  # a title longer than the picture's width is cut (between words)


def _stage_spans(names: list[str], start: np.ndarray, end: np.ndarray) -> list[dict[str, Any]]:
    """Consecutive intervals of one stage group merged into one shaded span."""
    spans: list[dict[str, Any]] = []
    for name, s, e in zip(names, start.tolist(), end.tolist(), strict=True):
        g = stage_group(name)
        if spans and spans[-1]["group"] == g:
            spans[-1]["end"] = e
            spans[-1]["steps"] += 1
        else:
            spans.append({"group": g, "start": s, "end": e, "steps": 1})
    return spans


# The picture's x axis (docs/sharing.md, "Pictures"): stages in order, each as wide as its share of
# the allocator's events, but never narrower than MIN_STAGE_SHARE / (number of stages), and the
# peak's stage never narrower than PEAK_STAGE_SHARE. A time axis gave SDXL's VAE decode 5% of the
# width (loading the weights takes half the run) and an event axis gave Flux's 2%; here the stage
# that matters is always readable, and the axis says it is not a time scale.
MIN_STAGE_SHARE = 0.5
PEAK_STAGE_SHARE = 0.25
STAGE_AXIS_LABEL = "stages in order, each as wide as its share of allocator events (short ones and the peak's widened)"


def stage_axis(n: int, span_rows: list[tuple[int, int]], peak_span: int | None) -> np.ndarray:
    """x in [0, 1] for each of ``n`` event rows: piecewise linear in the row, one piece per
    stage span (``span_rows``: (first row, row after the last), in order); rows before the
    first span or after the last share the rest in proportion to their count."""
    if n == 0:
        return np.empty(0, np.float64)
    knots = [0]
    shares: list[float] = []
    floors: list[float] = []
    floor = MIN_STAGE_SHARE / max(len(span_rows), 1)
    for k, (a, b) in enumerate(span_rows):
        a, b = max(a, knots[-1]), max(min(b, n), max(a, knots[-1]))
        if a > knots[-1]:  # rows between spans: by their count, no floor
            shares.append((a - knots[-1]) / n)
            floors.append(0.0)
            knots.append(a)
        shares.append((b - a) / n)
        floors.append((PEAK_STAGE_SHARE if k == peak_span else floor) if b > a else 0.0)
        knots.append(b)
    if knots[-1] < n:
        shares.append((n - knots[-1]) / n)
        floors.append(0.0)
        knots.append(n)
    s, f = np.asarray(shares), np.asarray(floors)
    fixed = np.zeros(len(s), bool)  # pieces held at their floor; the others share the rest by count
    w = s
    for _ in range(len(s) + 1):
        rest = max(1.0 - f[fixed].sum(), 0.0)
        free = s[~fixed].sum()
        w = np.where(fixed, f, s * (rest / free) if free > 0 else 0.0)
        below = ~fixed & (w < f)
        if not below.any():
            break
        fixed |= below
    xs = np.concatenate([[0.0], np.cumsum(w)])
    xs /= xs[-1] if xs[-1] > 0 else 1.0
    return np.interp(np.arange(n, dtype=np.float64), np.asarray(knots, np.float64), xs)


def _axis_spans(
    names: list[str], start_rows: np.ndarray, end_rows: np.ndarray, n: int, peak_row: int
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The stage axis of ``n`` rows and the merged stage spans on it (``start``/``end`` in x)."""
    spans = _stage_spans(names, np.asarray(start_rows, np.int64), np.asarray(end_rows, np.int64))
    peak_span = next((k for k, s in enumerate(spans) if s["start"] <= peak_row < s["end"]), None)
    x = stage_axis(n, [(int(s["start"]), int(s["end"])) for s in spans], peak_span)
    ends = np.append(x, 1.0)
    for s in spans:
        s["start"], s["end"] = float(ends[min(int(s["start"]), n)]), float(ends[min(int(s["end"]), n)])
    return x, spans


def _labelled_oom(oom_rows: np.ndarray, oom: Oom | None) -> int:
    """Which of the OOM markers the summary's ``oom`` explains (its event), else the last."""
    at = oom.event_index if oom is not None else None
    hits = np.flatnonzero(oom_rows == at) if at is not None else np.empty(0, np.int64)
    return int(hits[0]) if len(hits) else max(len(oom_rows) - 1, 0)


def picture_data(an: Analysis, summary: Summary, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """Series, stage spans and peak of one analysis and its ``snapviz.summary/1`` document, on
    the stage axis (:func:`stage_axis`)."""
    from snapviz.analyses.categories import category_timeline
    from snapviz.analyses.oom import oom_fix_short, oom_short
    from snapviz.category_vocab import order_categories
    from snapviz.render.html.palette import category_palette, stage_palette

    rep = an.replay
    ev = rep.events
    n = len(ev)
    ct = category_timeline(rep, an.labels.labels, an.allocations, max_points)  # the allocation table's group-by
    rows = ct["row"].to_numpy(np.int64) if len(ct) else np.empty(0, np.int64)
    cat_cols = [c for c in ct.columns if c not in ("row", "time_us", "stage", "allocated")]
    cats = [c for c in order_categories(cat_cols) if len(ct) and ct[c].to_numpy().any()]
    palette = category_palette(cats)
    st = an.stages
    names = [str(s) for s in st["name"]] if len(st) else []
    starts = st["start_row"].to_numpy(np.int64) if len(st) else np.empty(0, np.int64)
    ends = np.minimum(st["end_row"].to_numpy(np.int64), n - 1) + 1 if len(st) else np.empty(0, np.int64)
    pi = rep.peak_index
    x_all, spans = _axis_spans(names, starts, ends, n, pi)
    spal = stage_palette(s["group"] for s in spans)
    for s in spans:
        s["color"] = spal[s["group"]]
    peak = summary.peak
    oom_rows = np.flatnonzero(ev["action"].to_numpy() == A_OOM) if n else np.empty(0, np.int64)
    oom = summary.oom if isinstance(summary.oom, Oom) else None  # None: no OOM recorded
    title = (
        f"{_short(an.run.source)}: {summary.not_recorded.split(':', 1)[0]}"
        if summary.not_recorded
        else f"{_short(an.run.source)}: {fmt_bytes(peak.allocated_bytes)} live when the snapshot was taken "
        f"({END_STATE_ONLY.split(':', 1)[0]}, not a peak)"
        if peak.stage == END_STATE
        else f"{_short(an.run.source)}: peak {fmt_peak_bound(peak)}{fmt_bytes(peak.allocated_bytes)} allocated in {peak.stage}, "
        f"{fmt_bytes(peak.reserved_bytes)} reserved"
    )
    return {
        # OOM first: the failed request leads the title, the marker is labelled with it
        "title": [
            f"{_short(an.run.source)}: {oom_short(oom)}",
            title.split(": ", 1)[1],
            *([fix] if (fix := oom_fix_short(oom)) else []),  # the fix line, in a few words
        ]
        if oom
        else title,
        "ooms": {
            "x": x_all[oom_rows],
            "bytes": ev["allocated"].to_numpy()[oom_rows] if n else np.empty(0),
            "label": f"{oom_short(oom)}, {fmt_bytes(oom.allocated_bytes)} allocated" if oom else "",
            # the marker the label names: the OOM the report explains (the one that ended the run)
            "labelled": _labelled_oom(oom_rows, oom),
        },
        "x_label": STAGE_AXIS_LABEL,
        "x": x_all[rows],
        "allocated": ev["allocated"].to_numpy()[rows] if n else np.empty(0),
        "reserved": ev["reserved"].to_numpy()[rows] if n else np.empty(0),
        "categories": [{"name": c, "color": palette[c], "bytes": ct[c].to_numpy(np.float64)} for c in cats],
        "spans": spans,
        "peak": {
            "x": float(x_all[pi]) if pi >= 0 and n else 0.0,
            "bytes": int(rep.peak_allocated),
            "stage": str(peak.stage),
        },
        "truncated": bool(rep.truncated),
    }


def trace_picture_data(tan: Analysis, summary: Summary, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The same picture for a trace-only run and its ``snapviz.summary/1`` document: its memory
    events' allocated and reserved totals on the stage axis, the stages from its annotations; no
    categories (a trace does not say what each block holds)."""
    from snapviz.analyses.decimate import decimate_minmax
    from snapviz.render.html.palette import stage_palette

    tl = tan.timeline
    n = len(tl)
    alloc = tl["allocated"].to_numpy(np.int64) if n else np.empty(0, np.int64)
    reserved = tl["reserved"].to_numpy(np.int64) if n else np.empty(0, np.int64)
    times = tl["time_us"].to_numpy(np.float64) if n else np.empty(0)
    st = tan.stages.sort_values("start_us", kind="stable") if len(tan.stages) else tan.stages
    if "depth" in st and len(st):
        st = st[st["depth"] == st["depth"].min()]  # the outermost ranges: stages, not their steps' parents
    names = [str(x) for x in st["name"]] if len(st) else []
    starts = np.searchsorted(times, st["start_us"].to_numpy(np.float64), "left") if len(st) else np.empty(0, np.int64)
    ends = np.searchsorted(times, st["end_us"].to_numpy(np.float64), "right") if len(st) else np.empty(0, np.int64)
    pi = tan.peak_index
    x_all, spans = _axis_spans(names, starts, ends, n, pi)
    spal = stage_palette(s["group"] for s in spans)
    for s in spans:
        s["color"] = spal[s["group"]]
    rows = decimate_minmax(np.arange(n), alloc, reserved, max_points=max_points) if n else np.empty(0, np.int64)
    peak = summary.peak
    has_reserved = peak.reserved_bytes is not None
    where = f"{summary.device or 'no device'}, profiler trace"
    return {
        "title": f"{_short(tan.run.source)}: peak {fmt_bytes(peak.allocated_bytes)} allocated in {peak.stage}"
        + (f", {fmt_bytes(peak.reserved_bytes)} reserved" if has_reserved else "")
        + f" ({where})",
        "ooms": {"x": np.empty(0), "bytes": np.empty(0)},
        "x_label": STAGE_AXIS_LABEL,
        "x": x_all[rows],
        "allocated": alloc[rows].astype(np.float64),
        "reserved": reserved[rows].astype(np.float64) if has_reserved else None,
        "categories": [],
        "spans": spans,
        "peak": {"x": float(x_all[pi]) if n else 0.0, "bytes": int(alloc[pi]) if n else 0, "stage": str(peak.stage)},
        "truncated": False,
    }


def _short(source: str) -> str:
    """``runs/sdxl/`` and ``runs/sdxl/snapshot.pickle`` -> ``sdxl``; other files keep their name."""
    p = os.path.abspath(source)
    if os.path.isdir(p):
        return os.path.basename(p)
    base = os.path.basename(p)
    if base.startswith(("snapshot.", "trace.json")):
        return os.path.basename(os.path.dirname(p)) or base
    return base


# Fixed margins (figure fractions): the stage labels above the axes, the legend below them, and
# the label rows measured against a known axes width.
MARGINS = {"left": 0.07, "right": 0.985, "top": 0.84, "bottom": 0.15}
STAGE_FONT = 7.5
LABEL_ROWS = 2  # stage labels that do not fit side by side take a second row; then they are left out
MIN_LABELLED_PX = 14  # a stage narrower than this on the picture is shaded, not named


def _cleaned(d: dict[str, Any]) -> dict[str, Any]:
    """The picture's data with every label clipped and cleaned (snapviz.safe_text) before it
    reaches matplotlib: no control character in the PNG's text, the SVG's text and comments
    (which must stay well-formed XML) or matplotlib's own warnings (a missing glyph is named)."""
    out: dict[str, Any] = bound(d, max_list=None, json_numbers=False)
    return out


def _figure() -> tuple[Any, Any]:
    # A bare Figure renders through Agg/SVG canvases without pyplot, so the user's
    # backend (a notebook's inline one) and pyplot's global state are left alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    FigureCanvasAgg(fig)  # a renderer to measure text with (savefig picks the format's own canvas)
    ax = fig.add_subplot(1, 1, 1)
    fig.subplots_adjust(**MARGINS)
    return fig, ax


def _save(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    # metadata: no creation date, so the same input gives the same bytes
    meta = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
    return buf.getvalue()


HEADROOM = 1.32  # y range over the highest series: room above the data for the callouts


def _gib_axis(ax: Any, y_top: float) -> None:
    ax.set_ylim(0, max(y_top, 1.0) * HEADROOM / GIB)
    ax.set_ylabel("GiB")
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _shade_stages(ax: Any, spans: list[dict[str, Any]]) -> None:
    """Stage spans shaded in alternating strengths, each named above the plot (×N for steps)
    where its name fits: names that would overlap take a second row, and a stage with no room
    for its name in either row (or too narrow to see) is shaded only."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    x0, x1 = ax.get_xlim()
    box = ax.get_window_extent(renderer)
    px_per_x = box.width / (x1 - x0) if x1 > x0 else 0.0
    right_edge = [-np.inf] * LABEL_ROWS  # in pixels, per label row
    row_h = STAGE_FONT * 1.45 / 72 * DPI / box.height  # one text line, in axes fractions
    pad = 6.0
    for k, s in enumerate(spans):
        ax.axvspan(s["start"], s["end"], color=s["color"], alpha=0.10 if k % 2 else 0.17, linewidth=0)
        width_px = (s["end"] - s["start"]) * px_per_x
        if width_px < MIN_LABELLED_PX:
            continue
        label = s["group"] + (f" ×{s['steps']}" if s["steps"] > 1 else "")
        t = ax.text(
            (s["start"] + s["end"]) / 2,
            1.01,
            label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=STAGE_FONT,
            color="#444444",
            clip_on=False,
        )
        w = t.get_window_extent(renderer).width
        centre = box.x0 + ((s["start"] + s["end"]) / 2 - x0) * px_per_x
        centre = min(max(centre, box.x0 + w / 2), box.x1 - w / 2)  # inside the axes' width
        row = next((r for r in range(LABEL_ROWS) if centre - w / 2 >= right_edge[r] + pad), None)
        if row is None:
            t.remove()
            continue
        right_edge[row] = centre + w / 2
        t.set_x(x0 + (centre - box.x0) / px_per_x)
        t.set_y(1.01 + row * row_h)


def callout(ax: Any, x: float, y_bytes: float, text: str, color: str, slot: int = 0) -> None:
    """A label in the headroom above the data, joined to its point by a thin leader line, on
    the side with more room (``slot``: 0 top line, 1 the next; for a second marker)."""
    lo, hi = ax.get_xlim()
    frac = (x - lo) / (hi - lo) if hi > lo else 0.0
    right = frac > 0.5
    tx = min(max(frac + (-0.06 if right else 0.06), 0.01), 0.99)
    ax.annotate(
        text,
        xy=(x, y_bytes / GIB),
        xycoords="data",
        xytext=(tx, 0.985 - slot * 0.11),
        textcoords="axes fraction",
        fontsize=8,
        color=color,
        va="top",
        ha="right" if right else "left",
        arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.8, "shrinkB": 5},
        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
        zorder=7,
    )


def render_timeline_picture(an: Analysis, summary: Summary, fmt: str = "png") -> bytes:
    """One run's timeline as PNG or SVG bytes (see module doc)."""
    return draw_timeline(picture_data(an, summary), fmt)


def render_trace_picture(tan: Analysis, summary: Summary, fmt: str = "png") -> bytes:
    """A trace-only run's timeline as PNG or SVG bytes."""
    return draw_timeline(trace_picture_data(tan, summary), fmt)


def _legend_below(fig: Any, ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(handles), 7), fontsize=7, frameon=False)


def _title(fig: Any, text: str | list[str]) -> None:
    """The picture's title: one line, or a list of lines (an OOM's request above the peak), each
    cut between words to the picture's width."""
    lines = [text] if isinstance(text, str) else text
    if len(lines) > 2:  # an OOM's fix line as well: the plot starts one title line lower
        fig.subplots_adjust(top=MARGINS["top"] - 0.05 * (len(lines) - 2))
    fig.suptitle("\n".join(clip(t, TITLE_CHARS) for t in lines), fontsize=10.5, x=0.01, y=0.985, ha="left", va="top")


def draw_timeline(d: dict[str, Any], fmt: str = "png") -> bytes:
    return _save(timeline_figure(d, fmt), fmt)


def timeline_figure(d: dict[str, Any], fmt: str = "png") -> Any:
    """The matplotlib Figure of :func:`draw_timeline` (markers such as an OOM's are added here:
    a point on the data and, for its words, a :func:`callout` in the next slot)."""
    d = _cleaned(d)
    fig, ax = _figure()
    x = d["x"]
    reserved = d["reserved"]
    y_top = float(max(reserved.max(initial=0) if reserved is not None else 0, d["peak"]["bytes"]))
    _gib_axis(ax, y_top)
    ax.set_xlim(0.0, 1.0)
    _shade_stages(ax, d["spans"])
    if d["categories"]:
        ax.stackplot(
            x,
            *[c["bytes"] / GIB for c in d["categories"]],
            colors=[c["color"] for c in d["categories"]],
            labels=[c["name"] for c in d["categories"]],
            alpha=0.75,
            linewidth=0,
            step="post",
            rasterized=fmt == "svg",
        )  # thousands of vertices: pixels keep the SVG small
    if reserved is not None:
        ax.step(x, reserved / GIB, where="post", color=RESERVED_COLOR, linewidth=1.0, linestyle="--", label="reserved")
    ax.step(x, d["allocated"] / GIB, where="post", color=ALLOCATED_COLOR, linewidth=1.2, label="allocated")
    p = d["peak"]
    ax.plot(
        [p["x"]],
        [p["bytes"] / GIB],
        marker="o",
        markersize=9,
        color=PEAK_COLOR,
        markeredgecolor=PEAK_COLOR,
        linestyle="none",
        zorder=5,
    )  # no legend entry: the callout names it
    if len(d["ooms"]["x"]):
        ax.plot(
            d["ooms"]["x"],
            d["ooms"]["bytes"] / GIB,
            marker="X",
            markersize=9,
            color="black",
            linestyle="none",
            label="CUDA OOM",
            zorder=6,
        )
    if len(d["ooms"]["x"]) and d["ooms"].get("label"):
        k = d["ooms"].get("labelled", 0)
        callout(ax, float(d["ooms"]["x"][k]), float(d["ooms"]["bytes"][k]), d["ooms"]["label"], "black", slot=1)
    callout(ax, p["x"], p["bytes"], f"peak {fmt_bytes(p['bytes'])} in {p['stage']}", PEAK_COLOR)
    ax.set_xticks([])
    ax.set_xlabel(d["x_label"] + (" — history wrapped: recorded window only" if d["truncated"] else ""), fontsize=8)
    ax.tick_params(labelsize=8)
    _title(fig, d["title"])
    _legend_below(fig, ax)
    return fig


# ---------------------------------------------------------------- compare


def compare_picture_data(cmp: Comparison, doc: CompareDocument) -> dict[str, Any]:
    """Every run's allocated series on the stage-aligned axis (slot k = stage label k)."""
    from snapviz.render.html.compare_data import compare_report_data

    rd = compare_report_data(cmp, doc)
    spans = _stage_spans(list(rd.slots), np.asarray(rd.bands.left), np.asarray(rd.bands.right))
    for s in spans:
        s["color"] = rd.bands.color[list(rd.bands.group).index(s["group"])]
    runs: list[dict[str, Any]] = []
    for tl, r in zip(rd.timelines, cmp.runs.itertuples(index=False), strict=True):
        alloc = np.asarray(tl.allocated, np.float64)
        k = int(np.nanargmax(alloc)) if len(alloc) and np.isfinite(alloc).any() else -1
        runs.append(
            {
                "label": tl.label,
                "color": tl.color,
                "x": np.asarray(tl.x, np.float64),
                "allocated": alloc,
                "peak_x": float(tl.x[k]) if k >= 0 else 0.0,
                "peak_bytes": int(r.peak_allocated_bytes),
            }
        )
    base = runs[0]
    parts = [f"{r['label']} {fmt_bytes(r['peak_bytes'])}" for r in runs]
    return {
        "title": "peak allocated: " + " vs ".join(parts),
        "runs": runs,
        "spans": spans,
        "n_slots": len(rd.slots),
        "base_label": base["label"],
    }


def render_compare_picture(cmp: Comparison, doc: CompareDocument, fmt: str = "png") -> bytes:
    return draw_compare(compare_picture_data(cmp, doc), fmt)


def draw_compare(d: dict[str, Any], fmt: str = "png") -> bytes:
    d = _cleaned(d)
    fig, ax = _figure()
    y_top = max([r["peak_bytes"] for r in d["runs"]] + [1])
    _gib_axis(ax, y_top)
    ax.set_xlim(0, max(d["n_slots"], 1))
    _shade_stages(ax, d["spans"])
    for k in range(1, d["n_slots"]):
        ax.axvline(k, color="white", linewidth=0.6)  # step boundaries inside a shaded stage
    for i, r in enumerate(d["runs"]):
        # The base is drawn wide underneath, so where the runs agree both stay visible.
        ax.plot(
            r["x"],
            r["allocated"] / GIB,
            color=r["color"],
            linewidth=2.6 if i == 0 else 1.1,
            alpha=0.55 if i == 0 else 1.0,
            label=f"{r['label']} (peak {fmt_bytes(r['peak_bytes'])})",
        )
        ax.plot(
            [r["peak_x"]],
            [r["peak_bytes"] / GIB],
            marker="v",
            markersize=8,
            color=r["color"],
            linestyle="none",
            zorder=5,
        )
    ax.set_xticks([])
    ax.set_xlabel("stages aligned by label (each stage or step has the same width in every run)", fontsize=8)
    ax.tick_params(labelsize=8)
    _title(fig, d["title"])
    _legend_below(fig, ax)
    return _save(fig, fmt)
