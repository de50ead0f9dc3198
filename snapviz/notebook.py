"""Reports inline in Jupyter and VS Code notebooks: ``snapviz.show(x)``.

``x`` is a path (snapshot, trace or run directory), an :class:`~snapviz.analyses.analysis.Analysis`
(of a snapshot or a trace), a :class:`~snapviz.analyses.compare.Comparison`, or a list of paths
(compared, the first as base). The interactive report is the same self-contained page the
CLI writes (Bokeh with inline resources: no network), shown in an ``<iframe srcdoc>`` so each
report keeps its own Bokeh, scripts and styles however many a notebook holds; the Markdown
summary is the ``text/markdown`` alternative (GitHub and nbconvert show that one).

:class:`Report` is what notebooks display (``_repr_html_``, ``_repr_markdown_``); analyses and
comparisons display themselves through it.
"""

from __future__ import annotations

import html
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.compare import Comparison
from snapviz.analyses.document import to_json
from snapviz.analyses.pipeline import document_of
from snapviz.api import analyze, compare
from snapviz.errors import InputError
from snapviz.render.output import write_atomic
from snapviz.safe_text import printable, short_repr

# A path (snapshot, trace or run directory), paths to compare, or a result to display.
Displayable: TypeAlias = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Analysis | Comparison

IFRAME_HEIGHT_PX = 900


@dataclass
class Report:
    """A rendered report: the full HTML page and its Markdown summary."""

    title: str
    page: str  # the self-contained HTML document
    markdown: str
    summary: dict[str, Any]

    def __repr__(self) -> str:
        return short_repr(
            "Report",
            self.title,
            f"HTML page {len(self.page):,} characters",
            f"Markdown {len(self.markdown):,} characters",
            "save(path) writes the page",
        )

    def _repr_html_(self) -> str:
        # srcdoc carries the whole page; quotes and ampersands escaped keep it one attribute.
        return (
            f'<iframe title="{html.escape(printable(self.title))}" srcdoc="{html.escape(self.page, quote=True)}" '
            f'style="width:100%;height:{IFRAME_HEIGHT_PX}px;border:1px solid #ddd" '
            'loading="eager"></iframe>'
        )

    def _repr_markdown_(self) -> str:
        return self.markdown

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the HTML page (what ``snapviz analyze -o`` writes); returns the path."""
        p = os.fspath(path)
        write_atomic(p, self.page)
        return p


def report(obj: Displayable, max_points: int = 20000) -> Report:
    """Render ``obj`` (see the module doc) into a :class:`Report`."""
    if isinstance(obj, (list, tuple)):
        if len(obj) < 2:
            raise InputError("compare needs at least two inputs: BASE OTHER [MORE]...")
        obj = compare(*obj)
    elif isinstance(obj, (str, os.PathLike)):
        obj = analyze(obj)
    # The renderers (Bokeh) load on the first report, not when a notebook imports snapviz.
    from snapviz.render.compare_md import render_compare_markdown
    from snapviz.render.html import render_analysis_html, render_compare_html
    from snapviz.render.markdown import render_markdown

    if isinstance(obj, Analysis):
        document = document_of(obj)
        return Report(
            obj.run.label,
            render_analysis_html(obj, document, max_points=max_points),
            render_markdown(document),
            to_json(document),  # Report.summary: the document's JSON form
        )
    if isinstance(obj, Comparison):
        doc = obj.document()
        return Report(
            " vs ".join(obj.labels), render_compare_html(obj, doc), render_compare_markdown(doc), to_json(doc)
        )
    raise TypeError(
        f"snapviz.show: expected a path, a list of paths, an analysis or a comparison, not {type(obj).__name__}"
    )


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show(obj: Displayable, max_points: int = 20000, path: str | os.PathLike[str] | None = None) -> str | None:
    """Display the interactive report of ``obj`` in the running notebook; returns None.

    Outside a notebook (a script, a plain ``python`` prompt), or when ``path`` is given, the page
    is written to ``path`` (default: a new ``snapviz-*.html`` in the temp directory), its path
    printed (stderr) and returned: open it in a browser. :func:`report` gives the
    :class:`Report` itself.
    """
    rep = report(obj, max_points=max_points)
    if path is None and _in_notebook():
        from IPython.display import display

        display(rep)
        return None
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix="snapviz-", suffix=".html")
        os.close(fd)
        path = tmp
    written = rep.save(path)
    print(f"snapviz: report written to {printable(written, None)}", file=sys.stderr)
    return written


def _markdown_of(obj: Displayable) -> str:
    return report(obj).markdown


def _html_of(obj: Displayable) -> str:
    return report(obj)._repr_html_()


# Result types that display as their report, by module and name: registering them needs no
# import of the analyses (and the analyses stay free of any presentation code).
DISPLAYED_TYPES = (
    ("snapviz.analyses.analysis", "Analysis"),
    ("snapviz.analyses.compare", "Comparison"),
)


def register_formatters(ip: Any) -> None:
    """Teach an IPython shell to display analyses and comparisons as reports."""
    formatters = ip.display_formatter.formatters
    for module, name in DISPLAYED_TYPES:
        formatters["text/html"].for_type_by_name(module, name, _html_of)
        formatters["text/markdown"].for_type_by_name(module, name, _markdown_of)
