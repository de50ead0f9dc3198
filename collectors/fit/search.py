"""The fit search: every card, largest first; every candidate, cheapest to measure first; each one
either pruned by what was measured so far (:func:`collectors.fit.plan.prune_reason`) or run in a
fresh collector process under the card's allocator cap.

The process that runs a variant is passed in (``run_one``), so the search is tested with a fake
runner; the CLI passes :func:`collectors.matrix.runner.run_one`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collectors.matrix.runner import VariantResult
from collectors.matrix.variants import Variant

from .plan import Card, Measured, fits_without_running, measured_from, measuring_order, prune_reason
from .simulated import Simulated


@dataclass
class FitRow:
    """One candidate on one card: ``result`` when it ran, ``pruned`` (the reason) when not;
    ``inferred`` (the reason) when a run under a larger cap already proves it fits this card."""

    card: Card
    variant: Variant
    result: VariantResult | None = None
    pruned: str | None = None
    inferred: str | None = None
    simulated: Simulated | None = None  # decided by the allocator simulator from a larger card's run

    @property
    def fits(self) -> bool:
        if self.simulated is not None:
            return self.simulated.fits
        return self.result is not None and self.result.ok

    @property
    def decided_by(self) -> str:
        """``measured`` (a run of its own, or a larger cap's run that never met this cap),
        ``simulated``, or ``pruned``."""
        return "simulated" if self.simulated is not None else "pruned" if self.pruned is not None else "measured"


RunOne = Callable[[Variant, Card], VariantResult]
OnDone = Callable[[FitRow], None]
# (a completed run, the card it ran under, a smaller card) -> the simulator's verdict, or None
Simulate = Callable[[VariantResult, Card, Card], Simulated | None]


def plan_rows(cards: Sequence[Card], variants: Sequence[Variant]) -> list[tuple[Card, Variant]]:
    """The order of the search (what ``--dry-run`` prints): cards largest first, then
    :func:`measuring_order` within each card."""
    order = measuring_order(variants)
    return [(c, v) for c in sorted(cards, key=lambda c: -c.bytes) for v in order]


def run_fit(
    cards: Sequence[Card],
    variants: Sequence[Variant],
    run_one: RunOne,
    on_done: OnDone | None = None,
    simulate: Simulate | None = None,
) -> list[FitRow]:
    """Run (or prune) every candidate on every card, one at a time: the pruning of the next
    candidate depends on what the previous ones measured. ``simulate``: a candidate that completed
    under a larger card is simulated on this one (:mod:`.simulated`) before it is run; where the
    simulator decides, the cell is ``simulated``, not run. Simulated cells prune nothing."""
    measured: list[Measured] = []
    rows: list[FitRow] = []
    refused: dict[str, VariantResult] = {}  # the collector's refusal does not depend on the cap
    results: dict[tuple[str, int], VariantResult] = {}
    for card, v in plan_rows(cards, variants):
        why = prune_reason(v, card, measured)
        same = fits_without_running(v, card, measured)
        if why is not None:
            row = FitRow(card, v, pruned=why)
        elif same is not None:
            row = FitRow(
                card,
                v,
                result=results[(same.label, same.card.bytes)],
                inferred=(
                    f"the run under the {same.card.label} cap never reserved more than "
                    f"{(same.reserved_bytes or 0) / 2**30:.2f} GiB, so the {card.label} cap was never "
                    "met: the run under it would be the same"
                ),
            )
        elif v.label in refused:
            row = FitRow(card, v, result=refused[v.label])
        elif simulate is not None and (sim := _simulated(v, card, measured, results, simulate)) is not None:
            row = FitRow(card, v, simulated=sim)
        else:
            res = run_one(v, card)
            measured.append(measured_from(v.label, v.techniques, card, res.status, res.run))
            results[(v.label, card.bytes)] = res
            if res.status == "unsupported":
                refused[v.label] = res
            row = FitRow(card, v, result=res)
        rows.append(row)
        if on_done is not None:
            on_done(row)
    return rows


def _simulated(
    v: Variant,
    card: Card,
    measured: Sequence[Measured],
    results: dict[tuple[str, int], VariantResult],
    simulate: Simulate,
) -> Simulated | None:
    """The simulator's verdict on ``card`` from the smallest larger card ``v`` completed on."""
    done = sorted(
        (m for m in measured if m.label == v.label and m.status == "ok" and m.card.bytes > card.bytes),
        key=lambda m: m.card.bytes,
    )
    for m in done:
        sim = simulate(results[(m.label, m.card.bytes)], m.card, card)
        if sim is not None:
            return sim
    return None
