"""Advice for training runs, each with the saving estimated from this run's own categories.

Every phase interval's peak (``forward/<i>``, ``backward/<i>``, ``optimizer/<i>``, ``zero_grad/<i>``)
is split into the categories live at that instant (the allocation table's one column,
:func:`snapviz.analyses.categories.live_by_category`). A technique removes (or adds) bytes of some categories in some phases; the run's
new peak is the highest phase peak after that, so an estimate knows when the peak moves to another
phase (8-bit AdamW moves it from the optimizer step to the forward) or does not move at all
(checkpointing under full fine-tuning, whose peak is the optimizer step). What each technique does
to the categories (docs/training.md, where each estimate is compared with its twin sample):

* gradient checkpointing: the activations saved for backward go (block inputs stay: an upper bound);
* 8-bit AdamW: Adam's two moments (8 bytes a parameter in fp32) become 2 bytes: 3/4 of the state;
* LoRA: gradients (with DDP's buckets and FSDP's reduce-scatter buffers of them), optimizer state
  and foreach temporaries of the frozen weights go, and the frozen base is cast to half precision
  (fp32 weights, FSDP's shards included, halve; autocast's weight copies go);
* ``zero_grad(set_to_none=True)``: the gradients kept through forward and backward go;
* AMP (fp32 runs): saved activations halve, autocast adds a half-size copy of the weights;
* pure bf16 weights (AMP runs): weights, gradients (and DDP's buckets), state and optimizer
  temporaries halve, the autocast copies go;
* gradient accumulation (micro-batch ``b / K``): saved activations shrink to ``1/K``, but the
  gradients then stay live through every micro-batch's forward;
* fused AdamW (or foreach off): the optimizer step's temporaries go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from snapviz.analyses.categories import live_by_category
from snapviz.analyses.document import TrainingAdvice
from snapviz.category_vocab import (
    ACTIVATION,
    AUTOCAST_COPIES,
    DDP_BUCKETS,
    FSDP_REDUCE,
    FSDP_SHARDED,
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    TEMPORARY,
)
from snapviz.units import fmt_bytes
from snapviz.vocab import stage_group

TRAIN_PHASES = ("forward", "backward", "optimizer", "zero_grad")
PARAMS, GRADS, STATE = PARAMETER, GRADIENT, OPTIMIZER_STATE
SAVED, CASTS, TEMPS = ACTIVATION, AUTOCAST_COPIES, TEMPORARY


@dataclass(frozen=True)
class PhasePeak:
    """One phase interval's peak and the categories live at it (allocator blocks)."""

    name: str
    group: str
    peak: int
    cats: dict[str, int]

    def __getitem__(self, category: str) -> int:
        return self.cats.get(category, 0)

    @property
    def weights(self) -> int:
        """The parameters this rank holds: ``parameter`` and FSDP's shards of them."""
        return self[PARAMS] + self[FSDP_SHARDED]

    @property
    def gradient_copies(self) -> int:
        """What data parallelism keeps of the gradients beside them: DDP's buckets, FSDP's
        reduce-scatter buffers (they scale with what is trained, as the gradients do)."""
        return self[DDP_BUCKETS] + self[FSDP_REDUCE]


def phase_peaks(stages: pd.DataFrame, allocs: pd.DataFrame) -> list[PhasePeak]:
    """Training phase intervals of ``stages`` (in order) with the categories live at each one's
    peak (``allocs``: the allocation table, :func:`snapviz.analyses.categories.allocation_table`)."""
    return [
        PhasePeak(
            str(st.name),
            str(st.group),
            int(st.peak_allocated_bytes),
            live_by_category(allocs, int(st.peak_row)),
        )
        for st in stages.itertuples(index=False)
        if st.group in TRAIN_PHASES
    ]


@dataclass(frozen=True)
class Estimate:
    """A technique's effect on this run: the run's peak after it, and the saving per phase group."""

    technique: str
    new_peak: int
    saving: int  # the run's peak minus new_peak (negative: it would grow)
    phase_savings: dict[str, int]  # largest saving at a phase peak, per phase group
    new_peak_phase: str = ""  # the phase group that would hold the peak after it


def estimate(phases: list[PhasePeak], technique: str, cut: Callable[[PhasePeak], float]) -> Estimate:
    """The run's peak after removing ``cut(phase)`` bytes at every phase peak."""
    old = max(p.peak for p in phases)
    after = [(p, p.peak - int(cut(p))) for p in phases]
    top, new = max(after, key=lambda pa: pa[1])
    by_group: dict[str, int] = {}
    for p, a in after:
        by_group[p.group] = max(by_group.get(p.group, 0), p.peak - a)
    return Estimate(technique, new, old - new, by_group, top.group)


def _most(phases: list[PhasePeak], category: str) -> int:
    return max((p[category] for p in phases), default=0)


def _split(run: dict[str, Any] | None) -> tuple[int, int]:
    """The run's micro-batch (0: unknown) and the accumulation factor K to advise: micro-batches
    of one image (K = micro-batch), or halving when the batch is unknown."""
    train = (run or {}).get("train") or {}
    micro = int(train.get("micro_batch") or (run or {}).get("batch") or 0)
    return micro, (micro if micro > 1 else 2)


def _lora_parts(p: PhasePeak, fp32_weights: bool) -> dict[str, float]:
    """What LoRA removes at ``p``'s peak, by what it is (the words of its ``why``)."""
    return {
        "gradients": p[GRADS],
        "optimizer state": p[STATE],
        "step temporaries": p[TEMPS] if p.group == "optimizer" else 0,  # the foreach lists
        "gradient buckets": p.gradient_copies,
        "half the fp32 base": p.weights / 2 if fp32_weights else 0,
        "autocast copies": p[CASTS],
    }


def training_estimates(phases: list[PhasePeak], run: dict[str, Any] | None = None) -> dict[str, Estimate]:
    """Every technique's estimate for this run (whether it applies is :func:`advise_training`'s call).

    ``run`` (run.json) gives the micro-batch for accumulation (see :func:`_split`)."""
    if not phases:
        return {}
    _, k = _split(run)
    grads = _most(phases, GRADS)
    fwd_bwd = ("forward", "backward")
    fp32_weights = _most(phases, CASTS) > 0  # autocast copies weights that are not already half

    def lora(p: PhasePeak) -> float:
        return sum(_lora_parts(p, fp32_weights).values())

    cuts: dict[str, Callable[[PhasePeak], float]] = {
        "checkpointing": lambda p: p[SAVED],
        "adamw8bit": lambda p: 0.75 * p[STATE],
        "lora": lora,
        "set_to_none": lambda p: p[GRADS] if p.group in fwd_bwd else 0,
        "amp": lambda p: (p[SAVED] - p[PARAMS]) / 2 if p.group in fwd_bwd else 0,
        "bf16": lambda p: (
            (p.weights + p[GRADS] + p[DDP_BUCKETS] + p[STATE] + (p[TEMPS] if p.group == "optimizer" else 0)) / 2
            + p[CASTS]
        ),
        "accumulation": lambda p: (p[SAVED] * (1 - 1 / k) - (grads - p[GRADS])) if p.group in fwd_bwd else 0,
        "fused": lambda p: p[TEMPS] if p.group == "optimizer" else 0,
    }
    return {name: estimate(phases, name, cut) for name, cut in cuts.items()}


# How to apply a technique, in the API of the framework the frames show (``framework`` of
# :func:`snapviz.analyses.training.framework`); plain PyTorch otherwise. Model-agnostic wording:
# a diffusers UNet is named only when the frames are diffusers'.
_CHECKPOINTING = {
    "diffusers": "unet.enable_gradient_checkpointing()  (torch.utils.checkpoint per block; about one extra "
    "forward of compute)",
    "transformers": "model.gradient_checkpointing_enable()  (torch.utils.checkpoint per layer; about one extra "
    "forward of compute)",
    "torch": "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) around each block of the "
    "model (about one extra forward of compute)",
}
_LORA = {
    "diffusers": 'peft: unet.add_adapter(LoraConfig(r=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"])) '
    "with the base frozen in fp16/bf16",
    "transformers": "peft: model = get_peft_model(model, LoraConfig(r=16, target_modules=...))  with the base "
    "frozen in fp16/bf16 (fine-tuning only: the base weights do not train)",
    "torch": "low-rank adapters (peft's LoraConfig, or your own) on the large linear layers, the base weights "
    "frozen (requires_grad_(False)) in fp16/bf16 (fine-tuning only: the base weights do not train)",
}
_HOW = {
    "adamw8bit": "bitsandbytes.optim.AdamW8bit(params, lr=...)  (or transformers' Adafactor: no first moment, "
    "factored second)",
    "set_to_none": "optimizer.zero_grad(set_to_none=True)  (the default since torch 2.0)",
    "amp": 'with torch.autocast("cuda", dtype=torch.bfloat16): loss = ...  (fp16: with a GradScaler)',
    "bf16": "model.to(torch.bfloat16) and an optimizer that keeps bf16 state (no fp32 master copy; "
    "stochastic rounding or Kahan summation help)",
    "accumulation": "micro-batch {micro}, loss / {k}, optimizer.step() every {k} micro-batches",
    "fused": "torch.optim.AdamW(params, fused=True)  (or foreach=False: no lists of temporaries, slower)",
}
_BY_FRAMEWORK = {"checkpointing": _CHECKPOINTING, "lora": _LORA}


def how_to(technique: str, framework: str = "torch") -> str:
    """The ``how`` of a technique in ``framework``'s API (``diffusers``, ``transformers``, else torch)."""
    table = _BY_FRAMEWORK.get(technique)
    return _HOW[technique] if table is None else table.get(framework, table["torch"])


_NAMES = {
    "checkpointing": "gradient checkpointing",
    "adamw8bit": "8-bit AdamW / Adafactor",
    "lora": "LoRA",
    "set_to_none": "zero_grad(set_to_none=True)",
    "amp": "mixed precision (AMP bf16/fp16)",
    "bf16": "pure bf16 weights",
    "accumulation": "gradient accumulation (smaller micro-batch)",
    "fused": "fused AdamW",
}


def _applies(phases: list[PhasePeak], run: dict[str, Any] | None) -> dict[str, bool]:
    """Which techniques this run could still adopt: run.json's ``train`` block says what it used;
    without it, the categories say what they can (precision is not visible in them)."""
    train = (run or {}).get("train") or {}
    known = bool(train)
    opt = str(train.get("optimizer") or "")
    grads, state, params = _most(phases, GRADS), _most(phases, STATE), max((p.weights for p in phases), default=0)
    casts = _most(phases, CASTS)
    opt_temps = max((p[TEMPS] for p in phases if p.group == "optimizer"), default=0)
    after_step = [
        p for i, p in enumerate(phases) if p.group == "forward" and any(q.group == "optimizer" for q in phases[:i])
    ]
    kept = bool(after_step) and all(p[GRADS] > 0 for p in after_step)
    micro, _ = _split(run)
    return {
        "checkpointing": _most(phases, SAVED) > 0 and not train.get("checkpointing"),
        "adamw8bit": state >= 1.5 * grads > 0 and opt not in ("adamw8bit", "adafactor", "sgd"),
        "lora": grads > 0 and (int(train.get("lora_rank") or 0) == 0 if known else grads >= 0.5 * params),
        "set_to_none": (train.get("set_to_none") is False) if known else kept,
        "amp": train.get("precision") == "fp32",
        "bf16": casts > 0,
        "accumulation": _most(phases, SAVED) > 0 and micro != 1,
        "fused": opt_temps > 0 and opt not in ("adamw-fused", "adamw-loop", "adamw8bit", "sgd"),
    }


def _why(name: str, e: Estimate, peak_phase: str, phases: list[PhasePeak], k: int) -> str:
    """What the estimate rests on, in this run's numbers. The saving is the run's peak minus the
    highest phase peak after the technique, so where that lands in another phase the text says
    which: the parts it names add up to the cut at the run's peak, not to the saving."""
    elsewhere = f" (in {e.new_peak_phase})" if e.new_peak_phase and e.new_peak_phase != peak_phase else ""
    moved = f"; the peak would be {fmt_bytes(e.new_peak)}{elsewhere}" if e.saving > 0 else ""
    best_group = max(e.phase_savings, key=lambda g: e.phase_savings[g])
    if e.saving <= 0:
        head = (
            f"cuts the {best_group} peak by {fmt_bytes(e.phase_savings[best_group])}, but the run's peak is "
            f"{peak_phase}, which it does not touch"
        )
    else:
        head = f"saves {fmt_bytes(e.saving)} of the run's peak ({peak_phase})"
    basis = {
        "checkpointing": f"{fmt_bytes(_most(phases, SAVED))} of activations are saved for backward",
        "adamw8bit": f"Adam's moments are {fmt_bytes(_most(phases, STATE))}; 8-bit states keep a quarter",
        "lora": _lora_basis(phases, peak_phase),
        "set_to_none": f"{fmt_bytes(_most(phases, GRADS))} of zeroed gradients live through forward and backward",
        "amp": f"activations saved for backward ({fmt_bytes(_most(phases, SAVED))}) halve; autocast adds "
        "half-size weight copies",
        "bf16": f"fp32 weights, gradients{' (with their DDP buckets)' if _most(phases, DDP_BUCKETS) else ''} and "
        f"state halve and {fmt_bytes(_most(phases, CASTS))} of autocast copies go",
        "accumulation": f"saved activations shrink to 1/{k}, but the gradients stay live across micro-batches",
        "fused": "the foreach step's temporary lists "
        f"({fmt_bytes(max((p[TEMPS] for p in phases if p.group == 'optimizer'), default=0))}) go",
    }[name]
    return f"{head}: {basis}{moved}"


def _lora_basis(phases: list[PhasePeak], peak_phase: str) -> str:
    """LoRA's cut at the run's peak, part by part (they add up to it)."""
    top = max(phases, key=lambda p: p.peak)
    parts = {k: v for k, v in _lora_parts(top, _most(phases, CASTS) > 0).items() if v >= 1}
    said = ", ".join(f"{k} {fmt_bytes(int(v))}" for k, v in parts.items())
    total = fmt_bytes(int(sum(parts.values())))
    return f"at that peak the frozen weights' {said} go ({total})" if parts else "nothing to freeze"


def advise_training(
    phases: list[PhasePeak], run: dict[str, Any] | None = None, framework: str = "torch"
) -> list[TrainingAdvice]:
    """Training advice, largest saving first, as the summary's ``advice`` entries (``kind:
    "training"``, ``estimated_peak_bytes``, ``phase_savings_bytes``). A technique is listed when
    the run could adopt it and it saves at least 5% at the run's peak or at one phase's peak;
    ``how`` names ``framework``'s API (:func:`how_to`)."""
    if not phases:
        return []
    ests = training_estimates(phases, run)
    applies = _applies(phases, run)
    peak = max(p.peak for p in phases)
    peak_phase = stage_group(max(phases, key=lambda p: p.peak).name)
    micro, k = _split(run)
    kept = [
        e for name, e in ests.items() if applies[name] and max(max(e.phase_savings.values()), e.saving) >= 0.05 * peak
    ]
    kept.sort(key=lambda e: (-e.saving, -max(e.phase_savings.values())))
    return [
        TrainingAdvice(
            technique=_NAMES[e.technique],
            kind="training",
            why=_why(e.technique, e, peak_phase, phases, k),
            saves_up_to_bytes=int(max(e.saving, 0)),
            estimated_peak_bytes=int(e.new_peak),
            phase_savings_bytes={str(g): int(v) for g, v in e.phase_savings.items()},
            how=how_to(e.technique, framework).format(micro=max(micro // k, 1) if micro else f"batch/{k}", k=k),
        )
        for e in kept
    ]
