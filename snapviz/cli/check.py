"""``snapviz check``: gate CI on GPU memory (exit 1 when a limit is exceeded)."""

from __future__ import annotations

import os
from typing import Any

import click

from snapviz.cli import outputs
from snapviz.cli.errors import Command
from snapviz.cli.inputs import document_input
from snapviz.cli.options import CONTEXT_SETTINGS, epilog, quiet_option, stages_from_option
from snapviz.errors import CheckFailed, InputError
from snapviz.render.output import say
from snapviz.safe_text import printable


@click.command(cls=Command, epilog=epilog("docs/compare.md"), context_settings=CONTEXT_SETTINGS)
@click.argument("input", type=str)
@click.option(
    "--max-peak", metavar="SIZE", help="Limit on peak allocated (12GiB, 800MiB, 12GB = 12e9, '1.5 GiB', bytes)."
)
@click.option("--max-reserved", metavar="SIZE", help="Limit on peak reserved (what the caching allocator held).")
@click.option(
    "--max-stage-peak",
    "stage_limits",
    multiple=True,
    metavar="STAGE=SIZE",
    help="Limit on one stage's peak allocated, e.g. vae_decode=8GiB or denoise/0=6GiB (repeat).",
)
@click.option(
    "--baseline",
    type=str,
    metavar="B",
    help="A baseline run (snapshot, trace or run directory) for --max-increase, or a `snapviz history --json` "
    "file (its last or best run: --baseline-pick).",
)
@click.option(
    "--baseline-pick",
    type=click.Choice(["last", "best"]),
    default="last",
    show_default=True,
    help="With a history --baseline: its last run in history order, or its best (lowest peak allocated).",
)
@click.option(
    "--max-increase", metavar="PCT", help="Largest allowed increase of peak allocated over --baseline, e.g. 5%."
)
@click.option(
    "--fits",
    "fits",
    multiple=True,
    metavar="SIZE",
    help="Simulate the run on a card with this much memory for the allocator (recorded settings; "
    "snapshots only) and fail if it would run out of memory, e.g. --fits 24GiB (repeat). See docs/whatif.md.",
)
@click.option(
    "--junit-xml",
    "junit_out",
    type=click.Path(dir_okay=False),
    help="Also write a JUnit XML report (one testcase per limit).",
)
@stages_from_option()
@quiet_option("Print only failures.")
def check(
    input: str,
    max_peak: str | None,
    max_reserved: str | None,
    stage_limits: tuple[str, ...],
    baseline: str | None,
    baseline_pick: str,
    max_increase: str | None,
    fits: tuple[str, ...],
    junit_out: str | None,
    stage_source: str,
    quiet: bool,
) -> None:
    """Gate CI on GPU memory: exit 1 if a limit is exceeded.

    Prints one line per limit (PASS peak allocated 11.02 GiB <= 12.00 GiB, FAIL stage
    vae_decode 8.41 GiB > 8.00 GiB (+5.1%)). Sizes: GiB/MiB are binary, GB/MB decimal.
    A stage that the run does not have is an error (exit 2) that lists the stages it has.
    INPUT (and --baseline) may also be an earlier `snapviz analyze --json` file, read back
    and checked against the snapviz.summary/1 types (docs/summary.schema.json).

    \b
    Examples:
      snapviz check runs/sdxl-fp16/ --max-peak 12GiB --max-stage-peak vae_decode=8GiB
      snapviz check pr.pickle --baseline main.pickle --max-increase 5% --junit-xml memory.xml
      snapviz check pr/ --baseline history.json --baseline-pick best --max-increase 2%
      snapviz check pr.pickle --baseline main-summary.json --max-increase 5%
    """
    from snapviz.analyses.gate import evaluate_gates, history_notes, parse_stage_limit
    from snapviz.units import parse_percent, parse_size

    # Every option is validated before the (slow) analysis: bad options fail fast, exit 2.
    peak_limit = parse_size(max_peak, "--max-peak") if max_peak is not None else None
    reserved_limit = parse_size(max_reserved, "--max-reserved") if max_reserved is not None else None
    per_stage = [parse_stage_limit(s) for s in stage_limits]
    if (baseline is None) != (max_increase is None):
        raise InputError("--baseline and --max-increase go together (e.g. --baseline main.pickle --max-increase 5%)")
    increase = parse_percent(max_increase, "--max-increase") if max_increase is not None else None
    cards = [parse_size(g, "--fits") for g in fits]
    if any(c <= 0 for c in cards):
        raise InputError("--fits: a card needs more than 0 bytes")
    if peak_limit is None and reserved_limit is None and not per_stage and baseline is None and not cards:
        raise InputError(
            "nothing to check: give --max-peak, --max-reserved, --max-stage-peak, --fits or --baseline with "
            "--max-increase"
        )
    outputs.check({"junit_out": junit_out}, [input, baseline])

    doc = document_input(input, stage_source=stage_source)
    base_peak: int | None = None
    if baseline:
        from_history = _history_baseline(baseline, baseline_pick)
        base_peak = (
            int(from_history["peak"]["allocated_bytes"])
            if from_history is not None
            else document_input(baseline, stage_source=stage_source).peak.allocated_bytes
        )
    results = evaluate_gates(
        doc,
        max_peak=peak_limit,
        max_reserved=reserved_limit,
        stage_limits=per_stage,
        baseline_peak=base_peak,
        max_increase_pct=increase,
    )
    notes = history_notes(doc)
    if cards:
        from snapviz.analyses.gate import fits_gates
        from snapviz.analyses.whatif import what_if, whatif_document
        from snapviz.load import load

        gates, fit_notes = fits_gates(
            whatif_document(what_if(load(input), alloc_confs=[], gpu_memories=cards, stage_source=stage_source))
        )
        results = [*results, *gates]
        notes += fit_notes
    if junit_out:
        from snapviz.render.junit import render_junit
        from snapviz.render.output import write_outputs

        write_outputs([(junit_out, render_junit(results, source=input, notes=notes))])
    failed = [r for r in results if not r.passed]
    # Messages quote stage names from the input: one terminal line each, clipped.
    for r in results:
        if not quiet or not r.passed:
            say(printable(r.message))
    for n in notes:
        say(f"WARN {printable(n)}")
    if not quiet:
        say(f"{len(results) - len(failed)} passed, {len(failed)} failed ({printable(input)})")
    if failed:
        raise CheckFailed(f"snapviz check: {len(failed)} of {len(results)} limits exceeded")


HISTORY_JSON_MAX_BYTES = 64 << 20


def _history_baseline(path: str, pick: str) -> dict[str, Any] | None:
    """The baseline a ``snapviz history --json`` file names (its last or best run), or None when
    ``path`` is not such a file (then it is a run, loaded as usual)."""
    import json

    from snapviz.analyses.fleet_document import load_history
    from snapviz.analyses.history import history_baseline
    from snapviz.vocab import HISTORY_SCHEMA

    if not (os.path.isfile(path) and path.lower().endswith(".json")):
        return None
    try:
        with open(path, "rb") as f:
            # `history --json` writes the schema first; a trace (any size) is left to the loader
            if HISTORY_SCHEMA.encode() not in f.read(256) or os.path.getsize(path) > HISTORY_JSON_MAX_BYTES:
                return None
            f.seek(0)
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != HISTORY_SCHEMA:
        return None
    return history_baseline(load_history(doc, path), pick)
