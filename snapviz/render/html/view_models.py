"""The view-models of the single-run reports: typed, plain data (numpy columns, strings), no Bokeh.

The ``*_data`` modules build them from the analyses' DataFrames; the page and plot modules
only draw them, and tests assert on them. Byte columns are float64 (exact below 2**53).
Strings that repeat per timeline point are interned: ``Timeline.stage`` indexes
``stage_names``, ``Timeline.action`` indexes ``action_names`` and ``Timeline.stack`` indexes
:class:`Stacks` (whose ``frames`` index ``frame_text``), so a 20,000-point timeline stays a few
hundred KB in the page. A new view (a training band, another table) is one more field here
and one more block in the renderer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snapviz.analyses.report_view import CategoryTimelineView
from snapviz.safe_text import bound, clip

EMPTY_F = np.empty(0)


def _ints() -> np.ndarray:
    return np.empty(0, np.int64)


@dataclass
class Truth:
    """The replay's peak against the allocator's own ``max_memory_allocated`` (the header's badge)."""

    status: str  # "match" | "close" | "differs"
    text: str
    max_memory_allocated: int
    replay_allocated: int
    diff_bytes: int
    max_memory_reserved: int | None = None


@dataclass
class Headline:
    title: str
    verdict: str
    lines: list[str]
    truth: Truth | None


@dataclass
class Peak:
    """The peak event: ``index`` is its event row (-1 when it predates the recording)."""

    index: int
    time_s: float | None
    allocated: int
    reserved: int
    requested: int | None
    stage: str
    reserved_index: int
    label: str


@dataclass
class Decimation:
    decimated: bool
    shown: int
    total: int
    note: str


@dataclass
class Stacks:
    """Stacks referenced by the report; ``frames[k]`` index ``frame_text``."""

    stack_id: list[int] = field(default_factory=list)
    site: list[str] = field(default_factory=list)
    frames: list[list[int]] = field(default_factory=list)
    more: list[int] = field(default_factory=list)
    frame_text: list[str] = field(default_factory=list)

    def text(self, k: int) -> str:
        """The text of stack ``k`` (what a click on the timeline shows)."""
        if k < 0 or k >= len(self.frames):
            return "(no frames recorded)"
        lines = [self.frame_text[f] for f in self.frames[k]]
        if self.more[k]:
            lines.append(f"... {self.more[k]} more")
        return "\n".join(lines) or "(no frames recorded)"


@dataclass
class Timeline:
    """The decimated memory timeline: one entry per kept event (``index`` is its event row).
    A trace's timeline has no requested bytes, actions, sizes or stacks (None)."""

    index: np.ndarray
    time_s: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    fragmentation: np.ndarray
    stage: np.ndarray
    requested: np.ndarray | None = None
    action: np.ndarray | None = None
    size: np.ndarray | None = None
    stack: np.ndarray | None = None

    def columns(self) -> dict[str, np.ndarray]:
        """The columns of the timeline's data source (absent series left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class Bands:
    """Stage intervals as shaded bands, on both x axes (seconds and event rows)."""

    name: list[str]
    group: list[str]
    color: list[str]
    alpha: list[float]
    start_s: np.ndarray
    end_s: np.ndarray
    start_index: np.ndarray
    end_index: np.ndarray


@dataclass
class Oom:
    """The OOM markers (one per ``oom`` trace entry) and the story of the first (analyses/oom.py)."""

    index: np.ndarray = field(default_factory=_ints)
    time_s: np.ndarray = field(default_factory=lambda: EMPTY_F)
    allocated: np.ndarray = field(default_factory=lambda: EMPTY_F)
    requested: np.ndarray = field(default_factory=lambda: EMPTY_F)  # the failed request of each marker
    site: list[str] = field(default_factory=list)  # its site
    stage: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # headline, state, verdict, fix (oom_lines)
    live: list[str] = field(default_factory=list)  # what was live then, by category and by site


@dataclass
class StageBars:
    """Peak allocated per stage interval (or per stage, past ``MAX_STAGE_BARS`` intervals)."""

    label: list[str]
    name: list[str]
    group: list[str]
    color: list[str]
    peak_allocated: np.ndarray
    peak_reserved: np.ndarray
    allocator_peak: np.ndarray
    duration_s: np.ndarray
    note: str = ""


@dataclass
class TextTable:
    """A table of preformatted text cells (trace reports: no stacks to link)."""

    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Advice:
    technique: str
    why: str
    how: str
    saves_up_to_bytes: int | None
    saves: str
    share: float | None  # of the peak


@dataclass
class Categories:
    """Bytes by category live at the peak."""

    category: list[str]
    bytes: np.ndarray
    count: np.ndarray
    share: np.ndarray
    label: list[str]
    color: list[str]


@dataclass
class StageBreakdown:
    """Bytes by category at each shown stage interval's own peak (each bar adds up to it)."""

    interval: np.ndarray
    label: list[str]
    name: list[str]
    total: np.ndarray
    categories: list[str]
    colors: list[str]
    bytes: dict[str, np.ndarray]
    share: dict[str, np.ndarray]
    top_category: list[str]
    top_share: np.ndarray
    allocator_peak: np.ndarray
    note: str = ""


@dataclass
class BlockRows:
    """Allocations listed in a table, each with its stack (``stack`` indexes :class:`Stacks`)."""

    bytes: np.ndarray
    size: list[str]
    stage: list[str]
    site: list[str]
    event_index: np.ndarray
    time_s: np.ndarray
    stack: np.ndarray
    stack_text: list[str]


@dataclass
class StageTop(BlockRows):
    """The largest blocks each shown stage interval allocated itself, live at its peak."""

    interval: np.ndarray = field(default_factory=_ints)


@dataclass
class TopAllocations(BlockRows):
    """The largest blocks live at the peak, with the profiler op that allocated each (when joined)."""

    requested_bytes: np.ndarray = field(default_factory=lambda: EMPTY_F)
    has_ops: bool = False
    op: list[str] = field(default_factory=list)
    op_input_dims: list[str] = field(default_factory=list)


@dataclass
class AttentionRows(BlockRows):
    shape: list[str] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)
    live_events: np.ndarray = field(default_factory=_ints)
    lifetime: list[str] = field(default_factory=list)


@dataclass
class AttentionView:
    """The summary's attention section as the report shows it, and the score allocations."""

    count: int
    largest_bytes: int
    peak_live_bytes: int
    implementation: str  # the verdict (control characters shown as escapes)
    rows: AttentionRows | None = None
    note: str = ""


@dataclass
class SingleRunReport:
    """What the snapshot and trace reports share: header, timeline, bands, peak, stage bars."""

    title: str
    headline: Headline
    warnings: list[str]
    has_time: bool
    timeline: Timeline
    stage_names: list[str]
    stage_colors: dict[str, str]
    bands: Bands
    peak: Peak
    stage_bars: StageBars
    metadata: list[tuple[str, str]]
    decimation: Decimation


@dataclass
class SnapshotReport(SingleRunReport):
    action_names: list[str]
    stacks: Stacks
    oom: Oom
    advice: list[Advice]
    stage_breakdown: StageBreakdown
    stage_top: StageTop
    category_colors: dict[str, str]
    category_timeline: CategoryTimelineView
    category_stage: np.ndarray  # per category-timeline point: its stage, indexing stage_names
    categories: Categories
    top_allocations: TopAllocations
    attention: AttentionView
    end_state_only: bool = False  # the file holds only the blocks live when it was taken


@dataclass
class TraceReport(SingleRunReport):
    attention_ops: TextTable
    live_table: TextTable
    attention_implementation: str  # the summary's verdict (control characters shown as escapes)


def bounded(view: Any) -> Any:
    """A copy of a view-model with every string from the input clipped (columns stay whole and
    aligned): a page's size follows its rows, not the longest frame name in the snapshot."""
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return dataclasses.replace(
            view, **{f.name: bounded(getattr(view, f.name)) for f in dataclasses.fields(view) if f.init}
        )
    if isinstance(view, str):
        return clip(view)
    if isinstance(view, (list, tuple, dict, np.ndarray)):
        if isinstance(view, list) and view and dataclasses.is_dataclass(view[0]):
            return [bounded(v) for v in view]
        return bound(view, max_list=None, json_numbers=False)
    return view
