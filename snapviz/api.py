"""The Python API: ``snapviz.analyze``, ``snapviz.compare`` and ``snapviz.check``.

Each takes what a user has at hand (a path, a loaded :class:`~snapviz.load.Run`, or an
earlier analysis) and returns a frozen, typed result holding the same tables and the same
summary documents as the CLI's ``analyze``, ``compare`` and ``check`` verbs. The examples
in the docstrings run as tests (tests/unit/test_api.py), from the repository root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from snapviz.analyses.analysis import Analysis
from snapviz.analyses.compare import Comparison, compare_runs
from snapviz.analyses.digest import RunDigest
from snapviz.analyses.frame_rules import RuleSet, load_rules
from snapviz.analyses.gate import CheckResult, check_summary
from snapviz.analyses.pipeline import analyze_input, digest_of, document_of
from snapviz.analyses.stages import SOURCES
from snapviz.errors import InputError
from snapviz.load import Run, load
from snapviz.load.labels import unique_labels
from snapviz.units import parse_percent, parse_size

Source: TypeAlias = str | os.PathLike[str] | Run
Input: TypeAlias = Source | Analysis
Rules: TypeAlias = str | os.PathLike[str] | RuleSet | None

STAGE_SOURCES = ("auto", *SOURCES)


def analyze(source: Source, *, device: int | None = None, rules: Rules = None, stages_from: str = "auto") -> Analysis:
    """Analyse a snapshot pickle, a Chrome trace or a run directory (a path or a loaded run).

    ``device``: the device to analyse (default: the one with the highest peak). ``rules``: a
    rules file (or a loaded :class:`~snapviz.analyses.frame_rules.RuleSet`) replacing or
    extending the built-in stage/category rules. ``stages_from``: where a snapshot's stage
    labels come from (``auto`` or one of ``user_metadata``, ``annotations``, ``run.json``,
    ``frames``, ``phases``); a trace takes its stages from its ranges or run.json.

    Every input gives one :class:`~snapviz.analyses.analysis.Analysis`: of ``kind``
    ``snapshot`` (the replayed allocator) for a run with a snapshot, ``trace`` (the profiler's
    own totals) for a trace-only run, with the same timeline, stage table and summary:

    >>> an = analyze("sample_snapshots/sd15-fp16-classic")
    >>> an.replay.peak_allocated, an.peak_stage
    (3324129280, 'denoise/1')
    >>> an.stage_groups()[["name", "peak_allocated_bytes"]].to_dict("list")  # doctest: +NORMALIZE_WHITESPACE
    {'name': ['load', 'text_encode', 'denoise', 'vae_decode'],
     'peak_allocated_bytes': [2156505600, 2193120256, 3324129280, 2830440448]}
    >>> an.events[["time_us", "allocated", "reserved", "stage"]].shape
    (20220, 4)
    >>> an.summary()["peak"]["allocated_bytes"]
    3324129280
    >>> tr = analyze("sample_snapshots/sd15-fp16-profile-1step/trace.json.gz")
    >>> type(tr).__name__, tr.kind, tr.summary()["kind"], len(tr.timeline) > 0
    ('Analysis', 'trace', 'trace', True)
    >>> tr.capabilities.exact_blocks, tr.events[["time_us", "allocated", "stage"]].shape[1]
    (False, 3)
    """
    if stages_from not in STAGE_SOURCES:
        raise InputError(f"stages_from: {stages_from!r} is not one of {', '.join(STAGE_SOURCES)}")
    ruleset = rules if isinstance(rules, RuleSet) else load_rules(rules)  # a bad file fails before the load
    run = source if isinstance(source, Run) else load(source)
    return analyze_input(run, device=device, stage_source=stages_from, rules=ruleset)


def compare(
    before: Input,
    after: Input,
    *others: Input,
    labels: Sequence[str] = (),
    stages_from: str = "auto",
    max_points: int = 200,
) -> Comparison:
    """Compare runs stage by stage against the first (``before``), as ``snapviz compare`` does.

    Inputs are paths, loaded runs or analyses; ``labels`` name them in order (default: from
    their paths, as the CLI names them). Each input is analysed and reduced to a digest one
    at a time, so comparing many runs holds one full analysis in memory. ``max_points``:
    timeline points kept per stage and run.

    >>> cmp = compare("sample_snapshots/sd15-fp16-classic", "sample_snapshots/sd15-fp16-sdpa")
    >>> cmp.labels
    ['sd15-fp16-classic', 'sd15-fp16-sdpa']
    >>> cmp.verdict[0].split(",")[0]
    'sd15-fp16-sdpa lowers peak allocated by 469.94 MiB (−14.8%)'
    >>> cmp.summary()["runs"][1]["peak"]["allocated_bytes"]
    2831357440
    """
    if max_points < 2:
        raise InputError("max_points must be at least 2")
    items = [before, after, *others]
    names = unique_labels([_source_of(x) for x in items], list(labels))
    return compare_runs([_digest(x, name, stages_from, max_points) for x, name in zip(items, names, strict=True)])


def check(
    source: Input,
    *,
    max_peak: int | str | None = None,
    max_reserved: int | str | None = None,
    max_stage_peak: Mapping[str, int | str] | None = None,
    baseline: Input | None = None,
    max_increase: float | str | None = None,
    device: int | None = None,
    rules: Rules = None,
    stages_from: str = "auto",
) -> CheckResult:
    """Gate a run on memory limits: the verdict of ``snapviz check``, one gate per limit.

    Sizes are bytes or strings such as ``"12GiB"`` (binary) and ``"12GB"`` (decimal);
    ``max_stage_peak`` maps a stage or step (``"vae_decode"``, ``"denoise/0"``) to its limit;
    ``baseline`` with ``max_increase`` (percent: ``5`` or ``"5%"``) limits the growth of peak
    allocated over another run. A stage the run does not have raises :class:`InputError`.

    >>> result = check("sample_snapshots/sd15-fp16-classic", max_peak="3GiB",
    ...                max_stage_peak={"vae_decode": "3GiB"})
    >>> result.passed
    False
    >>> for gate in result.gates:
    ...     print(gate.message)
    FAIL peak allocated 3.10 GiB > 3.00 GiB (+3.2%)
    PASS stage vae_decode 2.64 GiB <= 3.00 GiB
    """
    peak_limit = parse_size(max_peak, "max_peak") if max_peak is not None else None
    reserved_limit = parse_size(max_reserved, "max_reserved") if max_reserved is not None else None
    stage_limits = [
        (name, parse_size(limit, f"max_stage_peak[{name!r}]")) for name, limit in (max_stage_peak or {}).items()
    ]
    if (baseline is None) != (max_increase is None):
        raise InputError("baseline and max_increase go together (e.g. baseline='main.pickle', max_increase='5%')")
    increase = parse_percent(max_increase, "max_increase") if max_increase is not None else None
    if peak_limit is None and reserved_limit is None and not stage_limits and baseline is None:
        raise InputError("nothing to check: give max_peak, max_reserved, max_stage_peak or baseline with max_increase")
    doc = document_of(_analysis(source, device, rules, stages_from))
    base_peak = (
        document_of(_analysis(baseline, None, rules, stages_from)).peak.allocated_bytes
        if baseline is not None
        else None
    )
    return check_summary(
        doc,
        max_peak=peak_limit,
        max_reserved=reserved_limit,
        stage_limits=stage_limits,
        baseline_peak=base_peak,
        max_increase_pct=increase,
    )


def _analysis(item: Input, device: int | None, rules: Rules, stages_from: str) -> Analysis:
    if isinstance(item, Analysis):
        return item
    return analyze(item, device=device, rules=rules, stages_from=stages_from)


def _source_of(item: Input) -> str:
    """The path an input came from: what its default label is made of."""
    if isinstance(item, Analysis):
        return item.run.source
    if isinstance(item, Run):
        return item.source
    return os.fspath(item)


def _digest(item: Input, label: str, stages_from: str, max_points: int) -> RunDigest:
    return digest_of(_analysis(item, None, None, stages_from), label, points_per_label=max_points)
