"""The report of a trace-only run (a profiler trace without a snapshot): one self-contained
HTML file drawn from :func:`~snapviz.render.html.trace_data.trace_report_data`."""
from __future__ import annotations

from typing import Any

from bokeh.models.layouts import UIElement

from snapviz.render.html.bokeh_kit import table_block
from snapviz.render.html.page import (
    bounded_data,
    build_page,
    card_open,
    esc,
    metadata_html,
    report_footer,
    report_hero,
    warnings_html,
)
from snapviz.render.html.snapshot_plots import stage_bar_block, timeline_or_note
from snapviz.render.html.trace_data import trace_report_data


def render_trace_report_data(data: dict[str, Any]) -> str:
    data = bounded_data(data)
    blocks: list[str | UIElement] = [report_hero(data, "snapviz · GPU memory report (profiler trace)"), warnings_html(data)]
    blocks += [card_open("Memory over time", "From the trace's memory events. Drag to pan, scroll to zoom.",
                          "sv-timeline-card"), timeline_or_note(data, with_points=False), "</section>"]
    if len(data["stage_bars"]["label"]):
        blocks += [card_open("Peak by stage", "Peak allocated in each stage interval", "sv-stages"),
                   stage_bar_block(data), "</section>"]
    live = data.get("live_table") or {}
    if live.get("rows"):
        blocks.append(card_open("Live at the peak", live.get("note", ""), "sv-live"))
        cols = {f"c{i}": [r[i] for r in live["rows"]] for i in range(len(live["columns"]))}
        widths = (90, 110, 520, 200, 360)
        blocks.append(table_block(cols, [(f"c{i}", c, widths[i]) for i, c in enumerate(live["columns"])],
                                   "sv-live-table", None, "", max_height=360))
        blocks.append("</section>")
    ops = data["attention_ops"]
    blocks.append(card_open("Attention ops", ops.get("note", ""), "sv-attention"))
    if ops["rows"]:
        cols = {f"c{i}": [r[i] for r in ops["rows"]] for i in range(len(ops["columns"]))}
        blocks.append(table_block(cols, [(f"c{i}", c, 120) for i, c in enumerate(ops["columns"])],
                                   "sv-attention-table", None, "", max_height=300))
    else:
        impl = (data.get("attention_summary") or {}).get("implementation")
        blocks.append(f'<p class="sv-none" id="sv-attention-none">No attention ops found in the trace.'
                      f'{" Implementation: " + esc(impl) + "." if impl else ""}</p>')
    blocks.append("</section>")
    blocks += [metadata_html(data["metadata"]), report_footer(data)]
    return build_page(f"snapviz: {data['title']}", blocks)


def render_trace_html(tan: Any, doc: dict[str, Any], max_points: int = 20000) -> str:
    """The report of a trace-only run (duck-typed ``tan``: see :func:`trace_report_data`)."""
    return render_trace_report_data(trace_report_data(tan, doc, max_points=max_points))
