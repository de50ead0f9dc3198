"""Join a snapshot with the profiler trace of the same run on one time axis.

Snapshot ``time_us`` is Unix µs; trace times are ``ts + baseTimeNanoseconds/1000``,
also Unix µs. The residual offset (µs to ms of clock-conversion error) is taken from
``record_function`` ranges present in both (:func:`trace_ops.align_offset_us`). Each
allocation is then matched with the innermost ``cpu_op`` running when it happened, so
the report can show exact op shapes (``aten::baddbmm [[16,4096,4096], …]``) next to
allocations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.stages import annotation_intervals
from snapviz.analyses.trace_ops import align_offset_us
from snapviz.model import Snapshot

# A snapshot and a trace of one run overlap in time, or nearly: recording starts and stops apart
# by seconds to minutes. Further apart than this, they are not one run (docs/sharing.md).
MAX_CLOCK_GAP_US = 86_400 * 1_000_000  # one day


def trace_time_range_us(trace: object) -> tuple[float, float] | None:
    """First and last absolute µs of a trace's memory events, annotations and ops (None: none)."""
    lo, hi = np.inf, -np.inf
    for table, cols in (
        ("memory", ("time_us",)),
        ("annotations", ("start_us", "end_us")),
        ("ops", ("start_us", "end_us")),
    ):
        df = getattr(trace, table, None)
        if df is None or not len(df):
            continue
        for c in cols:
            v = df[c].to_numpy(dtype=np.float64)
            v = v[np.isfinite(v)]
            if v.size:
                lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return (lo, hi) if lo <= hi else None


def clock_gap_us(snapshot_times_us: np.ndarray, trace: object) -> float | None:
    """µs between the snapshot's recorded time range and the trace's (0 when they overlap);
    None when either holds no times."""
    t = np.asarray(snapshot_times_us, dtype=np.float64)
    t = t[t >= 0]
    tr = trace_time_range_us(trace)
    if not t.size or tr is None:
        return None
    s0, s1 = float(t.min()), float(t.max())
    return max(0.0, tr[0] - s1, s0 - tr[1])


def snapshot_trace_offset(snap: Snapshot, trace: object) -> float:
    iv = annotation_intervals(snap)
    return align_offset_us(trace, iv[["name", "start_us"]]) if len(iv) else 0.0  # type: ignore[arg-type]


def ops_at(trace: object, times_us: np.ndarray, offset_us: float = 0.0) -> pd.DataFrame:
    """Innermost op of the busiest thread running at each snapshot time (or empty strings)."""
    ops: pd.DataFrame = trace.ops  # type: ignore[attr-defined]
    n = len(times_us)
    out = pd.DataFrame({"op": np.full(n, "", object), "op_input_dims": np.full(n, "", object)})
    if not len(ops) or not n:
        return out
    main_tid = ops["tid"].value_counts().idxmax()
    o = ops[ops["tid"] == main_tid].sort_values("start_us", kind="stable")
    starts, ends = o["start_us"].to_numpy(), o["end_us"].to_numpy()
    names = o["name"].astype(str).to_numpy()
    dims = o["input_dims"].astype(str).to_numpy()
    t = np.asarray(times_us, dtype=np.float64) + offset_us
    last = np.searchsorted(starts, t, side="right") - 1
    for i, j in enumerate(last.tolist()):
        # Ops nest: walk back from the latest op started before t to one still running.
        k, steps = j, 0
        while k >= 0 and ends[k] < t[i] and steps < 64:
            k -= 1
            steps += 1
        if k >= 0 and ends[k] >= t[i]:
            out.iat[i, 0] = names[k]
            out.iat[i, 1] = dims[k]
    return out
