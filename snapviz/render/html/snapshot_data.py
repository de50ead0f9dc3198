"""The view-model of the snapshot report: everything it shows, as plain columns (no Bokeh).

:func:`report_data` is the one step between the analyses and the renderer
(:mod:`snapviz.render.html.snapshot`), which draws what this dict holds and computes
nothing; what takes computing comes from :mod:`snapviz.analyses.report_view`. Tests assert
on this dict. Byte columns are float64 (exact below 2**53).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.report_view import (  # noqa: F401 (tests read the limits here)
    MAX_CATEGORY_POINTS,
    MAX_STAGE_BARS,
    category_timeline_view,
    shown_intervals,
    stage_category_bytes,
)
from snapviz.analyses.training_view import training_timeline_view
from snapviz.model import A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, A_OOM, ACTIONS
from snapviz.render.html.palette import category_palette, stage_palette
from snapviz.render.html.view_common import (
    StackTable,
    allocator_truth,
    decimated_rows,
    decimation_note,
    intern_stages,
    metadata_rows,
    run_title,
    stack_text,
    time_axis,
    unique_labels,
)
from snapviz.units import fmt_bytes
from snapviz.vocab import BEFORE_RECORDING, stage_group, stage_step

ACTION_NAMES: tuple[str, ...] = ACTIONS
MAX_ATTENTION_ROWS = 500
MAX_STAGE_TOP_ROWS = 600


def _stage_bands(names: Sequence[str], start_row: np.ndarray, end_row: np.ndarray, time_s: np.ndarray,
                 has_time: bool, palette: dict[str, str]) -> dict[str, Any]:
    n = len(time_s)
    names = [str(x) for x in names]
    groups = [stage_group(x) for x in names]
    # Alternate the shade of consecutive steps so step boundaries show.
    step_no = [stage_step(x) or 0 for x in names]
    bands: dict[str, Any] = {
        "name": names, "group": groups, "color": [palette[x] for x in names],
        "alpha": [0.22 if s % 2 else 0.13 for s in step_no],
        "start_index": np.asarray(start_row, np.int64), "end_index": np.asarray(end_row, np.int64),
    }
    if has_time and n:
        s_idx = np.clip(np.asarray(start_row, np.int64), 0, n - 1)
        e_idx = np.asarray(end_row, np.int64)
        bands["start_s"] = time_s[s_idx]
        bands["end_s"] = np.where(e_idx < n, time_s[np.clip(e_idx, 0, n - 1)], time_s[n - 1])
    else:
        bands["start_s"] = np.full(len(names), np.nan)
        bands["end_s"] = np.full(len(names), np.nan)
    return bands


def _stage_bars(an: Any, doc: dict[str, Any], palette: dict[str, str]) -> dict[str, Any]:
    st = an.stages
    truth: dict[tuple[str, int], Any] = {}
    for g in doc.get("stages") or []:
        for it in g.get("intervals") or []:
            truth[(str(it.get("name")), int(it.get("start_us", -1)))] = it.get("allocator_peak_allocated_bytes")
    if len(st) > MAX_STAGE_BARS:
        g = an.stage_groups()
        return {"label": [str(x) for x in g["name"]], "name": [str(x) for x in g["name"]],
                "group": [str(x) for x in g["name"]], "color": [palette.get(str(x), "#999999") for x in g["name"]],
                "peak_allocated": g["peak_allocated_bytes"].to_numpy(np.float64),
                "peak_reserved": g["peak_reserved_bytes"].to_numpy(np.float64),
                "allocator_peak": np.full(len(g), np.nan), "duration_s": g["duration_s"].to_numpy(np.float64),
                "note": f"{len(st):,} stage intervals: showing one bar per stage (peak over its intervals)"}
    names = [str(x) for x in st["name"]]
    got = [truth.get((x, int(s))) for x, s in zip(names, st["start_us"], strict=False)]
    ap = np.array([float(t) if isinstance(t, (int, float)) else np.nan for t in got], np.float64)
    return {"label": unique_labels(names), "name": names, "group": [stage_group(x) for x in names],
            "color": [palette[x] for x in names],
            "peak_allocated": st["peak_allocated_bytes"].to_numpy(np.float64),
            "peak_reserved": st["peak_reserved_bytes"].to_numpy(np.float64),
            "allocator_peak": ap, "duration_s": st["duration_s"].to_numpy(np.float64), "note": ""}


def _categories(doc: dict[str, Any], colors: dict[str, str]) -> dict[str, Any]:
    cats = doc.get("categories") or []
    total = sum(int(c["bytes"]) for c in cats) or 1
    return {"category": [str(c["category"]) for c in cats], "bytes": np.array([float(c["bytes"]) for c in cats]),
            "count": np.array([int(c.get("count", 0)) for c in cats], np.int64),
            "share": np.array([int(c["bytes"]) / total for c in cats]),
            "label": [f"{fmt_bytes(c['bytes'])} ({int(c['bytes']) / total:.0%})" for c in cats],
            "color": [colors.get(str(c["category"]), "#999999") for c in cats]}


def _stage_breakdown(an: Any, bars: dict[str, Any], colors: dict[str, str]) -> dict[str, Any]:
    """Bytes by category at each stage interval's own peak: one stacked bar per interval
    (each bar adds up to the interval's peak allocated: see :func:`stage_category_bytes`)."""
    st = an.stages
    shown = shown_intervals(st)
    collapsed = len(shown) != len(st)
    totals = st["peak_allocated_bytes"].to_numpy(np.float64)[shown] if len(st) else np.empty(0)
    by = stage_category_bytes(st, an.stage_live, shown)
    cats = list(by)
    share = {c: np.divide(by[c], totals, out=np.zeros(len(totals)), where=totals > 0) for c in cats}
    top_k = np.argmax(np.vstack([by[c] for c in cats]), axis=0) if cats else np.zeros(len(shown), np.int64)
    names = [str(x) for x in st["name"].to_numpy()[shown]] if len(st) else []
    labels = [stage_group(x) for x in names] if collapsed else list(bars["label"])
    top_cat = [cats[k] for k in top_k] if cats else ["" for _ in shown]
    return {
        "interval": shown, "label": labels, "name": names, "total": totals,
        "categories": cats, "colors": [colors[c] for c in cats],
        "bytes": by, "share": share,
        "top_category": top_cat,
        "top_share": np.array([share[c][j] if c else 0.0 for j, c in enumerate(top_cat)]),
        "allocator_peak": (np.asarray(bars["allocator_peak"], np.float64)[shown] if not collapsed
                           else np.full(len(shown), np.nan)),
        "note": (f"{len(st):,} stage intervals: one bar per stage, at its highest interval's peak" if collapsed else ""),
    }


def _stage_top(an: Any, shown: np.ndarray, time_s: np.ndarray, stacks: StackTable) -> dict[str, Any]:
    """The largest blocks each shown stage interval allocated itself that were live at its peak."""
    top = an.stage_top if isinstance(an.stage_top, pd.DataFrame) else pd.DataFrame()
    if len(top):
        top = top[top["interval"].isin(shown.tolist())].head(MAX_STAGE_TOP_ROWS)
    rows = top["row"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    sids = top["stack_id"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    return {"interval": top["interval"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64),
            "stage": [str(x) for x in (top["stage"] if len(top) else [])],
            "bytes": top["bytes"].to_numpy(np.float64) if len(top) else np.empty(0),
            "size": [fmt_bytes(b) for b in (top["bytes"] if len(top) else [])],
            "site": [str(x) for x in (top["site"] if len(top) else [])],
            "event_index": rows, "time_s": time_s[rows] if len(rows) and len(time_s) else np.full(len(rows), np.nan),
            "stack": stacks.add_many(sids),
            "stack_text": [an.sites.stack_text(int(s), limit=40) if an.sites is not None else "" for s in sids]}


def _advice(doc: dict[str, Any]) -> list[dict[str, Any]]:
    total = int((doc.get("peak") or {}).get("allocated_bytes") or 0)
    out = []
    for a in doc.get("advice") or []:
        saves = a.get("saves_up_to_bytes")
        out.append({"technique": str(a.get("technique", "")), "why": str(a.get("why", "")),
                    "how": str(a.get("how", "")), "saves_up_to_bytes": saves,
                    "saves": f"up to {fmt_bytes(saves)}" if saves else "saving not measurable from this run",
                    "share": (saves / total) if (saves and total) else None})
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


def _top_allocations(an: Any, time_s: np.ndarray, stacks: StackTable) -> dict[str, Any]:
    top = an.top_allocations
    rows = top["row"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    sids = top["stack_id"].to_numpy(np.int64) if len(top) else np.empty(0, np.int64)
    local = stacks.add_many(sids)
    texts = [an.sites.stack_text(int(s), limit=40) if an.sites is not None else "" for s in sids]
    # With the run's profiler trace joined: the op running at each allocation, and its inputs.
    ops = [str(x) if isinstance(x, str) else "" for x in top["op"]] if "op" in top else [""] * len(top)
    dims = [_dims(x) for x in top["op_input_dims"]] if "op_input_dims" in top else [""] * len(top)
    return {"bytes": top["bytes"].to_numpy(np.float64) if len(top) else np.empty(0),
            "size": [fmt_bytes(b) for b in (top["bytes"] if len(top) else [])],
            "requested_bytes": top["requested_bytes"].to_numpy(np.float64) if len(top) else np.empty(0),
            "stage": [str(s) for s in (top["stage"] if len(top) else [])],
            "site": [str(s) for s in (top["site"] if len(top) else [])],
            "event_index": rows, "time_s": time_s[rows] if len(rows) else np.empty(0),
            "stack": local, "stack_text": texts,
            "has_ops": any(ops), "op": ops, "op_input_dims": dims}


def _attention(an: Any, doc: dict[str, Any], time_s: np.ndarray, stacks: StackTable) -> dict[str, Any]:
    att = an.attention
    summary = dict(doc.get("attention") or {})
    if not len(att):
        return {"summary": summary, "rows": None, "note": ""}
    shown = att.sort_values(["bytes", "row"], ascending=[False, True], kind="stable").head(MAX_ATTENTION_ROWS)
    rows = shown["row"].to_numpy(np.int64)
    sids = an.replay.events["stack_id"].to_numpy()[rows]
    local = stacks.add_many(sids)
    note = (f"showing the {len(shown):,} largest of {len(att):,} score allocations" if len(att) > len(shown) else "")
    free_row = shown["free_row"].to_numpy(np.int64)
    n = len(time_s)
    life = np.where(free_row < n, free_row - rows, -1)
    if len(time_s) and np.isfinite(time_s).all():
        dt = np.where(free_row < n, time_s[np.clip(free_row, 0, n - 1)] - time_s[rows], np.nan)
        lifetime = [f"{d * 1e3:,.2f} ms ({_events(e)})" if e >= 0 else "not freed" for d, e in zip(dt, life, strict=False)]
    else:
        lifetime = [_events(e) if e >= 0 else "not freed" for e in life]
    return {"summary": summary, "note": note, "rows": {
        "event_index": rows, "time_s": time_s[rows], "bytes": shown["bytes"].to_numpy(np.float64),
        "size": [fmt_bytes(b) for b in shown["bytes"]],
        "shape": ["×".join(map(str, s)) if isinstance(s, (list, tuple)) else "?" for s in shown["shape"]],
        "dtype": [str(d) if d else "?" for d in shown["dtype"]],
        "stage": [str(s) for s in shown["stage"]], "site": [str(s) for s in shown["site"]],
        "live_events": life, "lifetime": lifetime, "stack": local,
        "stack_text": [stack_text({"stacks": stacks.as_dict()}, int(k)) for k in local]}}


def _events(n: int) -> str:
    return f"{n:,} event" + ("" if n == 1 else "s")


def _headline(doc: dict[str, Any], peak: dict[str, Any], top_site: str | None, has_time: bool) -> dict[str, Any]:
    p = doc["peak"]
    window = " (within the recorded window only)" if p.get("within_recorded_window") else ""
    when = []
    if has_time and peak.get("time_s") is not None and np.isfinite(peak["time_s"]):
        when.append(f"at {peak['time_s']:.3f} s")
    if peak.get("index", -1) >= 0:
        when.append(f"event {peak['index']:,}")
    if peak.get("index", -1) >= 0:
        where = f"in {p.get('stage')}" + (f", {' · '.join(when)}" if when else "")
    elif (doc.get("history") or {}).get("events"):
        where = "before the recorded history began"
    else:
        where = "at the time of the snapshot (no trace history: end state only)"
    verdict = (f"Peak {fmt_bytes(p['allocated_bytes'])} allocated ({fmt_bytes(p['reserved_bytes'])} reserved) "
               f"{where}{window}")
    lines = []
    if top_site:
        lines.append(f"Largest block live at the peak comes from {top_site}")
    att = doc.get("attention") or {}
    if att.get("count"):
        lg = att.get("largest") or {}
        shape = "×".join(map(str, lg["shape"])) if lg.get("shape") else "?"
        lines.append(f"{att['count']:,} attention score matrices materialized (largest {fmt_bytes(lg.get('bytes'))}, "
                     f"[{shape}]); up to {fmt_bytes(att.get('peak_live_bytes'))} live at once")
    return {"title": run_title(doc), "verdict": verdict, "lines": lines, "truth": allocator_truth(doc)}


def report_data(an: Any, doc: dict[str, Any], max_points: int = 20000) -> dict[str, Any]:
    """Plain columns for the snapshot report of one :class:`~snapviz.analyses.summary.Analysis`.

    ``doc`` is its ``snapviz.summary/1`` dict. Byte columns are float64 (exact below 2**53).
    """
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
    keep = (decimated_rows(n, [alloc, resv, req, frag], max_points, force, time_us if has_time else None)
            if n else np.empty(0, np.int64))

    labels = np.asarray(an.labels.labels, dtype=object)
    stage_names, stage_codes = intern_stages(labels) if n else ([], np.empty(0, np.int32))
    interval_names = [str(x) for x in an.stages["name"]] if len(an.stages) else []
    palette = stage_palette(list(dict.fromkeys(interval_names + stage_names)))

    snap = an.run.snapshot
    stacks = StackTable(snap, an.sites)
    a_k = actions[keep]
    is_block = np.isin(a_k, (A_ALLOC, A_FREE_REQ, A_FREE_DONE, A_FREE))
    size_col = np.where(is_block, ev["block_size"].to_numpy(np.int64)[keep], ev["size"].to_numpy(np.int64)[keep])
    timeline = {
        "index": keep.astype(np.int64),
        "time_s": time_s[keep],
        "allocated": alloc[keep].astype(np.float64),
        "reserved": resv[keep].astype(np.float64),
        "requested": req[keep].astype(np.float64),
        "fragmentation": frag[keep].astype(np.float64),
        "action": a_k.astype(np.int32),
        "stage": stage_codes[keep] if n else np.empty(0, np.int32),
        "size": size_col.astype(np.float64),
        "stack": stacks.add_many(ev["stack_id"].to_numpy()[keep]) if n else np.empty(0, np.int32),
    }

    pi = int(rep.peak_index)
    peak = {"index": pi, "time_s": float(time_s[pi]) if (pi >= 0 and has_time) else None,
            "allocated": int(rep.peak_allocated), "reserved": int(rep.peak_reserved),
            "requested": int(rep.peak_requested), "stage": an.peak_stage,
            "reserved_index": int(rep.peak_reserved_index),
            "label": f"peak {fmt_bytes(rep.peak_allocated)} · {an.peak_stage}"}

    st = an.stages
    bands = _stage_bands(interval_names, st["start_row"].to_numpy() if len(st) else np.empty(0, np.int64),
                         st["end_row"].to_numpy() if len(st) else np.empty(0, np.int64), time_s, has_time, palette)
    top = _top_allocations(an, time_s, stacks)
    attention = _attention(an, doc, time_s, stacks)
    cat_tl = category_timeline_view(an, t0, has_time, max_points)
    if an.training is not None:   # training runs stack their own categories
        cat_tl = training_timeline_view(an.training, cat_tl)
    cat_tl["stage"] = stage_codes[cat_tl["index"]] if n else np.empty(0, np.int32)  # indexes stage_names
    live = an.stage_live if isinstance(an.stage_live, pd.DataFrame) and len(an.stage_live) else None
    colors = category_palette([*(c["category"] for c in doc.get("categories") or []), *cat_tl["categories"],
                               *(live["category"] if live is not None else []), BEFORE_RECORDING])
    cat_tl["colors"] = [colors[c] for c in cat_tl["categories"]]
    bars = _stage_bars(an, doc, palette)
    breakdown = _stage_breakdown(an, bars, colors)
    headline = _headline(doc, peak, top["site"][0] if top["site"] else None, has_time)
    oom = {"index": oom_rows.astype(np.int64), "time_s": time_s[oom_rows],
           "allocated": alloc[oom_rows].astype(np.float64)}
    return {
        "kind": "snapshot",
        "title": headline["title"],
        "headline": headline,
        "warnings": [str(w) for w in doc.get("warnings") or []],
        "has_time": has_time,
        "timeline": timeline,
        "stage_names": stage_names,
        "action_names": list(ACTION_NAMES),
        "stage_colors": palette,
        "stacks": stacks.as_dict(),
        "bands": bands,
        "peak": peak,
        "oom": oom,
        "advice": _advice(doc),
        "stage_bars": bars,
        "stage_breakdown": breakdown,
        "stage_top": _stage_top(an, breakdown["interval"], time_s, stacks),
        "category_colors": colors,
        "category_timeline": cat_tl,
        "categories": _categories(doc, colors),
        "top_allocations": top,
        "attention": attention,
        "metadata": metadata_rows(doc, t0),
        "decimation": decimation_note(len(keep), n),
    }
