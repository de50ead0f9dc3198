"""Report phrases shared by the renderers (sizes themselves are :mod:`snapviz.units`)."""

from __future__ import annotations

from typing import Any

from snapviz.units import fmt_bytes, fmt_delta
from snapviz.vocab import BEFORE_RECORDING

__all__ = ["fmt_bytes", "fmt_delta", "fmt_device", "fmt_peak_where", "fmt_peak_allocated", "fmt_peak_bound"]


def fmt_device(doc: dict[str, Any]) -> str:
    """``cuda:0``, ``hip:0, AMD ROCm/HIP GPU memory``, ``cpu``…; snapshots give an index."""
    dev = doc.get("device")
    if dev is None:
        return "no device (no memory events)"
    if isinstance(dev, int):
        return f"cuda:{dev}"
    kind = doc.get("device_kind")
    return f"{dev}, {kind}" if kind and not str(dev).startswith(("cuda", "cpu")) else str(dev)


def fmt_peak_where(peak: dict[str, Any]) -> str:
    """`` in denoise/3 at event 1,234`` — only the parts the file knows."""
    stage = peak.get("stage")
    idx = peak.get("event_index")
    if idx is None or idx < 0:
        # The peak is the memory that existed when the recording started.
        return " before the recording began" if stage == BEFORE_RECORDING else (f" in {stage}" if stage else "")
    return (f" in {stage}" if stage else "") + f" at event {idx:,}"


def fmt_peak_bound(peak: dict[str, Any]) -> str:
    """The peak's qualifier, worded once for every sink: ``""`` (exact), ``"at least "`` (a lower
    bound) or ``"about "`` (approximate: the allocator's rules could not be honoured)."""
    if not peak.get("exact", True):
        return "at least "
    return "about " if peak.get("approximate") else ""


def fmt_peak_allocated(peak: dict[str, Any], events: int) -> str:
    """The peak as a sentence fragment: exact, a lower bound, approximate, or not recorded."""
    if not events and not peak.get("allocated_bytes"):
        return "not recorded (the input has no memory events)"
    a = int(peak["allocated_bytes"])
    return f"{fmt_peak_bound(peak)}{fmt_bytes(a)} ({a:,} B)"
