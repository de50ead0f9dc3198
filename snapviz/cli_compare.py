"""``snapviz compare`` and ``snapviz check``: thin verbs over load -> analyses -> renderers."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import click

from snapviz.cli_share import compare_picture_options, compare_picture_outputs
from snapviz.errors import CheckFailed, InputError
from snapviz.safe_text import bounded_doc, printable

EPILOG = """\b
Exit codes: 0 success, 1 a check failed, 2 bad input or options.
Docs: docs/compare.md in the snapviz repository."""

STAGE_SOURCES = ["auto", "user_metadata", "annotations", "run.json", "frames", "phases"]


_SUFFIXES = (".gz", ".xz", ".zst", ".bz2", ".pickle", ".pkl", ".json")


def default_label(path: str) -> str:
    """``runs/sdxl-fp16/`` -> ``sdxl-fp16``; ``base.pickle.xz`` -> ``base``; a run directory's
    ``snapshot.pickle`` or ``trace.json.gz`` -> the directory's name."""
    norm = os.path.normpath(path)
    if os.path.isdir(norm):
        return os.path.basename(os.path.abspath(norm))
    name = os.path.basename(norm)
    if name.startswith(("snapshot.", "trace.json")) and os.path.basename(os.path.dirname(os.path.abspath(norm))):
        return os.path.basename(os.path.dirname(os.path.abspath(norm)))
    stem = name
    while True:
        for suf in _SUFFIXES:
            if stem.endswith(suf) and len(stem) > len(suf):
                stem = stem[: -len(suf)]
                break
        else:
            return stem or name


def _unique_labels(paths: Sequence[str], given: Sequence[str]) -> list[str]:
    """``--label`` values in input order; the rest from file or directory names, made unique."""
    if len(given) > len(paths):
        raise InputError(f"{len(given)} --label values for {len(paths)} inputs")
    labels = list(given)
    for p in paths[len(given):]:
        labels.append(default_label(p))
    dups = {lab for lab in labels if labels.count(lab) > 1}
    for i, lab in enumerate(labels):
        if lab in dups and i >= len(given):
            parent = os.path.basename(os.path.dirname(os.path.abspath(paths[i])))
            labels[i] = f"{parent}/{lab}" if parent else lab
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        if lab in seen:
            seen[lab] += 1
            labels[i] = f"{lab}#{seen[lab]}"
        else:
            seen[lab] = 1
    return labels


def _analyze_input(path: str, label: str | None, stage_source: str) -> tuple[Any, dict[str, Any] | None]:
    """(Analysis, None) for a snapshot; (None, summary dict) for a trace-only run."""
    from snapviz.load import load

    run = load(path, label)
    if run.snapshot is None:
        try:
            from snapviz.analyses.trace_summary import analyze_trace_run, trace_summary_dict
        except ImportError:
            raise InputError(f"{path}: a trace without a memory snapshot; this snapviz build needs a snapshot here") from None
        return None, trace_summary_dict(analyze_trace_run(run))
    from snapviz.analyses.summary import analyze_run

    return analyze_run(run, stage_source=stage_source), None


def summarize_input(path: str, label: str | None = None, stage_source: str = "auto") -> tuple[dict[str, Any], Any]:
    """Load one input: the ``snapviz.summary/1`` dict and the Analysis (None for trace-only runs)."""
    an, doc = _analyze_input(path, label, stage_source)
    if an is None:
        assert doc is not None
        return doc, None
    from snapviz.analyses.summary import summary_dict

    return summary_dict(an), an


def digest_input(path: str, label: str, stage_source: str = "auto", points_per_label: int = 200) -> Any:
    """One input reduced to a :class:`~snapviz.analyses.digest.RunDigest` (the analysis is dropped)."""
    from snapviz.analyses.digest import digest_run, digest_summary

    an, doc = _analyze_input(path, label, stage_source)
    if an is None:
        assert doc is not None
        return digest_summary(doc, label)
    return digest_run(an, label, points_per_label=points_per_label)


def digest_inputs(items: list[tuple[str, str]], stage_source: str, points_per_label: int, jobs: int | None) -> list[Any]:
    """Digest every input, ``jobs`` at a time in worker processes (each run is loaded,
    analysed and reduced independently; only the small digests come back)."""
    from snapviz.progress import progress

    n = min(len(items), jobs if jobs else min(os.cpu_count() or 1, 4))
    with progress(len(items), "snapviz: analysing runs") as step:
        if n <= 1:
            out = []
            for p, lab in items:
                out.append(digest_input(p, lab, stage_source, points_per_label))
                step(1)
            return out
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(digest_input, p, lab, stage_source, points_per_label) for p, lab in items]
            for _ in as_completed(futures):
                step(1)
            return [f.result() for f in futures]


# ----------------------------------------------------------------------------- compare

@click.command(epilog=EPILOG)
@compare_picture_options  # --png/--svg (snapviz/cli_share.py)
@click.argument("inputs", nargs=-1, required=True, metavar="BASE OTHER [MORE]...")
@click.option("-o", "--output", "html_out", type=click.Path(dir_okay=False), help="Write the comparison here; the extension picks the format: .html (one self-contained page, opens offline), .md, .json, .png, .svg.")
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, allow_dash=True), help="Write a Markdown comparison (≤ 60 lines) for an issue; '-' for stdout.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), help="Write the machine-readable comparison (schema snapviz.compare/1); '-' for stdout.")
@click.option("--label", "labels", multiple=True, metavar="NAME", help="Name of each input, in order (repeat); default: file or directory name.")
@click.option("--fail-over", "fail_over", metavar="PCT", help="Exit 1 if any OTHER's peak allocated exceeds BASE's by more than PCT (e.g. 5%).")
@click.option("--stages-from", "stage_source", type=click.Choice(STAGE_SOURCES), default="auto", show_default=True, help="Where stage labels come from (every run).")
@click.option("--max-points", type=int, default=200, show_default=True, help="Timeline points kept per stage and run in the HTML (min/max decimation keeps every peak).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Runs loaded and analysed at once, in worker processes [the number of CPUs, at most 4]. "
                   "Each worker needs the memory of one analysis.")
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
def compare(inputs: tuple[str, ...], html_out: str | None, md_out: str | None, json_out: str | None, labels: tuple[str, ...],
            fail_over: str | None, stage_source: str, max_points: int, jobs: int | None, quiet: bool) -> None:
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
    """
    from snapviz.analyses.compare import compare_dict, compare_runs, over_limit
    from snapviz.render.output import check_outputs, write_outputs
    from snapviz.units import parse_percent

    if len(inputs) < 2:
        raise InputError("compare needs at least two inputs: BASE OTHER [MORE]...")
    if max_points < 2:
        raise InputError("--max-points must be at least 2")
    check_outputs([("-o", html_out), ("--markdown", md_out), ("--json", json_out)], inputs=inputs)
    pct = parse_percent(fail_over, "--fail-over") if fail_over is not None else None
    names = _unique_labels(inputs, labels)
    digests = digest_inputs(list(zip(inputs, names, strict=True)), stage_source, max_points, jobs)
    cmp = compare_runs(digests)
    doc = bounded_doc(compare_dict(cmp, fail_over=pct))

    outputs: list[tuple[str, str | bytes]] = list(compare_picture_outputs(cmp, doc))
    if json_out:
        from snapviz.render.json_summary import render_json
        outputs.append((json_out, render_json(doc)))
    if md_out:
        from snapviz.render.compare_md import render_compare_markdown
        outputs.append((md_out, render_compare_markdown(doc)))
    if html_out:
        from snapviz.render.html import render_compare_html
        outputs.append((html_out, render_compare_html(cmp, doc)))
    written = write_outputs(outputs)
    to_stdout = json_out == "-" or md_out == "-"
    if not quiet and not to_stdout:
        from snapviz.render.compare_md import render_compare_terminal
        click.echo(render_compare_terminal(doc), nl=False)
        for path in written:
            click.echo(f"  wrote {printable(path, None)}")
    if pct is not None:
        failures = over_limit(cmp, pct)
        if failures:
            raise CheckFailed("\n".join(failures))


# ----------------------------------------------------------------------------- check

@click.command(epilog=EPILOG)
@click.argument("input", type=str)
@click.option("--max-peak", metavar="SIZE", help="Limit on peak allocated (12GiB, 800MiB, 12GB = 12e9, '1.5 GiB', bytes).")
@click.option("--max-reserved", metavar="SIZE", help="Limit on peak reserved (what the caching allocator held).")
@click.option("--max-stage-peak", "stage_limits", multiple=True, metavar="STAGE=SIZE",
              help="Limit on one stage's peak allocated, e.g. vae_decode=8GiB or denoise/0=6GiB (repeat).")
@click.option("--baseline", type=str, metavar="B", help="A baseline run (snapshot, trace or run directory) for --max-increase.")
@click.option("--max-increase", metavar="PCT", help="Largest allowed increase of peak allocated over --baseline, e.g. 5%.")
@click.option("--junit-xml", "junit_out", type=click.Path(dir_okay=False), help="Also write a JUnit XML report (one testcase per limit).")
@click.option("--stages-from", "stage_source", type=click.Choice(STAGE_SOURCES), default="auto", show_default=True, help="Where stage labels come from.")
@click.option("-q", "--quiet", is_flag=True, help="Print only failures.")
def check(input: str, max_peak: str | None, max_reserved: str | None, stage_limits: tuple[str, ...], baseline: str | None,
          max_increase: str | None, junit_out: str | None, stage_source: str, quiet: bool) -> None:
    """Gate CI on GPU memory: exit 1 if a limit is exceeded.

    Prints one line per limit (PASS peak allocated 11.02 GiB <= 12.00 GiB, FAIL stage
    vae_decode 8.41 GiB > 8.00 GiB (+5.1%)). Sizes: GiB/MiB are binary, GB/MB decimal.
    A stage that the run does not have is an error (exit 2) that lists the stages it has.

    \b
    Examples:
      snapviz check runs/sdxl-fp16/ --max-peak 12GiB --max-stage-peak vae_decode=8GiB
      snapviz check pr.pickle --baseline main.pickle --max-increase 5% --junit-xml memory.xml
    """
    from snapviz.analyses.gate import evaluate_gates, parse_stage_limit
    from snapviz.units import parse_percent, parse_size

    # Every option is validated before the (slow) analysis: bad options fail fast, exit 2.
    peak_limit = parse_size(max_peak, "--max-peak") if max_peak is not None else None
    reserved_limit = parse_size(max_reserved, "--max-reserved") if max_reserved is not None else None
    per_stage = [parse_stage_limit(s) for s in stage_limits]
    if (baseline is None) != (max_increase is None):
        raise InputError("--baseline and --max-increase go together (e.g. --baseline main.pickle --max-increase 5%)")
    increase = parse_percent(max_increase, "--max-increase") if max_increase is not None else None
    if peak_limit is None and reserved_limit is None and not per_stage and baseline is None:
        raise InputError("nothing to check: give --max-peak, --max-reserved, --max-stage-peak or --baseline with --max-increase")
    from snapviz.render.output import check_outputs, write_outputs

    check_outputs([("--junit-xml", junit_out)], inputs=[input, *([baseline] if baseline else [])])

    doc, _ = summarize_input(input, stage_source=stage_source)
    base_doc = summarize_input(baseline, stage_source=stage_source)[0] if baseline else None
    results = evaluate_gates(doc, max_peak=peak_limit, max_reserved=reserved_limit, stage_limits=per_stage,
                             baseline=base_doc, max_increase_pct=increase)
    notes = [w for w in doc.get("warnings") or [] if "history" in w or "wrapped" in w]
    if junit_out:
        from snapviz.render.junit import render_junit
        write_outputs([(junit_out, render_junit(results, source=input, notes=notes))])
    failed = [r for r in results if not r.passed]
    # Messages quote stage names from the input: one terminal line each, clipped.
    for r in results:
        if not quiet or not r.passed:
            click.echo(printable(r.message))
    for n in notes:
        click.echo(f"WARN {printable(n)}")
    if not quiet:
        click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed ({printable(input)})")
    if failed:
        raise CheckFailed(f"snapviz check: {len(failed)} of {len(results)} limits exceeded")
