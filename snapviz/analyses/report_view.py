"""What the reports draw that takes computing: categories over time, and bytes by category
at each stage interval's own peak. Plain arrays and DataFrames; renderers only draw them.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.categories import category_timeline
from snapviz.analyses.summary import Analysis
from snapviz.vocab import BEFORE_RECORDING

# Stacking order (bottom/left first): what was there before, then what persists across
# stages, then what each stage adds. The same order and colors in every category view.
CATEGORY_ORDER: tuple[str, ...] = (BEFORE_RECORDING, "weights", "latents & embeddings", "activations",
                                   "attention scores", "vae buffers", "gradients & optimizer", "unknown")
MAX_STAGE_BARS = 150
# The category area is a summary under the exact timeline: fewer points keep the page small.
MAX_CATEGORY_POINTS = 10000


def order_categories(names: Iterable[str]) -> list[str]:
    """``names`` in :data:`CATEGORY_ORDER`, then any other (user rule) category in first-seen order."""
    got = list(dict.fromkeys(str(x) for x in names))
    return [c for c in CATEGORY_ORDER if c in got] + [c for c in got if c not in CATEGORY_ORDER]


def shown_intervals(stages: pd.DataFrame) -> np.ndarray:
    """Stage intervals that get a bar: all of them, or past MAX_STAGE_BARS the peak
    interval of each stage (the same bars as the collapsed peak-by-stage chart)."""
    st = stages
    if len(st) <= MAX_STAGE_BARS:
        return np.arange(len(st), dtype=np.int64)
    peak = st["peak_allocated_bytes"].to_numpy(np.int64)
    order = pd.Series(np.arange(len(st))).groupby(st["group"].to_numpy(), sort=False)
    return np.array([int(ix.to_numpy()[np.argmax(peak[ix.to_numpy()])]) for _, ix in order], np.int64)


def stage_category_bytes(stages: pd.DataFrame, stage_live: pd.DataFrame | None, shown: np.ndarray) -> dict[str, np.ndarray]:
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


def category_timeline_view(an: Analysis, t0_us: int, has_time: bool, max_points: int) -> dict[str, Any]:
    """Live bytes by category over time, on category_timeline's own (min/max) sampling.

    ``time_s`` is seconds since ``t0_us`` (NaN without timestamps); ``categories`` are the
    non-empty ones in stacking order, ``bytes`` their columns.
    """
    n = len(an.replay.events)
    empty = {"index": np.empty(0, np.int64), "time_s": np.empty(0), "allocated": np.empty(0),
             "categories": [], "bytes": {}, "total": 0, "note": ""}
    if not n:
        return empty
    ct = category_timeline(an.snapshot, an.replay, an.labels.labels,
                           max_points=max(2, min(max_points, MAX_CATEGORY_POINTS)), rules=an.rules, tables=an.tables)
    fixed = {"row", "time_us", "stage", "allocated"}
    cats = [c for c in order_categories(c for c in ct.columns if c not in fixed) if ct[c].to_numpy().any()]
    rows = ct["row"].to_numpy(np.int64)
    time_s = (ct["time_us"].to_numpy(np.int64) - t0_us) / 1e6 if has_time else np.full(len(rows), np.nan)
    shown = len(rows)
    return {"index": rows, "time_s": time_s, "allocated": ct["allocated"].to_numpy(np.float64),
            "categories": cats,
            "bytes": {c: ct[c].to_numpy(np.float64) for c in cats}, "total": n,
            "note": (f"sampled at {shown:,} of {n:,} events (min/max of allocated per bucket, peak kept)"
                     if shown < n else f"all {n:,} events")}
