"""Options that take a report where users already work: a Perfetto trace, a picture (``-o``
with a .png/.svg name routes here too, :func:`snapviz.cli.outputs.route_by_extension`).

Kept out of the verbs on purpose: a verb opts in with one decorator
(:func:`analyze_share_options` / :func:`compare_picture_options`) and one call
(:func:`share_outputs` / :func:`compare_picture_outputs`) once its analysis exists.
The decorator validates the paths *before* the verb does any work (exit 2, nothing
written), and stashes them on the click context for the call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from snapviz.cli import outputs
from snapviz.errors import InputError

if TYPE_CHECKING:
    from snapviz.analyses.analysis import Analysis
    from snapviz.analyses.compare import Comparison
    from snapviz.analyses.compare_document import CompareDocument
    from snapviz.analyses.document import Summary

_META_KEY = "snapviz.share"
_OWN_OUTPUTS = ("html_out", "md_out", "json_out")


def _append_options(f: Callable[..., Any], options: list[click.Option]) -> Callable[..., Any]:
    """Add ``options`` after the verb's own in ``--help`` (click lists params in reverse
    order of decoration, so they go to the front of the list, reversed)."""
    f.__click_params__ = list(reversed(options)) + list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
    return f


def _picture_opts() -> list[click.Option]:
    return [
        click.Option(
            ["--png", "png_out"],
            type=click.Path(dir_okay=False),
            help="Write a static PNG picture of the timeline, 900 px wide, for an issue or a PR comment "
            "(needs matplotlib: pip install 'snapviz[picture]').",
        ),
        click.Option(["--svg", "svg_out"], type=click.Path(dir_okay=False), help="The same picture as SVG."),
    ]


def analyze_share_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--perfetto``, ``--merge-into``, ``--png``, ``--svg`` for ``analyze``."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> Any:
        opts = {k: kw.pop(k) for k in ("perfetto_out", "merge_into", "merge_anyway", "png_out", "svg_out")}
        outputs.route_by_extension(kw, opts)
        if opts["merge_into"] and not opts["perfetto_out"]:
            raise InputError("--merge-into needs --perfetto FILE (the merged trace is written there, never in place)")
        if opts["merge_anyway"] and not opts["merge_into"]:
            raise InputError("--merge-anyway goes with --merge-into TRACE")
        if opts["merge_into"] and not os.path.isfile(opts["merge_into"]):
            raise InputError(f"--merge-into {opts['merge_into']}: no such file")
        if opts["perfetto_out"] and _trace_only(kw.get("input")):
            raise InputError(
                f"--perfetto needs a memory snapshot; {kw.get('input')} is a trace only (it is viewable as it is)"
            )
        outputs.check(
            {
                **{k: kw.get(k) for k in _OWN_OUTPUTS},
                "perfetto_out": opts["perfetto_out"],
                "png_out": opts["png_out"],
                "svg_out": opts["svg_out"],
            },
            [kw.get("input"), opts["merge_into"], kw.get("rules_path")],  # everything the command reads
        )
        outputs.refuse_unknown_format(kw, opts)
        if opts["png_out"] or opts["svg_out"]:
            _require_matplotlib()
        click.get_current_context().meta[_META_KEY] = opts
        return f(**kw)

    return _append_options(
        wrapper,
        [
            click.Option(
                ["--perfetto", "perfetto_out"],
                type=click.Path(dir_okay=False),
                help="Write a Chrome/Perfetto trace (.json or .json.gz) of the replayed memory: counters, "
                "stages, steps, peak, OOMs, largest allocations with stacks (ui.perfetto.dev).",
            ),
            click.Option(
                ["--merge-into", "merge_into"],
                type=click.Path(dir_okay=False),
                metavar="TRACE",
                help="With --perfetto: add the memory tracks to this torch.profiler trace (same clock); "
                "the result goes to the --perfetto file, the trace itself is not modified. A trace "
                "recorded more than a day away from the snapshot is refused (not the same run).",
            ),
            click.Option(
                ["--merge-anyway", "merge_anyway"],
                is_flag=True,
                help="With --merge-into: merge even a trace recorded more than a day away from the snapshot.",
            ),
            *_picture_opts(),
        ],
    )


def _trace_only(path: str | None) -> bool:
    """True when ``path`` holds no snapshot: a Chrome trace file, or a run directory with a trace
    and no snapshot (found by names and the file's first keys, before any loading)."""
    from snapviz.load import SNAPSHOT_NAMES, TRACE_NAMES
    from snapviz.load.trace.chrome_trace import looks_like_chrome_trace

    if not path:
        return False
    if os.path.isdir(path):
        names = set(os.listdir(path))
        return not names & set(SNAPSHOT_NAMES) and bool(names & set(TRACE_NAMES))
    try:
        return os.path.isfile(path) and looks_like_chrome_trace(path)
    except (OSError, ValueError):
        return False  # the loader reports what is wrong with it


def compare_picture_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--png``/``--svg`` for ``compare``: the runs overlaid, aligned by stage."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> Any:
        opts = {k: kw.pop(k) for k in ("png_out", "svg_out")}
        outputs.route_by_extension(kw, opts)
        outputs.check({**{k: kw.get(k) for k in _OWN_OUTPUTS}, **opts}, list(kw.get("inputs") or ()))
        outputs.refuse_unknown_format(kw, opts)
        if opts["png_out"] or opts["svg_out"]:
            _require_matplotlib()
        click.get_current_context().meta[_META_KEY] = opts
        return f(**kw)

    return _append_options(wrapper, _picture_opts())


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--png/--svg need matplotlib: pip install 'snapviz[picture]' (or pip install matplotlib)"
        ) from None


def _opts() -> dict[str, Any]:
    ctx = click.get_current_context(silent=True)
    return (ctx.meta.get(_META_KEY) if ctx is not None else None) or {}


def picture_for_markdown(md_out: str | None) -> str | None:
    """The --png (else --svg) picture's path relative to the Markdown file, for an image link;
    None when there is no picture or the Markdown goes to stdout (no place to be relative to)."""
    opts = _opts()
    pic = opts.get("png_out") or opts.get("svg_out")
    if not pic or not md_out or md_out == "-":
        return None
    rel = os.path.relpath(os.path.abspath(pic), os.path.dirname(os.path.abspath(md_out)))
    return rel.replace(os.sep, "/")


def share_outputs(an: Analysis, summary: Summary) -> list[tuple[str, bytes]]:
    """Rendered Perfetto/PNG/SVG files for one analysis and its ``snapviz.summary/1`` document
    (nothing written yet).

    A trace-only run (``an.kind == "trace"``) has its pictures drawn from the trace's memory
    events; it has no replayed allocator to export to Perfetto (refused before any work,
    :func:`analyze_share_options`).
    """
    opts = _opts()
    wanted = [opts.get(k) for k in ("perfetto_out", "png_out", "svg_out")]
    if not any(wanted):
        return []
    out: list[tuple[str, bytes]] = []
    if an.kind == "trace":
        if opts.get("perfetto_out"):
            raise InputError("--perfetto needs a memory snapshot; this input is a trace only (it is viewable as it is)")
        from snapviz.render.picture import render_trace_picture

        for key, fmt in (("png_out", "png"), ("svg_out", "svg")):
            if opts.get(key):
                out.append((opts[key], render_trace_picture(an, summary, fmt)))
        return out
    if opts.get("perfetto_out"):
        from snapviz.render.perfetto import render_perfetto

        out.append(
            (
                opts["perfetto_out"],
                render_perfetto(
                    an,
                    opts["perfetto_out"],
                    merge_into=opts.get("merge_into"),
                    merge_anyway=bool(opts.get("merge_anyway")),
                ),
            )
        )
    if opts.get("png_out") or opts.get("svg_out"):
        from snapviz.render.picture import render_timeline_picture

        for key, fmt in (("png_out", "png"), ("svg_out", "svg")):
            if opts.get(key):
                out.append((opts[key], render_timeline_picture(an, summary, fmt)))
    return out


def compare_picture_outputs(cmp: Comparison, doc: CompareDocument) -> list[tuple[str, bytes]]:
    """Rendered PNG/SVG comparison pictures (nothing written yet)."""
    opts = _opts()
    if not (opts.get("png_out") or opts.get("svg_out")):
        return []
    from snapviz.render.picture import render_compare_picture

    return [
        (opts[key], render_compare_picture(cmp, doc, fmt))
        for key, fmt in (("png_out", "png"), ("svg_out", "svg"))
        if opts.get(key)
    ]
