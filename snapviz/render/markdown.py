"""Markdown summary, paste-ready for a GitHub issue (at most ~60 lines).

Order is what a reader of the issue needs first: the peak, what would help, then per
stage what its peak was made of, then the evidence (live blocks at the peak). Denoising
steps are one row (the peak step and the range over steps), so a 50-step run fits too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from snapviz.analyses.document import (
    ABSENT,
    Absent,
    Attention,
    EndState,
    Interval,
    Oom,
    StageGroup,
    Summary,
    TraceAttention,
    Training,
    arr,
    bounded_summary,
    obj,
)
from snapviz.analyses.oom import oom_lines
from snapviz.render.fmt import fmt_bytes, fmt_device, fmt_peak_bound, fmt_peak_where, fmt_report_kind
from snapviz.safe_text import md_code, md_text, printable
from snapviz.vocab import BEFORE_RECORDING, END_STATE_ONLY

MAX_STAGE_ROWS = 12
MAX_TOP_ROWS = 10
MIN_TOP_ROWS = 3


def _known_bytes(n: int | None) -> str:
    return "not recorded" if n is None else fmt_bytes(n)


def _span(lo: int, hi: int) -> str:
    """``2.43–4.50 GiB`` (one unit when both share it)."""
    a, b = fmt_bytes(lo), fmt_bytes(hi)
    if a.split(" ")[-1] == b.split(" ")[-1]:
        return f"{a.rsplit(' ', 1)[0]}–{b}"
    return f"{a}–{b}"


def _peak_interval(stage: StageGroup) -> Interval | StageGroup:
    """The stage's interval with the highest peak (first on ties), or the stage itself."""
    if not stage.intervals:
        return stage
    return max(stage.intervals, key=lambda it: it.peak_allocated_bytes or 0)


def stage_rows(doc: Summary) -> list[dict[str, Any]]:
    """One row per stage (denoising steps grouped): what the Markdown stage table shows.

    ``intervals``/``steps``: counts; ``peak_interval``: the name of the interval with the
    stage's peak; ``range``: (lowest, highest) interval peak when there are several;
    ``top``: [(category, bytes, share of that interval's peak)] largest first, with memory
    from before the recording as ``before recording``; ``largest``: the largest block
    the peak interval allocated itself (:class:`SiteBytes`) or None.
    """
    out = []
    for s in doc.stages:
        ivs = s.intervals
        pk = _peak_interval(s)
        total = pk.peak_allocated_bytes or 0
        at_peak = pk.categories_at_peak if isinstance(pk, Interval) else ABSENT
        cats = dict(at_peak) if not isinstance(at_peak, Absent) else {}
        if cats and total > sum(cats.values()):
            cats[BEFORE_RECORDING] = cats.get(BEFORE_RECORDING, 0) + total - sum(cats.values())
        top = sorted(cats.items(), key=lambda kv: -kv[1])
        peaks = [i.peak_allocated_bytes or 0 for i in ivs]
        own = pk.top_allocations if isinstance(pk, Interval) and not isinstance(pk.top_allocations, Absent) else []
        out.append(
            {
                # None where the input has no figure (trace without memory events or Total Reserved)
                "name": s.name,
                "peak_allocated_bytes": s.peak_allocated_bytes,
                "peak_reserved_bytes": s.peak_reserved_bytes,
                "intervals": len(ivs),
                "steps": len(s.steps),
                "peak_interval": pk.name,
                "range": (min(peaks), max(peaks)) if len(peaks) > 1 else None,
                "top": [(c, b, b / total if total else 0.0) for c, b in top],
                "largest": max(own, key=lambda t: t.bytes) if own else None,
            }
        )
    return out


def _stage_table(doc: Summary) -> list[str]:
    stages = doc.stages
    if not stages:
        return []
    rss = {s.name: max((_rss(i) for i in s.intervals), default=0) for s in stages}
    has_rss = any(rss.values())
    rows = stage_rows(doc)
    has_cats = any(r["top"] for r in rows)
    head = "| stage | peak allocated | peak reserved | steps |"
    rule = "|---|---:|---:|---|"
    if has_cats:
        head += " most memory at its peak | largest block it allocated |"
        rule += "---|---|"
    if has_rss:
        head += " peak RSS |"
        rule += "---:|"
    out = [head, rule]
    for r in rows[:MAX_STAGE_ROWS]:
        n = r["steps"] or r["intervals"]
        what = f"{n} step{'s' if n != 1 else ''}" if r["steps"] else f"{n} intervals"
        if r["range"]:
            steps = f"{what}, peak {md_code(r['peak_interval'])}, {_span(*r['range'])}"
        else:
            steps = what if r["steps"] else f"{n} interval{'s' if n != 1 else ''}"
        line = (
            f"| {md_code(r['name'])} | {_known_bytes(r['peak_allocated_bytes'])} | "
            f"{_known_bytes(r['peak_reserved_bytes'])} | {steps} |"
        )
        if has_cats:
            top = ", ".join(f"{md_text(c)} {share:.0%}" for c, _, share in r["top"][:2])
            lg = r["largest"]
            own = f"{fmt_bytes(lg.bytes)} {md_code(lg.site)}" if lg else "none live at its peak"
            line += f" {top or 'not itemized'} | {own} |"
        if has_rss:
            line += f" {fmt_bytes(rss[r['name']])} |"
        out.append(line)
    if len(rows) > MAX_STAGE_ROWS:
        out.append(
            f"| … {len(rows) - MAX_STAGE_ROWS} more stages | | | |"
            + (" | |" if has_cats else "")
            + (" |" if has_rss else "")
        )
    return out + [""]


def _rss(iv: Interval) -> int:
    return iv.rss_peak_bytes if not isinstance(iv.rss_peak_bytes, Absent) else 0


def _training_table(training: Training | Absent) -> list[str]:
    """Training runs: per optimizer step, its peak and the categories live at it (before recording included)."""
    if isinstance(training, Absent) or not training.steps:
        return []
    steps = training.steps
    cats = [c for c in training.categories if any(s.categories_at_peak.get(c) for s in steps)]
    out = [
        "Per optimizer step, the peak and what it is made of (allocator blocks):",
        "",
        "| step | peak | in | " + " | ".join(md_text(c) for c in cats) + " |",
        "|---:|---:|---|" + "---:|" * len(cats),
    ]
    for s in steps[:MAX_STAGE_ROWS]:
        out.append(
            f"| {s.step} | {fmt_bytes(s.peak_allocated_bytes)} | {md_code(s.peak_phase)} | "
            + " | ".join(fmt_bytes(s.categories_at_peak.get(c, 0)) for c in cats)
            + " |"
        )
    return out + [""]


def _oom_section(oom: Oom | None) -> list[str]:
    """The failed request first (the same sentences as every sink: analyses.oom.oom_lines)."""
    if oom is None:
        return []
    head, *rest = oom_lines(oom)
    out = [f"**{md_text(head)}**", ""] + [f"- {md_text(x)}" for x in rest]
    if oom.live_categories:
        out.append(
            "- live then: " + ", ".join(f"{md_text(c.category)} {fmt_bytes(c.bytes)}" for c in oom.live_categories[:5])
        )
    if oom.live_sites:
        out.append(
            "- largest live sites: " + ", ".join(f"{md_code(c.site)} {fmt_bytes(c.bytes)}" for c in oom.live_sites[:3])
        )
    return out + [""]


def render_markdown(summary: Summary, max_lines: int = 60, picture: str | None = None) -> str:
    """Render a ``snapviz.summary/1`` document. Every string from the input goes through
    :func:`md_text` or :func:`md_code` (docs/security.md, "Escaping"). ``picture``: the path of
    a timeline picture written beside it (``--png``/``--svg``), relative to the Markdown file;
    it is shown under the title (upload both to the ticket)."""
    summary = bounded_summary(summary)
    p, h = summary.peak, summary.history
    run = summary.run
    title = " ".join(
        md_text(x)
        for x in (
            (
                run.pipeline,
                run.size,
                f"{run.height}x{run.width}" if run.height else None,
                run.dtype,
                "+".join(map(str, arr(run.techniques))) or None,
            )
            if run is not None
            else ()
        )
        if x
    )
    is_trace = summary.is_trace
    kind = fmt_report_kind(summary)
    oom = summary.oom if isinstance(summary.oom, Oom) else None
    oom_tag = (" — CUDA out of memory" + (" (survived)" if oom.survived else "")) if oom else ""
    out: list[str] = [f"### {md_text(kind)}: {title or md_text(summary.source)}{oom_tag}", ""]
    if picture:
        out += [f"![memory timeline]({quote(picture)})", ""]
    out += _oom_section(oom)
    if summary.not_recorded:  # no peak table for a file that recorded nothing of it
        out += [f"**{md_text(summary.not_recorded)}**", ""]
        rest = [w for w in summary.warnings if w != summary.not_recorded]
        out += [f"> ⚠️ {md_text(w)}" for w in rest[:5]] + ([""] if rest else [])
        out += ["<sub>Generated by snapviz</sub>"]
        return "\n".join(printable(line, None) for line in out) + "\n"
    window = " (within the recorded window)" if p.within_recorded_window else ""
    bound = fmt_peak_bound(p)
    label = {"": "", "at least ": " (lower bound)", "about ": " (approximate)"}[bound]
    es = summary.end_state if isinstance(summary.end_state, EndState) else None
    only = es is not None and es.only
    moment, at_moment = ("", "at the end state") if only else ("peak", "at the peak")
    where = md_text(fmt_peak_where(p).strip())
    out += ["| | bytes | |", "|---|---:|---|"]
    if only:
        out.append(
            f"| live allocated ({md_text(END_STATE_ONLY)}) | {p.allocated_bytes:,} | **{fmt_bytes(p.allocated_bytes)}** |"
        )
    elif h.events or p.allocated_bytes:
        out.append(
            f"| peak allocated{window}{label} | {p.allocated_bytes:,} | **{bound}{fmt_bytes(p.allocated_bytes)}** {where} |"
        )
    else:
        out.append("| peak allocated | not recorded | the input has no memory events |")
    if p.reserved_bytes is not None:
        out.append(
            f"| {moment + ' ' if moment else ''}reserved | {p.reserved_bytes:,} | {fmt_bytes(p.reserved_bytes)} |"
        )
    else:
        out.append("| peak reserved | not recorded | this trace carries no Total Reserved |")
    if p.requested_bytes is not None:
        out.append(
            f"| {moment + ' ' if moment else ''}requested | {p.requested_bytes:,} | {fmt_bytes(p.requested_bytes)} "
            f"(rounding: {fmt_bytes(p.allocated_bytes - p.requested_bytes)}) |"
        )
    truth = summary.allocator_truth.max_memory_allocated if summary.allocator_truth is not None else None
    if isinstance(truth, (int, float)) and not isinstance(truth, bool) and truth:
        out.append(f"| allocator's own max_memory_allocated | {truth:,} | {fmt_bytes(truth)} |")
    out.append("")
    advice = summary.advice if not isinstance(summary.advice, Absent) else []
    if advice:
        out.append("**What would help** (from this run's live set at the peak):")
        for a in advice:  # every entry the JSON has: a cap hid fused AdamW behind newer entries
            saves = f" — up to {fmt_bytes(a.saves_up_to_bytes)}" if a.saves_up_to_bytes else ""
            out.append(f"- **{md_text(a.technique)}**{saves}: {md_text(a.why)}. {md_code(a.how)}")
        out.append("")
    if es is not None and es.only:  # no stages in time: what held the memory, by the blocks' own frames
        out.append(
            "**End state by site:** "
            + ", ".join(f"{md_code(x.site)} {fmt_bytes(x.bytes)} ({x.count:,} blocks)" for x in es.sites[:5])
        )
        out.append("")
    else:
        out += _stage_table(summary)
    pre = es.before_recording if es is not None else None
    if not only and pre is not None and pre.itemised_bytes:
        out.append(
            f"**Before recording:** {fmt_bytes(pre.bytes)}, of which {fmt_bytes(pre.itemised_bytes)} is itemised "
            "by the end-state blocks' frames: "
            + ", ".join(f"{md_code(x.site)} {fmt_bytes(x.bytes)}" for x in pre.sites[:3])
        )
        out.append("")
    out += _training_table(summary.training)
    out += _attention(summary.attention)
    cats = summary.categories if isinstance(summary.categories, list) else []
    tail: list[str] = []
    if cats:
        tail.append(
            f"By category {at_moment}: "
            + ", ".join(f"{md_text(c.category)} {fmt_bytes(c.bytes)}" for c in cats if c.bytes)
        )
        tail.append("")
    settings = obj(summary.allocator_settings)
    baseline = f"{'at least ' if h.baseline_exact is False else ''}{fmt_bytes(h.baseline_allocated_bytes)}"
    if is_trace:
        source = f"{h.events:,} memory events on {md_text(fmt_device(summary))}, " + (
            f"{baseline} allocated before the first one"
            if h.baseline_allocated_bytes is not None
            else "memory allocated before profiling began not known"
        )
    elif "PYTORCH_CUDA_ALLOC_CONF" in settings:
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        conf_code = md_code("PYTORCH_CUDA_ALLOC_CONF=" + str(conf or "(unset)"), limit=None)  # conf is clipped already
        source = (
            f"Allocator: {conf_code}, expandable_segments={md_text(settings.get('expandable_segments', 'n/a'))}; "
            f"history {h.events:,} events, baseline {baseline}"
        )
    else:
        # Snapshots of torch < 2.1 carry no allocator_settings: say so rather than print empty values.
        source = f"Allocator: settings not in this snapshot; history {h.events:,} events, baseline {baseline}"
    tail.append(f"{source}; stages from {md_code(summary.stage_source)}.")
    if run is not None and run.torch_version:
        tail.append(f"Recorded with torch {md_text(run.torch_version)} on {md_text(run.device_name)}.")
    if summary.warnings:
        tail.append("")
        tail += [f"> ⚠️ {md_text(w)}" for w in summary.warnings[:5]]
    tail += ["", "<sub>Generated by snapviz</sub>"]
    # The live-at-the-peak table takes the room that is left (the rest is worth more).
    top = summary.top_allocations
    room = max_lines - len(out) - len(tail) - 5
    n_top = min(len(top), MAX_TOP_ROWS, max(room, MIN_TOP_ROWS))
    if n_top:
        has_ops = any(t.op for t in top[:n_top] if not isinstance(t.op, Absent))
        what = f"the largest {n_top} of {len(top)}" if n_top < len(top) else "largest first"
        out += [f"Live {at_moment} ({what}):", ""]
        if has_ops:
            out += ["| size | stage | allocated at | op (trace) |", "|---:|---|---|---|"]
        else:
            out += ["| size | stage | allocated at |", "|---:|---|---|"]
        for t in top[:n_top]:
            line = f"| {fmt_bytes(t.bytes)} | {md_code(t.stage)} | {md_code(t.site)} |"
            if has_ops:
                line += f" {md_code(t.op if not isinstance(t.op, Absent) else '')} |"
            out.append(line)
        out.append("")
    out += tail
    if len(out) > max_lines:
        out = out[: max_lines - 1] + ["<sub>(truncated)</sub>"]
    return "\n".join(printable(line, None) for line in out) + "\n"


def _attention(att: Attention | TraceAttention) -> list[str]:
    """The score matrices materialized (largest, live at once), or the implementation found."""
    if att.count:
        lg = att.largest
        dtype = lg.dtype if isinstance(lg.dtype, str) else ""
        shape = f" {md_code(lg.shape)} {md_text(dtype)}" if lg.shape else ""
        return [
            f"**Attention scores:** {att.count} materialized ({md_text(att.implementation)}); largest "
            f"{fmt_bytes(lg.bytes)}{shape}; up to {fmt_bytes(att.peak_live_bytes)} live at once. "
            "A fused kernel (SDPA / flash) would not materialize them.",
            "",
        ]
    return [f"**Attention:** {md_text(att.implementation)}", ""]
