"""Markdown (≤ 60 lines, for an issue) and terminal text for ``ranks`` and ``history``.

Both render the documents only (``snapviz.ranks/1``, ``snapviz.history/1``, typed:
:mod:`snapviz.analyses.fleet_document`), so every output says the same sentences with the same
numbers.
"""

from __future__ import annotations

from snapviz.analyses.fleet_document import HistoryDocument, RankRow, RanksDocument
from snapviz.safe_text import md_code, md_text, printable
from snapviz.units import fmt_bytes, fmt_delta

MAX_LINES = 60
MD_RANK_ROWS = 12  # ranks listed in Markdown: outliers and OOM ranks first, then the highest
TERMINAL_RANK_ROWS = 40


def _b(v: float | None) -> str:
    return "—" if v is None else fmt_bytes(v)


def _d(v: int | None) -> str:
    return "—" if v is None else ("=" if v == 0 else fmt_delta(v))


def who(r: RankRow) -> str:
    return f"rank {r.rank}" if r.rank is not None else str(r.label)


def rank_cells(r: RankRow) -> list[str]:
    p = r.peak
    if r.status != "ok":
        return [who(r), "failed", "", "", "", "", str(r.reason)]
    oom = "no" if not r.oom.count else f"yes ({r.oom.count})"
    site = r.top_site.site if r.top_site else "—"
    truth = r.allocator
    check = ""
    if truth is not None:
        check = (
            "= allocator"
            if truth.max_memory_allocated == p.allocated_bytes
            else "≠ allocator " + _b(truth.max_memory_allocated)
        )
    return [who(r), _b(p.allocated_bytes), _b(p.reserved_bytes), str(p.stage), oom, site, check]


def chosen_ranks(doc: RanksDocument, limit: int) -> list[RankRow]:
    """The ranks a short listing shows: failed, outliers and OOM ranks first, then the highest
    peaks; in table order."""
    ranks = doc.ranks
    marked = set()
    for v in doc.iterations:
        whos = {o.who for o in v.outliers} | set(v.oom_ranks)
        for i, r in enumerate(ranks):
            if r.iteration == v.iteration and who(r) in whos:
                marked.add(i)
    marked |= {i for i, r in enumerate(ranks) if r.status != "ok"}
    rest = sorted(
        (i for i in range(len(ranks)) if i not in marked and ranks[i].status == "ok"),
        key=lambda i: -(ranks[i].peak.allocated_bytes or 0),
    )
    pick = sorted(list(marked)[:limit] + rest[: max(0, limit - len(marked))])
    return [ranks[i] for i in pick]


RANK_COLUMNS = ["rank", "peak allocated", "peak reserved", "stage at peak", "OOM", "top site", "vs run.json"]


def render_ranks_markdown(doc: RanksDocument, max_lines: int = MAX_LINES) -> str:
    lines = [f"### snapviz ranks: {doc.inputs} inputs", ""]
    lines += [f"- {md_text(v)}" for v in doc.verdict]
    for v in doc.iterations:
        wm = [s for s in v.worst_vs_median if s.delta_bytes != 0]
        if v.max is None or v.median is None or not wm:
            continue
        it = "" if v.iteration is None or len(doc.iterations) == 1 else f" (iteration {v.iteration})"
        lines += [
            "",
            f"**{md_text(v.max.who)} vs median {md_text(v.median.who)}, stage by stage{it}**",
            "",
            "| stage | worst | median | Δ |",
            "|---|---:|---:|---:|",
        ]
        for s in wm[:8]:
            lines.append(f"| {md_code(s.stage)} | {_b(s.worst_bytes)} | {_b(s.median_bytes)} | {_d(s.delta_bytes)} |")
    shown = chosen_ranks(doc, MD_RANK_ROWS)
    lines += ["", "| " + " | ".join(RANK_COLUMNS) + " |", "|---|---:|---:|---|---|---|---|"]
    for r in shown:
        c = rank_cells(r)
        lines.append(
            "| " + " | ".join([md_text(c[0]), c[1], c[2], md_code(c[3]), c[4], md_code(c[5]), md_text(c[6])]) + " |"
        )
    if len(doc.ranks) > len(shown):
        lines.append(f"\n{len(doc.ranks) - len(shown)} more ranks in the HTML and JSON reports.")
    return "\n".join(lines[:max_lines]) + "\n"


def render_ranks_terminal(doc: RanksDocument) -> str:
    out = [f"snapviz ranks: {doc.inputs} inputs"]
    out += [f"  {printable(v)}" for v in doc.verdict]
    shown = chosen_ranks(doc, TERMINAL_RANK_ROWS)
    rows = [RANK_COLUMNS] + [[printable(c, 60) for c in rank_cells(r)] for r in shown]
    width = [max(len(r[k]) for r in rows) for k in range(len(RANK_COLUMNS))]
    out.append("")
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows]
    if len(doc.ranks) > len(shown):
        out.append(f"  … {len(doc.ranks) - len(shown)} more ranks (--json, --markdown, -o report.html)")
    return "\n".join(out) + "\n"


def history_rows(doc: HistoryDocument) -> list[list[str]]:
    rows = []
    for s in doc.stages:
        j = s.jump
        jump = "—" if j is None else f"{fmt_delta(j.delta_bytes)} in {j.run}"
        rows.append(
            [
                s.stage,
                _b(s.first_bytes),
                _b(s.last_bytes),
                _d(s.change_bytes),
                f"{_b(s.min_bytes)}",
                jump,
            ]
        )
    return rows


HISTORY_COLUMNS = ["stage", "first", "last", "change", "lowest", "largest jump"]


def render_history_markdown(doc: HistoryDocument, max_lines: int = MAX_LINES) -> str:
    lines = [f"### snapviz history: {len(doc.runs)} runs by {md_text(doc.order_by)}", ""]
    lines += [f"- {md_text(v)}" for v in doc.verdict]
    lines += ["", "| " + " | ".join(HISTORY_COLUMNS) + " |", "|---|---:|---:|---:|---:|---|"]
    for r in history_rows(doc)[:30]:
        lines.append("| " + " | ".join([md_code(r[0]), *r[1:5], md_text(r[5])]) + " |")
    return "\n".join(lines[:max_lines]) + "\n"


def render_history_terminal(doc: HistoryDocument) -> str:
    out = [f"snapviz history: {len(doc.runs)} runs ordered by {printable(doc.order_by)}"]
    out += [f"  {printable(v)}" for v in doc.verdict]
    rows = [HISTORY_COLUMNS] + [[printable(c, 60) for c in r] for r in history_rows(doc)]
    width = [max(len(r[k]) for r in rows) for k in range(len(HISTORY_COLUMNS))]
    out.append("")
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows]
    return "\n".join(out) + "\n"
