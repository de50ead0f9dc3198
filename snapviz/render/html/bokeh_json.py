"""The page's Bokeh documents as JSON, written by Bokeh's own public API
(``Document.add_root`` and ``Document.to_json``).

Bokeh serialises a model by asking every one of its properties for its value, defaults
included, and keeps those set on the model; on the largest benchmark report that is the
bulk of the page's serialisation (figures in docs/benchmarks.md). An earlier version read
Bokeh's private property tables to skip the defaults; it was tied to one Bokeh release and
is gone: the page depends only on what Bokeh documents.
"""

from __future__ import annotations

from collections.abc import Sequence

from bokeh.document import Document
from bokeh.document.json import DocJson
from bokeh.embed.util import RenderItem
from bokeh.models import UIElement
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id


def document_json(roots: Sequence[UIElement]) -> DocJson:
    """``Document.to_json(deferred=False)`` of a new document holding ``roots`` (the default
    title and configuration, no callbacks). Bokeh's document validation is not run here (it
    only logs); tests/unit/test_bokeh_integrity.py runs it on every kind of report."""
    doc = Document()
    for root in roots:
        doc.add_root(root)
    return doc.to_json(deferred=False)


def documents_json(groups: Sequence[Sequence[UIElement]]) -> tuple[dict[str, DocJson], list[RenderItem]]:
    """One document per group of roots, as ``bokeh.embed.standalone_docs_json_and_render_items``
    returns them for those roots (documents in group order, each root with a fresh element id)."""
    docs_json: dict[str, DocJson] = {}
    items: list[RenderItem] = []
    for group in groups:
        docid = make_globally_unique_id()
        docs_json[docid] = document_json(group)
        items.append(RenderItem(docid, roots={r: make_globally_unique_css_safe_id() for r in group}))
    return docs_json, items
