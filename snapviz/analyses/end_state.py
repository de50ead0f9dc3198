"""The end state as first-class input: the blocks live when the snapshot was taken, itemised
by their own frames.

Some files hold nothing else: ``_dump_snapshot`` with ``enabled="state"`` (or without
history), an OOM observer's dump, the torch 2.0 layout (blocks carry ``history`` frames and
there is no trace). Others start their history late: the memory from before the recording
is the replay's *baseline*, and those of its blocks still live at the end are in the end
state with their frames. Either way each live block is named like a recorded allocation:
its site (:class:`~snapviz.analyses.sites.SiteNamer`), its stage from the frame rules, its
category (:func:`~snapviz.analyses.categories.categorize_blocks`), and its memory pool
(``segment_pool_id``: the default pool, or a private pool of a CUDA graph or a ``MemPool``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from snapviz.analyses import document
from snapviz.analyses.categories import categorize_blocks
from snapviz.analyses.document import BeforeRecording, Pool, SiteBlocks
from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.frame_rules import RuleSet
from snapviz.analyses.phases import label_phases
from snapviz.analyses.replay import ReplayResult, live_at
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stack_tables import StackTables
from snapviz.model import A_ALLOC, A_FREE, A_FREE_DONE, A_FREE_REQ, Snapshot
from snapviz.vocab import BEFORE_RECORDING, END_STATE_ONLY, UNLABELLED, stage_group

DEFAULT_POOL = "0,0"
TOP_SITES = 10


@dataclass(frozen=True)
class EndState:
    """The device's live blocks at the end (largest first) and its memory pools."""

    blocks: pd.DataFrame  # addr, bytes, requested_bytes, stack_id, site, stage, category, pool, before_recording
    pools: pd.DataFrame  # pool, name, segments, reserved_bytes, allocated_bytes
    only: bool  # the file records no allocation or free of this device: the end state is all it holds


def pool_name(pool: str) -> str:
    """``0,0`` is the default pool; any other id is a private pool (a CUDA graph's or a MemPool's)."""
    if pool == DEFAULT_POOL:
        return "default pool"
    return f"private pool ({pool.replace(',', ', ')})"


def _stages(snap: Snapshot, stack_ids: np.ndarray, rules: RuleSet, tables: StackTables) -> np.ndarray:
    """Stage group of each block from its frames (pipeline rules, else generic phases)."""
    n = len(stack_ids)
    if not n:
        return np.empty(0, dtype=object)
    pseudo = pd.DataFrame(
        {"stack_id": stack_ids.astype(np.int32), "action": np.full(n, A_ALLOC, np.int8), "time_us": np.full(n, -1)}
    )
    labels = label_from_frames(snap, pseudo, rules, tables)
    if labels is None:
        labels = label_phases(pseudo, rules, tables, UNLABELLED)
    if labels is None:
        return np.full(n, UNLABELLED, dtype=object)
    # Blocks have no order in time: step numbers would mean nothing, the stage does; and a
    # block without frames says nothing (the labellers would lend it a neighbour's stage).
    out = np.array([stage_group(x) for x in labels], dtype=object)
    out[stack_ids < 0] = UNLABELLED
    return out


def end_state(snap: Snapshot, rep: ReplayResult, sites: SiteNamer, rules: RuleSet, tables: StackTables) -> EndState:
    """The end state of ``rep``'s device (see the module docstring)."""
    blocks, segs = snap.blocks, snap.segments
    dev = rep.device
    b = blocks[(blocks["device"] == dev) & (blocks["state"] == "active_allocated")] if len(blocks) else blocks
    ev = rep.events
    act = ev["action"].to_numpy() if len(ev) else np.empty(0, np.int8)
    only = not bool(np.isin(act, (A_ALLOC, A_FREE_REQ, A_FREE, A_FREE_DONE)).any())
    sg = segs[segs["device"] == dev] if len(segs) else segs
    pool_of_seg = sg["pool_id"].astype(str) if len(sg) else pd.Series(dtype=object)
    if len(b):
        addr = b["address"].to_numpy(np.int64)
        recorded = live_at(rep, len(ev) - 1)["addr"].to_numpy(np.int64) if len(ev) else np.empty(0, np.int64)
        sids = b["stack_id"].to_numpy(np.int64)
        stages = _stages(snap, sids, rules, tables)
        seg_idx = b["segment"].to_numpy(np.int64)
        pools = (
            segs["pool_id"].astype(str).to_numpy()[np.clip(seg_idx, 0, len(segs) - 1)]
            if len(segs)
            else np.full(len(b), DEFAULT_POOL, dtype=object)
        )
        out = pd.DataFrame(
            {
                "addr": addr,
                "bytes": b["size"].to_numpy(np.int64),
                "requested_bytes": b["requested_size"].to_numpy(np.int64),
                "stack_id": sids,
                "site": [sites.site(int(s)) for s in sids],
                "stage": stages,
                "category": categorize_blocks(snap, sids, stages, rules, tables),
                "pool": pools,
                "before_recording": ~np.isin(addr, recorded),
            }
        ).sort_values(["bytes", "addr"], ascending=[False, True], kind="stable")
    else:
        out = pd.DataFrame(
            columns=[
                "addr",
                "bytes",
                "requested_bytes",
                "stack_id",
                "site",
                "stage",
                "category",
                "pool",
                "before_recording",
            ]
        )
    pool_rows = []
    if len(sg):
        for pool, g in sg.groupby(pool_of_seg.to_numpy(), sort=True):
            pool_rows.append(
                {
                    "pool": str(pool),
                    "name": pool_name(str(pool)),
                    "segments": len(g),
                    "reserved_bytes": int(g["total_size"].sum()),
                    "allocated_bytes": int(g["allocated_size"].sum()),
                }
            )
    return EndState(blocks=out.reset_index(drop=True), pools=pd.DataFrame(pool_rows), only=only)


def end_state_top(es: EndState, limit: int = 25) -> pd.DataFrame:
    """The largest end-state blocks in :func:`~snapviz.analyses.live_sets.top_live`'s columns
    (``row`` -1: no event allocated them in the file)."""
    b = es.blocks.head(limit)
    return pd.DataFrame(
        {
            "row": np.full(len(b), -1, np.int64),
            "addr": b["addr"].to_numpy(np.int64),
            "bytes": b["bytes"].to_numpy(np.int64),
            "requested_bytes": b["requested_bytes"].to_numpy(np.int64),
            "stage": b["stage"].to_numpy(object),
            "site": b["site"].to_numpy(object),
            "stack_id": b["stack_id"].to_numpy(np.int64),
            "time_us": np.full(len(b), -1, np.int64),
        }
    )


def _by(df: pd.DataFrame, col: str) -> pd.DataFrame:
    if not len(df):
        return pd.DataFrame(columns=[col, "bytes", "count"])
    g = df.groupby(col, sort=False)["bytes"].agg(["sum", "size"]).reset_index()
    g.columns = [col, "bytes", "count"]
    return g.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def end_state_categories(es: EndState) -> pd.DataFrame:
    """Bytes and count of the end state by category (categorize_live's columns)."""
    return _by(es.blocks, "category")


def _framed_before(b: pd.DataFrame) -> pd.DataFrame:
    """Blocks from before the recording that carry frames (the others cannot be itemised)."""
    if not len(b):
        return b
    return b[b["before_recording"].astype(bool) & (b["stack_id"].to_numpy() >= 0)]


def split_before_recording(categories: pd.DataFrame, es: EndState | None) -> pd.DataFrame:
    """``categories`` (categorize_live's table) with its ``before recording`` row itemised: the
    blocks from before the recording still live at the end are live at every moment of the
    history, so they are ``before recording: <category>``; the rest (freed during the
    recording, or live without frames) stays ``before recording``."""
    if es is None or not len(categories) or BEFORE_RECORDING not in set(categories["category"]):
        return categories
    pre = _framed_before(es.blocks)
    if not len(pre):
        return categories
    total = int(categories.loc[categories["category"] == BEFORE_RECORDING, "bytes"].sum())
    parts = _by(pre, "category")
    if int(parts["bytes"].sum()) > total:  # an inconsistent file: keep the replay's figure whole
        return categories
    parts["category"] = [f"{BEFORE_RECORDING}: {c}" for c in parts["category"]]
    rest = total - int(parts["bytes"].sum())
    rows = [categories[categories["category"] != BEFORE_RECORDING], parts]
    if rest:
        rows.append(pd.DataFrame([{"category": BEFORE_RECORDING, "bytes": rest, "count": 0}]))
    out = pd.concat(rows, ignore_index=True)
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def _sites(df: pd.DataFrame, limit: int = TOP_SITES) -> list[SiteBlocks]:
    g = _by(df, "site").head(limit)
    return [
        SiteBlocks(site=str(s), bytes=int(b), count=int(c))
        for s, b, c in zip(g["site"].tolist(), g["bytes"].tolist(), g["count"].tolist(), strict=True)
    ]


def _bytes_by(df: pd.DataFrame, col: str) -> dict[str, int]:
    """Bytes by ``col``, largest first (:func:`_by`)."""
    g = _by(df, col)
    return {str(k): int(v) for k, v in zip(g[col].tolist(), g["bytes"].tolist(), strict=True)}


def end_state_doc(es: EndState, baseline_allocated: int) -> document.EndState:
    """The summary's ``end_state`` section (docs/json-schema.md)."""
    b = es.blocks
    pre = _framed_before(b)
    return document.EndState(
        only=bool(es.only),
        note=END_STATE_ONLY if es.only else None,
        live_bytes=int(b["bytes"].sum()) if len(b) else 0,
        blocks=int(len(b)),
        by_category=_bytes_by(b, "category"),
        by_stage=_bytes_by(b, "stage"),
        sites=_sites(b),
        pools=[
            Pool(
                pool=str(p.pool),
                name=str(p.name),
                segments=int(p.segments),
                reserved_bytes=int(p.reserved_bytes),
                allocated_bytes=int(p.allocated_bytes),
            )
            for p in es.pools.itertuples(index=False)
        ]
        if len(es.pools)
        else [],
        before_recording=BeforeRecording(
            bytes=int(baseline_allocated),
            itemised_bytes=int(pre["bytes"].sum()) if len(pre) else 0,
            by_category=_bytes_by(pre, "category"),
            sites=_sites(pre),
        ),
    )
