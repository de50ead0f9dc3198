"""Flux.1 (dev, schnell) and Stable Diffusion 3.5 (medium, large) from in-code configs.

Both are flow-matching DiTs with a T5-XXL text encoder beside CLIP. ``full`` geometries are the
published checkpoints' configs (black-forest-labs/FLUX.1-dev and -schnell, stabilityai/
stable-diffusion-3.5-medium and -large on the Hugging Face Hub); ``tiny`` keeps every structural
feature (guidance embedding, dual attention, QK norm, 16 latent channels, vae_scale_factor 8) at
widths that run in a fraction of a second on a CPU.

Weights are random (memory depends only on shapes and dtypes). Unlike the UNet pipelines, these
can be built straight on the GPU: Flux's transformer alone is 11.9B parameters, and building it
on the CPU then copying would take minutes, not seconds.
"""

from __future__ import annotations

from typing import Any

import torch

from .components import build_model, clip_text, clip_tokenizer, t5_encoder, t5_tokenizer

FLUX = ("flux-dev", "flux-schnell")
SD35 = ("sd35-medium", "sd35-large")
FLOW_PIPELINES = FLUX + SD35

# tiny widths: SD3 concatenates the two CLIP hidden states (16 + 16) and zero-pads them to the
# T5 width (32), so the CLIPs must be narrower than T5
_TINY_CLIP = 16
_TINY_T5 = 32


def default_max_sequence_length(pipeline: str) -> int:
    """T5 tokens per prompt: FluxPipeline's 512 (schnell's model card uses 256), SD3's 256."""
    return 512 if pipeline == "flux-dev" else 256


def _flow_vae(size: str, flux: bool) -> Any:
    """AutoencoderKL with 16 latent channels and no quant convs (shared by Flux and SD3)."""
    from diffusers import AutoencoderKL

    kw: dict[str, Any] = dict(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        force_upcast=True,
        scaling_factor=0.3611 if flux else 1.5305,
        shift_factor=0.1159 if flux else 0.0609,
    )
    if size == "full":
        kw.update(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32, sample_size=1024)
    else:  # 4 blocks so vae_scale_factor stays 8
        kw.update(block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=4, sample_size=64)
    return lambda: AutoencoderKL(**kw)


def _flux_transformer(size: str, guidance: bool) -> Any:
    from diffusers import FluxTransformer2DModel

    if size == "full":
        return lambda: FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=19,
            num_single_layers=38,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=4096,
            pooled_projection_dim=768,
            guidance_embeds=guidance,
            axes_dims_rope=(16, 56, 56),
        )
    return lambda: FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=_TINY_T5,
        pooled_projection_dim=_TINY_CLIP,
        guidance_embeds=guidance,
        axes_dims_rope=(4, 4, 8),
    )


def _sd35_transformer(size: str, large: bool) -> Any:
    from diffusers import SD3Transformer2DModel

    if size == "full" and large:
        return lambda: SD3Transformer2DModel(
            sample_size=128,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            num_layers=38,
            attention_head_dim=64,
            num_attention_heads=38,
            joint_attention_dim=4096,
            caption_projection_dim=2432,
            pooled_projection_dim=2048,
            pos_embed_max_size=192,
            qk_norm="rms_norm",
        )
    if size == "full":
        return lambda: SD3Transformer2DModel(
            sample_size=128,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            num_layers=24,
            attention_head_dim=64,
            num_attention_heads=24,
            joint_attention_dim=4096,
            caption_projection_dim=1536,
            pooled_projection_dim=2048,
            pos_embed_max_size=384,
            dual_attention_layers=tuple(range(13)),
            qk_norm="rms_norm",
        )
    return lambda: SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=_TINY_T5,
        caption_projection_dim=32,
        pooled_projection_dim=2 * _TINY_CLIP,
        pos_embed_max_size=32,
        dual_attention_layers=() if large else (0,),
        qk_norm="rms_norm",
    )


def _scheduler(pipeline: str) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler

    if pipeline == "flux-dev":  # resolution-dependent shift, as in the dev scheduler config
        return FlowMatchEulerDiscreteScheduler(
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        )
    if pipeline == "flux-schnell":
        return FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    return FlowMatchEulerDiscreteScheduler(shift=3.0)


def build_flow_pipeline(
    pipeline: str, size: str, dtype: torch.dtype, seed: int, device: torch.device | None = None, t5: bool = True
) -> Any:
    """A FluxPipeline or StableDiffusion3Pipeline with random weights, built on ``device``.

    ``t5=False`` leaves SD 3.5's text_encoder_3 out (the pipeline then feeds zeros in its
    place); Flux cannot run without T5.
    """
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    def build(factory: Any, offset: int) -> torch.nn.Module:
        return build_model(factory, dtype, seed + offset, device=device)

    clip = "tiny16" if size == "tiny" else "L"
    if pipeline in FLUX:
        return FluxPipeline(
            scheduler=_scheduler(pipeline),
            vae=build(_flow_vae(size, flux=True), 0),
            text_encoder=build(clip_text(size, clip), 1),
            tokenizer=clip_tokenizer(),
            text_encoder_2=build(t5_encoder(size), 3),
            tokenizer_2=t5_tokenizer(),
            transformer=build(_flux_transformer(size, guidance=pipeline == "flux-dev"), 2),
        )
    if pipeline in SD35:
        return StableDiffusion3Pipeline(
            transformer=build(_sd35_transformer(size, large=pipeline == "sd35-large"), 2),
            scheduler=_scheduler(pipeline),
            vae=build(_flow_vae(size, flux=False), 0),
            text_encoder=build(clip_text(size, clip, projection=True), 1),
            tokenizer=clip_tokenizer(),
            text_encoder_2=build(clip_text(size, "bigG" if size == "full" else "tiny16", projection=True), 3),
            tokenizer_2=clip_tokenizer(),
            text_encoder_3=build(t5_encoder(size), 4) if t5 else None,
            tokenizer_3=t5_tokenizer() if t5 else None,
        )
    raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {', '.join(FLOW_PIPELINES)}")


def flow_denoiser_factory(pipeline: str, size: str) -> Any:
    """The transformer alone (for fine-tuning and offline geometry checks)."""
    if pipeline in FLUX:
        return _flux_transformer(size, guidance=pipeline == "flux-dev")
    return _sd35_transformer(size, large=pipeline == "sd35-large")
