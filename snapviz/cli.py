"""The ``snapviz`` command: thin verbs over load -> analyses -> renderers (docs/design.md)."""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from snapviz import __version__
from snapviz.cli_share import analyze_share_options, picture_for_markdown, share_outputs
from snapviz.errors import CheckFailed, InputError, error_line
from snapviz.safe_text import bounded_doc, printable

EPILOG = """\b
Exit codes: 0 success, 1 a check failed, 2 bad input or options.
Docs: README.md and docs/ in the snapviz repository."""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, epilog=EPILOG)
@click.version_option(__version__, prog_name="snapviz")
def cli() -> None:
    """Analyse GPU memory snapshots and traces of diffusion pipelines.

    \b
    snapviz analyze snapshot.pickle -o report.html   # why did it OOM?
    snapviz compare before/ after/ -o compare.html   # did my change help?
    snapviz check run/ --max-peak 12GiB              # gate CI on peak memory
    snapviz collect --pipeline sdxl --technique fp16 # record a labelled run
    """


@cli.command(epilog=EPILOG)
@analyze_share_options  # --perfetto/--merge-into/--png/--svg (snapviz/cli_share.py)
@click.argument("input", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", "html_out", type=click.Path(dir_okay=False), help="Write the report here; the extension picks the format: .html (interactive, self-contained, opens offline), .md, .json, .png, .svg.")
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, allow_dash=True), help="Write a Markdown summary (≤ 60 lines) to paste into an issue; '-' for stdout.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), help="Write the machine-readable summary (schema snapviz.summary/1); '-' for stdout.")
@click.option("--device", type=int, default=None, help="GPU device index to analyse, in snapshots and traces (default: the one with the highest peak).")
@click.option("--stages-from", "stage_source", type=click.Choice(["auto", "user_metadata", "annotations", "run.json", "frames", "phases"]),
              default="auto", show_default=True, help="Where stage labels come from.")
@click.option("--rules", "rules_path", type=click.Path(exists=True, dir_okay=False), help="Stage/category rules file (JSON) replacing or extending the built-in diffusers rules.")
@click.option("--max-points", type=int, default=20000, show_default=True, help="Timeline points kept in the HTML (min/max decimation keeps the peak).")
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
def analyze(input: str, html_out: str | None, md_out: str | None, json_out: str | None, device: int | None,
            stage_source: str, rules_path: str | None, max_points: int, quiet: bool) -> None:
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
    from snapviz.load import load
    from snapviz.render.output import check_outputs

    check_outputs([("-o", html_out), ("--markdown", md_out), ("--json", json_out)], inputs=[input])
    from snapviz.analyses.frame_rules import load_rules

    rules = load_rules(rules_path)  # resolved (and validated) once, before any work
    progress = _Progress(input, enabled=not quiet)
    progress.step("loading")
    run = load(input)
    progress.step("replaying the allocator and attributing stages")
    if run.snapshot is None:
        from snapviz.analyses.trace_summary import analyze_trace_run, trace_summary_dict
        tan = analyze_trace_run(run, device=device)
        doc = trace_summary_dict(tan)
        html_builder = None
        if html_out:
            from snapviz.render.html import render_trace_html
            html_builder = lambda: render_trace_html(tan, doc, max_points=max_points)  # noqa: E731
        extra = share_outputs(None, doc)
    else:
        from snapviz.analyses.summary import analyze_run, summary_dict
        an = analyze_run(run, device=device, stage_source=stage_source, rules=rules)
        doc = summary_dict(an)
        html_builder = None
        if html_out:
            from snapviz.render.html import render_html
            html_builder = lambda: render_html(an, doc, max_points=max_points)  # noqa: E731
        extra = share_outputs(an, doc)
    progress.step("writing reports")
    _emit(doc, html_out, html_builder, md_out, json_out, quiet, before_print=progress.done, extra=extra)


class _Progress:
    """One status line on stderr for inputs that take a while (an interactive terminal only;
    CI logs and pipes stay clean)."""

    BIG = 32 << 20  # bytes on disk: about 400k trace entries, a few seconds of work

    def __init__(self, path: str, enabled: bool = True) -> None:
        import time

        try:
            size = os.path.getsize(path) if os.path.isfile(path) else sum(
                os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        except OSError:
            size = 0
        self.on = enabled and size >= self.BIG and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self._time = time.perf_counter

    def step(self, what: str) -> None:
        if self.on:
            sys.stderr.write(f"\r\033[Ksnapviz: {what}… ({self._time() - self.t0:.1f} s)")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _emit(doc: dict[str, Any], html_out: str | None, html_builder: Any, md_out: str | None, json_out: str | None,
          quiet: bool, before_print: Any = None, extra: list[tuple[str, bytes]] | None = None) -> None:
    from snapviz.render.json_summary import render_json
    from snapviz.render.markdown import render_markdown
    from snapviz.render.output import write_outputs
    from snapviz.render.terminal import render_terminal

    # Render everything first, then write: a failure leaves no partial outputs. Every renderer
    # gets the bounded document (strings clipped, non-finite numbers null, with warnings).
    doc = bounded_doc(doc)
    outputs: list[tuple[str, str | bytes]] = list(extra or [])
    if json_out:
        outputs.append((json_out, render_json(doc)))
    if md_out:
        outputs.append((md_out, render_markdown(doc, picture=picture_for_markdown(md_out))))
    if html_out:
        outputs.append((html_out, html_builder()))
    if before_print is not None:
        before_print()
    written = write_outputs(outputs)
    if not quiet and not (json_out == "-" or md_out == "-"):
        click.echo(render_terminal(doc), nl=False, err=False)
        for path in written:
            click.echo(f"  wrote {printable(path, None)}")


def _register_optional() -> None:
    """Verbs that live in other modules (kept importable without torch)."""
    try:
        from snapviz.cli_compare import check, compare
    except ImportError:
        pass
    else:
        cli.add_command(compare)
        cli.add_command(check)
    from snapviz.cli_trim import trim  # snapviz trim (shareable snapshots)

    cli.add_command(trim)
    try:
        from collectors.cli import collect, matrix
    except ImportError:
        pass
    else:
        cli.add_command(collect)
        cli.add_command(matrix)


_register_optional()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: the one place errors become exit codes and one stderr line each
    (control characters in file-derived text escaped, so a line stays one line)."""
    try:
        rv = cli.main(args=argv, prog_name="snapviz", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("snapviz: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        click.echo(error_line(exc.format_message()) + hint, err=True)
        sys.exit(2 if exc.exit_code not in (0, 1) else exc.exit_code)
    except InputError as exc:
        click.echo(error_line(str(exc)), err=True)
        sys.exit(2)
    except CheckFailed as exc:
        for line in str(exc).splitlines():
            click.echo(printable(line, None), err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("snapviz: interrupted", err=True)
        sys.exit(130)
    except MemoryError:
        click.echo("snapviz: error: out of memory while reading the input", err=True)
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - one line for users; SNAPVIZ_DEBUG=1 shows the traceback
        if os.environ.get("SNAPVIZ_DEBUG"):
            raise
        click.echo(error_line(f"could not process the input ({type(exc).__name__}: {exc}); if the input is valid "
                              "this is a snapviz bug: rerun with SNAPVIZ_DEBUG=1 and report it"), err=True)
        sys.exit(2)
    if isinstance(rv, int) and rv:
        sys.exit(rv)
    sys.exit(0)
