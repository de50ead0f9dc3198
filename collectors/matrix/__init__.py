"""``snapviz matrix``: one pipeline across technique combinations, ranked against a baseline.

* :mod:`.variants` — the grammar: which variants run (``fp16+vae-tiling``), in what order;
* :mod:`.runner` — each variant in its own ``python -m collectors`` process (``--jobs N``);
* :mod:`.ranking` — per-variant numbers from ``run.json`` alone (the allocator's per-stage peaks
  on CUDA, process RSS on CPU) and the ranking rule;
* :mod:`.document` — the ``snapviz.matrix/1`` document with snapviz compare's stage-aligned
  comparison inside;
* :mod:`.report` — Markdown and HTML rendered from that document;
* :mod:`.outputs` — ranking, comparison and report files at the end of a matrix.

Importing this package imports no torch; :func:`screen_variants` and :func:`technique_names`
import ``collectors.techniques`` (and so torch) when called. The verb is
``collectors.cli.matrix``::

    python -m collectors.matrix --pipeline sdxl --size full --device cuda --jobs 2
"""

from __future__ import annotations

from .document import SCHEMA, build_comparison, matrix_dict, run_json_summary
from .outputs import write_reports
from .ranking import RANKING_RULE, STAGE_GROUPS, measure, rank_results
from .report import matrix_card_html, render_full_markdown, render_matrix_html, render_matrix_markdown, table_cells
from .runner import MatrixOptions, VariantResult, classify, results_from_dir, run_variants, variant_row
from .variants import (
    DEFAULT_BASELINE,
    DEFAULT_VARIANTS,
    MatrixError,
    Variant,
    default_variants,
    dispatch_order,
    parse_variant,
    run_dir_name,
    screen_variants,
    technique_names,
)

__all__ = [
    "write_reports",
    "SCHEMA",
    "build_comparison",
    "matrix_dict",
    "run_json_summary",
    "RANKING_RULE",
    "STAGE_GROUPS",
    "measure",
    "rank_results",
    "matrix_card_html",
    "render_full_markdown",
    "render_matrix_html",
    "render_matrix_markdown",
    "table_cells",
    "MatrixOptions",
    "VariantResult",
    "classify",
    "results_from_dir",
    "run_variants",
    "variant_row",
    "DEFAULT_BASELINE",
    "DEFAULT_VARIANTS",
    "MatrixError",
    "Variant",
    "default_variants",
    "dispatch_order",
    "parse_variant",
    "run_dir_name",
    "screen_variants",
    "technique_names",
]
