"""Attention score matrices: the allocations that materialize QK^T, and the verdict.

Which allocations are scores, and what proves attention ran fused, comes from
:mod:`snapviz.analyses.score_evidence`. Here: their shapes (from the run's geometry when
a snapshot gives only sizes), how many bytes of them were live when, and the verdict:
``materialized`` with the functions that did it, ``fused (SDPA/flash)`` only with a
fused kernel or its code path in the frames (or the run's own record; vLLM's paged
attention, flash-attn, xFormers and ROCm aiter/CK kernels are named as such, see
:func:`fused_label`), and ``not determined`` otherwise: no frames of attention at all
says nothing either way.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.document import Attention, AttentionStage, ScoreMatrix
from snapviz.analyses.frame_rules import RuleSet
from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.score_evidence import fused_evidence, score_alloc_mask, score_stack_table
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stack_tables import StackTables
from snapviz.model import Snapshot
from snapviz.vocab import stage_group

SCORE_FUNCTIONS = frozenset({"get_attention_scores", "_native_math_attention", "eager_attention_forward"})
CROSS_KEYS = (77, 300, 226, 120, 512, 256, 333, 154)
DTYPE_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4, "float16": 2, "bfloat16": 2, "float32": 4}
# Attention heads of the denoisers (and of the VAE's mid-block attention: 1) by pipeline name.
PIPELINE_HEADS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("sdxl", (10, 20, 5)),
    ("pixart", (16,)),
    ("flux", (24,)),
    ("sd3", (24, 38)),
    ("sd2", (5, 10, 20)),
    ("sd15", (8,)),
    ("sd1", (8,)),
    ("stable-diffusion", (8,)),
    ("sd", (8,)),
)
GENERIC_HEADS = (8, 10, 20, 16, 24, 5, 12, 32, 1)
TEXT_HEADS = (12, 20, 64, 16, 32, 8)  # CLIP-L, OpenCLIP-bigG, T5-XXL, ...
TEXT_TOKENS = (77, 300, 512, 256, 226, 120)
IMPLEMENTATIONS = {
    "classic": "materialized: classic AttnProcessor (baddbmm + softmax score matrices)",
    "sliced": "materialized per slice: sliced attention (SlicedAttnProcessor)",
    "sdpa": "fused: SDPA (F.scaled_dot_product_attention)",
    "xformers": "fused: xFormers memory-efficient attention",
}
DIFFUSION_STAGES = ("text_encode", "denoise", "vae_decode")
FUSED = "fused (SDPA/flash)"
NOT_DETERMINED = "not determined"
# Fused attention that is not PyTorch's SDPA, named for what it is (op, kernel or frame names).
FUSED_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^vllm::|(^|/)vllm/"), "vLLM paged attention"),
    (re.compile(r"paged_attention"), "paged attention"),
    (re.compile(r"flash_attn"), "flash-attn"),
    (re.compile(r"xformers"), "xFormers"),
    (re.compile(r"aiter|ck_tile|composable_kernel|(^|\W)ck::"), "ROCm aiter/CK"),
    (re.compile(r"fmha"), "fused MHA kernel"),
)


def fused_label(names: list[str]) -> str:
    """``fused (…)`` naming the kinds of fused attention in ``names``: SDPA's kernels and
    code paths that call them are ``fused (SDPA/flash)``; vLLM's paged attention,
    flash-attn, xFormers, ROCm aiter/CK kernels are named as such."""
    kinds: list[str] = []
    for n in names:
        kind = next((label for rx, label in FUSED_FAMILIES if rx.search(n)), "SDPA/flash")
        if kind not in kinds:
            kinds.append(kind)
    return f"fused ({'; '.join(kinds)})" if kinds else FUSED


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


def guess_score_shape(
    nbytes: int,
    run: dict[str, Any] | None,
    tokens: list[int] | None = None,
    itemsizes: list[int] | None = None,
    stage: str | None = None,
) -> dict[str, Any] | None:
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
    best: tuple[tuple[float, bool, int, int, int], dict[str, Any]] | None = None
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
                fact: float = 0
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


def _implementation(run: dict[str, Any], count: int, functions: dict[str, int], fused: list[str]) -> tuple[str, str]:
    """The verdict and where it comes from (``run.json``, or ``inferred`` from frames)."""
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
        if functions.get("_native_math_attention") or any("_scaled_dot_product_attention_math" in f for f in functions):
            parts.append("SDPA math kernel (unfused)")
        if functions.get("eager_attention_forward"):
            parts.append("transformers eager attention")
        named = {"get_attention_scores", "_native_math_attention", "eager_attention_forward"}
        other = [f for f in functions if f not in named and "_scaled_dot_product_attention_math" not in f]
        if other:
            parts.append("softmax over a matmul in " + ", ".join(other))
        return "materialized: " + ", ".join(parts), "inferred"
    if fused:
        return f"{fused_label(sorted(fused))}: " + ", ".join(sorted(fused)[:3]), "inferred"
    return NOT_DETERMINED, "inferred"


def find_attention(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    stages: pd.DataFrame,
    sites: SiteNamer,
    rules: RuleSet,
    tables: StackTables,
    run_json: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, Attention]:
    """Score-matrix allocations (one row each) and the summary's attention section: count, peak of simultaneously
    live score bytes, the largest (with a shape guess), share of each stage's peak, and
    which attention implementation the run used (``run_json``: the run's geometry and
    techniques, when it has a ``run.json``)."""
    ev = rep.events
    n = len(ev)
    rows = np.flatnonzero(score_alloc_mask(snap, ev, rules, tables)) if n else np.empty(0, np.int64)
    run = run_json or {}
    stack = ev["stack_id"].to_numpy()[rows] if n else np.empty(0, np.int64)
    req = ev["size"].to_numpy()[rows] if n else np.empty(0, np.int64)
    # One shape guess per distinct (size, stage group), one site / function per distinct stack.
    lab_codes, lab_uniques = (
        pd.factorize(pd.Series(labels[rows], dtype=object)) if len(rows) else (np.zeros(0, np.int64), [])
    )
    grp_codes, grp_uniques = pd.factorize(pd.Series([stage_group(str(u)) for u in lab_uniques], dtype=object))
    grp_of_row = grp_codes[lab_codes] if len(rows) else np.zeros(0, np.int64)
    n_grp = max(len(grp_uniques), 1)
    ukey, size_inv = np.unique(req.astype(np.int64) * n_grp + grp_of_row, return_inverse=True)
    size_inv = np.asarray(size_inv).reshape(-1)
    # A size factors into [batch*heads, N, N] many ways: guess only with a diffusion run's
    # geometry (run.json) or inside a diffusion stage; elsewhere the shape stays unknown.
    raw_guesses = [
        guess_score_shape(int(k // n_grp), run, stage=str(grp_uniques[int(k % n_grp)]))
        if run.get("height") or str(grp_uniques[int(k % n_grp)]) in DIFFUSION_STAGES
        else None
        for k in ukey
    ]
    guesses = [g or {} for g in raw_guesses]
    ustacks, stack_inv = np.unique(stack, return_inverse=True)
    st_table = score_stack_table(snap, rules, tables)
    func_by_stack = dict(zip(st_table["stack_id"].tolist(), st_table["function"].tolist(), strict=True))

    def per_size(key: str) -> np.ndarray:
        return _objects([g.get(key) for g in guesses])[size_inv] if len(rows) else np.empty(0, object)

    table = pd.DataFrame(
        {
            "row": rows.astype(np.int64),
            "bytes": ev["block_size"].to_numpy()[rows] if n else np.empty(0, np.int64),
            "requested_bytes": req,
            "stage": labels[rows] if len(rows) else np.empty(0, object),
            "shape": per_size("shape"),
            "dtype": per_size("dtype"),
            "heads": per_size("heads"),
            "batch": per_size("batch"),
            "function": _objects([str(func_by_stack.get(int(s), "")) for s in ustacks])[stack_inv],
            "site": _objects([sites.site(int(s)) for s in ustacks])[stack_inv],
            "free_row": ev["free_row"].to_numpy()[rows] if n else np.empty(0, np.int64),
        }
    )
    live = live_attention_series(rep, table)
    peak_live = int(live.max()) if n else 0
    peak_live_row = int(np.argmax(live)) if n and peak_live > 0 else -1

    per_stage: list[AttentionStage] = []
    groups: dict[str, AttentionStage] = {}
    if len(stages) and n:
        s_rows = stages["start_row"].to_numpy().astype(np.int64)
        e_rows = stages["end_row"].to_numpy().astype(np.int64)
        max_in = [int(live[a:b].max()) if b > a else 0 for a, b in zip(s_rows, e_rows, strict=True)]
        for (name, peak_row, peak_b), mx in zip(
            stages[["name", "peak_row", "peak_allocated_bytes"]].itertuples(index=False), max_in, strict=True
        ):
            at_peak = int(live[peak_row]) if 0 <= peak_row < n else 0
            item = AttentionStage(
                stage=str(name),
                peak_allocated_bytes=int(peak_b),
                live_bytes_at_stage_peak=at_peak,
                share_of_stage_peak=float(at_peak / peak_b) if peak_b else 0.0,
                max_live_bytes=int(mx),
            )
            if at_peak > 0 or mx > 0:
                per_stage.append(item)
            grp = stage_group(str(name))
            cur = groups.get(grp)
            if cur is None or item.peak_allocated_bytes > cur.peak_allocated_bytes:
                # the group's figures are its highest interval's; its most live score bytes, over them all
                groups[grp] = replace(item, stage=grp, max_live_bytes=max(int(mx), cur.max_live_bytes if cur else 0))
            else:
                groups[grp] = replace(cur, max_live_bytes=max(cur.max_live_bytes, int(mx)))

    functions = {str(k): int(v) for k, v in table["function"].value_counts().items()} if len(table) else {}
    stack_ids = ev["stack_id"].to_numpy().astype(np.int64) if n else np.empty(0, np.int64)
    fused = fused_evidence(rules, tables, stack_ids)
    impl, impl_source = _implementation(run, len(rows), functions, fused)
    largest = ScoreMatrix(
        bytes=0, requested_bytes=0, shape=None, dtype=None, heads=None, batch=None, stage=None, site=None
    )
    if len(rows):
        i = int(np.argmax(table["bytes"].to_numpy()))
        shape, dtype, heads, batch = (table[c].iat[i] for c in ("shape", "dtype", "heads", "batch"))
        largest = ScoreMatrix(
            bytes=int(table["bytes"].iat[i]),
            requested_bytes=int(table["requested_bytes"].iat[i]),
            shape=[int(x) for x in shape] if shape is not None else None,
            dtype=str(dtype) if dtype is not None else None,
            heads=int(heads) if heads is not None else None,
            batch=int(batch) if batch is not None else None,
            stage=str(table["stage"].iat[i]),
            site=str(table["site"].iat[i]),
        )
    summary = Attention(
        count=int(len(rows)),
        peak_live_bytes=peak_live,
        peak_live_event_index=peak_live_row,
        total_bytes=int(table["bytes"].sum()) if len(table) else 0,
        largest=largest,
        implementation=impl,
        implementation_source=impl_source,
        materialized=bool(len(rows)),
        fused=impl.startswith("fused"),
        functions=functions,
        fused_evidence=fused[:5],
        stages=per_stage,
        stage_groups=[v for v in groups.values() if v.max_live_bytes > 0],
    )
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
