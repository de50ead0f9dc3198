"""The view-model of a trace-only run's report (a Chrome trace without a snapshot).

Reads of ``tan`` (an :class:`~snapviz.analyses.analysis.Analysis` of kind ``trace``) only its
``timeline`` (time_us, allocated, reserved), ``stages`` (name, start_us, end_us,
peak_allocated_bytes) and ``attention`` (the attention ops) DataFrames;
``summary`` is its ``snapviz.summary/1`` document. No allocator replay, so no stacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from snapviz.analyses.document import Absent, Summary
from snapviz.render.fmt import fmt_peak_bound
from snapviz.render.html.palette import stage_palette
from snapviz.render.html.snapshot_data import MAX_ATTENTION_ROWS
from snapviz.render.html.stage_data import band_alpha
from snapviz.render.html.view_common import (
    allocator_truth,
    decimated_rows,
    decimation_note,
    intern_stages,
    metadata_rows,
    run_title,
    time_axis,
    unique_labels,
)
from snapviz.render.html.view_models import Bands, Headline, Peak, StageBars, TextTable, Timeline, TraceReport
from snapviz.safe_text import printable
from snapviz.units import fmt_bytes
from snapviz.vocab import stage_group

if TYPE_CHECKING:
    from snapviz.analyses.analysis import Analysis


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return ""
    if isinstance(v, (list, tuple, np.ndarray)):
        return "×".join(map(str, v)) if all(isinstance(x, (int, np.integer)) for x in v) else ", ".join(map(str, v))
    if isinstance(v, (float, np.floating)):
        return f"{v:,.3f}"
    if isinstance(v, (int, np.integer)):
        return f"{v:,}"
    return str(v)


def trace_report_data(tan: Analysis, summary: Summary, max_points: int = 20000) -> TraceReport:
    """The report of a trace-only run (no allocator replay, no stacks)."""
    tl = tan.timeline
    n = len(tl)
    time_us = tl["time_us"].to_numpy(np.int64) if n else np.empty(0, np.int64)
    order = np.argsort(time_us, kind="stable")
    time_us = time_us[order]
    alloc = tl["allocated"].to_numpy(np.int64)[order] if n else np.empty(0, np.int64)
    resv = (tl["reserved"].to_numpy(np.int64)[order] if "reserved" in tl else alloc) if n else np.empty(0, np.int64)
    has_time, t0, time_s = time_axis(time_us)
    frag = resv - alloc
    # the analysis' own peak, at its place on the time-sorted axis
    pi = int(np.flatnonzero(order == tan.peak_index)[0]) if n else -1
    keep = (
        decimated_rows(n, [alloc, resv, frag], max_points, [pi], time_us if has_time else None)
        if n
        else np.empty(0, np.int64)
    )

    st = tan.stages
    names = [str(x) for x in st["name"]] if len(st) else []
    # Stage of each timeline point: the analysis' one labelling (stages.label_by_intervals).
    stage_of = np.asarray(tan.labels.labels, dtype=object)[order] if n else np.empty(0, dtype=object)
    stage_names, stage_codes = intern_stages(stage_of) if n else ([], np.empty(0, np.int32))
    palette = stage_palette(list(dict.fromkeys(names + stage_names)))
    timeline = Timeline(
        index=keep.astype(np.int64),
        time_s=time_s[keep],
        allocated=alloc[keep].astype(np.float64),
        reserved=resv[keep].astype(np.float64),
        fragmentation=frag[keep].astype(np.float64),
        stage=stage_codes[keep] if n else np.empty(0, np.int32),
    )
    if len(st) and n:
        s_us, e_us = st["start_us"].to_numpy(np.int64), st["end_us"].to_numpy(np.int64)
        bands = Bands(
            name=names,
            group=[stage_group(x) for x in names],
            color=[palette[x] for x in names],
            alpha=band_alpha(names),
            start_s=(s_us - t0) / 1e6,
            end_s=(e_us - t0) / 1e6,
            start_index=np.searchsorted(time_us, s_us, "left"),
            end_index=np.searchsorted(time_us, e_us, "right"),
        )
    else:
        bands = Bands(
            name=[],
            group=[],
            color=[],
            alpha=[],
            start_s=np.empty(0),
            end_s=np.empty(0),
            start_index=np.empty(0, np.int64),
            end_index=np.empty(0, np.int64),
        )
    peak_doc = summary.peak
    peak_alloc = int(peak_doc.allocated_bytes or (alloc[pi] if n else 0))
    peak_stage = str(peak_doc.stage or (stage_of[pi] if n else "n/a"))
    peak = Peak(
        index=pi,
        time_s=float(time_s[pi]) if (n and has_time) else None,
        allocated=peak_alloc,
        reserved=int(peak_doc.reserved_bytes or (resv.max() if n else 0)),
        requested=None,
        stage=peak_stage,
        reserved_index=int(np.argmax(resv)) if n else -1,
        label=f"peak {fmt_bytes(peak_alloc)} · {peak_stage}",
    )
    bars = StageBars(
        label=unique_labels(names),
        name=names,
        group=[stage_group(x) for x in names],
        color=[palette[x] for x in names],
        peak_allocated=st["peak_allocated_bytes"].to_numpy(np.float64) if len(st) else np.empty(0),
        peak_reserved=(
            st["peak_reserved_bytes"].to_numpy(np.float64) if "peak_reserved_bytes" in st else np.full(len(st), np.nan)
        ),
        allocator_peak=np.full(len(st), np.nan),
        duration_s=((st["end_us"] - st["start_us"]).to_numpy(np.float64) / 1e6) if len(st) else np.empty(0),
    )
    ops = tan.attention
    ops_shown = ops.head(MAX_ATTENTION_ROWS)
    att_table = TextTable(
        columns=[str(c) for c in ops_shown.columns],
        rows=[[_cell(v) for v in r] for r in ops_shown.itertuples(index=False)],
        note=(f"showing {len(ops_shown):,} of {len(ops):,} attention ops" if len(ops) > len(ops_shown) else ""),
    )
    window = " (within the recorded window only)" if peak_doc.within_recorded_window else ""
    when = f", at {peak.time_s:.3f} s" if peak.time_s is not None else ""
    reserved = (
        f"{fmt_bytes(peak.reserved)} reserved" if peak_doc.reserved_bytes is not None else "reserved not recorded"
    )
    verdict = (
        f"Peak {fmt_peak_bound(peak_doc)}{fmt_bytes(peak_alloc)} allocated ({reserved}) in {peak_stage}{when}{window}"
        if n
        else "No memory events in this trace: nothing to measure"
    )
    if summary.not_recorded:  # the CPU allocator's figures are no headline of a GPU run
        verdict = summary.not_recorded
    lines = [
        "From the profiler trace's memory events (no snapshot, so no allocator replay): the allocator's "
        "totals after every allocation, with Python stacks from the trace when recorded with with_stack=True"
    ]
    live_table = TextTable(
        columns=["size", "stage", "allocated in (Python, function start line)", "op (trace)", "op input shapes"],
        rows=[
            [
                fmt_bytes(t.bytes),
                t.stage,
                t.site,
                "" if isinstance(t.op, Absent) else t.op,
                "" if isinstance(t.op_input_dims, Absent) else t.op_input_dims,
            ]
            for t in summary.top_allocations
        ],
        note="" if isinstance(summary.top_allocations_note, Absent) else summary.top_allocations_note,
    )
    implementation = summary.attention.implementation
    if implementation:
        lines.append(f"Attention: {implementation}")
    return TraceReport(
        title=run_title(summary),
        headline=Headline(title=run_title(summary), verdict=verdict, lines=lines, truth=allocator_truth(summary)),
        warnings=list(summary.warnings),
        has_time=has_time,
        timeline=timeline,
        stage_names=stage_names,
        stage_colors=palette,
        bands=bands,
        peak=peak,
        stage_bars=bars,
        metadata=metadata_rows(summary, t0),
        decimation=decimation_note(len(keep), n),
        attention_ops=att_table,
        live_table=live_table,
        # control characters from the trace's op names shown as escapes
        attention_implementation=printable(implementation, None),
    )
