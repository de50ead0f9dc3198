"""The what-if report: each setting's simulated reserved curve over the recorded one, and the
tables of the terminal and Markdown summaries (the same words: :mod:`snapviz.render.whatif`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from bokeh.models import HoverTool, Legend, LegendItem
from markupsafe import Markup

from snapviz.analyses.decimate import decimate_minmax
from snapviz.analyses.whatif_document import WhatIfDocument
from snapviz.render.html.bokeh_kit import base_figure, bytes_axis, bytes_hover_formatter, make_source
from snapviz.render.html.page import build_page, card, card_open, chrome, table_css, warnings_html, wide_table
from snapviz.render.html.palette import SERIES_COLORS
from snapviz.render.whatif import (
    DETAIL_HEAD,
    card_grid,
    card_line,
    card_title,
    detail_cells,
    fidelity_line,
    outcome,
    recorded_card_rows,
    recorded_line,
    setting_name,
)

if TYPE_CHECKING:
    from snapviz.analyses.whatif import WhatIf

_LINE_COLORS = ("#1f3b73", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")


@dataclass
class WhatIfCurves:
    """Reserved bytes per kept event: the recording's and each setting's on the recorded card."""

    x: np.ndarray  # event index
    recorded: np.ndarray
    series: list[tuple[str, np.ndarray]]  # (setting, reserved; NaN after the simulated program died)


def whatif_curves(w: WhatIf, max_points: int = 4000) -> WhatIfCurves:
    """Decimated curves (every series' extremes kept) from a :class:`~snapviz.analyses.whatif.WhatIf`."""
    n = len(w.recorded_reserved)
    series = []
    for r in w.results:
        if r.scenario.gpu_memory is not None:
            continue
        y = np.full(n, np.nan)
        m = min(n, len(r.sim.reserved))
        y[:m] = r.sim.reserved[:m]
        series.append((setting_name(r.scenario.alloc_conf), y))
    rec = w.recorded_reserved.astype(np.float64)
    keep = decimate_minmax(np.arange(n), rec, *(y for _, y in series), max_points=max_points)
    return WhatIfCurves(np.arange(n)[keep], rec[keep], [(name, y[keep]) for name, y in series])


def _plot(c: WhatIfCurves) -> Any:
    cols: dict[str, Any] = {"x": c.x, "recorded": c.recorded}
    for i, (_, y) in enumerate(c.series):
        cols[f"s{i}"] = y
    src = make_source(cols)
    fig = base_figure(420, x_axis_label="event", y_axis_label="reserved")
    bytes_axis(fig)
    items = [
        LegendItem(
            label="recorded",
            renderers=[
                fig.step("x", "recorded", source=src, mode="after", line_width=3, color=SERIES_COLORS["reserved"])
            ],
        )
    ]
    for i, (name, _) in enumerate(c.series):
        r = fig.step(
            "x",
            f"s{i}",
            source=src,
            mode="after",
            line_width=1.5,
            color=_LINE_COLORS[i % len(_LINE_COLORS)],
            line_dash="solid" if i == 0 else "dashed",
        )
        items.append(LegendItem(label=name, renderers=[r]))
    legend = Legend(items=items, click_policy="hide", location="top_left")
    fig.add_layout(legend, "right")
    fig.add_tools(
        HoverTool(
            tooltips=[("event", "@x"), ("recorded", "@recorded{custom}")],
            formatters={"@recorded": bytes_hover_formatter()},
            mode="vline",
        )
    )
    return fig


def whatif_blocks(w: WhatIf, doc: WhatIfDocument, max_points: int = 4000) -> list[Any]:
    """The what-if's cards (the reserved curves, the recorded-card table, the card grid): the
    body of the what-if page and the section ``compare --whatif -o`` puts on the compare page."""
    rows = recorded_card_rows(doc)
    detail = [[*detail_cells(s), outcome(s)] for s in rows]
    head, grid = card_grid(doc)
    blocks: list[Any] = [
        card_open(
            "Reserved memory, simulated over recorded",
            "Each setting on the recorded card; "
            "click a legend entry to hide it. A line that stops: that run ran out of memory.",
        ),
        _plot(whatif_curves(w, max_points)),
        "</section>",
        card(f"On {card_title(doc)}", wide_table([*DETAIL_HEAD, "result"], detail, "sv-whatif-table")),
    ]
    if len(head) > 2:
        blocks.append(
            card(
                "Reserved peak by card",
                wide_table(head, grid, "sv-whatif-cards"),
                "OOM: the run would have died on that card.",
            )
        )
    return blocks


def whatif_hero(doc: WhatIfDocument, kicker: str = "snapviz whatif") -> Markup:
    """The page's first lines: the run, whether the simulator reproduced it, its recorded figures."""
    return chrome(
        "hero",
        kicker=kicker,
        title=f"{doc.source} (cuda:{int(doc.device)})",
        verdict=fidelity_line(doc),
        lines=[recorded_line(doc), *([c] if (c := card_line(doc)) else [])],
    )


def render_whatif_html(w: WhatIf, doc: WhatIfDocument, max_points: int = 4000, kicker: str = "snapviz whatif") -> str:
    """The page: hero lines, the reserved curves, the recorded-card table and the card grid."""
    blocks: list[Any] = [table_css(), whatif_hero(doc, kicker), warnings_html(doc.notes, "Notes")]
    blocks.extend(whatif_blocks(w, doc, max_points))
    return build_page(f"{kicker}: {doc.source}", blocks)
