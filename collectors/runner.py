"""One recorded pipeline run: build, apply techniques, load, generate, write the run directory."""

from __future__ import annotations

import gc
import os
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import techniques as tq
from .flow_pipelines import default_max_sequence_length
from .pipelines import FLOW_PIPELINES, build_pipeline, default_resolution, denoiser
from .recorder import DEFAULT_MAX_ENTRIES, Recorder, recording_args

PROMPT = "a photo of an astronaut riding a horse on mars"


@dataclass
class RunOptions:
    pipeline: str
    size: str = "tiny"
    model: str | None = None
    device: str = "auto"
    steps: int = 4
    height: int | None = None
    width: int | None = None
    batch: int = 1
    techniques: list[str] = field(default_factory=list)
    profile: bool | None = None  # None: on exactly when no CUDA snapshot is recorded (see validate)
    profile_scope: str = "all"
    stacks: str = "python"
    context: str = "all"
    max_entries: int = DEFAULT_MAX_ENTRIES
    history: bool = True
    seed: int = 0
    sync_stages: bool = False
    out: str | None = None
    save_image: bool = True
    memory_limit_gb: float | None = None
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF given by --alloc-conf
    max_sequence_length: int | None = None  # T5 tokens (PixArt, Flux, SD 3.5); None: pipeline's
    blocks_per_group: int = 1  # group-offload: blocks moved together

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def command(self, p: tq.Plan) -> str:
        """The CLI that reproduces this run."""
        args = ["snapviz", "collect", "--pipeline", self.pipeline]
        args += ["--model", self.model] if self.model else ["--size", self.size]
        args += [
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
        ]
        for t in p.names():
            args += ["--technique", t]
        if self.max_sequence_length:
            args += ["--max-sequence-length", str(self.max_sequence_length)]
        if self.blocks_per_group != 1:
            args += ["--offload-blocks", str(self.blocks_per_group)]
        return shlex.join(args + recording_args(self))


def validate(opts: RunOptions) -> tq.Plan:
    """Check options before any heavy work; raises ValueError/TechniqueError with one line."""
    device = opts.resolved_device()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise tq.TechniqueError(f"--device cuda but torch sees no CUDA device (torch {torch.__version__})")
    if opts.steps < 1:
        raise ValueError("--steps must be at least 1")
    if opts.batch < 1:
        raise ValueError("--batch must be at least 1")
    res = default_resolution(opts.pipeline, opts.size)
    opts.height = opts.height or res
    opts.width = opts.width or res
    if opts.height % 8 or opts.width % 8:
        raise ValueError("--height and --width must be multiples of 8")
    if opts.model and not Path(opts.model).is_dir():
        raise ValueError(f"--model {opts.model}: not a local directory (no hub access here)")
    # A run directory must hold something `snapviz analyze` can read: without a CUDA memory
    # snapshot (CPU runs, --no-history) the profiler trace's memory events are the record.
    writes_snapshot = device.startswith("cuda") and opts.history
    if opts.profile is None:
        opts.profile = not writes_snapshot
    elif not opts.profile and not device.startswith("cuda"):
        # on CUDA, run.json still holds the allocator's own per-stage peaks (what `fit` and
        # `matrix` measure with --no-history --no-profile); on the CPU nothing would be left
        raise ValueError(
            "--no-profile: a CPU run has no CUDA memory snapshot, so the run directory would hold "
            "nothing to analyse; drop --no-profile"
        )
    _check_sequence_length(opts)
    if opts.blocks_per_group < 1:
        raise ValueError("--offload-blocks must be at least 1")
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    if opts.memory_limit_gb is not None and not device.startswith("cuda"):
        raise ValueError("--memory-limit-gb caps the CUDA caching allocator; this run is on cpu")
    return tq.plan(opts.techniques, device=device, pipeline=opts.pipeline, num_gpus=gpus)


def _check_sequence_length(opts: RunOptions) -> None:
    n = opts.max_sequence_length
    if n is None:
        return
    if opts.pipeline in ("sd15", "sdxl"):
        raise ValueError(f"--max-sequence-length sets T5's prompt length; {opts.pipeline} has only CLIP (77 tokens)")
    top = 512 if opts.pipeline.startswith("flux") or opts.pipeline.startswith("sd35") else 300
    if not 1 <= n <= top:
        raise ValueError(f"--max-sequence-length must be between 1 and {top} for {opts.pipeline}")


def default_out(opts: RunOptions, p: tq.Plan) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(Path("runs") / f"{opts.pipeline}-{opts.model and 'model' or opts.size}-{'-'.join(p.names())}-{stamp}")


def _call_kwargs(opts: RunOptions, generator: torch.Generator) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        num_inference_steps=opts.steps,
        height=opts.height,
        width=opts.width,
        num_images_per_prompt=opts.batch,
        generator=generator,
    )
    if opts.pipeline == "pixart-sigma":
        kw.update(clean_caption=False, use_resolution_binning=False)
    if opts.pipeline in FLOW_PIPELINES:
        kw["max_sequence_length"] = opts.max_sequence_length or default_max_sequence_length(opts.pipeline)
        if opts.pipeline == "flux-schnell":
            kw["guidance_scale"] = 0.0  # timestep-distilled: no guidance embedding, no CFG
    elif opts.max_sequence_length:
        kw["max_sequence_length"] = opts.max_sequence_length
    return kw


def run(opts: RunOptions, p: tq.Plan | None = None, on_step: Callable[[int], None] | None = None) -> Path:
    """Record one run; returns the run directory."""
    p = p or validate(opts)
    # transformers loads checkpoints on worker threads; memory metadata is thread-local, so
    # those allocations would carry no stage label
    os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")
    device = torch.device(opts.resolved_device())
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out = Path(opts.out or default_out(opts, p))
    opts.out = str(out)
    torch.manual_seed(opts.seed)

    build_t0 = time.perf_counter()
    # Flux/SD 3.5 on CUDA are built inside the recording, straight on the GPU: the load stage
    # is then their construction (no CPU copy of a 12B transformer)
    on_device = not opts.model and device.type == "cuda" and p.build_on_device(opts.pipeline)
    no_t5: dict[str, Any] = {"text_encoder_3": None, "tokenizer_3": None} if p.has("no-t5") else {}
    pipe: Any = None
    if opts.model:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(opts.model, dtype=p.dtype, **no_t5)
    elif not on_device:
        pipe = build_pipeline(opts.pipeline, opts.size, p.dtype, seed=opts.seed, t5=not no_t5)
    if pipe is not None:
        pipe.set_progress_bar_config(disable=True)

    tmpdir = None
    if p.has("balanced"):  # (never on_device: built and prepared in the load stage below)
        # device_map="balanced" exists only in from_pretrained: save the in-code pipeline first
        if not opts.model:
            tmpdir = tempfile.TemporaryDirectory(prefix="snapviz-balanced-")
            pipe.save_pretrained(tmpdir.name)
        source = opts.model or tmpdir.name  # type: ignore[union-attr]  # tmpdir set where no --model
        del pipe
        gc.collect()
        pipe = None
    elif not on_device:
        tq.apply_module_techniques(pipe, p, seed=opts.seed, height=opts.height, width=opts.width)
        if p.offload:
            tq.quantize_after_load(pipe, p)  # offload keeps weights on CPU: quantize there
    build_s = time.perf_counter() - build_t0

    meta: dict[str, Any] = {
        "pipeline": opts.pipeline,
        "size": "model" if opts.model else opts.size,
        "model": opts.model,
        "techniques": p.names(),
        "height": opts.height,
        "width": opts.width,
        "steps": opts.steps,
        "batch": opts.batch,
        "dtype": p.dtype_name,
        "seed": opts.seed,
        "prompt": PROMPT,
        "command": opts.command(p),
        "build_s": round(build_s, 3),
        "profile": opts.profile,
        "built_on_device": on_device,
        "max_sequence_length": _call_kwargs(opts, torch.Generator()).get("max_sequence_length"),
        "profile_scope": opts.profile_scope if opts.profile else None,
        "env": {k: os.environ.get(k) for k in ("HF_DEACTIVATE_ASYNC_LOAD", "CUDA_VISIBLE_DEVICES")},
    }
    if p.has("vae-tiling"):
        meta["vae_tiling"] = {"tile_sample_min_size": None}
    devices = (
        list(range(torch.cuda.device_count()))
        if p.has("balanced")
        else ([device.index] if device.type == "cuda" else [])
    )
    rec = Recorder(
        pipe,
        out,
        device=device,
        stacks=opts.stacks,
        context=opts.context,
        max_entries=opts.max_entries,
        history=opts.history,
        profile=bool(opts.profile),
        profile_scope=opts.profile_scope,
        devices=devices,
        initial_stage="load",
        meta=meta,
        on_step=on_step,
        sync_stages=opts.sync_stages,
    )
    if opts.memory_limit_gb and device.type == "cuda":
        # pretend to be a smaller GPU: the caching allocator refuses to grow past the cap
        total = torch.cuda.get_device_properties(device).total_memory
        limit = int(opts.memory_limit_gb * 1024**3)
        for d in devices:
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), d)
        rec.meta["memory_limit_bytes"] = limit
        rec.meta["memory_fraction"] = min(1.0, limit / total)
    generator = torch.Generator("cpu").manual_seed(opts.seed)
    image = None
    _tiling_meta(rec, pipe, p)
    with rec:
        if on_device:
            pipe = build_pipeline(opts.pipeline, opts.size, p.dtype, seed=opts.seed, device=device, t5=not no_t5)
            pipe.set_progress_bar_config(disable=True)
            tq.apply_module_techniques(pipe, p, seed=opts.seed, height=opts.height, width=opts.width)
            _tiling_meta(rec, pipe, p)
            rec.pipe = pipe
            rec._install_hooks()
            image = pipe(PROMPT, **_call_kwargs(opts, generator)).images[0]
        elif p.has("balanced"):
            from diffusers import DiffusionPipeline

            pipe = DiffusionPipeline.from_pretrained(source, dtype=p.dtype, device_map="balanced")
            pipe.set_progress_bar_config(disable=True)
            tq.apply_module_techniques(pipe, p, seed=opts.seed, height=opts.height, width=opts.width)
            rec.pipe = pipe
            rec._install_hooks()
            # the primary device is the one that runs the denoiser
            den: Any = denoiser(pipe)
            rec.device = next(den.parameters()).device
            rec.meta["device_map"] = {k: str(v) for k, v in (pipe.hf_device_map or {}).items()}
            image = pipe(PROMPT, **_call_kwargs(opts, generator)).images[0]
        elif p.has("staged"):
            image = _run_staged(pipe, rec, opts, p, device, generator)
        else:
            if p.offload:
                tq.apply_offload(pipe, p, device, blocks_per_group=opts.blocks_per_group)
            else:
                pipe.to(device)
                tq.quantize_after_load(pipe, p)
            image = pipe(PROMPT, **_call_kwargs(opts, generator)).images[0]
    if tmpdir is not None:
        tmpdir.cleanup()
    if opts.save_image and image is not None and hasattr(image, "save"):
        image.save(rec.out_dir / "image.png")  # the rank's own directory under torch.distributed
        rec.write_run_json(rec.run_info())
    return rec.out_dir


def _tiling_meta(rec: Recorder, pipe: Any, p: tq.Plan) -> None:
    vae = getattr(pipe, "vae", None)
    if p.has("vae-tiling") and vae is not None:
        rec.meta["vae_tiling"] = {
            "tile_sample_min_size": vae.tile_sample_min_size,
            "tile_latent_min_size": vae.tile_latent_min_size,
            "tile_overlap_factor": vae.tile_overlap_factor,
        }


def _run_staged(
    pipe: Any, rec: Recorder, opts: RunOptions, p: tq.Plan, device: torch.device, generator: torch.Generator
) -> Any:
    """PixArt-Σ one component at a time: text encoder, transformer, VAE; each freed after use."""
    kw = _call_kwargs(opts, generator)
    # load stage is open: bring only the text encoder
    pipe.text_encoder.to(device)
    rec.mark("text_encode")
    with torch.no_grad():
        embeds, mask, neg, neg_mask = pipe.encode_prompt(
            PROMPT,
            do_classifier_free_guidance=True,
            num_images_per_prompt=opts.batch,
            device=device,
            clean_caption=False,
            max_sequence_length=300,
        )
    rec.mark("load")
    pipe.text_encoder = None
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    pipe.transformer.to(device)
    tq.quantize_after_load(pipe, p)
    rec.call_start_label = None  # no text encoding in this call (embeddings are passed in)
    rec.mark("other")
    latents = pipe(
        prompt=None,
        negative_prompt=None,
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        negative_prompt_embeds=neg,
        negative_prompt_attention_mask=neg_mask,
        output_type="latent",
        **kw,
    ).images
    rec.mark("load")
    pipe.transformer = None
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    pipe.vae.to(device)
    with torch.no_grad():
        latents = latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor
        image = pipe.vae.decode(latents, return_dict=False)[0]
        image = pipe.image_processor.postprocess(image, output_type="pil")
    return image[0]
