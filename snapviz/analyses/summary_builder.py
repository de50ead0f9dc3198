"""The one builder of the ``snapviz.summary/1`` document: any analysis in, a typed
:class:`~snapviz.analyses.document.Summary` out.

The document's shape is written here once, for both kinds of analysis: the stage table and
its groups, the peak, the history, the devices, what was live at the peak, the allocator's own
figures, the run's fields, the warnings and the "not recorded" sentence. What only one kind
has is filled from it and left :data:`~snapviz.analyses.document.ABSENT` for the other: a
replayed snapshot (an :class:`~snapviz.analyses.analysis.Analysis` of kind ``snapshot``) adds
the categories at the peak, the advice, the OOM, the end state and the training view; a
profiler trace (kind ``trace``) its device kind and what its totals cannot itemize.

Every section comes typed from the module that computes it (attention, OOM, end state,
training, advice); the builder adds to the OOM what only it has (the simulation, the advice,
the sentences). Only what the user's run.json and snapshot give as JSON (the allocator's own
figures, the run's fields, the allocator's settings) is decoded here (:func:`_user_json`),
checked as the document types it, so a malformed file fails at build time, not in a reader.
``--json`` only encodes the result (:func:`~snapviz.analyses.document.to_json`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import (
    ABSENT,
    Absent,
    AnyAdvice,
    Attention,
    CategoryBytes,
    DevicePeak,
    History,
    Interval,
    Oom,
    Peak,
    SiteBytes,
    StageGroup,
    Summary,
    TopAllocation,
    TraceDevice,
    Training,
    field_from_json,
)
from snapviz.vocab import SUMMARY_SCHEMA, UNLABELLED, run_summary_fields, stage_group

# --------------------------------------------------------------------------- shared pieces


def _user_json(name: str, value: object) -> Any:
    """Field ``name`` of the document from what the user's files give as JSON (run.json's
    figures and fields, the snapshot's allocator settings), checked as the document types it."""
    return field_from_json(Summary, name, value)


def _int_or_none(v: object) -> int | None:
    """A byte figure as an int; None where there is none (NaN, null, or not a number: the
    run's own ``run.json`` is read, and may hold anything)."""
    if isinstance(v, (bool, np.bool_)) or v is None:
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)) and np.isfinite(v) and float(v).is_integer():
        return int(v)
    return None


def _max_known(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _groups(intervals: Iterable[tuple[str, Interval]]) -> list[StageGroup]:
    """Stage intervals (each with its group: the name before ``/``) grouped in order of first
    appearance: a group's peaks are the highest known over its intervals (None: none known),
    and a numbered interval (``denoise/3``) is one of its ``steps`` too."""
    out: dict[str, dict[str, Any]] = {}
    for group, iv in intervals:
        g = out.get(group)
        if g is None:
            g = out[group] = {
                "peak_allocated_bytes": None,
                "peak_reserved_bytes": None,
                "start_us": iv.start_us,
                "end_us": iv.end_us,
                "steps": [],
                "intervals": [],
            }
        g["peak_allocated_bytes"] = _max_known(g["peak_allocated_bytes"], iv.peak_allocated_bytes)
        g["peak_reserved_bytes"] = _max_known(g["peak_reserved_bytes"], iv.peak_reserved_bytes)
        g["end_us"] = max(g["end_us"], iv.end_us)
        g["intervals"].append(iv)
        if "/" in iv.name:
            g["steps"].append(_as_step(iv))
    return [StageGroup(name=name, **g) for name, g in out.items()]


def _as_step(iv: Interval) -> Interval:
    return replace(iv, step=iv.name.split("/", 1)[1])


def _top(rows: Iterable[tuple[Any, str, list[str]]], *, snapshot: bool) -> list[TopAllocation]:
    """What was live at the peak: the analysis's ``top_allocations`` rows (largest first), each
    with its stage and its stack's lines."""
    out = []
    for t, stage, stack in rows:
        op = getattr(t, "op", "") or ""
        dims = getattr(t, "op_input_dims", "") or ""
        out.append(
            TopAllocation(
                bytes=int(t.bytes),
                requested_bytes=int(t.requested_bytes) if snapshot else ABSENT,
                stage=stage,
                site=str(t.site),
                address=int(t.addr),
                event_index=(int(t.row) if int(t.row) >= 0 else None) if snapshot else ABSENT,
                time_us=ABSENT if snapshot else int(t.time_us),
                stack=stack,
                op=str(op) if op else ABSENT,
                op_input_dims=str(dims) if dims else ABSENT,
            )
        )
    return out


def build_summary(an: Analysis) -> Summary:
    """The ``snapviz.summary/1`` document of any analysis (docs/design.md: additions fine,
    renames need ``/2``)."""
    return _snapshot_summary(an) if an.kind == "snapshot" else _trace_summary(an)


# --------------------------------------------------------------------------- a replayed snapshot


def _stage_truth(an: Analysis) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's own per-stage figures (``run.json``), by stage name and occurrence, for this device."""
    run = an.run.run_json or {}
    out: dict[tuple[str, int], dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for s in run.get("stages") or []:
        k = seen.get(s["name"], 0)
        seen[s["name"]] = k + 1
        entry = dict(s)
        for pd_ in s.get("per_device") or []:
            if pd_.get("device") == an.device:
                entry["peak_allocated_bytes"] = pd_.get("peak_allocated_bytes", entry.get("peak_allocated_bytes"))
                entry["peak_reserved_bytes"] = pd_.get("peak_reserved_bytes", entry.get("peak_reserved_bytes"))
        out[(s["name"], k)] = entry
    return out


def _by_interval(df: Any, cols: tuple[str, ...]) -> dict[int, dict[str, np.ndarray]]:
    """``df``'s columns split by its ``interval`` column, rows in their order within each (what
    ``groupby("interval")`` gives, without pandas' cost per group: ~170 stage intervals)."""
    if not len(df):
        return {}
    iv = df["interval"].to_numpy()
    order = np.argsort(iv, kind="stable")
    ivs = iv[order]
    starts = np.flatnonzero(np.r_[True, ivs[1:] != ivs[:-1]])
    ends = np.r_[starts[1:], len(ivs)]
    arrays = {c: df[c].to_numpy()[order] for c in cols}
    return {
        int(ivs[a]): {c: v[a:b] for c, v in arrays.items()} for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    }


def _descending(values: np.ndarray) -> np.ndarray:
    """The order of ``sort_values(ascending=False)`` on this column, ties included: pandas
    sorts the reversed column (quicksort) and reverses the result."""
    n = len(values)
    return (n - 1 - np.argsort(values[::-1], kind="quicksort"))[::-1]


def _snapshot_intervals(an: Analysis) -> list[tuple[str, Interval]]:
    truth = _stage_truth(an)
    occurrences: dict[str, int] = {}
    live_by_iv = _by_interval(an.stage_live, ("category", "bytes"))
    top_by_iv = _by_interval(an.stage_top, ("bytes", "site"))
    out = []
    for iv, r in enumerate(an.stages.itertuples(index=False)):
        name = str(r.name)
        k = occurrences.get(name, 0)
        occurrences[name] = k + 1
        t = truth.get((name, k))
        cats: dict[str, int] | Absent = ABSENT
        if iv in live_by_iv:
            g_ = live_by_iv[iv]
            at = _descending(g_["bytes"])
            cats = dict(zip(g_["category"][at].tolist(), g_["bytes"][at].tolist(), strict=True))
        top: list[SiteBytes] | Absent = ABSENT
        if iv in top_by_iv:
            top = [
                SiteBytes(bytes=b, site=st)
                for b, st in zip(top_by_iv[iv]["bytes"].tolist(), top_by_iv[iv]["site"].tolist(), strict=True)
            ]
        item = Interval(
            name=name,
            peak_allocated_bytes=int(r.peak_allocated_bytes),
            peak_reserved_bytes=int(r.peak_reserved_bytes),
            start_us=int(r.start_us),
            end_us=int(r.end_us),
            allocated_at_entry=int(r.allocated_at_entry),
            allocated_at_exit=int(r.allocated_at_exit),
            categories_at_peak=cats,
            top_allocations=top,
            duration_s=float(r.duration_s),
            allocator_peak_allocated_bytes=_int_or_none(t.get("peak_allocated_bytes")) if t is not None else ABSENT,
            allocator_peak_reserved_bytes=_int_or_none(t.get("peak_reserved_bytes")) if t is not None else ABSENT,
        )
        out.append((str(r.group), item))
    return out


def _snapshot_summary(an: Analysis) -> Summary:
    from snapviz.analyses.advice import AdviceFacts, advise
    from snapviz.analyses.end_state import end_state_doc
    from snapviz.analyses.not_recorded import empty_snapshot_note
    from snapviz.analyses.oom import oom_card, oom_fix, oom_lines, pick_advice
    from snapviz.analyses.training_advice import advise_training
    from snapviz.analyses.training_view import training_dict
    from snapviz.analyses.whatif import allocator_advice, oom_simulation, simulate_recorded

    rep = an.replay
    ev = rep.events
    pi = rep.peak_index
    run = an.run.run_json or {}
    att = an.attention_summary
    if not isinstance(att, Attention):  # analyze_run makes the frame-evidence section
        raise RuntimeError(f"a snapshot analysis with a trace's attention section: {type(att).__name__}")
    alloc_truth, run_fields = run_summary_fields(run, an.device)
    not_recorded = empty_snapshot_note(an.snapshot)

    advice: list[AnyAdvice] = [
        *advise(
            AdviceFacts.of(
                peak_allocated=int(rep.peak_allocated),
                peak_reserved=int(rep.peak_reserved),
                peak_stage=an.peak_stage,
                run_json=run,
                attention=att,
            ),
            an.categories,
        )
    ]
    oom_event = an.oom.event_index if an.oom is not None else None
    only = an.end_state is not None and an.end_state.only
    recorded_sim = None if only else simulate_recorded(an.run, rep, oom_event)
    # only where the simulator reproduced the run
    sim_advice = allocator_advice(an.run, recorded_sim, an.oom is not None and not an.oom.survived)
    if sim_advice is not None:
        advice.append(sim_advice)
    training: Training | Absent = ABSENT
    if an.training is not None:
        training = training_dict(an.training)
        advice.extend(advise_training(an.training.phases, run or None, an.training.framework))
        advice.sort(key=lambda a: -(a.saves_up_to_bytes or 0))
    oom: Oom | None = None
    if an.oom is not None:
        # what would have fit, where the simulator reproduced it; then what to try, then the sentences
        oom = replace(an.oom, simulation=oom_simulation(recorded_sim))
        oom = replace(oom, advice=pick_advice(oom, advice))
        headline, state, verdict_text = oom_lines(oom)[:3]
        oom = replace(
            oom, headline=headline, state=state, verdict_text=verdict_text, fix=oom_fix(oom), card=oom_card(oom)
        )

    sites = an.sites
    return Summary(
        schema=SUMMARY_SCHEMA,
        source=an.run.source,
        device=an.device,
        stage_source=an.labels.source,
        peak=Peak(
            allocated_bytes=int(rep.peak_allocated),
            reserved_bytes=int(rep.peak_reserved),
            requested_bytes=int(rep.peak_requested),
            # None: the peak is the memory that existed before the first recorded event
            event_index=int(pi) if pi >= 0 else None,
            time_us=int(ev["time_us"].iat[pi]) if pi >= 0 else None,
            # an empty snapshot has no peak, not one "before recording"
            stage=None if not_recorded else an.peak_stage,
            within_recorded_window=bool(rep.truncated),
            # present only when the allocator's rules could not be honoured (the reason is in warnings)
            approximate=True if rep.approximate else ABSENT,
        ),
        history=History(
            events=int(len(ev)),
            truncated=bool(rep.truncated),
            baseline_allocated_bytes=int(rep.baseline_allocated),
            baseline_reserved_bytes=int(rep.baseline_reserved),
            orphan_frees=int(rep.orphan_frees),
            end_state_matches=rep.end_state_matches,
            final_allocated_bytes=int(rep.final_allocated),
            final_reserved_bytes=int(rep.final_reserved),
        ),
        devices=[
            DevicePeak(
                device=int(d.device),
                peak_allocated_bytes=int(d.peak_allocated_bytes),
                peak_reserved_bytes=int(d.peak_reserved_bytes),
                events=int(d.events),
            )
            for d in an.device_peaks.itertuples(index=False)
        ],
        stages=_groups(_snapshot_intervals(an)),
        attention=att,
        categories=[
            CategoryBytes(category=str(c.category), bytes=int(c.bytes), count=int(c.count))
            for c in an.categories.itertuples(index=False)
        ],
        top_allocations=_top(
            (
                (t, str(t.stage), sites.stack_text(int(t.stack_id)).splitlines())
                for t in an.top_allocations.itertuples(index=False)
            ),
            snapshot=True,
        ),
        allocator_truth=_user_json("allocator_truth", alloc_truth),
        run=_user_json("run", run_fields),
        allocator_settings=_user_json("allocator_settings", an.snapshot.allocator_settings),
        advice=advice,
        warnings=list(an.warnings),
        oom=oom,
        not_recorded=not_recorded,
        end_state=end_state_doc(an.end_state, rep.baseline_allocated) if an.end_state is not None else None,
        training=training,
    )


# --------------------------------------------------------------------------- a profiler trace


def _trace_summary(an: Analysis) -> Summary:
    from snapviz.analyses.not_recorded import GPU_NOT_RECORDED
    from snapviz.analyses.stages import label_by_intervals
    from snapviz.analyses.trace_devices import DEVICE_CPU, device_kind, device_label

    tl = an.timeline
    st = an.stages
    rj = an.run.run_json or {}
    exact = an.capabilities.exact_totals
    has_reserved = an.capabilities.reserved_recorded
    dev = an.trace.device
    # The CPU profiler counts only what is allocated while it runs (what existed before is unknown).
    cpu = dev is not None and dev[0] == DEVICE_CPU

    def stage_names_at(times: np.ndarray) -> np.ndarray:
        return label_by_intervals(times, st, default=UNLABELLED) if len(st) else np.full(len(times), UNLABELLED)

    if len(tl):
        a = tl["allocated"].to_numpy()
        pi = an.peak_index
        t_peak = float(tl["time_us"].iat[pi])
        # Bytes-only traces: a lower bound (trace_devices), and no reserved figure at all.
        peak = Peak(
            allocated_bytes=int(a[pi]),
            reserved_bytes=int(tl["reserved"].max()) if has_reserved else None,
            requested_bytes=None,
            event_index=pi,
            time_us=int(t_peak),
            stage=an.peak_stage,
            within_recorded_window=False,
            exact=exact,
        )
        baseline = int(a[0] - tl["bytes"].iat[0])
    else:
        peak = Peak(
            allocated_bytes=0,
            reserved_bytes=None,
            requested_bytes=None,
            event_index=None,
            time_us=None,
            stage=UNLABELLED,
            within_recorded_window=False,
            exact=False,
        )
        baseline = 0

    rss = {s["name"]: s.get("rss_peak_bytes") for s in rj.get("stages") or []}
    intervals = []
    for r in st.itertuples(index=False):
        name = str(r.name)
        # None (JSON null) where the trace has no figure: no memory events, or no Total Reserved.
        rss_peak = _int_or_none(rss.get(name))
        item = Interval(
            name=name,
            peak_allocated_bytes=_int_or_none(r.peak_allocated_bytes),
            peak_reserved_bytes=_int_or_none(r.peak_reserved_bytes) if has_reserved else None,
            start_us=int(r.start_us),
            end_us=int(r.end_us),
            rss_peak_bytes=rss_peak if rss_peak is not None else ABSENT,
        )
        intervals.append((stage_group(name), item))
    stages = _groups(intervals)
    if peak.stage == UNLABELLED and len(tl):
        # The peak lies outside every range: the stage table says so rather than omit it.
        t = tl["time_us"].to_numpy()
        out = an.labels.labels == UNLABELLED
        a = tl["allocated"].to_numpy()
        stages.append(
            StageGroup(
                name=UNLABELLED,
                peak_allocated_bytes=int(a[out].max()),
                peak_reserved_bytes=int(tl["reserved"].to_numpy()[out].max()) if has_reserved else None,
                start_us=int(t[out].min()),
                end_us=int(t[out].max()),
                steps=[],
                intervals=[],
            )
        )
    before = (
        "memory allocated before profiling began (the weights, when loaded before it) is not known: the CPU "
        "profiler counts only allocations made while it runs"
        if cpu
        else f"{'' if exact else 'at least '}{baseline:,} bytes were already allocated at its first event"
    )
    # The allocator's figures are a CUDA device's: a CPU device is compared with none of them.
    alloc_truth, run_fields = run_summary_fields(rj, (-1 if dev[0] == DEVICE_CPU else int(dev[1])) if dev else None)
    top = an.top_allocations
    top_stages = stage_names_at(top["time_us"].to_numpy()).tolist() if len(top) else []
    return Summary(
        schema=SUMMARY_SCHEMA,
        source=an.run.source,
        kind="trace",
        device=device_label(*dev) if dev else None,
        device_kind=device_kind(dev[0]) if dev else None,
        stage_source=an.labels.source,
        peak=peak,
        history=History(
            events=int(len(tl)),
            truncated=False,
            baseline_allocated_bytes=None if cpu else baseline,
            baseline_exact=exact and not cpu,
        ),
        devices=[
            TraceDevice(
                device=device_label(t, i),
                kind=device_kind(t),
                events=int(n),
                exact=bool(x),
                peak_allocated_bytes=int(m),
            )
            for t, i, n, m, x in zip(
                *(an.trace.devices[c] for c in ("device_type", "device_id", "events", "max_allocated", "exact")),
                strict=True,
            )
        ],
        stages=stages,
        attention=an.attention_summary,
        top_allocations=_top(
            (
                (t, str(stage), [str(line) for line in t.stack])
                for t, stage in zip(top.itertuples(index=False), top_stages, strict=True)
            ),
            snapshot=False,
        ),
        top_allocations_note=(
            "allocations made before the trace began (e.g. weights loaded before profiling) are "
            f"not itemized: {before}; Python lines are the first line of each function (profiler stacks)"
        ),
        allocator_truth=_user_json("allocator_truth", alloc_truth),
        run=_user_json("run", run_fields),
        warnings=list(an.warnings),
        # the sentence every sink leads with when the file did not record GPU memory (not_recorded.py)
        not_recorded=next((w for w in an.warnings if w.startswith(GPU_NOT_RECORDED)), None),
    )
