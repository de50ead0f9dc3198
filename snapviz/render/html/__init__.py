"""HTML reports: self-contained pages (Bokeh INLINE, no network).

* :mod:`.page` — the page kit (page template; cards, headers and tables as Jinja2 macros with
  autoescape, ``assets/chrome.html``; CSS/JS/templates in ``assets/``);
* :mod:`.bokeh_kit` — sources, figures, axes and formatters shared by the reports;
* :mod:`.palette` — stage, category and series colors;
* view-models (plain columns, what tests assert on): :mod:`.snapshot_data`,
  :mod:`.trace_data`, :mod:`.compare_data` (shared pieces in :mod:`.view_common`);
* one renderer per report: :mod:`.snapshot` (plots in :mod:`.snapshot_plots`),
  :mod:`.trace`, :mod:`.compare`.

What needs computing comes from :mod:`snapviz.analyses.report_view`; renderers only draw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapviz.analyses.document import Summary
from snapviz.load import paused_gc

if TYPE_CHECKING:
    from snapviz.analyses.analysis import Analysis

# Importing Bokeh makes ~150k objects that live as long as the process; the collections that
# run meanwhile free almost nothing and walk the analysis already loaded (cost in
# docs/benchmarks.md). The few cycles it leaves go at the next collection.
with paused_gc():
    from snapviz.render.html.compare import render_compare_html, render_compare_report_data
    from snapviz.render.html.page import build_page, chrome
    from snapviz.render.html.snapshot import render_html, render_report_data
    from snapviz.render.html.trace import render_trace_html, render_trace_report_data


def render_analysis_html(an: Analysis, summary: Summary, max_points: int = 20000) -> str:
    """The report of any analysis and its ``snapviz.summary/1`` document
    (:func:`~snapviz.analyses.pipeline.document_of`): the snapshot report for a replayed
    snapshot, the trace report for a trace-only run."""
    if an.kind == "trace":
        return render_trace_html(an, summary, max_points=max_points)
    return render_html(an, summary, max_points=max_points)


__all__ = [
    "render_analysis_html",
    "render_html",
    "render_report_data",
    "render_trace_html",
    "render_trace_report_data",
    "render_compare_html",
    "render_compare_report_data",
    "build_page",
    "chrome",
]
