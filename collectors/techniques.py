"""Memory techniques: names, validation, and how each is applied to a pipeline.

Every technique is combinable unless ``validate`` says otherwise; an impossible request raises
:class:`TechniqueError` with one clear line, never a silent no-op.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ATTENTION = ("sdpa", "classic", "sliced")
OFFLOAD = ("model-offload", "sequential-offload", "group-offload")
OTHER = ("vae-slicing", "vae-tiling", "tiny-vae", "int8", "nf4-text-encoder", "staged",
         "balanced")
ALL = tuple(DTYPES) + ATTENTION + OFFLOAD + OTHER
ALIASES = {
    "offload-model": "model-offload", "offload-sequential": "sequential-offload",
    "offload-group": "group-offload", "model": "model-offload", "sequential": "sequential-offload",
    "group": "group-offload", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
    "nf4": "nf4-text-encoder", "int8-weights": "int8",
}


class TechniqueError(ValueError):
    """A technique that cannot be applied here (bad combination, missing device or package)."""


@dataclass
class Plan:
    dtype_name: str
    attention: str
    offload: str | None
    flags: set[str] = field(default_factory=set)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    def names(self) -> list[str]:
        """The normalized technique list written to run.json."""
        out = [self.dtype_name, self.attention]
        if self.offload:
            out.append(self.offload)
        out += [t for t in OTHER if t in self.flags]
        return out

    def has(self, name: str) -> bool:
        return name in self.flags or name == self.offload


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def plan(requested: list[str] | tuple[str, ...], *, device: str, pipeline: str,
         num_gpus: int) -> Plan:
    """Normalize and validate the requested techniques for ``device`` and ``pipeline``."""
    names = []
    for raw in requested:
        for part in str(raw).split(","):
            part = part.strip().lower()
            if not part:
                continue
            name = ALIASES.get(part, part)
            if name not in ALL:
                raise TechniqueError(
                    f"unknown technique {part!r}; choose from: {', '.join(ALL)}")
            if name not in names:
                names.append(name)
    cuda = device.startswith("cuda")
    dtypes = [n for n in names if n in DTYPES]
    attns = [n for n in names if n in ATTENTION]
    offs = [n for n in names if n in OFFLOAD]
    if len(dtypes) > 1:
        raise TechniqueError(f"pick one dtype, not {' and '.join(dtypes)}")
    if len(attns) > 1:
        raise TechniqueError(f"pick one attention implementation, not {' and '.join(attns)}")
    if len(offs) > 1:
        raise TechniqueError(f"pick one offload mode, not {' and '.join(offs)}")
    dtype_name = dtypes[0] if dtypes else ("fp16" if cuda else "fp32")
    p = Plan(dtype_name=dtype_name, attention=attns[0] if attns else "sdpa",
             offload=offs[0] if offs else None,
             flags={n for n in names if n in OTHER})

    if p.offload and not cuda:
        raise TechniqueError(f"{p.offload} needs a CUDA device (offloading moves weights "
                             f"between CPU and accelerator); this run is on {device}")
    if p.has("nf4-text-encoder"):
        if not cuda:
            raise TechniqueError("nf4-text-encoder needs a CUDA device (bitsandbytes 4-bit "
                                 f"quantizes on the GPU); this run is on {device}")
        if not _available("bitsandbytes"):
            raise TechniqueError("nf4-text-encoder needs the bitsandbytes package "
                                 "(pip install bitsandbytes)")
    if p.has("int8") and not _available("torchao"):
        raise TechniqueError("int8 needs the torchao package (pip install torchao)")
    if p.has("staged"):
        if pipeline != "pixart-sigma":
            raise TechniqueError("staged is the PixArt-Σ walkthrough; use --pipeline pixart-sigma")
        if p.offload or p.has("balanced"):
            raise TechniqueError("staged already moves components one at a time; "
                                 "drop the offload/balanced technique")
    if p.has("balanced"):
        if not cuda:
            raise TechniqueError(f"balanced needs CUDA GPUs; this run is on {device}")
        if num_gpus < 2:
            raise TechniqueError(f"balanced spreads components over GPUs but only {num_gpus} "
                                 "is visible")
        clash = [n for n in ("tiny-vae", "int8", "nf4-text-encoder") if p.has(n)]
        if p.offload:
            clash.append(p.offload)
        if clash:
            raise TechniqueError(f"balanced (device_map) cannot be combined with "
                                 f"{', '.join(clash)} here")
    if p.dtype_name == "fp16" and not cuda:
        # CPU fp16 kernels are missing or very slow for several ops; bf16 is the CPU half type
        raise TechniqueError("fp16 on CPU is not supported here; use bf16 or fp32")
    return p


# --- application ---------------------------------------------------------------------------------

def apply_module_techniques(pipe: Any, p: Plan, *, seed: int = 0, height: int | None = None,
                            width: int | None = None) -> None:
    """Techniques that only change modules (no device placement). Run before loading."""
    from .pipelines import build_tiny_vae, denoiser

    den = denoiser(pipe)
    if p.has("tiny-vae"):
        vae = build_tiny_vae(p.dtype, seed=seed)
        old = pipe.vae
        if old is not None:
            vae = vae.to(next(old.parameters()).device)
        pipe.vae = vae
    if p.attention == "classic":
        from diffusers.models.attention_processor import AttnProcessor

        den.set_attn_processor(AttnProcessor())
    elif p.attention == "sliced":
        if hasattr(den, "set_attention_slice"):
            pipe.enable_attention_slicing()  # UNets: slice_size "auto" = half the heads
        else:
            # transformers (PixArt) have no set_attention_slice: same processor, half the heads
            from diffusers.models.attention_processor import SlicedAttnProcessor

            heads = den.config.num_attention_heads
            den.set_attn_processor(SlicedAttnProcessor(slice_size=max(1, heads // 2)))
    if p.has("vae-slicing"):
        pipe.vae.enable_slicing()
    if p.has("vae-tiling"):
        pipe.vae.enable_tiling()
        shrink_tiles(pipe.vae, height, width)
    if p.has("nf4-text-encoder"):
        from .pipelines import text_encoders

        for _, enc in text_encoders(pipe):
            to_nf4(enc, compute_dtype=p.dtype)


def shrink_tiles(vae: Any, height: int | None, width: int | None) -> None:
    """Make tiling bite at the pipeline's native resolution.

    AutoencoderKL tiles only images larger than ``config.sample_size`` (512 for SD 1.5, 1024
    for SDXL), so ``enable_tiling()`` alone is a no-op at native resolution (measured: SDXL
    1024² with and without it gave byte-identical traces). Use tiles of half the image side,
    never below 256 px, as users do by setting ``tile_sample_min_size``.
    """
    if not height or not width or not hasattr(vae, "tile_sample_min_size"):
        return
    side = max(height, width)
    if side <= vae.tile_sample_min_size:
        tile = max(256, (side // 2) // 64 * 64)
        scale = vae.tile_sample_min_size // max(1, vae.tile_latent_min_size)
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile // scale


def to_nf4(module: torch.nn.Module, compute_dtype: torch.dtype) -> int:
    """Swap every nn.Linear for bitsandbytes Linear4bit (NF4); weights quantize on .to(cuda).

    This is what transformers' ``replace_with_bnb_linear`` does under
    ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``.
    """
    import bitsandbytes as bnb

    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                  bias=child.bias is not None, compute_dtype=compute_dtype,
                                  quant_type="nf4", device="cpu")
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                         quant_type="nf4")
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(module, name, q)
            count += 1
        else:
            count += to_nf4(child, compute_dtype)
    return count


def quantize_int8(module: torch.nn.Module) -> None:
    """torchao int8 weight-only quantization of every Linear in ``module`` (in place)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(module, Int8WeightOnlyConfig())


def apply_offload(pipe: Any, p: Plan, device: torch.device) -> None:
    if p.offload == "model-offload":
        pipe.enable_model_cpu_offload(device=device)
    elif p.offload == "sequential-offload":
        pipe.enable_sequential_cpu_offload(device=device)
    elif p.offload == "group-offload":
        pipe.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"),
                                  offload_type="block_level", num_blocks_per_group=1)
