"""The allocation table: one row per recorded allocation, classified once.

:func:`allocation_table` builds it once per analysis (cached on
:class:`~snapviz.analyses.analysis.Analysis` as ``allocations``); every category view (at the
peak, per stage, over time, the picture's legend, the training phases) is a group-by of its
``category`` column, whose names are :mod:`snapviz.category_vocab`'s.

Each allocation's category is decided by one ordered chain, the first that decides wins
(all vectorized: per unique stack, then gathers):

1. a **user rule** (``kind: "category"`` in a ``--rules`` file) matching the stack, among rules
   whose ``lifetime`` fits: *short* = freed inside the stage interval it was born in (one
   denoising step, one text encoding), *long* = outlives it or is never freed;
2. **attention evidence**: a score matrix (:mod:`snapviz.analyses.score_evidence`) ->
   ``attention scores``;
3. **training lifetime**, in a run whose stages are training phases (a ``backward`` or
   ``optimizer`` stage): :func:`snapviz.analyses.training.classify_allocations`, mapped
   into the vocabulary (:data:`~snapviz.category_vocab.FROM_TRAINING`: parameters ->
   ``parameter``, saved activations -> ``activation``, temporaries -> ``temporary``...; its
   ``other`` does not decide);
4. the **stage of birth**, refined by frames: the built-in frame rules (``parameter: T5``,
   ``latents & embeddings``, ``vae buffers``...), and an allocation without Python frames in a
   run that shows ``backward`` or ``torch/optim`` frames is the autograd engine thread's ->
   ``autograd detail``; otherwise ``load`` long -> parameter (built or loaded and alive across
   stages), short -> temporary; ``text_encode``/``denoise`` short -> activation, long ->
   latents & embeddings; ``vae_decode`` -> vae buffers; ``forward`` -> activation (not in a
   training run, whose phases step 3 has judged); anything else -> unknown.

Memory allocated before the recorded window is ``before recording`` (the baseline: no row).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from snapviz.analyses.decimate import decimate_minmax
from snapviz.analyses.frame_rules import Rule, RuleSet, builtin_rules_text, load_rules
from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.score_evidence import ATTENTION_CATEGORY, score_alloc_mask
from snapviz.analyses.stack_tables import StackTables
from snapviz.analyses.training import classify_allocations
from snapviz.arrays import unique
from snapviz.category_vocab import (
    ACTIVATION,
    ATTENTION_SCORES,
    AUTOGRAD_DETAIL,
    CATEGORIES,
    FROM_TRAINING,
    LATENTS,
    PARAMETER,
    TEMPORARY,
    UNKNOWN,
    VAE_BUFFERS,
)
from snapviz.model import A_ALLOC, Snapshot
from snapviz.vocab import BEFORE_RECORDING, stage_group

_CODE = {c: i for i, c in enumerate(CATEGORIES)}
# Step 4, by the stage group an allocation was born in: (short-lived, long-lived).
_BY_STAGE = {
    "load": (TEMPORARY, PARAMETER),
    "text_encode": (ACTIVATION, LATENTS),
    "denoise": (ACTIVATION, LATENTS),
    "vae_decode": (VAE_BUFFERS, VAE_BUFFERS),
    # generic PyTorch phases (snapviz.analyses.phases): what outlives a forward is kept for backward
    "forward": (ACTIVATION, ACTIVATION),
}
TRAINING_GROUPS = frozenset({"backward", "optimizer"})  # stages that make a run a training run
ALLOCATION_COLUMNS = ("row", "free_row", "size", "block_size", "stack_id", "stream", "stage", "phase", "category")


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


def _is_builtin(rules: tuple[Rule, ...]) -> np.ndarray:
    """Which of ``rules`` are built-in rules as shipped (a user's file may extend, disable or
    replace them): compared field by field with the built-in file, without compiling it again."""
    raw = json.loads(builtin_rules_text()).get("rules") or []
    ship = {
        (
            r.get("id"),
            r.get("name"),
            r.get("function"),
            r.get("file"),
            int(r.get("priority", 0)),
            r.get("lifetime", "any"),
        )
        for r in raw
        if r.get("kind") == "category"
    }
    return np.array([(r.id, r.name, r.function, r.file, r.priority, r.lifetime) in ship for r in rules], bool)


def _split_rules(rules: RuleSet) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
    """(built-in, user) category rules of ``rules``."""
    cat = rules.of_kind("category")
    b = _is_builtin(cat)
    return tuple(r for r, x in zip(cat, b, strict=True) if x), tuple(r for r, x in zip(cat, b, strict=True) if not x)


def stack_category_rules(
    rules: RuleSet, tables: StackTables, exclude: tuple[str, ...] = (), only: tuple[Rule, ...] | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per stack, the category a rule gives a short-lived and a long-lived allocation
    (``only``: among these category rules, default all of ``rules``).

    Returns (short, long, names): codes into ``names`` (-1: no rule).
    """
    pool = only if only is not None else rules.of_kind("category")
    cat_rules = [r for r in pool if r.name not in exclude]
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
    allocations without Python frames are then the autograd engine thread's."""
    probe = [r for r in rules.of_kind("phase") if r.name in ("backward", "optimizer")]
    return bool(tables.rules_mask(probe).any())


def _stage_fallback(labels: np.ndarray, training: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(short, long) category code of each event's stage of birth (one call per distinct label).
    In a training run the lifetime classifier has already judged the training phases: what it
    leaves undecided there is unknown, not an activation by default."""
    by_stage = {k: v for k, v in _BY_STAGE.items() if not (training and k == "forward")}
    lab_codes, uniq = pd.factorize(pd.Series(labels, dtype=object))
    picks = [by_stage.get(stage_group(str(u)), (UNKNOWN, UNKNOWN)) for u in uniq]
    fb_short = np.array([_CODE[p[0]] for p in picks] + [_CODE[UNKNOWN]], np.int64)
    fb_long = np.array([_CODE[p[1]] for p in picks] + [_CODE[UNKNOWN]], np.int64)
    return fb_short[lab_codes], fb_long[lab_codes]


def _apply_rules(
    out: np.ndarray,
    rules: RuleSet,
    tables: StackTables,
    only: tuple[Rule, ...],
    sc: np.ndarray,
    python: np.ndarray,
    short: np.ndarray,
    all_names: tuple[str, ...],
) -> np.ndarray:
    c_short, c_long, names = stack_category_rules(rules, tables, exclude=(ATTENTION_CATEGORY,), only=only)
    if not names:
        return out
    name_code = np.array([all_names.index(nm) for nm in names], np.int64)
    rule = np.where(short, c_short[sc], c_long[sc])
    rule = np.where(python, rule, -1)
    return np.where(rule >= 0, name_code[np.clip(rule, 0, None)], out)


def _groups(labels: np.ndarray) -> np.ndarray:
    """The stage group of each label (one call per distinct label)."""
    codes, uniq = pd.factorize(pd.Series(labels, dtype=object))
    return np.array([stage_group(u) for u in uniq] + [""], dtype=object)[codes]


def is_training_run(labels: np.ndarray) -> bool:
    """The stages are training phases: a ``backward`` or ``optimizer`` stage."""
    if not len(labels):
        return False
    return bool({stage_group(str(u)) for u in pd.unique(pd.Series(labels, dtype=object))} & TRAINING_GROUPS)


def allocation_table(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
) -> pd.DataFrame:
    """One row per recorded allocation, in event order: ``row`` (its alloc event), ``free_row``
    (its free event, ``len(events)`` if never), ``size`` (requested), ``block_size``,
    ``stack_id``, ``stream``, ``stage`` (label at birth), ``phase`` (its group) and ``category``
    (a ``pd.Categorical`` over :func:`category_names`, decided by the module's chain)."""
    rules = rules if rules is not None else load_rules()
    tables = tables if tables is not None else StackTables(snap)
    names = category_names(rules)
    ev = rep.events
    n = len(ev)
    rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC) if n else np.empty(0, np.int64)
    free = ev["free_row"].to_numpy()[rows].astype(np.int64)
    stack = ev["stack_id"].to_numpy()[rows].astype(np.int64)
    born = np.asarray(labels, dtype=object)[rows]
    codes = _classify(snap, rep, labels, rows, free, stack, rules, tables, names)
    stream = ev["stream"].to_numpy()[rows] if "stream" in ev.columns else np.zeros(len(rows), np.int64)
    return pd.DataFrame(
        {
            "row": rows,
            "free_row": free,
            "size": ev["size"].to_numpy()[rows],
            "block_size": ev["block_size"].to_numpy()[rows],
            "stack_id": stack,
            "stream": stream,
            "stage": born,
            "phase": _groups(born),
            "category": pd.Categorical.from_codes(codes, categories=list(names)),
        },
        columns=list(ALLOCATION_COLUMNS),
    )


def _classify(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    rows: np.ndarray,
    free: np.ndarray,
    stack: np.ndarray,
    rules: RuleSet,
    tables: StackTables,
    names: tuple[str, ...],
) -> np.ndarray:
    """Index into ``names`` for each alloc row (the chain of the module docstring, applied
    last step first so that each earlier step overrides)."""
    n = len(rep.events)
    if not len(rows):
        return np.empty(0, np.int64)
    iv = _intervals(labels)
    short = (free < n) & (iv[np.minimum(free, n - 1)] == iv[rows])
    training = is_training_run(labels)
    fb_short, fb_long = _stage_fallback(np.asarray(labels, dtype=object)[rows], training)
    out = np.where(short, fb_short, fb_long)
    ns = len(snap.stacks)
    sc = np.clip(stack, 0, max(ns - 1, 0))
    python = (stack >= 0) & tables.has_python[sc] if ns else np.zeros(len(rows), bool)
    builtin, user = _split_rules(rules)
    # 4. frames refine the stage of birth: the autograd engine thread has no Python frames
    if ns and training_evidence(rules, tables):
        out = np.where(~python, _CODE[AUTOGRAD_DETAIL], out)
    if ns:
        out = _apply_rules(out, rules, tables, builtin, sc, python, short, names)
    # 3. training lifetime
    if training:
        train = classify_allocations(snap, rep, labels)
        tc, tu = pd.factorize(train["category"])
        lookup = np.array([_CODE[new] if (new := FROM_TRAINING.get(str(u))) else -1 for u in tu] + [-1], np.int64)
        code = lookup[tc]
        out = np.where(code >= 0, code, out)
    # 2. score matrices
    att = score_alloc_mask(snap, rep.events, rules, tables, rows)
    out = np.where(att, _CODE[ATTENTION_SCORES], out)
    # 1. a user's rules
    if ns and user:
        out = _apply_rules(out, rules, tables, user, sc, python, short, names)
    return out


def categorize_blocks(
    snap: Snapshot, stack_ids: np.ndarray, stages: np.ndarray, rules: RuleSet, tables: StackTables
) -> np.ndarray:
    """Category (str) of blocks live in the end state, from their frames alone (no history:
    no lifetime, no score-matrix evidence, no training phases). They outlive everything
    recorded, so rules and the stage fallback take their *long-lived* choice; steps 1 and 4 of
    the module docstring."""
    names = category_names(rules)
    stack = np.asarray(stack_ids, dtype=np.int64)
    _, fb_long = _stage_fallback(np.asarray(stages, dtype=object))
    out = fb_long if len(stack) else np.empty(0, np.int64)
    if len(snap.stacks) and len(stack):
        sc = np.clip(stack, 0, len(snap.stacks) - 1)
        python = (stack >= 0) & tables.has_python[sc]
        if training_evidence(rules, tables):
            out = np.where(~python & (stack >= 0), _CODE[AUTOGRAD_DETAIL], out)
        never = np.zeros(len(stack), bool)
        for only in _split_rules(rules):
            out = _apply_rules(out, rules, tables, only, sc, python, never, names)
    return np.array(names, dtype=object)[out]


def live_mask(allocs: pd.DataFrame, row: int) -> np.ndarray:
    """Rows of the allocation table live just after event ``row``."""
    return (allocs["row"].to_numpy() <= row) & (allocs["free_row"].to_numpy() > row)


def live_categories(allocs: pd.DataFrame, row: int, baseline: int = 0) -> pd.DataFrame:
    """Bytes (allocator blocks) and count live just after ``row`` by category, largest first;
    ``baseline`` (memory from before the recording) is ``before recording``. The bytes add up
    to the allocated bytes at ``row``."""
    live = allocs[live_mask(allocs, row)] if row >= 0 else allocs.iloc[0:0]
    out = live.groupby("category", sort=False, observed=True)["block_size"].agg(["sum", "size"]).reset_index()
    out.columns = ["category", "bytes", "count"]
    out["category"] = out["category"].astype(object)
    out["bytes"] = out["bytes"].astype(np.int64)
    if baseline:
        out = pd.concat([out, pd.DataFrame([{"category": BEFORE_RECORDING, "bytes": int(baseline), "count": 0}])])
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def live_by_category(allocs: pd.DataFrame, row: int, column: str = "block_size") -> dict[str, int]:
    """Bytes (allocator ``block_size``, or ``size`` requested) of each category live just after
    ``row`` (every category of the table's vocabulary, zero where none is live)."""
    live = allocs[live_mask(allocs, row)]
    sums = live.groupby("category", sort=False, observed=False)[column].sum()
    return {str(c): int(sums.get(c, 0)) for c in allocs["category"].cat.categories}


def category_timeline(
    rep: ReplayResult, labels: np.ndarray, allocs: pd.DataFrame, max_points: int = 20000
) -> pd.DataFrame:
    """Bytes live per category after each sampled event row, ready for a stacked area.

    Columns: ``row``, ``time_us``, ``stage``, ``allocated``, one per category (CATEGORIES,
    then any other a rule names that this run allocates), and ``before recording`` (memory from
    before the recorded window: ``allocated`` minus the categories, so each row's categories add
    up to ``allocated``). One cumulative sum per category of the allocation table.
    """
    ev = rep.events
    n = len(ev)
    names = [str(c) for c in allocs["category"].cat.categories] if len(allocs.columns) else list(CATEGORIES)
    if not n:
        return pd.DataFrame(columns=["row", "time_us", "stage", "allocated", *CATEGORIES, BEFORE_RECORDING])
    allocated = ev["allocated"].to_numpy().astype(np.int64)
    rows_out = decimate_minmax(np.arange(n), allocated, max_points=max_points)
    arows = allocs["row"].to_numpy()
    codes = allocs["category"].cat.codes.to_numpy()
    # a rule's own category (parameter: T5, rotary embeddings, a user's) is a column only where it occurs
    used = set(unique(codes).tolist())
    cols = [
        "row",
        "time_us",
        "stage",
        "allocated",
        *(c for i, c in enumerate(names) if i < len(CATEGORIES) or i in used),
        BEFORE_RECORDING,
    ]
    size = allocs["block_size"].to_numpy().astype(np.float64)
    end = np.minimum(allocs["free_row"].to_numpy(), n)
    data: dict[str, np.ndarray] = {
        "row": rows_out,
        "time_us": ev["time_us"].to_numpy()[rows_out],
        "stage": np.asarray(labels)[rows_out],
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
