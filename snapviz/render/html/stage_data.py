"""The stage pieces of the snapshot report's view-model: bands on the timeline, peak per
stage, bytes by category at each stage's peak, and the blocks each stage added."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import Absent, Summary
from snapviz.analyses.report_view import MAX_STAGE_BARS, ReportView
from snapviz.render.html.view_common import StackTable, unique_labels
from snapviz.render.html.view_models import Bands, StageBars, StageBreakdown, StageTop
from snapviz.units import fmt_bytes
from snapviz.vocab import stage_group, stage_step

MAX_STAGE_TOP_ROWS = 600


def band_alpha(names: Sequence[str]) -> list[float]:
    """Alternate the shade of consecutive steps so step boundaries show."""
    return [0.22 if (stage_step(x) or 0) % 2 else 0.13 for x in names]


def stage_bands(
    names: Sequence[str],
    start_row: np.ndarray,
    end_row: np.ndarray,
    time_s: np.ndarray,
    has_time: bool,
    palette: dict[str, str],
) -> Bands:
    n = len(time_s)
    names = [str(x) for x in names]
    start_index = np.asarray(start_row, np.int64)
    end_index = np.asarray(end_row, np.int64)
    if has_time and n:
        start_s = time_s[np.clip(start_index, 0, n - 1)]
        end_s = np.where(end_index < n, time_s[np.clip(end_index, 0, n - 1)], time_s[n - 1])
    else:
        start_s = end_s = np.full(len(names), np.nan)
    return Bands(
        name=names,
        group=[stage_group(x) for x in names],
        color=[palette[x] for x in names],
        alpha=band_alpha(names),
        start_s=start_s,
        end_s=end_s,
        start_index=start_index,
        end_index=end_index,
    )


def stage_bars(an: Analysis, summary: Summary, palette: dict[str, str]) -> StageBars:
    st = an.stages
    truth: dict[tuple[str, int], int | None] = {}  # run.json's peak of each interval, where it has one
    for group in summary.stages:
        for it in group.intervals:
            peak = it.allocator_peak_allocated_bytes
            truth[(it.name, it.start_us)] = None if isinstance(peak, Absent) else peak
    if len(st) > MAX_STAGE_BARS:
        g = an.stage_groups()
        names = [str(x) for x in g["name"]]
        return StageBars(
            label=names,
            name=names,
            group=names,
            color=[palette.get(x, "#999999") for x in names],
            peak_allocated=g["peak_allocated_bytes"].to_numpy(np.float64),
            peak_reserved=g["peak_reserved_bytes"].to_numpy(np.float64),
            allocator_peak=np.full(len(g), np.nan),
            duration_s=g["duration_s"].to_numpy(np.float64),
            note=f"{len(st):,} stage intervals: showing one bar per stage (peak over its intervals)",
        )
    names = [str(x) for x in st["name"]]
    got = [truth.get((x, int(s))) for x, s in zip(names, st["start_us"], strict=False)]
    ap = np.array([float(t) if isinstance(t, (int, float)) else np.nan for t in got], np.float64)
    return StageBars(
        label=unique_labels(names),
        name=names,
        group=[stage_group(x) for x in names],
        color=[palette[x] for x in names],
        peak_allocated=st["peak_allocated_bytes"].to_numpy(np.float64),
        peak_reserved=st["peak_reserved_bytes"].to_numpy(np.float64),
        allocator_peak=ap,
        duration_s=st["duration_s"].to_numpy(np.float64),
    )


def stage_breakdown(an: Analysis, view: ReportView, bars: StageBars, colors: dict[str, str]) -> StageBreakdown:
    """Bytes by category at each stage interval's own peak: one stacked bar per interval
    (each bar adds up to the interval's peak allocated: see ``stage_category_bytes``)."""
    st = an.stages
    shown = view.shown_intervals
    collapsed = len(shown) != len(st)
    totals = st["peak_allocated_bytes"].to_numpy(np.float64)[shown] if len(st) else np.empty(0)
    by = view.stage_category_bytes
    cats = list(by)
    share = {c: np.divide(by[c], totals, out=np.zeros(len(totals)), where=totals > 0) for c in cats}
    top_k = np.argmax(np.vstack([by[c] for c in cats]), axis=0) if cats else np.zeros(len(shown), np.int64)
    names = [str(x) for x in st["name"].to_numpy()[shown]] if len(st) else []
    top_cat = [cats[k] for k in top_k] if cats else ["" for _ in shown]
    return StageBreakdown(
        interval=shown,
        label=[stage_group(x) for x in names] if collapsed else list(bars.label),
        name=names,
        total=totals,
        categories=cats,
        colors=[colors[c] for c in cats],
        bytes=by,
        share=share,
        top_category=top_cat,
        top_share=np.array([share[c][j] if c else 0.0 for j, c in enumerate(top_cat)]),
        allocator_peak=(
            np.asarray(bars.allocator_peak, np.float64)[shown] if not collapsed else np.full(len(shown), np.nan)
        ),
        note=f"{len(st):,} stage intervals: one bar per stage, at its highest interval's peak" if collapsed else "",
    )


def stage_top(an: Analysis, shown: np.ndarray, time_s: np.ndarray, stacks: StackTable) -> StageTop:
    """The largest blocks each shown stage interval allocated itself that were live at its peak."""
    top = an.stage_top if isinstance(an.stage_top, pd.DataFrame) else pd.DataFrame()
    if len(top):
        top = top[top["interval"].isin(shown.tolist())].head(MAX_STAGE_TOP_ROWS)
    if not len(top):
        empty = np.empty(0, np.int64)
        return StageTop(
            bytes=np.empty(0),
            size=[],
            stage=[],
            site=[],
            event_index=empty,
            time_s=np.empty(0),
            stack=np.empty(0, np.int32),
            stack_text=[],
            interval=empty,
        )
    rows = top["row"].to_numpy(np.int64)
    sids = top["stack_id"].to_numpy(np.int64)
    return StageTop(
        interval=top["interval"].to_numpy(np.int64),
        stage=[str(x) for x in top["stage"]],
        bytes=top["bytes"].to_numpy(np.float64),
        size=[fmt_bytes(b) for b in top["bytes"]],
        site=[str(x) for x in top["site"]],
        event_index=rows,
        time_s=time_s[rows] if len(time_s) else np.full(len(rows), np.nan),
        stack=stacks.add_many(sids),
        stack_text=[an.sites.stack_text(int(s), limit=40) if an.sites is not None else "" for s in sids],
    )
