"""The what-if document (``snapviz.whatif/1``) as terminal text and Markdown: one set of words.

Two tables: every setting on the recorded card (reserved peak, fragmentation, cudaMalloc /
cudaFree counts, retries, and where it ran out of memory), then the reserved peak of every
setting on every card. Above them, whether the simulator reproduced the recording exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from snapviz.analyses.whatif_document import (
    ScenarioRow,
    SimulatedTwin,
    TwinRow,
    WhatIfDocument,
    WhatIfTwins,
)
from snapviz.safe_text import md_code, md_text, printable
from snapviz.units import fmt_bytes


def setting_name(conf: str | None) -> str:
    return "recorded settings" if conf is None else conf


def fidelity_line(doc: WhatIfDocument | WhatIfTwins) -> str:
    f = doc.fidelity
    if f.reproduced:
        return f"Simulation reproduced this run exactly ({f.reason})."
    return f"Figures are approximate: the simulation did not reproduce this run exactly — {f.reason}."


def recorded_line(doc: WhatIfDocument) -> str:
    r = doc.recorded
    conf = r.alloc_conf or "defaults"
    lim = r.gpu_memory_bytes
    cap = (
        "no recorded limit"
        if not lim
        else f"a {fmt_bytes(lim)} memory fraction"
        if r.memory_fraction
        else f"a {fmt_bytes(lim)} limit (reserved + free device memory at the OOM)"
    )
    oom = f"; ran out of memory at event {r.oom_event_index:,}" if r.oom_event_index is not None else ""
    return (
        f"Recorded: settings {conf}, {cap}; reserved peak {fmt_bytes(r.peak_reserved_bytes)}, "
        f"allocated peak {fmt_bytes(r.peak_allocated_bytes)}{oom} "
        f"({r.events:,} events, {r.requests:,} requests, {r.empty_cache_calls:,} empty_cache calls)."
    )


def _fits(survives_recorded_oom: bool) -> str:
    return "fits as far as recorded (gets past the recorded OOM)" if survives_recorded_oom else "fits"


def outcome(row: ScenarioRow | SimulatedTwin, with_stage: Callable[[str], str] = printable) -> str:
    """What happened: 'fits', or where it ran out of memory (event, stage, request, live)."""
    oom = row.oom
    if oom is None:
        return _fits(row.survives_recorded_oom)
    stage = f" in {with_stage(oom.stage)}" if oom.stage else ""
    rec = " (as recorded)" if oom.recorded else ""
    return (
        f"OOM at event {oom.event_index:,}{stage}{rec}: a {fmt_bytes(oom.requested_bytes)} request "
        f"with {fmt_bytes(oom.allocated_bytes)} allocated, {fmt_bytes(oom.reserved_bytes)} reserved"
    )


def card_line(doc: WhatIfDocument) -> str | None:
    """On a run that ran out of memory: the smallest card it fits on (analyze's OOM words)."""
    from snapviz.analyses.whatif import card_fit_text  # noqa: PLC0415

    if not doc.smallest_card:
        return None
    approx = "" if doc.fidelity.reproduced else " (approximate: the simulation did not reproduce this run)"
    text = card_fit_text(doc.smallest_card, ended=doc.recorded.oom_ended_run)
    return text[:1].upper() + text[1:] + approx + "."


def recorded_card_rows(doc: WhatIfDocument) -> list[ScenarioRow]:
    return [s for s in doc.scenarios if s.gpu_memory_bytes is None]


def _cards(doc: WhatIfDocument) -> list[tuple[int | None, str]]:
    seen: dict[int | None, str] = {}
    for s in doc.scenarios:
        seen.setdefault(s.gpu_memory_bytes, s.card)
    return list(seen.items())


def _peak_cell(s: ScenarioRow) -> str:
    return "OOM" if s.oom is not None and not s.oom.recorded else fmt_bytes(s.peak_reserved_bytes)


def card_grid(doc: WhatIfDocument) -> tuple[list[str], list[list[str]]]:
    cards = _cards(doc)
    head = ["settings"] + [("recorded card" if g is None else label) for g, label in cards]
    by: dict[tuple[str | None, int | None], ScenarioRow] = {
        (s.alloc_conf, s.gpu_memory_bytes): s for s in doc.scenarios
    }
    rows = []
    for s in recorded_card_rows(doc):
        conf = s.alloc_conf
        rows.append([setting_name(conf)] + [_peak_cell(by[(conf, g)]) if (conf, g) in by else "" for g, _ in cards])
    return head, rows


DETAIL_HEAD = ["settings", "reserved peak", "allocated peak", "fragmentation", "cudaMalloc", "cudaFree", "retries"]


def detail_cells(s: ScenarioRow) -> list[str]:
    return [
        setting_name(s.alloc_conf),
        fmt_bytes(s.peak_reserved_bytes),
        fmt_bytes(s.peak_allocated_bytes),
        fmt_bytes(s.fragmentation_bytes),
        f"{s.device_mallocs:,}",
        f"{s.device_frees:,}",
        f"{s.retries:,}",
    ]


def card_title(doc: WhatIfDocument) -> str:
    lim = doc.recorded.gpu_memory_bytes
    return f"the recorded card ({fmt_bytes(lim)} cap)" if lim else "the recorded card (no limit)"


def render_whatif_terminal(doc: WhatIfDocument) -> str:
    """The terminal summary."""
    out = [
        f"snapviz whatif: {printable(doc.source)} (cuda:{doc.device})",
        recorded_line(doc),
        fidelity_line(doc),
        *([c] if (c := card_line(doc)) else []),
        "",
        f"On {card_title(doc)}:",
    ]
    rows = [detail_cells(s) for s in recorded_card_rows(doc)]
    results = [outcome(s) for s in recorded_card_rows(doc)]
    out += _aligned([*DETAIL_HEAD, "result"], [[*r, x] for r, x in zip(rows, results, strict=True)])
    head, grid = card_grid(doc)
    if len(head) > 2:
        out += ["", "Reserved peak by card (OOM: the run would have died):"]
        out += _aligned(head, grid)
    for n in doc.notes:
        out.append(f"note: {printable(n)}")
    return "\n".join(out) + "\n"


def _aligned(head: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[printable(c) for c in r] for r in [head, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:-1], strict=True)]
        parts.append(r[-1] if len(r) > 1 else "")
        lines.append("  ".join(parts).rstrip())
    return lines


def render_whatif_markdown(doc: WhatIfDocument) -> str:
    """The Markdown summary (paste-ready; stays short: one row per setting)."""
    out = [
        f"### What if: {md_text(doc.source)} (cuda:{doc.device})",
        "",
        md_text(recorded_line(doc)),
        "",
        f"**{md_text(fidelity_line(doc))}**",
        "",
        *([md_text(c), ""] if (c := card_line(doc)) else []),
        f"On {md_text(card_title(doc))}:",
        "",
        "| " + " | ".join([*DETAIL_HEAD, "result"]) + " |",
        "|" + "---|" * (len(DETAIL_HEAD) + 1),
    ]
    for s in recorded_card_rows(doc):
        cells = detail_cells(s)
        conf = md_code(cells[0]) if s.alloc_conf is not None else cells[0]
        out.append("| " + " | ".join([conf, *cells[1:], md_text(outcome(s))]) + " |")
    head, grid = card_grid(doc)
    if len(head) > 2:
        out += ["", "Reserved peak by card (OOM: the run would have died):", ""]
        out.append("| " + " | ".join(md_text(h) for h in head) + " |")
        out.append("|" + "---|" * len(head))
        for r in grid:
            conf = md_code(r[0]) if r[0] != "recorded settings" else r[0]
            out.append("| " + " | ".join([conf, *(md_text(c) for c in r[1:])]) + " |")
    notes = doc.notes
    if notes:
        out.append("")
        out += [f"- {md_text(n)}" for n in notes]
    out += ["", "_Simulated by snapviz from the recorded requests (docs/whatif.md)._"]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- compare --whatif

TWIN_HEAD = [
    "run",
    "reserved peak",
    "vs recorded",
    "allocated peak",
    "fragmentation",
    "cudaMalloc",
    "cudaFree",
    "retries",
    "result",
]


def _twin_outcome(row: TwinRow) -> str:
    if isinstance(row, SimulatedTwin):
        return outcome(row)
    if row.oom is None:
        return _fits(row.survives_recorded_oom)
    return f"OOM at event {row.oom.event_index:,} (as recorded)"


def twin_cells(row: TwinRow) -> list[str]:
    d = row.peak_reserved_delta_bytes
    return [
        row.label,
        fmt_bytes(row.peak_reserved_bytes),
        "" if not row.simulated else ("±0" if d == 0 else ("+" if d > 0 else "−") + fmt_bytes(abs(d))),
        fmt_bytes(row.peak_allocated_bytes),
        fmt_bytes(row.fragmentation_bytes),
        f"{row.device_mallocs:,}",
        f"{row.device_frees:,}",
        "n/a" if row.retries is None else f"{row.retries:,}",
        _twin_outcome(row),
    ]


def twin_title(tw: WhatIfTwins) -> str:
    return f"What if: {tw.label} beside its simulated twins (same requests, other allocator settings, same card)"


def render_twin_terminal(tw: WhatIfTwins) -> list[str]:
    """``compare --whatif``'s section as terminal lines."""
    out = [twin_title(tw), "  " + fidelity_line(tw)]
    out += ["  " + line for line in _aligned(TWIN_HEAD, [twin_cells(r) for r in tw.rows])]
    return [printable(x) for x in out]


def render_twin_markdown(tw: WhatIfTwins) -> list[str]:
    """``compare --whatif``'s section as Markdown lines."""
    out = [f"### {md_text(twin_title(tw))}", "", f"**{md_text(fidelity_line(tw))}**", ""]
    out.append("| " + " | ".join(TWIN_HEAD) + " |")
    out.append("|" + "---|" * len(TWIN_HEAD))
    for r in tw.rows:
        cells = twin_cells(r)
        name = md_code(r.alloc_conf) + " (simulated)" if isinstance(r, SimulatedTwin) else md_text(cells[0])
        out.append("| " + " | ".join([name, *(md_text(c) for c in cells[1:])]) + " |")
    return out + ["", "_Simulated rows: snapviz's allocator simulator on the recorded requests (docs/whatif.md)._", ""]
