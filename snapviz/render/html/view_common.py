"""Pieces of the report view-models shared by the snapshot and trace reports: interned
stacks, the time axis, decimation, the allocator-truth badge, title and run metadata
(the types are in :mod:`.view_models`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from snapviz.analyses.decimate import decimate_minmax, was_decimated
from snapviz.analyses.document import DevicePeak, Json, RunInfo, Summary, arr, obj
from snapviz.interning import Interner
from snapviz.render.html.view_models import Decimation, Stacks, Truth
from snapviz.units import fmt_bytes

STACK_FRAME_LIMIT = 12


def intern_stages(labels: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct stage labels (as text, in order of first appearance) and each row's code."""
    stages: Interner[str] = Interner()
    codes = stages.many(list(map(str, np.asarray(labels, dtype=object).tolist())))
    return stages.values, codes


class StackTable:
    """Builds the :class:`Stacks` a report references, with their frames interned once."""

    def __init__(self, snap: Any, sites: Any) -> None:
        self.snap = snap
        self.sites = sites
        self.index: dict[int, int] = {}
        self.frame_index: dict[int, int] = {}
        self.stacks = Stacks()

    def add(self, stack_id: int) -> int:
        stack_id = int(stack_id)
        if stack_id < 0 or self.snap is None or stack_id >= len(self.snap.stacks):
            return -1
        got = self.index.get(stack_id)
        if got is not None:
            return got
        out = self.stacks
        # Same selection as SiteNamer.stack_text (Python frames, or C++ ones when there are none).
        fids = self.sites.shown_frames(stack_id) if self.sites is not None else list(self.snap.stacks[stack_id])
        shown = fids[:STACK_FRAME_LIMIT]
        local = []
        for f in shown:
            j = self.frame_index.get(f)
            if j is None:
                j = self.frame_index[f] = len(out.frame_text)
                out.frame_text.append(self.sites.frame_str(f) if self.sites is not None else str(f))
            local.append(j)
        k = self.index[stack_id] = len(out.stack_id)
        out.stack_id.append(stack_id)
        out.site.append(self.sites.site(stack_id) if self.sites is not None else "")
        out.frames.append(local)
        out.more.append(len(fids) - len(shown))
        return k

    def add_many(self, stack_ids: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(np.asarray(stack_ids, np.int64), return_inverse=True)
        local = np.array([self.add(int(s)) for s in uniq], np.int32)
        return local[inv] if len(uniq) else np.empty(0, np.int32)


def time_axis(time_us: np.ndarray) -> tuple[bool, int, np.ndarray]:
    """(has_time, first time µs, seconds since the first event; NaN where unknown)."""
    n = len(time_us)
    if n == 0 or not (time_us >= 0).all():
        return False, -1, np.full(n, np.nan)
    t0 = int(time_us[0])
    return True, t0, (time_us - t0) / 1e6


def decimated_rows(
    n: int, series: Sequence[np.ndarray], max_points: int, force: Iterable[int] = (), time_us: np.ndarray | None = None
) -> np.ndarray:
    """Rows kept for the timeline: min/max per bucket of every series, plus ``force`` rows.

    With ``time_us`` the budget is split between buckets in event order and buckets in
    time, so both x axes of the report stay faithful: a slow stage with few events (model
    loading) is not flattened into one bucket of a million-event index axis.
    """
    if time_us is not None and was_decimated(n, max_points):
        half = max(2, max_points // 2)
        keep = np.union1d(
            decimate_minmax(np.arange(n), *series, max_points=half),
            decimate_minmax(time_us, *series, max_points=max_points - half),
        )
    else:
        keep = decimate_minmax(np.arange(n), *series, max_points=max_points)
    extra = np.array([int(r) for r in force if 0 <= int(r) < n], np.int64)
    return np.union1d(keep, extra) if len(extra) else keep


def decimation_note(shown: int, total: int) -> Decimation:
    dec = shown < total
    note = (
        f"showing {shown:,} of {total:,} points (min/max per bucket, peak kept)"
        if dec
        else f"showing all {total:,} points"
    )
    return Decimation(decimated=bool(dec), shown=int(shown), total=int(total), note=note)


def allocator_truth(summary: Summary) -> Truth | None:
    truth = summary.allocator_truth
    want = truth.max_memory_allocated if truth is not None else None
    if truth is None or not isinstance(want, (int, float)) or not want:
        return None
    got = int(summary.peak.allocated_bytes)
    diff = got - int(want)
    rel = diff / want
    if diff == 0:
        text = f"matches the allocator's own max_memory_allocated to the byte ({want:,} B)"
        status = "match"
    else:
        text = (
            f"allocator's own max_memory_allocated is {fmt_bytes(want)}; the replay is "
            f"{'+' if diff > 0 else '-'}{fmt_bytes(abs(diff))} ({rel * 100:+.2f}%) off"
        )
        status = "close" if abs(rel) < 0.01 else "differs"
    reserved = truth.max_memory_reserved
    return Truth(
        status=status,
        text=text,
        max_memory_allocated=int(want),
        replay_allocated=got,
        diff_bytes=int(diff),
        max_memory_reserved=int(reserved) if isinstance(reserved, (int, float)) and reserved else None,
    )


def run_title(summary: Summary) -> str:
    run = summary.run
    if run is None:  # no run.json
        return summary.source
    parts = [
        run.pipeline,
        run.size,
        f"{run.height}×{run.width}" if run.height and run.width else None,
        run.dtype,
        "+".join(map(str, arr(run.techniques))) or None,
    ]
    label = " · ".join(str(p) for p in parts if p)
    return label or summary.source


def _run_fields(run: RunInfo | None) -> list[tuple[str, Json]]:
    """The run's fields (run.json's, as the file has them) in the document's order."""
    return [(f.name, getattr(run, f.name)) for f in dataclasses.fields(run)] if run is not None else []


def metadata_rows(summary: Summary, t0_us: int, extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("source", summary.source)]
    if summary.device is not None:
        rows.append(("device", str(summary.device)))
    if summary.stage_source:
        rows.append(("stages from", summary.stage_source))
    if t0_us > 0:
        start = _dt.datetime.fromtimestamp(t0_us / 1e6, tz=_dt.timezone.utc)
        rows.append(("first event", start.strftime("%Y-%m-%d %H:%M:%S UTC")))
    for k, v in extra:
        rows.append((k, str(v)))
    for k, v in _run_fields(summary.run):
        if v is None or v == "" or v == []:
            continue
        rows.append((f"run.{k}", ", ".join(map(str, v)) if isinstance(v, list) else str(v)))
    for k, v in obj(summary.allocator_settings).items():
        if isinstance(v, dict):
            nz = {kk: vv for kk, vv in v.items() if vv not in (0, None, False, "")}
            v = ", ".join(f"{kk}={vv}" for kk, vv in nz.items()) if nz else "(all default)"
        rows.append((f"allocator.{k}", "(unset)" if v == "" else str(v)))
    hist = summary.history
    rows.append(("history events", f"{hist.events:,}"))
    rows.append(("history truncated", str(bool(hist.truncated))))
    if hist.baseline_allocated_bytes:
        bound = "at least " if hist.baseline_exact is False else ""
        rows.append(("allocated before recording", bound + fmt_bytes(hist.baseline_allocated_bytes)))
    if isinstance(hist.end_state_matches, bool):
        rows.append(("replay matches end state", str(hist.end_state_matches)))
    if len(summary.devices) > 1:
        for d in summary.devices:
            reserved = d.peak_reserved_bytes if isinstance(d, DevicePeak) else None  # a trace's devices: none
            rows.append(
                (
                    f"device {d.device} peak",
                    f"{fmt_bytes(d.peak_allocated_bytes)} allocated, {fmt_bytes(reserved)} reserved",
                )
            )
    return rows


def unique_labels(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for x in names:
        k = seen.get(x, 0) + 1
        seen[x] = k
        out.append(x if k == 1 else f"{x} ({k})")
    return out
