"""Stage attribution: every trace event gets a stage label.

Sources, best first (DESIGN.md "Stage labels"): ``user_metadata`` stamped by
``_set_memory_metadata``; ``external_annotations`` (``record_function`` ranges);
the stage timeline of a run directory's ``run.json``; stack-frame rules
(:mod:`snapviz.analyses.frame_rules`) when nothing is labelled.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from snapviz.model import Snapshot

# inference stages, then the training phases written by ``snapviz collect --train``
CANONICAL = ("load", "text_encode", "denoise", "vae_decode", "other",
             "forward", "backward", "optimizer", "zero_grad")
UNLABELLED = "unlabelled"


def stage_group(label: str) -> str:
    """``denoise/3`` -> ``denoise``."""
    return label.split("/", 1)[0]


def _looks_like_stage(name: str) -> bool:
    return stage_group(name) in CANONICAL


@dataclass
class StageLabels:
    """Per-event labels for one device's events plus where they came from."""

    labels: np.ndarray        # object array of str, one per event
    source: str               # user_metadata | annotations | run.json | frames | none


def _from_metadata(snap: Snapshot, ev: pd.DataFrame) -> np.ndarray | None:
    mids = ev["metadata_id"].to_numpy()
    if not (mids > 0).any():
        return None
    strings = np.array(snap.strings, dtype=object)
    labels = strings[mids]
    # Users may stamp "stage=denoise/3" style strings: keep the value.
    labels = np.array([s.split("=", 1)[1] if s.startswith("stage=") else s for s in strings], dtype=object)[mids]
    labels[mids == 0] = UNLABELLED
    return labels


def annotation_intervals(snap: Snapshot, device: int | None = None) -> pd.DataFrame:
    """Pair START/END annotations (a stack per name, so nesting and repeats work)."""
    ann = snap.annotations
    if device is not None and len(ann):
        ann = ann[(ann["device"] == device) | (ann["device"] < 0)]
    rows = []
    open_: dict[str, list[int]] = {}
    for t, name, stage in zip(ann["time_us"].tolist(), ann["name"].tolist(), ann["stage"].tolist()):
        if stage == "START":
            open_.setdefault(name, []).append(t)
        elif stage == "END" and open_.get(name):
            rows.append((name, open_[name].pop(), t))
    out = pd.DataFrame(rows, columns=["name", "start_us", "end_us"])
    return out.sort_values(["start_us", "end_us"], ascending=[True, False]).reset_index(drop=True)


def label_by_intervals(times: np.ndarray, intervals: pd.DataFrame, default: str = UNLABELLED) -> np.ndarray:
    """Label each time with the innermost (latest-starting) interval containing it."""
    labels = np.full(len(times), default, dtype=object)
    if not len(intervals):
        return labels
    iv = intervals.sort_values("start_us", kind="stable")
    # Later-starting intervals are applied last so that nested (inner) ranges win.
    for name, s, e in zip(iv["name"].tolist(), iv["start_us"].to_numpy(), iv["end_us"].to_numpy()):
        lo, hi = np.searchsorted(times, s, "left"), np.searchsorted(times, e, "right")
        labels[lo:hi] = name
    return labels


def _from_annotations(snap: Snapshot, ev: pd.DataFrame, device: int) -> np.ndarray | None:
    iv = annotation_intervals(snap, device)
    if not len(iv) or (ev["time_us"] < 0).all():
        return None
    stagey = iv[iv["name"].map(_looks_like_stage)]
    if len(stagey):
        iv = stagey
    else:
        iv = iv[~iv["name"].str.startswith(("ProfilerStep#", "Optimizer."))] if len(iv) else iv
        if not len(iv):
            return None
    return label_by_intervals(ev["time_us"].to_numpy(), iv)


def _from_run_json(snap: Snapshot, ev: pd.DataFrame) -> np.ndarray | None:
    run = snap.run or {}
    stages = run.get("stages") or []
    if not stages or (ev["time_us"] < 0).all():
        return None
    iv = pd.DataFrame([(s["name"], s["start_us"], s["end_us"]) for s in stages if "start_us" in s],
                      columns=["name", "start_us", "end_us"])
    return label_by_intervals(ev["time_us"].to_numpy(), iv, default="other")


def label_events(snap: Snapshot, ev: pd.DataFrame, device: int, use: str = "auto",
                 rules_path: str | None = None) -> StageLabels:
    """Stage label of every event of one device, from the best source present.

    ``use`` forces a source (``user_metadata``, ``annotations``, ``run.json``, ``frames``).
    """
    order = ("user_metadata", "annotations", "run.json", "frames") if use == "auto" else (use,)
    for source in order:
        if source == "user_metadata":
            labels = _from_metadata(snap, ev)
        elif source == "annotations":
            labels = _from_annotations(snap, ev, device)
        elif source == "run.json":
            labels = _from_run_json(snap, ev)
        else:
            try:
                from snapviz.analyses.frame_rules import label_from_frames
            except ImportError:
                labels = None
            else:
                labels = label_from_frames(snap, ev, rules_path)
        if labels is not None:
            return StageLabels(labels=labels, source=source)
    return StageLabels(labels=np.full(len(ev), UNLABELLED, dtype=object), source="none")


def stage_intervals(labels: np.ndarray, times: np.ndarray) -> pd.DataFrame:
    """Contiguous runs of one label: ``name``, ``start_row``, ``end_row`` (exclusive), times."""
    n = len(labels)
    if n == 0:
        return pd.DataFrame(columns=["name", "start_row", "end_row", "start_us", "end_us"])
    change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    return pd.DataFrame({
        "name": labels[starts], "start_row": starts, "end_row": ends,
        "start_us": times[starts], "end_us": times[ends - 1],
    })


def stage_table(intervals: pd.DataFrame, allocated: np.ndarray, reserved: np.ndarray, baseline: int,
                baseline_reserved: int) -> pd.DataFrame:
    """Per interval: peak allocated/reserved (as ``max_memory_*`` after a reset at the
    stage's start would report: the peak includes what was live on entry), entry/exit."""
    rows = []
    for name, s, e, t0, t1 in intervals[["name", "start_row", "end_row", "start_us", "end_us"]].itertuples(index=False):
        entry = int(allocated[s - 1]) if s > 0 else baseline
        entry_res = int(reserved[s - 1]) if s > 0 else baseline_reserved
        seg = allocated[s:e]
        k = int(np.argmax(seg))
        peak = max(entry, int(seg[k]))
        rows.append({
            "name": name, "group": stage_group(str(name)), "start_row": int(s), "end_row": int(e),
            "start_us": int(t0), "end_us": int(t1),
            "peak_allocated_bytes": peak, "peak_row": int(s + k) if int(seg[k]) >= entry else int(s - 1),
            "peak_reserved_bytes": max(entry_res, int(reserved[s:e].max())),
            "allocated_at_entry": entry, "allocated_at_exit": int(allocated[e - 1]),
            "duration_s": max(0, int(t1) - int(t0)) / 1e6,
        })
    cols = ["name", "group", "start_row", "end_row", "start_us", "end_us", "peak_allocated_bytes", "peak_row",
            "peak_reserved_bytes", "allocated_at_entry", "allocated_at_exit", "duration_s"]
    return pd.DataFrame(rows, columns=cols)
