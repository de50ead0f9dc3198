"""The view-model of the comparison page: :func:`compare_report_data` turns a
:class:`~snapviz.analyses.compare.Comparison` and its typed ``snapviz.compare/1`` document
(:class:`~snapviz.analyses.compare_document.CompareDocument`) into a typed
:class:`CompareReport` of plain columns (tests assert on it); :mod:`snapviz.render.html.compare`
only draws it.

The timeline's x axis is *stage-normalised*: stage label k (``load``, ``denoise/0``, …)
owns the slot [k, k+1) in every run, and an event's position inside the slot is its rank
among that label's events, so ``denoise/3`` lines up across runs whatever its wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from snapviz.analyses.compare_document import CompareDocument, CompareStep, FailOver, listed
from snapviz.analyses.compare_sites import changed_sites
from snapviz.analyses.document import Absent
from snapviz.render.fmt import fmt_compare_kind
from snapviz.render.html.palette import stage_palette
from snapviz.units import fmt_bytes, fmt_delta, fmt_ratio_pct
from snapviz.vocab import stage_group

if TYPE_CHECKING:
    from snapviz.analyses.compare import Comparison

# Run colors: the base is dark, others follow Tableau 10 (stage colors stay in the bands).
RUN_COLORS = (
    "#1d2330",
    "#d62728",
    "#1f77b4",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)


@dataclass
class SlotBands:
    """Stage slots as bands: slot k spans [k, k+1) on the stage-normalised x axis."""

    left: np.ndarray
    right: np.ndarray
    name: list[str]
    group: list[str]
    color: list[str]
    alpha: list[float]


@dataclass
class RunTimeline:
    label: str
    color: str
    x: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    stage: list[str]


@dataclass
class CompareBars:
    """Peak allocated per (stage, run), grouped by stage."""

    factors: list[tuple[str, str]]
    peak_allocated: np.ndarray
    peak_reserved: np.ndarray
    color: list[str]
    delta: list[str]


@dataclass
class RunRow:
    label: str
    color: str
    source: str
    peak: str
    reserved: str
    stage: str
    delta: str
    reserved_delta: str
    events: int
    stage_source: str


@dataclass
class TableRow:
    """A row of a text table: its name (stage or site) and one formatted cell per run."""

    name: str
    cells: list[str]
    is_step: bool = False


@dataclass
class CompareReport:
    title: str
    labels: list[str]
    verdict: list[str]
    runs: list[RunRow]
    slots: list[str]
    bands: SlotBands
    ticks: list[float]
    tick_labels: dict[float, str]
    timelines: list[RunTimeline]
    y_top: float
    bars: CompareBars
    stage_rows: list[TableRow]
    site_rows: list[TableRow]
    warnings: list[str]
    fail_over: FailOver | None
    kind: str = "GPU memory"  # what the runs measured (fmt_compare_kind)


def run_color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


def _slot_ticks(slots: list[str]) -> tuple[list[float], dict[float, str]]:
    """Tick at every slot centre when few; else only where a stage group starts."""
    ticks: list[float] = []
    labels: dict[float, str] = {}
    prev = None
    for k, s in enumerate(slots):
        g = stage_group(s)
        if len(slots) <= 24 or g != prev:
            ticks.append(k + 0.5)
            labels[k + 0.5] = s if len(slots) <= 24 else g
        prev = g
    return ticks, labels


def compare_report_data(cmp: Comparison, doc: CompareDocument) -> CompareReport:
    """Everything the comparison page shows, as plain lists and arrays."""
    labels = cmp.labels
    slots = list(cmp.slots)
    palette = stage_palette(slots)
    groups = [stage_group(s) for s in slots]
    shade = [0.16 if k % 2 == 0 else 0.08 for k in range(len(slots))]  # neighbours of one group stay apart
    bands = SlotBands(
        left=np.arange(len(slots), dtype=np.float64),
        right=np.arange(1, len(slots) + 1, dtype=np.float64),
        name=slots,
        group=groups,
        color=[palette[s] for s in slots],
        alpha=shade,
    )
    timelines = []
    tl = cmp.timeline
    for i, lab in enumerate(labels):
        part = tl[tl["run"] == i]
        x = part["x"].to_numpy(np.float64)
        cols = {
            "allocated": part["allocated"].to_numpy(np.float64),
            "reserved": part["reserved"].to_numpy(np.float64),
            "stage": np.asarray(part["name"].astype(str).tolist(), dtype=object),
        }
        # Break the line over stage slots this run does not have (fewer steps, no refiner…).
        gap = np.flatnonzero(np.floor(x[1:]) - np.floor(x[:-1]) > 1) + 1 if len(x) else np.empty(0, np.int64)
        if len(gap):
            x = np.insert(x, gap, np.floor(x[gap - 1]) + 1)
            cols = {k: np.insert(v, gap, "" if k == "stage" else np.nan) for k, v in cols.items()}
        timelines.append(
            RunTimeline(
                label=str(lab),
                color=run_color(i),
                x=x,
                allocated=cols["allocated"],
                reserved=cols["reserved"],
                stage=[str(v) for v in cols["stage"]],
            )
        )
    st = cmp.stages
    factors: list[tuple[str, str]] = []
    peak: list[float] = []
    reserved: list[float] = []
    colors: list[str] = []
    delta: list[str] = []
    for name in dict.fromkeys(st["name"].tolist()):
        for r in st[st["name"] == name].sort_values("run").itertuples(index=False):
            factors.append((str(name), str(r.label)))
            peak.append(float(r.peak_allocated_bytes) if not _na(r.peak_allocated_bytes) else np.nan)
            reserved.append(float(r.peak_reserved_bytes) if not _na(r.peak_reserved_bytes) else np.nan)
            delta.append(
                "" if r.run == 0 or _na(r.delta_bytes) else fmt_delta(int(r.delta_bytes)) + _pct(r.delta_ratio)
            )
            colors.append(run_color(int(r.run)))
    bars = CompareBars(
        factors=factors,
        peak_allocated=np.array(peak, np.float64),
        peak_reserved=np.array(reserved, np.float64),
        color=colors,
        delta=delta,
    )
    runs = []
    for i, r in enumerate(doc.runs):
        p = r.peak
        runs.append(
            RunRow(
                label=r.label,
                color=run_color(i),
                source=r.source,
                peak=fmt_bytes(p.allocated_bytes),
                reserved=fmt_bytes(p.reserved_bytes),
                stage=p.stage,
                delta="base" if i == 0 else fmt_delta(r.delta_bytes) + _pct(r.delta_ratio),
                reserved_delta="" if i == 0 else fmt_delta(r.reserved_delta_bytes),
                events=r.events,
                stage_source=r.stage_source,
            )
        )
    stage_rows = []
    for s in [*listed(doc.stages), *listed(doc.steps)]:
        cells = []
        for i in range(len(labels)):
            v = s.peak_allocated_bytes[i]
            if v is None:
                cells.append("—")
            elif i == 0:
                cells.append(fmt_bytes(v))
            else:
                d = s.delta_bytes[i]
                cells.append(
                    f"{fmt_bytes(v)} ({'=' if d == 0 else fmt_delta(d) + _pct(s.delta_ratio[i])})"
                    if d is not None
                    else fmt_bytes(v)
                )
        stage_rows.append(TableRow(name=s.name, cells=cells, is_step=isinstance(s, CompareStep)))
    site_rows = []
    for site in changed_sites(cmp.sites, 40):
        part = cmp.sites[cmp.sites["site"] == site].sort_values("run")
        cells = []
        for r in part.itertuples(index=False):
            if r.run == 0:
                cells.append(f"{fmt_bytes(r.peak_live_bytes)} / {fmt_bytes(r.total_bytes)}")
            elif r.status in ("same", "absent", "n/a"):
                cells.append(r.status)
            else:
                cells.append(f"{r.status} {fmt_delta(r.delta_peak_live_bytes)} / {fmt_delta(r.delta_total_bytes)}")
        site_rows.append(TableRow(name=str(site), cells=cells))
    warnings = [f"{r.label}: {w}" for r in doc.runs for w in r.warnings]
    ticks, tick_labels = _slot_ticks(slots)
    y_top = max([float(np.nanmax(t.reserved)) for t in timelines if len(t.reserved)] + [1.0])
    return CompareReport(
        title=f"{labels[0]} vs " + ", ".join(labels[1:]),
        labels=[str(x) for x in labels],
        verdict=list(listed(doc.verdict)),
        runs=runs,
        slots=slots,
        bands=bands,
        ticks=ticks,
        tick_labels=tick_labels,
        timelines=timelines,
        y_top=y_top,
        bars=bars,
        stage_rows=stage_rows,
        site_rows=site_rows,
        warnings=warnings,
        fail_over=None if isinstance(doc.fail_over, Absent) else doc.fail_over,
        kind=fmt_compare_kind(doc),
    )


def _na(v: Any) -> bool:
    try:
        return v is None or bool(np.isnan(v))
    except TypeError:
        return v is None or str(v) == "<NA>"


def _pct(r: Any) -> str:
    """:func:`~snapviz.units.fmt_ratio_pct`, also for pandas' missing values (``pd.NA``)."""
    return "" if _na(r) else fmt_ratio_pct(float(r))
