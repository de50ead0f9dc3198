"""Summary of a trace-only run (CPU collectors, or a profiler trace without a snapshot).

The profiler's ``[memory]`` events carry the allocator's own totals after every event,
so the peak needs no replay; stages come from ``user_annotation`` ranges (or the run
directory's stage timeline), attention from op shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.stages import stage_group
from snapviz.analyses.trace_attention import attention_verdict
from snapviz.analyses.trace_ops import TraceAnalysis, analyze_trace, stage_at, stage_peaks
from snapviz.load import Run

SCHEMA = "snapviz.summary/1"


@dataclass
class TraceRunAnalysis:
    run: Run
    trace: TraceAnalysis
    warnings: list[str] = field(default_factory=list)
    top_allocations: pd.DataFrame = field(default_factory=pd.DataFrame)  # live at the peak (trace_live)

    @property
    def timeline(self) -> pd.DataFrame:
        return self.trace.timeline

    @property
    def stages(self) -> pd.DataFrame:
        return self.trace.stages

    @property
    def attention_ops(self) -> pd.DataFrame:
        return self.trace.attention_ops


def analyze_trace_run(run: Run) -> TraceRunAnalysis:
    tr = run.trace
    assert tr is not None
    ta = analyze_trace(tr)
    warnings = list(getattr(tr, "notes", []) or [])
    rj = run.run or {}
    if not len(ta.stages) and rj.get("stages"):
        # No record_function ranges in the trace: take the run's own stage timeline.
        st = pd.DataFrame([(s["name"], float(s["start_us"]), float(s["end_us"])) for s in rj["stages"]],
                          columns=["name", "start_us", "end_us"])
        peaks = stage_peaks(tr, st)
        ta.stages = pd.concat([st, peaks.drop(columns=["name", "start_us", "end_us"])], axis=1)
    if not len(ta.timeline):
        warnings.append("the trace has no [memory] events: record with torch.profiler(profile_memory=True)")
    if ta.device is not None and ta.device[0] == 0:
        warnings.append("CPU trace: allocated bytes are the CPU allocator's (no caching-allocator rounding, no reserved)")
    from snapviz.analyses.trace_live import live_at_trace_peak

    top = live_at_trace_peak(tr, ta.device)
    return TraceRunAnalysis(run=run, trace=ta, warnings=warnings, top_allocations=top)


def _nan_to_none(v: Any) -> Any:
    if isinstance(v, float) and np.isnan(v):
        return None
    if isinstance(v, (np.floating,)):
        return None if np.isnan(v) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def trace_summary_dict(an: TraceRunAnalysis) -> dict[str, Any]:
    tl = an.timeline
    st = an.stages
    rj = an.run.run or {}
    if len(tl):
        a = tl["allocated"].to_numpy()
        pi = int(np.argmax(a))
        t_peak = float(tl["time_us"].iat[pi])
        peak_stage = str(stage_at(np.array([t_peak]), st, default="unlabelled")[0]) if len(st) else "unlabelled"
        peak = {"allocated_bytes": int(a[pi]), "reserved_bytes": int(tl["reserved"].max()),
                "requested_bytes": None, "event_index": pi, "time_us": int(t_peak), "stage": peak_stage,
                "within_recorded_window": False}
        baseline = int(a[0] - tl["bytes"].iat[0]) if "bytes" in tl else 0
    else:
        peak = {"allocated_bytes": 0, "reserved_bytes": 0, "requested_bytes": None, "event_index": -1,
                "time_us": None, "stage": "unlabelled", "within_recorded_window": False}
        baseline = 0
    groups: dict[str, dict[str, Any]] = {}
    stages_out: list[dict[str, Any]] = []
    rss = {s["name"]: s.get("rss_peak_bytes") for s in rj.get("stages") or []}
    for r in st.itertuples(index=False):
        name = str(r.name)
        g = groups.get(stage_group(name))
        item = {"name": name, "peak_allocated_bytes": _nan_to_none(r.peak_allocated_bytes),
                "peak_reserved_bytes": _nan_to_none(r.peak_reserved_bytes),
                "start_us": int(r.start_us), "end_us": int(r.end_us)}
        if rss.get(name) is not None:
            item["rss_peak_bytes"] = rss[name]
        if g is None:
            g = groups[stage_group(name)] = {"name": stage_group(name), "peak_allocated_bytes": 0, "peak_reserved_bytes": 0,
                                             "start_us": int(r.start_us), "end_us": int(r.end_us), "steps": [], "intervals": []}
            stages_out.append(g)
        g["peak_allocated_bytes"] = max(g["peak_allocated_bytes"], item["peak_allocated_bytes"] or 0)
        g["peak_reserved_bytes"] = max(g["peak_reserved_bytes"], item["peak_reserved_bytes"] or 0)
        g["end_us"] = max(g["end_us"], int(r.end_us))
        g["intervals"].append(item)
        if "/" in name:
            g["steps"].append({"name": name, "step": name.split("/", 1)[1], **{k: v for k, v in item.items() if k != "name"}})
    if peak["stage"] == "unlabelled" and len(tl):
        # The peak lies outside every range: the stage table says so rather than omit it.
        t = tl["time_us"].to_numpy()
        out = stage_at(t, st, default="unlabelled") == "unlabelled" if len(st) else np.ones(len(t), bool)
        a = tl["allocated"].to_numpy()
        stages_out.append({"name": "unlabelled", "peak_allocated_bytes": int(a[out].max()),
                           "peak_reserved_bytes": int(tl["reserved"].to_numpy()[out].max()),
                           "start_us": int(t[out].min()), "end_us": int(t[out].max()), "steps": [], "intervals": []})
    att = attention_verdict(an.attention_ops)
    dev = an.trace.device
    return {
        "schema": SCHEMA, "source": an.run.source, "kind": "trace",
        "device": (f"cuda:{dev[1]}" if dev and dev[0] == 1 else "cpu") if dev else None,
        "stage_source": "annotations" if len(st) else "none",
        "peak": peak,
        "history": {"events": int(len(tl)), "truncated": False, "baseline_allocated_bytes": baseline},
        "stages": stages_out,
        "attention": att,
        "top_allocations": [
            {"bytes": int(t.bytes), "stage": str(stage_at(np.array([t.time_us]), st, default="unlabelled")[0]) if len(st) else "unlabelled",
             "site": t.site, "address": int(t.addr), "time_us": int(t.time_us), "stack": list(t.stack),
             **({"op": t.op, "op_input_dims": t.op_input_dims} if t.op else {})}
            for t in an.top_allocations.itertuples(index=False)],
        "top_allocations_note": ("allocations made before the trace began (e.g. weights loaded before profiling) are "
                                 f"not itemized: {baseline:,} bytes were already allocated at its first event; "
                                 "Python lines are the first line of each function (profiler stacks)"),
        "allocator_truth": {k: (rj.get("allocator") or {}).get(k) for k in ("max_memory_allocated", "max_memory_reserved")} if rj else None,
        "run": {k: rj.get(k) for k in ("pipeline", "size", "techniques", "height", "width", "steps", "batch", "dtype",
                                         "device_name", "torch_version", "diffusers_version", "command")} if rj else None,
        "warnings": an.warnings,
    }
