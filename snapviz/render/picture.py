"""Static pictures (PNG/SVG) of a timeline, for bug tickets and PR comments.

GitHub renders an issue at about 900 px wide, so a picture is 900 px wide at 100 dpi
(SVG: the same 9 in) and says everything in itself: the title carries the peak, stages
are shaded and named, memory is stacked by category, the peak is a red marker.

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

from snapviz.analyses.compare import Comparison
from snapviz.analyses.summary import Analysis
from snapviz.model import A_OOM
from snapviz.render.fmt import fmt_peak_bound
from snapviz.units import fmt_bytes
from snapviz.vocab import stage_group

WIDTH_IN, HEIGHT_IN, DPI = 9.0, 4.4, 100  # 900 x 440 px
PEAK_COLOR = "#d62728"
ALLOCATED_COLOR = "#1f3b73"
RESERVED_COLOR = "#e8710a"
MAX_POINTS = 3000  # per series; min/max decimation keeps the peak
GIB = float(1 << 30)


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


def picture_data(an: Analysis, doc: dict[str, Any], max_points: int = MAX_POINTS) -> dict[str, Any]:
    """Series, stage spans and peak of one analysis, on an x axis in seconds (or event index)."""
    from snapviz.analyses.categories import category_timeline
    from snapviz.analyses.report_view import order_categories
    from snapviz.render.html.palette import category_palette, stage_palette

    rep = an.replay
    ev = rep.events
    n = len(ev)
    times = ev["time_us"].to_numpy() if n else np.empty(0, np.int64)
    has_time = bool(n) and bool((times >= 0).all())
    x_all = (times - times[0]) / 1e6 if has_time else np.arange(n, dtype=np.float64)
    ct = category_timeline(an.snapshot, rep, an.labels.labels, max_points=max_points, rules=an.rules, tables=an.tables)
    rows = ct["row"].to_numpy(np.int64) if len(ct) else np.empty(0, np.int64)
    cat_cols = [c for c in ct.columns if c not in ("row", "time_us", "stage", "allocated")]
    cats = [c for c in order_categories(cat_cols) if len(ct) and ct[c].to_numpy().any()]
    palette = category_palette(cats)
    st = an.stages
    names = [str(s) for s in st["name"]] if len(st) else []
    start = x_all[st["start_row"].to_numpy()] if len(st) else np.empty(0)
    end_rows = np.minimum(st["end_row"].to_numpy(), n - 1) if len(st) else np.empty(0, np.int64)
    end = x_all[end_rows] if len(st) else np.empty(0)
    spans = _stage_spans(names, start, end)
    spal = stage_palette(s["group"] for s in spans)
    for s in spans:
        s["color"] = spal[s["group"]]
    pi = rep.peak_index
    peak = doc["peak"]
    oom_rows = np.flatnonzero(ev["action"].to_numpy() == A_OOM) if n else np.empty(0, np.int64)
    return {
        "title": f"{_short(an.run.source)}: peak {fmt_peak_bound(peak)}{fmt_bytes(peak['allocated_bytes'])} allocated in {peak['stage']}, "
        f"{fmt_bytes(peak['reserved_bytes'])} reserved" + (f", CUDA OOM ×{len(oom_rows)}" if len(oom_rows) else ""),
        "ooms": {"x": x_all[oom_rows], "bytes": ev["allocated"].to_numpy()[oom_rows] if n else np.empty(0)},
        "x_label": "time since the first recorded event (s)" if has_time else "event index",
        "x": x_all[rows],
        "allocated": ev["allocated"].to_numpy()[rows] if n else np.empty(0),
        "reserved": ev["reserved"].to_numpy()[rows] if n else np.empty(0),
        "categories": [{"name": c, "color": palette[c], "bytes": ct[c].to_numpy(np.float64)} for c in cats],
        "spans": spans,
        "peak": {
            "x": float(x_all[pi]) if pi >= 0 and n else 0.0,
            "bytes": int(rep.peak_allocated),
            "stage": str(peak["stage"]),
        },
        "truncated": bool(rep.truncated),
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


def _figure() -> tuple[Any, Any]:
    # A bare Figure renders through Agg/SVG canvases without pyplot, so the user's
    # backend (a notebook's inline one) and pyplot's global state are left alone.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    ax = fig.add_subplot(1, 1, 1)
    return fig, ax


def _save(fig: Any, fmt: str) -> bytes:
    buf = io.BytesIO()
    # metadata: no creation date, so the same input gives the same bytes
    meta = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
    return buf.getvalue()


def _gib_axis(ax: Any, y_top: float) -> None:
    ax.set_ylim(0, max(y_top, 1.0) * 1.12 / GIB)
    ax.set_ylabel("GiB")
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _shade_stages(ax: Any, spans: list[dict[str, Any]]) -> None:
    """Stage spans shaded in alternating strengths, each named above the plot (×N for steps)."""
    for k, s in enumerate(spans):
        ax.axvspan(s["start"], s["end"], color=s["color"], alpha=0.10 if k % 2 else 0.17, linewidth=0)
        label = s["group"] + (f" ×{s['steps']}" if s["steps"] > 1 else "")
        ax.text(
            (s["start"] + s["end"]) / 2,
            1.0,
            label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7.5,
            color="#444444",
            clip_on=False,
        )


def render_timeline_picture(an: Analysis, doc: dict[str, Any], fmt: str = "png") -> bytes:
    """One run's timeline as PNG or SVG bytes (see module doc)."""
    return draw_timeline(picture_data(an, doc), fmt)


def draw_timeline(d: dict[str, Any], fmt: str = "png") -> bytes:
    fig, ax = _figure()
    x = d["x"]
    y_top = float(max(d["reserved"].max(initial=0), d["peak"]["bytes"]))
    _gib_axis(ax, y_top)
    if len(x):
        ax.set_xlim(float(x[0]), float(x[-1]) if x[-1] > x[0] else float(x[0]) + 1)
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
    ax.step(x, d["reserved"] / GIB, where="post", color=RESERVED_COLOR, linewidth=1.0, linestyle="--", label="reserved")
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
    )  # no legend entry: the annotation names it
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
    lo, hi = ax.get_xlim()
    right = p["x"] > (lo + hi) / 2  # keep the label inside the axes
    ax.annotate(
        f"peak {fmt_bytes(p['bytes'])}\n{p['stage']}",
        (p["x"], p["bytes"] / GIB),
        xytext=(-10 if right else 10, -4),
        textcoords="offset points",
        fontsize=8,
        color=PEAK_COLOR,
        va="top",
        ha="right" if right else "left",
    )
    ax.set_xlabel(d["x_label"] + (" — history wrapped: recorded window only" if d["truncated"] else ""), fontsize=8)
    ax.tick_params(labelsize=8)
    fig.suptitle(d["title"], fontsize=10.5, x=0.01, ha="left")
    ax.legend(loc="upper left", fontsize=7, ncol=3, framealpha=0.85)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, fmt)


# ---------------------------------------------------------------- compare


def compare_picture_data(cmp: Comparison, doc: dict[str, Any]) -> dict[str, Any]:
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


def render_compare_picture(cmp: Comparison, doc: dict[str, Any], fmt: str = "png") -> bytes:
    return draw_compare(compare_picture_data(cmp, doc), fmt)


def draw_compare(d: dict[str, Any], fmt: str = "png") -> bytes:
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
    fig.suptitle(d["title"], fontsize=10.5, x=0.01, ha="left")
    ax.legend(loc="upper left", fontsize=7.5, framealpha=0.85)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, fmt)
