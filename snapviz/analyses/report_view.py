"""What the reports draw that takes computing: categories over time, and bytes by category
at each stage interval's own peak. Plain arrays and DataFrames; renderers only draw them.

:func:`report_view` runs these once per report (the HTML report's analysis step); the
view-model builders in ``render/html`` read its :class:`ReportView` and compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.categories import category_timeline
from snapviz.category_vocab import order_categories
from snapviz.vocab import BEFORE_RECORDING

MAX_STAGE_BARS = 150
# The category area is a summary under the exact timeline: fewer points keep the page small.
MAX_CATEGORY_POINTS = 10000


def shown_intervals(stages: pd.DataFrame) -> np.ndarray:
    """Stage intervals that get a bar: all of them, or past MAX_STAGE_BARS the peak
    interval of each stage (the same bars as the collapsed peak-by-stage chart)."""
    st = stages
    if len(st) <= MAX_STAGE_BARS:
        return np.arange(len(st), dtype=np.int64)
    peak = st["peak_allocated_bytes"].to_numpy(np.int64)
    order = pd.Series(np.arange(len(st))).groupby(st["group"].to_numpy(), sort=False)
    return np.array([int(ix.to_numpy()[np.argmax(peak[ix.to_numpy()])]) for _, ix in order], np.int64)


def stage_category_bytes(
    stages: pd.DataFrame, stage_live: pd.DataFrame | None, shown: np.ndarray
) -> dict[str, np.ndarray]:
    """Bytes by category at the peak of each ``shown`` stage interval, in stacking order.

    The categories cover what was allocated in the recorded history; the rest of the
    interval's peak (memory from before the recording) is ``before recording``, so each
    interval's bytes add up to its peak allocated. Categories that are zero everywhere
    are left out.
    """
    totals = stages["peak_allocated_bytes"].to_numpy(np.float64)[shown] if len(stages) else np.empty(0)
    live = stage_live if stage_live is not None else pd.DataFrame()
    by: dict[str, np.ndarray] = {}
    if len(live) and len(shown):
        pos = {int(iv): j for j, iv in enumerate(shown)}
        sel = live[live["interval"].isin(list(pos))]
        for cat, g in sel.groupby("category", sort=False):
            col = np.zeros(len(shown))
            np.add.at(col, [pos[int(i)] for i in g["interval"]], g["bytes"].to_numpy(np.float64))
            by[str(cat)] = col
    rest = totals - (np.sum(list(by.values()), axis=0) if by else 0.0)
    if len(rest) and (rest > 0).any():
        by[BEFORE_RECORDING] = by.get(BEFORE_RECORDING, 0.0) + np.maximum(rest, 0.0)
    return {c: by[c] for c in order_categories(by) if by[c].any()}


@dataclass
class CategoryTimelineView:
    """Live bytes by category over time, on category_timeline's own (min/max) sampling.

    ``time_s`` is seconds since the first event (NaN without timestamps); ``categories`` are
    the non-empty ones in stacking order, ``bytes`` their columns.
    """

    index: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    time_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    allocated: np.ndarray = field(default_factory=lambda: np.empty(0))
    categories: list[str] = field(default_factory=list)
    bytes: dict[str, np.ndarray] = field(default_factory=dict)
    total: int = 0
    note: str = ""


@dataclass
class ReportView:
    """What an HTML report of one analysis shows beyond the analysis' own tables."""

    category_timeline: CategoryTimelineView
    shown_intervals: np.ndarray  # stage intervals that get a bar
    stage_category_bytes: dict[str, np.ndarray]  # bytes by category at each shown interval's peak


def category_timeline_view(an: Analysis, t0_us: int, has_time: bool, max_points: int) -> CategoryTimelineView:
    """Live bytes by category over time (see :class:`CategoryTimelineView`)."""
    n = len(an.replay.events)
    if not n:
        return CategoryTimelineView()
    ct = category_timeline(an.replay, an.labels.labels, an.allocations, max(2, min(max_points, MAX_CATEGORY_POINTS)))
    fixed = {"row", "time_us", "stage", "allocated"}
    cats = [c for c in order_categories(c for c in ct.columns if c not in fixed) if ct[c].to_numpy().any()]
    rows = ct["row"].to_numpy(np.int64)
    time_s = (ct["time_us"].to_numpy(np.int64) - t0_us) / 1e6 if has_time else np.full(len(rows), np.nan)
    shown = len(rows)
    return CategoryTimelineView(
        index=rows,
        time_s=time_s,
        allocated=ct["allocated"].to_numpy(np.float64),
        categories=cats,
        bytes={c: ct[c].to_numpy(np.float64) for c in cats},
        total=n,
        note=(
            f"sampled at {shown:,} of {n:,} events (min/max of allocated per bucket, peak kept)"
            if shown < n
            else f"all {n:,} events"
        ),
    )


def report_view(an: Analysis, max_points: int) -> ReportView:
    """The report's own analyses of ``an`` (an :class:`~snapviz.analyses.analysis.Analysis`)."""
    time_us = an.replay.events["time_us"].to_numpy(np.int64)
    has_time = bool(len(time_us)) and bool((time_us >= 0).all())
    t0 = int(time_us[0]) if has_time else -1
    shown = shown_intervals(an.stages)
    cat_tl = category_timeline_view(an, t0, has_time, max_points)
    return ReportView(
        category_timeline=cat_tl,
        shown_intervals=shown,
        stage_category_bytes=stage_category_bytes(an.stages, an.stage_live, shown),
    )
