"""What was live at a trace's peak, with Python stacks from ``python_function`` events.

A profiler trace has no allocator history, but every ``[memory]`` event names its address
and signed size, so allocations pair with their frees by address; the live set at the peak
is every allocation not yet freed there. With ``with_stack=True`` the ``python_function``
ranges of the allocating thread that contain the allocation's time are its Python stack
(innermost = latest start), and the innermost ``cpu_op`` is the op that allocated.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from snapviz.analyses.join import ops_at
from snapviz.analyses.sites import _PLUMBING, shorten_path

_PY_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")


def live_at_trace_peak(trace: object, device: tuple[int, int] | None, limit: int = 25) -> pd.DataFrame:
    """Largest allocations live at the peak of ``device``'s Total Allocated."""
    cols = ["bytes", "time_us", "tid", "addr", "op", "op_input_dims", "site", "stack"]
    mem: pd.DataFrame = trace.memory  # type: ignore[attr-defined]
    if device is not None and len(mem):
        mem = mem[(mem["device_type"] == device[0]) & (mem["device_id"] == device[1])]
    if not len(mem) or not mem["addr"].to_numpy().any():
        # No addresses (profilers of about 2021 wrote Bytes only): allocations cannot be
        # paired with their frees, so nothing can be said to be live.
        return pd.DataFrame(columns=cols)
    mem = mem.reset_index(drop=True)
    p = int(np.argmax(mem["total_allocated"].to_numpy()))
    b = mem["bytes"].to_numpy()
    # Pair each allocation with the next event on its address (its free), by position.
    order = np.lexsort((np.arange(len(mem)), mem["addr"].to_numpy()))
    addr_sorted = mem["addr"].to_numpy()[order]
    nxt = np.full(len(mem), len(mem), np.int64)
    same = addr_sorted[1:] == addr_sorted[:-1]
    nxt[order[:-1][same]] = order[1:][same]
    rows = np.arange(len(mem))
    live = (b > 0) & (rows <= p) & ((nxt > p) | (b[np.minimum(nxt, len(mem) - 1)] > 0))
    idx = rows[live]
    idx = idx[np.argsort(-b[idx], kind="stable")[:limit]]
    out = pd.DataFrame(
        {
            "bytes": b[idx],
            "time_us": mem["time_us"].to_numpy()[idx],
            "tid": mem["tid"].to_numpy()[idx],
            "addr": mem["addr"].to_numpy()[idx],
        }
    )
    out = pd.concat([out, ops_at(trace, out["time_us"].to_numpy())], axis=1)
    sites, stacks = _python_stacks(trace, out["time_us"].to_numpy(), out["tid"].to_numpy())
    out["site"], out["stack"] = sites, stacks
    return out[cols]


def _python_stacks(trace: object, times: np.ndarray, tids: np.ndarray) -> tuple[list[str], list[list[str]]]:
    pf: pd.DataFrame = trace.python_functions  # type: ignore[attr-defined]
    sites: list[str] = []
    stacks: list[list[str]] = []
    if not len(pf):
        return ["(no Python stacks: record with with_stack=True)"] * len(times), [[] for _ in times]
    by_tid = {t: g.sort_values("start_us", kind="stable") for t, g in pf.groupby("tid")}
    for t, tid in zip(times.tolist(), tids.tolist(), strict=True):
        g = by_tid.get(tid)
        if g is None:  # allocations on another thread (autograd): use the busiest one
            g = max(by_tid.values(), key=len)
        m = (g["start_us"].to_numpy() <= t) & (g["end_us"].to_numpy() >= t)
        names = g["name"].astype(str).to_numpy()[m][::-1]  # innermost first
        frames = []  # (raw file, line, function); built-ins and nn.Module markers carry no file
        for n in names:
            mt = _PY_FRAME.match(n)
            if mt and not n.startswith("<built-in"):
                frames.append((mt["file"], int(mt["line"]), mt["func"]))
        stack = [f"{shorten_path(f)}:{line} {fn}" for f, line, fn in frames]
        site = next(
            (s for (f, _, _), s in zip(frames, stack, strict=True) if not _PLUMBING.search("/" + f.lstrip("/"))),
            stack[0] if stack else "",
        )
        sites.append(site or "(no Python frame)")
        stacks.append(stack[:12])
    return sites, stacks
