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


@dataclass
class FitRow:
    """One candidate on one card: ``result`` when it ran, ``pruned`` (the reason) when not;
    ``inferred`` (the reason) when a run under a larger cap already proves it fits this card."""

    card: Card
    variant: Variant
    result: VariantResult | None = None
    pruned: str | None = None
    inferred: str | None = None

    @property
    def fits(self) -> bool:
        return self.result is not None and self.result.ok


RunOne = Callable[[Variant, Card], VariantResult]
OnDone = Callable[[FitRow], None]


def plan_rows(cards: Sequence[Card], variants: Sequence[Variant]) -> list[tuple[Card, Variant]]:
    """The order of the search (what ``--dry-run`` prints): cards largest first, then
    :func:`measuring_order` within each card."""
    order = measuring_order(variants)
    return [(c, v) for c in sorted(cards, key=lambda c: -c.bytes) for v in order]


def run_fit(cards: Sequence[Card], variants: Sequence[Variant], run_one: RunOne,
            on_done: OnDone | None = None) -> list[FitRow]:
    """Run (or prune) every candidate on every card, one at a time: the pruning of the next
    candidate depends on what the previous ones measured."""
    measured: list[Measured] = []
    rows: list[FitRow] = []
    refused: dict[str, VariantResult] = {}   # the collector's refusal does not depend on the cap
    results: dict[tuple[str, int], VariantResult] = {}
    for card, v in plan_rows(cards, variants):
        why = prune_reason(v, card, measured)
        same = fits_without_running(v, card, measured)
        if why is not None:
            row = FitRow(card, v, pruned=why)
        elif same is not None:
            row = FitRow(card, v, result=results[(same.label, same.card.bytes)],
                         inferred=(f"the run under the {same.card.label} cap never reserved more than "
                                   f"{(same.reserved_bytes or 0) / 2**30:.2f} GiB, so the {card.label} cap was never "
                                   "met: the run under it would be the same"))
        elif v.label in refused:
            row = FitRow(card, v, result=refused[v.label])
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
