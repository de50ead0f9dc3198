"""The page kit: one self-contained HTML page (Bokeh INLINE, no network) made of raw HTML
blocks and Bokeh roots, plus the cards, tables and headers every report shares.

The stylesheet, the byte-formatting JavaScript, the page template and the HTML around the
plots (``assets/chrome.html``: Jinja2 macros, rendered with autoescape on by :func:`chrome`)
are package data (``assets/``), read once. Blocks given as strings are HTML: :func:`chrome`'s
markup, never text pasted in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any, cast

from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.embed.elements import html_page_for_render_items
from bokeh.model import Model
from bokeh.models import PreText, UIElement
from bokeh.resources import INLINE
from jinja2 import Environment, StrictUndefined
from markupsafe import Markup

from snapviz import __version__
from snapviz.render.html.bokeh_json import documents_json
from snapviz.render.html.view_models import SingleRunReport
from snapviz.safe_text import clean


@cache
def load_asset(name: str) -> str:
    """The text of ``assets/<name>`` (CSS, JS or the page template)."""
    return files(__package__).joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _text(value: Any) -> Any:
    """Every value a macro prints, before autoescape: markup as it is, anything else as text
    with control characters, bidi controls and lone surrogates shown as escapes (the one
    policy of snapviz.safe_text)."""
    return value if isinstance(value, Markup) else clean(str(value))


@cache
def _macros() -> Any:
    env = Environment(autoescape=True, finalize=_text, undefined=StrictUndefined, keep_trailing_newline=False)
    env.filters["thousands"] = lambda n: f"{int(n):,}"
    return env.from_string(load_asset("chrome.html")).module


def chrome(macro: str, /, **values: Any) -> Markup:
    """The markup of one macro of ``assets/chrome.html`` (a card, a header, a table...): every
    value autoescaped unless it is itself such markup."""
    return cast(Markup, getattr(_macros(), macro)(**values))


PAGE_CSS = load_asset("page.css")
# Binary units, trimmed: 1536 MiB -> "1.5 GiB". Shared by axes, tooltips and click handlers.
BYTES_JS = load_asset("bytes.js")
LAZY_EMBED_JS = load_asset("lazy_embed.js")


def _linked_groups(roots: Sequence[UIElement], refs: Sequence[set[Model]]) -> list[list[UIElement]]:
    """The roots in groups that share no model (source, range, callback argument) with another
    group, each group in page order. Each group becomes a Bokeh document of its own, which the
    page deserializes only when its first root is due. ``refs``: each root's models."""
    parent = list(range(len(roots)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, models in enumerate(refs):
        for model in models:
            j = owner.setdefault(model.id, i)
            if find(j) != find(i):
                parent[find(i)] = find(j)
    groups: dict[int, list[UIElement]] = {}
    for i, root in enumerate(roots):
        groups.setdefault(find(i), []).append(root)
    return list(groups.values())


class _Models:
    """Models already collected, in the one shape ``bundle_for_objs_and_resources`` reads
    (an object whose ``references()`` are its models): a report's ~800 models are then walked
    once, not again for each bundle (a walk of every property: ~0.1 s per root)."""

    def __init__(self, models: set[Model]) -> None:
        self._models = models

    def references(self) -> set[Model]:
        return self._models


def build_page(title: str, blocks: Sequence[str | UIElement], eager_roots: int = 1) -> str:
    """One self-contained HTML page: ``blocks`` are raw HTML strings (already escaped by the
    caller) and Bokeh models, in order. Roots that share a model (a source, a range, a
    selection) are in one document, so they stay linked across blocks.

    The page paints before BokehJS runs (the scripts come after the blocks), and only the
    first ``eager_roots`` Bokeh roots render at once; the others follow one per frame
    (``assets/lazy_embed.js``), so the first screen does not wait for the plots below it. A
    document holding only later roots is deserialized when its turn comes, and the BokehJS
    bundles only such documents need (the tables) are compiled then, not before the first
    screen."""
    roots: list[UIElement] = []
    items: list[tuple[str, str]] = []
    for b in blocks:
        if isinstance(b, str):
            items.append(("html", b))
        else:
            if not b.name or any(r.name == b.name for r in roots):
                b.name = f"sv-root-{len(roots)}"
            roots.append(b)
            items.append(("root", b.name))
    if not roots:  # BokehJS needs a document; an empty one still loads it
        filler = PreText(text="", visible=False, name="sv-empty")
        roots.append(filler)
        items.append(("root", filler.name))
    later = {r.name for r in roots[max(eager_roots, 0) :]}
    refs = [r.references() for r in roots]
    pos = {id(r): i for i, r in enumerate(roots)}
    groups = _linked_groups(roots, refs)
    first_models: set[Model] = set()
    for group in groups:
        if any(r.name not in later for r in group):
            first_models.update(*(refs[pos[id(r)]] for r in group))
    docs_json, render_items = documents_json(groups)
    bundle = bundle_for_objs_and_resources([cast(Any, _Models(first_models))], INLINE)
    every = bundle_for_objs_and_resources([cast(Any, _Models(set().union(*refs)))], INLINE)
    deferred = [js for js in every.js_raw if js not in bundle.js_raw]
    # What lazy_embed.js defers: the later roots, by name, and the documents holding only such
    # roots, by id. Root names are ours (sv-...), but this sits in a <script> element: keep "</"
    # out of it.
    lazy = json.dumps(
        {
            "roots": [r.name for r in roots if r.name in later],
            "docs": [item.docid for item in render_items if all(r.name in later for r in item.roots)],
        }
    ).replace("</", "<\\/")
    return html_page_for_render_items(
        bundle,
        docs_json,
        render_items,
        title=title,
        template=load_asset("page.html"),
        template_variables={
            "blocks": items,
            # by name, over every document (Bokeh sets this itself only for a page of one document)
            "roots": {r.name: r for item in render_items for r in item.roots},
            "page_css": PAGE_CSS,
            "version": __version__,
            "lazy_roots": lazy,
            "lazy_js": LAZY_EMBED_JS,
            # BokehJS's own minified bundles, which never hold "</script"
            "deferred_js": "\n".join(deferred),
        },
    )


def card_open(title: str, hint: str = "", ident: str = "") -> Markup:
    """The opening of a card (``<section>``); the caller closes it with ``</section>``."""
    return chrome("card_open", title=title, hint=hint, ident=ident)


def card(title: str, body: Markup, hint: str = "", ident: str = "") -> Markup:
    """A whole card: title, hint and ``body`` (markup)."""
    return chrome("card", title=title, body=body, hint=hint, ident=ident)


def report_hero(data: SingleRunReport, kicker: str) -> Markup:
    """The header of a single-run report: title, verdict, lines and the allocator-truth badge."""
    h = data.headline
    truth = h.truth
    badge = chrome("badge", status=truth.status, text=truth.text) if truth else ""
    return chrome("hero", kicker=kicker, title=h.title, verdict=h.verdict, lines=list(h.lines), extra=badge)


def warnings_html(warnings: Sequence[str], title: str | None = None) -> Markup:
    if not warnings:
        return Markup("")
    head = title or f"⚠ {len(warnings)} warning{'s' if len(warnings) > 1 else ''}"
    return chrome("warnings", head=head, items=list(warnings))


def metadata_html(rows: Sequence[tuple[str, str]]) -> Markup:
    return card("Run", chrome("metadata", rows=list(rows)), ident="sv-metadata")


def report_footer(note: str) -> Markup:
    return chrome(
        "footer", text=f"Timeline {note}. Generated by snapviz {__version__} — self-contained, works offline."
    )


def html_table(head: list[str], rows: list[list[str]], ident: str) -> Markup:
    """A plain HTML table (class ``sv-cmp``, styled by ``assets/compare.css``): readable
    without JavaScript, for small tables of text."""
    return chrome("table", head=head, rows=rows, ident=ident)


def wide_table(head: list[str], rows: list[list[str]], ident: str) -> Markup:
    """:func:`html_table` in a box that scrolls sideways on narrow screens."""
    return chrome("wide_table", head=head, rows=rows, ident=ident)


def table_css() -> str:
    """The ``<style>`` block for :func:`html_table` (and run swatches), placed in the page body."""
    return "<style>" + load_asset("compare.css") + "</style>"
