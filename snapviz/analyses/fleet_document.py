"""The fleet documents, ``snapviz.ranks/1`` and ``snapviz.history/1``, as code: frozen dataclasses
whose JSON form is :func:`~snapviz.analyses.document.to_json` of them and whose loader is
:func:`~snapviz.analyses.document.from_json` (the summary's generic encoder and decoder; keys in
field order, the order :mod:`snapviz.analyses.ranks` and :mod:`snapviz.analyses.history` always
wrote them).

:class:`RanksDocument` and :class:`HistoryDocument` are what those modules build and what the
terminal, Markdown and HTML renderers (:mod:`snapviz.render.fleet_md`,
:mod:`snapviz.render.html.fleet`) take; ``check --baseline history.json`` reads a written history
back through :func:`load_history`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from snapviz.analyses.document import ABSENT, Absent, from_json
from snapviz.errors import InputError
from snapviz.vocab import HISTORY_SCHEMA

# --------------------------------------------------------------------------- ranks


@dataclass(frozen=True, kw_only=True)
class RankPeak:
    """A rank's peak (every figure None: the input failed). The byte counts are integers, written
    as ``1.0``-style numbers when another input of the fleet failed (a pandas column with NaN in it)."""

    allocated_bytes: float | None
    reserved_bytes: float | None
    stage: str | None
    time_us: int | None


@dataclass(frozen=True, kw_only=True)
class RankOom:
    count: int | None  # None: the input failed
    first_time_us: int | None  # Unix µs (None: no OOM, or no clock)


@dataclass(frozen=True, kw_only=True)
class TopSite:
    site: str
    peak_live_bytes: int


@dataclass(frozen=True, kw_only=True)
class RankAllocator:
    """The allocator's own figures from the rank's run.json."""

    max_memory_allocated: int
    max_memory_reserved: float | None  # an integer (see RankPeak)


@dataclass(frozen=True, kw_only=True)
class RankRow:
    """One input of the fleet: a rank of an iteration, or the reason it could not be analysed."""

    label: str
    source: str
    iteration: int | None
    rank: int | None
    rank_from: str  # run.json, trace, path or none
    world_size: int | None
    status: Literal["ok", "failed"]
    reason: str | None  # why it failed
    peak: RankPeak
    oom: RankOom
    top_site: TopSite | None
    allocator: RankAllocator | None  # None: no run.json figures
    truncated: bool | None
    stage_peak_allocated_bytes: list[int | None]  # one per ``stages`` (None: the rank has no such stage)
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class RankRef:
    """The rank with the highest peak of an iteration."""

    who: str  # "rank R", or the input's label when it names no rank
    rank: int | None
    peak_allocated_bytes: int


@dataclass(frozen=True, kw_only=True)
class MedianRank:
    """The median rank (the lower median: a real rank) and the median of the peaks."""

    who: str
    rank: int | None
    peak_allocated_bytes: int
    median_bytes: int


@dataclass(frozen=True, kw_only=True)
class Outlier:
    who: str
    rank: int | None
    peak_allocated_bytes: int
    vs_median: float | None


@dataclass(frozen=True, kw_only=True)
class FirstOom:
    """The rank that ran out of memory first (``time_us`` None: the only OOM rank, no clock)."""

    who: str
    rank: int | None
    time_us: int | None
    note: str | Absent = ABSENT  # other OOM ranks have no clock


@dataclass(frozen=True, kw_only=True)
class StageDelta:
    """The worst rank against the median rank in one stage group."""

    stage: str
    worst_bytes: int | None
    median_bytes: int | None
    delta_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class IterationView:
    """One iteration of the job: imbalance, outliers, the first OOM, worst vs median, its verdict."""

    iteration: int | None
    inputs: int
    ranks_ok: int
    failed: int
    max: RankRef | None  # None: no rank analysed
    median: MedianRank | None
    imbalance: float | None  # max / median
    outliers: list[Outlier]
    first_oom: FirstOom | None
    oom_ranks: list[str]
    worst_vs_median: list[StageDelta]
    missing_ranks: list[int]  # ranks below the stated world size with no input
    verdict: list[str]
    world_size: int | Absent = ABSENT  # absent: no input states it


@dataclass(frozen=True, kw_only=True)
class RanksDocument:
    """The ``snapviz.ranks/1`` document (``ranks --json``)."""

    schema: Literal["snapviz.ranks/1"]
    inputs: int
    failed: int
    verdict: list[str]
    stages: list[str]  # the stage groups of ``stage_peak_allocated_bytes``
    iterations: list[IterationView]
    ranks: list[RankRow]
    warnings: list[str] | Absent = ABSENT  # what the text sinks clipped (document.bounded)


# --------------------------------------------------------------------------- history


@dataclass(frozen=True, kw_only=True)
class HistoryPeak:
    allocated_bytes: int | None  # None: the run failed
    reserved_bytes: int | None
    stage: str | None


@dataclass(frozen=True, kw_only=True)
class HistoryRun:
    """One run in history order."""

    label: str
    source: str
    order_key: int | float | str | None  # what it was ordered by (None: it has none)
    status: Literal["ok", "failed"]
    reason: str | None
    peak: HistoryPeak
    oom_count: int | None
    stage_peak_allocated_bytes: list[int | None]  # one per ``stage_names``


@dataclass(frozen=True, kw_only=True)
class Jump:
    """A stage's largest rise from one analysed run to the next."""

    run: str
    after: str
    from_bytes: int
    to_bytes: int
    delta_bytes: int
    percent: float | None


@dataclass(frozen=True, kw_only=True)
class StageTrend:
    """One stage (or the whole run) over the runs: first, last, lowest, highest, the jump."""

    stage: str
    runs: int
    first_bytes: int
    last_bytes: int
    min_bytes: int
    min_run: str
    max_bytes: int
    max_run: str
    change_bytes: int
    jump: Jump | None  # None: no rise above the threshold


@dataclass(frozen=True, kw_only=True)
class HistoryDocument:
    """The ``snapviz.history/1`` document (``history --json``)."""

    schema: Literal["snapviz.history/1"]
    order_by: str
    jump_percent: float
    verdict: list[str]
    stage_names: list[str]
    runs: list[HistoryRun]
    stages: list[StageTrend]
    warnings: list[str] | Absent = ABSENT  # what the text sinks clipped (document.bounded)


def load_history(obj: object, source: str = "document") -> HistoryDocument:
    """A ``snapviz.history/1`` document read back (``check --baseline history.json``); one line in
    :class:`InputError` when malformed."""
    if not isinstance(obj, dict) or obj.get("schema") != HISTORY_SCHEMA:
        raise InputError(f"{source}: not a {HISTORY_SCHEMA} document")
    try:
        return from_json(obj, HistoryDocument)
    except InputError as e:
        raise InputError(f"{source}: malformed {HISTORY_SCHEMA} document: {e}") from None
