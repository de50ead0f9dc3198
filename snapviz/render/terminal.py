"""Short terminal summary: the peak, its stage and the biggest contributors at a glance."""

from __future__ import annotations

from snapviz.analyses.document import EndState, Oom, Summary, bounded_summary, num
from snapviz.analyses.oom import oom_lines
from snapviz.render.fmt import CPU_REHEARSAL, fmt_bytes, fmt_device, fmt_peak_allocated, fmt_peak_where, fmt_report_kind
from snapviz.safe_text import clip, printable


def render_terminal(summary: Summary) -> str:
    """Strings from the input are clipped (:func:`bounded_summary`) and every line has its control
    characters escaped: nothing in a snapshot can move the cursor, retitle the window or add
    a line."""
    doc = bounded_summary(summary)
    p, h = doc.peak, doc.history
    oom = doc.oom if isinstance(doc.oom, Oom) else None
    # OOM first: the failed request is the headline, the peak before it comes after.
    lines = [*oom_lines(oom)[:1]] if oom else []
    lines.append(f"snapviz: {doc.source} ({fmt_device(doc)}, {h.events:,} events, stages from {doc.stage_source})")
    if fmt_report_kind(doc) == CPU_REHEARSAL:
        lines.append(f"  {CPU_REHEARSAL}")
    if oom:
        lines += [f"  {x}" for x in oom_lines(oom)[1:]]
        if sites := oom.live_sites:
            lines.append(
                "  live then: "
                + ", ".join(f"{fmt_bytes(c.bytes)} {c.category}" for c in oom.live_categories[:4])
                + f"; largest site {sites[0].site} ({fmt_bytes(sites[0].bytes)})"
            )
    window = " within the recorded window" if p.within_recorded_window else ""
    es = doc.end_state if isinstance(doc.end_state, EndState) else None
    only = es is not None and es.only
    if doc.not_recorded:
        # nothing to report as a result: say what was not recorded, and no peak headline
        lines.append(f"  {doc.not_recorded}")
        lines += [f"  warning: {w}" for w in doc.warnings if w != doc.not_recorded]
        return "\n".join(printable(line, None) for line in lines) + "\n"
    lines.append(
        f"  {'live allocated' if only else 'peak allocated'} {fmt_peak_allocated(p, h.events)}{window}"
        + (fmt_peak_where(p) if h.events else "")
    )
    reserved = fmt_bytes(p.reserved_bytes) if p.reserved_bytes is not None else "not recorded"
    lines.append(
        f"  peak reserved  {reserved}"
        + (f"   requested {fmt_bytes(p.requested_bytes)}" if p.requested_bytes is not None else "")
    )
    if t := num(doc.allocator_truth.max_memory_allocated if doc.allocator_truth is not None else None):
        diff = p.allocated_bytes - t
        lines.append(
            f"  allocator said {fmt_bytes(t)} ({'exact match' if diff == 0 else f'replay differs by {diff:+,} B'})"
        )
    # Stages without a figure (a trace without memory events) have nothing to show here.
    stages = [(s.name, s.peak_allocated_bytes) for s in doc.stages if s.peak_allocated_bytes is not None]
    if only and es is not None and es.sites:  # no stages in time: what held the memory, by site
        lines.append(
            "  end state by site: "
            + "  ".join(f"{fmt_bytes(x.bytes)} {x.site} ({x.count:,} blocks)" for x in es.sites[:3])
        )
    elif stages:
        lines.append("  stages: " + "  ".join(f"{name} {fmt_bytes(b)}" for name, b in stages[:8]))
    cats = [c for c in doc.categories if c.bytes] if isinstance(doc.categories, list) else []
    if cats:  # the same list as the JSON's and the Markdown's (they add up to the peak)
        lines.append(
            f"  by category {'at the end state' if only else 'at the peak'}: "
            + clip(", ".join(f"{c.category} {fmt_bytes(c.bytes)}" for c in cats), 600)
        )
    if doc.top_allocations:
        top = doc.top_allocations[0]
        lines.append(f"  {'largest live block' if only else 'top of the peak'}: {fmt_bytes(top.bytes)} at {top.site}")
    pre = es.before_recording if es is not None else None
    if not only and pre is not None and pre.bytes and pre.by_category:
        rest = pre.bytes - pre.itemised_bytes
        lines.append(
            f"  before recording {fmt_bytes(pre.bytes)}, by the end-state blocks' frames: "
            + ", ".join(f"{c} {fmt_bytes(b)}" for c, b in list(pre.by_category.items())[:4])
            + (f" (largest site {pre.sites[0].site})" if pre.sites else "")
            + (f"; {fmt_bytes(rest)} without frames" if rest > 0 else "")
        )
    att = doc.attention
    if att.count:
        shape = f" {att.largest.shape}" if att.largest.shape else ""
        lines.append(f"  attention scores: {att.count} materialized, largest {fmt_bytes(att.largest.bytes)}{shape}")
    advice = doc.advice if isinstance(doc.advice, list) else []
    for a in advice[:3]:
        saves = f" (up to {fmt_bytes(a.saves_up_to_bytes)})" if a.saves_up_to_bytes else ""
        lines.append(f"  try: {a.technique}{saves}: {a.why}")
    if len(advice) > 3:  # named, so that the terminal tells the same advice as the other outputs
        more = [
            f"{a.technique}" + (f" ({fmt_bytes(a.saves_up_to_bytes)})" if a.saves_up_to_bytes else "")
            for a in advice[3:]
        ]
        lines.append(f"  also: {', '.join(more)} (--markdown or --json say why)")
    for w in doc.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(printable(line, None) for line in lines) + "\n"
