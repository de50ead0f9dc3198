"""Which allocations are attention score matrices, and what says attention was fused.

Two kinds of evidence, both from frames:

1. **Named score functions**: the ``"attention scores"`` category rules (diffusers'
   ``get_attention_scores``, transformers' ``eager_attention_forward``, SDPA's math
   kernel ``_native_math_attention`` / ``_scaled_dot_product_attention_math``). Not every
   allocation inside them is a score matrix, so per function ("family") and per source
   line of that function:

   * a line counts if its largest allocation is at least a quarter of the family's
     largest (drops ``query.float()``/``key.float()`` upcasts, which are ``[bh, N, d]``);
   * if some line calls ``softmax`` through a Python frame, lines after the last such
     line are the output (``attn @ V``, ``.contiguous()``) and do not;
   * a family that allocates from a single line (a C++ kernel such as the math SDPA) is
     filtered per allocation by the same quarter-of-the-largest test.

2. **Softmax over what its caller just built**, for any model (hand-written
   ``softmax(q @ k.T)``, LLaMA's eager attention in old transformers, a user's own
   ``softmax``): a ``kind: "attention", name: "softmax"`` frame (``F.softmax``, a
   function named ``softmax``, ``at::_ops::_softmax``) has a caller: the first Python
   frame outside it. That caller frame, with the Python frames above it (the same code
   path), is a family; its allocations from lines up to the softmax line are score
   matrices when their size is the softmax output's, half of it or twice it (the matmul
   result, the scaled and masked copies, the softmax internals, in the same dtype, or
   16-bit scores under an fp32 softmax, or the reverse); ``q``/``k`` copies
   (``[…, L, d]``) and boolean masks differ unless ``d`` is ``L``, ``L/2`` or ``2L``.
   Allocations after the softmax line are not scores (``probs @ V``).

A ``kind: "attention", name: "fused"`` frame (SDPA flash / efficient / cuDNN kernels,
transformers' ``sdpa_attention_forward``, diffusers' attention dispatch and processors,
xFormers, flash-attn) is positive evidence of fused attention.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.frame_rules import Rule, RuleSet
from snapviz.analyses.sites import plumbing_frames
from snapviz.analyses.stack_tables import StackTables
from snapviz.arrays import unique
from snapviz.category_vocab import ATTENTION_SCORES
from snapviz.model import A_ALLOC, Snapshot

ATTENTION_CATEGORY = ATTENTION_SCORES
LINE_SHARE = 0.25
COLUMNS = ["stack_id", "function", "family", "line", "max_bytes", "is_score", "min_bytes", "softmax_bytes", "evidence"]


def _attention_rules(rules: RuleSet) -> tuple[Rule, ...]:
    return rules.of_kind("category", ATTENTION_CATEGORY)


def _alloc_max_by_stack(snap: Snapshot) -> pd.Series:
    """Largest requested size allocated per stack (every device)."""
    ev = snap.events
    alloc = ev["action"].to_numpy() == A_ALLOC
    return pd.Series(ev["size"].to_numpy()[alloc]).groupby(ev["stack_id"].to_numpy()[alloc]).max()


def _named_families(snap: Snapshot, rules: RuleSet, tables: StackTables, sizes: pd.Series) -> pd.DataFrame:
    att_rules = _attention_rules(rules)
    if not att_rules or not tables.n_frames:
        return pd.DataFrame(columns=COLUMNS)
    depth, fid = tables.innermost(tables.rules_mask(att_rules))
    stacks = np.flatnonzero(fid >= 0)
    if not len(stacks):
        return pd.DataFrame(columns=COLUMNS)
    fid, depth = fid[stacks], depth[stacks]
    hits = pd.DataFrame({"stack_id": stacks, "depth": depth})
    hits["function"] = tables.names[fid]
    hits["family"] = tables.names[fid].astype(str) + "@" + tables.files[fid].astype(str)
    hits["line"] = tables.lines[fid]
    # A Python softmax frame inside the score function marks the softmax line.
    smask = (
        (tables.names == "softmax") & np.char.endswith(tables.files.astype(str), "functional.py")
        if tables.n_frames
        else np.zeros(0, bool)
    )
    sdepth, _ = tables.innermost(smask)
    hits["softmax"] = (sdepth[stacks] >= 0) & (sdepth[stacks] < depth)
    hits["max_bytes"] = hits["stack_id"].map(sizes).fillna(0).astype(np.int64).to_numpy()
    fam_max = hits.groupby("family")["max_bytes"].transform("max")
    line_max = hits.groupby(["family", "line"])["max_bytes"].transform("max")
    keep = line_max >= LINE_SHARE * fam_max
    soft_line = hits["line"].where(hits["softmax"]).groupby(hits["family"]).transform("max")
    keep &= soft_line.isna() | (hits["line"] <= soft_line)
    n_lines = hits.groupby("family")["line"].transform("nunique")
    hits["is_score"] = keep.to_numpy()
    hits["min_bytes"] = np.where(n_lines.to_numpy() == 1, (LINE_SHARE * fam_max).astype(np.int64), 0)
    hits["softmax_bytes"] = 0
    hits["evidence"] = "function"
    return hits[COLUMNS]


def _softmax_families(snap: Snapshot, rules: RuleSet, tables: StackTables, sizes: pd.Series) -> pd.DataFrame:
    soft_rules = rules.of_kind("attention", "softmax")
    if not soft_rules or not tables.n_frames:
        return pd.DataFrame(columns=COLUMNS)
    smask = tables.rules_mask(soft_rules)
    soft_stacks = np.flatnonzero(tables.stacks_matching(soft_rules))
    if not len(soft_stacks):
        return pd.DataFrame(columns=COLUMNS)
    # Evidence that a softmax is attention's (see the module docstring): per stack.
    module_rules, qk_rules, not_qk_rules = (rules.of_kind("attention", k) for k in ("module", "qk", "not-qk"))
    module_st = tables.stacks_matching(module_rules) if module_rules else np.zeros(tables.n_stacks, bool)
    qk_st = tables.stacks_matching(qk_rules) if qk_rules else np.zeros(tables.n_stacks, bool)
    if not_qk_rules:
        qk_st &= ~tables.stacks_matching(not_qk_rules)
    plumbing = plumbing_frames(tables.files)
    py = [tuple(f for f in st if tables.is_python[f]) for st in snap.stacks]  # innermost first
    # family (caller function, file, Python frames above it) -> [softmax line, output bytes, module frames]
    families: dict[tuple[str, str, tuple[int, ...]], list[int]] = {}
    for sid in soft_stacks.tolist():
        st = snap.stacks[sid]
        outer = max(i for i, f in enumerate(st) if smask[f])
        # The caller: the first Python frame outside the softmax and outside torch's own
        # plumbing (nn.Softmax's forward, Module.__call__), i.e. the code that built its input.
        caller = next((f for f in st[outer + 1 :] if tables.is_python[f] and not smask[f] and not plumbing[f]), None)
        if caller is None:
            continue
        k = py[sid].index(caller)
        key = (str(tables.names[caller]), str(tables.files[caller]), py[sid][k + 1 :])
        cur = families.setdefault(key, [0, 0, 0])
        cur[0] = max(cur[0], int(tables.lines[caller]))
        cur[1] = max(cur[1], int(sizes.get(sid, 0)))
        cur[2] |= int(module_st[sid])
    rows = []
    for (name, file, chain), (soft_line, soft_bytes, module) in families.items():
        if soft_bytes <= 0:
            continue
        n = len(chain)
        members = []
        for sid, pf in enumerate(py):
            if len(pf) <= n or pf[len(pf) - n :] != chain:
                continue
            f = pf[len(pf) - n - 1]  # the family's own frame, just inside the chain
            if tables.names[f] != name or tables.files[f] != file or int(tables.lines[f]) > soft_line:
                continue
            members.append((sid, int(tables.lines[f])))
        # Attention evidence: attention code around the softmax, or a matrix product (Q·K^T)
        # of the softmax's size among what the caller built before it. Neither: a softmax of
        # something else (a GNN's node scores, a classifier's logits), not scores.
        size_of = [int(sizes.get(sid, 0)) for sid, _ in members]
        qk = any(
            qk_st[sid] and b in (soft_bytes, 2 * soft_bytes, soft_bytes // 2)
            for (sid, _), b in zip(members, size_of, strict=True)
        )
        if not (module or qk):
            continue
        why = "softmax+qk" if qk else "softmax+module"
        for (sid, line), b in zip(members, size_of, strict=True):
            rows.append((sid, name, f"{name}@{file}", line, b, True, 0, soft_bytes, why))
    return pd.DataFrame(rows, columns=COLUMNS)


def score_stack_table(snap: Snapshot, rules: RuleSet, tables: StackTables) -> pd.DataFrame:
    """One row per stack that may allocate a score matrix: ``stack_id``, ``function``,
    ``family``, ``line``, ``max_bytes``, ``is_score`` (stack-level verdict), ``min_bytes``
    (per allocation threshold) and ``evidence`` (``function``: a named score function;
    ``softmax``: allocations a softmax consumed in the same frame)."""
    key = ("score_stacks", _attention_rules(rules), rules.of_kind("attention", "softmax"))
    hit = tables.results.get(key)
    if hit is not None:
        return hit
    sizes = _alloc_max_by_stack(snap)
    named = _named_families(snap, rules, tables, sizes)
    soft = _softmax_families(snap, rules, tables, sizes)
    soft = soft[~soft["stack_id"].isin(named["stack_id"])] if len(named) else soft
    parts = [t for t in (named, soft) if len(t)]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    tables.results[key] = out
    return out


def score_alloc_mask(
    snap: Snapshot, ev: pd.DataFrame, rules: RuleSet, tables: StackTables, rows: np.ndarray | None = None
) -> np.ndarray:
    """Bool per row of ``ev`` (or of ``ev`` at ``rows``): an alloc of a score matrix."""
    t = score_stack_table(snap, rules, tables)
    stack = ev["stack_id"].to_numpy()
    action = ev["action"].to_numpy()
    size = ev["size"].to_numpy()
    if rows is not None:
        stack, action, size = stack[rows], action[rows], size[rows]
    if not len(t):
        return np.zeros(len(stack), bool)
    n_stacks = max(len(snap.stacks), 1)
    thresh = np.full(n_stacks, -1, np.int64)  # -1: not a score stack
    soft = np.zeros(n_stacks, np.int64)  # > 0: sizes must match this softmax output
    ok = t["is_score"].to_numpy().astype(bool)
    ids = t["stack_id"].to_numpy()[ok].astype(np.int64)
    thresh[ids] = t["min_bytes"].to_numpy()[ok].astype(np.int64)
    soft[ids] = t["softmax_bytes"].to_numpy()[ok].astype(np.int64)
    sc = np.clip(stack, 0, n_stacks - 1)
    th = np.where(stack >= 0, thresh[sc], -1)
    b = np.where(stack >= 0, soft[sc], 0)
    size = size.astype(np.int64)
    size_ok = np.where(b > 0, (size == b) | (2 * size == b) | (size == 2 * b), size >= th)
    return (action == A_ALLOC) & (th >= 0) & size_ok


def fused_evidence(rules: RuleSet, tables: StackTables, stack_ids: np.ndarray) -> list[str]:
    """Names of the frames, among ``stack_ids``' stacks, that say attention ran fused."""
    fused = rules.of_kind("attention", "fused")
    if not fused or not tables.n_frames:
        return []
    _, fid = tables.innermost(tables.rules_mask(fused))
    sids = unique(stack_ids[(stack_ids >= 0) & (stack_ids < tables.n_stacks)])
    hit = fid[sids] if len(sids) else np.empty(0, np.int64)
    hit = unique(hit[hit >= 0])
    return [f"{tables.names[f]}" for f in hit]
