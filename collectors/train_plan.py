"""Training techniques: names, validation, and how each is built (optimizer, LoRA, EMA, AMP).

Like :mod:`collectors.techniques` for inference: an impossible request raises
:class:`~collectors.techniques.TechniqueError` with one clear line before any heavy work.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from .techniques import TechniqueError

PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
ATTENTION = ("sdpa", "classic")
FLAGS = ("checkpointing", "ema", "keep-grads")
ALL = PRECISIONS + ATTENTION + FLAGS
ALIASES = {
    "float32": "fp32",
    "amp": "amp-fp16",
    "fp16-amp": "amp-fp16",
    "bf16-amp": "amp-bf16",
    "bfloat16": "bf16",
    "gradient-checkpointing": "checkpointing",
    "zero-grad-keep": "keep-grads",
    "set-to-none-false": "keep-grads",
}
OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-loop", "adamw-fused", "adamw8bit", "adafactor", "sgd")

HELP = {
    "fp32": "weights, activations and gradients in float32",
    "amp-fp16": "fp32 master weights, torch.autocast(float16) + GradScaler",
    "amp-bf16": "fp32 master weights, torch.autocast(bfloat16)",
    "bf16": "weights, gradients and optimizer state in bfloat16 (no master copy)",
    "sdpa": "F.scaled_dot_product_attention (diffusers' default)",
    "classic": "AttnProcessor: materializes the QK^T score matrix, saved for backward",
    "checkpointing": "denoiser.enable_gradient_checkpointing(): recompute blocks in backward",
    "ema": "diffusers EMAModel: a copy of the trainable weights updated after each step",
    "keep-grads": "optimizer.zero_grad(set_to_none=False): gradients stay allocated (zeroed)",
}
# inference-only techniques: named so the error says why, not just "unknown"
_INFERENCE_ONLY = (
    "fp16",
    "sliced",
    "vae-slicing",
    "vae-tiling",
    "tiny-vae",
    "model-offload",
    "sequential-offload",
    "group-offload",
    "int8",
    "nf4-text-encoder",
    "staged",
    "balanced",
)


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass
class TrainPlan:
    precision: str
    attention: str
    optimizer: str
    lora_rank: int
    accumulate: int
    checkpointing: bool = False
    ema: bool = False
    set_to_none: bool = True

    @property
    def weight_dtype(self) -> torch.dtype:
        """dtype of the trained weights (AMP keeps fp32 masters)."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    @property
    def frozen_dtype(self) -> torch.dtype:
        """dtype of frozen (LoRA base) weights: AMP runs them in the autocast dtype, as
        diffusers' LoRA scripts do, since no master copy is needed for weights never updated."""
        return self.autocast_dtype or self.weight_dtype

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(self.precision)

    def names(self) -> list[str]:
        """The normalized technique list written to run.json."""
        out = [self.precision, self.attention, self.optimizer, f"lora-r{self.lora_rank}" if self.lora_rank else "full"]
        if self.accumulate > 1:
            out.append(f"accumulate-{self.accumulate}")
        out += [
            f
            for f, on in (
                ("checkpointing", self.checkpointing),
                ("ema", self.ema),
                ("keep-grads", not self.set_to_none),
            )
            if on
        ]
        return out


def plan(
    requested: list[str] | tuple[str, ...],
    *,
    device: str,
    optimizer: str = "adamw",
    lora_rank: int = 0,
    accumulate: int = 1,
) -> TrainPlan:
    """Normalize and validate training techniques for ``device``."""
    names: list[str] = []
    for raw in requested:
        for part in str(raw).split(","):
            part = part.strip().lower()
            if not part:
                continue
            name = ALIASES.get(part, part)
            if name in _INFERENCE_ONLY:
                hint = " (use amp-fp16 or bf16)" if name == "fp16" else ""
                raise TechniqueError(
                    f"{name} is an inference technique, not one for --train"
                    f"{hint}; training techniques: {', '.join(ALL)}"
                )
            if name not in ALL:
                raise TechniqueError(f"unknown training technique {part!r}; choose from: {', '.join(ALL)}")
            if name not in names:
                names.append(name)
    cuda = device.startswith("cuda")
    precisions = [n for n in names if n in PRECISIONS]
    attns = [n for n in names if n in ATTENTION]
    if len(precisions) > 1:
        raise TechniqueError(f"pick one precision, not {' and '.join(precisions)}")
    if len(attns) > 1:
        raise TechniqueError(f"pick one attention implementation, not {' and '.join(attns)}")
    if optimizer not in OPTIMIZERS:
        raise TechniqueError(f"unknown optimizer {optimizer!r}; choose from: {', '.join(OPTIMIZERS)}")
    if lora_rank < 0:
        raise TechniqueError("--lora-rank must be 0 (full fine-tuning) or a positive rank")
    if accumulate < 1:
        raise TechniqueError("--accumulate must be at least 1")
    p = TrainPlan(
        precision=precisions[0] if precisions else ("amp-fp16" if cuda else "fp32"),
        attention=attns[0] if attns else "sdpa",
        optimizer=optimizer,
        lora_rank=lora_rank,
        accumulate=accumulate,
        checkpointing="checkpointing" in names,
        ema="ema" in names,
        set_to_none="keep-grads" not in names,
    )
    if p.precision == "amp-fp16" and not cuda:
        raise TechniqueError(
            "amp-fp16 (autocast float16 + GradScaler) needs a CUDA device; "
            f"this run is on {device} (use amp-bf16 or fp32)"
        )
    if optimizer == "adamw8bit":
        if not cuda:
            raise TechniqueError(f"adamw8bit (bitsandbytes AdamW8bit) needs a CUDA device; this run is on {device}")
        if not _available("bitsandbytes"):
            raise TechniqueError("adamw8bit needs the bitsandbytes package (pip install bitsandbytes)")
    if optimizer == "adafactor" and not _available("transformers"):
        raise TechniqueError("adafactor is transformers.optimization.Adafactor: pip install transformers")
    if lora_rank and not _available("peft"):
        raise TechniqueError("--lora-rank needs the peft package (pip install peft)")
    return p


# --- building ------------------------------------------------------------------------------------


def make_optimizer(params: list[torch.nn.Parameter], p: TrainPlan, lr: float) -> Any:
    if p.optimizer == "adamw":  # torch's default: foreach on CUDA
        return torch.optim.AdamW(params, lr=lr)
    if p.optimizer == "adamw-foreach":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    if p.optimizer == "adamw-loop":
        return torch.optim.AdamW(params, lr=lr, foreach=False)
    if p.optimizer == "adamw-fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if p.optimizer == "adamw8bit":
        import bitsandbytes as bnb  # CUDA-only package: imported only when asked for

        return bnb.optim.AdamW8bit(params, lr=lr)
    if p.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # a fixed learning rate, as fine-tuning scripts use it (relative_step needs lr=None)
        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    return torch.optim.SGD(params, lr=lr)


def add_lora(model: torch.nn.Module, rank: int) -> None:
    """peft LoRA on the attention projections (diffusers' LoRA training scripts' targets)."""
    from peft import LoraConfig

    model.add_adapter(
        LoraConfig(
            r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=["to_k", "to_q", "to_v", "to_out.0"]
        )
    )


def set_attention(model: torch.nn.Module, attention: str) -> None:
    if attention == "classic":
        from diffusers.models.attention_processor import AttnProcessor

        model.set_attn_processor(AttnProcessor())


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) optimizer-state value."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def state_bytes(optimizer: Any) -> dict[str, int]:
    """Optimizer state on the device, by state key (``exp_avg``, ``state1``, ...); a tensor
    shared by several parameters (bitsandbytes' quantization maps) counts once."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    for st in optimizer.state.values():
        for key, val in st.items():
            if isinstance(val, torch.Tensor) and val.dim() > 0 and val.data_ptr() not in seen:
                seen.add(val.data_ptr())
                out[key] = out.get(key, 0) + tensor_bytes(val)
    return out
