"""The interactive report of one analysed snapshot: one self-contained HTML file.

Renders the view-model of :func:`~snapviz.render.html.snapshot_data.report_data` and computes
nothing. Static parts (verdict, warnings, what would help, run metadata) are plain HTML,
readable even where JavaScript is off; the plots and tables are Bokeh roots, and roots that
share a model are one document, so their sources, ranges and selections are linked (the
category area pans with the timeline; a click on a stage's bar selects that stage's blocks in
its table).
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, UIElement

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import Summary
from snapviz.analyses.report_view import report_view
from snapviz.render.html.bokeh_kit import table_block
from snapviz.render.html.page import card_open, chrome
from snapviz.render.html.single_run import single_run_page
from snapviz.render.html.snapshot_data import report_data
from snapviz.render.html.stage_plots import category_block, stage_breakdown_block
from snapviz.render.html.view_models import BlockRows, SnapshotReport, bounded
from snapviz.units import fmt_bytes
from snapviz.vocab import END_STATE_ONLY


def _columns(rows: BlockRows, names: tuple[str, ...]) -> dict[str, Any]:
    return {k: getattr(rows, k) for k in names}


def _advice_html(data: SnapshotReport) -> str:
    tiles = []
    for a in data.advice:  # every entry the JSON has
        share = a.share
        if share and share > 1:  # e.g. cached memory beyond the peak: no share of it to show
            share = None
        tiles.append(
            {
                "technique": a.technique,
                "save_class": "sv-fix-save" if a.saves_up_to_bytes else "sv-fix-save unknown",
                "saves": a.saves,
                "share": f"{share:.0%}" if share else "",
                "width": f"{share * 100:.1f}" if share else "",
                "why": a.why,
                "how": a.how,
            }
        )
    return chrome("advice", tiles=tiles)


def _oom_html(data: SnapshotReport) -> str:
    """The OOM card at the top: the failed request, the state, the verdict, the fix, what was live."""
    oom = data.oom
    if not oom.lines:
        return ""
    head, *rest = oom.lines
    return chrome("oom", head=head, items=[*rest, *oom.live])


def render_report_data(data: SnapshotReport) -> str:
    """The page for a :func:`~snapviz.render.html.snapshot_data.report_data` view-model."""
    data = bounded(data)
    stage_top, linked = _stage_top_blocks(data)
    cards = _breakdown_blocks(data, linked)
    top = data.top_allocations
    hint = (
        f"The {len(top.size)} largest blocks live at the peak (event {data.peak.index:,}). "
        "Select a row to see where it was allocated."
        if len(top.size)
        else ""
    )
    if data.end_state_only and len(top.size):
        hint = (
            f"The {len(top.size)} largest blocks of the end state ({END_STATE_ONLY}); no event of the file "
            "allocated them (event -1). Select a row to see where it was allocated."
        )
    if top.has_ops:
        hint += " The op and its input shapes come from the run's profiler trace."
    cards.append(card_open("Live at the end state" if data.end_state_only else "Live at the peak", hint, "sv-top"))
    if len(top.size):
        spec = [
            ("size", "size", 90),
            ("stage", "stage", 120),
            ("site", "allocated at", 900),
            ("event_index", "event", 80),
        ]
        fields = ["size", "bytes", "stage", "site", "event_index", "stack_text"]
        if top.has_ops:
            spec[2] = ("site", "allocated at", 520)
            spec[3:3] = [("op", "op (trace)", 200), ("op_input_dims", "op input shapes", 260)]
            fields += ["op", "op_input_dims"]
        cards.append(
            table_block(
                _columns(top, tuple(fields)), spec, "sv-top-allocations", "stack_text", "Select a row to see its stack."
            )
        )
    else:
        cards.append(
            '<p class="sv-none">No recorded allocation was live at the peak: the peak is memory '
            "allocated before the recorded history (see the categories).</p>"
            if data.peak.index < 0
            else '<p class="sv-none">No recorded allocation was live at the peak.</p>'
        )
    cards.append("</section>")
    cards += stage_top
    cards += _attention_blocks(data)
    hint = (
        "allocated = blocks handed out (what max_memory_allocated counts) · reserved = cudaMalloc'd segments · "
        "requested = what tensors asked for; below, the same allocated memory by category. Drag to pan, scroll "
        "to zoom (the plots move together), click a point for its stack; click legend entries to hide lines."
    )
    return single_run_page(
        data,
        "snapviz · GPU memory report",
        hint,
        with_points=True,
        before_timeline=[_oom_html(data), _advice_html(data)],
        cards=cards,
    )


def _breakdown_blocks(data: SnapshotReport, linked: ColumnDataSource | None = None) -> list[str | UIElement]:
    """Per stage interval, bytes by category at its peak, beside the global peak's categories."""
    b = data.stage_breakdown
    n = len(b.label)
    if not n:
        return [
            '<section class="sv-card" id="sv-stages"><h2>Peak by stage</h2><p class="sv-none">No stage '
            "intervals: there is no trace history to attribute.</p></section>",
            card_open(
                "At the peak, by category",
                f"What the {fmt_bytes(data.peak.allocated)} live at the peak is made of",
                "sv-categories-card",
            ),
            category_block(data),
            "</section>",
        ]
    height = max(300, 26 * n + 90)
    hint = b.note or (
        "Each bar is one stage interval (each denoising step separately) at its own peak, split by "
        "what was live then. Hover a segment for its bytes"
    )
    hint += "; click a bar for the stage's largest blocks (below)." if linked is not None else "."
    stages = [
        card_open("Peak by stage, by category", hint, "sv-stages"),
        stage_breakdown_block(data, height, linked),
        "</section>",
    ]
    cats = [
        card_open(
            "At the peak, by category",
            f"What the {fmt_bytes(data.peak.allocated)} live at the peak is made of",
            "sv-categories-card",
        ),
        category_block(data, height if n <= 14 else None),
        "</section>",
    ]
    if n <= 14:
        return ['<div class="sv-grid">', *stages, *cats, "</div>"]
    return [*stages, *cats]  # a tall chart of many steps gets the full width


def _stage_top_blocks(data: SnapshotReport) -> tuple[list[str | UIElement], ColumnDataSource | None]:
    """The "largest blocks each stage allocated" card, and its table's source (for linking)."""
    t = data.stage_top
    if not len(t.size):
        return [], None
    hint = (
        "For each stage interval, the largest blocks it allocated itself that were still live at its own peak "
        "(what the stage adds on top of what it inherited). Select a row to see its stack."
    )
    table = table_block(
        _columns(t, ("interval", "stage", "size", "bytes", "site", "event_index", "stack_text")),
        [("stage", "stage", 130), ("size", "size", 90), ("site", "allocated at", 900), ("event_index", "event", 80)],
        "sv-stage-top-table",
        "stack_text",
        "Select a row to see its stack.",
        max_height=330,
    )
    src = table.children[0].source
    return [card_open("Largest blocks each stage allocated", hint, "sv-stage-top"), table, "</section>"], src


def _attention_blocks(data: SnapshotReport) -> list[str | UIElement]:
    att = data.attention
    out: list[str | UIElement] = [card_open("Attention score matrices", ident="sv-attention")]
    if att.rows is None:
        impl = att.implementation or "unknown"
        text = f"No attention score matrices were materialized. Implementation: {impl}."
        out += [chrome("note", text=text, ident="sv-attention-none"), "</section>"]
        return out
    summary = (
        f"{att.count:,} score matrices materialized; largest {fmt_bytes(att.largest_bytes)}; up to "
        f"{fmt_bytes(att.peak_live_bytes)} live at once. Implementation: {att.implementation}. "
        "SDPA (the diffusers default) computes attention without materializing them."
    )
    if att.note:
        summary += f" ({att.note})"
    out.append(chrome("note", text=summary, kind="sv-hint"))
    out.append(
        table_block(
            _columns(
                att.rows, ("size", "bytes", "shape", "dtype", "stage", "site", "event_index", "lifetime", "stack_text")
            ),
            [
                ("size", "size", 90),
                ("shape", "shape [b·h, q, k]", 140),
                ("dtype", "dtype", 90),
                ("stage", "stage", 110),
                ("site", "allocated at", 520),
                ("event_index", "event", 80),
                ("lifetime", "freed after", 170),
            ],
            "sv-attention-table",
            "stack_text",
            "Select a row to see its stack.",
            max_height=300,
        )
    )
    out.append("</section>")
    return out


def render_html(an: Analysis, summary: Summary, max_points: int = 20000) -> str:
    """The interactive report of one analysed snapshot and its ``snapviz.summary/1`` document:
    the report's analysis step (:func:`~snapviz.analyses.report_view.report_view`), its
    view-model, its page. The one place that sequences them, as a CLI verb would, so callers
    keep one call."""
    view = report_view(an, max_points)
    return render_report_data(report_data(an, summary, view, max_points=max_points))
