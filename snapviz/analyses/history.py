"""Many runs of one pipeline over time (``snapviz history``): the runs' digests ordered by
when they ran or by a run.json key (``commit``, ``date``…), each stage's trend, and the run
where a stage's peak jumped. Pure: digests in, tables and ``snapviz.history/1`` out, typed
(:class:`~snapviz.analyses.fleet_document.HistoryDocument`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.document import to_json
from snapviz.analyses.fleet_document import HistoryDocument, HistoryPeak, HistoryRun, Jump, StageTrend
from snapviz.analyses.ranks import FleetRow
from snapviz.units import fmt_bytes, fmt_delta
from snapviz.vocab import HISTORY_SCHEMA, stage_group

WHOLE_RUN = "(whole run)"  # the stage row of the run's own peak


@dataclass(frozen=True)
class HistoryResult:
    """``runs``: one row per input in history order (failed and unordered ones last);
    ``stage_peaks``: runs × (whole run, stage groups), peak allocated bytes (NaN: absent);
    ``stages``: per stage the first, last, lowest, highest and the largest jump."""

    runs: pd.DataFrame
    stage_peaks: pd.DataFrame
    stages: list[StageTrend]
    order_by: str
    jump_pct: float
    notes: list[str]

    def document(self) -> HistoryDocument:
        """The typed ``snapviz.history/1`` document (:func:`history_document`)."""
        return history_document(self)

    def summary(self) -> dict[str, Any]:
        """The ``snapviz.history/1`` document as JSON (what ``history --json`` writes)."""
        return to_json(history_document(self))


def _key(row: FleetRow, order_by: str) -> Any:
    d = row.digest
    if d is None:
        return None
    if order_by == "time":
        return d.start_us
    v = d.run_info.get(order_by)
    return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None


def order_runs(rows: list[FleetRow], order_by: str) -> tuple[list[int], list[str]]:
    """Input indices in history order and what could not be ordered. ``input``: as given;
    ``time``: the first recorded event's clock; any other word: that run.json key (numbers
    numerically, else as text: ISO dates and commit counts sort right, hashes do not)."""
    n = len(rows)
    if order_by == "input":
        return list(range(n)), []
    keys = [_key(r, order_by) for r in rows]
    have = [i for i in range(n) if keys[i] is not None]
    lack = [i for i in range(n) if keys[i] is None]
    numeric = all(isinstance(keys[i], (int, float)) for i in have)
    have.sort(key=lambda i: (keys[i] if numeric else str(keys[i]), i))
    notes = []
    missing = [i for i in lack if rows[i].digest is not None]
    if missing:
        what = "no clock" if order_by == "time" else f"no run.json key {order_by!r}"
        notes.append(f"{len(missing)} run(s) have {what}: placed last, in input order")
    return have + lack, notes


def analyse_history(rows: list[FleetRow], order_by: str = "time", jump_pct: float = 5.0) -> HistoryResult:
    """The history of ``rows`` ordered by ``order_by``; a stage's jump is the largest rise
    from one analysed run to the next, reported when above ``jump_pct`` % of the earlier peak."""
    order, notes = order_runs(rows, order_by)
    recs: list[dict[str, Any]] = []
    peaks: list[dict[str, float]] = []
    groups: list[str] = [WHOLE_RUN]
    for pos, i in enumerate(order):
        r = rows[i]
        d = r.digest
        recs.append(
            {
                "position": pos,
                "label": r.label,
                "source": r.source,
                "key": _key(r, order_by) if order_by != "input" else i,
                "ok": d is not None,
                "reason": r.reason,
                "peak_allocated_bytes": d.peak_allocated if d else None,
                "peak_reserved_bytes": d.peak_reserved if d else None,
                "peak_stage": d.peak_stage if d else None,
                "oom_count": d.oom_count if d else None,
            }
        )
        p: dict[str, float] = {}
        if d is not None:
            p[WHOLE_RUN] = float(d.peak_allocated)
            for name, v in zip(d.stages["name"], d.stages["peak_allocated_bytes"], strict=True):
                g = stage_group(name)
                if g not in groups:
                    groups.append(g)
                p[g] = max(p.get(g, 0.0), float(v))
        peaks.append(p)
    runs = pd.DataFrame(recs)
    if len(runs):  # keys as given (a µs clock or a commit count stays an int, not a float)
        runs["key"] = pd.Series([r["key"] for r in recs], dtype=object)
    sp = pd.DataFrame(peaks, columns=groups, dtype="float64")
    stages = [_trend(g, sp[g].to_numpy(), runs, jump_pct) for g in groups] if len(runs) else []
    return HistoryResult(runs, sp, [s for s in stages if s is not None], order_by, jump_pct, notes)


def _trend(stage: str, v: np.ndarray, runs: pd.DataFrame, jump_pct: float) -> StageTrend | None:
    have = np.flatnonzero(~np.isnan(v))
    if not len(have):
        return None
    vals = v[have].astype(np.int64)
    lab = runs["label"].to_numpy()
    jump = None
    if len(vals) > 1:
        rise = np.diff(vals)
        j = int(np.argmax(rise))
        prev = int(vals[j])
        if rise[j] > 0 and rise[j] > jump_pct / 100.0 * prev:
            jump = Jump(
                run=str(lab[have[j + 1]]),
                after=str(lab[have[j]]),
                from_bytes=prev,
                to_bytes=int(vals[j + 1]),
                delta_bytes=int(rise[j]),
                percent=round(100.0 * float(rise[j]) / prev, 2) if prev else None,
            )
    return StageTrend(
        stage=stage,
        runs=int(len(have)),
        first_bytes=int(vals[0]),
        last_bytes=int(vals[-1]),
        min_bytes=int(vals.min()),
        min_run=str(lab[have[int(np.argmin(vals))]]),
        max_bytes=int(vals.max()),
        max_run=str(lab[have[int(np.argmax(vals))]]),
        change_bytes=int(vals[-1] - vals[0]),
        jump=jump,
    )


def history_verdict(res: HistoryResult) -> list[str]:
    """The sentences every output leads with."""
    ok = res.runs[res.runs["ok"]] if len(res.runs) else res.runs
    if not len(ok):
        return ["no run could be analysed"]
    out = []
    whole = next((s for s in res.stages if s.stage == WHOLE_RUN), None)
    if whole is not None:
        out.append(
            f"{whole.runs} runs ordered by {res.order_by}: peak allocated {fmt_bytes(whole.first_bytes)} "
            f"→ {fmt_bytes(whole.last_bytes)} ({fmt_delta(whole.change_bytes)}); "
            f"lowest {fmt_bytes(whole.min_bytes)} in {whole.min_run}"
        )
    jumps = [(s, s.jump) for s in res.stages if s.jump is not None]
    for s, j in sorted(jumps, key=lambda sj: -sj[1].delta_bytes)[:5]:
        out.append(f"{s.stage} jumped {fmt_delta(j.delta_bytes)} (+{j.percent:.1f}%) in {j.run} (after {j.after})")
    if not jumps:
        out.append(f"no stage's peak rose more than {res.jump_pct:g}% from one run to the next")
    failed = int((~res.runs["ok"]).sum())
    if failed:
        out.append(f"{failed} input(s) could not be analysed (see the table)")
    return out + res.notes


def history_document(res: HistoryResult) -> HistoryDocument:
    """The ``snapviz.history/1`` document (``history --json``)."""
    runs = []
    for i, r in res.runs.iterrows():
        ok = bool(r["ok"])
        key = r["key"]
        runs.append(
            HistoryRun(
                label=r["label"],
                source=r["source"],
                order_key=None if key is None or (isinstance(key, float) and np.isnan(key)) else key,
                status="ok" if ok else "failed",
                reason=r["reason"],
                peak=HistoryPeak(
                    allocated_bytes=int(r["peak_allocated_bytes"]) if ok else None,
                    reserved_bytes=int(r["peak_reserved_bytes"]) if ok else None,
                    stage=r["peak_stage"] if ok else None,
                ),
                oom_count=int(r["oom_count"]) if ok else None,
                stage_peak_allocated_bytes=[None if pd.isna(v) else int(v) for v in res.stage_peaks.loc[i]],
            )
        )
    return HistoryDocument(
        schema=HISTORY_SCHEMA,
        order_by=res.order_by,
        jump_percent=res.jump_pct,
        verdict=history_verdict(res),
        stage_names=[str(c) for c in res.stage_peaks.columns],
        runs=runs,
        stages=res.stages,
    )


BASELINE_PICKS = ("last", "best")


def history_baseline(doc: HistoryDocument, pick: str = "last") -> dict[str, Any]:
    """A ``check --baseline`` document from a ``snapviz.history/1`` one: the ``last`` analysed
    run in history order, or the ``best`` (lowest peak allocated). Only the peak is carried:
    it is all ``--max-increase`` compares."""
    from snapviz.errors import InputError

    ok = [(r, int(a)) for r in doc.runs if r.status == "ok" and (a := r.peak.allocated_bytes)]
    if not ok:
        raise InputError("the history holds no analysed run to take as the baseline")
    if pick not in BASELINE_PICKS:
        raise InputError(f"--baseline-pick: {pick!r} is not one of {', '.join(BASELINE_PICKS)}")
    run, peak = ok[-1] if pick == "last" else min(ok, key=lambda rp: rp[1])
    return {"source": str(run.label), "peak": {"allocated_bytes": int(peak)}}
