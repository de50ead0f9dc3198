"""The report of a trace-only run (a profiler trace without a snapshot): one self-contained
HTML file drawn from :func:`~snapviz.render.html.trace_data.trace_report_data`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bokeh.models import UIElement

from snapviz.analyses.document import Summary
from snapviz.render.html.bokeh_kit import table_block
from snapviz.render.html.page import card_open, chrome
from snapviz.render.html.single_run import single_run_page
from snapviz.render.html.stage_plots import stage_bar_block
from snapviz.render.html.trace_data import trace_report_data
from snapviz.render.html.view_models import TextTable, TraceReport, bounded

if TYPE_CHECKING:
    from snapviz.analyses.analysis import Analysis


def _text_table(t: TextTable, widths: tuple[int, ...], name: str, max_height: int) -> UIElement:
    cols = {f"c{i}": [r[i] for r in t.rows] for i in range(len(t.columns))}
    spec = [(f"c{i}", c, widths[i] if i < len(widths) else widths[-1]) for i, c in enumerate(t.columns)]
    return table_block(cols, spec, name, None, "", max_height=max_height)


def render_trace_report_data(data: TraceReport, kind: str = "memory (profiler trace)") -> str:
    """The page; ``kind``: what was measured (:func:`snapviz.render.fmt.fmt_report_kind`)."""
    data = bounded(data)
    cards: list[str | UIElement] = []
    if len(data.stage_bars.label):
        cards += [
            card_open("Peak by stage", "Peak allocated in each stage interval", "sv-stages"),
            stage_bar_block(data),
            "</section>",
        ]
    live = data.live_table
    if live.rows:
        cards += [
            card_open("Live at the peak", live.note, "sv-live"),
            _text_table(live, (90, 110, 520, 200, 360), "sv-live-table", 360),
            "</section>",
        ]
    ops = data.attention_ops
    cards.append(card_open("Attention ops", ops.note, "sv-attention"))
    if ops.rows:
        cards.append(_text_table(ops, (120,), "sv-attention-table", 300))
    else:
        impl = data.attention_implementation
        text = "No attention ops found in the trace." + (f" Implementation: {impl}." if impl else "")
        cards.append(chrome("note", text=text, ident="sv-attention-none"))
    cards.append("</section>")
    return single_run_page(
        data,
        f"snapviz · {kind}",
        "From the trace's memory events. Drag to pan, scroll to zoom.",
        with_points=False,
        cards=cards,
    )


def render_trace_html(tan: Analysis, summary: Summary, max_points: int = 20000) -> str:
    """The report of a trace-only run and its ``snapviz.summary/1`` document (what of ``tan`` is
    read: see :func:`trace_report_data`)."""
    from snapviz.render.fmt import fmt_report_kind

    return render_trace_report_data(trace_report_data(tan, summary, max_points=max_points), fmt_report_kind(summary))
