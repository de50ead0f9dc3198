"""Short terminal summary: the peak, its stage and the biggest contributors at a glance."""

from __future__ import annotations

from typing import Any

from snapviz.render.fmt import CPU_REHEARSAL, fmt_bytes, fmt_device, fmt_peak_allocated, fmt_peak_where, fmt_report_kind
from snapviz.safe_text import bounded_doc, clip, printable


def render_terminal(doc: dict[str, Any]) -> str:
    """Strings from the input are clipped (:func:`bounded_doc`) and every line has its control
    characters escaped: nothing in a snapshot can move the cursor, retitle the window or add
    a line."""
    doc = bounded_doc(doc)
    p, h = doc["peak"], doc["history"]
    lines = [f"snapviz: {doc['source']} ({fmt_device(doc)}, {h['events']:,} events, stages from {doc['stage_source']})"]
    if fmt_report_kind(doc) == CPU_REHEARSAL:
        lines.append(f"  {CPU_REHEARSAL}")
    window = " within the recorded window" if p.get("within_recorded_window") else ""
    lines.append(
        f"  peak allocated {fmt_peak_allocated(p, h['events'])}{window}" + (fmt_peak_where(p) if h["events"] else "")
    )
    reserved = fmt_bytes(p["reserved_bytes"]) if p.get("reserved_bytes") is not None else "not recorded"
    lines.append(
        f"  peak reserved  {reserved}"
        + (f"   requested {fmt_bytes(p['requested_bytes'])}" if p.get("requested_bytes") is not None else "")
    )
    truth = doc.get("allocator_truth") or {}
    if truth.get("max_memory_allocated"):
        t = truth["max_memory_allocated"]
        diff = p["allocated_bytes"] - t
        lines.append(
            f"  allocator said {fmt_bytes(t)} ({'exact match' if diff == 0 else f'replay differs by {diff:+,} B'})"
        )
    # Stages without a figure (a trace without memory events) have nothing to show here.
    stages = [s for s in doc.get("stages") or [] if s.get("peak_allocated_bytes") is not None]
    if stages:
        lines.append(
            "  stages: " + "  ".join(f"{s['name']} {fmt_bytes(s['peak_allocated_bytes'])}" for s in stages[:8])
        )
    steps = (doc.get("training") or {}).get("steps") or []
    if steps:
        worst = max(steps, key=lambda s: s["peak_allocated_bytes"])
        parts = sorted(worst["categories_at_peak"].items(), key=lambda kv: -kv[1])
        lines.append(
            f"  training peak in {worst['peak_phase']}: "
            + clip(", ".join(f"{c} {fmt_bytes(b)}" for c, b in parts if b), 400)
        )
    top = doc.get("top_allocations") or []
    if top:
        lines.append(f"  top of the peak: {fmt_bytes(top[0]['bytes'])} at {top[0]['site']}")
    att = doc.get("attention") or {}
    if att.get("count"):
        shape = f" {att['largest']['shape']}" if att["largest"].get("shape") else ""
        lines.append(
            f"  attention scores: {att['count']} materialized, largest {fmt_bytes(att['largest']['bytes'])}{shape}"
        )
    for a in (doc.get("advice") or [])[:3]:
        saves = f" (up to {fmt_bytes(a['saves_up_to_bytes'])})" if a.get("saves_up_to_bytes") else ""
        lines.append(f"  try: {a['technique']}{saves}: {a['why']}")
    for w in doc.get("warnings") or []:
        lines.append(f"  warning: {w}")
    return "\n".join(printable(line, None) for line in lines) + "\n"
