"""The matrix's numbers: per-variant peaks and times from run.json, and the ranking rule."""

from __future__ import annotations

import statistics
from typing import Any

from snapviz.vocab import CANONICAL_STAGES, stage_group, stage_step

# the table's per-stage columns: the inference pipeline's canonical stages (the matrix runs
# inference only), without the catch-all "other" and the training phases that follow it
STAGE_GROUPS: tuple[str, ...] = CANONICAL_STAGES[: CANONICAL_STAGES.index("other")]

RANKING_RULE = (
    "Ranking, against the baseline: (1) variants that lower peak memory and make the pipe() call "
    "no slower come first, most memory saved first; (2) then variants that lower peak memory at a "
    "time cost, by memory saved per extra second of the pipe() call, highest first; (3) then "
    "variants that save no memory, least memory added first, then fastest. Failed and skipped "
    "variants are listed last, unranked."
)


def measure(info: dict[str, Any]) -> dict[str, Any]:
    """Peaks and times of one run.json: allocator numbers when present, RSS otherwise."""
    stages = [s for s in info.get("stages") or [] if s.get("end_us") is not None and not s.get("open")]
    alloc = info.get("allocator")
    metric = "allocator" if alloc else "rss"

    def a(s: dict[str, Any]) -> int | None:
        return s.get("peak_allocated_bytes") if metric == "allocator" else s.get("rss_peak_bytes")

    def r(s: dict[str, Any]) -> int | None:
        return s.get("peak_reserved_bytes") if metric == "allocator" else None

    per_stage: dict[str, dict[str, int | None]] = {}
    for g in STAGE_GROUPS:
        rows = [s for s in stages if stage_group(s["name"]) == g]
        av = [v for v in map(a, rows) if v is not None]
        rv = [v for v in map(r, rows) if v is not None]
        per_stage[g] = {"peak_allocated_bytes": max(av) if av else None, "peak_reserved_bytes": max(rv) if rv else None}
    if alloc:
        peak, reserved = int(alloc["max_memory_allocated"]), int(alloc["max_memory_reserved"])
    else:
        peak = max((int(v) for v in map(a, stages) if v is not None), default=0)
        reserved = None
    peak_stage = None
    for s in stages:
        if a(s) is not None and a(s) == peak:
            peak_stage = s["name"]
            break
    # the pipe() call: everything after the first load stage (the staged walkthrough's own
    # component moves included, since they are the technique's cost)
    first = next((i for i, s in enumerate(stages) if stage_group(s["name"]) != "load"), len(stages))
    call_s = sum(float(s.get("wall_s") or 0.0) for s in stages[first:]) if first < len(stages) else None
    load_s = sum(float(s.get("wall_s") or 0.0) for s in stages[:first])
    steps = {
        step: float(s["wall_s"])
        for s in stages
        if stage_group(s["name"]) == "denoise"
        and (step := stage_step(s["name"])) is not None
        and s.get("wall_s") is not None
    }
    # step 0 carries CUDA/cuDNN warm-up (and offload's first transfer): leave it out when we can
    later = [t for k, t in steps.items() if k > 0] or list(steps.values())
    return {
        "memory_metric": metric,
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": reserved,
        "peak_stage": peak_stage,
        "stages": per_stage,
        "call_s": round(call_s, 6) if call_s is not None else None,
        "step_median_s": round(statistics.median(later), 6) if later else None,
        "steps_timed": len(later),
        "load_s": round(load_s, 6),
        "build_s": info.get("build_s"),
    }


def _rel(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base


def rank_results(rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Add deltas vs ``baseline``, tier, score and rank to the ``ok`` rows (in place); ranked order.

    ``rows`` are :func:`variant_row` dicts. See :data:`RANKING_RULE`.
    """
    base = next(r for r in rows if r["label"] == baseline)
    bm = base["measure"]
    for r in rows:
        m = r.get("measure")
        if r["status"] != "ok" or m is None:
            continue
        saved = bm["peak_allocated_bytes"] - m["peak_allocated_bytes"]
        extra = (m["call_s"] - bm["call_s"]) if (m["call_s"] is not None and bm["call_s"] is not None) else None
        rel = {
            "peak_allocated": _rel(m["peak_allocated_bytes"], bm["peak_allocated_bytes"]),
            "peak_reserved": _rel(m["peak_reserved_bytes"], bm["peak_reserved_bytes"]),
            "call_s": _rel(m["call_s"], bm["call_s"]),
            "step_median_s": _rel(m["step_median_s"], bm["step_median_s"]),
        }
        for g in STAGE_GROUPS:
            rel[g] = _rel(m["stages"][g]["peak_allocated_bytes"], bm["stages"][g]["peak_allocated_bytes"])
        r["vs_baseline"] = {
            "saved_bytes": saved,
            "extra_call_s": round(extra, 6) if extra is not None else None,
            "relative": rel,
        }
        if r["label"] == baseline:
            r.update(tier=None, score=None, rank=None, verdict="baseline")
            continue
        if saved > 0 and extra is not None and extra <= 0:
            r.update(tier=1, score=None, verdict="saves memory and time")
        elif saved > 0 and extra is not None:
            r.update(tier=2, score=saved / extra, verdict="saves memory, costs time")
        elif saved > 0:
            r.update(tier=2, score=None, verdict="saves memory (no time measured)")
        else:
            r.update(tier=3, score=None, verdict="saves no memory" if saved == 0 else "uses more memory")

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        vs = r["vs_baseline"]
        extra = vs["extra_call_s"] if vs["extra_call_s"] is not None else float("inf")
        if r["tier"] == 1:
            return (1, -vs["saved_bytes"], extra)
        if r["tier"] == 2:
            return (2, -(r["score"] if r["score"] is not None else -1.0), extra)
        return (3, -vs["saved_bytes"], extra)

    ranked = sorted((r for r in rows if r.get("tier") is not None), key=key)
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    ordered = [base] + ranked
    ordered += [r for r in rows if r not in ordered]
    return ordered
