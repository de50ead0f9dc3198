"""The fit document (schema ``snapviz.fit/1``) and its Markdown and HTML.

Per card: every candidate (fits, out of memory, pruned with the reason, or why it could not run),
its peak per stage and time per image, the fastest that fits, and the card's runs as a matrix
document (``snapviz.matrix/1``, ranked against the baseline by the matrix's own rule), rendered by
the matrix's own Markdown and HTML card.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectors.matrix.document import matrix_dict
from collectors.matrix.ranking import STAGE_GROUPS, rank_results
from collectors.matrix.report import matrix_card_html, render_matrix_markdown
from collectors.matrix.runner import MatrixOptions, variant_row
from snapviz.safe_text import bounded_doc, md_code, md_text, printable
from snapviz.units import fmt_bytes

from .plan import BASELINE, Card
from .search import FitRow

SCHEMA = "snapviz.fit/1"
PRUNING_RULE = (
    "Pruning: cards run largest first and, on each card, cheap-to-measure combinations first (no "
    "offload, more techniques first). A combination is not run on a card when a measurement already "
    "proves it cannot fit: it ran out of memory under a cap at least as large; its peak allocated, "
    "measured under another cap, exceeds this one; its weights alone (the load stage's peak, also "
    "measured with a combination that differs only by VAE tiling/slicing) exceed it; or a strictly "
    "more memory-saving combination (a superset of its techniques) cannot fit by those rules."
)
STATUS_TEXT = {
    "ok": "fits",
    "oom": "out of memory",
    "unsupported": "unsupported",
    "timeout": "timeout",
    "failed": "failed",
}


def _row_dict(row: FitRow, batch: int) -> dict[str, Any]:
    base = {"label": row.variant.label, "techniques": list(row.variant.techniques), "decided_by": row.decided_by}
    if row.simulated is not None:  # no run of its own: peaks from the simulator, no times
        sim = row.simulated
        return {
            **base,
            "status": "fits" if sim.fits else "oom",
            "reason": sim.reason,
            "inferred": False,
            "peak_allocated_bytes": sim.peak_allocated_bytes,
            "peak_reserved_bytes": sim.peak_reserved_bytes,
            "stages": {},
            "call_s": None,
            "time_per_image_s": None,
            "step_median_s": None,
            "run_dir": sim.source_run_dir,
        }
    if row.result is None:
        return {
            **base,
            "status": "pruned",
            "reason": row.pruned,
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "stages": {},
            "call_s": None,
            "time_per_image_s": None,
            "step_median_s": None,
            "run_dir": None,
        }
    res = row.result
    m = res.measure or {}
    call = m.get("call_s")
    return {
        **base,
        "status": "fits" if res.ok else res.status,
        "reason": row.inferred or res.reason,
        "inferred": row.inferred is not None,
        "peak_allocated_bytes": m.get("peak_allocated_bytes"),
        "peak_reserved_bytes": m.get("peak_reserved_bytes"),
        "stages": {g: (m.get("stages") or {}).get(g, {}).get("peak_allocated_bytes") for g in STAGE_GROUPS}
        if m
        else {},
        "call_s": call,
        "time_per_image_s": round(call / batch, 6) if call is not None else None,
        "step_median_s": m.get("step_median_s"),
        "run_dir": str(res.run_dir),
    }


def _card_matrix(opts: MatrixOptions, card: Card, rows: Sequence[FitRow]) -> dict[str, Any] | None:
    """The card's runs as a matrix document, ranked like ``snapviz matrix`` ranks them."""
    ran = [variant_row(r.result) for r in rows if r.result is not None]
    ok = [r for r in ran if r["status"] == "ok" and r["measure"]]
    if not ran:
        return None
    base = (BASELINE if BASELINE in [r["label"] for r in ok] else ok[0]["label"]) if ok else None
    if base is not None:
        ran = rank_results(ran, base)
    card_opts = MatrixOptions(**{**opts.__dict__, "memory_limit_gb": card.gib})
    notes = [f"every variant's CUDA allocator was capped at {card.label} (set_per_process_memory_fraction)"]
    return matrix_dict(card_opts, ran, base, [], notes, None)


def fit_dict(
    opts: MatrixOptions,
    cards: Sequence[Card],
    rows: Sequence[FitRow],
    skipped: list[dict[str, str]],
    notes: list[str],
    run_info: dict[str, Any] | None,
) -> dict[str, Any]:
    info = run_info or {}
    out_cards = []
    for card in cards:
        mine = [r for r in rows if r.card == card]
        items = [_row_dict(r, opts.batch) for r in mine]
        fitting = [i for i in items if i["status"] == "fits" and i["call_s"] is not None]
        fastest = min(fitting, key=lambda i: i["call_s"])["label"] if fitting else None
        out_cards.append(
            {
                "label": card.label,
                "bytes": card.bytes,
                "fastest": fastest,
                "fits": [i["label"] for i in items if i["status"] == "fits"],
                "pruned": sum(1 for i in items if i["status"] == "pruned"),
                "rows": items,
                "matrix": _card_matrix(opts, card, mine),
            }
        )
    return {
        "schema": SCHEMA,
        "pipeline": opts.pipeline,
        "size": opts.size,
        "device": opts.device,
        "device_name": info.get("device_name"),
        "torch_version": info.get("torch_version"),
        "diffusers_version": info.get("diffusers_version"),
        "steps": opts.steps,
        "height": info.get("height", opts.height),
        "width": info.get("width", opts.width),
        "batch": opts.batch,
        "history": opts.history,
        "out": str(opts.out),
        "memory_metric_text": "CUDA caching allocator under a cap equal to the card "
        "(torch.cuda.set_per_process_memory_fraction): max_memory_allocated / "
        "max_memory_reserved, per stage after reset_peak_memory_stats(); the CUDA "
        "context is not counted",
        "time_text": (
            f"time per image: wall time of the pipe() call divided by the batch, at {opts.steps} "
            f"denoising step{'s' if opts.steps != 1 else ''}; step s: median of steps 1..N-1"
        ),
        "pruning_rule": PRUNING_RULE,
        # a refused combination is asked once and its one result shown on every card
        "runs": len({str(r.result.run_dir) for r in rows if r.result is not None}),
        "pruned": sum(1 for r in rows if r.pruned is not None),
        # fits shown without a run of their own: a larger cap's run that never reserved this much
        "inferred": sum(1 for r in rows if r.inferred is not None),
        # cells the allocator simulator decided from a larger card's recording (--history)
        "simulated": sum(1 for r in rows if r.simulated is not None),
        "cards": out_cards,
        "skipped": skipped,
        "notes": notes,
    }


# ----------------------------------------------------------------------------- rendering


def _gib(n: Any) -> str:
    return fmt_bytes(n) if n is not None else ""


def fit_table(card: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (plain text, escaped by each renderer) of one card's table."""
    head = ["variant", "fits?", "peak allocated", "peak reserved", *STAGE_GROUPS, "s per image", "step s"]
    rows = []
    for r in card["rows"]:
        sim = r.get("decided_by") == "simulated"
        if r["status"] == "fits":
            t, s = r["time_per_image_s"], r["step_median_s"]
            rows.append(
                [
                    r["label"],
                    "yes (simulated)" if sim else "yes",
                    _gib(r["peak_allocated_bytes"]),
                    _gib(r["peak_reserved_bytes"]),
                    *(_gib(r["stages"].get(g)) for g in STAGE_GROUPS),
                    f"{t:.2f}" if t is not None else "",
                    f"{s:.3f}" if s is not None else "",
                ]
            )
        else:
            what = "pruned" if r["status"] == "pruned" else STATUS_TEXT.get(r["status"], r["status"])
            what += " (simulated)" if sim else ""
            rows.append([r["label"], f"no: {what}: {r['reason'] or ''}".rstrip(": ")] + [""] * (len(head) - 2))
    return head, rows


def _title(doc: dict[str, Any]) -> str:
    res = f"{doc['width']}×{doc['height']}" if doc.get("width") else "default resolution"
    return (
        f"Will it fit? {doc['pipeline']} ({doc['size']}, {res}, batch {doc['batch']}, {doc['steps']} steps) "
        f"on {doc.get('device_name') or doc['device']}"
    )


def _fastest_line(doc: dict[str, Any], card: dict[str, Any], code: Any) -> str:
    if card["fastest"] is None:
        return f"Nothing measured fits {card['label']}."
    row = next(r for r in card["rows"] if r["label"] == card["fastest"])
    return (
        f"Fastest that fits {card['label']}: {code(card['fastest'])}, {row['time_per_image_s']:.2f} s per image "
        f"at {doc['steps']} steps, peak {_gib(row['peak_allocated_bytes'])}."
    )


def render_fit_markdown(doc: dict[str, Any]) -> str:
    doc = bounded_doc(doc)
    out = [
        f"## {md_text(_title(doc))}",
        "",
        f"Memory: {doc['memory_metric_text']}. Times: {doc['time_text']}. "
        f"{doc['runs']} run{'s' if doc['runs'] != 1 else ''}, {doc['pruned']} pruned, "
        f"{doc.get('inferred', 0)} fit{'s' if doc.get('inferred', 0) != 1 else ''} inferred from a larger cap's run, "
        f"{doc.get('simulated', 0)} cell{'s' if doc.get('simulated', 0) != 1 else ''} simulated from a larger "
        "card's snapshot (the rest measured).",
        "",
    ]
    for card in doc["cards"]:
        out += [f"### {md_text(card['label'])} card", "", _fastest_line(doc, card, md_code), ""]
        head, rows = fit_table(card)
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
        out += ["| " + " | ".join([md_code(r[0]), *(md_text(c) for c in r[1:])]) + " |" for r in rows]
        out.append("")
    out.append(f"**{doc['pruning_rule']}**")
    extra = [f"{md_code(s['label'])} skipped: {md_text(s['reason'])}" for s in doc["skipped"]]
    extra += [md_text(n) for n in doc["notes"]]
    if extra:
        out += [""] + [f"- {n}" for n in extra]
    text = "\n".join(printable(line, None) for line in out) + "\n"
    for card in doc["cards"]:
        if card["matrix"]:
            text += f"\n### Ranked against the baseline, {md_text(card['label'])} card\n\n"
            text += render_matrix_markdown(card["matrix"])
    return text


def fit_card_html(doc: dict[str, Any]) -> str:
    """The fit tables, one per card, as one card of the shared page kit (which escapes)."""
    from markupsafe import escape as esc

    from snapviz.render.html.page import card_open, html_table

    # str(...): the parts are joined as text (Markup + str would escape the str)
    parts: list[str] = [
        str(
            card_open(
                printable(_title(doc), None),
                printable(f"{doc['memory_metric_text']}. {doc['time_text']}.", None),
                "sv-fit",
            )
        )
    ]
    for i, card in enumerate(doc["cards"]):
        head, rows = fit_table(card)
        table = html_table(
            [printable(h, None) for h in head], [[printable(c, None) for c in r] for r in rows], f"sv-fit-table-{i}"
        )
        parts.append(
            f"<h3>{esc(printable(card['label'], None))} card</h3>"
            f'<p>{esc(printable(_fastest_line(doc, card, str), None))}</p><div class="sv-cmp-wrap">{table}</div>'
        )
    parts.append(f'<p class="sv-hint">{esc(printable(doc["pruning_rule"], None))}</p></section>')
    return "".join(parts)


def render_fit_html(doc: dict[str, Any]) -> str:
    """One page: the fit card, then each card's matrix card. bokeh is imported here (a GPU box
    without it still writes JSON and Markdown)."""
    from snapviz.render.html import build_page
    from snapviz.render.html.page import table_css

    doc = bounded_doc(doc)
    blocks = [table_css(), fit_card_html(doc)]
    blocks += [matrix_card_html(c["matrix"], f"sv-matrix-{i}") for i, c in enumerate(doc["cards"]) if c["matrix"]]
    return build_page(f"snapviz fit: {doc['pipeline']}", blocks)


def card_dir(out: Path, card: Card) -> Path:
    return out / card.label.replace(" ", "")
