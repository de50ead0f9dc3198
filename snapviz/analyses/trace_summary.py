"""A trace-only run (CPU collectors, or a profiler trace without a snapshot) to its
:class:`~snapviz.analyses.analysis.Analysis`.

The profiler's ``[memory]`` events carry the allocator's own totals after every event,
so the peak needs no replay; stages come from ``user_annotation`` ranges (or the run
directory's stage timeline), attention from op shapes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis, Capabilities, TraceEvidence
from snapviz.analyses.not_recorded import gpu_not_recorded_note
from snapviz.analyses.stages import StageLabels, label_by_intervals
from snapviz.analyses.trace_attention import attention_verdict
from snapviz.analyses.trace_devices import DEVICE_CPU, device_label, pick_trace_device, with_running_totals
from snapviz.analyses.trace_live import live_at_trace_peak
from snapviz.analyses.trace_ops import TraceTables, analyze_trace, devices, stage_peaks
from snapviz.load import Run
from snapviz.vocab import UNLABELLED, stage_group


def analyze_trace_run(run: Run, device: int | None = None) -> Analysis:
    """Analyse a trace-only run on one device (``device``: ``--device N``, see
    :func:`snapviz.analyses.trace_devices.pick_trace_device`)."""
    assert run.trace is not None
    tr = with_running_totals(run.trace)
    dev = pick_trace_device(devices(tr), device, run.source)
    ta = analyze_trace(tr, *(dev if dev is not None else (None, None)))
    warnings = list(tr.notes) + list(ta.notes)
    rj = run.run_json or {}
    source = "annotations"  # the trace's own record_function ranges
    if not len(ta.stages) and rj.get("stages"):
        source = "run.json"
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
    stages = ta.stages.assign(group=[stage_group(str(n)) for n in ta.stages["name"]]) if len(ta.stages) else ta.stages
    times = ta.timeline["time_us"].to_numpy(np.float64) if len(ta.timeline) else np.empty(0)
    labels = (
        label_by_intervals(times, stages, default=UNLABELLED)
        if len(stages)
        else np.full(len(times), UNLABELLED, object)
    )
    exact = _exact(ta)
    cpu = dev is None or dev[0] == DEVICE_CPU  # no memory events, or the CPU allocator's
    exact = exact and dev is not None  # no memory events: no totals at all
    return Analysis(
        run=run,
        device=dev[1] if dev is not None else None,
        # The CPU profiler counts only what is allocated while it runs, and a CPU allocator
        # reserves nothing of its own; a Bytes-only trace records no reserved figure at all.
        capabilities=Capabilities(exact_blocks=False, reserved_recorded=exact and not cpu, exact_totals=exact),
        evidence=TraceEvidence(trace=ta),
        labels=StageLabels(labels=np.asarray(labels, dtype=object), source=source if len(stages) else "none"),
        stages=stages,
        top_allocations=top,
        attention=ta.attention_ops,
        attention_summary=attention_verdict(ta.attention_ops),
        warnings=warnings,
    )


def _exact(ta: TraceTables) -> bool:
    """The device's events carried the allocator's own totals (not an older Bytes-only trace)."""
    d = ta.devices
    if ta.device is None or not len(d):
        return True
    row = d[(d["device_type"] == ta.device[0]) & (d["device_id"] == ta.device[1])]
    return bool(row["exact"].all()) if len(row) else True
