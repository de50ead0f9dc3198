"""Build SD 1.5, SDXL, PixArt-Σ (and, via flow_pipelines, Flux.1 and SD 3.5) pipelines from
in-code configs, with random weights.

Memory depends only on shapes and dtypes, so random weights record the same allocations as a
real checkpoint (every pipeline pads prompts to a fixed length; no shape depends on values).
Two sizes: ``tiny`` (seconds on a CPU, for tests) and ``full`` (the published architectures,
the configs published with each model on the Hugging Face Hub).

These are built on the CPU (small enough to copy); Flux and SD 3.5 on the target device. How
weights are made cheaply is in components.py.
"""

from __future__ import annotations

from typing import Any

import torch

from .components import build_model, clip_text, clip_tokenizer, t5_encoder, t5_tokenizer
from .flow_pipelines import FLOW_PIPELINES, build_flow_pipeline, flow_denoiser_factory

UNET_DIT_PIPELINES = ("sd15", "sdxl", "pixart-sigma")
PIPELINES = UNET_DIT_PIPELINES + FLOW_PIPELINES


# --- component configs (the shared text encoders are in components.py) ----------------------


def _vae(size: str, sdxl: bool) -> Any:
    from diffusers import AutoencoderKL

    kw: dict[str, Any] = dict(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        scaling_factor=0.13025 if sdxl else 0.18215,
        force_upcast=sdxl,
    )
    if size == "full":
        kw.update(
            block_out_channels=(128, 256, 512, 512),
            layers_per_block=2,
            norm_num_groups=32,
            sample_size=1024 if sdxl else 512,
        )
    else:  # 4 blocks so vae_scale_factor stays 8, as in the real VAE
        kw.update(block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=4, sample_size=64)
    return lambda: AutoencoderKL(**kw)


def _sd15_unet(size: str) -> Any:
    from diffusers import UNet2DConditionModel

    if size == "full":
        return lambda: UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
    return lambda: UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
        norm_num_groups=4,
    )


def _sdxl_unet(size: str) -> Any:
    from diffusers import UNet2DConditionModel

    if size == "full":
        return lambda: UNet2DConditionModel(
            sample_size=128,
            in_channels=4,
            out_channels=4,
            layers_per_block=2,
            block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(5, 10, 20),
            transformer_layers_per_block=(1, 2, 10),
            cross_attention_dim=2048,
            use_linear_projection=True,
            addition_embed_type="text_time",
            addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816,
        )
    return lambda: UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(8, 16),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
        norm_num_groups=4,
    )


def _pixart_transformer(size: str) -> Any:
    from diffusers import PixArtTransformer2DModel

    if size == "full":  # PixArt-Σ XL/2 1024
        return lambda: PixArtTransformer2DModel(
            num_attention_heads=16,
            attention_head_dim=72,
            in_channels=4,
            out_channels=8,
            num_layers=28,
            cross_attention_dim=1152,
            attention_bias=True,
            sample_size=128,
            patch_size=2,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
            interpolation_scale=2,
            use_additional_conditions=False,
            caption_channels=4096,
        )
    return lambda: PixArtTransformer2DModel(
        sample_size=8,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        caption_channels=32,
        in_channels=4,
        cross_attention_dim=24,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        use_additional_conditions=False,
    )


# --- pipelines --------------------------------------------------------------------------------


def default_resolution(pipeline: str, size: str) -> int:
    if size == "tiny":
        return 64
    return 512 if pipeline == "sd15" else 1024


def build_pipeline(
    pipeline: str,
    size: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: torch.device | None = None,
    t5: bool = True,
) -> Any:
    """Return a diffusers pipeline in ``dtype`` with random weights.

    Flux and SD 3.5 are built on ``device`` (default CPU); ``t5=False`` drops SD 3.5's T5. The
    UNet/PixArt pipelines are always built on the CPU (they are small enough to copy).
    """
    if pipeline in FLOW_PIPELINES:
        return build_flow_pipeline(pipeline, size, dtype, seed, device=device, t5=t5)
    from diffusers import (
        DDIMScheduler,
        DPMSolverMultistepScheduler,
        EulerDiscreteScheduler,
        PixArtSigmaPipeline,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
    )

    betas = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    if pipeline == "sd15":
        return StableDiffusionPipeline(
            vae=build_model(_vae(size, sdxl=False), dtype, seed),
            text_encoder=build_model(clip_text(size, "L" if size == "full" else "L-sd15"), dtype, seed + 1),
            tokenizer=clip_tokenizer(),
            unet=build_model(_sd15_unet(size), dtype, seed + 2),
            scheduler=DDIMScheduler(**betas, clip_sample=False, set_alpha_to_one=False, steps_offset=1),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    if pipeline == "sdxl":
        return StableDiffusionXLPipeline(
            vae=build_model(_vae(size, sdxl=True), dtype, seed),
            text_encoder=build_model(clip_text(size, "L"), dtype, seed + 1),
            text_encoder_2=build_model(clip_text(size, "bigG"), dtype, seed + 3),
            tokenizer=clip_tokenizer(),
            tokenizer_2=clip_tokenizer(),
            unet=build_model(_sdxl_unet(size), dtype, seed + 2),
            scheduler=EulerDiscreteScheduler(**betas, steps_offset=1, timestep_spacing="leading"),
        )
    if pipeline == "pixart-sigma":
        return PixArtSigmaPipeline(
            tokenizer=t5_tokenizer(),
            text_encoder=build_model(t5_encoder(size), dtype, seed + 1),
            vae=build_model(_vae(size, sdxl=True), dtype, seed),
            transformer=build_model(_pixart_transformer(size), dtype, seed + 2),
            scheduler=DPMSolverMultistepScheduler(
                **{**betas, "beta_schedule": "linear", "beta_start": 0.0001, "beta_end": 0.02}
            ),
        )
    raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {', '.join(PIPELINES)}")


def build_denoiser(pipeline: str, size: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """The pipeline's UNet or DiT alone (what fine-tuning trains), as ``build_pipeline`` makes it."""
    factories = {"sd15": _sd15_unet, "sdxl": _sdxl_unet, "pixart-sigma": _pixart_transformer}
    if pipeline in FLOW_PIPELINES:
        return build_model(flow_denoiser_factory(pipeline, size), dtype, seed + 2)
    if pipeline not in factories:
        raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {', '.join(PIPELINES)}")
    return build_model(factories[pipeline](size), dtype, seed + 2)  # the seed build_pipeline uses


def build_tiny_vae(dtype: torch.dtype, seed: int = 0) -> Any:
    """AutoencoderTiny() with its default config: the TAESD architecture (2.45M params)."""
    from diffusers import AutoencoderTiny

    return build_model(lambda: AutoencoderTiny(), dtype, seed)


def denoiser(pipe: Any) -> torch.nn.Module | None:
    return getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)


def text_encoders(pipe: Any) -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        mod = getattr(pipe, name, None)
        if isinstance(mod, torch.nn.Module):
            out.append((name, mod))
    return out
