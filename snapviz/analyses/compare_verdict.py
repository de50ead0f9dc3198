"""The comparison's verdict: one sentence per run against the base (peak, stages that moved,
where the peak sits), and the relative change every comparison table uses."""

from __future__ import annotations

import pandas as pd

from snapviz.analyses.digest import RunDigest
from snapviz.units import fmt_bytes
from snapviz.vocab import stage_group

UNCHANGED_PEAK = 0.001  # |relative change| below this: "leaves peak allocated unchanged"
UNCHANGED_STAGE = 0.01  # |relative change| below this: "<stage> unchanged"


def change_ratio(delta: float, base: float) -> float | None:
    """``delta / base``, None where either is missing or the base is 0."""
    if base is None or pd.isna(base) or base == 0 or delta is None or pd.isna(delta):
        return None
    return float(delta) / float(base)


def _step_counts(d: RunDigest) -> dict[str, int]:
    names = [n for n in d.stages["name"].tolist() if "/" in n] if len(d.stages) else []
    out: dict[str, int] = {}
    for n in names:
        g = stage_group(n)
        out[g] = out.get(g, 0) + 1
    return out


def _signed_pct(r: float) -> str:
    s = f"{abs(r) * 100:.1f}%"
    return ("−" if r < 0 else "+") + s


def not_comparable_line(base: RunDigest, other: RunDigest) -> str:
    """The verdict for a run that measures another kind of memory than the base."""
    return (
        f"{other.label} measures {other.memory_kind}, the base {base.label} {base.memory_kind}: "
        "different things, not compared (no change or percentage is reported for it)"
    )


def verdict_line(base: RunDigest, other: RunDigest, stages: pd.DataFrame, run: int) -> str:
    """One line: "OTHER lowers peak allocated by 2.31 GiB (−20.6%), mostly in vae_decode; denoise unchanged (±0.3%)".

    ``stages`` is the aligned stage-group table of :func:`compare_runs`; ``run`` is other's index.
    """
    d = other.peak_allocated - base.peak_allocated
    r = change_ratio(d, base.peak_allocated)
    if (r is not None and abs(r) < UNCHANGED_PEAK) or (r is None and d == 0):
        head = f"{other.label} leaves peak allocated unchanged at {fmt_bytes(other.peak_allocated)} (±{abs(r or 0) * 100:.1f}%)"
        direction = 0
    else:
        verb = "lowers" if d < 0 else "raises"
        head = f"{other.label} {verb} peak allocated by {fmt_bytes(abs(d))}" + (
            f" ({_signed_pct(r)})" if r is not None else ""
        )
        direction = -1 if d < 0 else 1
    base_peaks = stages[stages["run"] == 0].set_index("name")["peak_allocated_bytes"]
    mine = stages[stages["run"] == run]
    both, gone, new = [], [], []
    for rec in mine.itertuples(index=False):
        b = base_peaks.get(rec.name)
        has_b, has_o = b is not None and not pd.isna(b), not pd.isna(rec.peak_allocated_bytes)
        if has_b and has_o:
            ratio = None if pd.isna(rec.delta_ratio) else float(rec.delta_ratio)
            both.append((str(rec.name), int(b), int(rec.delta_bytes), ratio))
        elif has_b:
            gone.append(str(rec.name))
        elif has_o:
            new.append(str(rec.name))
    main: str | None = None
    if direction and both:
        name, _, delta, _ = max(both, key=lambda x: x[2] * direction)
        # Comparable moves everywhere (dtype, offload, weights) are not "mostly" anywhere.
        alike = [x for x in both if x[2] * direction >= 0.5 * delta * direction]
        if delta * direction > 0 and len(both) >= 3 and len(alike) == len(both):
            head += ", in every stage"
        elif delta * direction > 0:
            main = name
            head += f", mostly in {main}"
    clauses: list[str] = []
    others = [x for x in sorted(both, key=lambda x: -x[1]) if x[0] != main]  # biggest stages first
    for k, (name, _, delta, ratio) in enumerate(others):
        if len(clauses) == 3:
            break
        if ratio is not None and abs(ratio) < UNCHANGED_STAGE or (ratio is None and delta == 0):
            if k == 0:  # only the biggest other stage is worth an "unchanged"
                clauses.append(f"{name} unchanged (±{abs(ratio or 0) * 100:.1f}%)")
        else:
            pct = f" ({_signed_pct(ratio)})" if ratio is not None else ""
            clauses.append(f"{name} {'+' if delta > 0 else '−'}{fmt_bytes(abs(delta))}{pct}")
    if gone:
        clauses.append("no " + ", ".join(gone[:3]) + (" stage" if len(gone) == 1 else " stages"))
    if new:
        clauses.append(("new stage " if len(new) == 1 else "new stages ") + ", ".join(new[:3]))
    counts = [_step_counts(d) for d in (base, other)]
    for g in counts[0]:
        if g in counts[1] and counts[1][g] != counts[0][g]:
            clauses.append(f"{counts[1][g]} {g} steps instead of {counts[0][g]}")
    if stage_group(other.peak_stage) != stage_group(base.peak_stage):
        clauses.append(f"peak moves from {stage_group(base.peak_stage)} to {stage_group(other.peak_stage)}")
    return head + ("; " + "; ".join(clauses) if clauses else "")
