"""``snapviz collect``: record a diffusion pipeline run into a run directory.

torch and diffusers are imported inside the callback only, so ``snapviz --help`` works without
them.
"""

from __future__ import annotations

import sys

import click

_TECHNIQUE_LIST = ("fp32 fp16 bf16 | sdpa classic sliced | vae-slicing vae-tiling tiny-vae | "
                   "model-offload sequential-offload group-offload | int8 nf4-text-encoder | "
                   "staged | balanced")

EPILOG = f"""\b
Techniques (repeat --technique, or comma-separate; each is validated):
  {_TECHNIQUE_LIST}
\b
Examples:
  snapviz collect --pipeline sd15 --size tiny --device cpu --profile
  snapviz collect --pipeline sd15 --size full --steps 4 --technique fp16 --technique classic
  snapviz collect --pipeline sdxl --size full -t fp16 -t vae-tiling --out runs/sdxl-tiling
  snapviz collect --pipeline pixart-sigma --size full -t staged,int8,nf4-text-encoder
  snapviz collect --pipeline sdxl --model ./my-sdxl-checkpoint -t fp16 -t model-offload
\b
Writes run.json (stage timeline and allocator peaks), snapshot.pickle (CUDA),
trace.json.gz (--profile) and image.png into --out (default runs/<name>-<time>).
"""


class OptionError(click.UsageError):
    """A bad option or technique: exit 2 with one line on stderr (no usage block)."""

    def show(self, file: object = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


@click.command("collect", epilog=EPILOG,
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--pipeline", required=True, type=click.Choice(["sd15", "sdxl", "pixart-sigma"]),
              help="Pipeline family to build.")
@click.option("--size", default="tiny", show_default=True, type=click.Choice(["tiny", "full"]),
              help="tiny: seconds on CPU; full: the real architecture (random weights).")
@click.option("--model", type=click.Path(file_okay=False), default=None,
              help="Local diffusers checkpoint folder (from_pretrained) instead of in-code "
                   "configs.")
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["auto", "cuda", "cpu"]), help="auto = cuda when available.")
@click.option("--steps", default=4, show_default=True, type=click.IntRange(min=1),
              help="Denoising steps (one denoise/<i> stage each).")
@click.option("--height", type=click.IntRange(min=8), default=None,
              help="Image height [tiny 64; sd15 512; sdxl/pixart 1024].")
@click.option("--width", type=click.IntRange(min=8), default=None, help="Image width.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1),
              help="Images per prompt (classifier-free guidance doubles the UNet batch).")
@click.option("--technique", "-t", "techniques", multiple=True, metavar="T",
              help="Memory technique to apply; repeatable. See the list below.")
@click.option("--profile", is_flag=True, help="Also write a torch.profiler trace.json.gz.")
@click.option("--profile-scope", default="all", show_default=True,
              type=click.Choice(["all", "after-load"]),
              help="after-load: start the profiler when the load stage ends (smaller trace).")
@click.option("--stacks", default="python", show_default=True,
              type=click.Choice(["python", "all"]), help="Stack frames kept per allocation.")
@click.option("--context", default="all", show_default=True,
              type=click.Choice(["all", "alloc", "state"]),
              help="Which events carry stacks.")
@click.option("--max-entries", default=1_000_000, show_default=True,
              type=click.IntRange(min=1), help="Ring-buffer size of the memory history.")
@click.option("--no-history", is_flag=True,
              help="Do not record memory history (honest wall times; no snapshot).")
@click.option("--memory-limit-gb", type=click.FloatRange(min=0.1), default=None,
              help="Cap the CUDA caching allocator at this many GiB (act as a smaller GPU; "
                   "the run OOMs and saves its snapshot if it needs more).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory to write.")
def collect(pipeline: str, size: str, model: str | None, device: str, steps: int,
            height: int | None, width: int | None, batch: int, techniques: tuple[str, ...],
            profile: bool, profile_scope: str, stacks: str, context: str, max_entries: int,
            no_history: bool, memory_limit_gb: float | None, seed: int,
            out: str | None) -> None:
    """Run a diffusion pipeline with stage labels and record its memory.

    Stages: load, text_encode, denoise/<i>, vae_decode, other. Each is labelled in the
    CUDA memory history, as a profiler range, and in run.json with the allocator's own peak.
    """
    try:
        import diffusers  # noqa: F401
        import torch
    except ImportError as err:
        raise OptionError(f"collect needs torch and diffusers ({err.name} is missing): "
                               "pip install 'snapviz[collect]'") from None

    from .runner import RunOptions, run, validate
    from .techniques import TechniqueError

    opts = RunOptions(pipeline=pipeline, size=size, model=model, device=device, steps=steps,
                      height=height, width=width, batch=batch, techniques=list(techniques),
                      profile=profile, profile_scope=profile_scope, stacks=stacks,
                      context=context, max_entries=max_entries,
                      history=not no_history, seed=seed, out=out,
                      memory_limit_gb=memory_limit_gb)
    try:
        plan = validate(opts)
    except (TechniqueError, ValueError) as err:
        raise OptionError(str(err)) from None

    with click.progressbar(length=steps, label="denoise", file=sys.stderr) as bar:
        def on_step(step: int) -> None:
            bar.update(1)

        try:
            run_dir = run(opts, plan, on_step=on_step)
        except Exception as err:
            oom = getattr(torch, "OutOfMemoryError", None)
            if oom is not None and isinstance(err, oom):
                click.echo(f"\nout of memory; the snapshot up to the failure is in {opts.out}",
                           err=True)
                sys.exit(1)
            raise
    click.echo(str(run_dir))
