"""Colors shared by every report and picture: a stage or category has one color everywhere."""

from __future__ import annotations

from collections.abc import Iterable

from snapviz.category_vocab import CATEGORY_COLORS, order_categories
from snapviz.vocab import UNLABELLED, stage_group

# Canonical stages keep one color in every report (and in comparisons).
STAGE_COLORS: dict[str, str] = {
    "load": "#7f7f7f",
    "text_encode": "#9467bd",
    "denoise": "#1f77b4",
    "vae_decode": "#2ca02c",
    "other": "#bcbd22",
    UNLABELLED: "#c7c7c7",
}
_EXTRA_COLORS = (
    "#17becf",
    "#e377c2",
    "#8c564b",
    "#aec7e8",
    "#98df8a",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
)
# categories: one colour each, defined with their names (snapviz.category_vocab)
_EXTRA_CATEGORY_COLORS = ("#393b79", "#637939", "#8c6d31", "#7b4173", "#9edae5", "#f7b6d2", "#843c39", "#5254a3")
SERIES_COLORS: dict[str, str] = {
    "allocated": "#1f3b73",
    "reserved": "#e8710a",
    "requested": "#5f9ea0",
    "fragmentation": "#e8710a",
    "peak": "#d62728",
}


def stage_palette(names: Iterable[str]) -> dict[str, str]:
    """A color for each stage name; steps of one stage (``denoise/0``...) share its group's color.

    Canonical groups have fixed colors; other groups take the next free color in order of
    first appearance, so the same names always get the same colors.
    """
    out: dict[str, str] = {}
    group_color: dict[str, str] = {}
    extra = iter(_EXTRA_COLORS * 4)
    for name in names:
        g = stage_group(name)
        if g not in group_color:
            group_color[g] = STAGE_COLORS.get(g) or next(extra, "#999999")
        out[str(name)] = group_color[g]
    return out


def category_palette(names: Iterable[str]) -> dict[str, str]:
    """A color for each category: the vocabulary's fixed (:data:`snapviz.category_vocab.CATEGORY_COLORS`),
    others the next free color in order, so a category has one color in every chart of a report."""
    out: dict[str, str] = {}
    extra = iter(_EXTRA_CATEGORY_COLORS * 4)
    for c in order_categories(names):
        out[c] = CATEGORY_COLORS.get(c) or next(extra, "#999999")
    return out
