"""The one result type of an analysis: :class:`Analysis`, for a replayed snapshot and for a
profiler trace alike.

Both kinds of input yield the same parts: a memory timeline (one row per allocator event:
``time_us``, ``allocated``, ``reserved``) and one stage per event (:class:`StageLabels`, from
the one interval labeller), the stage table, what was live at the peak, the attention table,
the warnings, and the category views (empty where the input cannot itemize them). What the
input can say is in :class:`Capabilities`; what only one kind has is its *evidence*: the
replayed allocator, the stack tables and site names of a snapshot (:class:`ReplayEvidence`),
the profiler's device table and attention ops of a trace (:class:`TraceEvidence`).

:func:`snapviz.analyses.pipeline.analyze_input` makes one, choosing the kind once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import pandas as pd

from snapviz.analyses.stages import StageLabels
from snapviz.load import Run
from snapviz.safe_text import printable, short_repr
from snapviz.units import fmt_bytes
from snapviz.vocab import BEFORE_RECORDING, END_STATE, UNLABELLED

if TYPE_CHECKING:
    from snapviz.analyses.document import Attention, Oom, TraceAttention
    from snapviz.analyses.end_state import EndState
    from snapviz.analyses.frame_rules import RuleSet
    from snapviz.analyses.replay import ReplayResult
    from snapviz.analyses.sites import SiteNamer
    from snapviz.analyses.stack_tables import StackTables
    from snapviz.analyses.trace_ops import TraceTables
    from snapviz.analyses.training_view import TrainingView
    from snapviz.model import Snapshot

Kind: TypeAlias = Literal["snapshot", "trace"]


@dataclass(frozen=True)
class Capabilities:
    """What an input can tell, so that a view says "not determined" rather than guess."""

    exact_blocks: bool  # every allocator block replayed: what was live, and where, is exact
    reserved_recorded: bool  # reserved (cached) memory known at every event
    exact_totals: bool  # allocated figures are the allocator's own (False: a lower bound)


@dataclass(frozen=True)
class ReplayEvidence:
    """What only a replayed snapshot has: the allocator replayed block by block, and the stack
    tables every frame-based analysis read (with the rules they used)."""

    replay: ReplayResult
    sites: SiteNamer  # names an allocation site from its stack
    tables: StackTables  # the snapshot's stack tables, built once
    rules: RuleSet  # the rules every frame-based analysis of this run used


@dataclass(frozen=True)
class TraceEvidence:
    """What only a profiler trace has: its per-device table and its ops (``trace_ops``)."""

    trace: TraceTables


def _empty() -> pd.DataFrame:
    return pd.DataFrame()


@dataclass(frozen=True)
class Analysis:
    """Every result for one device of a run, whichever its input. Tables are DataFrames.

    ``summary()`` is the ``snapviz.summary/1`` document the CLI writes with ``--json``.
    """

    run: Run
    # snapshot: the CUDA device index; trace: the chosen device's index (None: no memory events)
    device: int | None
    capabilities: Capabilities
    evidence: ReplayEvidence | TraceEvidence
    labels: StageLabels  # one stage per timeline event, and where the stages came from
    stages: pd.DataFrame  # one row per stage interval (stages.stage_table / trace_ops.stage_peaks)
    top_allocations: pd.DataFrame  # live at the peak, largest first
    # snapshot: one row per attention score allocation (frame evidence); trace: the attention
    # ops with their shapes (op-shape evidence)
    attention: pd.DataFrame
    # the summary's attention section: a snapshot's score matrices by frame evidence, a trace's
    # by op shapes (count, largest, implementation)
    attention_summary: Attention | TraceAttention
    warnings: list[str] = field(default_factory=list)
    categories: pd.DataFrame = field(default_factory=_empty)  # live bytes by category at the peak
    device_peaks: pd.DataFrame = field(default_factory=_empty)  # every device: peak allocated / reserved
    stage_live: pd.DataFrame = field(default_factory=_empty)  # per stage interval: bytes by category at its peak
    stage_top: pd.DataFrame = field(default_factory=_empty)  # per stage interval: largest live blocks at its peak
    training: TrainingView | None = None  # phases, steps and categories of a training run
    # the OOM that ended the run (analyses/oom.py), None: none. Its facts only: the sentences,
    # the advice and the simulation are the summary's (``document_of(an).oom``), left empty here
    oom: Oom | None = None
    end_state: EndState | None = None  # the live blocks at the end, named by their frames
    # one row per recorded allocation, classified once (categories.allocation_table): every
    # category view is a group-by of its ``category`` column (empty: the input has no blocks)
    allocations: pd.DataFrame = field(default_factory=_empty)

    # ------------------------------------------------------------------ what every kind has

    @property
    def kind(self) -> Kind:
        """``snapshot``: a replayed allocator (exact blocks, reserved recorded); ``trace``: the
        profiler's ``[memory]`` events (totals only)."""
        return "snapshot" if isinstance(self.evidence, ReplayEvidence) else "trace"

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per allocator event of the device: ``time_us``, ``allocated``, ``reserved``
        (and, for a snapshot, the replay's other columns; for a trace the profiler's)."""
        ev = self.evidence
        return ev.replay.events if isinstance(ev, ReplayEvidence) else ev.trace.timeline

    @property
    def events(self) -> pd.DataFrame:
        """The timeline with its ``stage``."""
        return self.timeline.assign(stage=self.labels.labels)

    @cached_property
    def peak_index(self) -> int:
        """The timeline row of the allocated peak; -1: the peak is memory from before the first
        event (a snapshot's baseline), or there are no events."""
        ev = self.evidence
        if isinstance(ev, ReplayEvidence):
            return int(ev.replay.peak_index)
        tl = ev.trace.timeline
        return int(np.argmax(tl["allocated"].to_numpy())) if len(tl) else -1

    @property
    def peak_stage(self) -> str:
        i = self.peak_index
        if i >= 0:
            return str(self.labels.labels[i])
        if self.kind == "trace":
            return UNLABELLED
        return END_STATE if self.end_state_only else BEFORE_RECORDING

    @property
    def end_state_only(self) -> bool:
        """The file holds no allocation history for this device, only its end state."""
        return self.end_state is not None and self.end_state.only and bool(len(self.end_state.blocks))

    def stage_groups(self) -> pd.DataFrame:
        """Stages grouped by name before '/': peak over every interval of the group."""
        st = self.stages
        if not len(st):
            return st
        agg: dict[str, tuple[str, str]] = {
            "peak_allocated_bytes": ("peak_allocated_bytes", "max"),
            "peak_reserved_bytes": ("peak_reserved_bytes", "max"),
            "start_us": ("start_us", "min"),
            "end_us": ("end_us", "max"),
            "intervals": ("name", "size"),
        }
        if "duration_s" in st:
            agg["duration_s"] = ("duration_s", "sum")
        g = st.groupby("group", sort=False).agg(**agg)
        return g.reset_index().rename(columns={"group": "name"})

    def summary(self) -> dict[str, Any]:
        """The ``snapviz.summary/1`` document as JSON (:func:`snapviz.analyses.pipeline.summary_of`)."""
        from snapviz.analyses.pipeline import summary_of

        return summary_of(self)

    # ------------------------------------------------------------------ one kind's evidence

    @property
    def replay(self) -> ReplayResult:
        """The replayed allocator (a snapshot's; a trace has none: narrow on :attr:`kind`)."""
        return self._replayed("replay").replay

    @property
    def sites(self) -> SiteNamer:
        return self._replayed("sites").sites

    @property
    def tables(self) -> StackTables:
        return self._replayed("tables").tables

    @property
    def rules(self) -> RuleSet:
        return self._replayed("rules").rules

    @property
    def snapshot(self) -> Snapshot:
        """The analysed snapshot (a snapshot analysis only)."""
        self._replayed("snapshot")
        snap = self.run.snapshot
        assert snap is not None
        return snap

    @property
    def trace(self) -> TraceTables:
        """The profiler trace's own tables (a trace analysis only: narrow on :attr:`kind`)."""
        ev = self.evidence
        if not isinstance(ev, TraceEvidence):
            raise AttributeError("a snapshot analysis has no 'trace': its evidence is the replay")
        return ev.trace

    def _replayed(self, what: str) -> ReplayEvidence:
        ev = self.evidence
        if not isinstance(ev, ReplayEvidence):
            raise AttributeError(f"a trace analysis has no {what!r}: only a replayed snapshot has one")
        return ev

    def __repr__(self) -> str:
        tl = self.timeline
        pi = self.peak_index
        if self.kind == "snapshot":
            peak: int | None = int(self.replay.peak_allocated)
            where = f"cuda:{self.device}"
        else:
            peak = int(tl["allocated"].iat[pi]) if pi >= 0 else None
            dev = self.trace.device
            from snapviz.analyses.trace_devices import device_label

            where = device_label(*dev) if dev is not None else "no device memory events"
        return short_repr(
            "Analysis",
            self.kind,
            self.run.label,
            where,
            f"{len(tl):,} events" if self.kind == "snapshot" else f"{len(tl):,} memory events",
            f"peak allocated {fmt_bytes(peak)} ({peak:,} B) in {printable(self.peak_stage, 60)}"
            if peak is not None
            else "",
            f"peak reserved {fmt_bytes(self.replay.peak_reserved)}" if self.kind == "snapshot" else "",
            f"{len(self.stages):,} stage intervals",
            f"{len(self.warnings)} warning(s)",
            "summary() for the full document",
        )
