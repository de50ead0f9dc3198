"""The frame every single-run report shares (snapshot and trace): header, warnings, the memory
timeline card, the report's own cards, run metadata and footer, on one page."""

from __future__ import annotations

from collections.abc import Sequence

from bokeh.models import UIElement

from snapviz.render.html.page import build_page, card_open, metadata_html, report_footer, report_hero, warnings_html
from snapviz.render.html.timeline_plots import timeline_or_note
from snapviz.render.html.view_models import SingleRunReport


def single_run_page(
    data: SingleRunReport,
    kicker: str,
    timeline_hint: str,
    *,
    with_points: bool,
    before_timeline: Sequence[str | UIElement] = (),
    cards: Sequence[str | UIElement] = (),
) -> str:
    """The page of ``data`` (already bounded): ``before_timeline`` blocks go between the warnings
    and the timeline, ``cards`` after it."""
    blocks: list[str | UIElement] = [
        report_hero(data, kicker),
        warnings_html(data.warnings),
        *before_timeline,
        card_open("Memory over time", timeline_hint, "sv-timeline-card"),
        *timeline_or_note(data, with_points),
        "</section>",
        *cards,
        metadata_html(data.metadata),
        report_footer(data.decimation.note),
    ]
    return build_page(f"snapviz: {data.title}", blocks)
