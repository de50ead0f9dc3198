"""The matrix document (schema ``snapviz.matrix/1``) and its stage-aligned comparison.

The comparison reuses :mod:`snapviz.analyses.compare`: a variant with a snapshot is digested
from the snapshot (timeline, sites, attention), one without from its ``run.json`` stage peaks.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapviz.vocab import MATRIX_SCHEMA, SUMMARY_SCHEMA

from .ranking import RANKING_RULE, measure
from .runner import MatrixOptions

if TYPE_CHECKING:
    from snapviz.analyses.compare import Comparison
    from snapviz.analyses.compare_document import CompareDocument

SCHEMA = MATRIX_SCHEMA


def run_json_summary(info: dict[str, Any], label: str, source: str, warn: bool = True) -> dict[str, Any]:
    """A ``snapviz.summary/1``-shaped dict from run.json stage peaks, for ``digest_summary``."""
    m = measure(info)
    rss = m["memory_metric"] == "rss"
    stages = []
    for s in info.get("stages") or []:
        if s.get("end_us") is None or s.get("open"):
            continue
        a = s.get("rss_peak_bytes") if rss else s.get("peak_allocated_bytes")
        stages.append(
            {
                "name": s["name"],
                "peak_allocated_bytes": int(a or 0),
                "peak_reserved_bytes": 0 if rss else int(s.get("peak_reserved_bytes") or 0),
            }
        )
    warnings = []
    if rss and warn:
        warnings.append(
            "CPU run: peaks are process RSS (sampled every 5 ms, Python and torch included), "
            "not CUDA allocator numbers; reserved is not measured"
        )
    return {
        "schema": SUMMARY_SCHEMA,
        "source": source,
        "label": label,
        "peak": {
            "allocated_bytes": m["peak_allocated_bytes"],
            "reserved_bytes": m["peak_reserved_bytes"] or 0,
            "stage": m["peak_stage"],
        },
        "stages": stages,
        "stage_source": "run.json",
        "history": {"events": 0, "truncated": False},
        "warnings": warnings,
    }


def _run_json_digest(summary: dict[str, Any]) -> Any:
    """A compare digest of :func:`run_json_summary`'s stage peaks (no timeline, sites or attention)."""
    from snapviz.analyses.digest import digest_of_peaks

    p = summary["peak"]
    return digest_of_peaks(
        summary["label"],
        summary["source"],
        [(str(s["name"]), s["peak_allocated_bytes"], s["peak_reserved_bytes"]) for s in summary["stages"]],
        peak_allocated=int(p["allocated_bytes"]),
        peak_reserved=int(p["reserved_bytes"] or 0),
        peak_stage=str(p["stage"]),
        stage_source=summary["stage_source"],
        warnings=summary["warnings"],
    )


def _snapshot_digest(run_dir: Path, label: str) -> Any:
    """The variant's snapshot through the analyses (timeline, sites, attention), reduced to a
    compare digest; None when the run directory holds no snapshot after all."""
    from snapviz.analyses.pipeline import analyze_input, digest_of
    from snapviz.load import load

    run = load(str(run_dir), label)
    if run.snapshot is None:  # a trace-only variant is compared from its run.json figures
        return None
    return digest_of(analyze_input(run), label)


def build_comparison(
    rows: list[dict[str, Any]], use_snapshots: bool = True
) -> tuple[Comparison, CompareDocument] | None:
    """The stage-aligned comparison (base first, then ranked variants) via snapviz compare, and
    its typed ``snapviz.compare/1`` document."""
    from snapviz.analyses.compare import compare_runs

    ok = [r for r in rows if r["status"] == "ok" and r.get("measure")]
    if len(ok) < 2:
        return None
    digests: list[Any] = []
    for r in ok:
        run_dir = Path(r["run_dir"])
        digest = None
        if use_snapshots and any((run_dir / n).is_file() for n in ("snapshot.pickle", "snapshot.pickle.xz")):
            try:
                digest = _snapshot_digest(run_dir, r["label"])
            except Exception as err:  # noqa: BLE001 - the run.json numbers still make a comparison
                r.setdefault("notes", []).append(
                    f"snapshot not analysed ({type(err).__name__}: {err}); compared from run.json"
                )
        if digest is None:
            info = json.loads((run_dir / "run.json").read_text())
            # the RSS caveat once, on the base, not on every run
            digest = _run_json_digest(run_json_summary(info, r["label"], str(run_dir), warn=not digests))
        digests.append(digest)
    cmp = compare_runs(digests)
    return cmp, cmp.document()


# ----------------------------------------------------------------------------- document


def _json_of(compare_doc: CompareDocument | None) -> dict[str, Any] | None:
    """The ``compare`` object of the matrix document: the comparison's JSON form."""
    if compare_doc is None:
        return None
    from snapviz.analyses.document import to_json

    return typing.cast(dict[str, Any], to_json(compare_doc))


def matrix_dict(
    opts: MatrixOptions,
    rows: list[dict[str, Any]],
    baseline: str | None,
    skipped: list[dict[str, str]],
    notes: list[str],
    compare_doc: CompareDocument | None,
) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok" and r.get("measure")]
    metric = ok[0]["measure"]["memory_metric"] if ok else ("allocator" if opts.device == "cuda" else "rss")
    first: dict[str, Any] = next((json.loads((Path(r["run_dir"]) / "run.json").read_text()) for r in ok), {})
    return {
        "schema": SCHEMA,
        "pipeline": opts.pipeline,
        "size": opts.size,
        "device": opts.device,
        "device_name": first.get("device_name"),
        "torch_version": first.get("torch_version"),
        "diffusers_version": first.get("diffusers_version"),
        "steps": opts.steps,
        "height": first.get("height", opts.height),
        "width": first.get("width", opts.width),
        "batch": opts.batch,
        "history": opts.history,
        "jobs": opts.jobs,
        "out": str(opts.out),
        "baseline": baseline,
        "memory_metric": metric,
        "memory_metric_text": (
            "CUDA caching allocator: torch.cuda.max_memory_allocated / max_memory_reserved, "
            "reset at every stage boundary"
            if metric == "allocator"
            else "process RSS (CPU run, no CUDA allocator): peak resident set size per stage, "
            "Python, torch and the weights included"
        ),
        "time_text": (
            "call s: wall time of the pipe() call (every stage after the initial load); step s: median "
            "wall time of denoise steps 1..N-1 (step 0 carries warm-up)"
        ),
        "ranking_rule": RANKING_RULE,
        "variants": rows,
        "skipped": skipped,
        "notes": notes,
        "compare": _json_of(compare_doc),
    }
