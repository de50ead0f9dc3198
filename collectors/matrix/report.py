"""The matrix's reports, rendered from the matrix document (``snapviz.matrix/1`` dict) alone.

:func:`table_cells` turns the document into the table once, as plain values that say what
each cell is (a variant label, text read from files, or a number we formatted); the Markdown
and HTML renderers each escape those values for their own sink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from snapviz.safe_text import bounded_doc, md_code, md_text, printable
from snapviz.units import fmt_bytes, fmt_ratio_pct

from .ranking import STAGE_GROUPS

if TYPE_CHECKING:
    from snapviz.analyses.compare import Comparison
    from snapviz.analyses.compare_document import CompareDocument

CODE, TEXT, PLAIN = "code", "text", "plain"


class Cell(NamedTuple):
    value: str
    kind: str = PLAIN  # CODE: a label; TEXT: words from files; PLAIN: our own numbers


def _pct(r: float | None) -> str:
    """`` (−5.0%)`` with a true minus, `` (=)`` under 0.05%: the matrix's compact delta."""
    if r is None:
        return ""
    if abs(r) < 0.0005:
        return " (=)"
    return fmt_ratio_pct(r).replace("-", "−")


def _secs(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def table_cells(doc: dict[str, Any]) -> tuple[list[str], list[list[Cell]]]:
    """The matrix table: header and one row of cells per variant, in the document's order."""
    rss = doc["memory_metric"] == "rss"
    head = [
        "#",
        "variant",
        "peak RSS" if rss else "peak allocated",
        *([] if rss else ["peak reserved"]),
        *(f"{g}" for g in STAGE_GROUPS),
        "call s",
        "step s",
        "memory saved per extra s",
    ]
    rows: list[list[Cell]] = []
    for r in doc["variants"]:
        m = r.get("measure")
        if r["status"] != "ok" or m is None or r.get("vs_baseline") is None:
            what = {"oom": "OOM", "unsupported": "unsupported", "timeout": "timeout"}.get(r["status"], "failed")
            rows.append(
                [Cell("✗"), Cell(r["label"], CODE), Cell(f"{what}: {r['reason'] or ''}".strip(), TEXT)]
                + [Cell("")] * (len(head) - 3)
            )
            continue
        rel = r["vs_baseline"]["relative"]
        is_base = r["label"] == doc["baseline"]

        def cell(text: str, ratio: float | None, is_base: bool = is_base) -> Cell:
            return Cell(text if is_base else text + _pct(ratio))

        if is_base:
            ranking = Cell("baseline")
        elif r["tier"] == 1:
            ranking = Cell("saves memory and time")
        elif r["tier"] == 2 and r["score"] is not None:
            ranking = Cell(f"{fmt_bytes(int(r['score']))}/s")
        else:
            ranking = Cell(r["verdict"] or "", TEXT)
        rows.append(
            [
                Cell("base" if is_base else str(r["rank"])),
                Cell(r["label"], CODE),
                cell(fmt_bytes(m["peak_allocated_bytes"]), rel["peak_allocated"]),
                *(
                    []
                    if rss
                    else [
                        Cell("n/a")
                        if m["peak_reserved_bytes"] is None
                        else cell(fmt_bytes(m["peak_reserved_bytes"]), rel["peak_reserved"])
                    ]
                ),
                *(
                    (
                        Cell("—")
                        if m["stages"][g]["peak_allocated_bytes"] is None
                        else cell(fmt_bytes(m["stages"][g]["peak_allocated_bytes"]), rel[g])
                    )
                    for g in STAGE_GROUPS
                ),
                cell(_secs(m["call_s"], 2), rel["call_s"]),
                cell(_secs(m["step_median_s"], 3), rel["step_median_s"]),
                ranking,
            ]
        )
    return head, rows


def _notes(doc: dict[str, Any], code: Callable[[Any], str], text: Callable[[Any], str]) -> list[str]:
    """The notes under the table: ``code`` renders a label, ``text`` any other text that may
    come from the files (md_code/md_text for Markdown; str for HTML, which escapes it all)."""
    notes = [text(n) for n in doc.get("notes") or []]
    notes += [f"skipped {code(s['label'])}: {text(s['reason'])}" for s in doc.get("skipped") or []]
    for r in doc["variants"]:
        notes += [f"{code(r['label'])}: {text(n)}" for n in r.get("notes") or []]
    if doc["memory_metric"] == "rss":
        notes.append(
            "RSS differs by tens of MiB between identical processes (allocator arenas, threads): "
            "on CPU only differences well above that mean anything"
        )
    if doc["jobs"] > 1:
        where = "one GPU each, sharing the host CPUs" if doc["device"] == "cuda" else "sharing the CPU"
        notes.append(
            f"{doc['jobs']} variants ran at once ({where}): peaks are per process and unaffected, "
            "but times can move; treat small time differences as noise"
        )
    return notes


# ----------------------------------------------------------------------------- Markdown

# snapviz's own sentences in a matrix document: printed whole in every sink (never clipped)
OWN_SENTENCES = ("memory_metric_text", "time_text", "ranking_rule")


def _md_cell(c: Cell) -> str:
    return md_code(c.value) if c.kind == CODE else md_text(c.value) if c.kind == TEXT else c.value


def render_matrix_markdown(doc: dict[str, Any]) -> str:
    """Title, setup, the ranked table, the rule and the notes (no comparison). Names read
    from run directories (--from-dir) are escaped like every snapviz Markdown; snapviz's own
    sentences (the ranking rule, what memory and time mean) are printed whole."""
    own = {k: doc[k] for k in OWN_SENTENCES}
    doc = {**bounded_doc(doc), **own}
    res = f"{md_text(doc.get('width'))}×{md_text(doc.get('height'))}" if doc.get("width") else "default resolution"
    on = md_text(doc.get("device_name") or doc["device"])
    out = [
        f"## Technique matrix: {md_text(doc['pipeline'])} ({md_text(doc['size'])}, {res}, batch {md_text(doc['batch'])}, "
        f"{md_text(doc['steps'])} steps) on {on}",
        "",
    ]
    setup = [
        f"torch {md_text(doc['torch_version'])}" if doc.get("torch_version") else None,
        f"diffusers {md_text(doc['diffusers_version'])}" if doc.get("diffusers_version") else None,
        "memory history on (times include its overhead)"
        if doc["history"] and doc["device"] == "cuda"
        else ("no memory history" if doc["device"] == "cuda" else None),
        None
        if doc["jobs"] == 0
        else f"{doc['jobs']} variants at a time"
        if doc["jobs"] > 1
        else "one variant at a time",
        "each variant in a fresh process",
    ]
    out.append("Setup: " + ", ".join(s for s in setup if s) + ".")
    against = (
        f"Percentages are against the baseline {md_code(doc['baseline'])}."
        if doc.get("baseline")
        else "No variant ran, so nothing is ranked."
    )
    out.append(f"Memory: {doc['memory_metric_text']}. Times: {doc['time_text']}. {against}")
    out.append("")
    head, rows = table_cells(doc)
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
    for row in rows:
        out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    out += ["", f"**{doc['ranking_rule']}**"]
    notes = _notes(doc, md_code, md_text)
    if notes:
        out.append("")
        out += [f"- {n}" for n in notes]
    return "\n".join(printable(line, None) for line in out) + "\n"


def render_full_markdown(doc: dict[str, Any]) -> str:
    """The matrix section followed by snapviz compare's Markdown (when two variants succeeded)."""
    from snapviz.render.compare_md import render_compare_markdown

    text = render_matrix_markdown(doc)
    if doc.get("compare"):
        text += "\n" + render_compare_markdown(_compare_of(doc))
    return text


def _compare_of(doc: dict[str, Any]) -> CompareDocument:
    """The matrix document's ``compare`` object (the comparison's JSON form), typed again."""
    from snapviz.analyses.compare_document import load_compare

    return load_compare(doc["compare"], "matrix document: compare")


# ----------------------------------------------------------------------------- HTML


def _line(text: Any) -> str:
    # one visible line, as in the Markdown (control characters shown as escapes); the page kit escapes it
    return printable(text, None)


def matrix_card_html(doc: dict[str, Any], ident: str = "sv-matrix") -> str:
    """The matrix table, its rule and notes as one card of the shared page kit (``ident``: the
    card's id, unique on a page with several)."""
    from markupsafe import escape as esc

    from snapviz.render.html.page import card_open, html_table

    head, rows = table_cells(doc)
    table = html_table([_line(h) for h in head], [[_line(c.value) for c in row] for row in rows], "sv-matrix-table")
    items = "".join(f"<li>{esc(_line(n))}</li>" for n in _notes(bounded_doc(doc), str, str))
    # str(...): Markup + str would escape the str (the table's markup)
    return (
        str(card_open("Technique matrix", f"{_line(doc['memory_metric_text'])}. {_line(doc['time_text'])}.", ident))
        + f'<div class="sv-cmp-wrap">{table}</div><p class="sv-hint">{esc(_line(doc["ranking_rule"]))}</p>'
        + (f"<ul>{items}</ul>" if items else "")
        + "</section>"
    )


def render_matrix_html(doc: dict[str, Any], cmp: Comparison | None) -> str:
    """snapviz compare's page with the matrix table as its first card (or the table alone).

    bokeh is imported here, not at module level: a GPU box without it still writes the JSON
    and Markdown (the caller reports the ImportError and carries on)."""
    from snapviz.render.html import build_page, render_compare_html
    from snapviz.render.html.page import table_css

    card = matrix_card_html(doc)
    if cmp is not None and doc.get("compare"):
        return render_compare_html(cmp, _compare_of(doc), lead=[card])
    return build_page(f"snapviz matrix: {doc['pipeline']}", [table_css(), card])
