"""``snapviz analyze``: one snapshot, trace or run directory -> summary and reports."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from snapviz.cli import outputs
from snapviz.cli.errors import Command
from snapviz.cli.options import (
    CONTEXT_SETTINGS,
    device_option,
    epilog,
    max_points_option,
    output_options,
    quiet_option,
    rules_option,
    stages_from_option,
)
from snapviz.cli.share import analyze_share_options, picture_for_markdown, share_outputs
from snapviz.load import SNAPSHOT_NAMES, TRACE_NAMES
from snapviz.progress import Steps, reading
from snapviz.vocab import SUMMARY_SCHEMA

if TYPE_CHECKING:
    from snapviz.analyses.document import Summary


def _input_files(path: str) -> list[str]:
    """The files ``load`` reads for ``path`` (the snapshot and trace of a run directory)."""
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in (*SNAPSHOT_NAMES, *TRACE_NAMES) if os.path.isfile(os.path.join(path, n))]
    return [path]


@click.command(cls=Command, epilog=epilog("README.md and docs/"), context_settings=CONTEXT_SETTINGS)
@analyze_share_options  # --perfetto/--merge-into/--png/--svg (snapviz/cli/share.py)
@click.argument("input", type=click.Path(dir_okay=True, path_type=str))
@output_options(report="report", summary="summary", schema=SUMMARY_SCHEMA)
@device_option("GPU device index to analyse, in snapshots and traces (default: the one with the highest peak).")
@stages_from_option()
@rules_option
@max_points_option(20000, "Timeline points kept in the HTML (min/max decimation keeps the peak).")
@quiet_option()
def analyze(
    input: str,
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
    device: int | None,
    stage_source: str,
    rules_path: str | None,
    max_points: int,
    quiet: bool,
) -> None:
    """Analyse one snapshot pickle, Chrome trace, or run directory.

    Prints a short summary: the peak (allocated, reserved), when and in which stage it
    happened, the source line at the top of the live set, and warnings. The replay
    simulates the caching allocator, so peaks match torch.cuda.max_memory_allocated().

    \b
    Examples:
      snapviz analyze snapshot.pickle -o report.html
      snapviz analyze runs/sdxl-fp16/ --markdown - > issue.md
      snapviz analyze trace.json.gz --json summary.json
    """
    from snapviz.load import load, paused_gc

    with paused_gc():  # pandas and the analyses: objects that live as long as the process (see paused_gc)
        from snapviz.analyses.document import bounded_summary
        from snapviz.analyses.frame_rules import load_rules
        from snapviz.analyses.pipeline import analyze_input, document_of

    rules = load_rules(rules_path)  # resolved (and validated) once, before any work
    with reading(_input_files(input), "snapviz: loading", enabled=not quiet) as bar:
        run = load(input)
    steps = Steps(show=bar is not None)  # the status line follows the bar of a big input
    steps.step("replaying the allocator and attributing stages")
    html_builder: Callable[[], str] | None = None
    an = analyze_input(run, device=device, stage_source=stage_source, rules=rules)
    document = document_of(an)  # the typed snapviz.summary/1 document, built once, for every renderer
    if html_out:
        from snapviz.render.html import render_analysis_html

        html_builder = lambda: render_analysis_html(an, document, max_points=max_points)  # noqa: E731
    extra = share_outputs(an, document)
    steps.step("writing reports")
    # Every renderer gets the bounded document (strings clipped, non-finite numbers null, with warnings).
    bounded = bounded_summary(document)
    rendered = _render(bounded, html_out, html_builder, md_out, json_out, extra)
    steps.done()
    from snapviz.render.terminal import render_terminal

    outputs.emit(rendered, lambda: render_terminal(bounded), quiet)


def _render(
    doc: Summary,
    html_out: str | None,
    html_builder: Callable[[], str] | None,
    md_out: str | None,
    json_out: str | None,
    extra: list[tuple[str, bytes]],
) -> list[tuple[str, str | bytes]]:
    """Every output rendered before anything is written: a failure leaves no partial outputs."""
    from snapviz.render.json_summary import render_summary_json
    from snapviz.render.markdown import render_markdown

    out: list[tuple[str, str | bytes]] = list(extra)
    if json_out:
        out.append((json_out, render_summary_json(doc)))
    if md_out:
        out.append((md_out, render_markdown(doc, picture=picture_for_markdown(md_out))))
    if html_out and html_builder is not None:
        out.append((html_out, html_builder()))
    return out
