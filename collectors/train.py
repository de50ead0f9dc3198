"""One recorded fine-tuning run of a pipeline's denoiser (``snapviz collect --train``).

The UNet (SD 1.5, SDXL) or DiT (PixArt-Σ) trains with the standard noise-prediction loss:
random latents are noised at random timesteps (DDPM schedule) and the model predicts the
noise, conditioned on text embeddings pre-computed once (random, the shapes the pipeline's
text encoders produce), so neither text encoders nor VAE are on the GPU. Each optimizer step
runs ``accumulate`` micro-batches of ``batch`` samples; phases are labelled by
:class:`~collectors.train_record.TrainRecorder` and stay contiguous from ``load`` to the end.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import distributed
from . import train_plan as tp
from .pipelines import build_denoiser, default_resolution
from .recorder import DEFAULT_MAX_ENTRIES, recording_args
from .techniques import TechniqueError
from .train_record import TrainRecorder

TEXT_TOKENS = {"sd15": 77, "sdxl": 77, "pixart-sigma": 300}  # what each pipeline pads to


@dataclass
class TrainOptions:
    pipeline: str
    size: str = "tiny"
    device: str = "auto"
    steps: int = 2
    height: int | None = None
    width: int | None = None
    batch: int = 1
    accumulate: int = 1
    optimizer: str = "adamw"
    lora_rank: int = 0
    lr: float = 1e-5
    techniques: list[str] = field(default_factory=list)
    profile: bool = False
    profile_scope: str = "all"
    stacks: str = "python"
    context: str = "all"
    max_entries: int = DEFAULT_MAX_ENTRIES
    history: bool = True
    seed: int = 0
    sync_stages: bool = False
    out: str | None = None
    memory_limit_gb: float | None = None
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF given by --alloc-conf

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def command(self, p: tp.TrainPlan) -> str:
        """The CLI that reproduces this run."""
        args = [
            "snapviz",
            "collect",
            "--train",
            "--pipeline",
            self.pipeline,
            "--size",
            self.size,
            "--device",
            self.resolved_device(),
            "--steps",
            str(self.steps),
            "--height",
            str(self.height),
            "--width",
            str(self.width),
            "--batch",
            str(self.batch),
            "--accumulate",
            str(self.accumulate),
            "--optimizer",
            p.optimizer,
            "--lora-rank",
            str(p.lora_rank),
        ]
        for t in [p.precision, p.attention] + [n for n in p.names() if n in tp.FLAGS]:
            args += ["--technique", t]
        return shlex.join(args + recording_args(self))


def validate(opts: TrainOptions) -> tp.TrainPlan:
    """Check options before any heavy work; raises ValueError/TechniqueError with one line."""
    device = opts.resolved_device()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TechniqueError(f"--device cuda but torch sees no CUDA device (torch {torch.__version__})")
    if opts.steps < 1 or opts.batch < 1:
        raise ValueError("--steps and --batch must be at least 1")
    res = default_resolution(opts.pipeline, opts.size)
    opts.height = opts.height or res
    opts.width = opts.width or res
    if opts.height % 8 or opts.width % 8:
        raise ValueError("--height and --width must be multiples of 8")
    if opts.memory_limit_gb is not None and not device.startswith("cuda"):
        raise ValueError("--memory-limit-gb caps the CUDA caching allocator; this run is on cpu")
    return tp.plan(
        opts.techniques, device=device, optimizer=opts.optimizer, lora_rank=opts.lora_rank, accumulate=opts.accumulate
    )


def prepare_model(opts: TrainOptions, p: tp.TrainPlan) -> torch.nn.Module:
    """The denoiser on the CPU, set up for training: dtypes, LoRA or full, attention, ckpt."""
    dtype = p.frozen_dtype if p.lora_rank else p.weight_dtype
    model = build_denoiser(opts.pipeline, opts.size, dtype, seed=opts.seed)
    tp.set_attention(model, p.attention)
    if p.lora_rank:
        tp.add_lora(model, p.lora_rank)  # base weights stay frozen
        for param in model.parameters():
            if param.requires_grad:  # trainable LoRA weights keep full precision under AMP
                param.data = param.data.to(p.weight_dtype)
    else:
        model.requires_grad_(True)
    if p.checkpointing:
        model.enable_gradient_checkpointing()
    return model.train()


class Batch:
    """Pre-computed conditioning for one micro-batch and the model call that uses it."""

    def __init__(
        self,
        model: torch.nn.Module,
        pipeline: str,
        batch: int,
        height: int,
        width: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        cfg = model.config
        gen = torch.Generator(device="cpu").manual_seed(1)
        self.pipeline, self.batch, self.device, self.dtype = pipeline, batch, device, dtype
        self.latent_shape = (batch, cfg.in_channels, height // 8, width // 8)
        tokens = TEXT_TOKENS[pipeline]
        self.kwargs: dict[str, Any] = {}
        if pipeline == "pixart-sigma":
            self.kwargs["encoder_hidden_states"] = torch.randn(batch, tokens, cfg.caption_channels, generator=gen).to(
                device, dtype
            )
            self.kwargs["encoder_attention_mask"] = torch.ones(batch, tokens, device=device)
            self.kwargs["added_cond_kwargs"] = {"resolution": None, "aspect_ratio": None}
        else:
            self.kwargs["encoder_hidden_states"] = torch.randn(
                batch, tokens, cfg.cross_attention_dim, generator=gen
            ).to(device, dtype)
            if cfg.addition_embed_type == "text_time":  # SDXL's pooled embeds + size ids
                pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
                ids = torch.tensor([height, width, 0, 0, height, width], dtype=dtype)
                self.kwargs["added_cond_kwargs"] = {
                    "text_embeds": torch.randn(batch, pooled, generator=gen).to(device, dtype),
                    "time_ids": ids.repeat(batch, 1).to(device),
                }
        from diffusers import DDPMScheduler

        self.scheduler = DDPMScheduler(
            num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear"
        )
        self.scheduler.alphas_cumprod = self.scheduler.alphas_cumprod.to(device)

    def loss(self, model: torch.nn.Module) -> torch.Tensor:
        latents = torch.randn(self.latent_shape, device=self.device, dtype=self.dtype)
        noise = torch.randn_like(latents)
        t = torch.randint(0, 1000, (self.batch,), device=self.device)
        noisy = self.scheduler.add_noise(latents, noise, t)
        if self.pipeline == "pixart-sigma":
            pred = model(noisy, timestep=t, return_dict=False, **self.kwargs)[0]
            pred = pred[:, : noise.shape[1]]  # the learned-sigma half is not in this loss
        else:
            pred = model(noisy, t, return_dict=False, **self.kwargs)[0]
        return F.mse_loss(pred.float(), noise.float())


def _param_stats(model: torch.nn.Module) -> dict[str, Any]:
    out: dict[str, Any] = {
        "trainable": 0,
        "frozen": 0,
        "trainable_bytes": 0,
        "frozen_bytes": 0,
        "trainable_dtypes": {},
        "frozen_dtypes": {},
    }
    for param in model.parameters():
        kind = "trainable" if param.requires_grad else "frozen"
        out[kind] += param.numel()
        out[f"{kind}_bytes"] += param.numel() * param.element_size()
        d = str(param.dtype).replace("torch.", "")
        out[f"{kind}_dtypes"][d] = out[f"{kind}_dtypes"].get(d, 0) + param.numel()
    return out


def run_training(
    opts: TrainOptions, p: tp.TrainPlan | None = None, on_step: Callable[[int], None] | None = None
) -> Path:
    """Record one fine-tuning run; returns the run directory."""
    p = p or validate(opts)
    device = torch.device(opts.resolved_device())
    own_group = distributed.init_from_launcher(device.type)  # under torchrun: DDP, one dir a rank
    if own_group:
        device = distributed.local_device(device.type)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out = Path(
        distributed.agree(
            opts.out
            or str(
                Path("runs") / f"train-{opts.pipeline}-{opts.size}-"
                f"{'-'.join(p.names())}-{time.strftime('%Y%m%d-%H%M%S')}"
            )
        )
    )
    opts.out = str(out)
    torch.manual_seed(opts.seed)
    build_t0 = time.perf_counter()
    model = prepare_model(opts, p)
    build_s = time.perf_counter() - build_t0
    train: dict[str, Any] = {
        "precision": p.precision,
        "optimizer": p.optimizer,
        "lora_rank": p.lora_rank,
        "accumulate": p.accumulate,
        "micro_batch": opts.batch,
        "effective_batch": opts.batch * p.accumulate,
        "checkpointing": p.checkpointing,
        "ema": p.ema,
        "set_to_none": p.set_to_none,
        "attention": p.attention,
        "lr": opts.lr,
        "params": _param_stats(model),
    }
    rank = distributed.rank_info()
    if rank:
        train["ddp"] = {"backend": rank.get("backend"), "world_size": rank.get("world_size"), "bucket_cap_mb": 25}
    meta: dict[str, Any] = {
        "pipeline": opts.pipeline,
        "size": opts.size,
        "mode": "train",
        "techniques": p.names() + (["ddp"] if rank else []),
        "height": opts.height,
        "width": opts.width,
        "steps": opts.steps,
        "batch": opts.batch,
        "dtype": str(p.weight_dtype).split(".")[-1],
        "seed": opts.seed,
        "command": opts.command(p),
        "build_s": round(build_s, 3),
        "profile": opts.profile,
        "profile_scope": opts.profile_scope if opts.profile else None,
        "env": {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "train": train,
    }
    rec = TrainRecorder(
        model,
        out,
        device=device,
        stacks=opts.stacks,
        context=opts.context,
        max_entries=opts.max_entries,
        history=opts.history,
        profile=opts.profile,
        profile_scope=opts.profile_scope,
        initial_stage="load",
        meta=meta,
        sync_stages=opts.sync_stages,
    )
    cuda = device.type == "cuda"
    if opts.memory_limit_gb and cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        limit = int(opts.memory_limit_gb * 1024**3)
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        rec.meta["memory_limit_bytes"] = limit
        rec.meta["memory_fraction"] = min(1.0, limit / total)
    with rec:
        # load: weights, conditioning, optimizer (its state is allocated by the first step)
        model.to(device)
        net = distributed.wrap_ddp(model, device)  # gradients all-reduced in buckets under torchrun
        params = [q for q in model.parameters() if q.requires_grad]
        assert opts.height is not None and opts.width is not None  # set by validate()
        inputs = Batch(model, opts.pipeline, opts.batch, opts.height, opts.width, device, p.weight_dtype)
        optimizer = tp.make_optimizer(params, p, opts.lr)
        scaler = torch.amp.GradScaler(device.type) if p.precision == "amp-fp16" else None
        ema = None
        if p.ema:
            from diffusers.training_utils import EMAModel

            ema = EMAModel(params)
        step_s: list[float] = []
        if rank:  # the same weights on every rank (DDP broadcasts rank 0's), different data
            torch.manual_seed(opts.seed + 1000 * (1 + int(rank.get("rank") or 0)))
        for step in range(opts.steps):
            t0 = time.perf_counter()
            for _ in range(p.accumulate):
                with rec.phase("forward", chain=True):
                    with torch.autocast(device.type, dtype=p.autocast_dtype, enabled=p.autocast_dtype is not None):
                        loss = inputs.loss(net) / p.accumulate
                rec.backward(scaler.scale(loss) if scaler else loss, chain=True)
                del loss
            with rec.phase("optimizer", chain=True):
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                if ema is not None:
                    ema.step(params)
            if step == opts.steps - 1:  # what the last step held, before zero_grad frees it
                train["gradient_bytes"] = sum(
                    q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None
                )
                train["optimizer_state_bytes"] = tp.state_bytes(optimizer)
                train["ema_bytes"] = sum(tp.tensor_bytes(s) for s in ema.shadow_params) if ema is not None else 0
            with rec.phase("zero_grad", chain=True):
                optimizer.zero_grad(set_to_none=p.set_to_none)
            rec.next_step()
            if cuda:  # honest step time; between steps, so no phase's memory changes
                torch.cuda.synchronize(device)
            step_s.append(round(time.perf_counter() - t0, 6))
            if on_step is not None:
                on_step(step)
        rec.mark("other")
        train["step_wall_s"] = step_s
    distributed.finish(own_group)
    return rec.out_dir  # OUT/rank<R>/ under torch.distributed, else OUT
