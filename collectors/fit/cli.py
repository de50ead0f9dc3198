"""``snapviz fit``: which technique combinations fit which card, and the fastest that fits.

torch is imported inside the command (through :func:`collector_names` and :func:`probe_cuda`),
so ``snapviz --help`` works without it; tests replace those two and :func:`run_variant`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from collectors.errors import OptionError
from collectors.matrix.runner import MatrixOptions, VariantResult, run_one
from collectors.matrix.variants import MatrixError, Variant, parse_variant, screen_variants
from snapviz.cli.errors import CollectorCommand

from .plan import DEFAULT_CANDIDATES, DEFAULT_CARDS, Card, default_candidates, parse_cards
from .report import card_dir, fit_dict, render_fit_html, render_fit_markdown
from .search import FitRow, plan_rows, run_fit
from .simulated import simulate_card

FIT_EPILOG = f"""\b
Default cards: {" ".join(DEFAULT_CARDS)}. Default candidates (baseline bf16):
  flux-*   {" ".join(v.replace(",", "+") for v in DEFAULT_CANDIDATES["flux"])}
  sd35-*   {" ".join(v.replace(",", "+") for v in DEFAULT_CANDIDATES["sd35"])}
A default candidate the installed collectors refuse is skipped with the collector's reason.
\b
Examples:
  snapviz fit --pipeline flux-dev --size full --gpu-memory 24GiB --gpu-memory 16GiB
  snapviz fit --pipeline sd35-large --dry-run
  python -m collectors.fit --pipeline flux-dev --variant bf16 --variant bf16,model-offload
\b
Each combination runs in a fresh `python -m collectors` process whose CUDA allocator is capped at
the card's size; cards run largest first, and a combination that a measurement already proves
cannot fit a card is pruned there (docs/fit.md). Writes OUT/<card>/<variant>/ run directories,
then fit.json (snapviz.fit/1), fit.md and fit.html. Exit 0 when a combination ran to a verdict,
1 when none did, 2 for bad options (and on a machine without CUDA, unless --dry-run).
"""


def collector_names() -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """Pipelines, techniques and aliases the installed collectors know (imports torch)."""
    from collectors.pipelines import PIPELINES
    from collectors.techniques import ALIASES, ALL

    return tuple(PIPELINES), tuple(ALL), dict(ALIASES)


def probe_cuda() -> str | None:
    """The GPU to run on (first visible), or None without CUDA."""
    import torch

    return "0" if torch.cuda.is_available() else None


def run_variant(opts: MatrixOptions, v: Variant, card: Card, gpu: str | None) -> VariantResult:
    card_opts = MatrixOptions(**{**opts.__dict__, "memory_limit_gb": card.gib, "out": card_dir(opts.out, card)})
    card_opts.out.mkdir(parents=True, exist_ok=True)
    return run_one(card_opts, v, gpu)


def _candidates(
    pipeline: str, variants: tuple[str, ...], known: tuple[str, ...] | None, aliases: dict[str, str]
) -> tuple[list[Variant], list[dict[str, str]]]:
    if variants:
        chosen = [parse_variant(v, known, aliases) for v in variants]
        labels = [v.label for v in chosen]
        dups = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dups:
            raise OptionError(f"--variant {dups[0]} is given twice")
        return chosen, []
    chosen = default_candidates(pipeline)
    if known is None:
        return chosen, []
    return screen_variants(chosen, device="cuda", pipeline=pipeline)


@click.command(
    "fit",
    cls=CollectorCommand,
    epilog=FIT_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--pipeline", required=True, help="Pipeline to build (flux-dev, flux-schnell, sd35-medium, sd35-large, ...)."
)
@click.option(
    "--size",
    default="full",
    show_default=True,
    type=click.Choice(["tiny", "full"]),
    help="full: the real architecture (random weights); tiny: a quick rehearsal.",
)
@click.option(
    "--gpu-memory",
    "cards",
    multiple=True,
    metavar="SIZE",
    help=f"A card to fit, e.g. 24GiB, 16GiB, 24GB (repeat) [{', '.join(DEFAULT_CARDS)}].",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    metavar="T[,T...]",
    help="A technique combination to try (repeat). Replaces the default candidates.",
)
@click.option(
    "--steps",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Denoising steps per run (time per image is reported at this count).",
)
@click.option("--height", type=click.IntRange(min=8), default=None, help="Image height [the pipeline's default].")
@click.option("--width", type=click.IntRange(min=8), default=None, help="Image width.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Images per prompt.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Kill a run after this many seconds and record it as timed out.",
)
@click.option(
    "--history",
    is_flag=True,
    help="Record memory history (snapshots; times include its cost). A "
    "combination that fits a larger card is then simulated on the smaller ones from its snapshot "
    "(snapviz whatif's allocator simulator) instead of run, where the simulator reproduces the run; "
    "the report marks each cell simulated or measured.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the run directories and logs [runs/fit-<pipeline>-<size>-<time>].",
)
@click.option("--dry-run", is_flag=True, help="Print the plan (cards, candidates, order) and run nothing.")
@click.option("-o", "--output", "html_out", type=click.Path(dir_okay=False), default=None, help="HTML [OUT/fit.html].")
@click.option(
    "--markdown",
    "md_out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Markdown [OUT/fit.md]; '-' for stdout.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="JSON, schema snapviz.fit/1 [OUT/fit.json]; '-' for stdout.",
)
def fit(
    pipeline: str,
    size: str,
    cards: tuple[str, ...],
    variants: tuple[str, ...],
    steps: int,
    height: int | None,
    width: int | None,
    batch: int,
    timeout_s: float | None,
    history: bool,
    seed: int,
    out: str | None,
    dry_run: bool,
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
) -> None:
    """Find the technique combinations that fit each card, their peaks and times, and the fastest."""
    import time

    from snapviz.cli.outputs import require_html_name
    from snapviz.errors import InputError
    from snapviz.render.output import check_outputs
    from snapviz.safe_text import printable

    try:
        require_html_name("-o", html_out)
        check_outputs([("-o", html_out), ("--markdown", md_out), ("--json", json_out)])
    except InputError as err:
        raise OptionError(str(err)) from None
    if (height and height % 8) or (width and width % 8):
        raise OptionError("--height and --width must be multiples of 8")
    try:
        names: tuple[tuple[str, ...], tuple[str, ...], dict[str, str]] | None = collector_names()
    except ImportError as err:
        if not dry_run:
            raise OptionError(
                f"fit needs torch and diffusers ({err.name} is missing): pip install 'snapviz[collect]'"
            ) from None
        names = None  # the plan can still be printed; names are checked when it runs
    try:
        card_list = parse_cards(cards)
        if names is not None and pipeline not in names[0]:
            raise OptionError(f"--pipeline {pipeline}: the installed collectors build {', '.join(names[0])}")
        chosen, skipped = _candidates(pipeline, variants, names[1] if names else None, names[2] if names else {})
    except MatrixError as err:
        raise OptionError(str(err)) from None
    if not chosen:
        raise OptionError("no candidate can run: " + "; ".join(f"{s['label']}: {s['reason']}" for s in skipped))

    order = plan_rows(card_list, chosen)
    if dry_run:
        click.echo(
            f"snapviz fit plan: {pipeline} {size}, {len(card_list)} card(s) largest first, "
            f"{len(chosen)} candidate(s), up to {len(order)} runs of {steps} steps, each in a fresh process "
            "under an allocator cap equal to the card; a run is pruned when earlier ones prove it cannot fit"
        )
        for i, (card, v) in enumerate(order, 1):
            click.echo(f"  {i:>3}. {card.label:<8} {v.label}")
        for s in skipped:
            click.echo(f"  skip {s['label']}: {printable(s['reason'])}")
        return
    gpu = probe_cuda()
    if gpu is None:
        raise OptionError(
            "fit needs a CUDA GPU: each card is a cap on the CUDA caching allocator "
            "(set_per_process_memory_fraction) and cpu has none; --dry-run prints the plan"
        )

    out_dir = Path(out or Path("runs") / f"fit-{pipeline}-{size}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise OptionError(f"--out {out_dir}: exists and is not empty (pick a new directory)")
    out_dir.mkdir(parents=True, exist_ok=True)
    opts = MatrixOptions(
        pipeline=pipeline,
        size=size,
        device="cuda",
        steps=steps,
        height=height,
        width=width,
        batch=batch,
        history=history,
        seed=seed,
        jobs=1,
        timeout_s=timeout_s,
        out=out_dir,
    )
    click.echo(
        f"snapviz fit: {pipeline} {size} on {', '.join(c.label for c in card_list)}, {len(chosen)} "
        f"candidates, {steps} steps -> {out_dir}",
        err=True,
    )
    for s in skipped:
        click.echo(f"  skip {s['label']}: {printable(s['reason'])}", err=True)

    def progress(row: FitRow) -> None:
        if row.simulated is not None:
            what = ("fits" if row.simulated.fits else "out of memory") + f" ({row.simulated.reason})"
        elif row.result is None:
            what = f"pruned: {row.pruned}"
        elif row.result.ok and row.result.measure:
            m = row.result.measure
            what = f"fits, peak {m['peak_allocated_bytes'] / 2**30:.2f} GiB, call {m['call_s'] or 0:.2f} s"
        else:
            what = f"{row.result.status}: {row.result.reason or ''}"
        click.echo(f"  {row.card.label:<8} {row.variant.label:<40} {printable(what)}", err=True)

    # with memory history, a smaller card is simulated from a larger card's snapshot before it is run
    rows = run_fit(
        card_list,
        chosen,
        lambda v, c: run_variant(opts, v, c, gpu),
        progress,
        simulate=simulate_card if history else None,
    )
    _write(opts, card_list, rows, skipped, out_dir, html_out, md_out, json_out)


def _write(
    opts: MatrixOptions,
    cards: list[Card],
    rows: list[FitRow],
    skipped: list[dict[str, str]],
    out_dir: Path,
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
) -> None:
    from snapviz.errors import InputError
    from snapviz.render.json_summary import render_json
    from snapviz.render.output import write_outputs
    from snapviz.safe_text import printable

    first: dict[str, Any] | None = next((r.result.run for r in rows if r.result is not None and r.result.ok), None)
    doc = fit_dict(opts, cards, rows, skipped, [], first)
    rendered = []
    for path, make in (
        (json_out or str(out_dir / "fit.json"), lambda: render_json(doc)),
        (md_out or str(out_dir / "fit.md"), lambda: render_fit_markdown(doc)),
        (html_out or str(out_dir / "fit.html"), lambda: render_fit_html(doc)),
    ):
        try:
            rendered.append((path, make()))
        except ImportError as err:  # a GPU box without bokeh: keep the JSON and Markdown
            click.echo(f"  skipped {path}: {err}", err=True)
    try:
        written = write_outputs(rendered)
    except InputError as err:
        raise OptionError(str(err)) from None
    if "-" not in (json_out, md_out):
        click.echo(render_fit_markdown(doc), nl=False)
    for path in written:
        click.echo(f"  wrote {printable(path, None)}", err=True)
    if not any(r.result is not None and r.result.status in ("ok", "oom") for r in rows):
        click.echo(f"no combination ran to a verdict; see the logs in {out_dir}", err=True)
        sys.exit(1)
