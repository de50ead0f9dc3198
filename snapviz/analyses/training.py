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

Without labels the phases come from frames (:mod:`snapviz.analyses.phases`), so the same rules
hold for any model; frames and lifetime add what labels cannot say:

* parameters allocated before the recording leave no sizes to match gradients against: the
  optimizer state's sizes stand in (Adam keeps one moment per parameter, in its shape);
* a never-freed allocation made by an optimizer (``torch/optim/``, bitsandbytes, transformers'
  Adafactor) is ``optimizer state`` whatever phase the labels put it in;
* DDP's gradient buckets (frames in ``torch/nn/parallel/distributed.py``: ``_ddp_init_helper``,
  the reducer's bucket rebuild in the first forwards) outliving their phase -> ``DDP gradient
  buckets``; FSDP's all-gather inputs and outputs (``torch/distributed/fsdp/`` frames of an
  ``all_gather`` / ``unshard`` function) -> ``FSDP all-gather buffers``; what it allocates to
  reduce-scatter gradients (``foreach_reduce``, ``reduce_scatter``, ``_reduce_grad``, FSDP1's
  ``_post_backward_hook``; the innermost of these and the gather functions decides) -> ``FSDP
  reduce-scatter buffers``, except the sharded output kept as the gradient (freed by ``zero_grad``:
  ``gradients``); its other allocations made at load and kept (each rank's shard of the
  parameters) -> ``FSDP sharded parameters``.

Pure functions of the replay and the labels; nothing here reads run.json.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.stack_tables import python_frames
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
    "DDP gradient buckets",
    "FSDP sharded parameters",
    "FSDP all-gather buffers",
    "FSDP reduce-scatter buffers",
    "other",
)
DDP_BUCKETS, FSDP_SHARDED = "DDP gradient buckets", "FSDP sharded parameters"
FSDP_GATHER, FSDP_REDUCE = "FSDP all-gather buffers", "FSDP reduce-scatter buffers"
_OPTIMIZER_FILES = re.compile(r"torch/optim/|bitsandbytes/(?:optim/|functional\.py)|transformers/optimization\.py")
_DDP_FILES = re.compile(r"torch/nn/parallel/distributed\.py$")
_FSDP_FILES = re.compile(r"torch/distributed/(?:fsdp|_composable/fsdp)/")
_DISTRIBUTED_FILES = re.compile(r"torch/(?:distributed|nn/parallel)/")
_GATHER_FUNCTIONS = re.compile(r"all_gather|unshard")
# FSDP1's ``_post_backward_hook`` casts the unsharded gradient to the reduce dtype before
# ``_reduce_grad`` reduce-scatters it
_REDUCE_FUNCTIONS = re.compile(r"reduce_scatter|foreach_reduce|_reduce_grad|^_post_backward_hook$")
# torch's generic tensor and storage methods: the innermost Python frame of an allocation they
# make on a caller's behalf (FSDP1's ``_alloc_storage`` resizes a storage through
# ``torch/storage.py``), never who asked for it
_PASS_THROUGH_FILES = re.compile(r"torch/(?:storage|_tensor|_utils)\.py$")
# the framework whose API the advice names, from the frames of the allocations
_FRAMEWORKS = (("diffusers", re.compile(r"(?:^|/)diffusers/")), ("transformers", re.compile(r"(?:^|/)transformers/")))
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


def _stacks_with(snap: Snapshot, files: re.Pattern[str], names: re.Pattern[str] | None = None) -> np.ndarray:
    """Bool per stack id: some frame's filename matches ``files`` (and its function ``names``)."""
    n = len(snap.stacks)
    if not n or not len(snap.frames) or not len(snap.stack_frames):
        return np.zeros(n, bool)
    fr = snap.frames
    hit = fr["filename"].astype(str).str.contains(files).to_numpy(bool, copy=True)
    if names is not None:
        hit &= fr["name"].astype(str).str.contains(names).to_numpy(bool)
    by_id = np.zeros(int(fr["frame_id"].max()) + 1, bool)
    by_id[fr["frame_id"].to_numpy()] = hit
    sf = snap.stack_frames
    return np.bincount(sf["stack_id"].to_numpy(), weights=by_id[sf["frame_id"].to_numpy()], minlength=n)[:n] > 0


def _innermost_python_file(snap: Snapshot) -> np.ndarray:
    """Per stack id, the filename of its innermost Python frame ('' without one): who made the
    allocation, as opposed to the wrappers (DDP, FSDP) every forward allocation runs under.
    torch's own tensor and storage methods (:data:`_PASS_THROUGH_FILES`) pass it on to their
    caller, unless the stack has no other Python frame."""
    n = len(snap.stacks)
    out = np.full(n, "", dtype=object)
    if not n or not len(snap.frames) or not len(snap.stack_frames):
        return out
    fr = snap.frames
    files = fr["filename"].astype(str).to_numpy()
    py = python_frames(files, fr["line"].to_numpy().astype(np.int64))
    file_of = np.full(int(fr["frame_id"].max()) + 1, "", dtype=object)
    is_py = np.zeros(len(file_of), bool)
    file_of[fr["frame_id"].to_numpy()] = files
    is_py[fr["frame_id"].to_numpy()] = py
    passing = np.zeros(len(file_of), bool)
    passing[fr["frame_id"].to_numpy()] = [bool(_PASS_THROUGH_FILES.search(f)) for f in files]
    sf = snap.stack_frames
    fid = sf["frame_id"].to_numpy()
    keep = is_py[fid]
    sid, depth, fid = sf["stack_id"].to_numpy()[keep], sf["depth"].to_numpy()[keep], fid[keep]
    order = np.lexsort((depth, passing[fid], sid))
    sid, fid = sid[order], fid[order]
    first = np.r_[True, sid[1:] != sid[:-1]] if len(sid) else np.zeros(0, bool)
    out[sid[first]] = file_of[fid[first]]
    return out


def _innermost_of(snap: Snapshot, files: re.Pattern[str], names: tuple[re.Pattern[str], ...]) -> np.ndarray:
    """Per stack id, the index into ``names`` of its innermost frame whose filename matches
    ``files`` and whose function one of ``names`` (the first that does), -1 where none does:
    which of a wrapper's jobs the allocation serves (FSDP1 prefetches the next all-gather from
    inside the hook that reduce-scatters a gradient)."""
    n = len(snap.stacks)
    out = np.full(n, -1, np.int64)
    if not n or not len(snap.frames) or not len(snap.stack_frames):
        return out
    fr = snap.frames
    in_files = fr["filename"].astype(str).str.contains(files).to_numpy(bool)
    fn = fr["name"].astype(str)
    role = np.full(len(fr), -1, np.int64)
    for i in reversed(range(len(names))):
        role[in_files & fn.str.contains(names[i]).to_numpy(bool)] = i
    role_of = np.full(int(fr["frame_id"].max()) + 1, -1, np.int64)
    role_of[fr["frame_id"].to_numpy()] = role
    sf = snap.stack_frames
    r = role_of[sf["frame_id"].to_numpy()]
    keep = r >= 0
    sid, depth, r = sf["stack_id"].to_numpy()[keep], sf["depth"].to_numpy()[keep], r[keep]
    order = np.lexsort((depth, sid))
    sid, r = sid[order], r[order]
    first = np.r_[True, sid[1:] != sid[:-1]] if len(sid) else np.zeros(0, bool)
    out[sid[first]] = r[first]
    return out


def _rows_with(per_stack: np.ndarray, stack_ids: np.ndarray) -> np.ndarray:
    """Gather per-stack flags for events (stack id -1, no frames: False)."""
    if not len(per_stack):
        return np.zeros(len(stack_ids), bool)
    ok = (stack_ids >= 0) & (stack_ids < len(per_stack))
    return ok & per_stack[np.clip(stack_ids, 0, len(per_stack) - 1)]


def framework(snap: Snapshot, stack_ids: np.ndarray) -> str:
    """``diffusers``, ``transformers`` or ``torch``: the library most of these allocations'
    stacks pass through (the one whose API a piece of advice should name)."""
    counts = {name: int(_rows_with(_stacks_with(snap, pat), stack_ids).sum()) for name, pat in _FRAMEWORKS}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] > 0 else "torch"


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
    sids = ev["stack_id"].to_numpy().astype(np.int64)[rows]
    never_freed = free_row >= n

    cat = np.full(len(rows), "other", dtype=object)
    cat[(born_g == "load") & ~same_interval] = "parameters"
    by_optimizer = _rows_with(_stacks_with(snap, _OPTIMIZER_FILES), sids)
    state = ~same_interval & ((born_g == "optimizer") | (by_optimizer & never_freed & (born_g != "load")))
    # parameters allocated before the recording leave nothing to match: the optimizer's state
    # (one moment per parameter, in its shape) stands in for their sizes
    param_sizes = unique(size[cat == "parameters"])
    grad_sizes = unique(np.r_[param_sizes, size[state]])
    # freed by zero_grad(set_to_none=True), or (kept and zeroed) the size of a parameter; what
    # else backward leaves alive for good is the autograd thread's cuBLAS workspace
    grads = (born_g == "backward") & ~same_interval & ((freed_g == "zero_grad") | np.isin(size, grad_sizes))
    cat[grads] = "gradients"
    cat[state] = "optimizer state"
    saved = (born_g == "forward") & (freed_g == "backward")
    cat[saved] = "saved activations"
    cat[same_interval] = "temporaries"
    # made by the data-parallel wrapper itself (its innermost Python frame), not by the module it wraps
    inner = _innermost_python_file(snap)
    own = np.array([bool(_DISTRIBUTED_FILES.search(f)) for f in inner], bool)
    ddp = own & np.array([bool(_DDP_FILES.search(f)) for f in inner], bool)
    fsdp = own & _stacks_with(snap, _FSDP_FILES)
    cat[_rows_with(ddp, sids) & ~same_interval] = DDP_BUCKETS
    cat[_rows_with(fsdp, sids) & (born_g == "load") & ~same_interval] = FSDP_SHARDED
    # the innermost of FSDP's gather and reduce functions says which the allocation serves
    job = _innermost_of(snap, _FSDP_FILES, (_GATHER_FUNCTIONS, _REDUCE_FUNCTIONS))
    cat[_rows_with(fsdp & (job == 0), sids)] = FSDP_GATHER
    # the reduce-scatter's sharded output is kept as the gradient; the rest is its buffers
    reducing = _rows_with(fsdp & (job == 1), sids)
    cat[reducing & ~grads] = FSDP_REDUCE

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
