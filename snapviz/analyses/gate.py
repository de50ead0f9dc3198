"""Memory gates for CI: parse limits, evaluate them against a summary, one result per limit.

Pure: the input is a typed ``snapviz.summary/1`` document (:class:`~snapviz.analyses.document.Summary`,
so snapshots, traces and documents read back from JSON gate alike), the
output a list of :class:`GateResult` (or, with the notes that qualify them, a
:class:`CheckResult`). The CLI prints them and maps failures to exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapviz.analyses.document import Summary
from snapviz.analyses.whatif_document import WhatIfDocument
from snapviz.errors import InputError
from snapviz.units import fmt_bytes, parse_size
from snapviz.vocab import stage_group


def parse_stage_limit(text: str) -> tuple[str, int]:
    """``vae_decode=8GiB`` -> ("vae_decode", 8589934592)."""
    name, sep, size = str(text).partition("=")
    if not sep or not name.strip():
        raise InputError(f"--max-stage-peak: expected STAGE=SIZE (e.g. vae_decode=8GiB), got {text!r}")
    return name.strip(), parse_size(size, f"--max-stage-peak {name.strip()}")


@dataclass(frozen=True)
class GateResult:
    """One limit checked: what, against what, and the line CI prints."""

    name: str  # stable id, e.g. "peak_allocated", "stage:vae_decode"
    limit: int  # bytes
    actual: int  # bytes
    passed: bool
    message: str  # "PASS peak allocated 11.02 GiB <= 12.00 GiB"

    @property
    def excess_ratio(self) -> float | None:
        return (self.actual / self.limit - 1.0) if self.limit else None


def _line(passed: bool, what: str, actual: int, limit: int, extra: str = "") -> str:
    if passed:
        return f"PASS {what} {fmt_bytes(actual)} <= {fmt_bytes(limit)}{extra}"
    over = f" (+{(actual / limit - 1) * 100:.1f}%)" if limit else ""
    return f"FAIL {what} {fmt_bytes(actual)} > {fmt_bytes(limit)}{over}{extra}"


def stage_peaks(doc: Summary) -> dict[str, tuple[int, int]]:
    """Stage group and step name -> (peak allocated, peak reserved), from a summary; a stage
    with no allocated figure (a trace without memory events in it) is left out."""
    out: dict[str, tuple[int, int]] = {}
    for s in doc.stages:
        if s.peak_allocated_bytes is None:
            continue
        out[s.name] = (s.peak_allocated_bytes, s.peak_reserved_bytes or 0)
        for iv in s.intervals or s.steps:
            if iv.name == s.name or iv.peak_allocated_bytes is None:
                continue
            a, r = iv.peak_allocated_bytes, iv.peak_reserved_bytes or 0
            prev = out.get(iv.name)
            out[iv.name] = (max(a, prev[0]), max(r, prev[1])) if prev else (a, r)
    return out


def describe_stages(names: list[str], limit: int = 12) -> str:
    """Stage names for an error message, steps folded: ``denoise/0..denoise/49``."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(stage_group(n), []).append(n)
    parts: list[str] = []
    for g, members in groups.items():
        steps = [m for m in members if m != g]
        parts.append(g)
        if len(steps) == 1:
            parts.append(steps[0])
        elif steps:
            parts.append(f"{steps[0]}..{steps[-1]}")
    text = ", ".join(parts[:limit])
    return (
        text + (f", … ({len(parts) - limit} more)" if len(parts) > limit else "")
        if parts
        else "(none: the run has no stages)"
    )


def evaluate_gates(
    doc: Summary,
    max_peak: int | None = None,
    max_reserved: int | None = None,
    stage_limits: list[tuple[str, int]] | None = None,
    baseline_peak: int | None = None,
    max_increase_pct: float | None = None,
) -> list[GateResult]:
    """Every limit against one summary; a stage missing from the run is an :class:`InputError`.
    ``baseline_peak``: the baseline run's peak allocated bytes (``--baseline``)."""
    results: list[GateResult] = []
    peak = doc.peak
    if max_peak is not None:
        a = peak.allocated_bytes
        results.append(
            GateResult(
                "peak_allocated", max_peak, a, a <= max_peak, _line(a <= max_peak, "peak allocated", a, max_peak)
            )
        )
    if max_reserved is not None:
        if peak.reserved_bytes is None:  # traces of about 2021 carry Bytes only
            raise InputError(f"{doc.source} records no reserved memory: --max-reserved cannot be checked")
        r = peak.reserved_bytes
        results.append(
            GateResult(
                "peak_reserved",
                max_reserved,
                r,
                r <= max_reserved,
                _line(r <= max_reserved, "peak reserved", r, max_reserved),
            )
        )
    if stage_limits:
        peaks = stage_peaks(doc)
        for name, limit in stage_limits:
            if name not in peaks:
                raise InputError(f"stage {name!r} is not in {doc.source} (stages: {describe_stages(list(peaks))})")
            a = peaks[name][0]
            results.append(
                GateResult(f"stage:{name}", limit, a, a <= limit, _line(a <= limit, f"stage {name}", a, limit))
            )
    if baseline_peak is not None:
        pct = 0.0 if max_increase_pct is None else float(max_increase_pct)
        base = baseline_peak
        limit = int(base * (1 + pct / 100.0))
        a = peak.allocated_bytes
        change = f"{(a / base - 1) * 100:+.1f}%" if base else "n/a"
        extra = f" (baseline {fmt_bytes(base)}, {change}, allowed {pct:+.1f}%)"
        ok = a <= limit
        msg = (
            f"PASS peak allocated vs baseline {fmt_bytes(a)} <= {fmt_bytes(limit)}{extra}"
            if ok
            else f"FAIL peak allocated vs baseline {fmt_bytes(a)} > {fmt_bytes(limit)}{extra}"
        )
        results.append(GateResult("increase_over_baseline", limit, a, ok, msg))
    return results


@dataclass(frozen=True)
class CheckResult:
    """The verdict of ``snapviz check``: one :class:`GateResult` per limit, and the notes
    that qualify it (a wrapped history: the peak is that of the recorded window)."""

    source: str
    gates: tuple[GateResult, ...]
    notes: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @property
    def failures(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if not g.passed)


def history_notes(doc: Summary) -> list[str]:
    """The summary's warnings about the recorded history (wrapped, incomplete), which every
    gate verdict on it must repeat."""
    return [w for w in doc.warnings if "history" in w or "wrapped" in w]


def check_summary(
    doc: Summary,
    max_peak: int | None = None,
    max_reserved: int | None = None,
    stage_limits: list[tuple[str, int]] | None = None,
    baseline_peak: int | None = None,
    max_increase_pct: float | None = None,
) -> CheckResult:
    """:func:`evaluate_gates` with the history notes: what ``snapviz check`` reports."""
    gates = evaluate_gates(
        doc,
        max_peak=max_peak,
        max_reserved=max_reserved,
        stage_limits=stage_limits,
        baseline_peak=baseline_peak,
        max_increase_pct=max_increase_pct,
    )
    return CheckResult(doc.source, tuple(gates), tuple(history_notes(doc)))


def fits_gates(whatif_doc: WhatIfDocument) -> tuple[list[GateResult], list[str]]:
    """``check --fits SIZE``: one gate per simulated card of a ``snapviz.whatif/1`` document (the
    recorded settings on that card): it passes when the simulation does not run out of memory.
    Returns the gates and the notes that qualify them (a simulation that did not reproduce the
    recording is approximate)."""
    gates = []
    for s in whatif_doc.scenarios:
        card = s.gpu_memory_bytes
        if s.alloc_conf is not None or card is None:
            continue
        oom = s.oom
        ok = oom is None
        what = f"fits a {fmt_bytes(card)} card (simulated, recorded settings)"
        if oom is None:
            msg = f"PASS {what}: reserved peak {fmt_bytes(s.peak_reserved_bytes)}"
            if s.survives_recorded_oom:
                msg += " (as far as recorded: the recording ends in its own OOM)"
        else:
            stage = f" in {oom.stage}" if oom.stage else ""
            msg = (
                f"FAIL {what}: out of memory at event {oom.event_index:,}{stage} "
                f"(a {fmt_bytes(oom.requested_bytes)} request, {fmt_bytes(oom.reserved_bytes)} reserved)"
            )
        gates.append(GateResult(f"fits:{card}", card, int(s.peak_reserved_bytes), ok, msg))
    f = whatif_doc.fidelity
    notes = [] if f.reproduced else [f"--fits is approximate: {f.reason}"]
    return gates, notes
