"""``snapviz compare``: runs aligned stage by stage against the first one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from snapviz.cli import outputs
from snapviz.cli.errors import Command
from snapviz.cli.inputs import digest_inputs, unique_labels
from snapviz.cli.options import (
    CONTEXT_SETTINGS,
    count,
    epilog,
    max_points_option,
    output_options,
    quiet_option,
    stages_from_option,
)
from snapviz.cli.share import compare_picture_options, compare_picture_outputs
from snapviz.errors import CheckFailed, InputError
from snapviz.vocab import COMPARE_SCHEMA

if TYPE_CHECKING:
    from snapviz.analyses.whatif import WhatIf
    from snapviz.analyses.whatif_document import WhatIfDocument, WhatIfTwins


@click.command(cls=Command, epilog=epilog("docs/compare.md"), context_settings=CONTEXT_SETTINGS)
@compare_picture_options  # --png/--svg (snapviz/cli/share.py)
@click.argument("inputs", nargs=-1, required=True, metavar="BASE OTHER [MORE]...")
@output_options(report="comparison", summary="comparison", schema=COMPARE_SCHEMA)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="NAME",
    help="Name of each input, in order (repeat); default: file or directory name.",
)
@click.option(
    "--whatif",
    "whatifs",
    multiple=True,
    metavar="CONF",
    help="Also show BASE beside its simulated twin under this PYTORCH_CUDA_ALLOC_CONF, e.g. "
    "expandable_segments:True (repeat): reserved peak, fragmentation, cudaMalloc/cudaFree, retries and OOM, "
    "simulated from BASE's own requests (snapviz whatif). With --whatif one input is enough. "
    "Terminal, Markdown, JSON and HTML (the reserved curves, over the comparison); no PNG/SVG.",
)
@click.option(
    "--fail-over",
    "fail_over",
    metavar="PCT",
    help="Exit 1 if any OTHER's peak allocated exceeds BASE's by more than PCT (e.g. 5%).",
)
@stages_from_option("Where stage labels come from (every run).")
@max_points_option(200, "Timeline points kept per stage and run in the HTML (min/max decimation keeps every peak).")
@click.option(
    "-j",
    "--jobs",
    type=count(1),
    default=None,
    help="Runs loaded and analysed at once, in worker processes [the number of CPUs, at most 4]. "
    "Each worker needs the memory of one analysis.",
)
@quiet_option()
def compare(
    inputs: tuple[str, ...],
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
    labels: tuple[str, ...],
    whatifs: tuple[str, ...],
    fail_over: str | None,
    stage_source: str,
    max_points: int,
    jobs: int | None,
    quiet: bool,
) -> None:
    """Compare runs stage by stage against the first one (BASE).

    Inputs are snapshot pickles, Chrome traces or run directories. Runs are aligned by
    stage and step (denoise/3 against denoise/3, whatever the wall time), and the verdict
    says what changed and where, e.g. "fp16-tiled lowers peak allocated by 2.31 GiB
    (−20.6%), mostly in vae_decode; denoise unchanged (±0.3%)". Any number of runs can be
    compared with one base (several techniques against a baseline).

    \b
    Examples:
      snapviz compare runs/sdxl-fp16/ runs/sdxl-fp16-tiling/ -o compare.html
      snapviz compare base.pickle new.pickle --markdown - > comment.md
      snapviz compare base/ a/ b/ c/ --label base --label sdpa --label slicing --label tiling --json cmp.json
      snapviz compare main.pickle pr.pickle --fail-over 5%    # CI: exit 1 on a >5% regression
      snapviz compare run.pickle --whatif expandable_segments:True   # the run beside its simulated twin
    """
    from snapviz.analyses.compare import build_compare, compare_runs, over_limit
    from snapviz.analyses.compare_document import CompareDocument, bounded_compare
    from snapviz.analyses.document import to_json
    from snapviz.render.compare_md import render_compare_markdown, render_compare_terminal
    from snapviz.render.json_summary import render_json
    from snapviz.units import parse_percent

    if len(inputs) < 2 and not whatifs:
        raise InputError("compare needs at least two inputs: BASE OTHER [MORE]... (or one with --whatif CONF)")
    if max_points < 2:
        raise InputError("--max-points must be at least 2")
    pct = parse_percent(fail_over, "--fail-over") if fail_over is not None else None
    if whatifs:
        from snapviz.analyses.whatif import parse_conf
        from snapviz.cli.share import _opts

        for conf in whatifs:
            parse_conf(conf)  # a bad value fails before any work
        if any(_opts().values()):
            raise InputError("compare --whatif draws no PNG or SVG picture: use -o report.html for its curves")
        if pct is not None and len(inputs) < 2:
            raise InputError("--fail-over needs a second run to compare with BASE")
    names = unique_labels(inputs, labels)
    sim = _twin(inputs[0], names[0], whatifs, stage_source, quiet) if whatifs else None
    twin = sim[0] if sim is not None else None
    if len(inputs) < 2:
        assert twin is not None
        doc = bounded_compare(CompareDocument(schema=COMPARE_SCHEMA, runs=[], whatif=twin))
        cmp = None
    else:
        digests = digest_inputs(
            list(zip(inputs, names, strict=True)), stage_source, max_points, jobs, show_progress=not quiet
        )
        cmp = compare_runs(digests)
        doc = bounded_compare(build_compare(cmp, fail_over=pct, whatif=twin))

    rendered: list[tuple[str, str | bytes]] = list(compare_picture_outputs(cmp, doc)) if cmp is not None else []
    if json_out:
        rendered.append((json_out, render_json(to_json(doc))))
    if md_out:
        rendered.append((md_out, render_compare_markdown(doc)))
    if html_out and sim is not None and cmp is None:
        from snapviz.render.html.whatif import render_whatif_html

        rendered.append((html_out, render_whatif_html(sim[1], sim[2], kicker="snapviz compare --whatif")))
    elif html_out and cmp is not None:
        from snapviz.render.html import render_compare_html
        from snapviz.render.html.page import card_open

        lead: list[Any] = []
        if sim is not None:  # BASE beside its simulated twins, above the runs' comparison
            from snapviz.render.html.whatif import whatif_blocks, whatif_hero

            lead = [
                card_open(f"{names[0]} beside its simulated twins", "snapviz whatif, on the recorded card"),
                whatif_hero(sim[2], kicker=f"{names[0]}: simulated"),
                "</section>",
                *whatif_blocks(sim[1], sim[2]),
            ]
        rendered.append((html_out, render_compare_html(cmp, doc, lead)))
    outputs.emit(rendered, lambda: render_compare_terminal(doc), quiet)
    if cmp is None:
        return
    if pct is not None:
        failures = over_limit(cmp, pct)
        if failures:
            raise CheckFailed("\n".join(failures))


def _twin(
    path: str, label: str, confs: tuple[str, ...], stage_source: str, quiet: bool
) -> tuple[WhatIfTwins, WhatIf, WhatIfDocument]:
    """BASE beside its simulated twins (``snapviz.analyses.whatif.twin_document``), with the what-if
    and its ``snapviz.whatif/1`` document that the HTML draws from (the same simulation)."""
    from snapviz.analyses.document import bounded
    from snapviz.analyses.whatif import twin_document, what_if, whatif_document
    from snapviz.cli.analyze import _input_files
    from snapviz.load import load
    from snapviz.progress import reading

    with reading(_input_files(path), "snapviz: loading", enabled=not quiet):
        run = load(path)
    alloc = (run.run_json or {}).get("allocator")
    stats = alloc.get("stats") if isinstance(alloc, dict) else None
    retries = stats.get("num_alloc_retries") if isinstance(stats, dict) else None
    w = what_if(run, alloc_confs=list(confs), gpu_memories=[], stage_source=stage_source)
    recorded_retries = retries if isinstance(retries, int) and not isinstance(retries, bool) else None
    wdoc = whatif_document(w)
    return twin_document(w, label, recorded_retries, wdoc), w, bounded(wdoc)
