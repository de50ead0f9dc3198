"""Summary of a trace-only run (CPU collectors, or a profiler trace without a snapshot).

The profiler's ``[memory]`` events carry the allocator's own totals after every event,
so the peak needs no replay; stages come from ``user_annotation`` ranges (or the run
directory's stage timeline), attention from op shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from snapviz.analyses.not_recorded import GPU_NOT_RECORDED, gpu_not_recorded_note
from snapviz.analyses.stages import label_by_intervals
from snapviz.analyses.trace_attention import attention_verdict
from snapviz.analyses.trace_devices import DEVICE_CPU, device_kind, device_label, pick_trace_device, with_running_totals
from snapviz.analyses.trace_live import live_at_trace_peak
from snapviz.analyses.trace_ops import TraceAnalysis, analyze_trace, devices, stage_peaks
from snapviz.load import Run
from snapviz.safe_text import short_repr
from snapviz.units import fmt_bytes
from snapviz.vocab import SUMMARY_SCHEMA, run_summary_fields, stage_group

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
        """The ``snapviz.summary/1`` document (see :func:`trace_summary_dict`)."""
        return trace_summary_dict(self)


def analyze_trace_run(run: Run, device: int | None = None) -> TraceRunAnalysis:
    """Analyse a trace-only run on one device (``device``: ``--device N``, see
    :func:`snapviz.analyses.trace_devices.pick_trace_device`)."""
    assert run.trace is not None
    tr = with_running_totals(run.trace)
    dev = pick_trace_device(devices(tr), device, run.source)
    ta = analyze_trace(tr, *(dev if dev is not None else (None, None)))
    warnings = list(tr.notes)
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


def _bytes_or_none(v: Any) -> int | None:
    """A byte figure of the stage table (float64 where NaN marks "not known") as an int, or None."""
    if v is None or (isinstance(v, (float, np.floating)) and np.isnan(v)):
        return None
    return int(v)


def _max_known(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def trace_summary_dict(an: TraceRunAnalysis) -> dict[str, Any]:
    tl = an.timeline
    st = an.stages
    rj = an.run.run_json or {}
    exact = _exact(an.trace)
    # The CPU profiler counts only what is allocated while it runs (what existed before is unknown),
    # and a CPU allocator reserves nothing of its own.
    cpu = an.trace.device is not None and an.trace.device[0] == DEVICE_CPU
    has_reserved = exact and not cpu
    if len(tl):
        a = tl["allocated"].to_numpy()
        pi = int(np.argmax(a))
        t_peak = float(tl["time_us"].iat[pi])
        peak_stage = (
            str(label_by_intervals(np.array([t_peak]), st, default="unlabelled")[0]) if len(st) else "unlabelled"
        )
        # Bytes-only traces: a lower bound (trace_devices), and no reserved figure at all.
        peak = {
            "allocated_bytes": int(a[pi]),
            "reserved_bytes": int(tl["reserved"].max()) if has_reserved else None,
            "requested_bytes": None,
            "event_index": pi,
            "time_us": int(t_peak),
            "stage": peak_stage,
            "within_recorded_window": False,
            "exact": exact,
        }
        baseline = int(a[0] - tl["bytes"].iat[0])
    else:
        peak = {
            "allocated_bytes": 0,
            "reserved_bytes": None,
            "requested_bytes": None,
            "event_index": None,
            "time_us": None,
            "stage": "unlabelled",
            "within_recorded_window": False,
            "exact": False,
        }
        baseline = 0
    groups: dict[str, dict[str, Any]] = {}
    stages_out: list[dict[str, Any]] = []
    rss = {s["name"]: s.get("rss_peak_bytes") for s in rj.get("stages") or []}
    for r in st.itertuples(index=False):
        name = str(r.name)
        g = groups.get(stage_group(name))
        item: dict[str, Any] = {
            "name": name,
            "peak_allocated_bytes": _bytes_or_none(r.peak_allocated_bytes),
            "peak_reserved_bytes": _bytes_or_none(r.peak_reserved_bytes) if has_reserved else None,
            "start_us": int(r.start_us),
            "end_us": int(r.end_us),
        }
        if rss.get(name) is not None:
            item["rss_peak_bytes"] = rss[name]
        if g is None:
            g = groups[stage_group(name)] = {
                "name": stage_group(name),
                "peak_allocated_bytes": None,
                "peak_reserved_bytes": None,
                "start_us": int(r.start_us),
                "end_us": int(r.end_us),
                "steps": [],
                "intervals": [],
            }
            stages_out.append(g)
        # None (JSON null) where the trace has no figure: no memory events, or no Total Reserved.
        g["peak_allocated_bytes"] = _max_known(g["peak_allocated_bytes"], item["peak_allocated_bytes"])
        g["peak_reserved_bytes"] = _max_known(
            g["peak_reserved_bytes"], item["peak_reserved_bytes"] if has_reserved else None
        )
        g["end_us"] = max(g["end_us"], int(r.end_us))
        g["intervals"].append(item)
        if "/" in name:
            g["steps"].append(
                {"name": name, "step": name.split("/", 1)[1], **{k: v for k, v in item.items() if k != "name"}}
            )
    if peak["stage"] == "unlabelled" and len(tl):
        # The peak lies outside every range: the stage table says so rather than omit it.
        t = tl["time_us"].to_numpy()
        out = label_by_intervals(t, st, default="unlabelled") == "unlabelled" if len(st) else np.ones(len(t), bool)
        a = tl["allocated"].to_numpy()
        stages_out.append(
            {
                "name": "unlabelled",
                "peak_allocated_bytes": int(a[out].max()),
                "peak_reserved_bytes": int(tl["reserved"].to_numpy()[out].max()) if has_reserved else None,
                "start_us": int(t[out].min()),
                "end_us": int(t[out].max()),
                "steps": [],
                "intervals": [],
            }
        )
    att = attention_verdict(an.attention_ops)
    dev = an.trace.device
    before = (
        "memory allocated before profiling began (the weights, when loaded before it) is not known: the CPU "
        "profiler counts only allocations made while it runs"
        if cpu
        else f"{'' if exact else 'at least '}{baseline:,} bytes were already allocated at its first event"
    )
    # The allocator's figures are a CUDA device's: a CPU device is compared with none of them.
    alloc_truth, run_fields = run_summary_fields(rj, (-1 if dev[0] == DEVICE_CPU else int(dev[1])) if dev else None)
    return {
        "schema": SCHEMA,
        "source": an.run.source,
        "kind": "trace",
        "device": device_label(*dev) if dev else None,
        "device_kind": device_kind(dev[0]) if dev else None,
        "stage_source": "annotations" if len(st) else "none",
        "peak": peak,
        "history": {
            "events": int(len(tl)),
            "truncated": False,
            "baseline_allocated_bytes": None if cpu else baseline,
            "baseline_exact": exact and not cpu,
        },
        "devices": [
            {
                "device": device_label(t, i),
                "kind": device_kind(t),
                "events": int(n),
                "exact": bool(x),
                "peak_allocated_bytes": int(m),
            }
            for t, i, n, m, x in zip(
                *(an.trace.devices[c] for c in ("device_type", "device_id", "events", "max_allocated", "exact")),
                strict=True,
            )
        ],
        "stages": stages_out,
        "attention": att,
        "top_allocations": [
            {
                "bytes": int(t.bytes),
                "stage": str(label_by_intervals(np.array([t.time_us]), st, default="unlabelled")[0])
                if len(st)
                else "unlabelled",
                "site": t.site,
                "address": int(t.addr),
                "time_us": int(t.time_us),
                "stack": list(t.stack),
                **({"op": t.op} if t.op else {}),
                **({"op_input_dims": t.op_input_dims} if t.op_input_dims else {}),
            }
            for t in an.top_allocations.itertuples(index=False)
        ],
        "top_allocations_note": (
            "allocations made before the trace began (e.g. weights loaded before profiling) are "
            f"not itemized: {before}; Python lines are the first line of each function (profiler stacks)"
        ),
        "allocator_truth": alloc_truth,
        "run": run_fields,
        "warnings": an.warnings,
        # the sentence every sink leads with when the file did not record GPU memory (not_recorded.py)
        "not_recorded": next((w for w in an.warnings if w.startswith(GPU_NOT_RECORDED)), None),
    }
