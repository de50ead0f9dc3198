"""Summary of a trace-only run (CPU collectors, or a profiler trace without a snapshot).

The profiler's ``[memory]`` events carry the allocator's own totals after every event,
so the peak needs no replay; stages come from ``user_annotation`` ranges (or the run
directory's stage timeline), attention from op shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pandas as pd

from snapviz.analyses.not_recorded import gpu_not_recorded_note
from snapviz.analyses.trace_devices import DEVICE_CPU, device_label, pick_trace_device, with_running_totals
from snapviz.analyses.trace_live import live_at_trace_peak
from snapviz.analyses.trace_ops import TraceAnalysis, analyze_trace, devices, stage_peaks
from snapviz.load import Run
from snapviz.safe_text import short_repr
from snapviz.units import fmt_bytes
from snapviz.vocab import SUMMARY_SCHEMA

SCHEMA = SUMMARY_SCHEMA


@dataclass(frozen=True)
class TraceRunAnalysis:
    """Every result for one device of a run with a Chrome trace and no snapshot.

    ``summary()`` is the ``snapviz.summary/1`` document (``"kind": "trace"``) the CLI writes.
    """

    run: Run
    trace: TraceAnalysis
    warnings: list[str] = field(default_factory=list)
    top_allocations: pd.DataFrame = field(default_factory=pd.DataFrame)  # live at the peak (trace_live)

    def __repr__(self) -> str:
        tl = self.timeline
        peak = int(tl["allocated"].max()) if len(tl) and "allocated" in tl else None
        dev = self.trace.device
        return short_repr(
            "TraceRunAnalysis",
            self.run.label,
            device_label(*dev) if dev is not None else "no device memory events",
            f"{len(tl):,} memory events",
            f"peak allocated {fmt_bytes(peak)} ({peak:,} B)" if peak is not None else "",
            f"{len(self.stages):,} stages",
            f"{len(self.warnings)} warning(s)",
            "summary() for the full document",
        )

    @property
    def kind(self) -> Literal["trace"]:
        """A profiler trace: the allocator's totals per event, no blocks (see pipeline.RunAnalysis)."""
        return "trace"

    @property
    def timeline(self) -> pd.DataFrame:
        """The device's ``[memory]`` events with the allocator's totals (``allocated``, ``reserved``)."""
        return self.trace.timeline

    @property
    def stages(self) -> pd.DataFrame:
        return self.trace.stages

    @property
    def attention_ops(self) -> pd.DataFrame:
        return self.trace.attention_ops

    def summary(self) -> dict[str, Any]:
        """The ``snapviz.summary/1`` document as JSON (:func:`snapviz.analyses.pipeline.summary_of`)."""
        from snapviz.analyses.pipeline import summary_of

        return summary_of(self)


def analyze_trace_run(run: Run, device: int | None = None) -> TraceRunAnalysis:
    """Analyse a trace-only run on one device (``device``: ``--device N``, see
    :func:`snapviz.analyses.trace_devices.pick_trace_device`)."""
    assert run.trace is not None
    tr = with_running_totals(run.trace)
    dev = pick_trace_device(devices(tr), device, run.source)
    ta = analyze_trace(tr, *(dev if dev is not None else (None, None)))
    warnings = list(tr.notes) + list(ta.notes)
    rj = run.run_json or {}
    if not len(ta.stages) and rj.get("stages"):
        # No record_function ranges in the trace: take the run's own stage timeline.
        st = pd.DataFrame(
            [(s["name"], float(s["start_us"]), float(s["end_us"])) for s in rj["stages"]],
            columns=["name", "start_us", "end_us"],
        )
        peaks = stage_peaks(tr, st, *(dev if dev is not None else (None, None)))
        ta = replace(ta, stages=pd.concat([st, peaks.drop(columns=["name", "start_us", "end_us"])], axis=1))
    if not len(ta.timeline):
        warnings.append("the trace has no [memory] events: record with torch.profiler(profile_memory=True)")
    elif not _exact(ta):
        floor = int(ta.timeline["allocated"].iat[0] - ta.timeline["bytes"].iat[0])
        warnings.append(
            "this trace's [memory] events carry Bytes but no Total Allocated/Total Reserved (an older "
            "torch.profiler): allocated memory is the running sum of the events, so the peak is a lower "
            "bound; memory allocated before the trace began and not freed in it is unknown"
            + (
                f" (at least {floor:,} bytes existed, since the trace frees that much it never saw allocated)"
                if floor
                else ""
            )
            + "; reserved memory is not recorded"
        )
    if dev is not None and dev[0] == DEVICE_CPU:
        warnings.append(
            "CPU trace: allocated bytes are the CPU allocator's (no caching-allocator rounding, no reserved), "
            "counted from when the profiler started: memory allocated before it (the weights, when loaded "
            "before profiling) is not in them"
        )
    cpu_only = dev is None or dev[0] == DEVICE_CPU
    if (note := gpu_not_recorded_note(tr.meta, cpu_only)) is not None:
        warnings.insert(0, note)
    others = [
        device_label(t, i)
        for t, i in zip(ta.devices["device_type"], ta.devices["device_id"], strict=True)
        if dev is not None and (int(t), int(i)) != dev and int(t) != DEVICE_CPU
    ]
    if others:
        warnings.append(
            f"this trace also holds {', '.join(others)}; showing {device_label(*dev)} "  # type: ignore[misc]
            + ("(chosen with --device)" if device is not None else "(highest peak); use --device to pick another")
        )
    top = live_at_trace_peak(tr, ta.device)
    if len(ta.timeline) and not tr.memory["addr"].to_numpy().any():
        warnings.append(
            "the [memory] events carry no addresses, so allocations cannot be paired with their frees: "
            "what was live at the peak is not itemized"
        )
    return TraceRunAnalysis(run=run, trace=ta, warnings=warnings, top_allocations=top)


def _exact(ta: TraceAnalysis) -> bool:
    """The device's events carried the allocator's own totals (not an older Bytes-only trace)."""
    d = ta.devices
    if ta.device is None or not len(d):
        return True
    row = d[(d["device_type"] == ta.device[0]) & (d["device_id"] == ta.device[1])]
    return bool(row["exact"].all()) if len(row) else True
