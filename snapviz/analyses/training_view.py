"""The training view of one analysed run: phases, per-step peaks and the categories at each.

Built only when the stages are training phases (a ``backward`` or an ``optimizer`` stage, from
labels, profiler ranges or frames). Pure tables for the summary (``training`` block), the
Markdown "per step" table and the HTML phase bands; nothing here renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from snapviz.analyses.categories import TRAINING_GROUPS
from snapviz.analyses.document import Training, TrainingPhase, TrainingStep
from snapviz.analyses.training import framework
from snapviz.analyses.training_advice import PhasePeak, phase_peaks
from snapviz.category_vocab import order_categories
from snapviz.model import Snapshot
from snapviz.vocab import BEFORE_RECORDING

_STEP_STARTERS = ("forward", "backward")
_STEP_ENDERS = ("optimizer", "zero_grad")


@dataclass
class TrainingView:
    """Each phase interval's peak split by category (the allocation table's one column), and
    per step (an optimizer step with its micro-batches) the highest phase peak."""

    phases: list[PhasePeak]  # training phase intervals, in order
    steps: pd.DataFrame  # step, phase (the peak's interval), peak_allocated_bytes, <category>...
    categories: tuple[str, ...]  # the categories live at some phase peak, in the vocabulary's order
    framework: str = "torch"  # diffusers | transformers | torch: whose API the advice names


def phase_categories(phases: list[PhasePeak]) -> tuple[str, ...]:
    """Categories live at some phase peak, stacking order (``before recording`` first: the part
    of a phase's peak no recorded allocation explains), then any a rule names."""
    names = list(dict.fromkeys(c for p in phases for c, b in _at_peak(p).items() if b))
    return tuple(order_categories(names))


def _at_peak(p: PhasePeak) -> dict[str, int]:
    """The phase's categories with ``before recording`` (its peak minus them): they add up to the peak."""
    rest = p.peak - sum(p.cats.values())
    return {BEFORE_RECORDING: max(rest, 0), **p.cats}


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


def step_table(phases: list[PhasePeak], cats: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Per optimizer step: the phase interval holding its peak and what that peak is made of
    (``cats``, default :func:`phase_categories`)."""
    cats = cats if cats is not None else phase_categories(phases)
    best: dict[int, PhasePeak] = {}
    for step, p in zip(phase_steps(phases), phases, strict=True):
        if step not in best or p.peak > best[step].peak:
            best[step] = p
    rows = [
        {"step": step, "phase": p.name, "peak_allocated_bytes": p.peak, **{c: _at_peak(p).get(c, 0) for c in cats}}
        for step, p in best.items()
    ]
    return pd.DataFrame(rows, columns=["step", "phase", "peak_allocated_bytes", *cats])


def training_view(allocs: pd.DataFrame, stages: pd.DataFrame, snap: Snapshot | None = None) -> TrainingView | None:
    """The view of the allocation table (:func:`snapviz.analyses.categories.allocation_table`),
    or None when the stages are not training phases. ``snap`` (its frames) says which framework
    the forward and backward allocations ran through, for the advice's wording."""
    if not len(stages) or not set(stages["group"]) & TRAINING_GROUPS:
        return None
    phases = phase_peaks(stages, allocs)
    cats = phase_categories(phases)
    fw = "torch"
    if snap is not None:
        fw = framework(snap, allocs["stack_id"].to_numpy()[allocs["phase"].isin(_STEP_STARTERS).to_numpy()])
    return TrainingView(phases, step_table(phases, cats), cats, fw)


def training_dict(view: TrainingView) -> Training:
    """The summary's ``training`` section: per phase interval and per step, the peak and the
    categories live at it (allocator blocks, ``before recording`` included: they add up to it)."""
    steps = phase_steps(view.phases)
    cats = view.categories
    return Training(
        categories=[str(c) for c in cats],
        phases=[
            TrainingPhase(
                name=str(p.name),
                step=int(s),
                peak_allocated_bytes=int(p.peak),
                categories_at_peak={str(c): int(_at_peak(p).get(c, 0)) for c in cats},
            )
            for s, p in zip(steps, view.phases, strict=True)
        ],
        steps=[
            TrainingStep(
                step=int(r["step"]),
                peak_phase=str(r["phase"]),
                peak_allocated_bytes=int(r["peak_allocated_bytes"]),
                categories_at_peak={str(c): int(r[c]) for c in cats},
            )
            for r in view.steps.to_dict("records")
        ],
    )
