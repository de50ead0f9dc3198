"""Analyses over a loaded Chrome trace: memory timeline, stages, stage peaks, attention.

Pure functions from :class:`snapviz.load.trace.chrome_trace.ChromeTrace` to DataFrames.

Time axes (docs/design.md, "Format facts"): every ``*_us`` column of a ``ChromeTrace`` is
already absolute Unix µs (``ts + baseTimeNanoseconds / 1000``), the clock of a
snapshot's ``time_us``; see :func:`trace_ts_to_unix_us` and :func:`align_offset_us`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from snapviz.analyses.stages import (
    CANONICAL,
    OTHER_STAGES,
    label_by_intervals,
    range_labels,
    range_names_note,
    stage_group,
    stages_note,
    wrapper_range_phase,
)
from snapviz.analyses.trace_attention import attention_op_table
from snapviz.analyses.trace_devices import DEVICE_CPU
from snapviz.load.limits import ENV, Limits
from snapviz.load.trace.chrome_trace import ChromeTrace

__all__ = [
    "devices",
    "memory_timeline",
    "annotation_stages",
    "stage_peaks",
    "attention_ops",
    "analyze_trace",
    "TraceTables",
    "trace_ts_to_unix_us",
    "unix_us_to_trace_ts",
    "align_offset_us",
]


# --------------------------------------------------------------------------- time


# A time or an array of times: the conversions keep the kind they are given.
Times = TypeVar("Times", float, np.ndarray)


def trace_ts_to_unix_us(trace: ChromeTrace, ts: Times) -> Times:
    """Raw Chrome ``ts`` (µs relative to ``baseTimeNanoseconds``) -> Unix µs.

    The rule: ``unix_us = ts + baseTimeNanoseconds / 1000`` (``base_us`` is 0 for old
    traces whose ``ts`` is already absolute). The result is directly comparable with a
    snapshot's ``time_us`` (CLOCK_REALTIME, Unix µs) up to the µs–ms error of the
    allocator's clock conversion; the ``*_us`` columns of a ChromeTrace already are.
    Works on scalars and numpy arrays.
    """
    return ts + trace.base_us


def unix_us_to_trace_ts(trace: ChromeTrace, unix_us: Times) -> Times:
    """Inverse of :func:`trace_ts_to_unix_us`: Unix µs (e.g. snapshot ``time_us``) -> Chrome ``ts``."""
    return unix_us - trace.base_us


def align_offset_us(trace: ChromeTrace, snapshot_ranges: pd.DataFrame) -> float:
    """Residual clock offset (µs) to add to snapshot times to land on the trace's axis.

    Both clocks are Unix µs, so this is ~0; it corrects the few µs–ms of conversion
    error when a run has both files. ``snapshot_ranges`` has ``name`` and ``start_us``
    (e.g. paired ``external_annotations``); the k-th range of a name is matched with
    the k-th ``user_annotation`` of that name, and the median difference is returned.
    0.0 when no name matches.
    """
    ann = trace.annotations
    if not len(ann) or not len(snapshot_ranges):
        return 0.0

    def numbered(names: pd.Series, times: np.ndarray, col: str) -> pd.DataFrame:
        df = pd.DataFrame({"name": names.astype(str).to_numpy(), col: times}).sort_values(col, kind="stable")
        return df.assign(k=df.groupby("name").cumcount())

    a = numbered(ann["name"], ann["start_us"].to_numpy(), "t")
    b = numbered(snapshot_ranges["name"], snapshot_ranges["start_us"].to_numpy(dtype=np.float64), "s")
    both = a.merge(b, on=["name", "k"])
    return float(np.median(both["t"] - both["s"])) if len(both) else 0.0


# --------------------------------------------------------------------------- memory


def devices(trace: ChromeTrace) -> pd.DataFrame:
    """One row per (device_type, device_id) seen in ``[memory]`` events.

    Columns: ``device_type``, ``device_id``, ``events``, ``max_allocated``,
    ``max_reserved``, ``exact`` (every event carried the allocator's totals; False for
    old ``Bytes``-only traces, see :mod:`snapviz.analyses.trace_devices`); accelerators
    (any type but CPU) first, then by descending ``max_allocated``.
    """
    mem = trace.memory
    cols = ["device_type", "device_id", "events", "max_allocated", "max_reserved", "exact"]
    if not len(mem):
        return pd.DataFrame({c: pd.Series(dtype=bool if c == "exact" else np.int64) for c in cols})
    g = mem.groupby(["device_type", "device_id"], sort=False)
    out = pd.DataFrame(
        {
            "events": g.size(),
            "max_allocated": g["total_allocated"].max(),
            "max_reserved": g["total_reserved"].max(),
            "exact": g["has_totals"].all() if "has_totals" in mem else True,
        }
    ).reset_index()
    out["_cuda"] = out["device_type"] != DEVICE_CPU
    out = out.sort_values(["_cuda", "max_allocated", "device_id"], ascending=[False, False, True])
    return out.drop(columns="_cuda").reset_index(drop=True)[cols]


def pick_device(trace: ChromeTrace, device_type: int | None, device_id: int | None) -> tuple[int, int] | None:
    """Default device: the accelerator with the largest Total Allocated, else CPU."""
    devs = devices(trace)
    if device_type is not None:
        devs = devs[devs["device_type"] == device_type]
    if device_id is not None:
        devs = devs[devs["device_id"] == device_id]
    if not len(devs):
        return None if device_type is None or device_id is None else (int(device_type), int(device_id))
    return int(devs["device_type"].iloc[0]), int(devs["device_id"].iloc[0])


def _device_memory(trace: ChromeTrace, device_type: int | None, device_id: int | None) -> pd.DataFrame:
    dev = pick_device(trace, device_type, device_id)
    mem = trace.memory
    if dev is None:
        return mem.iloc[:0]
    keep = (mem["device_type"].to_numpy() == dev[0]) & (mem["device_id"].to_numpy() == dev[1])
    return mem[keep]


def memory_timeline(trace: ChromeTrace, device_type: int | None = None, device_id: int | None = None) -> pd.DataFrame:
    """Allocator totals after each ``[memory]`` event of one device, in time order.

    Columns ``time_us`` (Unix µs), ``allocated`` (``Total Allocated``), ``reserved``
    (``Total Reserved``; 0 on CPU), ``bytes`` (the event's signed size). The device
    defaults to the accelerator with the largest ``Total Allocated``, else the CPU.
    """
    mem = _device_memory(trace, device_type, device_id)
    return pd.DataFrame(
        {
            "time_us": mem["time_us"].to_numpy(),
            "allocated": mem["total_allocated"].to_numpy(),
            "reserved": mem["total_reserved"].to_numpy(),
            "bytes": mem["bytes"].to_numpy(),
        }
    )


# --------------------------------------------------------------------------- stages


def _containment_depth(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For intervals sorted by (start asc, end desc): how many earlier ones contain each.

    In that order an earlier interval starts no later, so it contains interval i exactly
    when its end is >= end_i (identical intervals: the earlier row is the outer one).
    Counting those is a Fenwick-tree pass over end ranks: O(n log n), so thousands of
    per-layer ``record_function`` ranges stay cheap, where all-pairs would not.
    """
    n = len(start)
    ranks = np.unique(end, return_inverse=True)[1].astype(np.int64) + 1  # 1-based, ties share a rank
    size = int(ranks.max()) if n else 0
    tree = [0] * (size + 1)
    depth = np.zeros(n, np.int64)
    for i, r in enumerate(ranks.tolist()):
        below, k = 0, r - 1  # earlier intervals ending strictly before end_i
        while k > 0:
            below += tree[k]
            k -= k & -k
        depth[i] = i - below
        k = r
        while k <= size:
            tree[k] += 1
            k += k & -k
    return depth


_PROFILER_STEP_NAME = r"^ProfilerStep#\d+$"


def _ranges(trace: ChromeTrace) -> pd.DataFrame:
    """``record_function`` ranges: the ``user_annotation`` events, and ``ProfilerStep#N``
    in whatever category its profiler put it (2021 traces: ``Operator``, read as ``cpu_op``;
    some releases: ``cpu_op``), once each."""
    ann = trace.annotations
    ops = trace.ops
    if not len(ops):
        return ann
    cats = pd.Index(ops["name"].cat.categories).astype(str)
    is_step = np.asarray(cats.str.match(_PROFILER_STEP_NAME), bool)
    steps = ops[is_step[ops["name"].cat.codes.to_numpy()]] if is_step.any() else ops.iloc[:0]
    if not len(steps):
        return ann
    cols = ["name", "start_us", "end_us", "tid"]
    both = pd.concat(
        [ann[cols].astype({"name": str}), steps[cols].astype({"name": str})], ignore_index=True
    ).drop_duplicates(["name", "start_us", "end_us"])
    both["name"] = both["name"].astype("category")
    return both.reset_index(drop=True)


def annotation_stages(trace: ChromeTrace) -> pd.DataFrame:
    """``record_function`` ranges that look like pipeline stages, outermost first.

    Keeps canonical names (``load``, ``text_encode``, ``denoise``/``denoise/<i>``,
    ``vae_decode``, ``other``) when any is present; otherwise every range, named by
    :func:`snapviz.analyses.stages.range_stage` (``ProfilerStep#3`` -> ``step/3``,
    ``Optimizer.step#…`` -> ``optimizer``, ``## Call CompiledFxGraph <key> ##`` ->
    ``compiled graph/<key>``, ``## forward ##`` -> ``forward``); FSDP's ranges as
    :func:`snapviz.analyses.stages.wrapper_range_phase` says (``FSDP::pre_forward`` -> ``forward``,
    ``FSDP::all_gather`` -> none: the enclosing stage's).
    Nesting is by time containment across threads, not same-tid nesting, because
    allocations of other threads (autograd, data loaders) belong to the stage that
    encloses them in time. Columns: ``name``, ``start_us``, ``end_us``, ``group``
    (the part before ``/``), ``depth`` (number of enclosing stages), ``tid``.
    Rows are ordered by start, then longer (outer) first.
    """
    ann = _ranges(trace)
    cols = ["name", "start_us", "end_us", "group", "depth", "tid"]
    if not len(ann):
        return pd.DataFrame(
            {
                "name": pd.Series(dtype=object),
                "start_us": pd.Series(dtype=np.float64),
                "end_us": pd.Series(dtype=np.float64),
                "group": pd.Series(dtype=object),
                "depth": pd.Series(dtype=np.int64),
                "tid": pd.Series(dtype=np.int64),
            }
        )
    # Decide per distinct name (categories), then broadcast through the codes.
    cats = pd.Index(ann["name"].cat.categories).astype(str)
    canonical = np.isin([stage_group(c) for c in cats], CANONICAL)
    codes = ann["name"].cat.codes.to_numpy()
    if canonical[codes].any():
        keep_name, names = canonical, cats.to_numpy().astype(object)
    else:
        # FSDP's own ranges are no user's stages: forward / backward where their name says so,
        # otherwise (all-gather, copy-out) dropped, so the phase that encloses them holds them
        wrapper = [wrapper_range_phase(c) for c in cats]
        keep_name = np.array([w != "" for w in wrapper], bool)
        grouped = range_labels([c for c, w in zip(cats, wrapper, strict=True) if w is None])
        names = np.array([grouped[c] if w is None else w for c, w in zip(cats, wrapper, strict=True)], dtype=object)
    groups = np.array([stage_group(n) for n in names], dtype=object)
    rows = ann[keep_name[codes]]
    out = pd.DataFrame(
        {
            "name": names[rows["name"].cat.codes.to_numpy()],
            "start_us": rows["start_us"].to_numpy(),
            "end_us": rows["end_us"].to_numpy(),
            "group": groups[rows["name"].cat.codes.to_numpy()],
            "tid": rows["tid"].to_numpy(),
        }
    )
    out = out.sort_values(["start_us", "end_us"], ascending=[True, False], kind="stable").reset_index(drop=True)
    out, notes = _bound_ranges(out)
    out["depth"] = _containment_depth(out["start_us"].to_numpy(), out["end_us"].to_numpy())
    out = out[cols]
    if notes:
        out.attrs["notes"] = notes  # analyze_trace puts them in the report's warnings
    return out


def _bound_ranges(out: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The trace's stage ranges (sorted by start) within the snapshot's stage bounds
    (:func:`snapviz.analyses.stages.bound_labels`): names after the first
    ``limits.stages`` distinct ones are :data:`OTHER_STAGES`, and past
    ``limits.stage_intervals`` ranges the rest become one ``other stages`` range from the
    first of them to the last end; the warnings say so (none: nothing grouped)."""
    lim = Limits.from_env()
    notes = [range_names_note()] if bool((out["name"] == OTHER_STAGES).any()) else []  # range_labels' cap
    if len(out) <= min(lim.stages, lim.stage_intervals):
        return out, notes
    codes, distinct = pd.factorize(out["name"])
    keep = max(lim.stages, 1)
    if len(distinct) > keep:
        out = out.assign(
            name=np.where(codes < keep, out["name"].to_numpy(), OTHER_STAGES),
            group=np.where(codes < keep, out["group"].to_numpy(), OTHER_STAGES),
        )
        notes.append(stages_note(len(distinct), keep))
    most = max(lim.stage_intervals, 1)
    if len(out) > most:
        rest = out.iloc[most - 1 :]
        other = pd.DataFrame(
            {
                "name": [OTHER_STAGES],
                "start_us": [rest["start_us"].iloc[0]],
                "end_us": [rest["end_us"].max()],
                "group": [OTHER_STAGES],
                "tid": [rest["tid"].iloc[0]],
            }
        )
        notes.append(
            f"{len(out):,} stage ranges in the trace: the {len(rest):,} from {float(rest['start_us'].iloc[0]):,.0f} us "
            f"on are one '{OTHER_STAGES}' range ({ENV['stage_intervals']}={most:,}; docs/security.md)"
        )
        out = pd.concat([out.iloc[: most - 1], other], ignore_index=True)
    return out, notes


def stage_peaks(
    trace: ChromeTrace, stages: pd.DataFrame, device_type: int | None = None, device_id: int | None = None
) -> pd.DataFrame:
    """Allocator peaks of one device inside each stage interval.

    For each row of ``stages`` (``name``, ``start_us``, ``end_us``):

    * ``events``: ``[memory]`` events inside, bounds included, any thread;
    * ``entry_allocated_bytes``: Total Allocated just before ``start_us`` (after the
      last earlier event; before the first event, its total minus its bytes);
    * ``exit_allocated_bytes``: after the last event at or before ``end_us``;
    * ``peak_allocated_bytes``: max(entry, every event inside) — what
      ``max_memory_allocated()`` reports after ``reset_peak_memory_stats()`` at the
      stage start (the run.json convention) — and ``peak_time_us`` (the stage start
      when nothing inside beats the entry level);
    * ``peak_reserved_bytes``: the same for Total Reserved, float64, NaN when unknown
      (no event inside and none before: reserved before an event is not recorded).

    The device is chosen as in :func:`memory_timeline`. With no memory event on it,
    every figure is NaN.
    """
    tl = memory_timeline(trace, device_type, device_id)
    n_st = len(stages)
    starts = stages["start_us"].to_numpy(dtype=np.float64) if n_st else np.zeros(0)
    ends = stages["end_us"].to_numpy(dtype=np.float64) if n_st else np.zeros(0)
    out = pd.DataFrame(
        {"name": stages["name"].to_numpy() if n_st else np.zeros(0, object), "start_us": starts, "end_us": ends}
    )
    t = tl["time_us"].to_numpy()
    alloc = tl["allocated"].to_numpy()
    res = tl["reserved"].to_numpy()
    if not len(t):
        out["events"] = np.zeros(n_st, np.int64)
        for c in (
            "entry_allocated_bytes",
            "exit_allocated_bytes",
            "peak_allocated_bytes",
            "peak_time_us",
            "peak_reserved_bytes",
        ):
            out[c] = np.full(n_st, np.nan)
        return out
    lo = np.searchsorted(t, starts, "left")  # first event inside
    hi = np.searchsorted(t, ends, "right")  # one past the last event inside
    has = hi > lo
    before_first = alloc[0] - tl["bytes"].iloc[0]  # Total Allocated is the value *after* an event
    entry = np.where(lo > 0, alloc[np.maximum(lo - 1, 0)], before_first)
    exit_ = np.where(hi > 0, alloc[np.maximum(hi - 1, 0)], before_first)
    # Range max over [lo, hi) for all stages at once: reduceat on (lo, hi) index pairs,
    # with a sentinel so hi == len(t) is a valid index; empty ranges are masked below.
    idx = np.stack([lo, hi], axis=1).ravel()
    a_max = np.maximum.reduceat(np.append(alloc, alloc[-1]), idx)[::2]
    r_max = np.maximum.reduceat(np.append(res, res[-1]), idx)[::2]
    arg = np.zeros(n_st, np.int64)
    for i in np.flatnonzero(has):  # argmax per stage; stages are few
        arg[i] = lo[i] + int(np.argmax(alloc[lo[i] : hi[i]]))
    inside_wins = has & (a_max > entry)
    res_entry = np.where(lo > 0, res[np.maximum(lo - 1, 0)].astype(np.float64), np.nan)
    res_inside = np.where(has, r_max.astype(np.float64), np.nan)
    out["events"] = (hi - lo).astype(np.int64)
    out["entry_allocated_bytes"] = entry.astype(np.int64)
    out["exit_allocated_bytes"] = exit_.astype(np.int64)
    out["peak_allocated_bytes"] = np.where(inside_wins, a_max, entry).astype(np.int64)
    out["peak_time_us"] = np.where(inside_wins, t[arg], starts)
    out["peak_reserved_bytes"] = np.fmax(res_entry, res_inside)  # fmax: NaN only if both unknown
    return out


@dataclass(frozen=True)
class TraceTables:
    """A trace's own tables for one device, as DataFrames (see the functions named): the
    evidence of a trace analysis (:class:`snapviz.analyses.analysis.TraceEvidence`)."""

    device: tuple[int, int] | None  # (device_type, device_id) of timeline and stage peaks
    devices: pd.DataFrame  # devices()
    timeline: pd.DataFrame  # memory_timeline()
    stages: pd.DataFrame  # annotation_stages() joined with stage_peaks()
    attention_ops: pd.DataFrame  # attention_ops()
    notes: tuple[str, ...] = ()  # what the analyses grouped (the stage bounds), for the warnings


def analyze_trace(trace: ChromeTrace, device_type: int | None = None, device_id: int | None = None) -> TraceTables:
    """Run every trace analysis for one device (default as in :func:`memory_timeline`)."""
    stages = annotation_stages(trace)
    peaks = stage_peaks(trace, stages, device_type, device_id)
    return TraceTables(
        device=pick_device(trace, device_type, device_id),
        devices=devices(trace),
        timeline=memory_timeline(trace, device_type, device_id),
        stages=pd.concat([stages, peaks.drop(columns=["name", "start_us", "end_us"])], axis=1),
        attention_ops=attention_ops(trace),
        notes=tuple(stages.attrs.get("notes", ())),
    )


# --------------------------------------------------------------------------- attention


def attention_ops(trace: ChromeTrace) -> pd.DataFrame:
    """Attention-related ops (:func:`snapviz.analyses.trace_attention.attention_op_table`)
    with ``stage``: the innermost enclosing stage of :func:`annotation_stages` (``""`` if none)."""
    ops = attention_op_table(trace)
    ops["stage"] = (
        label_by_intervals(ops["start_us"].to_numpy(dtype=np.float64), annotation_stages(trace), default="")
        if len(ops)
        else []
    )
    return ops
