"""Report phrases shared by the renderers (sizes themselves are :mod:`snapviz.units`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapviz.analyses.document import Peak, Summary
from snapviz.units import fmt_bytes, fmt_delta
from snapviz.vocab import BEFORE_RECORDING, END_STATE

__all__ = [
    "fmt_bytes",
    "fmt_delta",
    "fmt_device",
    "fmt_peak_where",
    "fmt_peak_allocated",
    "fmt_peak_bound",
    "fmt_report_kind",
]

if TYPE_CHECKING:
    from snapviz.analyses.compare_document import CompareDocument

CPU_REHEARSAL = "CPU rehearsal: CPU allocator and process memory (RSS), no GPU memory recorded"


def fmt_compare_kind(doc: CompareDocument) -> str:
    """What a comparison compares: ``GPU memory``, or every kind its runs measured when they differ."""
    kinds = list(dict.fromkeys(r.memory_kind or "CUDA GPU memory" for r in doc.runs))
    if all("GPU memory" in k for k in kinds):
        return "GPU memory"
    return "memory of different kinds (" + ", ".join(kinds) + ")"


def _report_kind(trace: bool, device: object, device_kind: object, has_run: bool) -> str:
    if not trace:
        return "GPU memory"
    if device == "cpu" and has_run:
        return CPU_REHEARSAL
    return (device_kind if isinstance(device_kind, str) and device_kind else "memory") + " (profiler trace)"


def fmt_report_kind(doc: Summary) -> str:
    """What a summary measured, for every sink's title: ``GPU memory`` (a snapshot),
    ``<device kind> (profiler trace)``, or, for a collectors' run on the CPU (``collect --device
    cpu``: a rehearsal), :data:`CPU_REHEARSAL`."""
    return _report_kind(doc.is_trace, doc.device, doc.device_kind, doc.run is not None)


def fmt_device(doc: Summary) -> str:
    """``cuda:0``, ``hip:0, AMD ROCm/HIP GPU memory``, ``cpu``…; snapshots give an index."""
    dev = doc.device
    if dev is None:
        return "no device (no memory events)"
    if isinstance(dev, int):
        return f"cuda:{dev}"
    kind = doc.device_kind if isinstance(doc.device_kind, str) else None
    return f"{dev}, {kind}" if kind and not dev.startswith(("cuda", "cpu")) else dev


def fmt_peak_where(peak: Peak) -> str:
    """`` in denoise/3 at event 1,234`` — only the parts the file knows."""
    stage = peak.stage
    idx = peak.event_index
    if idx is None or idx < 0:
        # The peak is the memory that existed when the recording started.
        if stage == END_STATE:
            return " live when the snapshot was taken (end state only, not a peak)"
        return " before the recording began" if stage == BEFORE_RECORDING else (f" in {stage}" if stage else "")
    return (f" in {stage}" if stage else "") + f" at event {idx:,}"


def _bound(lower_bound: bool, approximate: bool) -> str:
    return "at least " if lower_bound else "about " if approximate else ""


def fmt_peak_bound(peak: Peak) -> str:
    """The peak's qualifier, worded once for every sink: ``""`` (exact), ``"at least "`` (a lower
    bound) or ``"about "`` (approximate: the allocator's rules could not be honoured)."""
    return _bound(peak.exact is False, peak.approximate is True)


def fmt_peak_allocated(peak: Peak, events: int) -> str:
    """The peak as a sentence fragment: exact, a lower bound, approximate, or not recorded."""
    if not events and not peak.allocated_bytes:
        return "not recorded (the input has no memory events)"
    a = peak.allocated_bytes
    return f"{fmt_peak_bound(peak)}{fmt_bytes(a)} ({a:,} B)"
