"""One run reduced to what a comparison needs (a digest): stage rows, a stage-normalised
timeline, allocation sites and categories. Digests are small, so ``compare`` builds them in
worker processes and only these come back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.document import Interval, StageGroup, Summary, to_json
from snapviz.analyses.replay import live_at
from snapviz.category_vocab import canonical_category
from snapviz.load import Run
from snapviz.model import A_ALLOC, A_OOM
from snapviz.vocab import BEFORE_RECORDING, stage_group

SNAPSHOT_MEMORY = "CUDA GPU memory"  # a snapshot is the CUDA caching allocator's (ROCm's too, through it)


@dataclass
class RunDigest:
    """What a comparison needs from one analysed run (small; the Analysis can be dropped)."""

    label: str
    source: str
    peak_allocated: int
    peak_reserved: int
    peak_stage: str
    stages: pd.DataFrame  # name (label), group, peak_allocated_bytes, peak_reserved_bytes, order
    timeline: pd.DataFrame  # name, pos (0..1 within the label), allocated, reserved
    categories: pd.DataFrame  # category, bytes
    attention: dict[str, Any]
    sites: pd.DataFrame  # site, allocs, total_bytes, peak_live_bytes
    stage_source: str = "none"
    events: int = 0
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)
    memory_kind: str = SNAPSHOT_MEMORY  # what was measured: runs of different kinds are not compared
    # For fleets of runs (``ranks``, ``history``): when the peak and the first OOM happened
    # (Unix µs, None when the input has no clock or no OOM), how many OOM entries, and the run's
    # own words about itself (run.json's scalar keys, the trace's ``distributedInfo``).
    peak_time_us: int | None = None
    start_us: int | None = None
    oom_count: int = 0
    first_oom_us: int | None = None
    run_info: dict[str, Any] = field(default_factory=dict)


def comparable(a: RunDigest, b: RunDigest) -> bool:
    """True when two runs measure the same kind of memory (any GPU's, or the same other kind):
    a CUDA snapshot and a CPU-only trace are not two measures of one thing."""

    def family(kind: str) -> str:
        return "GPU memory" if "GPU memory" in kind else kind

    return family(a.memory_kind) == family(b.memory_kind)


def _stage_rows(stages: pd.DataFrame) -> pd.DataFrame:
    """Stage intervals merged per label (a label may recur), in order of first appearance."""
    cols = ["name", "group", "peak_allocated_bytes", "peak_reserved_bytes", "order"]
    if not len(stages):
        return pd.DataFrame(columns=cols)
    g = (
        stages.groupby("name", sort=False)
        .agg(
            peak_allocated_bytes=("peak_allocated_bytes", "max"),
            peak_reserved_bytes=("peak_reserved_bytes", "max"),
            order=("start_row", "min"),
        )
        .reset_index()
    )
    g["group"] = [stage_group(str(n)) for n in g["name"]]
    g["name"] = g["name"].astype(str)
    return g.sort_values("order", kind="stable")[cols].reset_index(drop=True)


def stage_normalised_timeline(
    labels: np.ndarray, allocated: np.ndarray, reserved: np.ndarray, points_per_label: int = 200
) -> pd.DataFrame:
    """Each event's position within its own label (rank / count, in 0..1), decimated.

    Per label, ``points_per_label`` buckets keep the rows of the bucket's min and max
    allocated and max reserved, so the peak of every stage survives decimation.
    """
    cols = ["name", "pos", "allocated", "reserved"]
    n = len(labels)
    if n == 0:
        return pd.DataFrame(columns=cols)
    codes, uniques = pd.factorize(pd.Series(labels, dtype=object), sort=False)
    counts = np.bincount(codes)
    # Rank of each event among the events of its label (stable: file order).
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, counts)
    pos = rank / counts[codes]
    buckets = np.minimum((pos * points_per_label).astype(np.int64), points_per_label - 1)
    key = codes.astype(np.int64) * points_per_label + buckets
    if n > 3 * len(uniques) * points_per_label:
        keep = np.zeros(n, bool)
        o = order if len(uniques) == 1 else np.argsort(key, kind="stable")
        ks = key[o]
        first = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        sizes = np.diff(np.r_[first, n])
        for series, reduce in ((allocated, np.maximum), (allocated, np.minimum), (reserved, np.maximum)):
            # Row of the first extreme of ``series`` in each bucket.
            sv = series[o]
            hit = np.flatnonzero(sv == np.repeat(reduce.reduceat(sv, first), sizes))
            bucket = np.searchsorted(first, hit, side="right") - 1
            lead = np.r_[True, bucket[1:] != bucket[:-1]]
            keep[o[hit[lead]]] = True
        # First and last event of each label keep the stage edges exact.
        keep[order[starts]] = True
        keep[order[starts + counts - 1]] = True
        rows = np.flatnonzero(keep)
    else:
        rows = np.arange(n)
    rows = rows[np.lexsort((rank[rows], codes[rows]))]
    return pd.DataFrame(
        {
            "name": np.asarray(uniques, dtype=object)[codes[rows]].astype(str),
            "pos": pos[rows],
            "allocated": allocated[rows],
            "reserved": reserved[rows],
        }
    )


def site_table(an: Analysis) -> pd.DataFrame:
    """Per allocation site (``SiteNamer.site``): allocations, bytes allocated in total, bytes live at the peak."""
    rep = an.replay
    ev = rep.events
    cols = ["site", "allocs", "total_bytes", "peak_live_bytes"]
    if not len(ev):
        return pd.DataFrame(columns=cols)
    is_alloc = ev["action"].to_numpy() == A_ALLOC
    stacks = ev["stack_id"].to_numpy()[is_alloc]
    sizes = ev["block_size"].to_numpy()[is_alloc].astype(np.int64)
    live = live_at(rep, rep.peak_index)
    live_stacks = live["stack_id"].to_numpy()
    live_sizes = live["block_size"].to_numpy().astype(np.int64)
    uniq, inv = np.unique(np.concatenate([stacks, live_stacks]), return_inverse=True)
    k = len(stacks)
    total = np.zeros(len(uniq), np.int64)
    np.add.at(total, inv[:k], sizes)
    count = np.bincount(inv[:k], minlength=len(uniq))
    at_peak = np.zeros(len(uniq), np.int64)
    np.add.at(at_peak, inv[k:], live_sizes)
    names = [an.sites.site(int(s)) for s in uniq]
    df = pd.DataFrame({"site": names, "allocs": count, "total_bytes": total, "peak_live_bytes": at_peak})
    df = df.groupby("site", sort=False, as_index=False).sum()
    if rep.baseline_allocated:
        df = pd.concat(
            [
                df,
                pd.DataFrame(
                    [
                        {
                            "site": BEFORE_RECORDING,
                            "allocs": 0,
                            "total_bytes": int(rep.baseline_allocated),
                            "peak_live_bytes": int(rep.baseline_allocated),
                        }
                    ]
                ),
            ],  # live at every instant
            ignore_index=True,
        )
    return df.sort_values(["peak_live_bytes", "total_bytes"], ascending=False, kind="stable").reset_index(drop=True)[
        cols
    ]


def run_info(run: Run) -> dict[str, Any]:
    """What a run says about itself, for ordering and grouping runs: run.json's scalar
    top-level keys, its ``distributed`` object's (``rank``, ``world_size``), and the profiler
    trace's ``distributedInfo`` (``rank``, ``world_size``, ``backend``) under ``trace_``."""
    info: dict[str, Any] = {}
    rj = run.run_json or {}
    for k, v in rj.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            info[str(k)] = v
    truth = rj.get("allocator")
    if isinstance(truth, dict):
        for k in ("max_memory_allocated", "max_memory_reserved"):
            if isinstance(truth.get(k), int):
                info[f"allocator_{k}"] = truth[k]
    dist = rj.get("distributed")
    if isinstance(dist, dict):
        for k in ("rank", "world_size", "local_rank", "backend"):
            if k in dist and isinstance(dist[k], (str, int)):
                info.setdefault(k, dist[k])
    meta = run.trace.meta if run.trace is not None else {}
    di = meta.get("distributedInfo")
    if isinstance(di, dict):
        for k in ("rank", "world_size", "backend"):
            if isinstance(di.get(k), (str, int)):
                info[f"trace_{k}"] = di[k]
    return info


def digest_run(an: Analysis, label: str | None = None, points_per_label: int = 200) -> RunDigest:
    """Reduce an :class:`~snapviz.analyses.analysis.Analysis` to what a comparison needs."""
    rep = an.replay
    ev = rep.events
    allocated = ev["allocated"].to_numpy() if len(ev) else np.empty(0, np.int64)
    reserved = ev["reserved"].to_numpy() if len(ev) else np.empty(0, np.int64)
    times = ev["time_us"].to_numpy() if len(ev) else np.empty(0, np.int64)
    ooms = np.flatnonzero(ev["action"].to_numpy() == A_OOM) if len(ev) else np.empty(0, np.int64)
    oom_times = times[ooms]
    oom_times = oom_times[oom_times >= 0]
    pi = int(rep.peak_index)
    cats = (
        an.categories[["category", "bytes"]].copy()
        if len(an.categories)
        else pd.DataFrame(columns=["category", "bytes"])
    )
    return RunDigest(
        label=label or an.run.label,
        source=an.run.source,
        peak_allocated=int(rep.peak_allocated),
        peak_reserved=int(rep.peak_reserved),
        peak_stage=str(an.peak_stage),
        stages=_stage_rows(an.stages),
        timeline=stage_normalised_timeline(an.labels.labels, allocated, reserved, points_per_label),
        categories=cats,
        attention=to_json(an.attention_summary),  # the digest is a JSON document
        sites=site_table(an),
        stage_source=an.labels.source,
        events=int(len(ev)),
        truncated=bool(rep.truncated),
        warnings=list(an.warnings),
        peak_time_us=int(times[pi]) if 0 <= pi < len(times) and times[pi] >= 0 else None,
        start_us=int(times[times >= 0].min()) if (times >= 0).any() else None,
        oom_count=int(len(ooms)),
        first_oom_us=int(oom_times.min()) if len(oom_times) else None,
        run_info=run_info(an.run),
    )


def _doc_categories(doc: Summary) -> pd.DataFrame:
    """A document's categories at the peak, old names (``weights``, ``activations``: documents
    written before the one vocabulary) said as the vocabulary says them now, so they compare."""
    listed = doc.categories if isinstance(doc.categories, list) else []
    cats = pd.DataFrame([(c.category, c.bytes) for c in listed], columns=["category", "bytes"])
    if len(cats):
        cats["category"] = [canonical_category(str(c)) for c in cats["category"]]
        cats = cats.groupby("category", sort=False, as_index=False)["bytes"].sum()
    return cats


def digest_of_peaks(
    label: str,
    source: str,
    intervals: Sequence[tuple[str, int, int]],
    *,
    peak_allocated: int,
    peak_reserved: int,
    peak_stage: str,
    stage_source: str = "none",
    events: int = 0,
    truncated: bool = False,
    warnings: Sequence[str] = (),
    categories: pd.DataFrame | None = None,
    attention: dict[str, Any] | None = None,
    memory_kind: str = SNAPSHOT_MEMORY,
) -> RunDigest:
    """A digest from stage peaks alone, no timeline (what an earlier ``analyze --json`` or a
    run.json says): ``intervals`` are (stage label, peak allocated, peak reserved), a label
    seen twice keeping its highest peaks."""
    st = pd.DataFrame(
        [(n, stage_group(n), a, r, i) for i, (n, a, r) in enumerate(intervals)],
        columns=["name", "group", "peak_allocated_bytes", "peak_reserved_bytes", "order"],
    )
    if len(st):
        st = (
            st.groupby("name", sort=False)
            .agg(
                group=("group", "first"),
                peak_allocated_bytes=("peak_allocated_bytes", "max"),
                peak_reserved_bytes=("peak_reserved_bytes", "max"),
                order=("order", "min"),
            )
            .reset_index()
        )
    return RunDigest(
        label=label,
        source=source,
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        peak_stage=peak_stage,
        stages=st,
        timeline=pd.DataFrame(columns=["name", "pos", "allocated", "reserved"]),
        categories=categories if categories is not None else pd.DataFrame(columns=["category", "bytes"]),
        attention=attention if attention is not None else {},
        sites=pd.DataFrame(columns=["site", "allocs", "total_bytes", "peak_live_bytes"]),
        stage_source=stage_source,
        events=events,
        truncated=truncated,
        warnings=list(warnings),
        memory_kind=memory_kind,
    )


def digest_summary(doc: Summary, label: str) -> RunDigest:
    """A digest from a ``snapviz.summary/1`` document (an earlier ``analyze --json``, or a
    trace-only run): stages and peaks only."""
    intervals = []
    for s in doc.stages:
        ivs: Sequence[Interval | StageGroup] = s.intervals if s.intervals else [s]  # older documents: none
        # null in a trace without memory events: nothing measured there
        intervals += [(iv.name, iv.peak_allocated_bytes or 0, iv.peak_reserved_bytes or 0) for iv in ivs]
    p = doc.peak
    device_kind = doc.device_kind if isinstance(doc.device_kind, str) else None
    return digest_of_peaks(
        label,
        doc.source,
        intervals,
        peak_allocated=p.allocated_bytes,
        peak_reserved=p.reserved_bytes or 0,
        peak_stage=str(p.stage),
        stage_source=doc.stage_source,
        events=doc.history.events,
        truncated=doc.history.truncated,
        warnings=doc.warnings,
        categories=_doc_categories(doc),
        attention=to_json(doc.attention),  # the comparison's attention row reads its JSON form
        memory_kind=(device_kind or "no memory events") if doc.is_trace else SNAPSHOT_MEMORY,
    )


def digest_trace(an: Analysis, label: str, points_per_label: int = 200) -> RunDigest:
    """A trace-only run's digest: :func:`digest_summary` plus its memory timeline, each memory
    event placed in the stage interval it falls in (as the trace summary's stage peaks are)."""
    from snapviz.analyses.pipeline import document_of

    doc = document_of(an)
    d = digest_summary(doc, label)
    d.peak_time_us = doc.peak.time_us
    d.run_info = run_info(an.run)
    tl = an.timeline
    if not len(tl) or not len(an.stages):
        return d
    timeline = stage_normalised_timeline(
        np.asarray(an.labels.labels, dtype=object),
        tl["allocated"].to_numpy(np.int64),
        tl["reserved"].to_numpy(np.int64),
        points_per_label,
    )
    # events outside every stage interval have no slot on the comparison's stage-aligned axis
    return replace(d, timeline=timeline[timeline["name"].isin(set(d.stages["name"]))].reset_index(drop=True))


# ---------------------------------------------------------------- digests -> comparison
