"""The matrix's end: rank the variants, build the comparison, write JSON/Markdown/HTML.

Shared by a fresh matrix and ``--from-dir`` (which re-reports a finished one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from collectors.errors import OptionError
from snapviz.errors import InputError
from snapviz.render.json_summary import render_json
from snapviz.render.output import write_outputs
from snapviz.safe_text import printable

from .document import build_comparison, matrix_dict
from .ranking import rank_results
from .report import OWN_SENTENCES, render_full_markdown, render_matrix_html, render_matrix_markdown
from .runner import MatrixOptions, VariantResult, variant_row


def write_reports(
    opts: MatrixOptions,
    results: list[VariantResult],
    base: str,
    skipped: list[dict[str, str]],
    notes: list[str],
    out_dir: Path,
    html_out: str | None,
    md_out: str | None,
    json_out: str | None,
) -> None:
    """Rank the variants, build the stage-aligned comparison, write the reports."""
    rows = [variant_row(r) for r in results]
    ok = [r for r in rows if r["status"] == "ok" and r["measure"]]
    if ok and base not in [r["label"] for r in ok]:
        notes.append(
            f"the baseline {base} did not run ({next(r['status'] for r in rows if r['label'] == base)}); "
            f"everything is relative to {ok[0]['label']} instead"
        )
        base = ok[0]["label"]
    if len({r["measure"]["memory_metric"] for r in ok}) > 1:
        notes.append("variants mix allocator and RSS numbers; compare like with like")
    cmp, compare_doc = None, None
    if ok:
        rows = rank_results(rows, base)
        built = build_comparison(rows)
        if built is not None:
            cmp, compare_doc = built
        else:
            notes.append("the stage-aligned comparison needs two variants that ran")
    doc = matrix_dict(opts, rows, base if ok else None, skipped, notes, compare_doc)

    outputs = [
        (json_out or str(out_dir / "matrix.json"), lambda: render_json(doc, OWN_SENTENCES)),
        (md_out or str(out_dir / "matrix.md"), lambda: render_full_markdown(doc)),
        (html_out or str(out_dir / "matrix.html"), lambda: render_matrix_html(doc, cmp)),
    ]
    rendered = []
    for path, make in outputs:
        try:
            rendered.append((path, make()))
        except ImportError as err:  # e.g. a GPU box without bokeh: keep the JSON/Markdown
            click.echo(
                f"  skipped {path}: {err} (re-render elsewhere with snapviz matrix --from-dir {out_dir})", err=True
            )
    try:
        written = write_outputs(rendered)
    except InputError as err:  # e.g. the disk filled up: nothing was written
        raise OptionError(str(err)) from None
    if "-" not in (json_out, md_out):
        click.echo(render_matrix_markdown(doc), nl=False)
    for path in written:
        click.echo(f"  wrote {printable(path, None)}", err=True)
    if not ok:
        click.echo(f"no variant ran successfully; see the logs in {out_dir}", err=True)
        sys.exit(1)
