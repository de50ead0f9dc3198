"""The ranks of a distributed job side by side (``snapviz ranks``): one row per rank from its
digest, and per iteration the imbalance, the outliers, the first rank to run out of memory and
the worst rank against the median rank stage by stage. Pure: digests in, tables and the
``snapviz.ranks/1`` document out, typed (:class:`~snapviz.analyses.fleet_document.RanksDocument`;
the renderers only draw that document)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.digest import RunDigest
from snapviz.analyses.document import ABSENT, Absent, to_json
from snapviz.analyses.fleet_document import (
    FirstOom,
    IterationView,
    MedianRank,
    Outlier,
    RankAllocator,
    RankOom,
    RankPeak,
    RankRef,
    RankRow,
    RanksDocument,
    StageDelta,
    TopSite,
)
from snapviz.units import fmt_bytes, fmt_delta
from snapviz.vocab import RANKS_SCHEMA, stage_group

# An outlier is far from the median in robust terms (median absolute deviation, scaled to a
# normal sigma) *and* by a share of the median that matters in practice: identical ranks give
# MAD 0, where any byte of difference would otherwise be "an outlier".
OUTLIER_MADS = 3.5
OUTLIER_MIN_SHARE = 0.05
MAD_SIGMA = 1.4826


@dataclass(frozen=True)
class FleetRow:
    """One input of a fleet as the engine returned it: the digest, or why there is none."""

    source: str
    label: str
    rank_from_path: int | None
    iteration: int | None
    digest: RunDigest | None
    reason: str | None = None  # why the input failed (digest is None)


@dataclass(frozen=True)
class RanksResult:
    """``table``: one row per input (failed ones included, with ``reason``); ``stage_peaks``:
    rank rows × stage groups, peak allocated bytes (NaN: the rank has no such stage);
    ``iterations``: one view per iteration (imbalance, outliers, first OOM, worst vs median)."""

    table: pd.DataFrame
    stage_peaks: pd.DataFrame
    iterations: list[IterationView]

    def document(self) -> RanksDocument:
        """The typed ``snapviz.ranks/1`` document (:func:`ranks_document`)."""
        return ranks_document(self)

    def summary(self) -> dict[str, Any]:
        """The ``snapviz.ranks/1`` document as JSON (what ``ranks --json`` writes)."""
        return to_json(ranks_document(self))


def _int(v: Any) -> int | None:
    """An integer from a file's own words (run.json, a trace): never a bool or a string."""
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) else None


def _opt(v: Any) -> int | None:
    """A table cell that holds an integer or a missing value (NaN/None) as an int or None."""
    return None if v is None or pd.isna(v) else int(v)


def resolve_rank(row: FleetRow) -> tuple[int | None, str, list[str]]:
    """The rank, where it came from (``run.json``, ``trace``, ``path``, ``none``) and any
    disagreement between them (the run's own word wins over its file name)."""
    info = row.digest.run_info if row.digest is not None else {}
    said = [(_int(info.get("rank")), "run.json"), (_int(info.get("trace_rank")), "trace"), (row.rank_from_path, "path")]
    known = [(r, w) for r, w in said if r is not None]
    if not known:
        return None, "none", []
    rank, where = known[0]
    notes = [f"rank {r} by its {w} but {rank} by its {where}" for r, w in known[1:] if r != rank]
    return rank, where, notes


def rank_table(rows: list[FleetRow]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-rank table and the rank × stage-group peaks, in (iteration, rank, input) order."""
    recs: list[dict[str, Any]] = []
    peaks: list[dict[str, int]] = []
    groups: list[str] = []
    for i, row in enumerate(rows):
        d = row.digest
        rank, rank_from, notes = resolve_rank(row)
        info = d.run_info if d is not None else {}
        top = d.sites.iloc[0] if d is not None and len(d.sites) else None
        recs.append(
            {
                "input": i,
                "label": row.label,
                "source": row.source,
                "iteration": row.iteration,
                "rank": rank,
                "rank_from": rank_from,
                "world_size": _int(info.get("world_size")) or _int(info.get("trace_world_size")),
                "ok": d is not None,
                "reason": row.reason,
                "peak_allocated_bytes": d.peak_allocated if d else None,
                "peak_reserved_bytes": d.peak_reserved if d else None,
                "peak_stage": d.peak_stage if d else None,
                "peak_time_us": d.peak_time_us if d else None,
                "oom_count": d.oom_count if d else None,
                "first_oom_us": d.first_oom_us if d else None,
                "top_site": str(top["site"]) if top is not None else None,
                "top_site_bytes": int(top["peak_live_bytes"]) if top is not None else None,
                "allocator_max_allocated": _int(info.get("allocator_max_memory_allocated")),
                "allocator_max_reserved": _int(info.get("allocator_max_memory_reserved")),
                "truncated": bool(d.truncated) if d else None,
                "notes": notes,
            }
        )
        p: dict[str, int] = {}
        if d is not None and len(d.stages):
            for name, v in zip(d.stages["name"], d.stages["peak_allocated_bytes"], strict=True):
                g = stage_group(name)
                if g not in groups:
                    groups.append(g)
                p[g] = max(p.get(g, 0), int(v))
        peaks.append(p)
    table = pd.DataFrame(recs)
    sp = pd.DataFrame(peaks, columns=groups, index=table.index if len(table) else None, dtype="float64")
    # -1 sorts a missing iteration/rank first, input order breaks ties
    order = np.lexsort(
        (
            table["input"].to_numpy(),
            table["rank"].fillna(-1).to_numpy(dtype=np.int64),
            table["iteration"].fillna(-1).to_numpy(dtype=np.int64),
        )
    )
    table = table.iloc[order].reset_index(drop=True)
    sp = sp.iloc[order].reset_index(drop=True)
    return table, sp


def _who(row: pd.Series) -> str:
    return f"rank {int(row['rank'])}" if pd.notna(row["rank"]) else str(row["label"])


def _iteration_view(t: pd.DataFrame, sp: pd.DataFrame) -> IterationView:
    """Imbalance, outliers, first OOM and worst-vs-median for the rows of one iteration."""
    ok = t[t["ok"]]
    it = t["iteration"].iat[0]
    empty = IterationView(
        iteration=None if pd.isna(it) else int(it),
        inputs=int(len(t)),
        ranks_ok=int(len(ok)),
        failed=int((~t["ok"]).sum()),
        max=None,
        median=None,
        imbalance=None,
        outliers=[],
        first_oom=None,
        oom_ranks=[],
        worst_vs_median=[],
        missing_ranks=[],
        verdict=[],
    )
    # the world size the runs state (run.json, distributedInfo): ranks below it with no input
    ws = t["world_size"].dropna()
    world_size: int | Absent = ABSENT
    missing: list[int] = []
    if len(ws):
        seen = {int(r) for r in t["rank"].dropna()}
        world_size = int(ws.max())
        missing = sorted(set(range(int(ws.max()))) - seen)
    if not len(ok):
        verdict = [f"none of the {len(t)} input(s) could be analysed (see the table)"]
        return replace(empty, missing_ranks=missing, verdict=verdict, world_size=world_size)
    peak = ok["peak_allocated_bytes"].to_numpy(dtype=np.int64)
    order = np.argsort(peak, kind="stable")
    worst = ok.iloc[int(order[-1])]
    med_row = ok.iloc[int(order[(len(order) - 1) // 2])]  # the lower median: a real rank
    med = float(np.median(peak))
    mad = float(np.median(np.abs(peak - med))) * MAD_SIGMA
    far = np.abs(peak - med) > max(OUTLIER_MADS * mad, OUTLIER_MIN_SHARE * med)
    outliers = []
    for j in np.flatnonzero(far):
        r = ok.iloc[int(j)]
        outliers.append(
            Outlier(
                who=_who(r),
                rank=_opt(r["rank"]),
                peak_allocated_bytes=int(r["peak_allocated_bytes"]),
                vs_median=round(float(r["peak_allocated_bytes"]) / med, 4) if med > 0 else None,
            )
        )
    oom = ok[ok["oom_count"] > 0]
    timed = oom[oom["first_oom_us"].notna()]
    first_oom = None
    if len(timed):
        first = timed.iloc[int(np.argmin(timed["first_oom_us"].to_numpy(dtype=np.int64)))]
        first_oom = FirstOom(
            who=_who(first),
            rank=_opt(first["rank"]),
            time_us=int(first["first_oom_us"]),
            note=f"{len(oom) - len(timed)} other OOM rank(s) have no clock: first among the timed"
            if len(timed) < len(oom)
            else ABSENT,
        )
    elif len(oom) == 1:
        first_oom = FirstOom(who=_who(oom.iloc[0]), rank=_opt(oom.iloc[0]["rank"]), time_us=None)
    # worst against median, stage by stage (groups in the worst rank's order)
    w_i, m_i = int(worst.name), int(med_row.name)
    worst_vs_median = []
    for g in sp.columns:
        wv, mv = sp.at[w_i, g], sp.at[m_i, g]
        if pd.isna(wv) and pd.isna(mv):
            continue
        worst_vs_median.append(
            StageDelta(
                stage=str(g),
                worst_bytes=None if pd.isna(wv) else int(wv),
                median_bytes=None if pd.isna(mv) else int(mv),
                delta_bytes=None if pd.isna(wv) or pd.isna(mv) else int(wv) - int(mv),
            )
        )
    view = replace(
        empty,
        max=RankRef(who=_who(worst), rank=_opt(worst["rank"]), peak_allocated_bytes=int(worst["peak_allocated_bytes"])),
        median=MedianRank(
            who=_who(med_row),
            rank=_opt(med_row["rank"]),
            peak_allocated_bytes=int(med_row["peak_allocated_bytes"]),
            median_bytes=int(round(med)),
        ),
        imbalance=round(float(peak.max()) / med, 4) if med > 0 else None,
        outliers=outliers,
        first_oom=first_oom,
        oom_ranks=[_who(r) for _, r in oom.iterrows()],
        worst_vs_median=worst_vs_median,
        missing_ranks=missing,
        world_size=world_size,
    )
    return replace(view, verdict=_verdict(view))


def _verdict(v: IterationView) -> list[str]:
    """The sentences every output leads with (terminal, Markdown, HTML, JSON say the same)."""
    out = []
    mx, md = v.max, v.median
    if v.imbalance is not None and mx is not None and md is not None:
        out.append(
            f"{mx.who} peaks highest at {fmt_bytes(mx.peak_allocated_bytes)}, "
            f"{v.imbalance:.3f}x the median {fmt_bytes(md.median_bytes)} ({v.ranks_ok} ranks)"
        )
    if v.first_oom is not None:
        f = v.first_oom
        when = "" if f.time_us is not None else " (the only OOM rank; no clock to order by)"
        out.append(f"{f.who} ran out of memory first{when}; {len(v.oom_ranks)} rank(s) hit OOM")
    elif v.oom_ranks:
        out.append(f"{len(v.oom_ranks)} ranks hit OOM; which was first is not determined (no clock)")
    else:
        out.append("no rank hit OOM")
    if v.outliers:
        out.append("outliers: " + ", ".join(f"{o.who} ({o.vs_median:.3f}x median)" for o in v.outliers))
    else:
        out.append("no outlier rank")
    deltas = [s for s in v.worst_vs_median if s.delta_bytes]
    if deltas and mx is not None and md is not None and mx.who != md.who:
        s = max(deltas, key=lambda s: abs(s.delta_bytes or 0))
        out.append(
            f"{mx.who} vs median {md.who}: the largest difference is in {s.stage} ({fmt_delta(s.delta_bytes or 0)})"
        )
    if v.failed:
        out.append(f"{v.failed} input(s) could not be analysed (see the table)")
    if v.missing_ranks:
        miss = v.missing_ranks
        shown = ", ".join(str(r) for r in miss[:10]) + (f" and {len(miss) - 10} more" if len(miss) > 10 else "")
        out.append(f"world size {v.world_size}: no input for rank(s) {shown}")
    return out


def analyse_ranks(rows: list[FleetRow]) -> RanksResult:
    """The per-rank table and every iteration's view."""
    table, sp = rank_table(rows)
    iterations = []
    if len(table):
        key = table["iteration"].fillna(-1).astype(np.int64)
        for _, idx in table.groupby(key, sort=True).groups.items():
            ix = list(idx)
            iterations.append(_iteration_view(table.loc[ix], sp))
    return RanksResult(table=table, stage_peaks=sp, iterations=iterations)


def _none(v: Any) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def ranks_verdict(iterations: list[IterationView]) -> list[str]:
    """Every iteration's sentences, each prefixed with its iteration when there are several."""
    if len(iterations) == 1:
        return list(iterations[0].verdict)
    out = []
    for v in iterations:
        head = "no iteration named" if v.iteration is None else f"iteration {v.iteration}"
        out += [f"{head}: {line}" for line in v.verdict]
    return out


def ranks_document(res: RanksResult) -> RanksDocument:
    """The ``snapviz.ranks/1`` document (``ranks --json``)."""
    t, sp = res.table, res.stage_peaks
    ranks = []
    for i, r in t.iterrows():
        ok = bool(r["ok"])
        ranks.append(
            RankRow(
                label=r["label"],
                source=r["source"],
                iteration=_opt(r["iteration"]),
                rank=int(r["rank"]) if pd.notna(r["rank"]) else None,
                rank_from=r["rank_from"],
                world_size=int(r["world_size"]) if pd.notna(r["world_size"]) else None,
                status="ok" if ok else "failed",
                reason=r["reason"],
                peak=RankPeak(
                    allocated_bytes=_none(r["peak_allocated_bytes"]) if ok else None,
                    reserved_bytes=_none(r["peak_reserved_bytes"]) if ok else None,
                    stage=r["peak_stage"] if ok else None,
                    time_us=int(r["peak_time_us"]) if ok and pd.notna(r["peak_time_us"]) else None,
                ),
                oom=RankOom(
                    count=int(r["oom_count"]) if ok else None,
                    first_time_us=int(r["first_oom_us"]) if ok and pd.notna(r["first_oom_us"]) else None,
                ),
                top_site=(
                    TopSite(site=r["top_site"], peak_live_bytes=int(r["top_site_bytes"]))
                    if ok and r["top_site"] is not None
                    else None
                ),
                allocator=(
                    RankAllocator(
                        max_memory_allocated=int(r["allocator_max_allocated"]),
                        max_memory_reserved=_none(r["allocator_max_reserved"])
                        if pd.notna(r["allocator_max_reserved"])
                        else None,
                    )
                    if pd.notna(r["allocator_max_allocated"])
                    else None
                ),
                truncated=bool(r["truncated"]) if ok else None,
                stage_peak_allocated_bytes=[None if pd.isna(v) else int(v) for v in sp.loc[i]],
                notes=list(r["notes"]),
            )
        )
    return RanksDocument(
        schema=RANKS_SCHEMA,
        inputs=int(len(t)),
        failed=int((~t["ok"]).sum()) if len(t) else 0,
        verdict=ranks_verdict(res.iterations),
        stages=[str(c) for c in sp.columns],
        iterations=res.iterations,
        ranks=ranks,
    )
