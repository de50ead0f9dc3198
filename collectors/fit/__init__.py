"""``snapviz fit``: which technique combinations fit which GPU, at what cost in time.

* :mod:`.plan` — cards (``24GiB``), the default candidates, the measuring order and the pruning rule
  (pure functions on measured facts);
* :mod:`.search` — every card largest first, every candidate run under the card's allocator cap
  (one fresh collector process each, through the matrix's runner) or pruned;
* :mod:`.report` — the ``snapviz.fit/1`` document, Markdown and HTML (each card's runs also as a
  ranked matrix document, rendered by the matrix's report);
* :mod:`.cli` — the verb. docs/fit.md explains how to read it.

Importing this package imports no torch.
"""

from __future__ import annotations

from .plan import (
    BASELINE,
    DEFAULT_CANDIDATES,
    DEFAULT_CARDS,
    MEMORY_SAVING,
    WEIGHT_NEUTRAL,
    Card,
    FitError,
    Measured,
    default_candidates,
    measured_from,
    measuring_order,
    parse_card,
    parse_cards,
    prune_reason,
)
from .report import SCHEMA, fit_dict, render_fit_html, render_fit_markdown
from .search import FitRow, plan_rows, run_fit

__all__ = [
    "BASELINE",
    "DEFAULT_CANDIDATES",
    "DEFAULT_CARDS",
    "MEMORY_SAVING",
    "WEIGHT_NEUTRAL",
    "Card",
    "FitError",
    "Measured",
    "default_candidates",
    "measured_from",
    "measuring_order",
    "parse_card",
    "parse_cards",
    "prune_reason",
    "SCHEMA",
    "fit_dict",
    "render_fit_html",
    "render_fit_markdown",
    "FitRow",
    "plan_rows",
    "run_fit",
]
