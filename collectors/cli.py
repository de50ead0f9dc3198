"""``snapviz collect`` and ``snapviz matrix``: record diffusion pipeline runs into run directories.

The verbs use snapviz's command-line pieces (the error mapping, the output-path checks, the
progress bar), so they behave as every snapviz verb does, also when run on their own
(``python -m collectors``). torch and diffusers are imported inside the callbacks only;
``snapviz`` imports this module only when one of these verbs runs.
"""

from __future__ import annotations

import sys

import click

from snapviz.cli import outputs
from snapviz.cli.errors import CollectorCommand
from snapviz.cli.options import CONTEXT_SETTINGS
from snapviz.progress import Bar, wanted

from .errors import OptionError
from .fit.cli import fit

__all__ = ["collect", "fit", "matrix"]  # the verbs snapviz registers (fit beside matrix)

_TECHNIQUE_LIST = (
    "fp32 fp16 bf16 | sdpa classic sliced | vae-slicing vae-tiling tiny-vae | "
    "model-offload sequential-offload group-offload group-offload-leaf "
    "offload-stream | int8 fp8 (torchao) qint8 qfloat8 (quanto) layerwise-fp8 "
    "nf4-transformer nf4-text-encoder (bitsandbytes) | no-t5 (SD 3.5) | "
    "staged | balanced"
)
# = collectors.pipelines.PIPELINES, spelled here so --help needs no torch (a test keeps them equal)
PIPELINE_NAMES = ("sd15", "sdxl", "pixart-sigma", "flux-dev", "flux-schnell", "sd35-medium", "sd35-large")

EPILOG = f"""\b
Techniques (repeat --technique, or comma-separate; each is validated):
  {_TECHNIQUE_LIST}
\b
Examples:
  snapviz collect --pipeline sd15 --size tiny --device cpu
  snapviz collect --pipeline sd15 --size full --steps 4 --technique fp16 --technique classic
  snapviz collect --pipeline sdxl --size full -t fp16 -t vae-tiling --out runs/sdxl-tiling
  snapviz collect --pipeline pixart-sigma --size full -t staged,int8,nf4-text-encoder
  snapviz collect --pipeline sdxl --model ./my-sdxl-checkpoint -t fp16 -t model-offload
  snapviz collect --pipeline flux-dev --size full --steps 4 -t bf16 -t group-offload,offload-stream
  snapviz collect --pipeline sd35-large --size full -t bf16 -t no-t5 --max-sequence-length 128
  snapviz collect --pipeline sd15 --size full -t fp16 --alloc-conf expandable_segments:True
\b
Writes run.json (stage timeline and allocator peaks), snapshot.pickle (CUDA),
trace.json.gz (--profile) and image.png into --out (default runs/<name>-<time>).
"""


@click.command("collect", cls=CollectorCommand, epilog=EPILOG, context_settings=CONTEXT_SETTINGS)
@click.option("--pipeline", required=True, type=click.Choice(PIPELINE_NAMES), help="Pipeline family to build.")
@click.option(
    "--size",
    default="tiny",
    show_default=True,
    type=click.Choice(["tiny", "full"]),
    help="tiny: seconds on CPU; full: the real architecture (random weights).",
)
@click.option(
    "--max-sequence-length",
    type=int,
    default=None,
    help="T5 prompt tokens (PixArt-Σ 300, Flux-dev 512, Flux-schnell/SD 3.5 256 by default).",
)
@click.option(
    "--offload-blocks",
    type=int,
    default=1,
    show_default=True,
    help="group-offload: transformer blocks moved to the GPU together (num_blocks_per_group).",
)
@click.option(
    "--model",
    type=click.Path(file_okay=False),
    default=None,
    help="Local diffusers checkpoint folder (from_pretrained) instead of in-code configs.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cuda", "cpu"]),
    help="auto = cuda when available.",
)
@click.option(
    "--steps",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Denoising steps (one denoise/<i> stage each).",
)
@click.option(
    "--height", type=click.IntRange(min=8), default=None, help="Image height [tiny 64; sd15 512; sdxl/pixart 1024]."
)
@click.option("--width", type=click.IntRange(min=8), default=None, help="Image width.")
@click.option(
    "--batch",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Images per prompt (classifier-free guidance doubles the UNet batch).",
)
@click.option(
    "--technique",
    "-t",
    "techniques",
    multiple=True,
    metavar="T",
    help="Memory technique to apply; repeatable. See the list below.",
)
@click.option(
    "--profile/--no-profile",
    default=None,
    help="Write a torch.profiler trace.json.gz (with memory events). Default: on when no "
    "CUDA snapshot is recorded (--device cpu, --no-history), since the trace is then "
    "the run's only memory record; off otherwise.",
)
@click.option(
    "--profile-scope",
    default="all",
    show_default=True,
    type=click.Choice(["all", "after-load"]),
    help="after-load: start the profiler when the load stage ends (smaller trace).",
)
@click.option(
    "--stacks",
    default="python",
    show_default=True,
    type=click.Choice(["python", "all"]),
    help="Stack frames kept per allocation.",
)
@click.option(
    "--context",
    default="all",
    show_default=True,
    type=click.Choice(["all", "alloc", "state"]),
    help="Which events carry stacks.",
)
@click.option(
    "--max-entries",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Ring-buffer size of the memory history.",
)
@click.option("--no-history", is_flag=True, help="Do not record memory history (honest wall times; no snapshot).")
@click.option(
    "--sync-stages",
    is_flag=True,
    help="Synchronize the GPU at every stage boundary: exact per-stage wall times, at "
    "the cost of CPU/GPU overlap (peaks are exact either way).",
)
@click.option(
    "--memory-limit-gb",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Cap the CUDA caching allocator at this many GiB (act as a smaller GPU; "
    "the run OOMs and saves its snapshot if it needs more).",
)
@click.option(
    "--alloc-conf",
    metavar="CONF",
    default=None,
    help="PYTORCH_CUDA_ALLOC_CONF for this run (e.g. expandable_segments:True, "
    "max_split_size_mb:64, roundup_power2_divisions:[256:1,512:2,>:4]); set before "
    "CUDA starts and recorded in run.json (alloc_conf, allocator.conf).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Run directory to write.")
@click.option(
    "--train",
    is_flag=True,
    help="Fine-tune the denoiser instead (--steps optimizer steps; phases forward/<i>, "
    "backward/<i>, optimizer/<i>, zero_grad/<i>); see collectors/train_plan.py.",
)
@click.option(
    "--accumulate",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="--train: micro-batches of --batch per optimizer step.",
)
@click.option(
    "--optimizer",
    default="adamw",
    show_default=True,
    help="--train: adamw adamw-foreach adamw-loop adamw-fused adamw8bit adafactor sgd.",
)
@click.option(
    "--lora-rank",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="--train: peft LoRA of this rank on the attention projections (0: full).",
)
def collect(
    pipeline: str,
    size: str,
    max_sequence_length: int | None,
    offload_blocks: int,
    model: str | None,
    device: str,
    steps: int,
    height: int | None,
    width: int | None,
    batch: int,
    techniques: tuple[str, ...],
    profile: bool | None,
    profile_scope: str,
    stacks: str,
    context: str,
    max_entries: int,
    no_history: bool,
    sync_stages: bool,
    memory_limit_gb: float | None,
    alloc_conf: str | None,
    seed: int,
    out: str | None,
    train: bool,
    accumulate: int,
    optimizer: str,
    lora_rank: int,
) -> None:
    """Run a diffusion pipeline with stage labels and record its memory.

    Stages: load, text_encode, denoise/<i>, vae_decode, other. Each is labelled in the
    CUDA memory history, as a profiler range, and in run.json with the allocator's own peak.
    """
    from .alloc_conf import apply_alloc_conf

    if alloc_conf is not None and (not alloc_conf.strip() or not alloc_conf.isprintable()):
        raise OptionError("--alloc-conf needs a PYTORCH_CUDA_ALLOC_CONF string such as expandable_segments:True")
    apply_alloc_conf(alloc_conf)  # before torch starts CUDA: the allocator reads it once
    try:
        import diffusers  # noqa: F401
        import torch
    except ImportError as err:
        raise OptionError(
            f"collect needs torch and diffusers ({err.name} is missing): pip install 'snapviz[collect]'"
        ) from None

    if train:
        if pipeline not in PIPELINE_NAMES[:3]:
            raise OptionError(f"--train fine-tunes sd15, sdxl or pixart-sigma; not {pipeline}")
        if max_sequence_length is not None or offload_blocks != 1:
            raise OptionError("--max-sequence-length and --offload-blocks are inference options; drop --train")
        from .train_cli import collect_train

        return collect_train(
            pipeline=pipeline,
            size=size,
            model=model,
            device=device,
            steps=steps,
            height=height,
            width=width,
            batch=batch,
            techniques=list(techniques),
            profile=profile,
            profile_scope=profile_scope,
            stacks=stacks,
            context=context,
            max_entries=max_entries,
            history=not no_history,
            seed=seed,
            out=out,
            memory_limit_gb=memory_limit_gb,
            alloc_conf=alloc_conf,
            sync_stages=sync_stages,
            accumulate=accumulate,
            optimizer=optimizer,
            lora_rank=lora_rank,
        )
    if accumulate != 1 or optimizer != "adamw" or lora_rank:
        raise OptionError("--accumulate, --optimizer and --lora-rank need --train")
    from .runner import RunOptions, run, validate
    from .techniques import TechniqueError

    opts = RunOptions(
        pipeline=pipeline,
        size=size,
        model=model,
        device=device,
        steps=steps,
        height=height,
        width=width,
        batch=batch,
        techniques=list(techniques),
        profile=profile,
        profile_scope=profile_scope,
        stacks=stacks,
        context=context,
        max_entries=max_entries,
        history=not no_history,
        seed=seed,
        out=out,
        memory_limit_gb=memory_limit_gb,
        alloc_conf=alloc_conf,
        sync_stages=sync_stages,
        max_sequence_length=max_sequence_length,
        blocks_per_group=offload_blocks,
    )
    try:
        plan = validate(opts)
    except (TechniqueError, ValueError) as err:
        raise OptionError(str(err)) from None

    bar = Bar(steps, "denoise", show=wanted())
    try:
        run_dir = run(opts, plan, on_step=lambda step: bar.update(1))
    except Exception as err:
        oom = getattr(torch, "OutOfMemoryError", None)
        if oom is not None and isinstance(err, oom):
            bar.close()
            click.echo(f"out of memory; the snapshot up to the failure is in {opts.out}", err=True)
            sys.exit(1)
        raise
    finally:
        bar.close()
    click.echo(str(run_dir))


# ----------------------------------------------------------------------------- matrix

MATRIX_EPILOG = """\b
Default variants (when no --variant is given; baseline fp16):
  sdxl          fp32 fp16 fp16+classic fp16+vae-slicing fp16+vae-tiling fp16+tiny-vae
                fp16+model-offload fp16+sequential-offload bf16
  sd15          the sdxl set plus fp16+sliced
  pixart-sigma  fp16 bf16 fp16+vae-tiling fp16+model-offload fp16+staged+int8+nf4-text-encoder
On CPU the fp16 variants run in fp32 and CUDA-only ones are skipped, each with the reason.
\b
Examples:
  snapviz matrix --pipeline sd15 --size tiny --device cpu --variant fp32 --variant fp32,vae-tiling
  snapviz matrix --pipeline sdxl --size full --device cuda --steps 4 --no-history --jobs 2
  snapviz matrix --pipeline sdxl --size full --memory-limit-gb 10 -o m.html  # fits 10 GiB?
\b
Writes one run directory and one .log per variant into --out, then matrix.html (snapviz
compare's page with the matrix table on top), matrix.md and matrix.json (schema
snapviz.matrix/1, the snapviz.compare/1 document inside) there unless -o/--markdown/--json
say otherwise, and prints the ranked Markdown table. Exit 0 when at least one variant ran,
1 when none did, 2 for bad options.
"""


@click.command("matrix", cls=CollectorCommand, epilog=MATRIX_EPILOG, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--pipeline", required=True, type=click.Choice(["sd15", "sdxl", "pixart-sigma"]), help="Pipeline family to build."
)
@click.option(
    "--size",
    default="tiny",
    show_default=True,
    type=click.Choice(["tiny", "full"]),
    help="tiny: seconds on CPU; full: the real architecture (random weights).",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cuda", "cpu"]),
    help="auto = cuda when available.",
)
@click.option("--steps", default=4, show_default=True, type=click.IntRange(min=1), help="Denoising steps per variant.")
@click.option(
    "--height", type=click.IntRange(min=8), default=None, help="Image height [tiny 64; sd15 512; sdxl/pixart 1024]."
)
@click.option("--width", type=click.IntRange(min=8), default=None, help="Image width.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Images per prompt.")
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="T[,T...]",
    help="A technique combination, e.g. fp16,vae-tiling (repeat). Replaces the default set.",
)
@click.option(
    "--baseline",
    metavar="VARIANT",
    default=None,
    help="Variant the others are measured against [fp16 in the default set; else the first --variant].",
)
@click.option(
    "--jobs",
    "-j",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Variants run at once; on CUDA one GPU each (CUDA_VISIBLE_DEVICES).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Kill a variant after this many seconds and record it as timed out.",
)
@click.option("--no-history", is_flag=True, help="Variants record no memory history (honest wall times; no snapshots).")
@click.option("--profile", is_flag=True, help="Variants also write a profiler trace (after load).")
@click.option(
    "--memory-limit-gb",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Cap every variant's CUDA allocator (act as a smaller GPU): which variants fit?",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the variants' run directories and logs [runs/matrix-<pipeline>-<size>-<time>].",
)
@click.option(
    "--from-dir",
    "from_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Do not run anything: rank and report the variants already in DIR (a previous "
    "matrix --out, e.g. recorded on a GPU machine without bokeh).",
)
@click.option(
    "-o", "--output", "html_out", type=click.Path(dir_okay=False), default=None, help="HTML report [OUT/matrix.html]."
)
@click.option(
    "--markdown",
    "md_out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Markdown (matrix table + comparison) [OUT/matrix.md]; '-' for stdout.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="JSON, schema snapviz.matrix/1 [OUT/matrix.json]; '-' for stdout.",
)
def matrix(
    pipeline: str,
    size: str,
    device: str,
    steps: int,
    height: int | None,
    width: int | None,
    batch: int,
    variants: tuple[str, ...],
    baseline: str | None,
    jobs: int,
    timeout_s: float | None,
    no_history: bool,
    profile: bool,
    memory_limit_gb: float | None,
    seed: int,
    out: str | None,
    from_dir: str | None,
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
) -> None:
    """Run one pipeline across technique combinations and rank them against a baseline.

    Each variant runs in a fresh `python -m collectors` process (peaks not polluted by the
    previous one); a variant that fails (OOM, unsupported, crash, --timeout) is recorded as
    such and the matrix goes on. The report is snapviz compare's, stage-aligned, plus a
    table of peak allocated/reserved, per-stage peaks, pipe() call time and median step
    time, each relative to the baseline, ranked by memory saved per second of extra time.
    """
    import os
    import time
    from pathlib import Path

    # every option is checked before any variant runs: bad options cost seconds, not minutes
    from snapviz.safe_text import printable

    from . import matrix as mx

    # --from-dir reads the variants' run directories and logs: no output may replace them
    # (its own matrix.* files are what a re-report rewrites).
    inputs = [str(p) for p in Path(from_dir).iterdir() if p.is_dir() or p.suffix == ".log"] if from_dir else []

    def default(given: str | None, name: str) -> str | None:  # --from-dir writes its reports there
        return given or (str(Path(from_dir) / name) if from_dir else None)

    outputs.require_html_name("-o", html_out)
    outputs.check(
        {
            "html_out": default(html_out, "matrix.html"),
            "md_out": default(md_out, "matrix.md"),
            "json_out": default(json_out, "matrix.json"),
        },
        inputs,
    )
    if (height and height % 8) or (width and width % 8):
        raise OptionError("--height and --width must be multiples of 8")
    if from_dir:
        try:
            opts, results, base = mx.results_from_dir(Path(from_dir), baseline)
        except mx.MatrixError as err:
            raise OptionError(str(err)) from None
        mx.write_reports(
            opts, results, base, [], [f"re-reported from {from_dir}"], Path(from_dir), html_out, md_out, json_out
        )
        return
    try:
        import torch

        known, aliases = mx.technique_names()
    except ImportError as err:
        raise OptionError(
            f"matrix needs torch and diffusers ({err.name} is missing): pip install 'snapviz[collect]'"
        ) from None

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    slots: list[str | None]
    if device == "cuda":
        if not torch.cuda.is_available():
            raise OptionError(f"--device cuda but torch sees no CUDA device (torch {torch.__version__})")
        count = torch.cuda.device_count()
        if jobs > count:
            raise OptionError(f"--jobs {jobs} needs {jobs} GPUs but {count} {'is' if count == 1 else 'are'} visible")
        visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        ids = visible[:count] if len(visible) >= count else [str(i) for i in range(count)]
        slots = list(ids[:jobs])
    else:
        if memory_limit_gb is not None:
            raise OptionError("--memory-limit-gb caps the CUDA caching allocator; this matrix is on cpu")
        slots = [None] * jobs

    try:
        notes: list[str] = []
        skipped: list[dict[str, str]] = []
        if variants:
            chosen = [mx.parse_variant(v, known, aliases) for v in variants]
            labels = [v.label for v in chosen]
            dups = sorted({lab for lab in labels if labels.count(lab) > 1})
            if dups:
                raise OptionError(f"--variant {dups[0]} is given twice")
        else:
            chosen, notes = mx.default_variants(pipeline, device)
            chosen, skipped = mx.screen_variants(chosen, device=device, pipeline=pipeline)
        labels = [v.label for v in chosen]
        if baseline is not None:
            base = mx.parse_variant(baseline, known, aliases).label
            if base in [s["label"] for s in skipped]:
                reason = next(s["reason"] for s in skipped if s["label"] == base)
                raise OptionError(f"--baseline {baseline}: skipped on {device} ({reason})")
            if base not in labels:
                hint = (
                    " (on CPU the default fp16 variants run in fp32)"
                    if device == "cpu" and not variants and "fp16" in base.split("+")
                    else ""
                )
                raise OptionError(f"--baseline {baseline} is not one of the variants: {', '.join(labels)}{hint}")
        else:
            fallback = mx.parse_variant("fp32" if device == "cpu" else mx.DEFAULT_BASELINE).label
            base = fallback if (not variants and fallback in labels) else (labels[0] if labels else "")
    except mx.MatrixError as err:
        raise OptionError(str(err)) from None
    if not chosen:
        raise OptionError(
            f"no variant can run on {device}: " + "; ".join(f"{s['label']}: {s['reason']}" for s in skipped)
        )

    out_dir = Path(out or Path("runs") / f"matrix-{pipeline}-{size}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise OptionError(f"--out {out_dir}: exists and is not empty (pick a new directory)")
    out_dir.mkdir(parents=True, exist_ok=True)
    opts = mx.MatrixOptions(
        pipeline=pipeline,
        size=size,
        device=device,
        steps=steps,
        height=height,
        width=width,
        batch=batch,
        history=not no_history,
        profile=profile,
        memory_limit_gb=memory_limit_gb,
        seed=seed,
        jobs=jobs,
        timeout_s=timeout_s,
        out=out_dir,
    )

    if memory_limit_gb:
        notes.append(
            f"every variant's CUDA allocator was capped at {memory_limit_gb:g} GiB "
            "(--memory-limit-gb): an OOM row would not fit a GPU of that size"
        )
    where = f"GPU {', '.join(str(s) for s in slots)}" if device == "cuda" else "cpu"
    click.echo(
        f"snapviz matrix: {pipeline} {size}, {len(chosen)} variant{'' if len(chosen) == 1 else 's'}, {steps} steps, "
        f"baseline {base}, {jobs} at a time on {where} -> {out_dir}",
        err=True,
    )
    for s in skipped:
        click.echo(f"  skip {s['label']}: {printable(s['reason'])}", err=True)

    bar = Bar(len(chosen), "snapviz matrix: variants", show=wanted())
    bar.update(0)  # drawn at 0/N now: the first variant may take minutes

    def progress(i: int, n: int, res: mx.VariantResult) -> None:
        m = res.measure or {}
        if res.ok:
            peak = m["peak_allocated_bytes"] / 2**30
            what = f"peak {peak:.2f} GiB{' RSS' if m['memory_metric'] == 'rss' else ''}, call {m['call_s']:.2f} s"
            if m["step_median_s"] is not None:
                what += f", step {m['step_median_s']:.3f} s"
        else:
            what = printable(res.reason)  # the last line of the variant's log: one clean line
        gpu = f"GPU {res.gpu}, " if res.gpu is not None else ""
        bar.note(f"[{i}/{n}] {res.variant.label:<34} {res.status:<11} {what}  ({gpu}{res.elapsed_s:.1f} s)")
        bar.update(1)

    try:
        results = mx.run_variants(opts, chosen, slots, on_done=progress)
    finally:
        bar.close()
    mx.write_reports(opts, results, base, skipped, notes, out_dir, html_out, md_out, json_out)
