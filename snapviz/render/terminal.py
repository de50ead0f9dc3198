"""Short terminal summary: the peak, its stage and the biggest contributors at a glance."""

from __future__ import annotations

from typing import Any

from snapviz.analyses.document import Summary, to_json
from snapviz.analyses.oom import oom_lines
from snapviz.render.fmt import CPU_REHEARSAL, fmt_bytes, fmt_device, fmt_peak_allocated, fmt_peak_where, fmt_report_kind
from snapviz.safe_text import bounded_doc, clip, printable


def render_terminal(summary: Summary) -> str:
    """Strings from the input are clipped (:func:`bounded_doc`) and every line has its control
    characters escaped: nothing in a snapshot can move the cursor, retitle the window or add
    a line."""
    doc: dict[str, Any] = bounded_doc(to_json(summary))  # the body still reads the JSON form
    p, h = doc["peak"], doc["history"]
    oom = doc.get("oom")
    # OOM first: the failed request is the headline, the peak before it comes after.
    lines = [*oom_lines(oom)[:1]] if oom else []
    lines.append(
        f"snapviz: {doc['source']} ({fmt_device(doc)}, {h['events']:,} events, stages from {doc['stage_source']})"
    )
    if fmt_report_kind(doc) == CPU_REHEARSAL:
        lines.append(f"  {CPU_REHEARSAL}")
    if oom:
        lines += [f"  {x}" for x in oom_lines(oom)[1:]]
        if oom.get("live_sites"):
            lines.append(
                "  live then: "
                + ", ".join(f"{fmt_bytes(c['bytes'])} {c['category']}" for c in oom.get("live_categories", [])[:4])
                + f"; largest site {oom['live_sites'][0]['site']} ({fmt_bytes(oom['live_sites'][0]['bytes'])})"
            )
    window = " within the recorded window" if p.get("within_recorded_window") else ""
    only = bool((doc.get("end_state") or {}).get("only"))
    if doc.get("not_recorded"):
        # nothing to report as a result: say what was not recorded, and no peak headline
        lines.append(f"  {doc['not_recorded']}")
        lines += [f"  warning: {w}" for w in doc.get("warnings") or [] if w != doc["not_recorded"]]
        return "\n".join(printable(line, None) for line in lines) + "\n"
    lines.append(
        f"  {'live allocated' if only else 'peak allocated'} {fmt_peak_allocated(p, h['events'])}{window}"
        + (fmt_peak_where(p) if h["events"] else "")
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
    es = doc.get("end_state") or {}
    if es.get("only") and es.get("sites"):  # no stages in time: what held the memory, by site
        lines.append(
            "  end state by site: "
            + "  ".join(f"{fmt_bytes(x['bytes'])} {x['site']} ({x['count']:,} blocks)" for x in es["sites"][:3])
        )
    elif stages:
        lines.append(
            "  stages: " + "  ".join(f"{s['name']} {fmt_bytes(s['peak_allocated_bytes'])}" for s in stages[:8])
        )
    cats = [c for c in doc.get("categories") or [] if c["bytes"]]
    if cats:  # the same list as the JSON's and the Markdown's (they add up to the peak)
        lines.append(
            f"  by category {'at the end state' if es.get('only') else 'at the peak'}: "
            + clip(", ".join(f"{c['category']} {fmt_bytes(c['bytes'])}" for c in cats), 600)
        )
    top = doc.get("top_allocations") or []
    if top:
        what = "largest live block" if es.get("only") else "top of the peak"
        lines.append(f"  {what}: {fmt_bytes(top[0]['bytes'])} at {top[0]['site']}")
    pre = es.get("before_recording") or {}
    if not es.get("only") and pre.get("bytes") and pre.get("by_category"):
        rest = pre["bytes"] - pre["itemised_bytes"]
        lines.append(
            f"  before recording {fmt_bytes(pre['bytes'])}, by the end-state blocks' frames: "
            + ", ".join(f"{c} {fmt_bytes(b)}" for c, b in list(pre["by_category"].items())[:4])
            + (f" (largest site {pre['sites'][0]['site']})" if pre.get("sites") else "")
            + (f"; {fmt_bytes(rest)} without frames" if rest > 0 else "")
        )
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
