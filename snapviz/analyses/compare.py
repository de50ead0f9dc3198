"""Compare runs: stage-aligned peaks, steps, sites, attention, categories and a verdict.

Runs are aligned by *stage label*, never by wall time: ``denoise/3`` of one run lines up
with ``denoise/3`` of another however long each took. Every run is first reduced to a
:class:`RunDigest` (small tables plus a decimated timeline), so comparing ten runs holds
one full analysis in memory at a time. Everything here returns DataFrames, or the typed
``snapviz.compare/1`` document (:mod:`snapviz.analyses.compare_document`); renderers only render.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.compare_document import (
    CompareAttention,
    CompareCategory,
    CompareDocument,
    CompareRun,
    CompareSite,
    CompareStage,
    CompareStep,
    FailOver,
    RunPeak,
)
from snapviz.analyses.compare_sites import changed_sites, compare_sites
from snapviz.analyses.compare_verdict import change_ratio, not_comparable_line, verdict_line
from snapviz.analyses.digest import RunDigest, comparable
from snapviz.analyses.document import ABSENT, to_json
from snapviz.analyses.whatif_document import WhatIfTwins
from snapviz.safe_text import printable, short_repr
from snapviz.units import fmt_bytes
from snapviz.vocab import COMPARE_SCHEMA, stage_group


@dataclass(frozen=True)
class Comparison:
    """Base (run 0) against every other run. Long tables carry ``run`` (0 = base) and ``label``.

    ``document()`` is the typed ``snapviz.compare/1`` document, ``summary()`` its JSON form (what
    the CLI writes with ``compare --json``).
    """

    runs: pd.DataFrame
    stages: pd.DataFrame  # per stage group and run
    steps: pd.DataFrame  # per step label (``denoise/3``) and run
    sites: pd.DataFrame  # per allocation site and run, with status vs base
    attention: pd.DataFrame  # per run
    categories: pd.DataFrame  # per category and run (live bytes at each run's own peak)
    timeline: pd.DataFrame  # run, x (stage-normalised), allocated, reserved, name
    slots: list[str]  # stage labels in x order: slot k spans [k, k+1)
    verdict: list[str]  # one line per other run
    digests: list[RunDigest]

    @property
    def labels(self) -> list[str]:
        return [d.label for d in self.digests]

    def __repr__(self) -> str:
        shown = self.digests[:6]
        peaks = "; ".join(f"{printable(d.label, 60)} {fmt_bytes(d.peak_allocated)}" for d in shown)
        more = f" and {len(self.digests) - len(shown)} more" if len(self.digests) > len(shown) else ""
        return short_repr(
            "Comparison",
            self.labels[0] if self.labels else "",
            f"base and {len(self.digests) - 1} other run(s)",
            f"peaks {peaks}{more}",
            "summary() for the full document",
        )

    def document(self, fail_over: float | None = None) -> CompareDocument:
        """The typed ``snapviz.compare/1`` document (:func:`build_compare`): what the renderers take."""
        return build_compare(self, fail_over=fail_over)

    def summary(self, fail_over: float | None = None) -> dict[str, Any]:
        """The ``snapviz.compare/1`` document as JSON (what ``compare --json`` writes)."""
        return typing.cast(dict[str, Any], to_json(self.document(fail_over)))


# ---------------------------------------------------------------- one run -> digest


def merge_orders(orders: Sequence[Sequence[str]]) -> list[str]:
    """One order for every label: the base's, with labels only later runs have inserted
    right after the label that precedes them in that run."""
    out: list[str] = []
    for order in orders:
        prev: str | None = None
        for name in order:
            if name not in out:
                out.insert(out.index(prev) + 1 if prev is not None else 0, name)
            prev = name
    return out


def _aligned(
    keys: list[str], per_run: list[dict[str, tuple[int, int]]], labels: list[str], key_col: str
) -> pd.DataFrame:
    """Long table key x run with peaks and deltas vs run 0 (missing: NA)."""
    rows = []
    for key in keys:
        base = per_run[0].get(key)
        for r, values in enumerate(per_run):
            v = values.get(key)
            a = v[0] if v else None
            res = v[1] if v else None
            d = (v[0] - base[0]) if (v and base) else None
            dr = (v[1] - base[1]) if (v and base) else None
            rows.append(
                {
                    key_col: key,
                    "run": r,
                    "label": labels[r],
                    "peak_allocated_bytes": a,
                    "peak_reserved_bytes": res,
                    "delta_bytes": d,
                    "delta_ratio": change_ratio(d, base[0]) if (d is not None and base) else None,
                    "reserved_delta_bytes": dr,
                }
            )
    df = pd.DataFrame(
        rows,
        columns=[
            key_col,
            "run",
            "label",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "delta_bytes",
            "delta_ratio",
            "reserved_delta_bytes",
        ],
    )
    for c in ("peak_allocated_bytes", "peak_reserved_bytes", "delta_bytes", "reserved_delta_bytes"):
        df[c] = df[c].astype("Int64")
    df["delta_ratio"] = df["delta_ratio"].astype("Float64")
    return df


def compare_runs(digests: Sequence[RunDigest]) -> Comparison:
    """Compare every run with the first (the base). Needs at least two digests."""
    if len(digests) < 2:
        raise ValueError("compare needs at least two runs")
    labels = [d.label for d in digests]
    base = digests[0]
    slots = merge_orders([d.stages["name"].tolist() for d in digests])
    groups = merge_orders([list(dict.fromkeys(d.stages["group"].tolist())) for d in digests])

    runs = pd.DataFrame(
        [
            {
                "run": i,
                "label": d.label,
                "source": d.source,
                "peak_allocated_bytes": d.peak_allocated,
                "peak_reserved_bytes": d.peak_reserved,
                "peak_stage": d.peak_stage,
                "delta_bytes": d.peak_allocated - base.peak_allocated,
                "delta_ratio": change_ratio(d.peak_allocated - base.peak_allocated, base.peak_allocated),
                "reserved_delta_bytes": d.peak_reserved - base.peak_reserved,
                "reserved_delta_ratio": change_ratio(d.peak_reserved - base.peak_reserved, base.peak_reserved),
                "events": d.events,
                "truncated": d.truncated,
                "stage_source": d.stage_source,
            }
            for i, d in enumerate(digests)
        ]
    )

    group_peaks: list[dict[str, tuple[int, int]]] = []
    step_peaks: list[dict[str, tuple[int, int]]] = []
    for d in digests:
        st = d.stages
        g = st.groupby("group", sort=False)[["peak_allocated_bytes", "peak_reserved_bytes"]].max() if len(st) else None
        group_peaks.append(
            {k: (int(v.peak_allocated_bytes), int(v.peak_reserved_bytes)) for k, v in g.iterrows()}
            if g is not None
            else {}
        )
        steps = st[st["name"].str.contains("/", regex=False)] if len(st) else st
        step_peaks.append(
            {
                str(r.name): (int(r.peak_allocated_bytes), int(r.peak_reserved_bytes))
                for r in steps.itertuples(index=False)
            }
        )
    stages = _aligned(groups, group_peaks, labels, "name")
    step_names = [s for s in slots if "/" in s]
    steps = _aligned(step_names, step_peaks, labels, "name")
    steps.insert(1, "group", [stage_group(s) for s in steps["name"]])
    steps.insert(2, "step", [s.split("/", 1)[1] for s in steps["name"]])

    att = pd.DataFrame(
        [
            {
                "run": i,
                "label": d.label,
                "count": int(d.attention.get("count") or 0),
                "peak_live_bytes": int(d.attention.get("peak_live_bytes") or 0),
                "total_bytes": int(d.attention.get("total_bytes") or 0),
                "largest_bytes": int((d.attention.get("largest") or {}).get("bytes") or 0),
                "largest_shape": (d.attention.get("largest") or {}).get("shape"),
                "implementation": d.attention.get("implementation"),
            }
            for i, d in enumerate(digests)
        ]
    )
    for c in ("count", "peak_live_bytes", "total_bytes", "largest_bytes"):
        att[f"delta_{c}"] = att[c] - att[c].iat[0]

    cat_names = list(dict.fromkeys(c for d in digests for c in d.categories["category"].tolist()))
    cat_rows = []
    for c in cat_names:
        b = _cat_bytes(base, c)
        for i, d in enumerate(digests):
            v = _cat_bytes(d, c)
            cat_rows.append(
                {
                    "category": c,
                    "run": i,
                    "label": d.label,
                    "bytes": v,
                    "delta_bytes": v - b,
                    "delta_ratio": change_ratio(v - b, b),
                }
            )
    categories = pd.DataFrame(cat_rows, columns=["category", "run", "label", "bytes", "delta_bytes", "delta_ratio"])

    slot_of = {s: k for k, s in enumerate(slots)}
    tl_frames = []
    for i, d in enumerate(digests):
        tl = d.timeline
        if len(tl):
            x = tl["name"].map(slot_of).to_numpy(np.float64) + tl["pos"].to_numpy(np.float64)
            tl_frames.append(
                pd.DataFrame(
                    {
                        "run": i,
                        "label": d.label,
                        "x": x,
                        "allocated": tl["allocated"].to_numpy(),
                        "reserved": tl["reserved"].to_numpy(),
                        "name": tl["name"].to_numpy(),
                    }
                )
            )
    timeline = (
        pd.concat(tl_frames, ignore_index=True)
        if tl_frames
        else pd.DataFrame(columns=["run", "label", "x", "allocated", "reserved", "name"])
    )

    # A run that measures another kind of memory (a CPU-only trace against a CUDA snapshot) is shown
    # beside the base, but no change is computed against it: no percentage, no "lowers by".
    apart = [i for i, d in enumerate(digests) if not comparable(base, d)]
    if apart:
        for df, cols in (
            (runs, ["delta_ratio", "reserved_delta_ratio"]),
            (stages, ["delta_ratio"]),
            (steps, ["delta_ratio"]),
            (categories, ["delta_ratio"]),
        ):
            df[cols] = df[cols].astype(object)
            df.loc[df["run"].isin(apart), cols] = None
    verdict = [
        verdict_line(base, d, stages, i) if i not in apart else not_comparable_line(base, d)
        for i, d in enumerate(digests)
        if i > 0
    ]
    return Comparison(
        runs=runs,
        stages=stages,
        steps=steps,
        sites=compare_sites(digests),
        attention=att,
        categories=categories,
        timeline=timeline,
        slots=slots,
        verdict=verdict,
        digests=list(digests),
    )


def _cat_bytes(d: RunDigest, category: str) -> int:
    c = d.categories
    v = c.loc[c["category"] == category, "bytes"]
    return int(v.sum()) if len(v) else 0


# ---------------------------------------------------------------- gate and document


def over_limit(cmp: Comparison, pct: float) -> list[str]:
    """``--fail-over PCT``: one line per other run whose peak exceeds the base by more than PCT."""
    base = cmp.runs.iloc[0]
    out = []
    for r in cmp.runs.iloc[1:].itertuples(index=False):
        limit = base.peak_allocated_bytes * (1 + pct / 100.0)
        if r.peak_allocated_bytes > limit:
            ratio = r.delta_ratio
            out.append(
                f"FAIL {r.label} peak allocated {fmt_bytes(r.peak_allocated_bytes)} exceeds base {base.label} "
                f"{fmt_bytes(base.peak_allocated_bytes)} by {ratio * 100 if ratio is not None else float('inf'):+.1f}% "
                f"(allowed +{pct:g}%)"
            )
    return out


def _missing(v: Any) -> bool:
    return v is None or (not isinstance(v, str) and bool(pd.isna(v)))


def _ints(values: Iterable[Any]) -> list[int | None]:
    """A column of byte counts or counts as JSON numbers (pandas' missing values: None)."""
    return [None if _missing(v) else int(v) for v in values]


def _counts(values: Iterable[Any]) -> list[int]:
    """A column of byte counts or counts that every run has (0 where a run has none)."""
    return [int(v) for v in values]


def _ratios(values: Iterable[Any]) -> list[float | None]:
    """A column of ratios as JSON numbers (missing: None)."""
    return [None if _missing(v) else float(v) for v in values]


def _per_key(df: pd.DataFrame, key: str) -> list[tuple[str, pd.DataFrame]]:
    """Each value of ``key`` in order of first appearance, with its rows in run order."""
    return [(k, df[df[key] == k].sort_values("run")) for k in dict.fromkeys(df[key].tolist())]


def _stage_row(name: str, part: pd.DataFrame) -> CompareStage:
    return CompareStage(
        name=name,
        peak_allocated_bytes=_ints(part["peak_allocated_bytes"]),
        peak_reserved_bytes=_ints(part["peak_reserved_bytes"]),
        delta_bytes=_ints(part["delta_bytes"]),
        delta_ratio=_ratios(part["delta_ratio"]),
        reserved_delta_bytes=_ints(part["reserved_delta_bytes"]),
    )


def _step_row(name: str, part: pd.DataFrame) -> CompareStep:
    stage, step = name.split("/", 1)
    return CompareStep(**vars(_stage_row(name, part)), stage=stage, step=step)


def _site_row(site: str, part: pd.DataFrame) -> CompareSite:
    return CompareSite(
        site=site,
        status=part["status"].tolist(),
        allocs=_counts(part["allocs"]),
        total_bytes=_counts(part["total_bytes"]),
        peak_live_bytes=_counts(part["peak_live_bytes"]),
        delta_total_bytes=_counts(part["delta_total_bytes"]),
        delta_peak_live_bytes=_counts(part["delta_peak_live_bytes"]),
    )


def build_compare(
    cmp: Comparison, fail_over: float | None = None, max_sites: int = 25, whatif: WhatIfTwins | None = None
) -> CompareDocument:
    """The ``snapviz.compare/1`` document of ``cmp`` (docs/design.md; per-run arrays run base first):
    with the ``--fail-over`` gate's verdict when ``fail_over`` is given, and ``whatif`` (BASE
    beside its simulated twins, ``snapviz.analyses.whatif.twin_document``) when given."""
    runs = [
        CompareRun(
            label=r.label,
            source=r.source,
            peak=RunPeak(
                allocated_bytes=int(r.peak_allocated_bytes),
                reserved_bytes=int(r.peak_reserved_bytes),
                stage=r.peak_stage,
            ),
            delta_bytes=int(r.delta_bytes),
            delta_ratio=_ratios([r.delta_ratio])[0],
            reserved_delta_bytes=int(r.reserved_delta_bytes),
            events=int(r.events),
            truncated=bool(r.truncated),
            stage_source=r.stage_source,
            memory_kind=cmp.digests[i].memory_kind,
            verdict=cmp.verdict[i - 1] if i > 0 else None,
            warnings=cmp.digests[i].warnings,
        )
        for i, r in enumerate(cmp.runs.itertuples(index=False))
    ]
    att = cmp.attention
    failures = over_limit(cmp, fail_over) if fail_over is not None else []
    return CompareDocument(
        schema=COMPARE_SCHEMA,
        base=cmp.labels[0],
        runs=runs,
        stages=[_stage_row(k, part) for k, part in _per_key(cmp.stages, "name")],
        steps=[_step_row(k, part) for k, part in _per_key(cmp.steps, "name")],
        sites=[
            _site_row(k, cmp.sites[cmp.sites["site"] == k].sort_values("run"))
            for k in changed_sites(cmp.sites, max_sites)
        ],
        attention=CompareAttention(
            count=_counts(att["count"]),
            peak_live_bytes=_counts(att["peak_live_bytes"]),
            total_bytes=_counts(att["total_bytes"]),
            largest_bytes=_counts(att["largest_bytes"]),
            delta_count=_counts(att["delta_count"]),
            delta_peak_live_bytes=_counts(att["delta_peak_live_bytes"]),
            delta_largest_bytes=_counts(att["delta_largest_bytes"]),
        ),
        categories=[
            CompareCategory(name=k, bytes=_counts(part["bytes"]), delta_bytes=_counts(part["delta_bytes"]))
            for k, part in _per_key(cmp.categories, "category")
        ],
        verdict=list(cmp.verdict),
        fail_over=(
            FailOver(percent=fail_over, passed=not failures, failures=failures) if fail_over is not None else ABSENT
        ),
        whatif=whatif if whatif else ABSENT,
    )
