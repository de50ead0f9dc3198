"""Allocation sites across runs: each site's bytes per run, matched by source line, and which
changed most."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from snapviz.analyses.digest import RunDigest


def compare_sites(digests: Sequence[RunDigest]) -> pd.DataFrame:
    """Sites of every run matched by site string; status of each other run vs the base."""
    cols = [
        "site",
        "run",
        "label",
        "allocs",
        "total_bytes",
        "peak_live_bytes",
        "delta_total_bytes",
        "delta_peak_live_bytes",
        "status",
    ]
    frames = [d.sites.assign(run=i, label=d.label) for i, d in enumerate(digests) if len(d.sites)]
    if not frames:
        return pd.DataFrame(columns=cols)
    allr = pd.concat(frames, ignore_index=True)
    sites = list(dict.fromkeys(allr["site"].tolist()))
    full = pd.MultiIndex.from_product([sites, range(len(digests))], names=["site", "run"])
    t = allr.set_index(["site", "run"])[["allocs", "total_bytes", "peak_live_bytes"]].reindex(full)
    present = t["allocs"].notna().to_numpy().reshape(len(sites), len(digests))
    vals = {
        c: t[c].fillna(0).to_numpy(np.int64).reshape(len(sites), len(digests))
        for c in ("allocs", "total_bytes", "peak_live_bytes")
    }
    d_total = vals["total_bytes"] - vals["total_bytes"][:, :1]
    d_live = vals["peak_live_bytes"] - vals["peak_live_bytes"][:, :1]
    status = np.full((len(sites), len(digests)), "same", dtype=object)
    main = np.where(d_live != 0, d_live, d_total)
    status[main > 0] = "grew"
    status[main < 0] = "shrank"
    status[present & ~present[:, :1]] = "appeared"
    status[~present & present[:, :1]] = "vanished"
    status[~present & ~present[:, :1]] = "absent"
    no_sites = np.array([len(d.sites) == 0 for d in digests])  # trace-only runs: sites unknown, not vanished
    status[:, no_sites | no_sites[0]] = "n/a"
    status[:, 0] = "base"
    out = pd.DataFrame(
        {
            "site": np.repeat(np.array(sites, dtype=object), len(digests)),
            "run": np.tile(np.arange(len(digests)), len(sites)),
            "label": np.tile(np.array([d.label for d in digests], dtype=object), len(sites)),
            "allocs": vals["allocs"].ravel(),
            "total_bytes": vals["total_bytes"].ravel(),
            "peak_live_bytes": vals["peak_live_bytes"].ravel(),
            "delta_total_bytes": d_total.ravel(),
            "delta_peak_live_bytes": d_live.ravel(),
            "status": status.ravel(),
        }
    )
    return out[cols]


def changed_sites(sites: pd.DataFrame, limit: int = 25) -> list[str]:
    """Sites that grew, shrank, appeared or vanished in some run, biggest change first."""
    if not len(sites):
        return []
    others = sites[sites["run"] > 0]
    ch = others[others["status"].isin(["grew", "shrank", "appeared", "vanished"])]
    if not len(ch):
        return []
    score = np.maximum(ch["delta_peak_live_bytes"].abs().to_numpy(), ch["delta_total_bytes"].abs().to_numpy())
    best = (
        pd.Series(score, index=ch["site"].to_numpy()).groupby(level=0).max().sort_values(ascending=False, kind="stable")
    )
    return best.index[:limit].tolist()
