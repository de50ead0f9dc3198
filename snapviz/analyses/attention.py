"""Attention score matrices: allocations made by the score computation.

Diffusers materializes scores only in ``Attention.get_attention_scores`` (``baddbmm``
then ``softmax``), used by the classic and sliced processors; SDPA does not. Other
materializing paths: diffusers' ``_native_math_attention`` and transformers'
``eager_attention_forward``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.sites import SiteNamer
from snapviz.model import A_ALLOC, Snapshot

SCORE_FUNCTIONS = frozenset({"get_attention_scores", "_native_math_attention", "eager_attention_forward"})
CROSS_KEYS = (77, 300, 226, 120, 512, 256, 333)
DTYPE_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4}


def attention_stack_ids(snap: Snapshot) -> np.ndarray:
    fr = snap.frames
    if not len(fr):
        return np.empty(0, np.int64)
    score_frames = fr.index[fr["name"].isin(SCORE_FUNCTIONS)].to_numpy()
    sf = snap.stack_frames
    return np.unique(sf.loc[sf["frame_id"].isin(score_frames), "stack_id"].to_numpy())


def token_candidates(run: dict[str, Any] | None) -> list[int]:
    """Sequence lengths the run's geometry allows (latent = image / 8; levels halve)."""
    if run and run.get("height") and run.get("width"):
        h, w = int(run["height"]) // 8, int(run["width"]) // 8
        cands = [(h // f) * (w // f) for f in (1, 2, 4, 8)]
        if str(run.get("pipeline", "")).startswith("pixart"):
            cands = [(h // 2) * (w // 2)] + cands
        return [c for c in dict.fromkeys(cands) if c > 0]
    return [k * k for k in (128, 96, 64, 48, 32, 24, 16, 8)]


def guess_shape(nbytes: int, tokens: list[int], itemsizes: list[int]) -> tuple[list[int], str] | None:
    """``[batch*heads, Nq, Nk]`` and dtype whose product is exactly ``nbytes``."""
    for itemsize in itemsizes:
        if nbytes % itemsize:
            continue
        elems = nbytes // itemsize
        dtype = {2: "fp16/bf16", 4: "fp32", 1: "int8/fp8"}.get(itemsize, f"{itemsize}B")
        for n in tokens:
            for nk in (n, *CROSS_KEYS):
                if elems % (n * nk) == 0:
                    bh = elems // (n * nk)
                    if 1 <= bh <= 4096:
                        return [bh, n, nk], dtype
    return None


def find_attention(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, stages: pd.DataFrame,
                   sites: SiteNamer) -> tuple[pd.DataFrame, dict[str, Any]]:
    ev = rep.events
    att_stacks = attention_stack_ids(snap)
    is_alloc = ev["action"].to_numpy() == A_ALLOC
    mask = is_alloc & np.isin(ev["stack_id"].to_numpy(), att_stacks)
    rows = np.flatnonzero(mask)
    run = snap.run or {}
    dtype = str(run.get("dtype", ""))
    itemsizes = [DTYPE_SIZES[dtype]] if dtype in DTYPE_SIZES else [2, 4]
    itemsizes += [s for s in (4, 2) if s not in itemsizes]  # softmax upcasts to fp32
    tokens = token_candidates(run)
    req = ev["size"].to_numpy()[rows]
    shapes = [guess_shape(int(b), tokens, itemsizes) for b in req]
    table = pd.DataFrame({
        "row": rows, "bytes": ev["block_size"].to_numpy()[rows], "requested_bytes": req,
        "stage": labels[rows] if len(rows) else np.empty(0, object),
        "shape": pd.Series([s[0] if s else None for s in shapes], dtype=object), "dtype": pd.Series([s[1] if s else None for s in shapes], dtype=object),
        "site": [sites.site(int(s)) for s in ev["stack_id"].to_numpy()[rows]],
        "free_row": ev["free_row"].to_numpy()[rows],
    })
    # Simultaneously live score bytes over the timeline.
    n = len(ev)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, rows, table["bytes"].to_numpy())
    np.add.at(delta, np.minimum(table["free_row"].to_numpy(), n), -table["bytes"].to_numpy())
    live = np.cumsum(delta[:n]) if n else np.zeros(0, np.int64)
    peak_live = int(live.max()) if n else 0
    per_stage = []
    for s in stages.itertuples(index=False):
        if s.peak_row >= 0 and s.peak_row < n:
            share = float(live[s.peak_row]) / s.peak_allocated_bytes if s.peak_allocated_bytes else 0.0
            per_stage.append({"stage": s.name, "live_bytes_at_stage_peak": int(live[s.peak_row]), "share_of_stage_peak": share})
    has_frames = bool((ev["stack_id"].to_numpy() >= 0).any()) if n else False
    if len(rows):
        impl = "materialized (classic or sliced attention: scores built by baddbmm + softmax)"
    elif has_frames:
        impl = "fused (SDPA / flash / memory-efficient): no score matrices materialized"
    else:
        impl = "unknown (no stack frames recorded)"
    largest: dict[str, Any] = {"bytes": 0, "shape": None, "dtype": None, "stage": None}
    if len(rows):
        i = int(np.argmax(table["bytes"].to_numpy()))
        largest = {"bytes": int(table["bytes"].iat[i]), "requested_bytes": int(table["requested_bytes"].iat[i]),
                   "shape": table["shape"].iat[i], "dtype": table["dtype"].iat[i], "stage": str(table["stage"].iat[i])}
    summary = {"count": int(len(rows)), "peak_live_bytes": peak_live, "total_bytes": int(table["bytes"].sum()),
               "largest": largest, "implementation": impl,
               "stages": [p for p in per_stage if p["live_bytes_at_stage_peak"] > 0]}
    table["live_series_max"] = peak_live
    return table.drop(columns=["live_series_max"]), summary


def live_attention_series(rep: ReplayResult, table: pd.DataFrame) -> np.ndarray:
    n = len(rep.events)
    delta = np.zeros(n + 1, np.int64)
    if len(table):
        np.add.at(delta, table["row"].to_numpy(), table["bytes"].to_numpy())
        np.add.at(delta, np.minimum(table["free_row"].to_numpy(), n), -table["bytes"].to_numpy())
    return np.cumsum(delta[:n])
