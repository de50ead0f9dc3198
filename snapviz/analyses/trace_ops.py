"""Analyses over a loaded Chrome trace: memory timeline, stages, stage peaks, attention.

Pure functions from :class:`snapviz.load.chrome_trace.ChromeTrace` to DataFrames.

Time axes (reference §2.6 and §5.1): every ``*_us`` column of a ``ChromeTrace`` is
already absolute Unix µs (``ts + baseTimeNanoseconds / 1000``), the clock of a
snapshot's ``time_us``; see :func:`trace_ts_to_unix_us` and :func:`align_offset_us`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.stages import CANONICAL, stage_group
from snapviz.analyses.trace_devices import DEVICE_CPU
from snapviz.load.chrome_trace import ChromeTrace

__all__ = [
    "devices", "memory_timeline", "annotation_stages", "stage_peaks", "attention_ops",
    "stage_at", "analyze_trace", "TraceAnalysis", "trace_ts_to_unix_us", "unix_us_to_trace_ts", "align_offset_us", "ITEMSIZE",
]


# Ranges the profiler adds by itself; stages only when a trace has nothing else.
_HOUSEKEEPING = re.compile(r"^(ProfilerStep#\d+|Optimizer\..*)$")

# torch.profiler "Input type" strings (c10 scalar type names) -> bytes per element.
ITEMSIZE: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1, "long int": 8, "int": 4, "short int": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}

_SCORE_OPS = ("aten::baddbmm", "aten::bmm")
_SOFTMAX_OPS = ("aten::softmax", "aten::_softmax")
_SDPA_MATH = "aten::_scaled_dot_product_attention_math"  # also ..._math_for_mps


def _is_sdpa(name: str) -> bool:
    return name == "aten::scaled_dot_product_attention" or name.startswith("aten::_scaled_dot_product_")


def _is_attention(name: str) -> bool:
    return name in _SCORE_OPS or name in _SOFTMAX_OPS or _is_sdpa(name)


# --------------------------------------------------------------------------- time


def trace_ts_to_unix_us(trace: ChromeTrace, ts: Any) -> Any:
    """Raw Chrome ``ts`` (µs relative to ``baseTimeNanoseconds``) -> Unix µs.

    The rule: ``unix_us = ts + baseTimeNanoseconds / 1000`` (``base_us`` is 0 for old
    traces whose ``ts`` is already absolute). The result is directly comparable with a
    snapshot's ``time_us`` (CLOCK_REALTIME, Unix µs) up to the µs–ms error of the
    allocator's clock conversion; the ``*_us`` columns of a ChromeTrace already are.
    Works on scalars and numpy arrays.
    """
    return ts + trace.base_us


def unix_us_to_trace_ts(trace: ChromeTrace, unix_us: Any) -> Any:
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
    out = pd.DataFrame({
        "events": g.size(),
        "max_allocated": g["total_allocated"].max(),
        "max_reserved": g["total_reserved"].max(),
        "exact": g["has_totals"].all() if "has_totals" in mem else True,
    }).reset_index()
    out["_cuda"] = out["device_type"] != DEVICE_CPU
    out = out.sort_values(["_cuda", "max_allocated", "device_id"], ascending=[False, False, True])
    return out.drop(columns="_cuda").reset_index(drop=True)[cols]


def _pick_device(trace: ChromeTrace, device_type: int | None, device_id: int | None) -> tuple[int, int] | None:
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
    dev = _pick_device(trace, device_type, device_id)
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
    return pd.DataFrame({
        "time_us": mem["time_us"].to_numpy(),
        "allocated": mem["total_allocated"].to_numpy(),
        "reserved": mem["total_reserved"].to_numpy(),
        "bytes": mem["bytes"].to_numpy(),
    })


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


def annotation_stages(trace: ChromeTrace) -> pd.DataFrame:
    """``record_function`` ranges that look like pipeline stages, outermost first.

    Keeps canonical names (``load``, ``text_encode``, ``denoise``/``denoise/<i>``,
    ``vae_decode``, ``other``) when any is present; otherwise every user annotation
    except ``ProfilerStep#N`` / ``Optimizer.*`` (kept only when nothing else exists).
    Nesting is by time containment across threads, not same-tid nesting, because
    allocations of other threads (autograd, data loaders) belong to the stage that
    encloses them in time. Columns: ``name``, ``start_us``, ``end_us``, ``group``
    (the part before ``/``), ``depth`` (number of enclosing stages), ``tid``.
    Rows are ordered by start, then longer (outer) first.
    """
    ann = trace.annotations
    cols = ["name", "start_us", "end_us", "group", "depth", "tid"]
    if not len(ann):
        return pd.DataFrame({"name": pd.Series(dtype=object), "start_us": pd.Series(dtype=np.float64),
                             "end_us": pd.Series(dtype=np.float64), "group": pd.Series(dtype=object),
                             "depth": pd.Series(dtype=np.int64), "tid": pd.Series(dtype=np.int64)})
    # Decide per distinct name (categories), then broadcast through the codes.
    cats = pd.Index(ann["name"].cat.categories).astype(str)
    groups = np.array([stage_group(c) for c in cats], dtype=object)
    canonical = np.isin(groups, CANONICAL)
    housekeeping = np.array([bool(_HOUSEKEEPING.match(c)) for c in cats])
    codes = ann["name"].cat.codes.to_numpy()
    if canonical[codes].any():
        keep_name = canonical
    elif (~housekeeping)[codes].any():
        keep_name = ~housekeeping
    else:
        keep_name = np.ones(len(cats), bool)
    rows = ann[keep_name[codes]]
    out = pd.DataFrame({
        "name": cats.to_numpy()[rows["name"].cat.codes.to_numpy()].astype(object),
        "start_us": rows["start_us"].to_numpy(),
        "end_us": rows["end_us"].to_numpy(),
        "group": groups[rows["name"].cat.codes.to_numpy()],
        "tid": rows["tid"].to_numpy(),
    })
    out = out.sort_values(["start_us", "end_us"], ascending=[True, False], kind="stable").reset_index(drop=True)
    out["depth"] = _containment_depth(out["start_us"].to_numpy(), out["end_us"].to_numpy())
    return out[cols]


def stage_at(times: np.ndarray, stages: pd.DataFrame, default: str = "") -> np.ndarray:
    """Name of the innermost stage whose interval contains each time (``default`` if none).

    Innermost = largest ``depth`` (then latest start), so ``denoise/3`` wins over an
    enclosing ``denoise``. Object array aligned with ``times``.
    """
    times = np.asarray(times, dtype=np.float64)
    labels = np.full(len(times), default, dtype=object)
    if not len(stages) or not len(times):
        return labels
    depth = stages["depth"].to_numpy() if "depth" in stages else np.zeros(len(stages), np.int64)
    order = np.lexsort((stages["start_us"].to_numpy(), depth))  # paint outer first, inner last
    order_t = np.argsort(times, kind="stable")
    sorted_t = times[order_t]
    names = stages["name"].to_numpy()
    starts, ends = stages["start_us"].to_numpy(), stages["end_us"].to_numpy()
    for i in order:  # one slice assignment per stage; stages are few
        lo, hi = np.searchsorted(sorted_t, starts[i], "left"), np.searchsorted(sorted_t, ends[i], "right")
        labels[order_t[lo:hi]] = names[i]
    return labels


def stage_peaks(trace: ChromeTrace, stages: pd.DataFrame, device_type: int | None = None,
                device_id: int | None = None) -> pd.DataFrame:
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
    out = pd.DataFrame({"name": stages["name"].to_numpy() if n_st else np.zeros(0, object),
                        "start_us": starts, "end_us": ends})
    t = tl["time_us"].to_numpy()
    alloc = tl["allocated"].to_numpy()
    res = tl["reserved"].to_numpy()
    if not len(t):
        out["events"] = np.zeros(n_st, np.int64)
        for c in ("entry_allocated_bytes", "exit_allocated_bytes", "peak_allocated_bytes", "peak_time_us",
                  "peak_reserved_bytes"):
            out[c] = np.full(n_st, np.nan)
        return out
    lo = np.searchsorted(t, starts, "left")    # first event inside
    hi = np.searchsorted(t, ends, "right")     # one past the last event inside
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
        arg[i] = lo[i] + int(np.argmax(alloc[lo[i]:hi[i]]))
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


@dataclass
class TraceAnalysis:
    """Everything the trace-only report needs, as DataFrames (see the functions named)."""

    device: tuple[int, int] | None   # (device_type, device_id) of timeline and stage peaks
    devices: pd.DataFrame            # devices()
    timeline: pd.DataFrame           # memory_timeline()
    stages: pd.DataFrame             # annotation_stages() joined with stage_peaks()
    attention_ops: pd.DataFrame      # attention_ops()


def analyze_trace(trace: ChromeTrace, device_type: int | None = None, device_id: int | None = None) -> TraceAnalysis:
    """Run every trace analysis for one device (default as in :func:`memory_timeline`)."""
    stages = annotation_stages(trace)
    peaks = stage_peaks(trace, stages, device_type, device_id)
    return TraceAnalysis(
        device=_pick_device(trace, device_type, device_id),
        devices=devices(trace),
        timeline=memory_timeline(trace, device_type, device_id),
        stages=pd.concat([stages, peaks.drop(columns=["name", "start_us", "end_us"])], axis=1),
        attention_ops=attention_ops(trace),
    )


# --------------------------------------------------------------------------- attention


def _parse_json_list(text: str) -> list[Any]:
    if not text:
        return []
    try:
        val = json.loads(text)
    except ValueError:
        return []
    return val if isinstance(val, list) else []


def _dims3(shape: Any) -> tuple[int, int, int] | None:
    """A tensor shape flattened to (batch, rows, cols); None if not a >= 2-D int shape."""
    if not isinstance(shape, list) or len(shape) < 2 or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1, shape[-2], shape[-1]


def _score_shape(name: str, shapes: list[Any]) -> tuple[int, int, int] | None:
    """(B, M, N) of the scores an op computes or would compute.

    baddbmm(self, b1[B,M,K], b2[B,K,N]) and bmm(a[B,M,K], b[B,K,N]) output [B,M,N];
    softmax's is its input; SDPA(q[...,L,E], k[...,S,E]) implies [prod(...), L, S],
    the matrix a classic implementation would allocate and the fused kernel does not.
    """
    if name == "aten::baddbmm" and len(shapes) >= 3:
        a, b = _dims3(shapes[1]), _dims3(shapes[2])
        return (a[0], a[1], b[2]) if a and b else None
    if name == "aten::bmm" and len(shapes) >= 2:
        a, b = _dims3(shapes[0]), _dims3(shapes[1])
        return (a[0], a[1], b[2]) if a and b else None
    if name in _SOFTMAX_OPS and shapes:
        return _dims3(shapes[0])
    if _is_sdpa(name) and len(shapes) >= 2:
        q, k = _dims3(shapes[0]), _dims3(shapes[1])
        return (q[0], q[1], k[1]) if q and k else None
    return None


def _contraction(name: str, shapes: list[Any]) -> int | None:
    """K of a bmm/baddbmm (the summed dimension)."""
    first = shapes[1] if name == "aten::baddbmm" and len(shapes) > 1 else (shapes[0] if shapes else None)
    d = _dims3(first)
    return d[2] if d else None


def _nested(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """True for ops inside another listed op of the same thread (``_softmax`` in ``softmax``)."""
    nested = np.zeros(len(start), bool)
    order = np.lexsort((-end, start, tid))  # by tid, start, longer first
    open_end, open_tid = -np.inf, None
    for i in order:  # attention ops are few (thousands): a plain sweep is clear and fast
        if tid[i] == open_tid and end[i] <= open_end:
            nested[i] = True
        else:
            open_end, open_tid = end[i], tid[i]
    return nested


def attention_ops(trace: ChromeTrace) -> pd.DataFrame:
    """Attention-related ``cpu_op`` events with shapes, score sizes and their stage.

    Rows: ``aten::baddbmm``, ``aten::bmm``, ``aten::softmax``/``aten::_softmax``,
    ``aten::scaled_dot_product_attention`` and ``aten::_scaled_dot_product_*``, in
    time order. Columns: ``name``, ``start_us``, ``end_us``, ``tid``, ``shapes``
    (list of input dims), ``dtype`` (``Input type`` of the first input), ``itemsize``,
    ``score_shape`` ((B, M, N), see below), ``score_bytes`` (B·M·N·itemsize),
    ``materializes_scores``, ``nested`` (inside another listed op of the same thread,
    e.g. ``_softmax`` in ``softmax``), ``stage`` (innermost enclosing stage of
    :func:`annotation_stages`, ``""`` if none).

    ``score_shape`` is the output of baddbmm/bmm, the input of softmax, and for SDPA the
    matrix a classic implementation would materialize (so ``score_bytes`` is what the
    fused kernel saved). ``materializes_scores`` is True for a non-nested baddbmm/bmm
    whose output is attention scores — the next listed op on its thread is a softmax
    over that shape, or the output is square with a smaller contraction dim (self
    attention) — and for a non-nested softmax over such an output. SDPA materializes
    only when it ran the unfused math backend (``_scaled_dot_product_attention_math``
    under it); the fused kernels (flash, efficient, cuDNN, CPU flash) never do. Sum
    ``score_bytes`` over ``materializes_scores`` rows only.
    """
    ops = trace.ops
    cols = ["name", "start_us", "end_us", "tid", "shapes", "dtype", "itemsize", "score_shape",
            "score_bytes", "materializes_scores", "nested", "stage"]
    names_cat = pd.Index(ops["name"].cat.categories).astype(str) if len(ops) else pd.Index([])
    wanted = np.array([_is_attention(n) for n in names_cat], dtype=bool)
    if not len(ops) or not wanted.any():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    sel = ops[wanted[ops["name"].cat.codes.to_numpy()]]
    # By thread, then time, outer op first on equal start: an op's children follow it.
    sel = sel.iloc[np.lexsort((-sel["end_us"].to_numpy(), sel["start_us"].to_numpy(), sel["tid"].to_numpy()))]
    n = len(sel)
    names = names_cat.to_numpy()[sel["name"].cat.codes.to_numpy()].astype(object)
    # Parse each distinct dims / types JSON text once.
    dims_cat = sel["input_dims"].cat
    dims_parsed = [_parse_json_list(str(s)) for s in dims_cat.categories]
    shapes = [dims_parsed[c] if c >= 0 else [] for c in dims_cat.codes.to_numpy()]
    types_cat = sel["input_types"].cat
    first_type = [(_parse_json_list(str(s)) or [""])[0] for s in types_cat.categories]
    dtype = np.array([first_type[c] if c >= 0 else "" for c in types_cat.codes.to_numpy()], dtype=object)
    itemsize = np.array([ITEMSIZE.get(str(d), 0) for d in dtype], dtype=np.int64)

    start, end, tid = sel["start_us"].to_numpy(), sel["end_us"].to_numpy(), sel["tid"].to_numpy()
    nested = _nested(start, end, tid)
    score = [_score_shape(nm, sh) for nm, sh in zip(names, shapes)]
    numel = np.array([s[0] * s[1] * s[2] if s else 0 for s in score], dtype=np.int64)
    score_bytes = numel * itemsize

    # Classify along each thread's sequence of non-nested listed ops (rows are sorted by tid, start).
    materializes = np.zeros(n, bool)
    top = np.flatnonzero(~nested)
    for j, i in enumerate(top):
        nm, s = names[i], score[i]
        if _is_sdpa(nm):
            # The math backend is SDPA unfused: it builds the full score matrix inside.
            kids = names[i + 1:top[j + 1] if j + 1 < len(top) else n]
            materializes[i] = s is not None and any(str(k).startswith(_SDPA_MATH) for k in kids)
            continue
        if nm not in _SCORE_OPS or s is None:
            continue
        nxt = top[j + 1] if j + 1 < len(top) and tid[top[j + 1]] == tid[i] else None
        followed_by_softmax = nxt is not None and names[nxt] in _SOFTMAX_OPS and score[nxt] == s
        k = _contraction(nm, shapes[i])
        square_self_attention = s[1] == s[2] and k is not None and k < s[2]
        if followed_by_softmax or square_self_attention:
            materializes[i] = True
            if followed_by_softmax:
                materializes[nxt] = True

    stages = annotation_stages(trace)
    out = pd.DataFrame({
        "name": names, "start_us": start, "end_us": end, "tid": tid,
        "shapes": pd.Series(shapes, dtype=object).to_numpy(),
        "dtype": dtype, "itemsize": itemsize,
        "score_shape": pd.Series(score, dtype=object).to_numpy(),
        "score_bytes": score_bytes, "materializes_scores": materializes, "nested": nested,
        "stage": stage_at(start, stages),
    })
    return out.sort_values(["start_us", "end_us"], ascending=[True, False], kind="stable").reset_index(drop=True)[cols]
