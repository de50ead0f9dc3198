"""Build SD 1.5, SDXL, PixArt-Σ (and, via flow_pipelines, Flux.1 and SD 3.5) pipelines from
in-code configs, with random weights.

Memory depends only on shapes and dtypes, so random weights record the same allocations as a
real checkpoint (every pipeline pads prompts to a fixed length; no shape depends on values).
Two sizes: ``tiny`` (seconds on a CPU, for tests) and ``full`` (the published architectures,
the configs published with each model on the Hugging Face Hub).

Models are built on the CPU unless a device is given (Flux and SD 3.5 on CUDA). Building skips torch's per-parameter initialisers (slow and serial
on CPU: ~15 s for SD 1.5, over a minute for T5-XXL) and then fills every parameter from one
pool of N(0, 0.02) samples, so weights are random-valued but cheap to make. Buffers computed
in ``__init__`` (position embeddings) are left as the constructors computed them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

UNET_DIT_PIPELINES = ("sd15", "sdxl", "pixart-sigma")
# flow_pipelines imports this module, so its names are spelled here rather than imported
FLOW_PIPELINES = ("flux-dev", "flux-schnell", "sd35-medium", "sd35-large")
PIPELINES = UNET_DIT_PIPELINES + FLOW_PIPELINES

_INIT_METHODS = (
    "normal_", "uniform_", "log_normal_", "exponential_", "geometric_", "cauchy_", "random_",
)
_POOL_ELEMENTS = 1 << 22


@contextlib.contextmanager
def skip_random_init(dtype: torch.dtype | None = None) -> Iterator[None]:
    """Make in-place random initialisers no-ops (and optionally build in ``dtype``)."""
    saved = {name: getattr(torch.Tensor, name) for name in _INIT_METHODS}
    old_dtype = torch.get_default_dtype()
    for name in _INIT_METHODS:
        setattr(torch.Tensor, name, lambda self, *args, **kwargs: self)
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.set_default_dtype(old_dtype)


def fill_random(module: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Fill every floating parameter with N(0, std) values tiled from one random pool."""
    gen = torch.Generator().manual_seed(seed)
    # one pool per (dtype, device), made on the CPU and copied once: the same values on any device
    pools: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
    offset = 0
    with torch.no_grad():
        for param in module.parameters():
            if not param.is_floating_point() or param.device.type == "meta":
                continue
            pool = pools.get((param.dtype, param.device))
            if pool is None:
                pool = (torch.randn(_POOL_ELEMENTS, generator=gen) * std).to(param.dtype)
                pool = pool.to(param.device)
                pools[(param.dtype, param.device)] = pool
            flat = param.data.view(-1)
            start = 0
            while start < flat.numel():
                take = min(flat.numel() - start, _POOL_ELEMENTS - offset)
                flat[start:start + take].copy_(pool[offset:offset + take])
                start += take
                offset = (offset + take) % (_POOL_ELEMENTS - 1)
            # norm weights of exactly zero/one are what real checkpoints start from; keep the
            # random values anyway: they change no shape.


def _build(factory: Any, dtype: torch.dtype, seed: int,
           device: torch.device | None = None) -> torch.nn.Module:
    """Construct, cast and fill one model; on ``device`` directly when given (no CPU copy)."""
    where = torch.device(device) if device is not None else contextlib.nullcontext()
    with where, skip_random_init(dtype if dtype != torch.float32 else None):
        model = factory()
    model = model.to(dtype)  # buffers too (PixArt's pos_embed), as from_pretrained(dtype=) does
    fill_random(model, seed=seed)
    return model.eval().requires_grad_(False)


# --- tokenizers -------------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP byte-to-printable-character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def clip_tokenizer(max_length: int = 77) -> Any:
    """Byte-level CLIP BPE: 256 bytes, 256 ``byte</w>``, and the two specials (514 ids)."""
    from transformers import CLIPTokenizer

    chars = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for ch in chars:
        vocab[ch] = len(vocab)
    for ch in chars:
        vocab[ch + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length,
                         pad_token="<|endoftext|>")


def t5_tokenizer() -> Any:
    """Unigram T5 tokenizer over a small word list (pipelines pad to a fixed length anyway)."""
    from transformers import T5Tokenizer

    words = ("a painting of squirrel eating burger photo cat dog astronaut riding horse on mars "
             "the in with and red blue green city night").split()
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -5.0 - i * 0.01) for i, w in enumerate(words)]
    vocab += [(chr(c), -10.0) for c in range(ord("a"), ord("z") + 1)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(99, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=100)


# --- component configs ------------------------------------------------------------------------

def _vae(size: str, sdxl: bool) -> Any:
    from diffusers import AutoencoderKL

    kw: dict[str, Any] = dict(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        scaling_factor=0.13025 if sdxl else 0.18215, force_upcast=sdxl,
    )
    if size == "full":
        kw.update(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                  norm_num_groups=32, sample_size=1024 if sdxl else 512)
    else:  # 4 blocks so vae_scale_factor stays 8, as in the real VAE
        kw.update(block_out_channels=(8, 16, 32, 32), layers_per_block=1,
                  norm_num_groups=4, sample_size=64)
    return lambda: AutoencoderKL(**kw)


def _clip(size: str, variant: str, projection: bool | None = None) -> Any:
    """CLIP text encoders: "L", "bigG" (full) and tiny ones ("L-sd15"/"tiny16": hidden 16).

    ``projection`` picks CLIPTextModelWithProjection (default: only for bigG, as SDXL has it;
    SD 3.5 uses it for both encoders)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    if size == "full" and variant == "L":
        cfg = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                             num_hidden_layers=12, num_attention_heads=12,
                             max_position_embeddings=77, hidden_act="quick_gelu",
                             projection_dim=768, bos_token_id=49406, eos_token_id=49407,
                             pad_token_id=49407)
    elif size == "full":  # OpenCLIP bigG (SDXL text_encoder_2)
        cfg = CLIPTextConfig(vocab_size=49408, hidden_size=1280, intermediate_size=5120,
                             num_hidden_layers=32, num_attention_heads=20,
                             max_position_embeddings=77, hidden_act="gelu",
                             projection_dim=1280, bos_token_id=49406, eos_token_id=49407,
                             pad_token_id=49407)
    else:
        hidden = 16 if variant in ("L-sd15", "tiny16") else 32
        cfg = CLIPTextConfig(vocab_size=1000, hidden_size=hidden, intermediate_size=37,
                             num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=77, hidden_act="gelu",
                             projection_dim=hidden, bos_token_id=512, eos_token_id=513,
                             pad_token_id=513)
    if projection is None:
        projection = variant == "bigG"
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return lambda: cls(cfg)


def _t5(size: str) -> Any:
    from transformers import T5Config, T5EncoderModel

    if size == "full":  # t5-v1_1-xxl encoder
        cfg = T5Config(vocab_size=32128, d_model=4096, d_ff=10240, d_kv=64, num_heads=64,
                       num_layers=24, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
                       dense_act_fn="gelu_new", is_gated_act=True, tie_word_embeddings=False)
    else:
        cfg = T5Config(vocab_size=1000, d_model=32, d_ff=37, d_kv=8, num_heads=4, num_layers=2,
                       feed_forward_proj="gated-gelu", is_encoder_decoder=False)
    return lambda: T5EncoderModel(cfg)


def _sd15_unet(size: str) -> Any:
    from diffusers import UNet2DConditionModel

    if size == "full":
        return lambda: UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
    return lambda: UNet2DConditionModel(
        sample_size=8, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16, attention_head_dim=2, norm_num_groups=4)


def _sdxl_unet(size: str) -> Any:
    from diffusers import UNet2DConditionModel

    if size == "full":
        return lambda: UNet2DConditionModel(
            sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
            cross_attention_dim=2048, use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816)
    return lambda: UNet2DConditionModel(
        sample_size=8, block_out_channels=(8, 16), layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2),
        use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=4)


def _pixart_transformer(size: str) -> Any:
    from diffusers import PixArtTransformer2DModel

    if size == "full":  # PixArt-Σ XL/2 1024
        return lambda: PixArtTransformer2DModel(
            num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
            num_layers=28, cross_attention_dim=1152, attention_bias=True, sample_size=128,
            patch_size=2, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
            norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
            interpolation_scale=2, use_additional_conditions=False, caption_channels=4096)
    return lambda: PixArtTransformer2DModel(
        sample_size=8, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3,
        caption_channels=32, in_channels=4, cross_attention_dim=24, out_channels=8,
        attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
        norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
        use_additional_conditions=False)


# --- pipelines --------------------------------------------------------------------------------

def default_resolution(pipeline: str, size: str) -> int:
    if size == "tiny":
        return 64
    return 512 if pipeline == "sd15" else 1024


def build_pipeline(pipeline: str, size: str, dtype: torch.dtype = torch.float32,
                   seed: int = 0, device: torch.device | None = None, t5: bool = True) -> Any:
    """Return a diffusers pipeline in ``dtype`` with random weights.

    Flux and SD 3.5 are built on ``device`` (default CPU); ``t5=False`` drops SD 3.5's T5. The
    UNet/PixArt pipelines are always built on the CPU (they are small enough to copy).
    """
    if pipeline in FLOW_PIPELINES:
        # imported here: flow_pipelines builds on this module's helpers
        from .flow_pipelines import build_flow_pipeline

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
            vae=_build(_vae(size, sdxl=False), dtype, seed),
            text_encoder=_build(_clip(size, "L" if size == "full" else "L-sd15"), dtype, seed + 1),
            tokenizer=clip_tokenizer(),
            unet=_build(_sd15_unet(size), dtype, seed + 2),
            scheduler=DDIMScheduler(**betas, clip_sample=False, set_alpha_to_one=False,
                                    steps_offset=1),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        )
    if pipeline == "sdxl":
        return StableDiffusionXLPipeline(
            vae=_build(_vae(size, sdxl=True), dtype, seed),
            text_encoder=_build(_clip(size, "L"), dtype, seed + 1),
            text_encoder_2=_build(_clip(size, "bigG"), dtype, seed + 3),
            tokenizer=clip_tokenizer(), tokenizer_2=clip_tokenizer(),
            unet=_build(_sdxl_unet(size), dtype, seed + 2),
            scheduler=EulerDiscreteScheduler(**betas, steps_offset=1, timestep_spacing="leading"),
        )
    if pipeline == "pixart-sigma":
        return PixArtSigmaPipeline(
            tokenizer=t5_tokenizer(),
            text_encoder=_build(_t5(size), dtype, seed + 1),
            vae=_build(_vae(size, sdxl=True), dtype, seed),
            transformer=_build(_pixart_transformer(size), dtype, seed + 2),
            scheduler=DPMSolverMultistepScheduler(**{**betas, "beta_schedule": "linear",
                                                     "beta_start": 0.0001, "beta_end": 0.02}),
        )
    raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {', '.join(PIPELINES)}")


def build_denoiser(pipeline: str, size: str, dtype: torch.dtype = torch.float32,
                   seed: int = 0) -> torch.nn.Module:
    """The pipeline's UNet or DiT alone (what fine-tuning trains), as ``build_pipeline`` makes it."""
    factories = {"sd15": _sd15_unet, "sdxl": _sdxl_unet, "pixart-sigma": _pixart_transformer}
    if pipeline in FLOW_PIPELINES:
        from .flow_pipelines import flow_denoiser_factory  # see build_pipeline

        return _build(flow_denoiser_factory(pipeline, size), dtype, seed + 2)
    if pipeline not in factories:
        raise ValueError(f"unknown pipeline {pipeline!r}; expected one of {', '.join(PIPELINES)}")
    return _build(factories[pipeline](size), dtype, seed + 2)  # the seed build_pipeline uses


def build_tiny_vae(dtype: torch.dtype, seed: int = 0) -> Any:
    """AutoencoderTiny() with its default config: the TAESD architecture (2.45M params)."""
    from diffusers import AutoencoderTiny

    return _build(lambda: AutoencoderTiny(), dtype, seed)


def denoiser(pipe: Any) -> torch.nn.Module | None:
    return getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)


def text_encoders(pipe: Any) -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        mod = getattr(pipe, name, None)
        if isinstance(mod, torch.nn.Module):
            out.append((name, mod))
    return out
