"""The view-model of the snapshot report (:class:`~.view_models.SnapshotReport`): everything
it shows, as typed plain columns (no Bokeh).

:func:`report_data` is the one step between the analyses and the renderer
(:mod:`snapviz.render.html.snapshot`), which draws what it holds and computes nothing; what
takes computing comes from :func:`snapviz.analyses.report_view.report_view`. Tests assert on it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses import document
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import Absent, EndState, Summary
from snapviz.analyses.oom import oom_lines
from snapviz.analyses.report_view import ReportView
from snapviz.model import A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, A_OOM, ACTIONS
from snapviz.render.fmt import fmt_peak_bound
from snapviz.render.html.palette import category_palette, stage_palette
from snapviz.render.html.stage_data import stage_bands, stage_bars, stage_breakdown, stage_top
from snapviz.render.html.view_common import (
    StackTable,
    allocator_truth,
    decimated_rows,
    decimation_note,
    intern_stages,
    metadata_rows,
    run_title,
    time_axis,
)
from snapviz.render.html.view_models import (
    Advice,
    AttentionRows,
    AttentionView,
    Categories,
    Headline,
    Oom,
    Peak,
    SnapshotReport,
    Timeline,
    TopAllocations,
)
from snapviz.safe_text import printable
from snapviz.units import fmt_bytes
from snapviz.vocab import BEFORE_RECORDING, END_STATE_ONLY

ACTION_NAMES: tuple[str, ...] = ACTIONS
MAX_ATTENTION_ROWS = 500


def _categories(summary: Summary, colors: dict[str, str]) -> Categories:
    cats = [] if isinstance(summary.categories, Absent) else summary.categories
    total = sum(c.bytes for c in cats) or 1
    return Categories(
        category=[c.category for c in cats],
        bytes=np.array([float(c.bytes) for c in cats]),
        count=np.array([c.count for c in cats], np.int64),
        share=np.array([c.bytes / total for c in cats]),
        label=[f"{fmt_bytes(c.bytes)} ({c.bytes / total:.0%})" for c in cats],
        color=[colors.get(c.category, "#999999") for c in cats],
    )


def _oom_section(summary: Summary) -> document.Oom | None:
    """The summary's OOM section (None: no OOM recorded)."""
    return summary.oom if isinstance(summary.oom, document.Oom) else None


def _end_state_only(summary: Summary) -> bool:
    """The snapshot holds no history, only what was live when it was taken."""
    return isinstance(summary.end_state, EndState) and summary.end_state.only


def _advice(summary: Summary) -> list[Advice]:
    total = summary.peak.allocated_bytes
    out = []
    for a in [] if isinstance(summary.advice, Absent) else summary.advice:
        saves = a.saves_up_to_bytes
        out.append(
            Advice(
                technique=a.technique,
                why=a.why,
                how=a.how,
                saves_up_to_bytes=saves,
                saves=f"up to {fmt_bytes(saves)}" if saves else "saving not measurable from this run",
                share=(saves / total) if (saves and total) else None,
            )
        )
    return out


def _dims(text: Any) -> str:
    """``[[16, 4096, 40], [], []]`` -> ``16×4096×40`` (empty and scalar inputs dropped)."""
    if not isinstance(text, str) or not text.strip():
        return ""
    try:
        dims = json.loads(text)
    except ValueError:
        return text
    if not isinstance(dims, list):
        return text
    shapes = ["×".join(map(str, d)) for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    return ", ".join(shapes)


def _top_allocations(an: Analysis, time_s: np.ndarray, stacks: StackTable) -> TopAllocations:
    top = an.top_allocations
    rows = top["row"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    sids = top["stack_id"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    # With the run's profiler trace joined: the op running at each allocation, and its inputs.
    ops = [str(x) if isinstance(x, str) else "" for x in top["op"]] if "op" in top else [""] * len(top)
    dims = [_dims(x) for x in top["op_input_dims"]] if "op_input_dims" in top else [""] * len(top)
    return TopAllocations(
        bytes=top["bytes"].to_numpy(np.float64) if len(top) else np.empty(0),
        size=[fmt_bytes(b) for b in (top["bytes"] if len(top) else [])],
        requested_bytes=top["requested_bytes"].to_numpy(np.float64) if len(top) else np.empty(0),
        stage=[str(s) for s in (top["stage"] if len(top) else [])],
        site=[str(s) for s in (top["site"] if len(top) else [])],
        event_index=rows,
        # end-state blocks (row -1) were allocated by no event of the file: no time
        time_s=np.where(rows >= 0, time_s[np.clip(rows, 0, None)], np.nan)
        if len(rows) and len(time_s)
        else np.full(len(rows), np.nan),
        stack=stacks.add_many(sids),
        stack_text=[an.sites.stack_text(int(s), limit=40) if an.sites is not None else "" for s in sids],
        has_ops=any(ops),
        op=ops,
        op_input_dims=dims,
    )


def _attention(an: Analysis, summary: Summary, time_s: np.ndarray, stacks: StackTable) -> AttentionView:
    att = an.attention
    section = summary.attention
    found = AttentionView(
        count=section.count,
        largest_bytes=section.largest.bytes,
        peak_live_bytes=section.peak_live_bytes,
        # control characters from the file's frames (function names) shown as escapes
        implementation=printable(section.implementation, None),
    )
    if not len(att):
        return found
    shown = att.sort_values(["bytes", "row"], ascending=[False, True], kind="stable").head(MAX_ATTENTION_ROWS)
    rows = shown["row"].to_numpy(np.int64)
    local = stacks.add_many(an.replay.events["stack_id"].to_numpy()[rows])
    note = f"showing the {len(shown):,} largest of {len(att):,} score allocations" if len(att) > len(shown) else ""
    free_row = shown["free_row"].to_numpy(np.int64)
    n = len(time_s)
    life = np.where(free_row < n, free_row - rows, -1)
    if len(time_s) and np.isfinite(time_s).all():
        dt = np.where(free_row < n, time_s[np.clip(free_row, 0, n - 1)] - time_s[rows], np.nan)
        lifetime = [
            f"{d * 1e3:,.2f} ms ({_events(e)})" if e >= 0 else "not freed" for d, e in zip(dt, life, strict=False)
        ]
    else:
        lifetime = [_events(e) if e >= 0 else "not freed" for e in life]
    return replace(
        found,
        note=note,
        rows=AttentionRows(
            event_index=rows,
            time_s=time_s[rows],
            bytes=shown["bytes"].to_numpy(np.float64),
            size=[fmt_bytes(b) for b in shown["bytes"]],
            shape=["×".join(map(str, s)) if isinstance(s, (list, tuple)) else "?" for s in shown["shape"]],
            dtype=[str(d) if d else "?" for d in shown["dtype"]],
            stage=[str(s) for s in shown["stage"]],
            site=[str(s) for s in shown["site"]],
            live_events=life,
            lifetime=lifetime,
            stack=local,
            stack_text=[stacks.stacks.text(int(k)) for k in local],
        ),
    )


def _oom(
    an: Analysis,
    oom: document.Oom | None,
    rows: np.ndarray,
    time_s: np.ndarray,
    alloc: np.ndarray,
    labels: np.ndarray,
) -> Oom:
    """The OOM markers with their own request (a marker's hover names it, not a nearby event);
    ``oom``: the summary's OOM section (None: none)."""
    ev = an.replay.events
    live: list[str] = []
    if oom:
        cats = oom.live_categories
        if cats:
            live.append("live then: " + ", ".join(f"{c.category} {fmt_bytes(c.bytes)}" for c in cats[:5]))
        live += [f"{fmt_bytes(c.bytes)} live from {c.site}" for c in oom.live_sites[:3]]
    return Oom(
        index=rows.astype(np.int64),
        time_s=time_s[rows],
        allocated=alloc[rows].astype(np.float64),
        requested=ev["size"].to_numpy(np.float64)[rows],
        # control characters from the file shown as escapes, as in the terminal
        site=[printable(an.sites.site(int(s)), None) for s in ev["stack_id"].to_numpy()[rows]],
        stage=[printable(x, None) for x in labels[rows]],
        lines=[printable(x, None) for x in oom_lines(oom)] if oom else [],
        live=[printable(x, None) for x in live],
    )


def _events(n: int) -> str:
    return f"{n:,} event" + ("" if n == 1 else "s")


def _headline(summary: Summary, peak: Peak, top_site: str | None, has_time: bool) -> Headline:
    p = summary.peak
    window = " (within the recorded window only)" if p.within_recorded_window else ""
    when = []
    if has_time and peak.time_s is not None and np.isfinite(peak.time_s):
        when.append(f"at {peak.time_s:.3f} s")
    if peak.index >= 0:
        when.append(f"event {peak.index:,}")
        where = f"in {p.stage}" + (f", {' · '.join(when)}" if when else "")
    elif _end_state_only(summary) or not summary.history.events:
        where, window = f"live when the snapshot was taken ({END_STATE_ONLY})", ""
    else:
        where = "before the recorded history began"
    verdict = (
        f"Peak {fmt_peak_bound(p)}{fmt_bytes(p.allocated_bytes)} allocated "
        f"({fmt_bytes(p.reserved_bytes)} reserved) {where}{window}"
    )
    if _end_state_only(summary):  # no peak in such a file: what was live, and when
        verdict = f"{fmt_bytes(p.allocated_bytes)} allocated ({fmt_bytes(p.reserved_bytes)} reserved) {where}"
    lines = []
    if summary.not_recorded:  # nothing to report as a peak
        verdict = summary.not_recorded
    if oom := _oom_section(summary):  # OOM first: the failed request is the verdict, the peak a line under it
        lines.append(verdict)
        verdict = printable(oom_lines(oom)[0], None)
    if top_site:
        lines.append(f"Largest block live at the peak comes from {top_site}")
    att = summary.attention
    if att.count:
        lg = att.largest
        shape = "×".join(map(str, lg.shape)) if lg.shape else "?"
        lines.append(
            f"{att.count:,} attention score matrices materialized (largest {fmt_bytes(lg.bytes)}, "
            f"[{shape}]); up to {fmt_bytes(att.peak_live_bytes)} live at once"
        )
    return Headline(title=run_title(summary), verdict=verdict, lines=lines, truth=allocator_truth(summary))


def report_data(an: Analysis, summary: Summary, view: ReportView, max_points: int = 20000) -> SnapshotReport:
    """The snapshot report of one :class:`~snapviz.analyses.analysis.Analysis`, its
    ``snapviz.summary/1`` document (:func:`~snapviz.analyses.pipeline.document_of`) and its
    :func:`~snapviz.analyses.report_view.report_view`."""
    ev = an.replay.events
    n = len(ev)
    time_us = ev["time_us"].to_numpy(np.int64)
    has_time, t0, time_s = time_axis(time_us)
    alloc = ev["allocated"].to_numpy(np.int64)
    resv = ev["reserved"].to_numpy(np.int64)
    req = ev["requested"].to_numpy(np.int64)
    frag = resv - alloc
    actions = ev["action"].to_numpy(np.int8)
    rep = an.replay
    oom_rows = np.flatnonzero(actions == A_OOM)
    force = [rep.peak_index, rep.peak_reserved_index, *oom_rows[:100].tolist()]
    keep = (
        decimated_rows(n, [alloc, resv, req, frag], max_points, force, time_us if has_time else None)
        if n
        else np.empty(0, np.int64)
    )

    labels = np.asarray(an.labels.labels, dtype=object)
    stage_names, stage_codes = intern_stages(labels) if n else ([], np.empty(0, np.int32))
    interval_names = [str(x) for x in an.stages["name"]] if len(an.stages) else []
    palette = stage_palette(list(dict.fromkeys(interval_names + stage_names)))

    stacks = StackTable(an.run.snapshot, an.sites)
    a_k = actions[keep]
    is_block = np.isin(a_k, (A_ALLOC, A_FREE_REQ, A_FREE_DONE, A_FREE))
    size_col = np.where(is_block, ev["block_size"].to_numpy(np.int64)[keep], ev["size"].to_numpy(np.int64)[keep])
    timeline = Timeline(
        index=keep.astype(np.int64),
        time_s=time_s[keep],
        allocated=alloc[keep].astype(np.float64),
        reserved=resv[keep].astype(np.float64),
        requested=req[keep].astype(np.float64),
        fragmentation=frag[keep].astype(np.float64),
        action=a_k.astype(np.int32),
        stage=stage_codes[keep] if n else np.empty(0, np.int32),
        size=size_col.astype(np.float64),
        stack=stacks.add_many(ev["stack_id"].to_numpy()[keep]) if n else np.empty(0, np.int32),
    )

    pi = int(rep.peak_index)
    peak = Peak(
        index=pi,
        time_s=float(time_s[pi]) if (pi >= 0 and has_time) else None,
        allocated=int(rep.peak_allocated),
        reserved=int(rep.peak_reserved),
        requested=int(rep.peak_requested),
        stage=str(an.peak_stage),
        reserved_index=int(rep.peak_reserved_index),
        label=f"peak {fmt_bytes(rep.peak_allocated)} · {an.peak_stage}",
    )

    st = an.stages
    bands = stage_bands(
        interval_names,
        st["start_row"].to_numpy() if len(st) else np.empty(0, np.int64),
        st["end_row"].to_numpy() if len(st) else np.empty(0, np.int64),
        time_s,
        has_time,
        palette,
    )
    top = _top_allocations(an, time_s, stacks)
    attention = _attention(an, summary, time_s, stacks)
    cat_tl = view.category_timeline
    live = an.stage_live if isinstance(an.stage_live, pd.DataFrame) and len(an.stage_live) else None
    colors = category_palette(
        [
            *(c.category for c in ([] if isinstance(summary.categories, Absent) else summary.categories)),
            *cat_tl.categories,
            *(live["category"] if live is not None else []),
            BEFORE_RECORDING,
        ]
    )
    bars = stage_bars(an, summary, palette)
    breakdown = stage_breakdown(an, view, bars, colors)
    headline = _headline(summary, peak, top.site[0] if top.site else None, has_time)
    return SnapshotReport(
        title=headline.title,
        headline=headline,
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
        action_names=list(ACTION_NAMES),
        stacks=stacks.stacks,
        oom=_oom(an, _oom_section(summary), oom_rows, time_s, alloc, labels),
        advice=_advice(summary),
        stage_breakdown=breakdown,
        stage_top=stage_top(an, breakdown.interval, time_s, stacks),
        category_colors=colors,
        category_timeline=cat_tl,
        category_stage=stage_codes[cat_tl.index] if n else np.empty(0, np.int32),
        categories=_categories(summary, colors),
        top_allocations=top,
        attention=attention,
        end_state_only=_end_state_only(summary),
    )
