"""Cut a snapshot down to a window of its history, still a valid snapshot (``snapviz trim``).

The trimmed dict keeps the original trace entries of the window verbatim (frames,
``user_metadata``, ``time_us``) and replaces the end state by the allocator's state *at
the window's end*, as the replay knows it: every segment then existing, tiled by its
live, pending-free and free blocks. Whoever replays the file derives the baseline as
docs/design.md says (end-state active blocks minus the trace's net), and that baseline is
then exactly what was allocated when the window opened; the segment and live-block
geometry the replay needs to size blocks is the same as the original's. So the trimmed
file's replay equals the original's over the window, byte for byte (tested on every
sample).

One rewrite is needed: a free whose allocation fell before the window names only the
*requested* size, and a replay must then guess the block by rounding, which is wrong for
a cached block handed out whole. Such frees carry the block's size instead (the request
is not in the file any more); the allocated and reserved series stay exact, the
requested series can differ by the rounding of those blocks.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.analysis import Analysis
from snapviz.errors import InputError
from snapviz.model import (
    A_ALLOC,
    A_FREE,
    A_FREE_DONE,
    A_FREE_REQ,
    A_SEG_ALLOC,
    A_SEG_FREE,
    A_SEG_MAP,
    A_SEG_UNMAP,
    Snapshot,
)
from snapviz.vocab import stage_group

SMALL_SEGMENT = 2 << 20  # the small pool's segment size (kSmallBuffer)


@dataclass
class Window:
    """Rows ``first``..``last`` (inclusive) of the analysed device's events, and why."""

    first: int
    last: int
    reason: str


def _time_s(an: Analysis) -> np.ndarray:
    t = an.replay.events["time_us"].to_numpy()
    if not len(t) or (t < 0).any():
        raise InputError(f"{an.run.source}: entries carry no time_us (torch < 2.2); use --stage or --top")
    return (t - t[0]) / 1e6


_WINDOW = re.compile(r"^\s*([0-9.]*)\s*s?\s*:\s*([0-9.]*)\s*s?\s*$")


def window_from_times(an: Analysis, spec: str) -> Window:
    """``T0:T1`` in seconds since the first recorded event (either end may be left open)."""
    m = _WINDOW.match(spec)
    if not m:
        raise InputError(f"--window {spec!r}: expected T0:T1 in seconds since the first event, e.g. 2.5:3.1")
    try:
        t0 = float(m.group(1)) if m.group(1) else 0.0
        t1 = float(m.group(2)) if m.group(2) else float("inf")
    except ValueError:
        raise InputError(f"--window {spec!r}: expected T0:T1 in seconds, e.g. 2.5:3.1") from None
    ts = _time_s(an)
    if t1 < t0:
        raise InputError(f"--window {spec}: T1 is before T0")
    first, last = int(np.searchsorted(ts, t0, "left")), int(np.searchsorted(ts, t1, "right")) - 1
    if last < first:
        raise InputError(f"--window {spec}: no event in it (the history spans 0 to {ts[-1]:.3f} s)")
    return Window(first, last, f"window {t0:g}s to {min(t1, float(ts[-1])):g}s")


def window_from_stage(an: Analysis, stage: str) -> Window:
    """A stage label (``denoise/3``) or group (``vae_decode``): from its first event to its last."""
    labels = an.labels.labels
    hit = (
        np.flatnonzero((labels == stage) | np.array([stage_group(x) == stage for x in labels], bool))
        if "/" not in stage
        else np.flatnonzero(labels == stage)
    )
    if not len(hit):
        names = list(dict.fromkeys(str(x) for x in an.stages["name"])) if len(an.stages) else []
        raise InputError(f"--stage {stage}: no such stage in this run (stages: {', '.join(names[:20]) or 'none'})")
    return Window(int(hit[0]), int(hit[-1]), f"stage {stage}")


def window_from_top(an: Analysis, n: int) -> Window:
    """From the allocation of the oldest of the ``n`` largest blocks live at the peak, to the peak."""
    if n < 1:
        raise InputError("--top must be at least 1")
    pi = an.replay.peak_index
    if pi < 0:
        raise InputError(f"{an.run.source}: the peak is before the recorded history; use --window or --stage")
    top = an.top_allocations.head(n)
    first = int(top["row"].min()) if len(top) else pi
    return Window(first, pi, f"the {len(top)} largest blocks live at the peak, up to the peak")


def _segments_at(snap: Snapshot, ev: pd.DataFrame, device: int, last: int) -> dict[int, dict[str, Any]]:
    """Segments existing right after row ``last``: the end state with later history undone."""
    segs: dict[int, dict[str, Any]] = {}
    s = snap.segments
    for r in s[s["device"] == device].itertuples(index=False):
        segs[int(r.address)] = {
            "total_size": int(r.total_size),
            "stream": int(r.stream),
            "segment_type": str(r.segment_type),
            "is_expandable": bool(r.is_expandable),
            "pool": str(r.pool_id),
            "stack_id": int(r.stack_id),
        }
    act = ev["action"].to_numpy()
    addr = ev["addr"].to_numpy()
    size = ev["size"].to_numpy()
    stream = ev["stream"].to_numpy()
    later = np.arange(len(ev)) > last
    for r in np.flatnonzero(later & ((act == A_SEG_ALLOC) | (act == A_SEG_FREE)))[::-1].tolist():
        a = int(addr[r])
        if act[r] == A_SEG_ALLOC:  # did not exist yet at the window's end
            segs.pop(a, None)
        else:  # freed later: still there at the window's end
            segs[a] = {
                "total_size": int(size[r]),
                "stream": int(stream[r]),
                "is_expandable": False,
                "pool": "0,0",
                "segment_type": "small" if int(size[r]) == SMALL_SEGMENT else "large",
                "stack_id": int(ev["stack_id"].iat[r]),
            }
    starts = sorted(segs)
    for r in np.flatnonzero(later & ((act == A_SEG_MAP) | (act == A_SEG_UNMAP))).tolist():
        j = bisect.bisect_right(starts, int(addr[r])) - 1
        if j >= 0:  # mapped later: not yet part of the segment at the window's end
            segs[starts[j]]["total_size"] -= int(size[r]) if act[r] == A_SEG_MAP else -int(size[r])
    return segs


def _blocks_at(an: Analysis, last: int) -> list[tuple[int, int, int, str, int]]:
    """(address, block size, requested, state, stack_id) of every busy block after row ``last``."""
    rep = an.replay
    ev = rep.events
    act = ev["action"].to_numpy()
    addr = ev["addr"].to_numpy()
    rows = np.arange(len(ev))
    is_alloc = act == A_ALLOC
    free_row, alloc_row = ev["free_row"].to_numpy(), ev["alloc_row"].to_numpy()
    bsz, req, sid = ev["block_size"].to_numpy(), ev["size"].to_numpy(), ev["stack_id"].to_numpy()
    out: list[tuple[int, int, int, str, int]] = []
    for r in np.flatnonzero(is_alloc & (rows <= last) & (free_row > last)).tolist():
        out.append((int(addr[r]), int(bsz[r]), int(req[r]), "active_allocated", int(sid[r])))
    # Pending free: the address's last block event by the window's end is a free_requested
    # (its free_completed comes later), as the replay keeps it until free_completed.
    blk = is_alloc | (act == A_FREE_REQ) | (act == A_FREE_DONE) | (act == A_FREE)
    before = np.flatnonzero(blk & (rows <= last))
    if (act == A_FREE_DONE).any() and len(before):
        rev = before[::-1]
        _, k = np.unique(addr[rev], return_index=True)
        for f in rev[k].tolist():
            if act[f] == A_FREE_REQ:
                a_row = int(alloc_row[f])
                out.append(
                    (
                        int(addr[f]),
                        int(bsz[f]),
                        int(req[a_row] if a_row >= 0 else req[f]),
                        "active_pending_free",
                        int(sid[a_row] if a_row >= 0 else sid[f]),
                    )
                )
    # Blocks from before the history: the end state's busy blocks the history never touches,
    # and blocks it frees after the window without having allocated them.
    touched = set(addr[blk].tolist())
    b = an.snapshot.blocks
    b = b[(b["device"] == an.device) & (b["state"] != "inactive")]
    for a, size, rq, st, k_ in zip(
        b["address"].tolist(),
        b["size"].tolist(),
        b["requested_size"].tolist(),
        b["state"].astype(str).tolist(),
        b["stack_id"].tolist(),
        strict=True,
    ):
        if a not in touched:
            out.append((int(a), int(size), int(rq), st, int(k_)))
    seen: set[int] = set()
    for r in np.flatnonzero(((act == A_FREE_REQ) | (act == A_FREE)) & (alloc_row < 0) & (rows > last)).tolist():
        a = int(addr[r])
        if a not in seen and not (blk & (rows <= last) & (addr == a)).any():
            seen.add(a)
            out.append((a, int(bsz[r]), int(req[r]), "active_allocated", int(sid[r])))
    return out


class _Frames:
    """Frame lists by stack id, reusing the original entries' list objects so the pickle's
    memo stores each stack once (the end state would otherwise repeat every weight's stack)."""

    def __init__(self, an: Analysis, entries: list[dict[str, Any]]) -> None:
        self.an = an
        sids = an.replay.events["stack_id"].to_numpy()
        uniq, first = np.unique(sids, return_index=True)
        self.by_stack: dict[int, Any] = {
            int(k): entries[int(r)].get("frames") or [] for k, r in zip(uniq, first, strict=True) if k >= 0
        }

    def __call__(self, stack_id: int) -> Any:
        if stack_id < 0:
            return []
        got = self.by_stack.get(stack_id)
        if got is None:  # a stack only the end state has (blocks from before the history)
            got = self.by_stack[stack_id] = self.an.snapshot.stack(stack_id)
        return got


def trim_snapshot(raw: dict[str, Any], an: Analysis, window: Window) -> dict[str, Any]:
    """The trimmed snapshot dict (builtins only) for ``window`` of ``an``'s device."""
    dev = an.replay.device
    ev = an.replay.events
    first, last = window.first, window.last
    entries = [e for e in raw["device_traces"][dev] if isinstance(e, dict)]
    assert len(entries) == len(ev)
    kept = entries[first : last + 1]
    # Frees of blocks allocated before the window: the block's size, not the request (module doc).
    act = ev["action"].to_numpy()
    alloc_row = ev["alloc_row"].to_numpy()
    bsz = ev["block_size"].to_numpy()
    for r in np.flatnonzero(
        ((act == A_FREE_REQ) | (act == A_FREE))
        & (np.arange(len(ev)) >= first)
        & (np.arange(len(ev)) <= last)
        & (alloc_row < first)
    ).tolist():
        if int(bsz[r]) != int(entries[r].get("size", 0)):
            kept[r - first] = {**entries[r], "size": int(bsz[r])}

    frames = _Frames(an, entries)
    segs = _segments_at(an.snapshot, ev, dev, last)
    blocks = sorted(_blocks_at(an, last))
    seg_starts = sorted(segs)
    by_seg: dict[int, list[tuple[int, int, int, str, int]]] = {a: [] for a in seg_starts}
    for blk in blocks:
        j = bisect.bisect_right(seg_starts, blk[0]) - 1
        if j >= 0:
            by_seg[seg_starts[j]].append(blk)
    segments = []
    for a in seg_starts:
        info = segs[a]
        out_blocks: list[dict[str, Any]] = []
        cur = a
        for b_addr, b_size, b_req, state, sid in by_seg[a]:
            if b_addr > cur:
                out_blocks.append(
                    {"address": cur, "size": b_addr - cur, "requested_size": 0, "state": "inactive", "frames": []}
                )
            out_blocks.append(
                {"address": b_addr, "size": b_size, "requested_size": b_req, "state": state, "frames": frames(sid)}
            )
            cur = max(cur, b_addr + b_size)
        total = max(info["total_size"], cur - a)
        if a + total > cur:
            out_blocks.append(
                {"address": cur, "size": a + total - cur, "requested_size": 0, "state": "inactive", "frames": []}
            )
        busy = [b for b in out_blocks if b["state"] != "inactive"]
        pool = tuple(int(x) for x in info["pool"].split(","))
        segments.append(
            {
                "device": dev,
                "address": a,
                "total_size": total,
                "allocated_size": sum(b["size"] for b in busy),
                "active_size": sum(b["size"] for b in busy),
                "requested_size": sum(b["requested_size"] for b in busy),
                "stream": info["stream"],
                "segment_type": info["segment_type"],
                "segment_pool_id": pool,
                "is_expandable": info["is_expandable"],
                "frames": frames(info["stack_id"]),
                "blocks": out_blocks,
            }
        )

    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(dev + 1, len(raw.get("device_traces") or [])))]
    traces[dev] = kept
    out: dict[str, Any] = {"segments": segments, "device_traces": traces}
    if isinstance(raw.get("allocator_settings"), dict):
        out["allocator_settings"] = dict(raw["allocator_settings"])
    t = ev["time_us"].to_numpy()
    if raw.get("external_annotations") and (t >= 0).all():
        t0, t1 = int(t[first]), int(t[last])
        out["external_annotations"] = [
            a for a in raw["external_annotations"] if isinstance(a, dict) and t0 <= int(a.get("time_us", -1)) <= t1
        ]
    return out
