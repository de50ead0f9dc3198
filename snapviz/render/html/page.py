"""The page kit: one self-contained HTML page (Bokeh INLINE, no network) made of raw HTML
blocks and Bokeh roots, plus the cards, tables and headers every report shares.

The stylesheet, the byte-formatting JavaScript and the page template are package data
(``assets/``), read once. Blocks given as strings are HTML the caller has already escaped.
"""

from __future__ import annotations

import html as _html
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

from snapviz import __version__
from snapviz.render.html.bokeh_json import documents_json
from snapviz.render.html.view_models import SingleRunReport
from snapviz.safe_text import clean


def esc(text: str, quote: bool = True) -> str:
    """HTML text of a string: control characters, bidi controls and lone surrogates shown as
    escapes (the one policy of snapviz.safe_text), then HTML-escaped."""
    return _html.escape(clean(text), quote=quote)


@cache
def load_asset(name: str) -> str:
    """The text of ``assets/<name>`` (CSS, JS or the page template)."""
    return files(__package__).joinpath("assets").joinpath(name).read_text(encoding="utf-8")


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


def card_open(title: str, hint: str = "", ident: str = "") -> str:
    """The opening of a card (``<section>``); the caller closes it with ``</section>``."""
    ident_attr = f' id="{esc(ident)}"' if ident else ""
    return f'<section class="sv-card"{ident_attr}><h2>{esc(title)}</h2>' + (
        f'<p class="sv-hint">{esc(hint)}</p>' if hint else ""
    )


def report_hero(data: SingleRunReport, kicker: str) -> str:
    """The header of a single-run report: title, verdict, lines and the allocator-truth badge."""
    h = data.headline
    truth = h.truth
    badge = f'<div class="sv-badge {esc(truth.status)}">{esc(truth.text)}</div>' if truth else ""
    lines = "".join(f"<li>{esc(x)}</li>" for x in h.lines)
    return (
        f'<header class="sv-hero"><p class="sv-kicker">{esc(kicker)}</p>'
        f'<p class="sv-title">{esc(h.title)}</p>'
        f'<h1 class="sv-verdict" id="sv-verdict">{esc(h.verdict)}</h1>'
        f"{'<ul class=sv-lines>' + lines + '</ul>' if lines else ''}{badge}</header>"
    )


def warnings_html(warnings: Sequence[str], title: str | None = None) -> str:
    if not warnings:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    head = title or f"⚠ {len(warnings)} warning{'s' if len(warnings) > 1 else ''}"
    return f'<div class="sv-warn" id="sv-warnings"><h3>{esc(head)}</h3><ul>{items}</ul></div>'


def metadata_html(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f'<div class="k">{esc(k)}</div><div class="v">{esc(v)}</div>' for k, v in rows)
    return card_open("Run", ident="sv-metadata") + f'<div class="sv-meta">{body}</div></section>'


def report_footer(note: str) -> str:
    return (
        f'<footer class="sv-foot" id="sv-footer">Timeline {esc(note)}. '
        f"Generated by snapviz {esc(__version__)} — self-contained, works offline.</footer>"
    )


def html_table(head: list[str], rows: list[list[str]], ident: str) -> str:
    """A plain HTML table (class ``sv-cmp``, styled by ``assets/compare.css``): readable
    without JavaScript, for small tables of text."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="sv-cmp" id="{esc(ident)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def table_css() -> str:
    """The ``<style>`` block for :func:`html_table` (and run swatches), placed in the page body."""
    return "<style>" + load_asset("compare.css") + "</style>"
