"""What was live at a moment: the largest blocks at one row (the peak's table), and at each
stage interval's own peak, the bytes by category and the blocks the stage itself added."""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.categories import categorize_allocs
from snapviz.analyses.frame_rules import RuleSet
from snapviz.analyses.replay import ReplayResult, live_at
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stack_tables import StackTables
from snapviz.model import A_ALLOC, Snapshot


def top_live(replay: ReplayResult, labels: np.ndarray, sites: SiteNamer, row: int, limit: int = 25) -> pd.DataFrame:
    live = live_at(replay, row)
    if not len(live):
        return pd.DataFrame(columns=["row", "addr", "bytes", "requested_bytes", "stage", "site", "stack_id", "time_us"])
    rows = live.index.to_numpy()
    out = pd.DataFrame(
        {
            "row": rows,
            "addr": live["addr"].to_numpy(),
            "bytes": live["block_size"].to_numpy(),
            "requested_bytes": live["size"].to_numpy(),
            "stage": labels[rows],
            "stack_id": live["stack_id"].to_numpy(),
            "time_us": live["time_us"].to_numpy(),
        }
    ).sort_values(["bytes", "row"], ascending=[False, True], kind="stable")
    out = out.head(limit).reset_index(drop=True)
    out.insert(5, "site", [sites.site(int(s)) for s in out["stack_id"]])
    return out


def stage_live_sets(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    stages: pd.DataFrame,
    sites: SiteNamer,
    rules: RuleSet,
    tables: StackTables,
    top_n: int = 5,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What was live at each stage interval's own peak: bytes by category, and the largest
    blocks the stage itself allocated.

    Allocations are categorised once; each stage is then one vectorized mask.
    """
    ev = rep.events
    alloc_rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    empty = (
        pd.DataFrame(columns=["interval", "stage", "category", "bytes", "count"]),
        pd.DataFrame(columns=["interval", "stage", "bytes", "site", "row", "stack_id"]),
    )
    if not len(alloc_rows) or not len(stages):
        return empty
    cats = categorize_allocs(snap, rep, labels, alloc_rows, rules, tables)
    frees = ev["free_row"].to_numpy()[alloc_rows]
    sizes = ev["block_size"].to_numpy()[alloc_rows]
    stacks = ev["stack_id"].to_numpy()[alloc_rows]
    # Categories factorized once, sorted (the order a groupby gives); each stage is then a
    # mask and two bincounts (sums stay exact in float64: a device's bytes are far below 2**53).
    ccodes, cnames = pd.factorize(cats, sort=True)
    known = ccodes >= 0
    live_rows, top_rows = [], []
    for k, (name, prow, srow) in enumerate(
        zip(stages["name"].tolist(), stages["peak_row"].tolist(), stages["start_row"].tolist(), strict=True)
    ):
        if prow < 0:
            continue
        m = (alloc_rows <= prow) & (frees > prow)
        if not m.any():
            continue
        mk = m & known
        count = np.bincount(ccodes[mk], minlength=len(cnames))
        total = np.bincount(ccodes[mk], weights=sizes[mk], minlength=len(cnames))
        for c in np.flatnonzero(count).tolist():
            live_rows.append((k, name, cnames[c], int(total[c]), int(count[c])))
        # The stage's own allocations: what it added on top of what it inherited.
        idx = np.flatnonzero(m & (alloc_rows >= srow))
        for j in idx[np.argsort(-sizes[idx], kind="stable")[:top_n]]:
            top_rows.append((k, name, int(sizes[j]), sites.site(int(stacks[j])), int(alloc_rows[j]), int(stacks[j])))
    return (
        pd.DataFrame(live_rows, columns=empty[0].columns) if live_rows else empty[0],
        pd.DataFrame(top_rows, columns=empty[1].columns) if top_rows else empty[1],
    )
