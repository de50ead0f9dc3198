"""Shared building blocks of the in-code pipelines: random-init helpers, tokenizers built in
code, and the text encoders several pipelines share (CLIP-L, OpenCLIP bigG, T5-XXL).

Models are built on the CPU unless a device is given. Building skips torch's per-parameter
initialisers (slow and serial on CPU: ~15 s for SD 1.5, over a minute for T5-XXL) and then fills
every parameter from one pool of N(0, 0.02) samples, so weights are random-valued but cheap to
make. Buffers computed in ``__init__`` (position embeddings) are left as the constructors
computed them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_INIT_METHODS = (
    "normal_",
    "uniform_",
    "log_normal_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "random_",
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
                flat[start : start + take].copy_(pool[offset : offset + take])
                start += take
                offset = (offset + take) % (_POOL_ELEMENTS - 1)
            # norm weights of exactly zero/one are what real checkpoints start from; keep the
            # random values anyway: they change no shape.


def build_model(factory: Any, dtype: torch.dtype, seed: int, device: torch.device | None = None) -> torch.nn.Module:
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
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


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
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length, pad_token="<|endoftext|>")


def t5_tokenizer() -> Any:
    """Unigram T5 tokenizer over a small word list (pipelines pad to a fixed length anyway)."""
    from transformers import T5Tokenizer

    words = (
        "a painting of squirrel eating burger photo cat dog astronaut riding horse on mars "
        "the in with and red blue green city night"
    ).split()
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -5.0 - i * 0.01) for i, w in enumerate(words)]
    vocab += [(chr(c), -10.0) for c in range(ord("a"), ord("z") + 1)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(99, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=100)


def clip_text(size: str, variant: str, projection: bool | None = None) -> Any:
    """CLIP text encoders: "L", "bigG" (full) and tiny ones ("L-sd15"/"tiny16": hidden 16).

    ``projection`` picks CLIPTextModelWithProjection (default: only for bigG, as SDXL has it;
    SD 3.5 uses it for both encoders)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    if size == "full" and variant == "L":
        cfg = CLIPTextConfig(
            vocab_size=49408,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            projection_dim=768,
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=49407,
        )
    elif size == "full":  # OpenCLIP bigG (SDXL text_encoder_2)
        cfg = CLIPTextConfig(
            vocab_size=49408,
            hidden_size=1280,
            intermediate_size=5120,
            num_hidden_layers=32,
            num_attention_heads=20,
            max_position_embeddings=77,
            hidden_act="gelu",
            projection_dim=1280,
            bos_token_id=49406,
            eos_token_id=49407,
            pad_token_id=49407,
        )
    else:
        hidden = 16 if variant in ("L-sd15", "tiny16") else 32
        cfg = CLIPTextConfig(
            vocab_size=1000,
            hidden_size=hidden,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            hidden_act="gelu",
            projection_dim=hidden,
            bos_token_id=512,
            eos_token_id=513,
            pad_token_id=513,
        )
    if projection is None:
        projection = variant == "bigG"
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return lambda: cls(cfg)


def t5_encoder(size: str) -> Any:
    from transformers import T5Config, T5EncoderModel

    if size == "full":  # t5-v1_1-xxl encoder
        cfg = T5Config(
            vocab_size=32128,
            d_model=4096,
            d_ff=10240,
            d_kv=64,
            num_heads=64,
            num_layers=24,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
            dense_act_fn="gelu_new",
            is_gated_act=True,
            tie_word_embeddings=False,
        )
    else:
        cfg = T5Config(
            vocab_size=1000,
            d_model=32,
            d_ff=37,
            d_kv=8,
            num_heads=4,
            num_layers=2,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
        )
    return lambda: T5EncoderModel(cfg)
