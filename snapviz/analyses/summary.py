"""A run with a snapshot to its :class:`~snapviz.analyses.analysis.Analysis`: the allocator
replayed, every result table computed once (pure: no rendering here)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis, Capabilities, ReplayEvidence
from snapviz.analyses.attention import find_attention
from snapviz.analyses.categories import allocation_table, live_categories
from snapviz.analyses.end_state import (
    end_state,
    end_state_categories,
    end_state_top,
    split_before_recording,
)
from snapviz.analyses.frame_rules import RuleSet, load_rules
from snapviz.analyses.join import ops_at, snapshot_trace_offset
from snapviz.analyses.live_sets import stage_live_sets, top_live
from snapviz.analyses.not_recorded import empty_snapshot_note
from snapviz.analyses.oom import (
    explained_oom,
    oom_devices,
    oom_note,
    oom_report,
    oom_rows,
    run_json_oom,
)
from snapviz.analyses.replay import ReplayResult, expandable_segments, replay_allocator
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stack_tables import StackTables
from snapviz.analyses.stages import label_events, stage_intervals, stage_table
from snapviz.analyses.training_view import training_view
from snapviz.errors import InputError
from snapviz.load import Run
from snapviz.vocab import END_STATE_ONLY


def pick_device(run: Run, device: int | None) -> tuple[int, dict[int, ReplayResult], str]:
    snap = run.snapshot
    assert snap is not None
    devs = snap.devices or [0]
    results = {d: replay_allocator(snap, d) for d in devs}
    if device is not None:
        if device not in results:
            raise InputError(
                f"{snap.source}: no device {device} in this snapshot (devices: {', '.join(map(str, devs))})"
            )
        return device, results, "chosen with --device"
    # OOM first: the device that failed is the one to explain.
    failed = [d for d in oom_devices(snap, run.run_json) if d in results]
    if failed:
        return failed[0], results, "the device that ran out of memory"
    best = max(devs, key=lambda d: (results[d].peak_allocated, -d))
    return best, results, "highest peak"


def analyze_run(
    run: Run, device: int | None = None, stage_source: str = "auto", rules: RuleSet | None = None
) -> Analysis:
    """Replay, attribute and summarise one run (snapshot required; traces: see trace_ops).

    ``rules`` (default: the built-in rules) and the snapshot's stack tables are resolved
    once here and handed to every analysis that reads frames.
    """
    snap = run.snapshot
    if snap is None:
        raise InputError(f"{run.source}: no snapshot to analyse (a trace-only run: use the trace analysis)")
    rules = rules if rules is not None else load_rules()
    tables = StackTables(snap)
    dev, results, why_dev = pick_device(run, device)
    rep = results[dev]
    ev = rep.events
    labels = label_events(snap, ev, dev, use=stage_source, rules=rules, tables=tables, run_json=run.run_json)
    times = ev["time_us"].to_numpy() if len(ev) else np.empty(0, np.int64)
    alloc = ev["allocated"].to_numpy() if len(ev) else np.empty(0, np.int64)
    resv = ev["reserved"].to_numpy() if len(ev) else np.empty(0, np.int64)
    intervals = stage_intervals(labels.labels, times)
    stages = stage_table(intervals, alloc, resv, rep.baseline_allocated, rep.baseline_reserved)
    sites = SiteNamer(snap, tables)
    top = top_live(rep, labels.labels, sites, rep.peak_index)
    allocs = allocation_table(snap, rep, labels.labels, rules, tables)

    attention, att_summary = find_attention(snap, rep, labels.labels, stages, sites, rules, tables, run.run_json)
    if run.trace is not None and len(ev):
        # Same run profiled too: put exact op shapes next to allocations (one time axis).
        off = snapshot_trace_offset(snap, run.trace)
        top = pd.concat([top.reset_index(drop=True), ops_at(run.trace, top["time_us"].to_numpy(), off)], axis=1)
        if len(attention):
            times = ev["time_us"].to_numpy()[attention["row"].to_numpy()]
            attention = pd.concat([attention.reset_index(drop=True), ops_at(run.trace, times, off)], axis=1)
        att_summary = replace(att_summary, trace_offset_us=off)
    es = end_state(snap, rep, sites, rules, tables)
    only = es.only and bool(len(es.blocks))
    if only:  # no history: what held memory is the end state's blocks, named by their frames
        top = end_state_top(es)
        categories = end_state_categories(es)
    else:
        categories = split_before_recording(live_categories(allocs, rep.peak_index, rep.baseline_allocated), es)

    stage_live, stage_top = stage_live_sets(allocs, stages, sites)
    warnings = list(snap.format_notes) + list(rep.warnings)
    warnings.extend(labels.notes)
    if (nothing := empty_snapshot_note(snap)) is not None:
        warnings.insert(0, nothing)
    if only:
        warnings.insert(0, f"{END_STATE_ONLY} ({len(es.blocks):,} live blocks, named by their own frames)")
    if private := [p for p in (es.pools.to_dict("records") if len(es.pools) else []) if p["pool"] != "0,0"]:
        warnings.append(
            "private memory pools (CUDA graphs or MemPool): "
            + ", ".join(f"{p['name']} {p['reserved_bytes']:,} B reserved in {p['segments']} segments" for p in private)
        )
    if labels.source == "none" and len(ev) and not only:
        warnings.append(
            "no stage labels, and the built-in rules do not recognise this program (no pipeline stage, "
            "no forward/backward/optimizer frames, no profiler ranges): every event is 'unlabelled'"
        )
    elif labels.source == "phases":
        warnings.append(
            "stages are generic PyTorch phases (forward / backward / optimizer / zero_grad / load) "
            "recognised in the frames: the built-in pipeline rules do not know this program (--rules adds its own)"
        )
    oom_cats = None
    if len(rows := oom_rows(rep)):
        row, survived = explained_oom(rep, rows)
        oom_cats = split_before_recording(live_categories(allocs, row, rep.baseline_allocated), es)
        if (note := oom_note(len(rows), survived)) is not None:
            warnings.append(note)
    elif len(ev) and run_json_oom(run.run_json, dev) is not None:
        oom_cats = split_before_recording(live_categories(allocs, len(ev) - 1, rep.baseline_allocated), es)
    elsewhere = [d for d in oom_devices(snap, run.run_json) if d != dev]
    if elsewhere and not len(rows):
        warnings.append(
            f"CUDA out of memory on cuda:{elsewhere[0]}, not on the device shown: --device {elsewhere[0]} explains it"
        )
    oom = oom_report(snap, rep, labels.labels, sites, oom_cats, run.run_json, expandable_segments(snap, dev))
    dp = pd.DataFrame(
        [
            {
                "device": d,
                "peak_allocated_bytes": r.peak_allocated,
                "peak_reserved_bytes": r.peak_reserved,
                "events": len(r.events),
            }
            for d, r in sorted(results.items())
        ]
    )
    if len(results) > 1:
        warnings.append(
            f"{len(results)} devices in this snapshot; showing device {dev} ({why_dev})"
            + ("" if device is not None else "; use --device to pick another")
        )
    return Analysis(
        run=run,
        device=dev,
        capabilities=Capabilities(exact_blocks=True, reserved_recorded=True, exact_totals=not rep.approximate),
        evidence=ReplayEvidence(replay=rep, sites=sites, tables=tables, rules=rules),
        labels=labels,
        stages=stages,
        top_allocations=top,
        attention=attention,
        attention_summary=att_summary,
        categories=categories,
        device_peaks=dp,
        warnings=warnings,
        stage_live=stage_live,
        stage_top=stage_top,
        training=training_view(allocs, stages, snap),
        oom=oom,
        end_state=es,
        allocations=allocs,
    )
