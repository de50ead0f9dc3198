"""``snapviz whatif``: other allocator settings and smaller cards, simulated from one snapshot."""

from __future__ import annotations

from typing import Any

import click

from snapviz.cli import outputs
from snapviz.cli.analyze import _input_files
from snapviz.cli.errors import Command
from snapviz.cli.options import (
    CONTEXT_SETTINGS,
    device_option,
    epilog,
    output_options,
    quiet_option,
    stages_from_option,
)
from snapviz.vocab import WHATIF_SCHEMA


@click.command(cls=Command, epilog=epilog("docs/whatif.md", check=False), context_settings=CONTEXT_SETTINGS)
@click.argument("input", type=click.Path(dir_okay=True, path_type=str))
@click.option(
    "--alloc-conf",
    "alloc_confs",
    multiple=True,
    metavar="CONF",
    help="A PYTORCH_CUDA_ALLOC_CONF to simulate, e.g. expandable_segments:True or "
    "max_split_size_mb:128,garbage_collection_threshold:0.6 (repeat; default: the standard sweep).",
)
@click.option(
    "--gpu-memory",
    "gpu_memories",
    multiple=True,
    metavar="SIZE",
    help="Memory the allocator may take on a card, e.g. 24GiB (repeat; default: 8, 12, 16, 24, 40, 48, 80 GiB).",
)
@output_options(report="what-if report", summary="what-if table", schema=WHATIF_SCHEMA, pictures=False)
@device_option("GPU device index to simulate (default: the one with the highest peak).")
@stages_from_option()
@quiet_option()
def whatif(
    input: str,
    alloc_confs: tuple[str, ...],
    gpu_memories: tuple[str, ...],
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
    device: int | None,
    stage_source: str,
    quiet: bool,
) -> None:
    """What if: re-run a snapshot's allocations under other allocator settings and card sizes.

    Simulates PyTorch's CUDA caching allocator on the recorded requests: reserved peak,
    fragmentation (reserved - allocated at that peak), cudaMalloc/cudaFree counts, retries,
    and where each setting would run out of memory. It first checks that the simulation of the
    recorded settings reproduces the recording event by event, and says so; when it does not,
    every figure is marked approximate. The recorded settings and card are always included.
    On a run that ran out of memory it also names the smallest card the run fits on (1 GiB
    steps, and the smallest common card) under the recorded settings and expandable segments.

    \b
    Examples:
      snapviz whatif snapshot.pickle
      snapviz whatif run/ --alloc-conf expandable_segments:True --gpu-memory 24GiB -o whatif.html
      snapviz whatif oom.pickle --json - | jq '.scenarios[] | select(.oom == null)'
    """
    from snapviz.analyses.whatif import parse_conf
    from snapviz.errors import InputError
    from snapviz.units import parse_size

    kw: dict[str, Any] = {"html_out": html_out, "md_out": md_out, "json_out": json_out}
    outputs.route_by_extension(kw, {})
    for conf in alloc_confs:
        parse_conf(conf)  # a bad value fails before any work
    cards = [parse_size(g, "--gpu-memory") for g in gpu_memories]
    if any(c <= 0 for c in cards):
        raise InputError("--gpu-memory: a card needs more than 0 bytes")
    if kw.get("png_out") or kw.get("svg_out"):
        raise InputError("-o: the what-if report is written as .html, .md or .json")
    outputs.check(kw, [input])

    from snapviz.analyses.document import bounded, to_json
    from snapviz.analyses.whatif import what_if, whatif_document
    from snapviz.load import load
    from snapviz.progress import Steps, reading
    from snapviz.render.whatif import render_whatif_markdown, render_whatif_terminal

    with reading(_input_files(input), "snapviz: loading", enabled=not quiet) as bar:
        run = load(input)
    steps = Steps(show=bar is not None)
    steps.step("simulating the allocator")
    w = what_if(
        run,
        device=device,
        alloc_confs=list(alloc_confs) if alloc_confs else None,
        gpu_memories=cards or None,
        stage_source=stage_source,
    )
    doc = bounded(whatif_document(w))
    rendered: list[tuple[str, str | bytes]] = []
    if kw["json_out"]:
        from snapviz.render.json_summary import render_json

        rendered.append((kw["json_out"], render_json(to_json(doc))))
    if kw["md_out"]:
        rendered.append((kw["md_out"], render_whatif_markdown(doc)))
    if kw["html_out"]:
        from snapviz.render.html.whatif import render_whatif_html

        rendered.append((kw["html_out"], render_whatif_html(w, doc)))
    steps.done()
    outputs.emit(rendered, lambda: render_whatif_terminal(doc), quiet)
