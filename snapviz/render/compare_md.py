"""Markdown (for issues and PR comments, ≤ 60 lines) and terminal text for a comparison.

Both render a ``snapviz.compare/1`` dict (see :func:`snapviz.analyses.compare.compare_dict`).
"""

from __future__ import annotations

from typing import Any

from snapviz.render.fmt import fmt_compare_kind
from snapviz.safe_text import bounded_doc, md_code, md_text, printable
from snapviz.units import fmt_bytes, fmt_delta, fmt_ratio_pct

MAX_LINES = 60


def _cell(value: int | None, delta: int | None, ratio: float | None, is_base: bool) -> str:
    if value is None:
        return "—"
    if is_base or delta is None:
        return fmt_bytes(value)
    if delta == 0:
        return f"{fmt_bytes(value)} (=)"
    return f"{fmt_bytes(value)} ({fmt_delta(delta)}{'' if ratio is None else f', {ratio * 100:+.1f}%'})"


def _step_lines(doc: dict[str, Any], labels: list[str]) -> list[str]:
    """One line per stage with steps: how many aligned, and the largest step change per run."""
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for s in doc.get("steps") or []:
        by_stage.setdefault(s["stage"], []).append(s)
    out = []
    for stage, steps in by_stage.items():
        parts = []
        for r in range(1, len(labels)):
            deltas = [(abs(s["delta_bytes"][r]), s) for s in steps if s["delta_bytes"][r] is not None]
            if not deltas:
                parts.append(f"{md_code(labels[r])} no such steps")
                continue
            _, worst = max(deltas, key=lambda x: x[0])
            d, ratio = worst["delta_bytes"][r], worst["delta_ratio"][r]
            missing = sum(1 for s in steps if s["peak_allocated_bytes"][r] is None)
            gone = f" ({missing} missing)" if missing else ""
            parts.append(
                f"{md_code(labels[r])} steps unchanged{gone}"
                if not d
                else f"{md_code(labels[r])} largest step change {fmt_delta(d)}{fmt_ratio_pct(ratio)} at {md_code(worst['name'])}{gone}"
            )
        out.append(f"- {md_code(stage)}: {len(steps)} steps aligned by step number; " + "; ".join(parts))
    return out


def _first_upper(s: str) -> str:
    return s[:1].upper() + s[1:]


def render_compare_markdown(doc: dict[str, Any], max_lines: int = MAX_LINES) -> str:
    """Labels, stage and site names and warnings come from the inputs (and --label): each goes
    through :func:`md_code` or :func:`md_text` (docs/security.md, "Escaping")."""
    doc = bounded_doc(doc)
    runs = doc["runs"]
    labels = [r["label"] for r in runs]
    n = len(runs)
    out: list[str] = [
        f"### {_first_upper(md_text(fmt_compare_kind(doc)))} comparison: {md_code(labels[0])} (base) vs "
        + ", ".join(md_code(x) for x in labels[1:]),
        "",
    ]
    out += [f"- {md_text(v)}" for v in doc.get("verdict") or []][:8]
    if n - 1 > 8:
        out.append(f"- … {n - 1 - 8} more runs (see the JSON)")
    out.append("")
    out += [
        "| run | peak allocated | Δ vs base | peak reserved | Δ reserved | peak in |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(runs):
        p = r["peak"]
        if i == 0:
            out.append(
                f"| {md_code(r['label'])} (base) | {fmt_bytes(p['allocated_bytes'])} | | {fmt_bytes(p['reserved_bytes'])} | | {md_code(p['stage'])} |"
            )
        else:
            out.append(
                f"| {md_code(r['label'])} | {fmt_bytes(p['allocated_bytes'])} | {fmt_delta(r['delta_bytes'])}{fmt_ratio_pct(r.get('delta_ratio'))} "
                f"| {fmt_bytes(p['reserved_bytes'])} | {fmt_delta(r['reserved_delta_bytes'])} | {md_code(p['stage'])} |"
            )
    out.append("")
    stages = doc.get("stages") or []
    if stages:
        shown = min(len(stages), 10 if n <= 4 else 6)
        out += [
            "Peak allocated per stage (Δ vs base):",
            "",
            "| stage | " + " | ".join(md_code(x) for x in labels) + " |",
            "|---|" + "---:|" * n,
        ]
        for s in stages[:shown]:
            cells = [
                _cell(s["peak_allocated_bytes"][i], s["delta_bytes"][i], s["delta_ratio"][i], i == 0) for i in range(n)
            ]
            out.append(f"| {md_code(s['name'])} | " + " | ".join(cells) + " |")
        if len(stages) > shown:
            out.append(f"| … {len(stages) - shown} more | " + " | ".join("" for _ in range(n)) + " |")
        out.append("")
    steps = _step_lines(doc, labels)
    if steps:
        out += steps[:3] + [""]
    sites = doc.get("sites") or []
    if sites:
        k = 8 if n <= 3 else 5
        out += [
            "Allocation sites that changed (Δ bytes live at the peak / allocated in total):",
            "",
            "| site | " + " | ".join(md_code(x) for x in labels[1:]) + " |",
            "|---|" + "---|" * (n - 1),
        ]
        for s in sites[:k]:
            cells = []
            for i in range(1, n):
                st = s["status"][i]
                cells.append(
                    f"{md_text(st)} {fmt_delta(s['delta_peak_live_bytes'][i])} / {fmt_delta(s['delta_total_bytes'][i])}"
                    if st not in ("same", "absent", "n/a")
                    else md_text(st)
                )
            out.append(f"| {md_code(s['site'])} | " + " | ".join(cells) + " |")
        out.append("")
    att = doc.get("attention") or {}
    if any(att.get("count") or []):
        out.append(
            "Attention scores: "
            + "; ".join(
                f"{md_code(labels[i])} {att['count'][i]} materialized, up to {fmt_bytes(att['peak_live_bytes'][i])} live"
                for i in range(n)
            )
            + "."
        )
    cats = [c for c in doc.get("categories") or [] if any(d for d in c["delta_bytes"][1:])]
    if cats:
        cats.sort(key=lambda c: -max(abs(d or 0) for d in c["delta_bytes"][1:]))
        out.append(
            "Live at each run's peak, by category (Δ vs base): "
            + "; ".join(
                f"{md_text(c['name'])} "
                + ", ".join(
                    f"{md_code(labels[i])} {fmt_delta(c['delta_bytes'][i])}" for i in range(1, n) if c["delta_bytes"][i]
                )
                for c in cats[:4]
            )
            + "."
        )
    warned = [(r["label"], w) for r in runs for w in (r.get("warnings") or [])]
    if att or cats:
        out.append("")
    for label, w in warned[:3]:
        out.append(f"> ⚠️ {md_code(label)}: {md_text(w)}")
    fo = doc.get("fail_over")
    if fo is not None:
        out.append(f"**Gate (--fail-over {fo['percent']:g}%): {'passed' if fo['passed'] else 'FAILED'}**")
    out += ["", "<sub>Generated by snapviz compare</sub>"]
    if len(out) > max_lines:
        out = out[: max_lines - 1] + ["<sub>(truncated)</sub>"]
    return "\n".join(printable(line, None) for line in out) + "\n"


def render_compare_terminal(doc: dict[str, Any]) -> str:
    """A short summary: verdicts, then each run's peak and the stage table (input strings
    clipped, control characters escaped line by line)."""
    doc = bounded_doc(doc)
    runs = doc["runs"]
    labels = [r["label"] for r in runs]
    lines = [
        f"snapviz compare: base {labels[0]} ({fmt_bytes(runs[0]['peak']['allocated_bytes'])} peak allocated in {runs[0]['peak']['stage']})"
    ]
    lines += [f"  {v}" for v in doc.get("verdict") or []]
    stages = doc.get("stages") or []
    if stages:
        width = max(len(s["name"]) for s in stages[:12])
        lines.append("  " + "stage".ljust(width) + "".join(f"  {lab[:26]:>26}" for lab in labels))
        for s in stages[:12]:
            cells = []
            for i in range(len(labels)):
                v, d = s["peak_allocated_bytes"][i], s["delta_bytes"][i]
                txt = "—" if v is None else fmt_bytes(v) if i == 0 or not d else f"{fmt_bytes(v)} ({fmt_delta(d)})"
                cells.append(f"  {txt:>26}")
            lines.append("  " + s["name"].ljust(width) + "".join(cells))
    fo = doc.get("fail_over")
    if fo is not None:
        lines.append(f"  gate --fail-over {fo['percent']:g}%: {'passed' if fo['passed'] else 'FAILED'}")
    return "\n".join(printable(line, None) for line in lines) + "\n"
