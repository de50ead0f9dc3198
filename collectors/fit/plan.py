"""The fit finder's plan: cards, candidate combinations, the order they run in, and pruning.

Everything here is plain data and pure functions (no torch, no processes), so the pruning rule
is unit-tested on synthetic results. The rule, stated once (docs/fit.md says it in words):

A combination cannot fit a card when one of these was *measured* (never guessed):

1. **same combination, bigger or equal cap**: it ran out of memory under a cap at least as large;
2. **same combination, measured peak**: a run of it (under any cap) reached a peak allocated
   above this cap (``max_memory_allocated`` does not depend on the cap; an OOM run's completed
   stages give a lower bound);
3. **weights alone**: a run of it, or of a combination that differs only in techniques that do
   not change what is resident after loading (:data:`WEIGHT_NEUTRAL`), held more than the cap
   at the end of its ``load`` stage;
4. **a strictly more memory-saving combination**: a superset of its techniques, the extra ones
   all in :data:`MEMORY_SAVING`, cannot fit this cap by 1-3.

Rules 1 and 4 assume that a smaller cap only fails earlier, and that adding a memory-saving
technique never raises the peak; both are assumptions, named in every pruning reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from collectors.matrix.variants import MatrixError, Variant, parse_variant

GIB = 2**30

# Default candidates per pipeline, from the techniques issue 12 lists for these models. Names are
# the collectors' technique names (collectors/techniques.py); one that the installed collectors do
# not know is skipped with the collector's own reason, as the matrix skips a CUDA-only variant.
DEFAULT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "flux": (
        "bf16",
        "bf16,vae-tiling",
        "bf16,layerwise-fp8",
        "bf16,layerwise-fp8,vae-tiling",
        "bf16,int8",
        "bf16,nf4-transformer",
        "bf16,nf4-transformer,nf4-text-encoder",
        "bf16,nf4-transformer,nf4-text-encoder,vae-tiling",
        "bf16,group-offload",
        "bf16,group-offload,vae-tiling",
        "bf16,model-offload",
        "bf16,nf4-transformer,model-offload",
        "bf16,sequential-offload",
    ),
    "sd35": (
        "bf16",
        "bf16,vae-tiling",
        "bf16,no-t5",
        "bf16,no-t5,vae-tiling",
        "bf16,layerwise-fp8",
        "bf16,nf4-transformer",
        "bf16,nf4-transformer,nf4-text-encoder",
        "bf16,group-offload",
        "bf16,model-offload",
        "bf16,no-t5,model-offload",
        "bf16,sequential-offload",
    ),
}
DEFAULT_CARDS = ("48GiB", "24GiB", "16GiB", "12GiB")
BASELINE = "bf16"

# Techniques that lower the peak (rule 4); dtypes and attention implementations are not here.
MEMORY_SAVING = frozenset(
    {
        "vae-tiling",
        "vae-slicing",
        "tiny-vae",
        "layerwise-fp8",
        "fp8",
        "qint8",
        "qfloat8",
        "nf4-transformer",
        "nf4-text-encoder",
        "int8",
        "no-t5",
        "group-offload",
        "group-offload-leaf",
        "offload-stream",
        "model-offload",
        "sequential-offload",
        "staged",
    }
)
# Techniques that change nothing resident after the load stage (rule 3).
WEIGHT_NEUTRAL = frozenset({"vae-tiling", "vae-slicing", "sdpa"})
# Measuring order: a combination that offloads is slow to measure (every step moves weights), so
# those go last, the slowest last; within a class, more techniques first, so that a superset's
# failure can prune its subsets before they run (rule 4).
_SLOW_LAST = ("group-offload", "group-offload-leaf", "offload-stream", "model-offload", "sequential-offload")


class FitError(MatrixError):
    """A bad fit option: one line, exit 2."""


@dataclass(frozen=True)
class Card:
    label: str  # "24 GiB", as the user wrote it, normalised
    bytes: int

    @property
    def gib(self) -> float:
        return self.bytes / GIB


_UNITS = {"gib": GIB, "g": GIB, "": GIB, "gb": 10**9, "mib": 2**20, "mb": 10**6, "tib": 2**40}


def parse_card(text: str) -> Card:
    """``24GiB`` / ``24 GiB`` / ``24G`` / ``24`` (GiB) / ``24GB`` (10^9 bytes) -> Card."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise FitError(f"--gpu-memory {text!r}: give a size such as 24GiB, 16GiB or 24GB")
    n = int(float(m.group(1)) * _UNITS[unit])
    shown = {"gib": "GiB", "g": "GiB", "": "GiB", "gb": "GB", "mib": "MiB", "mb": "MB", "tib": "TiB"}[unit]
    return Card(f"{float(m.group(1)):g} {shown}", n)


def parse_cards(texts: Sequence[str]) -> list[Card]:
    """Cards largest first (a bigger card's measurements bound the smaller ones), no duplicates."""
    cards: dict[int, Card] = {}
    for t in texts or DEFAULT_CARDS:
        c = parse_card(t)
        cards.setdefault(c.bytes, c)
    return sorted(cards.values(), key=lambda c: -c.bytes)


def family(pipeline: str) -> str | None:
    """``flux-dev`` -> ``flux``, ``sd35-large`` -> ``sd35``: which default set applies."""
    return next((k for k in DEFAULT_CANDIDATES if pipeline.startswith(k)), None)


def default_candidates(pipeline: str) -> list[Variant]:
    fam = family(pipeline)
    if fam is None:
        raise FitError(f"--pipeline {pipeline}: no default candidate set (give --variant)")
    return [parse_variant(v) for v in DEFAULT_CANDIDATES[fam]]


def measuring_order(variants: Iterable[Variant]) -> list[Variant]:
    def key(v: Variant) -> tuple[int, int]:
        slow = max((i + 1 for i, s in enumerate(_SLOW_LAST) if s in v.techniques), default=0)
        return slow, -len(v.techniques)

    return sorted(variants, key=key)


# ----------------------------------------------------------------------------- pruning


@dataclass(frozen=True)
class Measured:
    """What one finished run of a combination under a card's cap proves."""

    label: str
    techniques: tuple[str, ...]
    card: Card
    status: str  # ok | oom | unsupported | failed | timeout
    peak_bytes: int | None = None  # ok: max_memory_allocated; oom: largest completed stage peak
    load_bytes: int | None = None  # peak allocated of the load stage (the weights), when it completed
    reserved_bytes: int | None = None  # ok: max_memory_reserved


def measured_from(
    label: str, techniques: tuple[str, ...], card: Card, status: str, run: dict[str, Any] | None
) -> Measured:
    """The facts a run.json gives (see :class:`Measured`); nothing for a run that left none."""
    stages = [s for s in (run or {}).get("stages") or [] if s.get("end_us") is not None and not s.get("open")]
    peaks = [int(s["peak_allocated_bytes"]) for s in stages if s.get("peak_allocated_bytes") is not None]
    loads = [
        int(s["peak_allocated_bytes"])
        for s in stages
        if s.get("name") == "load" and s.get("peak_allocated_bytes") is not None
    ]
    peak: int | None = max(peaks) if peaks else None
    alloc = (run or {}).get("allocator") or {}
    if status == "ok" and alloc.get("max_memory_allocated") is not None:
        peak = int(alloc["max_memory_allocated"])
    reserved = alloc.get("max_memory_reserved") if status == "ok" else None
    return Measured(
        label,
        tuple(techniques),
        card,
        status,
        peak,
        loads[0] if loads else None,
        int(reserved) if reserved is not None else None,
    )


def fits_without_running(v: Variant, card: Card, measured: Sequence[Measured]) -> Measured | None:
    """A finished run of the same combination whose max reserved is at most ``card``, or None.

    Exact, not an estimate: the cap (``set_per_process_memory_fraction``) is consulted only when
    the allocator reserves a new segment and its reserved total would pass the cap, so a run that
    never reserved more than ``card`` never met that card's cap either: under it, the run would
    have been the same, allocation for allocation."""
    mine = set(v.techniques)
    for m in measured:
        if (
            m.status == "ok"
            and set(m.techniques) == mine
            and m.reserved_bytes is not None
            and m.reserved_bytes <= card.bytes
        ):
            return m
    return None


def _fmt(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _own_bound(m: Measured, card: Card) -> str | None:
    """Why ``m``'s own combination cannot fit ``card`` (rules 1-2), or None."""
    if m.status == "oom" and m.card.bytes >= card.bytes:
        same = "this" if m.card.bytes == card.bytes else f"the larger {m.card.label}"
        return f"out of memory under {same} cap (a smaller cap only fails earlier)"
    if m.peak_bytes is not None and m.peak_bytes > card.bytes:
        return f"its peak allocated {_fmt(m.peak_bytes)}, measured under the {m.card.label} cap, exceeds {card.label}"
    return None


def prune_reason(v: Variant, card: Card, measured: Sequence[Measured]) -> str | None:
    """Why ``v`` cannot fit ``card`` from what was measured so far, or None (it must run)."""
    mine = set(v.techniques)
    for m in measured:  # rules 1-2: the same combination
        if set(m.techniques) == mine and (why := _own_bound(m, card)):
            return why
    for m in measured:  # rule 3: weights alone
        other = set(m.techniques)
        if m.load_bytes is not None and m.load_bytes > card.bytes and (other ^ mine) <= WEIGHT_NEUTRAL:
            via = "it" if other == mine else f"`{m.label}`, which loads the same weights"
            return f"its weights alone ({_fmt(m.load_bytes)} after load, measured with {via}) exceed {card.label}"
    for m in measured:  # rule 4: a strictly more memory-saving combination
        other = set(m.techniques)
        if other > mine and (other - mine) <= MEMORY_SAVING and (why := _own_bound(m, card)):
            return (
                f"`{m.label}` saves strictly more memory and still cannot fit: {why} "
                "(assumes adding a memory-saving technique never raises the peak)"
            )
    return None
