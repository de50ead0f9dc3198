"""The training view of one analysed run: phases, per-step peaks and the categories over time.

Built only when the stages are training phases (a ``backward`` or an ``optimizer`` stage, from
labels, profiler ranges or frames). Pure tables for the summary (``training`` block), the
Markdown "per step" table and the HTML phase bands; nothing here renders.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.training import TRAINING_CATEGORIES, classify_allocations, framework
from snapviz.analyses.training_advice import PEAK_CATEGORIES, PhasePeak, phase_peaks
from snapviz.model import Snapshot
from snapviz.vocab import BEFORE_RECORDING, stage_group

if TYPE_CHECKING:  # report_view imports this module
    from snapviz.analyses.report_view import CategoryTimelineView

_STEP_STARTERS = ("forward", "backward")
_STEP_ENDERS = ("optimizer", "zero_grad")


@dataclass
class TrainingView:
    """Every allocation's category, each phase interval's peak split by category, and per step
    (an optimizer step with its micro-batches) the highest phase peak."""

    allocs: pd.DataFrame  # classify_allocations
    phases: list[PhasePeak]  # training phase intervals, in order
    steps: pd.DataFrame  # step, phase (the peak's interval), peak_allocated_bytes, <category>...
    framework: str = "torch"  # diffusers | transformers | torch: whose API the advice names


def phase_steps(phases: list[PhasePeak]) -> list[int]:
    """The optimizer step each phase interval belongs to: a forward or backward after an
    optimizer or zero_grad phase starts the next step (labels number micro-batches and steps
    apart, so the step is counted here, not read from the label)."""
    out, step, ended = [], 0, False
    for p in phases:
        if p.group in _STEP_STARTERS and ended:
            step, ended = step + 1, False
        ended = ended or p.group in _STEP_ENDERS
        out.append(step)
    return out


def step_table(phases: list[PhasePeak]) -> pd.DataFrame:
    """Per optimizer step: the phase interval holding its peak and what that peak is made of."""
    best: dict[int, PhasePeak] = {}
    for step, p in zip(phase_steps(phases), phases, strict=True):
        if step not in best or p.peak > best[step].peak:
            best[step] = p
    rows = [
        {"step": step, "phase": p.name, "peak_allocated_bytes": p.peak, **{c: p[c] for c in PEAK_CATEGORIES}}
        for step, p in best.items()
    ]
    return pd.DataFrame(rows, columns=["step", "phase", "peak_allocated_bytes", *PEAK_CATEGORIES])


def training_view(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, stages: pd.DataFrame) -> TrainingView | None:
    """The view, or None when the stages are not training phases."""
    if not len(stages) or not set(stages["group"]) & {"backward", "optimizer"}:
        return None
    allocs = classify_allocations(snap, rep, labels)
    phases = phase_peaks(stages, allocs)
    ev = rep.events
    trained = ev["stack_id"].to_numpy()[allocs["row"].to_numpy()[allocs["born"].map(stage_group).isin(_STEP_STARTERS)]]
    return TrainingView(allocs, phases, step_table(phases), framework(snap, trained))


def training_category_timeline(allocs: pd.DataFrame, n_events: int) -> pd.DataFrame:
    """Allocator bytes live in each training category after every event (one column per category,
    one row per event): the stacked areas under the phase bands."""
    out = {}
    for cat in TRAINING_CATEGORIES:
        a = allocs[allocs["category"] == cat]
        delta = np.zeros(n_events + 1, np.int64)
        np.add.at(delta, a["row"].to_numpy(), a["block_size"].to_numpy())
        freed = a["free_row"].to_numpy() < n_events
        np.subtract.at(delta, a["free_row"].to_numpy()[freed], a["block_size"].to_numpy()[freed])
        out[cat] = np.cumsum(delta[:n_events])
    return pd.DataFrame(out, columns=list(TRAINING_CATEGORIES))


def training_timeline_view(view: TrainingView, base: CategoryTimelineView) -> CategoryTimelineView:
    """``base`` (:func:`snapviz.analyses.report_view.category_timeline_view`'s sampled rows) with the
    training categories stacked instead, so the report's area under the phase bands shows parameters,
    gradients, optimizer state, saved activations... Memory from before the recording, which no
    recorded allocation explains, is ``before recording``."""
    rows = np.asarray(base.index, np.int64)
    if not len(rows):
        return base
    tl = training_category_timeline(view.allocs, int(rows.max()) + 1)
    by = {c: tl[c].to_numpy(np.float64)[rows] for c in TRAINING_CATEGORIES}
    rest = np.asarray(base.allocated, np.float64) - np.sum(list(by.values()), axis=0)
    by = {BEFORE_RECORDING: np.maximum(rest, 0.0), **by}
    cats = [c for c, v in by.items() if v.any()]
    return replace(base, categories=cats, bytes={c: by[c] for c in cats}, note=f"training categories · {base.note}")


def training_dict(view: TrainingView) -> dict[str, object]:
    """The summary's ``training`` block: per phase interval and per step, the peak and the
    training categories live at it (allocator blocks)."""
    steps = phase_steps(view.phases)
    return {
        "categories": list(PEAK_CATEGORIES),
        "phases": [
            {
                "name": p.name,
                "step": s,
                "peak_allocated_bytes": p.peak,
                "categories_at_peak": {c: p[c] for c in PEAK_CATEGORIES},
            }
            for s, p in zip(steps, view.phases, strict=True)
        ],
        "steps": [
            {
                "step": int(r["step"]),
                "peak_phase": str(r["phase"]),
                "peak_allocated_bytes": int(r["peak_allocated_bytes"]),
                "categories_at_peak": {c: int(r[c]) for c in PEAK_CATEGORIES},
            }
            for r in view.steps.to_dict("records")
        ],
    }
