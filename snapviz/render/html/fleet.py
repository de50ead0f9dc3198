"""The ``ranks`` and ``history`` pages: self-contained HTML (Bokeh INLINE, offline) drawn from
the ``snapviz.ranks/1`` and ``snapviz.history/1`` documents (typed:
:mod:`snapviz.analyses.fleet_document`) with the page and Bokeh kits; the pages compute nothing
the documents do not hold."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
from bokeh.models import ColorBar, FactorRange, HoverTool, LinearColorMapper
from bokeh.palettes import Viridis256
from markupsafe import Markup

from snapviz import __version__
from snapviz.analyses.document import from_json, to_json
from snapviz.analyses.fleet_document import HistoryDocument, RanksDocument
from snapviz.render.fleet_md import HISTORY_COLUMNS, RANK_COLUMNS, history_rows, rank_cells, who
from snapviz.render.html.bokeh_kit import base_figure, bytes_axis, bytes_tick_formatter, make_source
from snapviz.render.html.page import (
    build_page,
    card,
    card_open,
    chrome,
    html_table,
    table_css,
    warnings_html,
    wide_table,
)
from snapviz.render.html.palette import stage_palette
from snapviz.safe_text import printable
from snapviz.units import fmt_bytes, fmt_delta

ROW_PX = 14  # heatmap pixels per rank
MAX_HEATMAP_PX = 4000


D = TypeVar("D", RanksDocument, HistoryDocument)


def visible(doc: D) -> D:
    """``doc`` with every string shown as one printable line (controls from file names and
    run.json escaped as ``\x01``): the page prints what the terminal and Markdown print."""
    return from_json(_visible(to_json(doc)), type(doc))


def _visible(v: Any) -> Any:
    if isinstance(v, str):
        return printable(v, None)
    if isinstance(v, dict):
        return {k: _visible(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_visible(x) for x in v]
    return v


def _hero(kicker: str, title: str, verdict: list[str]) -> str:
    head = verdict[0] if verdict else ""
    return chrome("hero", kicker=kicker, title=title, verdict=head, lines=list(verdict[1:]))


def row_names(doc: RanksDocument) -> list[str]:
    """One unique heatmap row name per input: ``rank R`` (``it N · rank R`` with several iterations)."""
    several = len(doc.iterations) > 1
    names: list[str] = []
    for r in doc.ranks:
        n = who(r)
        if several and r.iteration is not None:
            n = f"it {r.iteration} · {n}"
        if r.oom.count:  # the rows of ranks that ran out of memory say so
            n += " · OOM"
        while n in names:
            n += "′"
        names.append(n)
    return names


def heatmap_columns(doc: RanksDocument) -> dict[str, Any]:
    """The heatmap's cells: one per (rank, stage) that the rank has, peak allocated bytes."""
    names = row_names(doc)
    xs, ys, vals, texts = [], [], [], []
    for name, r in zip(names, doc.ranks, strict=True):
        for stage, v in zip(doc.stages, r.stage_peak_allocated_bytes, strict=True):
            if v is None:
                continue
            xs.append(stage)
            ys.append(name)
            vals.append(float(v))
            texts.append(fmt_bytes(v))
    return {"stage": xs, "rank": ys, "bytes": np.asarray(vals, np.float64), "text": texts}


def _heatmap(doc: RanksDocument) -> Any:
    cols = heatmap_columns(doc)
    names = row_names(doc)
    vals = cols["bytes"]
    lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (0.0, 1.0)
    mapper = LinearColorMapper(palette=Viridis256, low=lo, high=max(hi, lo + 1))
    height = min(MAX_HEATMAP_PX, 120 + ROW_PX * len(names))
    fig = base_figure(height, x_range=FactorRange(*doc.stages), y_range=FactorRange(*reversed(names)))
    fig.rect(
        "stage",
        "rank",
        1,
        1,
        source=make_source(cols),
        fill_color={"field": "bytes", "transform": mapper},
        line_color=None,
    )
    fig.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("stage", "@stage"), ("peak allocated", "@text")]))
    fig.add_layout(ColorBar(color_mapper=mapper, formatter=bytes_tick_formatter(), width=10), "right")
    fig.xaxis.major_label_orientation = 0.8
    fig.grid.grid_line_color = None
    return fig


def _details(doc: RanksDocument) -> str:
    """One ``<details>`` per rank: the table row, and one click away its stage peaks and notes."""
    out = []
    for r in doc.ranks:
        cells = rank_cells(r)
        stages = [
            [s, fmt_bytes(v)] for s, v in zip(doc.stages, r.stage_peak_allocated_bytes, strict=True) if v is not None
        ]
        body = html_table(["stage", "peak allocated"], stages, "") if stages else ""
        meta = [
            ("source", r.source),
            ("iteration", "—" if r.iteration is None else str(r.iteration)),
            ("rank from", r.rank_from),
            ("world size", "—" if r.world_size is None else str(r.world_size)),
        ]
        if r.oom.first_time_us is not None:
            meta.append(("first OOM at (Unix µs)", str(r.oom.first_time_us)))
        if r.allocator is not None:
            meta.append(("run.json max_memory_allocated", fmt_bytes(r.allocator.max_memory_allocated)))
        out.append(chrome("rank_details", cells=[c for c in cells if c], meta=meta, notes=list(r.notes), body=body))
    return Markup("").join(out)


def render_ranks_html(doc: RanksDocument) -> str:
    """The ranks page of a ``snapviz.ranks/1`` document."""
    doc = visible(doc)
    blocks: list[Any] = [
        table_css(),
        _hero("snapviz · ranks of a distributed job", f"{doc.inputs} inputs", doc.verdict),
    ]
    for v in doc.iterations:
        wm = [s for s in v.worst_vs_median if s.delta_bytes != 0]
        if v.max is None or v.median is None or not wm:
            continue
        it = "" if v.iteration is None else f" (iteration {v.iteration})"
        rows = [[s.stage, fmt_bytes(s.worst_bytes), fmt_bytes(s.median_bytes), _delta(s.delta_bytes)] for s in wm]
        blocks.append(
            card(
                f"{v.max.who} vs median {v.median.who}, stage by stage{it}",
                wide_table(["stage", "worst", "median", "Δ"], rows, ""),
            )
        )
    if doc.stages and any(r.status == "ok" for r in doc.ranks):
        blocks += [
            card_open(
                "Peak allocated, rank × stage",
                "Each cell: the rank's peak allocated within the stage (all steps of it); hover for the figure.",
                "sv-heatmap-card",
            ),
            _heatmap(doc),
            "</section>",
        ]
    blocks.append(
        card(
            "Ranks",
            chrome("note", text=" · ".join(RANK_COLUMNS), kind="sv-hint") + _details(doc),
            "Click a rank for its stage peaks and where its figures come from.",
            "sv-ranks",
        )
    )
    failed = [f"{r.source}: {r.reason}" for r in doc.ranks if r.status != "ok"]
    blocks.append(warnings_html(failed[:50], f"⚠ {len(failed)} input(s) not analysed" if failed else None))
    blocks.append(chrome("footer", text=f"Generated by snapviz {__version__} ranks — self-contained, works offline."))
    return build_page(f"snapviz ranks: {doc.inputs} inputs", blocks)


def _delta(v: int | None) -> str:
    """A stage's difference in the worst-vs-median table (None: one of the two ranks lacks the stage)."""
    return "—" if v is None else fmt_delta(v)


def _trend(doc: HistoryDocument) -> Any:
    labels = [r.label for r in doc.runs]
    uniq = []
    for lab in labels:
        while lab in uniq:
            lab += "′"
        uniq.append(lab)
    fig = base_figure(360, x_range=FactorRange(*uniq))
    colors = stage_palette(doc.stage_names)
    for k, stage in enumerate(doc.stage_names):
        xs = [uniq[i] for i, r in enumerate(doc.runs) if r.stage_peak_allocated_bytes[k] is not None]
        ys = [y for r in doc.runs if (y := r.stage_peak_allocated_bytes[k]) is not None]
        if not xs:
            continue
        src = make_source(
            {
                "run": xs,
                "bytes": np.asarray(ys, np.float64),
                "text": [fmt_bytes(y) for y in ys],
                "stage": [stage] * len(xs),
            }
        )
        color = colors[stage]
        fig.line("run", "bytes", source=src, color=color, legend_label=stage, line_width=2)
        fig.scatter("run", "bytes", source=src, color=color, size=6)
    fig.add_tools(HoverTool(tooltips=[("run", "@run"), ("stage", "@stage"), ("peak allocated", "@text")]))
    bytes_axis(fig)
    fig.xaxis.major_label_orientation = 0.8
    fig.legend.click_policy = "hide"
    return fig


def render_history_html(doc: HistoryDocument) -> str:
    """The history page of a ``snapviz.history/1`` document."""
    doc = visible(doc)
    runs = [
        [
            r.label,
            "" if r.order_key is None else str(r.order_key),
            fmt_bytes(r.peak.allocated_bytes) if r.status == "ok" else "failed",
            str(r.peak.stage or r.reason or ""),
        ]
        for r in doc.runs
    ]
    blocks: list[Any] = [
        table_css(),
        _hero("snapviz · history of a pipeline", f"{len(doc.runs)} runs ordered by {doc.order_by}", doc.verdict),
    ]
    if any(r.status == "ok" for r in doc.runs):
        blocks += [
            card_open("Peak allocated per stage, run by run", "Click a legend entry to hide a stage.", "sv-trend-card"),
            _trend(doc),
            "</section>",
        ]
    blocks.append(
        card(
            "Each stage's trend",
            wide_table(HISTORY_COLUMNS, history_rows(doc), "sv-stage-table"),
            f"A jump: the largest rise from one run to the next, above {doc.jump_percent:g}%.",
            "sv-stages",
        )
    )
    blocks.append(
        card(
            "Runs",
            wide_table(["run", doc.order_by, "peak allocated", "stage at peak"], runs, "sv-run-table"),
            "In history order.",
            "sv-runs",
        )
    )
    blocks.append(chrome("footer", text=f"Generated by snapviz {__version__} history — self-contained, works offline."))
    return build_page(f"snapviz history: {len(doc.runs)} runs", blocks)
