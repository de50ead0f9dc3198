"""Everything the HTML report shows, as plain columns (no Bokeh here).

:func:`report_data` is the one step between the analyses and the HTML renderer: the
renderer draws what this dict holds and computes nothing. Tests assert on this dict.

Strings that repeat per timeline point are interned: ``timeline["stage"]`` indexes
``stage_names``, ``timeline["action"]`` indexes ``action_names`` and
``timeline["stack"]`` indexes ``stacks`` (whose ``frames`` index ``frame_text``), so a
20,000-point timeline stays a few hundred KB in the page.
"""
from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from snapviz.analyses.decimate import decimate_minmax, was_decimated
from snapviz.model import A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, A_OOM, ACTIONS
from snapviz.render.fmt import fmt_bytes

ACTION_NAMES: tuple[str, ...] = ACTIONS

# Canonical stages keep one color in every report (and in comparisons).
STAGE_COLORS: dict[str, str] = {
    "load": "#7f7f7f",
    "text_encode": "#9467bd",
    "denoise": "#1f77b4",
    "vae_decode": "#2ca02c",
    "other": "#bcbd22",
    "unlabelled": "#c7c7c7",
}
_EXTRA_COLORS = ("#17becf", "#e377c2", "#8c564b", "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2",
                 "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
CATEGORY_COLORS: dict[str, str] = {
    "weights": "#7f7f7f",
    "attention scores": "#d62728",
    "activations": "#1f77b4",
    "latents & embeddings": "#9467bd",
    "vae buffers": "#2ca02c",
    "gradients & optimizer": "#8c564b",
    "before recording": "#c7c7c7",
    "unknown": "#bcbd22",
}
# Stacking order (bottom/left first): what was there before, then what persists across
# stages, then what each stage adds. The same order and colors in every category view.
CATEGORY_ORDER: tuple[str, ...] = ("before recording", "weights", "latents & embeddings", "activations",
                                   "attention scores", "vae buffers", "gradients & optimizer", "unknown")
_EXTRA_CATEGORY_COLORS = ("#17becf", "#e377c2", "#ff7f0e", "#393b79", "#637939", "#8c6d31", "#7b4173", "#9edae5")
SERIES_COLORS: dict[str, str] = {"allocated": "#1f3b73", "reserved": "#e8710a", "requested": "#5f9ea0",
                                 "fragmentation": "#e8710a", "peak": "#d62728"}
STACK_FRAME_LIMIT = 12
MAX_STAGE_BARS = 150
MAX_ATTENTION_ROWS = 500
MAX_STAGE_TOP_ROWS = 600
# The category area is a summary under the exact timeline: fewer points keep the page small.
MAX_CATEGORY_POINTS = 10000


def stage_group(name: str) -> str:
    """``denoise/3`` -> ``denoise`` (the DESIGN.md stage contract)."""
    return str(name).split("/", 1)[0]


def stage_palette(names: Iterable[str]) -> dict[str, str]:
    """A color for each stage name; steps of one stage (``denoise/0``...) share its group's color.

    Canonical groups have fixed colors; other groups take the next free color in order of
    first appearance, so the same names always get the same colors.
    """
    out: dict[str, str] = {}
    group_color: dict[str, str] = {}
    extra = iter(_EXTRA_COLORS * 4)
    for name in names:
        g = stage_group(name)
        if g not in group_color:
            group_color[g] = STAGE_COLORS.get(g) or next(extra, "#999999")
        out[str(name)] = group_color[g]
    return out


def order_categories(names: Iterable[str]) -> list[str]:
    """``names`` in :data:`CATEGORY_ORDER`, then any other (user rule) category in first-seen order."""
    got = list(dict.fromkeys(str(x) for x in names))
    return [c for c in CATEGORY_ORDER if c in got] + [c for c in got if c not in CATEGORY_ORDER]


def category_palette(names: Iterable[str]) -> dict[str, str]:
    """A color for each category: canonical ones fixed (:data:`CATEGORY_COLORS`), others
    the next free color in order, so a category has one color in every chart of a report."""
    out: dict[str, str] = {}
    extra = iter(_EXTRA_CATEGORY_COLORS * 4)
    for c in order_categories(names):
        out[c] = CATEGORY_COLORS.get(c) or next(extra, "#999999")
    return out


def _stage_codes(labels: np.ndarray) -> tuple[list[str], np.ndarray]:
    codes, names = pd.factorize(pd.Series(labels, dtype=object).astype(str), sort=False)
    return [str(n) for n in names], codes.astype(np.int32)


class _StackTable:
    """Stacks referenced by the report, with their frames interned once."""

    def __init__(self, snap: Any, sites: Any) -> None:
        self.snap = snap
        self.sites = sites
        self.index: dict[int, int] = {}
        self.stack_id: list[int] = []
        self.site: list[str] = []
        self.frames: list[list[int]] = []
        self.more: list[int] = []
        self.frame_index: dict[int, int] = {}
        self.frame_text: list[str] = []

    def add(self, stack_id: int) -> int:
        stack_id = int(stack_id)
        if stack_id < 0 or self.snap is None or stack_id >= len(self.snap.stacks):
            return -1
        got = self.index.get(stack_id)
        if got is not None:
            return got
        # Same selection as SiteNamer.stack_text (Python frames, or C++ ones when there are none).
        fids = self.sites.shown_frames(stack_id) if self.sites is not None else list(self.snap.stacks[stack_id])
        shown = fids[:STACK_FRAME_LIMIT]
        local = []
        for f in shown:
            j = self.frame_index.get(f)
            if j is None:
                j = self.frame_index[f] = len(self.frame_text)
                self.frame_text.append(self.sites.frame_str(f) if self.sites is not None else str(f))
            local.append(j)
        k = self.index[stack_id] = len(self.stack_id)
        self.stack_id.append(stack_id)
        self.site.append(self.sites.site(stack_id) if self.sites is not None else "")
        self.frames.append(local)
        self.more.append(len(fids) - len(shown))
        return k

    def add_many(self, stack_ids: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(np.asarray(stack_ids, np.int64), return_inverse=True)
        local = np.array([self.add(int(s)) for s in uniq], np.int32)
        return local[inv] if len(uniq) else np.empty(0, np.int32)

    def as_dict(self) -> dict[str, Any]:
        return {"stack_id": self.stack_id, "site": self.site, "frames": self.frames, "more": self.more,
                "frame_text": self.frame_text}


def stack_text(data: dict[str, Any], k: int) -> str:
    """The text of stack ``k`` of a report's ``stacks`` table (what a click on the timeline shows)."""
    st = data["stacks"]
    if k < 0 or k >= len(st["frames"]):
        return "(no frames recorded)"
    lines = [st["frame_text"][f] for f in st["frames"][k]]
    if st["more"][k]:
        lines.append(f"... {st['more'][k]} more")
    return "\n".join(lines) or "(no frames recorded)"


def _time_axis(time_us: np.ndarray) -> tuple[bool, int, np.ndarray]:
    """(has_time, first time µs, seconds since the first event; NaN where unknown)."""
    n = len(time_us)
    if n == 0 or not (time_us >= 0).all():
        return False, -1, np.full(n, np.nan)
    t0 = int(time_us[0])
    return True, t0, (time_us - t0) / 1e6


def decimated_rows(n: int, series: Sequence[np.ndarray], max_points: int, force: Iterable[int] = (),
                   time_us: np.ndarray | None = None) -> np.ndarray:
    """Rows kept for the timeline: min/max per bucket of every series, plus ``force`` rows.

    With ``time_us`` the budget is split between buckets in event order and buckets in
    time, so both x axes of the report stay faithful: a slow stage with few events (model
    loading) is not flattened into one bucket of a million-event index axis.
    """
    if time_us is not None and was_decimated(n, max_points):
        half = max(2, max_points // 2)
        keep = np.union1d(decimate_minmax(np.arange(n), *series, max_points=half),
                          decimate_minmax(time_us, *series, max_points=max_points - half))
    else:
        keep = decimate_minmax(np.arange(n), *series, max_points=max_points)
    extra = np.array([int(r) for r in force if 0 <= int(r) < n], np.int64)
    return np.union1d(keep, extra) if len(extra) else keep


def decimation_note(shown: int, total: int) -> dict[str, Any]:
    dec = shown < total
    note = (f"showing {shown:,} of {total:,} points (min/max per bucket, peak kept)" if dec
            else f"showing all {total:,} points")
    return {"decimated": bool(dec), "shown": int(shown), "total": int(total), "note": note}


def _truth(doc: dict[str, Any]) -> dict[str, Any] | None:
    truth = doc.get("allocator_truth") or {}
    want = truth.get("max_memory_allocated")
    if not isinstance(want, (int, float)) or not want:
        return None
    got = int(doc["peak"]["allocated_bytes"])
    diff = got - int(want)
    rel = diff / want
    if diff == 0:
        text = f"matches the allocator's own max_memory_allocated to the byte ({want:,} B)"
        status = "match"
    else:
        text = (f"allocator's own max_memory_allocated is {fmt_bytes(want)}; the replay is "
                f"{'+' if diff > 0 else '-'}{fmt_bytes(abs(diff))} ({rel * 100:+.2f}%) off")
        status = "close" if abs(rel) < 0.01 else "differs"
    out = {"status": status, "text": text, "max_memory_allocated": int(want), "replay_allocated": got,
           "diff_bytes": int(diff)}
    if truth.get("max_memory_reserved"):
        out["max_memory_reserved"] = int(truth["max_memory_reserved"])
    return out


def _title(doc: dict[str, Any]) -> str:
    run = doc.get("run") or {}
    parts = [run.get("pipeline"), run.get("size"),
             f"{run.get('height')}×{run.get('width')}" if run.get("height") and run.get("width") else None,
             run.get("dtype"), "+".join(run.get("techniques") or []) or None]
    label = " · ".join(str(p) for p in parts if p)
    return label or str(doc.get("source", ""))


def _metadata(doc: dict[str, Any], t0_us: int, extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("source", str(doc.get("source", "")))]
    if doc.get("device") is not None:
        rows.append(("device", str(doc["device"])))
    if doc.get("stage_source"):
        rows.append(("stages from", str(doc["stage_source"])))
    if t0_us > 0:
        start = _dt.datetime.fromtimestamp(t0_us / 1e6, tz=_dt.timezone.utc)
        rows.append(("first event", start.strftime("%Y-%m-%d %H:%M:%S UTC")))
    for k, v in extra:
        rows.append((k, str(v)))
    run = doc.get("run") or {}
    for k, v in run.items():
        if v is None or v == "" or v == []:
            continue
        rows.append((f"run.{k}", ", ".join(map(str, v)) if isinstance(v, list) else str(v)))
    settings = doc.get("allocator_settings") or {}
    for k, v in settings.items():
        if isinstance(v, dict):
            nz = {kk: vv for kk, vv in v.items() if vv not in (0, None, False, "")}
            v = ", ".join(f"{kk}={vv}" for kk, vv in nz.items()) if nz else "(all default)"
        rows.append((f"allocator.{k}", "(unset)" if v == "" else str(v)))
    hist = doc.get("history") or {}
    if hist:
        rows.append(("history events", f"{hist.get('events', 0):,}"))
        rows.append(("history truncated", str(bool(hist.get("truncated")))))
        if hist.get("baseline_allocated_bytes"):
            bound = "" if hist.get("baseline_exact", True) else "at least "
            rows.append(("allocated before recording", bound + fmt_bytes(hist["baseline_allocated_bytes"])))
        if hist.get("end_state_matches") is not None:
            rows.append(("replay matches end state", str(hist["end_state_matches"])))
    for d in doc.get("devices") or []:
        if len(doc.get("devices") or []) > 1:
            rows.append((f"device {d.get('device')} peak", f"{fmt_bytes(d.get('peak_allocated_bytes'))} allocated, "
                                                           f"{fmt_bytes(d.get('peak_reserved_bytes'))} reserved"))
    return rows


def _stage_bands(names: Sequence[str], start_row: np.ndarray, end_row: np.ndarray, time_s: np.ndarray,
                 has_time: bool, palette: dict[str, str]) -> dict[str, Any]:
    n = len(time_s)
    names = [str(x) for x in names]
    groups = [stage_group(x) for x in names]
    # Alternate the shade of consecutive steps so step boundaries show.
    step_no = [int(x.split("/", 1)[1]) if "/" in x and x.split("/", 1)[1].isdigit() else 0 for x in names]
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


def _unique_labels(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for x in names:
        k = seen.get(x, 0) + 1
        seen[x] = k
        out.append(x if k == 1 else f"{x} ({k})")
    return out


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
    got = [truth.get((x, int(s))) for x, s in zip(names, st["start_us"])]
    ap = np.array([float(t) if isinstance(t, (int, float)) else np.nan for t in got], np.float64)
    return {"label": _unique_labels(names), "name": names, "group": [stage_group(x) for x in names],
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


def _shown_intervals(an: Any) -> np.ndarray:
    """Stage intervals that get a bar: all of them, or past MAX_STAGE_BARS the peak
    interval of each stage (the same bars as the collapsed peak-by-stage chart)."""
    st = an.stages
    if len(st) <= MAX_STAGE_BARS:
        return np.arange(len(st), dtype=np.int64)
    peak = st["peak_allocated_bytes"].to_numpy(np.int64)
    order = pd.Series(np.arange(len(st))).groupby(st["group"].to_numpy(), sort=False)
    return np.array([int(ix.to_numpy()[np.argmax(peak[ix.to_numpy()])]) for _, ix in order], np.int64)


def _stage_breakdown(an: Any, bars: dict[str, Any], colors: dict[str, str]) -> dict[str, Any]:
    """Bytes by category at each stage interval's own peak: one stacked bar per interval.

    The categories cover what was allocated in the recorded history; the rest of the
    interval's peak (memory from before the recording) is ``before recording``, so each
    bar adds up to the interval's peak allocated.
    """
    st = an.stages
    shown = _shown_intervals(an)
    collapsed = len(shown) != len(st)
    totals = st["peak_allocated_bytes"].to_numpy(np.float64)[shown] if len(st) else np.empty(0)
    live = an.stage_live if isinstance(an.stage_live, pd.DataFrame) else pd.DataFrame()
    by: dict[str, np.ndarray] = {}
    if len(live) and len(shown):
        pos = {int(iv): j for j, iv in enumerate(shown)}
        sel = live[live["interval"].isin(list(pos))]
        for cat, g in sel.groupby("category", sort=False):
            col = np.zeros(len(shown))
            np.add.at(col, [pos[int(i)] for i in g["interval"]], g["bytes"].to_numpy(np.float64))
            by[str(cat)] = col
    rest = totals - (np.sum(list(by.values()), axis=0) if by else 0.0)
    if len(rest) and (rest > 0).any():
        by["before recording"] = by.get("before recording", 0.0) + np.maximum(rest, 0.0)
    cats = [c for c in order_categories(by) if by[c].any()]
    share = {c: np.divide(by[c], totals, out=np.zeros(len(totals)), where=totals > 0) for c in cats}
    top_k = np.argmax(np.vstack([by[c] for c in cats]), axis=0) if cats else np.zeros(len(shown), np.int64)
    names = [str(x) for x in st["name"].to_numpy()[shown]] if len(st) else []
    labels = [stage_group(x) for x in names] if collapsed else list(bars["label"])
    top_cat = [cats[k] for k in top_k] if cats else ["" for _ in shown]
    return {
        "interval": shown, "label": labels, "name": names, "total": totals,
        "categories": cats, "colors": [colors[c] for c in cats],
        "bytes": {c: by[c] for c in cats}, "share": share,
        "top_category": top_cat,
        "top_share": np.array([share[c][j] if c else 0.0 for j, c in enumerate(top_cat)]),
        "allocator_peak": (np.asarray(bars["allocator_peak"], np.float64)[shown] if not collapsed
                           else np.full(len(shown), np.nan)),
        "note": (f"{len(st):,} stage intervals: one bar per stage, at its highest interval's peak" if collapsed else ""),
    }


def _stage_top(an: Any, shown: np.ndarray, time_s: np.ndarray, stacks: _StackTable) -> dict[str, Any]:
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


def _category_timeline(an: Any, t0_us: int, has_time: bool, max_points: int) -> dict[str, Any]:
    """Live bytes by category over time, on category_timeline's own (min/max) sampling."""
    from snapviz.analyses.categories import category_timeline

    n = len(an.replay.events)
    empty = {"index": np.empty(0, np.int64), "time_s": np.empty(0), "allocated": np.empty(0),
             "categories": [], "colors": [], "bytes": {}, "total": 0, "note": ""}
    if not n or an.run.snapshot is None:
        return empty
    ct = category_timeline(an.run.snapshot, an.replay, an.labels.labels,
                           max_points=max(2, min(max_points, MAX_CATEGORY_POINTS)), rules=an.rules, tables=an.tables)
    fixed = {"row", "time_us", "stage", "allocated"}
    cats = [c for c in order_categories(c for c in ct.columns if c not in fixed) if ct[c].to_numpy().any()]
    rows = ct["row"].to_numpy(np.int64)
    time_s = (ct["time_us"].to_numpy(np.int64) - t0_us) / 1e6 if has_time else np.full(len(rows), np.nan)
    shown = len(rows)
    return {"index": rows, "time_s": time_s, "allocated": ct["allocated"].to_numpy(np.float64),
            "categories": cats,
            "bytes": {c: ct[c].to_numpy(np.float64) for c in cats}, "total": n,
            "note": (f"sampled at {shown:,} of {n:,} events (min/max of allocated per bucket, peak kept)"
                     if shown < n else f"all {n:,} events")}


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


def _top_allocations(an: Any, time_s: np.ndarray, stacks: _StackTable) -> dict[str, Any]:
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


def _attention(an: Any, doc: dict[str, Any], time_s: np.ndarray, stacks: _StackTable) -> dict[str, Any]:
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
        lifetime = [f"{d * 1e3:,.2f} ms ({_events(e)})" if e >= 0 else "not freed" for d, e in zip(dt, life)]
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
    return {"title": _title(doc), "verdict": verdict, "lines": lines, "truth": _truth(doc)}


def report_data(an: Any, doc: dict[str, Any], max_points: int = 20000) -> dict[str, Any]:
    """Plain columns for the snapshot report of one :class:`~snapviz.analyses.summary.Analysis`.

    ``doc`` is its ``snapviz.summary/1`` dict. Byte columns are float64 (exact below 2**53).
    """
    ev = an.replay.events
    n = len(ev)
    time_us = ev["time_us"].to_numpy(np.int64)
    has_time, t0, time_s = _time_axis(time_us)
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
    stage_names, stage_codes = _stage_codes(labels) if n else ([], np.empty(0, np.int32))
    interval_names = [str(x) for x in an.stages["name"]] if len(an.stages) else []
    palette = stage_palette(list(dict.fromkeys(interval_names + stage_names)))

    snap = an.run.snapshot
    stacks = _StackTable(snap, an.sites)
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
    cat_tl = _category_timeline(an, t0, has_time, max_points)
    cat_tl["stage"] = stage_codes[cat_tl["index"]] if n else np.empty(0, np.int32)  # indexes stage_names
    live = an.stage_live if isinstance(an.stage_live, pd.DataFrame) and len(an.stage_live) else None
    colors = category_palette([*(c["category"] for c in doc.get("categories") or []), *cat_tl["categories"],
                               *(live["category"] if live is not None else []), "before recording"])
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
        "metadata": _metadata(doc, t0),
        "decimation": decimation_note(len(keep), n),
    }


# ---------------------------------------------------------------------------------------
# Trace-only runs (a Chrome trace without a snapshot). Duck-typed on purpose: ``tan`` has
# ``timeline`` (time_us, allocated, reserved), ``stages`` (name, start_us, end_us,
# peak_allocated_bytes) and ``attention_ops`` DataFrames; ``doc`` is its summary dict.
# ---------------------------------------------------------------------------------------

def _frame_or_empty(obj: Any, name: str) -> pd.DataFrame:
    df = getattr(obj, name, None)
    return df if isinstance(df, pd.DataFrame) else pd.DataFrame()


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


def trace_report_data(tan: Any, doc: dict[str, Any], max_points: int = 20000) -> dict[str, Any]:
    """Plain columns for the report of a trace-only run (no allocator replay, no stacks)."""
    tl = _frame_or_empty(tan, "timeline")
    n = len(tl)
    time_us = tl["time_us"].to_numpy(np.int64) if n else np.empty(0, np.int64)
    order = np.argsort(time_us, kind="stable")
    time_us = time_us[order]
    alloc = tl["allocated"].to_numpy(np.int64)[order] if n else np.empty(0, np.int64)
    resv = (tl["reserved"].to_numpy(np.int64)[order] if "reserved" in tl else alloc) if n else np.empty(0, np.int64)
    has_time, t0, time_s = _time_axis(time_us)
    frag = resv - alloc
    pi = int(np.argmax(alloc)) if n else -1
    keep = (decimated_rows(n, [alloc, resv, frag], max_points, [pi], time_us if has_time else None)
            if n else np.empty(0, np.int64))

    st = _frame_or_empty(tan, "stages")
    names = [str(x) for x in st["name"]] if len(st) else []
    palette = stage_palette(names)
    # Stage of each timeline point: the interval containing its time (innermost = latest start).
    stage_of = np.full(n, "unlabelled", dtype=object)
    if len(st) and n:
        for name, s, e in sorted(zip(names, st["start_us"].to_numpy(), st["end_us"].to_numpy()), key=lambda r: r[1]):
            lo, hi = np.searchsorted(time_us, s, "left"), np.searchsorted(time_us, e, "right")
            stage_of[lo:hi] = name
    stage_names, stage_codes = _stage_codes(stage_of) if n else ([], np.empty(0, np.int32))
    palette = stage_palette(list(dict.fromkeys(names + stage_names)))
    timeline = {
        "index": keep.astype(np.int64), "time_s": time_s[keep],
        "allocated": alloc[keep].astype(np.float64), "reserved": resv[keep].astype(np.float64),
        "fragmentation": frag[keep].astype(np.float64), "stage": stage_codes[keep] if n else np.empty(0, np.int32),
    }
    if len(st) and n:
        s_us, e_us = st["start_us"].to_numpy(np.int64), st["end_us"].to_numpy(np.int64)
        bands = {"name": names, "group": [stage_group(x) for x in names], "color": [palette[x] for x in names],
                 "alpha": [0.22 if ("/" in x and x.split("/", 1)[1].isdigit() and int(x.split("/", 1)[1]) % 2) else 0.13
                           for x in names],
                 "start_s": (s_us - t0) / 1e6, "end_s": (e_us - t0) / 1e6,
                 "start_index": np.searchsorted(time_us, s_us, "left"),
                 "end_index": np.searchsorted(time_us, e_us, "right")}
    else:
        bands = {"name": [], "group": [], "color": [], "alpha": [], "start_s": np.empty(0), "end_s": np.empty(0),
                 "start_index": np.empty(0, np.int64), "end_index": np.empty(0, np.int64)}
    peak_doc = doc.get("peak") or {}
    peak_alloc = int(peak_doc.get("allocated_bytes") or (alloc[pi] if n else 0))
    peak_stage = str(peak_doc.get("stage") or (stage_of[pi] if n else "n/a"))
    peak = {"index": pi, "time_s": float(time_s[pi]) if (n and has_time) else None, "allocated": peak_alloc,
            "reserved": int(peak_doc.get("reserved_bytes") or (resv.max() if n else 0)),
            "requested": None, "stage": peak_stage, "reserved_index": int(np.argmax(resv)) if n else -1,
            "label": f"peak {fmt_bytes(peak_alloc)} · {peak_stage}"}
    bars = {"label": _unique_labels(names), "name": names, "group": [stage_group(x) for x in names],
            "color": [palette[x] for x in names],
            "peak_allocated": st["peak_allocated_bytes"].to_numpy(np.float64) if len(st) else np.empty(0),
            "peak_reserved": (st["peak_reserved_bytes"].to_numpy(np.float64) if "peak_reserved_bytes" in st
                              else np.full(len(st), np.nan)),
            "allocator_peak": np.full(len(st), np.nan),
            "duration_s": ((st["end_us"] - st["start_us"]).to_numpy(np.float64) / 1e6) if len(st) else np.empty(0),
            "note": ""}
    ops = _frame_or_empty(tan, "attention_ops")
    ops_shown = ops.head(MAX_ATTENTION_ROWS)
    att_table = {"columns": [str(c) for c in ops_shown.columns],
                 "rows": [[_cell(v) for v in r] for r in ops_shown.itertuples(index=False)],
                 "note": f"showing {len(ops_shown):,} of {len(ops):,} attention ops" if len(ops) > len(ops_shown) else ""}
    window = " (within the recorded window only)" if peak_doc.get("within_recorded_window") else ""
    when = f", at {peak['time_s']:.3f} s" if peak["time_s"] is not None else ""
    exact = peak_doc.get("exact", True)
    reserved = f"{fmt_bytes(peak['reserved'])} reserved" if peak_doc.get("reserved_bytes") is not None else "reserved not recorded"
    verdict = (f"Peak {'' if exact else 'at least '}{fmt_bytes(peak_alloc)} allocated ({reserved}) "
               f"in {peak_stage}{when}{window}" if n else "No memory events in this trace: nothing to measure")
    lines = ["From the profiler trace's memory events (no snapshot, so no allocator replay): the allocator's "
             "totals after every allocation, with Python stacks from the trace when recorded with with_stack=True"]
    top = doc.get("top_allocations") or []
    live_table = {"columns": ["size", "stage", "allocated in (Python, function start line)", "op (trace)", "op input shapes"],
                  "rows": [[fmt_bytes(t["bytes"]), str(t.get("stage", "")), str(t.get("site", "")), str(t.get("op", "")),
                            str(t.get("op_input_dims", ""))] for t in top],
                  "note": str(doc.get("top_allocations_note") or "")}
    att_doc = doc.get("attention") or {}
    if att_doc.get("implementation"):
        lines.append(f"Attention: {att_doc['implementation']}")
    return {
        "kind": "trace",
        "title": _title(doc),
        "headline": {"title": _title(doc), "verdict": verdict, "lines": lines, "truth": _truth(doc) if "peak" in doc and "allocated_bytes" in (doc.get("peak") or {}) else None},
        "warnings": [str(w) for w in doc.get("warnings") or []],
        "has_time": has_time,
        "timeline": timeline,
        "stage_names": stage_names,
        "stage_colors": palette,
        "bands": bands,
        "peak": peak,
        "stage_bars": bars,
        "attention_ops": att_table,
        "live_table": live_table,
        "attention_summary": dict(att_doc),
        "metadata": _metadata(doc, t0),
        "decimation": decimation_note(len(keep), n),
    }
