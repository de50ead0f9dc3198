"""Option decorators shared by the verbs: one spelling, one help text, one default each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# The largest count an option takes (points, jobs, a device index, N largest blocks): far above
# any real use, far below what a NumPy int64 computation could overflow on.
MAX_COUNT = 2**31 - 1


def count(min: int = 1) -> click.IntRange:
    """An integer option's type: ``min`` to :data:`MAX_COUNT`; anything else (a 20-digit number
    included) is a usage error, one line, exit 2."""
    return click.IntRange(min=min, max=MAX_COUNT)


STAGE_SOURCES = ["auto", "user_metadata", "annotations", "run.json", "frames", "phases"]
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def epilog(docs: str, check: bool = True) -> str:
    """The exit-code and docs lines at the end of every verb's ``--help``."""
    codes = "0 success, 1 a check failed, 2 bad input or options" if check else "0 success, 2 bad input or options"
    return f"\b\nExit codes: {codes}.\nDocs: {docs} in the snapviz repository."


def _stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Apply ``decorators`` so that ``--help`` lists them in the order given."""

    def apply(f: F) -> F:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def output_options(report: str, summary: str, schema: str, pictures: bool = True) -> Callable[[F], F]:
    """``-o/--output`` (the format by its extension), ``--markdown`` and ``--json`` (either may be
    ``-``), named ``html_out``/``md_out``/``json_out`` as :mod:`snapviz.cli.outputs` expects.
    ``pictures``: whether the verb also writes .png/.svg (its help lists only what it writes)."""
    formats = ".html (interactive, self-contained, opens offline), .md, .json" + (", .png, .svg" if pictures else "")
    return _stack(
        click.option(
            "-o",
            "--output",
            "html_out",
            type=click.Path(dir_okay=False),
            help=f"Write the {report} here; the extension picks the format: {formats}; any other extension is refused.",
        ),
        click.option(
            "--markdown",
            "md_out",
            type=click.Path(dir_okay=False, allow_dash=True),
            help=f"Write a Markdown {summary} (≤ 60 lines) to paste into an issue; '-' for stdout.",
        ),
        click.option(
            "--json",
            "json_out",
            type=click.Path(dir_okay=False, allow_dash=True),
            help=f"Write the machine-readable {summary} (schema {schema}); '-' for stdout.",
        ),
    )


def device_option(help: str) -> Callable[[F], F]:
    """``--device N``: a CUDA device index of the input (default: the one with the highest peak)."""
    return click.option("--device", type=count(0), default=None, help=help)


def stages_from_option(help: str = "Where stage labels come from.") -> Callable[[F], F]:
    return click.option(
        "--stages-from", "stage_source", type=click.Choice(STAGE_SOURCES), default="auto", show_default=True, help=help
    )


def rules_option(f: F) -> F:
    return click.option(
        "--rules",
        "rules_path",
        type=click.Path(exists=True, dir_okay=False),
        help="Stage/category rules file (JSON) replacing or extending the built-in diffusers rules.",
    )(f)


def max_points_option(default: int, help: str) -> Callable[[F], F]:
    return click.option("--max-points", type=count(1), default=default, show_default=True, help=help)


def quiet_option(help: str = "No terminal summary.") -> Callable[[F], F]:
    return click.option("-q", "--quiet", is_flag=True, help=help)
