"""``snapviz ranks`` and ``snapviz history``: many runs, one small digest each, computed on a
local process pool or a Dask cluster (:mod:`snapviz.engine`), then compared (docs/ranks.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from snapviz.cli import outputs
from snapviz.cli.errors import Command
from snapviz.cli.options import CONTEXT_SETTINGS, epilog, output_options, quiet_option, stages_from_option
from snapviz.errors import InputError
from snapviz.vocab import HISTORY_SCHEMA, RANKS_SCHEMA


def engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``-j/--jobs`` (local worker processes) and ``--scheduler`` (a Dask cluster)."""
    f = click.option(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Run one task per input on this Dask distributed scheduler (tcp://host:8786; "
        "also SNAPVIZ_DASK_SCHEDULER); the workers must reach the inputs (a shared filesystem "
        "or fsspec URLs). Default: local worker processes.",
    )(f)
    return click.option(
        "-j",
        "--jobs",
        type=click.IntRange(min=1),
        default=None,
        help="Local worker processes [the number of CPUs, at most 4]. Each needs the memory of one analysis.",
    )(f)


def _outputs(html_out: str | None, md_out: str | None, json_out: str | None, inputs: list[str]) -> dict[str, Any]:
    kw: dict[str, Any] = {"html_out": html_out, "md_out": md_out, "json_out": json_out}
    outputs.route_by_extension(kw, {})
    pictures = [k for k in ("png_out", "svg_out") if kw.get(k)]
    if pictures:
        raise InputError(f"-o {kw[pictures[0]]}: this verb writes .html, .md or .json")
    outputs.check(kw, [i for i in inputs if "://" not in i])
    return kw


def _digest_fleet(
    inputs: tuple[str, ...],
    stage_source: str,
    jobs: int | None,
    scheduler: str | None,
    quiet: bool,
    outs: tuple[str | None, str | None, str | None],
) -> tuple[dict[str, Any], list[Any]]:
    """Every input expanded and digested (one task each); failures come back as rows (all of
    them failing is bad input)."""
    from snapviz.analyses.ranks import FleetRow
    from snapviz.cli.inputs import fleet_digest
    from snapviz.engine import TaskFailed, run_tasks, scheduler_address
    from snapviz.load.fleet import expand_inputs
    from snapviz.load.labels import unique_labels

    found = expand_inputs(inputs)
    # outputs checked against every input the globs and folders expanded to, before any work
    kw = _outputs(*outs, [*inputs, *(f.source for f in found)])
    labels = unique_labels([f.source for f in found], [])
    results = run_tasks(
        fleet_digest,
        [f.source for f in found],
        [(f.source, lab, stage_source) for f, lab in zip(found, labels, strict=True)],
        jobs=jobs,
        scheduler=scheduler_address(scheduler),
        show_progress=not quiet,
        label="snapviz: digesting inputs",
    )
    if results and all(isinstance(r, TaskFailed) for r in results):
        # nothing to compare: bad input, not a report of failures (exit 2, nothing written)
        first = results[0]
        raise InputError(f"none of the {len(results)} input(s) could be analysed; {first.source}: {first.reason}")
    return kw, [
        FleetRow(
            f.source,
            lab,
            f.rank,
            f.iteration,
            None if isinstance(r, TaskFailed) else r,
            r.reason if isinstance(r, TaskFailed) else None,
        )
        for f, lab, r in zip(found, labels, results, strict=True)
    ]


@click.command(cls=Command, epilog=epilog("docs/ranks.md", check=False), context_settings=CONTEXT_SETTINGS)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@output_options(report="ranks report", summary="per-rank summary", schema=RANKS_SCHEMA, pictures=False)
@stages_from_option("Where stage labels come from (every rank).")
@engine_options
@quiet_option()
def ranks(
    inputs: tuple[str, ...],
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
    stage_source: str,
    jobs: int | None,
    scheduler: str | None,
    quiet: bool,
) -> None:
    """The ranks of a distributed job side by side: which rank peaked, which ran out first, how they differ.

    INPUT: snapshot files, folders, globs or fsspec URLs, e.g. torchtitan's
    memory_snapshot/iteration_N/rankR_memory_snapshot.pickle or one run directory per rank.
    The rank comes from run.json, the trace's distributedInfo or the file name; several
    iterations are shown side by side. An input that cannot be analysed is one row saying
    why. Per rank: peak allocated and reserved, stage at the peak, OOM, top site; per
    iteration: imbalance (max / median), outliers, the first rank to OOM, and the worst rank
    against the median rank stage by stage.

    \b
    Examples:
      snapviz ranks outputs/memory_snapshot/ -o ranks.html
      snapviz ranks 'outputs/memory_snapshot/iteration_*/rank*_memory_snapshot.pickle' --json ranks.json
      snapviz ranks s3://bucket/job42/memory_snapshot/ --scheduler tcp://dask-head:8786 --markdown -
    """
    from snapviz.analyses.document import bounded, to_json
    from snapviz.analyses.ranks import analyse_ranks, ranks_document
    from snapviz.render.fleet_md import render_ranks_markdown, render_ranks_terminal
    from snapviz.render.json_summary import render_json

    kw, rows = _digest_fleet(inputs, stage_source, jobs, scheduler, quiet, (html_out, md_out, json_out))
    doc = bounded(ranks_document(analyse_ranks(rows)))
    rendered: list[tuple[str, str | bytes]] = []
    if kw["json_out"]:
        rendered.append((kw["json_out"], render_json(to_json(doc))))
    if kw["md_out"]:
        rendered.append((kw["md_out"], render_ranks_markdown(doc)))
    if kw["html_out"]:
        from snapviz.render.html.fleet import render_ranks_html

        rendered.append((kw["html_out"], render_ranks_html(doc)))
    outputs.emit(rendered, lambda: render_ranks_terminal(doc), quiet)


@click.command(cls=Command, epilog=epilog("docs/ranks.md", check=False), context_settings=CONTEXT_SETTINGS)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@output_options(report="history report", summary="history summary", schema=HISTORY_SCHEMA, pictures=False)
@click.option(
    "--order-by",
    default="time",
    show_default=True,
    metavar="KEY",
    help="time (the first recorded event's clock), input (as given), or a run.json key (commit, date, …).",
)
@click.option(
    "--jump",
    "jump",
    default="5%",
    show_default=True,
    metavar="PCT",
    help="A stage's peak rising more than this from one run to the next is reported as a jump.",
)
@stages_from_option("Where stage labels come from (every run).")
@engine_options
@quiet_option()
def history(
    inputs: tuple[str, ...],
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
    order_by: str,
    jump: str,
    stage_source: str,
    jobs: int | None,
    scheduler: str | None,
    quiet: bool,
) -> None:
    """Many runs of one pipeline in order: each stage's trend and the run where its peak jumped.

    INPUT: run directories, snapshots, folders, globs or fsspec URLs (e.g. a CI farm's runs
    of one pipeline). Ordered by time, by input order, or by a run.json key (--order-by
    commit); an input that cannot be analysed is one row saying why.

    \b
    Examples:
      snapviz history ci-runs/sdxl-*/ -o history.html
      snapviz history ci-runs/ --order-by date --jump 3% --markdown -
    """
    from snapviz.analyses.document import bounded, to_json
    from snapviz.analyses.history import analyse_history, history_document
    from snapviz.render.fleet_md import render_history_markdown, render_history_terminal
    from snapviz.render.json_summary import render_json
    from snapviz.units import parse_percent

    pct = parse_percent(jump, "--jump")
    kw, rows = _digest_fleet(inputs, stage_source, jobs, scheduler, quiet, (html_out, md_out, json_out))
    doc = bounded(history_document(analyse_history(rows, order_by=order_by, jump_pct=pct)))
    rendered: list[tuple[str, str | bytes]] = []
    if kw["json_out"]:
        rendered.append((kw["json_out"], render_json(to_json(doc))))
    if kw["md_out"]:
        rendered.append((kw["md_out"], render_history_markdown(doc)))
    if kw["html_out"]:
        from snapviz.render.html.fleet import render_history_html

        rendered.append((kw["html_out"], render_history_html(doc)))
    outputs.emit(rendered, lambda: render_history_terminal(doc), quiet)
