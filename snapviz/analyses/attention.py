"""Attention score matrices: the allocations that materialize QK^T.

Diffusers materializes scores only in ``Attention.get_attention_scores`` (the
``baddbmm_input`` empty, the ``baddbmm`` result, the fp32 upcast, the softmax probs),
used by the classic and sliced processors; SDPA does not. Other materializing paths:
diffusers' ``_native_math_attention`` (SDPA's math kernel) and transformers'
``eager_attention_forward``. Which functions count comes from the ``"attention scores"``
category rules (snapviz/rules/diffusers.json).

Not every allocation inside those functions is a score matrix, so per function
("family") and per source line of that function:

* a line counts if its largest allocation is at least a quarter of the family's largest
  (drops ``query.float()``/``key.float()`` upcasts, which are ``[bh, N, d]``);
* if some line calls ``softmax`` through a Python frame (transformers' eager path), lines
  after the last such line are the output (``attn @ V``, ``.contiguous()``) and do not;
* a family that allocates from a single line (a C++ kernel such as the math SDPA) is
  filtered per allocation by the same quarter-of-the-largest test.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.frame_rules import RuleSet, rules_for, stack_tables
from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stages import stage_group
from snapviz.model import A_ALLOC, Snapshot

ATTENTION_CATEGORY = "attention scores"
SCORE_FUNCTIONS = frozenset({"get_attention_scores", "_native_math_attention", "eager_attention_forward"})
CROSS_KEYS = (77, 300, 226, 120, 512, 256, 333, 154)
DTYPE_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4, "float16": 2, "bfloat16": 2, "float32": 4}
LINE_SHARE = 0.25
# Attention heads of the denoisers (and of the VAE's mid-block attention: 1) by pipeline name.
PIPELINE_HEADS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("sdxl", (10, 20, 5)), ("pixart", (16,)), ("flux", (24,)), ("sd3", (24, 38)), ("sd2", (5, 10, 20)),
    ("sd15", (8,)), ("sd1", (8,)), ("stable-diffusion", (8,)), ("sd", (8,)),
)
GENERIC_HEADS = (8, 10, 20, 16, 24, 5, 12, 32, 1)
TEXT_HEADS = (12, 20, 64, 16, 32, 8)        # CLIP-L, OpenCLIP-bigG, T5-XXL, ...
TEXT_TOKENS = (77, 300, 512, 256, 226, 120)
IMPLEMENTATIONS = {
    "classic": "materialized: classic AttnProcessor (baddbmm + softmax score matrices)",
    "sliced": "materialized per slice: sliced attention (SlicedAttnProcessor)",
    "sdpa": "fused: SDPA (F.scaled_dot_product_attention)",
    "xformers": "fused: xFormers memory-efficient attention",
}
NONE_MATERIALIZED = "none materialized (SDPA/flash)"


# --- which allocations are score matrices ---------------------------------------------------------

def _attention_rules(rules: RuleSet) -> tuple[Any, ...]:
    return tuple(r for r in rules.of_kind("category") if r.name == ATTENTION_CATEGORY)


def score_stack_table(snap: Snapshot, rules_path: str | None = None) -> pd.DataFrame:
    """One row per stack inside a score function: ``stack_id``, ``function``, ``family``,
    ``line``, ``max_bytes``, ``is_score`` (stack-level verdict) and ``min_bytes`` (per
    allocation threshold; 0 unless the family allocates from a single line)."""
    cols = ["stack_id", "function", "family", "line", "max_bytes", "is_score", "min_bytes"]
    rules = rules_for(snap, rules_path)
    tables = stack_tables(snap)
    key = ("score_stacks", _attention_rules(rules))
    hit = tables.results.get(key)
    if hit is not None:
        return hit
    att_rules = _attention_rules(rules)
    if not att_rules or not tables.n_frames:
        out = pd.DataFrame(columns=cols)
        tables.results[key] = out
        return out
    fmask = np.zeros(tables.n_frames, bool)
    for r in att_rules:
        fmask |= tables.frame_mask(r)
    sel = fmask[tables.sf_frame]
    if not sel.any():
        out = pd.DataFrame(columns=cols)
        tables.results[key] = out
        return out
    # Innermost matching frame per stack.
    hits = pd.DataFrame({"stack_id": tables.sf_stack[sel], "depth": tables.sf_depth[sel], "frame_id": tables.sf_frame[sel]})
    hits = hits.sort_values(["stack_id", "depth"], kind="stable").drop_duplicates("stack_id")
    fr = snap.frames
    fid = hits["frame_id"].to_numpy()
    hits["function"] = fr["name"].to_numpy()[fid]
    hits["family"] = fr["name"].to_numpy()[fid].astype(str) + "@" + fr["filename"].to_numpy()[fid].astype(str)
    hits["line"] = fr["line"].to_numpy()[fid].astype(np.int64)
    # A Python softmax frame inside the score function marks the softmax line.
    names = fr["name"].to_numpy()
    files = fr["filename"].astype(str).to_numpy()
    smask = (names == "softmax") & np.char.endswith(files.astype(str), "functional.py") if len(fr) else np.zeros(0, bool)
    ssel = smask[tables.sf_frame]
    soft = pd.DataFrame({"stack_id": tables.sf_stack[ssel], "sdepth": tables.sf_depth[ssel]}).groupby("stack_id")["sdepth"].min()
    hits["softmax"] = hits["stack_id"].map(soft).lt(hits["depth"]).fillna(False).astype(bool).to_numpy()
    # Sizes seen per stack (every device).
    ev = snap.events
    alloc = ev["action"].to_numpy() == A_ALLOC
    sizes = pd.Series(ev["size"].to_numpy()[alloc]).groupby(ev["stack_id"].to_numpy()[alloc]).max()
    hits["max_bytes"] = hits["stack_id"].map(sizes).fillna(0).astype(np.int64).to_numpy()
    fam_max = hits.groupby("family")["max_bytes"].transform("max")
    line_max = hits.groupby(["family", "line"])["max_bytes"].transform("max")
    keep = line_max >= LINE_SHARE * fam_max
    soft_line = hits["line"].where(hits["softmax"]).groupby(hits["family"]).transform("max")
    keep &= soft_line.isna() | (hits["line"] <= soft_line)
    n_lines = hits.groupby("family")["line"].transform("nunique")
    hits["is_score"] = keep.to_numpy()
    hits["min_bytes"] = np.where(n_lines.to_numpy() == 1, (LINE_SHARE * fam_max).astype(np.int64), 0)
    out = hits[cols].reset_index(drop=True)
    tables.results[key] = out
    return out


def score_alloc_mask(snap: Snapshot, ev: pd.DataFrame, rows: np.ndarray | None = None,
                     rules_path: str | None = None) -> np.ndarray:
    """Bool per row of ``ev`` (or of ``ev`` at ``rows``): an alloc of a score matrix."""
    t = score_stack_table(snap, rules_path)
    stack = ev["stack_id"].to_numpy()
    action = ev["action"].to_numpy()
    size = ev["size"].to_numpy()
    if rows is not None:
        stack, action, size = stack[rows], action[rows], size[rows]
    if not len(t):
        return np.zeros(len(stack), bool)
    n_stacks = max(len(snap.stacks), 1)
    thresh = np.full(n_stacks, -1, np.int64)        # -1: not a score stack
    ok = t["is_score"].to_numpy().astype(bool)
    thresh[t["stack_id"].to_numpy()[ok].astype(np.int64)] = t["min_bytes"].to_numpy()[ok]
    th = np.where(stack >= 0, thresh[np.clip(stack, 0, n_stacks - 1)], -1)
    return (action == A_ALLOC) & (th >= 0) & (size >= th)


# --- shapes -------------------------------------------------------------------------------------

def _heads_for(pipeline: str) -> tuple[int, ...] | None:
    p = pipeline.lower().replace("_", "-")
    for key, heads in PIPELINE_HEADS:
        if p.startswith(key) or key in p:
            return heads
    return None


def token_candidates(run: dict[str, Any] | None) -> list[int]:
    """Sequence lengths the run's geometry allows: latent = image / 8; UNet levels halve
    it; DiT-style transformers patchify by 2 (and Flux/SD3 add their text tokens)."""
    if run and run.get("height") and run.get("width"):
        h, w = int(run["height"]) // 8, int(run["width"]) // 8
        pipe = str(run.get("pipeline", "")).lower()
        patched = (h // 2) * (w // 2)
        cands = []
        if any(k in pipe for k in ("pixart", "flux", "sd3", "dit")):
            cands.append(patched)
            if "flux" in pipe:
                cands.append(patched + 512)
            if "sd3" in pipe:
                cands.append(patched + 333)
        cands += [(h // f) * (w // f) for f in (1, 2, 4, 8)]
        return [c for c in dict.fromkeys(cands) if c > 0]
    return [k * k for k in (128, 96, 64, 48, 32, 24, 16, 8)]


def _dtype_name(itemsize: int) -> str:
    return {2: "fp16/bf16", 4: "fp32", 1: "int8/fp8"}.get(itemsize, f"{itemsize}B")


def guess_score_shape(nbytes: int, run: dict[str, Any] | None, tokens: list[int] | None = None,
                      itemsizes: list[int] | None = None, stage: str | None = None) -> dict[str, Any] | None:
    """Best ``[batch*heads, Nq, Nk]`` for a score matrix of ``nbytes``, from the run's geometry.

    Prefers a ``batch*heads`` that factors as (images × 2 for CFG) × heads of the
    pipeline in run.json, then images × heads, then a slice of the heads (sliced
    attention); Nq = Nk (self-attention) before text keys. ``stage`` (a stage group)
    narrows it: ``vae_decode`` is the VAE's one-head attention at latent resolution
    without CFG, ``text_encode`` the text encoder's (77 / 300 / 512 tokens).
    Returns ``shape``, ``dtype``, and ``heads``/``batch`` when the factoring is known.
    """
    run = run or {}
    images = int(run["batch"]) if isinstance(run.get("batch"), int) and run["batch"] > 0 else None
    known_heads = _heads_for(str(run.get("pipeline", "")))
    batches = [images * 2, images] if images else [2, 1, 4]
    if stage == "vae_decode":
        known_heads, batches = (1,), ([images, 1] if images else [1, 2])
    elif stage == "text_encode":
        known_heads = TEXT_HEADS
        tokens = tokens or list(TEXT_TOKENS)
    if tokens is None:
        tokens = token_candidates(run)
    if itemsizes is None:
        dt = str(run.get("dtype", ""))
        itemsizes = [DTYPE_SIZES[dt]] if dt in DTYPE_SIZES else [2, 4]
        itemsizes += [s for s in (4, 2) if s not in itemsizes]  # softmax / upcast in fp32
    heads = known_heads or GENERIC_HEADS
    best: tuple[tuple[int, ...], dict[str, Any]] | None = None
    order = 0
    for ii, itemsize in enumerate(itemsizes):
        if nbytes % itemsize:
            continue
        elems = nbytes // itemsize
        for ti, nq in enumerate(tokens):
            for nk in (nq, *CROSS_KEYS):
                if elems % (nq * nk):
                    continue
                bh = elems // (nq * nk)
                if not 1 <= bh <= 8192:
                    continue
                order += 1
                fact = 0
                info: dict[str, Any] = {"heads": None, "batch": None}
                for b_rank, b in enumerate(batches):
                    for h in heads:
                        if bh == b * h:
                            f = (4 if known_heads else 2) - b_rank if h != 1 else 1
                            if f > fact:
                                fact, info = f, {"heads": h, "batch": b}
                if fact == 0 and any(bh < b * h and (b * h) % bh == 0 for b in batches for h in heads):
                    fact = 0.5  # one slice of batch*heads (sliced attention)
                score = (fact, nk == nq, -ii, -ti, -order)
                if best is None or score > best[0]:
                    best = (score, {"shape": [bh, nq, nk], "dtype": _dtype_name(itemsize), **info})
    return best[1] if best else None


# --- the analysis -----------------------------------------------------------------------------------

def _objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array (np.array would turn a list of equal-length lists into 2-D)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _implementation(run: dict[str, Any], count: int, functions: dict[str, int], has_frames: bool) -> tuple[str, str]:
    techniques = [str(t).lower() for t in (run.get("techniques") or [])]
    for t in techniques:
        if t in IMPLEMENTATIONS:
            return IMPLEMENTATIONS[t], "run.json"
    if "xformers" in " ".join(techniques):
        return IMPLEMENTATIONS["xformers"], "run.json"
    if count:
        parts = []
        if functions.get("get_attention_scores"):
            parts.append("diffusers get_attention_scores (classic or sliced AttnProcessor)")
        if functions.get("_native_math_attention"):
            parts.append("SDPA math kernel (_native_math attention backend)")
        if functions.get("eager_attention_forward"):
            parts.append("transformers eager attention")
        other = [f for f in functions if f not in SCORE_FUNCTIONS]
        parts += other
        return "materialized: " + ", ".join(parts), "inferred"
    if has_frames:
        return NONE_MATERIALIZED, "inferred"
    return "unknown (no stack frames recorded)", "inferred"


def find_attention(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, stages: pd.DataFrame,
                   sites: SiteNamer, rules_path: str | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Score-matrix allocations (one row each) and a summary: count, peak of simultaneously
    live score bytes, the largest (with a shape guess), share of each stage's peak, and
    which attention implementation the run used."""
    ev = rep.events
    n = len(ev)
    rows = np.flatnonzero(score_alloc_mask(snap, ev, rules_path=rules_path)) if n else np.empty(0, np.int64)
    run = snap.run or {}
    stack = ev["stack_id"].to_numpy()[rows] if n else np.empty(0, np.int64)
    req = ev["size"].to_numpy()[rows] if n else np.empty(0, np.int64)
    # One shape guess per distinct (size, stage group), one site / function per distinct stack.
    lab_codes, lab_uniques = pd.factorize(pd.Series(labels[rows], dtype=object)) if len(rows) else (np.zeros(0, np.int64), [])
    grp_codes, grp_uniques = pd.factorize(pd.Series([stage_group(str(u)) for u in lab_uniques], dtype=object))
    grp_of_row = grp_codes[lab_codes] if len(rows) else np.zeros(0, np.int64)
    n_grp = max(len(grp_uniques), 1)
    ukey, size_inv = np.unique(req.astype(np.int64) * n_grp + grp_of_row, return_inverse=True)
    size_inv = np.asarray(size_inv).reshape(-1)
    guesses = [guess_score_shape(int(k // n_grp), run, stage=str(grp_uniques[int(k % n_grp)])) or {} for k in ukey]
    ustacks, stack_inv = np.unique(stack, return_inverse=True)
    st_table = score_stack_table(snap, rules_path)
    func_by_stack = dict(zip(st_table["stack_id"].tolist(), st_table["function"].tolist()))

    def per_size(key: str) -> np.ndarray:
        return _objects([g.get(key) for g in guesses])[size_inv] if len(rows) else np.empty(0, object)

    table = pd.DataFrame({
        "row": rows.astype(np.int64),
        "bytes": ev["block_size"].to_numpy()[rows] if n else np.empty(0, np.int64),
        "requested_bytes": req,
        "stage": labels[rows] if len(rows) else np.empty(0, object),
        "shape": per_size("shape"), "dtype": per_size("dtype"), "heads": per_size("heads"), "batch": per_size("batch"),
        "function": _objects([str(func_by_stack.get(int(s), "")) for s in ustacks])[stack_inv],
        "site": _objects([sites.site(int(s)) for s in ustacks])[stack_inv],
        "free_row": ev["free_row"].to_numpy()[rows] if n else np.empty(0, np.int64),
    })
    live = live_attention_series(rep, table)
    peak_live = int(live.max()) if n else 0
    peak_live_row = int(np.argmax(live)) if n and peak_live > 0 else -1

    per_stage: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    if len(stages) and n:
        s_rows = stages["start_row"].to_numpy().astype(np.int64)
        e_rows = stages["end_row"].to_numpy().astype(np.int64)
        max_in = [int(live[a:b].max()) if b > a else 0 for a, b in zip(s_rows, e_rows)]
        for (name, peak_row, peak_b), mx in zip(stages[["name", "peak_row", "peak_allocated_bytes"]].itertuples(index=False), max_in):
            at_peak = int(live[peak_row]) if 0 <= peak_row < n else 0
            share = at_peak / peak_b if peak_b else 0.0
            item = {"stage": str(name), "peak_allocated_bytes": int(peak_b), "live_bytes_at_stage_peak": at_peak,
                    "share_of_stage_peak": share, "max_live_bytes": int(mx)}
            if at_peak > 0 or mx > 0:
                per_stage.append(item)
            grp = stage_group(str(name))
            cur = groups.get(grp)
            if cur is None or int(peak_b) > cur["peak_allocated_bytes"]:
                groups[grp] = {**item, "stage": grp, "max_live_bytes": max(int(mx), cur["max_live_bytes"] if cur else 0)}
            else:
                cur["max_live_bytes"] = max(cur["max_live_bytes"], int(mx))

    functions = {str(k): int(v) for k, v in table["function"].value_counts().items()} if len(table) else {}
    has_frames = bool((ev["stack_id"].to_numpy() >= 0).any()) if n else False
    impl, impl_source = _implementation(run, len(rows), functions, has_frames)
    largest: dict[str, Any] = {"bytes": 0, "requested_bytes": 0, "shape": None, "dtype": None, "heads": None,
                               "batch": None, "stage": None, "site": None}
    if len(rows):
        i = int(np.argmax(table["bytes"].to_numpy()))
        largest = {"bytes": int(table["bytes"].iat[i]), "requested_bytes": int(table["requested_bytes"].iat[i]),
                   "shape": table["shape"].iat[i], "dtype": table["dtype"].iat[i], "heads": table["heads"].iat[i],
                   "batch": table["batch"].iat[i], "stage": str(table["stage"].iat[i]), "site": table["site"].iat[i]}
    summary = {
        "count": int(len(rows)), "peak_live_bytes": peak_live, "peak_live_event_index": peak_live_row,
        "total_bytes": int(table["bytes"].sum()) if len(table) else 0,
        "largest": largest, "implementation": impl, "implementation_source": impl_source,
        "materialized": bool(len(rows)), "functions": functions,
        "stages": per_stage,
        "stage_groups": [v for v in groups.values() if v["max_live_bytes"] > 0],
    }
    return table, summary


def live_attention_series(rep: ReplayResult, table: pd.DataFrame) -> np.ndarray:
    """Bytes of score matrices live after each event row."""
    n = len(rep.events)
    if not n:
        return np.zeros(0, np.int64)
    if not len(table):
        return np.zeros(n, np.int64)
    b = table["bytes"].to_numpy().astype(np.float64)
    delta = np.bincount(table["row"].to_numpy(), weights=b, minlength=n + 1)
    delta -= np.bincount(np.minimum(table["free_row"].to_numpy(), n), weights=b, minlength=n + 1)
    return np.rint(np.cumsum(delta[:n])).astype(np.int64)
