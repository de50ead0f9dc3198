"""Memory techniques: names, validation, and how each is applied to a pipeline.

Every technique is combinable unless ``validate`` says otherwise; an impossible request raises
:class:`TechniqueError` with one clear line, never a silent no-op.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from . import quantize as qz
from .flow_pipelines import FLOW_PIPELINES as FLOW
from .quantize import DENOISER_QUANT

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ATTENTION = ("sdpa", "classic", "sliced")
OFFLOAD = ("model-offload", "sequential-offload", "group-offload", "group-offload-leaf")
OTHER = (
    "vae-slicing",
    "vae-tiling",
    "tiny-vae",
    "int8",
    "nf4-text-encoder",
    "staged",
    "balanced",
    "no-t5",
    "nf4-transformer",
    "fp8",
    "qint8",
    "qfloat8",
    "layerwise-fp8",
    "offload-stream",
)
ALL = tuple(DTYPES) + ATTENTION + OFFLOAD + OTHER
ALIASES = {
    "offload-model": "model-offload",
    "offload-sequential": "sequential-offload",
    "offload-group": "group-offload",
    "model": "model-offload",
    "sequential": "sequential-offload",
    "group": "group-offload",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "nf4": "nf4-text-encoder",
    "int8-weights": "int8",
    "nf4-t5": "nf4-text-encoder",
    "nf4-denoiser": "nf4-transformer",
    "group-offload-block": "group-offload",
    "offload-group-leaf": "group-offload-leaf",
    "leaf": "group-offload-leaf",
    "layerwise-casting": "layerwise-fp8",
    "fp8-layerwise": "layerwise-fp8",
    "without-t5": "no-t5",
    "quanto-int8": "qint8",
    "quanto-fp8": "qfloat8",
    "torchao-int8": "int8",
    "torchao-fp8": "fp8",
}
# techniques that change how weights are stored, or where they live between uses: the pipeline
# is built on the CPU and the technique applied there, as a checkpoint load would
CPU_FIRST = (
    "nf4-text-encoder",
    "nf4-transformer",
    "int8",
    "fp8",
    "qint8",
    "qfloat8",
    "layerwise-fp8",
    "staged",
    "balanced",
)  # torchao/quanto: built like int8 always was


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

    def build_on_device(self, pipeline: str) -> bool:
        """Flux/SD 3.5 are built on the target device unless weights start on the CPU."""
        return pipeline in FLOW and not self.offload and not any(self.has(n) for n in CPU_FIRST)


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # "optimum.quanto" without optimum
        return False


def plan(requested: list[str] | tuple[str, ...], *, device: str, pipeline: str, num_gpus: int) -> Plan:
    """Normalize and validate the requested techniques for ``device`` and ``pipeline``."""
    names = []
    for raw in requested:
        for part in str(raw).split(","):
            part = part.strip().lower()
            if not part:
                continue
            name = ALIASES.get(part, part)
            if name not in ALL:
                raise TechniqueError(f"unknown technique {part!r}; choose from: {', '.join(ALL)}")
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
    p = Plan(
        dtype_name=dtype_name,
        attention=attns[0] if attns else "sdpa",
        offload=offs[0] if offs else None,
        flags={n for n in names if n in OTHER},
    )

    if p.offload and not cuda:
        raise TechniqueError(
            f"{p.offload} needs a CUDA device (offloading moves weights "
            f"between CPU and accelerator); this run is on {device}"
        )
    _check_weights(p, device=device, pipeline=pipeline)
    if p.has("staged"):
        if pipeline != "pixart-sigma":
            raise TechniqueError("staged is the PixArt-Σ walkthrough; use --pipeline pixart-sigma")
        if p.offload or p.has("balanced"):
            raise TechniqueError("staged already moves components one at a time; drop the offload/balanced technique")
    if p.has("balanced"):
        if not cuda:
            raise TechniqueError(f"balanced needs CUDA GPUs; this run is on {device}")
        if num_gpus < 2:
            raise TechniqueError(f"balanced spreads components over GPUs but only {num_gpus} is visible")
        clash = [n for n in ("tiny-vae", "nf4-text-encoder", *DENOISER_QUANT) if p.has(n)]
        if p.offload:
            clash.append(p.offload)
        if clash:
            raise TechniqueError(f"balanced (device_map) cannot be combined with {', '.join(clash)} here")
    if p.dtype_name == "fp16" and not cuda:
        # CPU fp16 kernels are missing or very slow for several ops; bf16 is the CPU half type
        raise TechniqueError("fp16 on CPU is not supported here; use bf16 or fp32")
    return p


def _check_weights(p: Plan, *, device: str, pipeline: str) -> None:
    """Quantization, T5 and architecture checks (one TechniqueError line each)."""
    cuda = device.startswith("cuda")
    quants = [n for n in DENOISER_QUANT if p.has(n)]
    if len(quants) > 1:
        raise TechniqueError(f"pick one weight format for the denoiser, not {' and '.join(quants)}")
    for name in ("nf4-text-encoder", "nf4-transformer"):
        if p.has(name):
            if not cuda:
                raise TechniqueError(
                    f"{name} needs a CUDA device (bitsandbytes 4-bit quantizes on the GPU); this run is on {device}"
                )
            if not _available("bitsandbytes"):
                raise TechniqueError(f"{name} needs the bitsandbytes package (pip install bitsandbytes)")
    for name in ("int8", "fp8"):
        if p.has(name) and not _available("torchao"):
            raise TechniqueError(f"{name} needs the torchao package (pip install torchao)")
    if p.has("fp8"):
        if not cuda:
            raise TechniqueError(f"fp8 (torchao float8 weights) needs a CUDA GPU; this run is on {device}")
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if (major, minor) < (8, 9):
            raise TechniqueError(
                f"fp8 needs a GPU of compute capability 8.9 or newer (this one is "
                f"{major}.{minor}); use layerwise-fp8 or int8"
            )
    for name in ("qint8", "qfloat8"):
        if p.has(name) and not _available("optimum.quanto"):
            raise TechniqueError(f"{name} needs the optimum-quanto package (pip install optimum-quanto)")
        if p.has(name) and p.offload:
            raise TechniqueError(
                f"{name} cannot be offloaded: quanto's frozen weights cannot be moved "
                f"between devices (Module.to fails); drop {p.offload}"
            )
    if p.has("offload-stream") and p.offload not in ("group-offload", "group-offload-leaf"):
        raise TechniqueError(
            "offload-stream overlaps group offloading's transfers with compute; add group-offload or group-offload-leaf"
        )
    if p.has("no-t5") and not pipeline.startswith("sd35"):
        raise TechniqueError(f"no-t5 drops SD 3.5's optional third text encoder; {pipeline} cannot run without its T5")
    if pipeline in FLOW:
        clash: list[str] = [n for n in ("classic", "sliced") if p.attention == n]
        clash += [n for n in ("tiny-vae",) if p.has(n)]
        if clash:
            raise TechniqueError(
                f"{clash[0]} does not apply to {pipeline} (joint-attention processors; 16-channel latents)"
            )


# --- application ---------------------------------------------------------------------------------


def apply_module_techniques(
    pipe: Any, p: Plan, *, seed: int = 0, height: int | None = None, width: int | None = None
) -> None:
    """Techniques that only change modules (no device placement). Run before loading."""
    from .pipelines import build_tiny_vae, denoiser

    den: Any = denoiser(pipe)
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
            qz.to_nf4(enc, compute_dtype=p.dtype)
    if p.has("nf4-transformer"):
        qz.to_nf4(den, compute_dtype=p.dtype)
    elif p.has("layerwise-fp8"):
        qz.layerwise_fp8(den, compute_dtype=p.dtype)


def quantize_after_load(pipe: Any, p: Plan) -> None:
    """torchao and quanto quantize the weights where they are: on the GPU after loading, or on
    the CPU under offloading (the runner calls this at the right moment). Quanto's frozen
    weights cannot be moved afterwards: ``Module.to`` fails with "Couldn't swap QConv2d.weight"
    (measured, torch 2.13), so they are never quantized before a move."""
    from .pipelines import denoiser

    if p.has("int8") or p.has("fp8"):
        qz.quantize_torchao(denoiser(pipe), "int8" if p.has("int8") else "fp8")
    elif p.has("qint8") or p.has("qfloat8"):
        qz.quantize_quanto(denoiser(pipe), "qint8" if p.has("qint8") else "qfloat8")


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


def apply_offload(pipe: Any, p: Plan, device: torch.device, blocks_per_group: int = 1) -> None:
    if p.offload == "model-offload":
        pipe.enable_model_cpu_offload(device=device)
    elif p.offload == "sequential-offload":
        pipe.enable_sequential_cpu_offload(device=device)
    elif p.offload in ("group-offload", "group-offload-leaf"):
        kw: dict[str, Any] = dict(offload_type="block_level", num_blocks_per_group=blocks_per_group)
        if p.offload == "group-offload-leaf":
            kw = dict(offload_type="leaf_level")
        pipe.enable_group_offload(
            onload_device=device, offload_device=torch.device("cpu"), use_stream=p.has("offload-stream"), **kw
        )
