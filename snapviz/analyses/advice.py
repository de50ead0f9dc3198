"""What to do: fixes from the standard toolbox, each with the bytes it can act on.

Estimates come from this run's own live set at the peak (never from a lookup table):
e.g. switching to SDPA removes the score matrices live at the peak. Where a fix's
effect is not visible in the live set (offload, dtype), the estimate says what it is
bounded by. Measured effects on full-size SDXL are in docs/techniques.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from snapviz.analyses.document import Advice, Attention
from snapviz.analyses.training_advice import TRAIN_PHASES
from snapviz.category_vocab import ACTIVATION, ATTENTION_SCORES, PARAMETER, VAE_BUFFERS
from snapviz.vocab import stage_group


def _cat(categories: pd.DataFrame, name: str) -> int:
    """Bytes of category ``name`` and of its per-model parts (``parameter: T5`` counts as ``parameter``)."""
    if not len(categories):
        return 0
    cat = categories["category"].astype(str)
    m = (cat == name) | cat.str.startswith(name + ": ")
    return int(categories.loc[m, "bytes"].sum())


@dataclass(frozen=True)
class AdviceFacts:
    """What the advice reads of a run, taken from the analysis itself (not from the summary
    document being built): the peak, the techniques and dtype the collector recorded, and the
    attention score matrices found."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int | None  # None: not recorded
    peak_stage: str | None
    techniques: frozenset[str]
    dtype: str
    attention_count: int
    attention_from_diffusers: bool  # diffusers' get_attention_scores materialized them

    @classmethod
    def of(
        cls,
        *,
        peak_allocated: int,
        peak_reserved: int | None,
        peak_stage: str | None,
        run_json: Mapping[str, Any] | None,
        attention: Attention,
    ) -> AdviceFacts:
        run = run_json or {}
        techniques = run.get("techniques")
        return cls(
            peak_allocated_bytes=int(peak_allocated),
            peak_reserved_bytes=None if peak_reserved is None else int(peak_reserved),
            peak_stage=peak_stage,
            techniques=frozenset(str(t) for t in techniques) if isinstance(techniques, list) else frozenset(),
            dtype=str(run.get("dtype") or ""),
            attention_count=attention.count,
            attention_from_diffusers=bool(attention.functions.get("get_attention_scores")),
        )


def advise(facts: AdviceFacts, categories: pd.DataFrame) -> list[Advice]:
    """Ranked suggestions: ``technique``, ``why``, ``saves_up_to_bytes`` (None: unknown), ``how``."""
    total = facts.peak_allocated_bytes or 1
    stage = stage_group(facts.peak_stage or "")
    techniques = facts.techniques
    dtype = facts.dtype
    out: list[Advice] = []
    att_live = _cat(categories, ATTENTION_SCORES)
    if facts.attention_count and att_live:
        diffusers = facts.attention_from_diffusers
        out.append(
            Advice(
                technique="SDPA attention (the diffusers default)" if diffusers else "fused attention (SDPA / flash)",
                why=f"{facts.attention_count} attention score matrices are materialized; {att_live / total:.0%} of the peak is scores",
                saves_up_to_bytes=att_live,
                how="pipe.unet.set_attn_processor(AttnProcessor2_0())  # or drop set_default_attn_processor / attention slicing"
                if diffusers
                else "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...) instead of "
                'softmax(q @ k.mT) (transformers: attn_implementation="sdpa")',
            )
        )
    if stage == "vae_decode":
        vae = _cat(categories, VAE_BUFFERS) + _cat(categories, ACTIVATION)
        out.append(
            Advice(
                technique="VAE tiling or tiny VAE",
                why=f"the peak is in VAE decode, where decode buffers hold {vae / total:.0%} of the peak",
                saves_up_to_bytes=vae or None,
                how="pipe.vae.enable_tiling()  (tiles must be smaller than the image), or AutoencoderTiny; "
                "batch > 1: pipe.vae.enable_slicing()",
            )
        )
    weights = _cat(categories, PARAMETER)
    if dtype == "fp32" and weights:
        out.append(
            Advice(
                technique="fp16/bf16 weights",
                why=f"fp32 weights take {weights / total:.0%} of the peak",
                saves_up_to_bytes=weights // 2,
                how="DiffusionPipeline.from_pretrained(..., torch_dtype=torch.float16)  (bf16 also avoids SDXL's fp32 VAE upcast)",
            )
        )
    # training keeps every weight busy in each step (the frozen base of a LoRA too): nothing idles to offload
    training = stage in TRAIN_PHASES
    if (
        weights
        and not training
        and not techniques & {"model-offload", "sequential-offload", "group-offload", "offload"}
        and weights / total > 0.4
    ):
        out.append(
            Advice(
                technique="model CPU offload",
                why=f"weights are {weights / total:.0%} of the peak, but only one model runs at a time",
                saves_up_to_bytes=None,
                how="pipe.enable_model_cpu_offload()  (bounded by the weights of the models idle at the peak; costs transfer time)",
            )
        )
    frag = (facts.peak_reserved_bytes or 0) - facts.peak_allocated_bytes
    if frag > 0.2 * total:
        out.append(
            Advice(
                technique="expandable segments",
                why=f"reserved exceeds allocated by {frag / total:.0%} at the peaks (fragmentation / cached blocks)",
                saves_up_to_bytes=frag,
                how="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            )
        )
    out.sort(key=lambda a: -(a.saves_up_to_bytes or 0))
    return out
