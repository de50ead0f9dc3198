"""Perfetto / chrome://tracing export: the replayed allocator as trace events.

One process track per device (``snapviz cuda:N``) holds:

* counter tracks ``allocated`` and ``reserved`` (``"ph": "C"``, value in ``args.bytes``):
  every change of the replayed series, so the counter's maximum *is* the replayed peak;
* slices (``"ph": "X"``) for stages (thread ``stages``) and steps (thread ``steps``);
* instant events (``"ph": "i"``) for the peak and for every OOM (thread ``markers``);
* the largest allocations as async slices (``"ph": "b"``/``"e"``, free to overlap)
  from alloc to free, their stack (≤ :data:`MAX_FRAMES` frames) in ``args``.

Time axis (docs/design.md "Format facts"): snapshot ``time_us`` is Unix µs; a Chrome
trace's ``ts`` is µs relative to ``baseTimeNanoseconds``. A standalone export sets
``baseTimeNanoseconds`` to the first event, so both files follow torch.profiler's
convention; a merge writes ``ts = time_us + offset - base`` on the user's trace's own
base, ``offset`` being the residual clock offset measured from ``record_function``
ranges both files hold (:func:`snapviz.analyses.join.snapshot_trace_offset`).

A merge never rewrites the user's trace in place: the result goes to a new file, the
user's keys and events unchanged, ours first in its ``traceEvents`` array.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import numpy as np

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.decimate import decimate_minmax
from snapviz.errors import InputError
from snapviz.model import A_ALLOC, A_OOM
from snapviz.safe_text import bound
from snapviz.units import fmt_bytes

# Real OS pids stay below pid_max (2**22 on Linux); kineto's GPU tracks use small ints.
PID_BASE = 9_000_000
TID_MARKERS, TID_STAGES, TID_STEPS, TID_ALLOCS = 1, 2, 3, 4
MAX_FRAMES = 20
TOP_ALLOCATIONS = 50
# Counter points per series; min/max decimation keeps the global peak exactly.
MAX_COUNTER_POINTS = 250_000


def _has_time(times: np.ndarray) -> bool:
    return bool(len(times)) and bool((times >= 0).all())


def _meta(pid: int, tid: int | None, what: str, name: str, sort_index: int | None = None) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"ph": "M", "pid": pid, "name": what, "args": {"name": name}}
    if tid is not None:
        base["tid"] = tid
    out = [base]
    if sort_index is not None:
        key = "thread_sort_index" if tid is not None else "process_sort_index"
        out.append(
            {
                "ph": "M",
                "pid": pid,
                **({"tid": tid} if tid is not None else {}),
                "name": key,
                "args": {"sort_index": sort_index},
            }
        )
    return out


def _counter_rows(allocated: np.ndarray, reserved: np.ndarray, max_points: int) -> np.ndarray:
    """Rows where either series changes (plus the first), decimated with min/max kept."""
    n = len(allocated)
    if not n:
        return np.empty(0, np.int64)
    change = np.ones(n, bool)
    change[1:] = (np.diff(allocated) != 0) | (np.diff(reserved) != 0)
    rows = np.flatnonzero(change)
    if len(rows) > max_points:
        keep = decimate_minmax(rows, allocated[rows], reserved[rows], max_points=max_points)
        rows = rows[keep]
    return rows


def _stack_args(an: Analysis, stack_id: int) -> list[str]:
    return an.sites.stack_text(int(stack_id), limit=MAX_FRAMES).splitlines()


def perfetto_events(
    an: Analysis,
    base_us: float,
    offset_us: float = 0.0,
    top_n: int = TOP_ALLOCATIONS,
    max_points: int = MAX_COUNTER_POINTS,
) -> list[dict[str, Any]]:
    """Trace events for one :class:`~snapviz.analyses.analysis.Analysis` (see module doc).

    ``base_us`` is the Unix µs that ``ts = 0`` stands for; ``offset_us`` is added to every
    snapshot time first (clock residual against a trace of the same run). Snapshots
    without ``time_us`` (torch < 2.2) use the event index as µs (standalone only).
    """
    rep = an.replay
    ev = rep.events
    n = len(ev)
    pid = PID_BASE + rep.device
    raw_t = ev["time_us"].to_numpy() if n else np.empty(0, np.int64)
    t = (raw_t.astype(np.float64) + offset_us - base_us) if _has_time(raw_t) else np.arange(n, dtype=np.float64)
    out: list[dict[str, Any]] = []
    out += _meta(pid, None, "process_name", f"snapviz cuda:{rep.device} (replayed allocator)", sort_index=-1)
    for tid, name in (
        (TID_MARKERS, "peak & OOM"),
        (TID_STAGES, "stages"),
        (TID_STEPS, "steps"),
        (TID_ALLOCS, f"largest allocations (top {top_n})"),
    ):
        out += _meta(pid, tid, "thread_name", name, sort_index=tid)
    if not n:
        return out

    alloc = ev["allocated"].to_numpy()
    resv = ev["reserved"].to_numpy()
    # Before the first entry the baseline was live (counts toward the peak when pi == -1).
    t_first = float(t[0])
    for name, base_val in (("allocated", rep.baseline_allocated), ("reserved", rep.baseline_reserved)):
        out.append({"ph": "C", "pid": pid, "name": name, "ts": t_first, "args": {"bytes": int(base_val)}})
    for r in _counter_rows(alloc, resv, max_points).tolist():
        ts = float(t[r])
        out.append({"ph": "C", "pid": pid, "name": "allocated", "ts": ts, "args": {"bytes": int(alloc[r])}})
        out.append({"ph": "C", "pid": pid, "name": "reserved", "ts": ts, "args": {"bytes": int(resv[r])}})

    out += _stage_slices(an, t, pid)

    pi = rep.peak_index
    peak_ts = float(t[pi]) if pi >= 0 else t_first
    out.append(
        {
            "ph": "i",
            "s": "t",
            "pid": pid,
            "tid": TID_MARKERS,
            "ts": peak_ts,
            "name": f"peak allocated {fmt_bytes(rep.peak_allocated)} ({an.peak_stage})",
            "args": {
                "allocated_bytes": int(rep.peak_allocated),
                "reserved_bytes": int(rep.peak_reserved),
                "stage": an.peak_stage,
                "event_index": int(pi),
                "top_sites": [str(s) for s in an.top_allocations["site"].head(5)] if len(an.top_allocations) else [],
            },
        }
    )
    act = ev["action"].to_numpy()
    for r in np.flatnonzero(act == A_OOM).tolist():
        free = int(ev["device_free"].iat[r])
        out.append(
            {
                "ph": "i",
                "s": "t",
                "pid": pid,
                "tid": TID_MARKERS,
                "ts": float(t[r]),
                "name": f"CUDA OOM: asked {fmt_bytes(int(ev['size'].iat[r]))}",
                "args": {
                    "requested_bytes": int(ev["size"].iat[r]),
                    "device_free_bytes": free,
                    "allocated_bytes": int(alloc[r]),
                    "reserved_bytes": int(resv[r]),
                    "stage": str(an.labels.labels[r]),
                    "event_index": r,
                },
            }
        )
    out += _allocation_slices(an, t, pid, top_n)
    # Names, stages, sites and stacks come from the file: clipped and cleaned as in every other
    # sink (snapviz.safe_text); the counters carry numbers only.
    return [e if e["ph"] == "C" else bound(e, max_list=None, json_numbers=False) for e in out]


def _stage_slices(an: Analysis, t: np.ndarray, pid: int) -> list[dict[str, Any]]:
    """Stage groups on one thread, steps (``denoise/3``) on another: each thread's slices
    abut without overlapping, so no importer has to guess a nesting."""
    st = an.stages
    if not len(st):
        return []
    n = len(t)
    starts = st["start_row"].to_numpy()
    # An interval lasts until the next one starts (or its own last event at the end).
    ends = np.r_[starts[1:], n - 1]
    rows = []
    for name, group, s, e, peak in zip(
        st["name"].astype(str),
        st["group"].astype(str),
        starts.tolist(),
        ends.tolist(),
        st["peak_allocated_bytes"].tolist(),
        strict=True,
    ):
        rows.append((name, group, float(t[s]), float(t[e]), int(peak)))
    out: list[dict[str, Any]] = []
    # Merge consecutive intervals of one group (denoise/0, denoise/1, ... -> denoise).
    k = 0
    while k < len(rows):
        j = k
        while j + 1 < len(rows) and rows[j + 1][1] == rows[k][1]:
            j += 1
        g_peak = max(r[4] for r in rows[k : j + 1])
        out.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": TID_STAGES,
                "name": rows[k][1],
                "ts": rows[k][2],
                "dur": max(rows[j][3] - rows[k][2], 0.0),
                "args": {"peak_allocated_bytes": g_peak},
            }
        )
        k = j + 1
    for name, _group, t0, t1, peak in rows:
        if "/" in name:
            out.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": TID_STEPS,
                    "name": name,
                    "ts": t0,
                    "dur": max(t1 - t0, 0.0),
                    "args": {"peak_allocated_bytes": peak},
                }
            )
    return out


def _allocation_slices(an: Analysis, t: np.ndarray, pid: int, top_n: int) -> list[dict[str, Any]]:
    """The ``top_n`` largest allocations of the run, plus every one in the peak's top list."""
    ev = an.replay.events
    n = len(ev)
    arows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    if not len(arows) or top_n <= 0:
        return []
    sizes = ev["block_size"].to_numpy()[arows]
    pick = arows[np.argsort(-sizes, kind="stable")[:top_n]]
    if len(an.top_allocations):
        pick = np.union1d(pick, an.top_allocations["row"].to_numpy().astype(np.int64))
    free_row = ev["free_row"].to_numpy()
    labels = an.labels.labels
    out: list[dict[str, Any]] = []
    for r in sorted(pick.tolist()):
        size = int(ev["block_size"].iat[r])
        sid = int(ev["stack_id"].iat[r])
        site = an.sites.site(sid)
        f = int(free_row[r])
        common = {
            "cat": "snapviz.allocation",
            "id": f"alloc-{an.replay.device}-{r}",
            "pid": pid,
            "tid": TID_ALLOCS,
            "name": f"{fmt_bytes(size)} {site}",
        }
        out.append(
            {
                **common,
                "ph": "b",
                "ts": float(t[r]),
                "args": {
                    "bytes": size,
                    "requested_bytes": int(ev["size"].iat[r]),
                    "address": hex(int(ev["addr"].iat[r])),
                    "stage": str(labels[r]),
                    "site": site,
                    "freed": f < n,
                    "stack": _stack_args(an, sid),
                },
            }
        )
        out.append({**common, "ph": "e", "ts": float(t[min(f, n - 1)])})
    return out


# ---------------------------------------------------------------- files


def standalone_trace(an: Analysis, top_n: int = TOP_ALLOCATIONS) -> dict[str, Any]:
    """A trace document of its own: ``ts`` relative to the first event, as torch.profiler writes."""
    times = an.replay.events["time_us"].to_numpy()
    has_time = _has_time(times)
    base_us = float(times[0]) if has_time else 0.0
    doc: dict[str, Any] = {
        "displayTimeUnit": "ms",
        "traceEvents": perfetto_events(an, base_us=base_us, top_n=top_n),
        "snapviz": {
            "source": an.run.source,
            "device": an.replay.device,
            "time_axis": "unix_us" if has_time else "event_index",
        },
    }
    if has_time:
        doc["baseTimeNanoseconds"] = int(times[0]) * 1000
    return doc


def _encode(path: str, data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6, mtime=0) if path.endswith(".gz") else data


def render_perfetto(
    an: Analysis,
    out_path: str,
    merge_into: str | None = None,
    top_n: int = TOP_ALLOCATIONS,
    merge_anyway: bool = False,
) -> bytes:
    """The file's bytes (gzip when ``out_path`` ends in ``.gz``); with ``merge_into``, the
    user's trace with our events added on its clock. Raises InputError for a bad trace, and for
    a trace recorded more than a day away from the snapshot (not the same run) unless
    ``merge_anyway``."""
    if merge_into is None:
        return _encode(out_path, json.dumps(standalone_trace(an, top_n), separators=(",", ":")).encode())
    from snapviz.analyses.join import MAX_CLOCK_GAP_US, clock_gap_us, snapshot_trace_offset
    from snapviz.load.trace.chrome_trace import load_chrome_trace

    times = an.replay.events["time_us"].to_numpy()
    if len(times) and not _has_time(times):
        raise InputError(
            f"{an.run.source}: the snapshot has no time_us (torch < 2.2), so it cannot be placed "
            "on a trace's clock; use --perfetto without --merge-into"
        )
    trace = load_chrome_trace(merge_into)
    gap = clock_gap_us(times, trace)
    if gap is not None and gap > MAX_CLOCK_GAP_US and not merge_anyway:
        raise InputError(
            f"--merge-into {merge_into}: the trace was recorded {_days(gap)} away from the snapshot "
            f"(more than {_days(MAX_CLOCK_GAP_US)}: not the same run); give --merge-anyway to merge them regardless"
        )
    offset = snapshot_trace_offset(an.snapshot, trace)
    events = perfetto_events(an, base_us=trace.base_us, offset_us=offset, top_n=top_n)
    return _encode(out_path, splice_events(merge_into, events))


def _days(us: float) -> str:
    days = us / 86_400e6
    return f"{days:,.0f} day{'s' if round(days) != 1 else ''}" if days >= 1 else f"{us / 3_600e6:,.1f} hours"


def splice_events(trace_path: str, events: list[dict[str, Any]]) -> bytes:
    """The trace with ``events`` inserted first in its ``traceEvents``; every other byte of the
    user's trace is kept as it was (keys, values, order, formatting).

    Streamed, not parsed: the user's events are never made into objects (50M tiny events took
    4.5 GiB through ``json.loads``). Only the JSON before the list is scanned, token by token, for
    the top-level ``traceEvents`` key; the decompressed bytes are bounded by the input limits."""
    from snapviz.load.decompress import open_decompressed, read_all

    with open_decompressed(trace_path, what="Chrome trace file") as f:
        data = read_all(f)
    at = _events_list_start(data)
    if at < 0:
        raise InputError(f"{trace_path}: not a Chrome trace (no traceEvents list)")
    ours = b",".join(json.dumps(e, separators=(",", ":")).encode() for e in events)
    rest = data[at + 1 :]
    sep = b"," if ours and rest.lstrip()[:1] != b"]" else b""
    return b"".join((data[: at + 1], ours, sep, rest))


# A JSON string (escapes included) or a structural character: the tokens that decide nesting.
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')


def _events_list_start(data: bytes) -> int:
    """Offset of the ``[`` that opens the top-level ``traceEvents`` list (-1: none)."""
    start = len(data) - len(data.lstrip(b"\xef\xbb\xbf \t\r\n"))
    if data[start : start + 1] != b"{":
        return -1
    depth = 0
    key_pending = False  # the last token was the key "traceEvents" at depth 1
    colon = False
    for m in _JSON_TOKEN.finditer(data, start):
        tok = m.group(0)
        if key_pending and colon:
            return m.start() if tok == b"[" else -1
        if key_pending and not colon:
            colon = tok == b":"
            key_pending = colon
            continue
        if tok in (b"{", b"["):
            depth += 1
        elif tok in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return -1
        elif depth == 1 and tok == b'"traceEvents"':
            key_pending, colon = True, False
    return -1
