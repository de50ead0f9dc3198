"""Categories of memory: weights, activations, attention scores, latents, VAE buffers…

Decided per allocation from its frames and its lifetime, all vectorized (per unique
stack, then gathers):

1. score matrices (see :mod:`snapviz.analyses.attention`) -> ``attention scores``;
2. the highest-priority ``kind: "category"`` rule matching the stack, among rules whose
   ``lifetime`` fits: *short* = freed inside the stage interval it was born in (one
   denoising step, one text encoding), *long* = outlives it or is never freed;
3. an allocation without Python frames in a run that shows ``backward`` or
   ``torch/optim`` frames is the autograd engine thread's -> ``gradients & optimizer``;
4. otherwise by the stage it was born in: ``load`` long -> weights (built or loaded and
   alive across stages); ``text_encode``/``denoise`` short -> activations, long ->
   latents & embeddings; ``vae_decode`` -> vae buffers; the generic ``forward`` ->
   activations, ``backward``/``optimizer``/``zero_grad`` -> gradients & optimizer;
   anything else -> unknown.

Memory allocated before the recorded window is ``before recording``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.decimate import decimate_minmax
from snapviz.analyses.frame_rules import RuleSet, load_rules
from snapviz.analyses.replay import ReplayResult, live_at
from snapviz.analyses.score_evidence import ATTENTION_CATEGORY, score_alloc_mask
from snapviz.analyses.stack_tables import StackTables
from snapviz.arrays import unique
from snapviz.model import A_ALLOC, Snapshot
from snapviz.vocab import BEFORE_RECORDING, stage_group

CATEGORIES = (
    "weights",
    "attention scores",
    "activations",
    "latents & embeddings",
    "vae buffers",
    "gradients & optimizer",
    "unknown",
)
_CODE = {c: i for i, c in enumerate(CATEGORIES)}
# Fallback by the stage group an allocation was born in: (short-lived, long-lived).
_BY_STAGE = {
    "load": ("activations", "weights"),
    "text_encode": ("activations", "latents & embeddings"),
    "denoise": ("activations", "latents & embeddings"),
    "vae_decode": ("vae buffers", "vae buffers"),
    # generic PyTorch phases (snapviz.analyses.phases): what outlives a forward is kept for backward
    "forward": ("activations", "activations"),
    "backward": ("gradients & optimizer", "gradients & optimizer"),
    "optimizer": ("gradients & optimizer", "gradients & optimizer"),
    "zero_grad": ("gradients & optimizer", "gradients & optimizer"),
}


def _intervals(labels: np.ndarray) -> np.ndarray:
    """Id of the contiguous run of equal labels each event belongs to."""
    n = len(labels)
    if not n:
        return np.zeros(0, np.int64)
    return np.r_[0, np.cumsum(labels[1:] != labels[:-1])].astype(np.int64)


def category_names(rules: RuleSet) -> tuple[str, ...]:
    """CATEGORIES plus any new category a user rule names (in rule order)."""
    extra = [r.name for r in rules.of_kind("category") if r.name not in _CODE]
    return CATEGORIES + tuple(dict.fromkeys(extra))


def stack_category_rules(
    rules: RuleSet, tables: StackTables, exclude: tuple[str, ...] = ()
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per stack, the category a rule gives a short-lived and a long-lived allocation.

    Returns (short, long, names): codes into ``names`` (-1: no rule).
    """
    cat_rules = [r for r in rules.of_kind("category") if r.name not in exclude]
    names = list(dict.fromkeys(r.name for r in cat_rules))
    out = []
    for life in ("short", "long"):
        sub = tuple(r for r in cat_rules if r.lifetime in ("any", life))
        best = tables.best_rule(sub)
        codes = np.array([names.index(r.name) for r in sub] + [-1], np.int64)
        out.append(codes[best])
    return out[0], out[1], names


def training_evidence(rules: RuleSet, tables: StackTables) -> bool:
    """Frames of the ``backward`` or ``optimizer`` phase (see :mod:`snapviz.analyses.phases`):
    allocations without Python frames are then the autograd engine thread's (gradients)."""
    probe = [r for r in rules.of_kind("phase") if r.name in ("backward", "optimizer")]
    return bool(tables.rules_mask(probe).any())


def _category_codes(
    snap: Snapshot, rep: ReplayResult, labels: np.ndarray, rows: np.ndarray, rules: RuleSet, tables: StackTables
) -> np.ndarray:
    """Index into ``category_names(rules)`` for each alloc row in ``rows``."""
    ev = rep.events
    n = len(ev)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(len(rows), _CODE["unknown"], np.int64)
    if not len(rows):
        return out
    stack = ev["stack_id"].to_numpy()[rows].astype(np.int64)
    free = ev["free_row"].to_numpy()[rows]
    iv = _intervals(labels)
    short = (free < n) & (iv[np.minimum(free, n - 1)] == iv[rows])

    # 4. by the stage of birth (one Python call per distinct label, not per event).
    lab_codes, lab_uniques = pd.factorize(pd.Series(labels[rows], dtype=object))
    fb_short = np.array(
        [_CODE[_BY_STAGE.get(stage_group(str(u)), ("unknown", "unknown"))[0]] for u in lab_uniques]
        + [_CODE["unknown"]],
        np.int64,
    )
    fb_long = np.array(
        [_CODE[_BY_STAGE.get(stage_group(str(u)), ("unknown", "unknown"))[1]] for u in lab_uniques]
        + [_CODE["unknown"]],
        np.int64,
    )
    out = np.where(short, fb_short[lab_codes], fb_long[lab_codes])

    if len(snap.stacks):
        ns = len(snap.stacks)
        sc = np.clip(stack, 0, ns - 1)
        python = (stack >= 0) & tables.has_python[sc]
        # 3. the autograd engine thread has no Python frames.
        if training_evidence(rules, tables):
            out = np.where(~python, _CODE["gradients & optimizer"], out)
        # 2. category rules.
        c_short, c_long, names = stack_category_rules(rules, tables, exclude=(ATTENTION_CATEGORY,))
        if names:
            all_names = category_names(rules)
            name_code = np.array([all_names.index(nm) for nm in names], np.int64)
            rule = np.where(short, c_short[sc], c_long[sc])
            rule = np.where(python, rule, -1)
            hit = rule >= 0
            out = np.where(hit, name_code[np.clip(rule, 0, None)], out)
    # 1. score matrices.
    att = score_alloc_mask(snap, ev, rules, tables, rows)
    out = np.where(att, _CODE["attention scores"], out)
    return out


def categorize_blocks(
    snap: Snapshot, stack_ids: np.ndarray, stages: np.ndarray, rules: RuleSet, tables: StackTables
) -> np.ndarray:
    """Category (str) of blocks live in the end state, from their frames alone (no history:
    no lifetime, no score-matrix evidence). They outlive everything recorded, so rules and the
    stage fallback take their *long-lived* choice; steps 2-4 of the module docstring."""
    names = np.array(category_names(rules), dtype=object)
    stack = np.asarray(stack_ids, dtype=np.int64)
    codes, uniq = pd.factorize(pd.Series(np.asarray(stages, dtype=object), dtype=object))
    fb = np.array(
        [_CODE[_BY_STAGE.get(stage_group(str(u)), ("unknown", "unknown"))[1]] for u in uniq] + [_CODE["unknown"]],
        np.int64,
    )
    out = fb[codes] if len(stack) else np.empty(0, np.int64)
    if len(snap.stacks) and len(stack):
        sc = np.clip(stack, 0, len(snap.stacks) - 1)
        python = (stack >= 0) & tables.has_python[sc]
        if training_evidence(rules, tables):
            out = np.where(~python & (stack >= 0), _CODE["gradients & optimizer"], out)
        _, c_long, cnames = stack_category_rules(rules, tables, exclude=(ATTENTION_CATEGORY,))
        if cnames:
            name_code = np.array([list(names).index(nm) for nm in cnames], np.int64)
            rule = np.where(python, c_long[sc], -1)
            out = np.where(rule >= 0, name_code[np.clip(rule, 0, None)], out)
    return names[out]


def categorize_allocs(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    rows: np.ndarray,
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
) -> np.ndarray:
    """Category (str) of each alloc row in ``rows`` (built-in rules unless ``rules``)."""
    rules = rules if rules is not None else load_rules()
    tables = tables if tables is not None else StackTables(snap)
    names = np.array(category_names(rules), dtype=object)
    return names[_category_codes(snap, rep, labels, rows, rules, tables)]


def categorize_live(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    row: int,
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
) -> pd.DataFrame:
    """Bytes and count live at ``row`` by category (the baseline counts as 'before recording')."""
    live = live_at(rep, row)
    rows = live.index.to_numpy()
    cats = categorize_allocs(snap, rep, labels, rows, rules, tables) if len(rows) else np.empty(0, object)
    df = pd.DataFrame({"category": cats, "bytes": live["block_size"].to_numpy()})
    out = df.groupby("category", sort=False)["bytes"].agg(["sum", "size"]).reset_index()
    out.columns = ["category", "bytes", "count"]
    if rep.baseline_allocated:
        out = pd.concat(
            [out, pd.DataFrame([{"category": BEFORE_RECORDING, "bytes": rep.baseline_allocated, "count": 0}])]
        )
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def category_timeline(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    max_points: int = 20000,
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
) -> pd.DataFrame:
    """Bytes live per category after each sampled event row, ready for a stacked area.

    Columns: ``row``, ``time_us``, ``stage``, ``allocated``, one per category (CATEGORIES,
    then any other a rule names that this run allocates), and ``before recording`` (memory from before the recorded window:
    ``allocated`` minus the categories, so each row's categories add up to ``allocated``).
    Computed with one cumulative sum per category over all events.
    """
    ev = rep.events
    n = len(ev)
    rules = rules if rules is not None else load_rules()
    tables = tables if tables is not None else StackTables(snap)
    names = category_names(rules)
    if not n:
        return pd.DataFrame(columns=["row", "time_us", "stage", "allocated", *CATEGORIES, BEFORE_RECORDING])
    allocated = ev["allocated"].to_numpy().astype(np.int64)
    rows_out = decimate_minmax(np.arange(n), allocated, max_points=max_points)
    arows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    codes = _category_codes(snap, rep, labels, arows, rules, tables)
    # a rule's own category (weights: T5, rotary embeddings, a user's) is a column only where it occurs
    used = set(unique(codes).tolist())
    cols = [
        "row",
        "time_us",
        "stage",
        "allocated",
        *(c for i, c in enumerate(names) if i < len(CATEGORIES) or i in used),
        BEFORE_RECORDING,
    ]
    size = ev["block_size"].to_numpy()[arows].astype(np.float64)
    end = np.minimum(ev["free_row"].to_numpy()[arows], n)
    data: dict[str, np.ndarray] = {
        "row": rows_out,
        "time_us": ev["time_us"].to_numpy()[rows_out],
        "stage": labels[rows_out],
        "allocated": allocated[rows_out],
    }
    total = np.zeros(len(rows_out), np.int64)
    for ci, cat in enumerate(names):
        if cat not in cols:
            continue
        m = codes == ci
        if m.any():
            delta = np.bincount(arows[m], weights=size[m], minlength=n + 1)
            delta -= np.bincount(end[m], weights=size[m], minlength=n + 1)
            series = np.rint(np.cumsum(delta[:n])[rows_out]).astype(np.int64)
        else:
            series = np.zeros(len(rows_out), np.int64)
        data[cat] = series
        total += series
    data[BEFORE_RECORDING] = np.maximum(allocated[rows_out] - total, 0)
    return pd.DataFrame(data, columns=cols)
