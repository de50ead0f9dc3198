"""Training categories: parameters, gradients, optimizer state, saved activations, autocast
weight copies, temporaries.

Decided per allocation from the phases it was born and freed in (``forward``, ``backward``,
``optimizer``, ``zero_grad``, ``load``; labels as ``snapviz collect --train`` writes them):

* born in ``load`` and outliving it -> ``parameters`` (weights, EMA copies, fixed inputs);
* born in ``backward``, outliving it, and freed by ``zero_grad`` or (``set_to_none=False``
  keeps them) of a parameter's exact size -> ``gradients``;
* born in ``optimizer`` and outliving that phase -> ``optimizer state`` (moments, 8-bit states
  and their quantization maps, step counters);
* born in ``forward`` and freed in a ``backward`` -> ``saved activations``, except the low-
  precision copies autocast makes of each weight (``autocast weight copies``: freed the same
  way, allocated by ``nn.Linear``/``nn.Conv*`` with exactly half a parameter's size);
* freed in the phase interval it was born in -> ``temporaries`` (foreach optimizer lists,
  activations recomputed by checkpointing, backward workspace);
* anything else -> ``other`` (each thread's cuBLAS workspace, the loss, the GradScaler's scale).

Pure functions of the replay and the labels; nothing here reads run.json.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.replay import ReplayResult
from snapviz.arrays import unique
from snapviz.model import A_ALLOC, Snapshot
from snapviz.vocab import stage_group

TRAINING_CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer state",
    "saved activations",
    "autocast weight copies",
    "temporaries",
    "other",
)
_WEIGHT_OPS = ("torch/nn/modules/linear.py", "torch/nn/modules/conv.py")
# autocast copies every Linear/Conv weight: matches are counted only when they cover this
# share of the parameters' half size (measured: 0.99 on SD 1.5 AMP), so activations of a
# coincidental size (0.40 of it on SDXL LoRA, whose frozen base is already fp16) do not count
_AUTOCAST_COVERAGE = 0.75


def _innermost_files(snap: Snapshot, stack_ids: np.ndarray) -> np.ndarray:
    """Filename of the innermost frame of each stack ('' without frames)."""
    files = snap.frames["filename"].to_numpy() if len(snap.frames) else np.empty(0, object)
    out = np.full(len(stack_ids), "", dtype=object)
    for sid in unique(stack_ids):
        if 0 <= sid < len(snap.stacks) and snap.stacks[sid]:
            out[stack_ids == sid] = files[snap.stacks[sid][0]]
    return out


def classify_allocations(snap: Snapshot, rep: ReplayResult, labels: np.ndarray) -> pd.DataFrame:
    """One row per recorded allocation: ``row``, ``free_row``, ``size`` (requested),
    ``block_size``, ``born`` / ``freed`` (phase labels; ``freed`` is '' if never) and
    ``category`` (one of :data:`TRAINING_CATEGORIES`)."""
    ev = rep.events
    rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    n = len(ev)
    free_row = ev["free_row"].to_numpy()[rows]
    born = labels[rows].astype(object)
    freed = np.where(free_row < n, labels[np.minimum(free_row, n - 1)], "").astype(object)
    born_g = np.array([stage_group(str(s)) for s in born], dtype=object)
    freed_g = np.array([stage_group(str(s)) if s else "" for s in freed], dtype=object)
    # the contiguous label interval each event belongs to: "freed in the interval it was born in"
    interval = np.r_[0, np.cumsum(labels[1:] != labels[:-1])] if n else np.zeros(0, np.int64)
    same_interval = (free_row < n) & (interval[rows] == interval[np.minimum(free_row, n - 1)])
    size = ev["size"].to_numpy()[rows]

    cat = np.full(len(rows), "other", dtype=object)
    cat[(born_g == "load") & ~same_interval] = "parameters"
    param_sizes = unique(size[cat == "parameters"])
    # freed by zero_grad(set_to_none=True), or (kept and zeroed) the size of a parameter; what
    # else backward leaves alive for good is the autograd thread's cuBLAS workspace
    grads = (born_g == "backward") & ~same_interval & ((freed_g == "zero_grad") | np.isin(size, param_sizes))
    cat[grads] = "gradients"
    cat[(born_g == "optimizer") & ~same_interval] = "optimizer state"
    saved = (born_g == "forward") & (freed_g == "backward")
    cat[saved] = "saved activations"
    cat[same_interval] = "temporaries"

    params = cat == "parameters"
    halves = np.isin(size * 2, param_sizes) & saved & (size > 0)
    if halves.any():
        files = _innermost_files(snap, ev["stack_id"].to_numpy()[rows[halves]])
        by_weight_op = np.array([f.endswith(_WEIGHT_OPS) for f in files], dtype=bool)
        idx = np.flatnonzero(halves)[by_weight_op]
        # per forward interval, as autocast fills its cache anew in every forward; at most as
        # many copies of a size as there are parameters of twice that size
        sizes, counts = np.unique(size[params], return_counts=True)
        per_size = dict(zip(sizes.tolist(), counts.tolist(), strict=True))
        for iv in unique(interval[rows[idx]]):
            pick = idx[interval[rows[idx]] == iv]
            taken: dict[int, int] = {}
            keep = []
            for i in pick.tolist():
                k = int(size[i])
                if taken.get(k, 0) < per_size.get(2 * k, 0):
                    taken[k] = taken.get(k, 0) + 1
                    keep.append(i)
            if size[keep].sum() >= _AUTOCAST_COVERAGE * size[params].sum() / 2:
                cat[keep] = "autocast weight copies"
    return pd.DataFrame(
        {
            "row": rows,
            "free_row": free_row,
            "size": size,
            "block_size": ev["block_size"].to_numpy()[rows],
            "born": born,
            "freed": freed,
            "category": cat,
        }
    )


def live_by_category(allocs: pd.DataFrame, row: int, column: str = "size") -> dict[str, int]:
    """Bytes (``size`` requested, or ``block_size``) of each category live just after ``row``."""
    live = allocs[(allocs["row"] <= row) & (allocs["free_row"] > row)]
    sums = live.groupby("category")[column].sum()
    return {c: int(sums.get(c, 0)) for c in TRAINING_CATEGORIES}


def phase_categories(allocs: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """Per stage interval (``stages`` as :func:`snapviz.analyses.stages.stage_table` makes
    it): allocator bytes of each category live at the interval's peak and at its exit."""
    out = []
    for st in stages.itertuples(index=False):
        for when, row in (("peak", int(st.peak_row)), ("exit", int(st.end_row) - 1)):
            live = live_by_category(allocs, row, "block_size")
            out += [
                {"name": st.name, "group": st.group, "at": when, "category": c, "bytes": b} for c, b in live.items()
            ]
    return pd.DataFrame(out, columns=["name", "group", "at", "category", "bytes"])
