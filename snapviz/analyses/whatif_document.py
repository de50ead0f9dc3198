"""The ``snapviz.whatif/1`` document and ``compare --whatif``'s twins as code: frozen dataclasses
whose JSON form is :func:`~snapviz.analyses.document.to_json` of them and whose loader is
:func:`~snapviz.analyses.document.from_json` (the summary's generic encoder and decoder; the
keys come in field order, the order the builders in :mod:`snapviz.analyses.whatif` always wrote).

:class:`WhatIfDocument` is what :func:`snapviz.analyses.whatif.whatif_document` builds and what
the terminal, Markdown and HTML renderers (:mod:`snapviz.render.whatif`,
:mod:`snapviz.render.html.whatif`) and ``check --fits`` (:func:`snapviz.analyses.gate.fits_gates`)
take; :class:`WhatIfTwins` is the compare document's ``whatif``. The smallest cards are the
summary's own :class:`~snapviz.analyses.document.CardFit`: ``analyze``'s OOM section and the
what-if report name them in the same words (:func:`snapviz.analyses.whatif.card_fit_text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from snapviz.analyses.document import ABSENT, Absent, CardFit


@dataclass(frozen=True, kw_only=True)
class RecordedRun:
    """What the recording itself says: its settings, cap, peaks and OOM."""

    alloc_conf: str  # the recorded settings in PYTORCH_CUDA_ALLOC_CONF words ('' for the defaults)
    gpu_memory_bytes: int | None  # the cap the simulation meets (None: no limit)
    memory_fraction: bool  # the cap is set_per_process_memory_fraction's
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    oom_event_index: int | None  # the first recorded OOM (None: none)
    oom_ended_run: bool  # the last recorded OOM came after the last allocation
    events: int
    requests: int
    empty_cache_calls: int


@dataclass(frozen=True, kw_only=True)
class SimulationFidelity:
    """Whether the recorded settings, simulated, reproduce the recording event by event."""

    reproduced: bool
    diverged_at_event: int | None  # None: reproduced
    reason: str


@dataclass(frozen=True, kw_only=True)
class ScenarioOom:
    """Where a simulated scenario ran out of memory."""

    event_index: int
    stage: str | None
    requested_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    recorded: bool  # the recording ran out of memory there too


@dataclass(frozen=True, kw_only=True)
class ScenarioRow:
    """One scenario: a setting (None: the recorded ones) on a card (None: the recorded card)."""

    alloc_conf: str | None
    gpu_memory_bytes: int | None
    card: str  # the card in words
    memory_fraction: bool
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    fragmentation_bytes: int
    device_mallocs: int
    device_frees: int
    retries: int
    oom: ScenarioOom | None  # None: it fits
    survives_recorded_oom: bool
    reproduces_recording: bool
    approximate: bool  # the recorded scenario was not reproduced: every figure is approximate
    simulated: bool  # False: the result of an equal scenario (a card above what it ever holds)


@dataclass(frozen=True, kw_only=True)
class WhatIfDocument:
    """The ``snapviz.whatif/1`` document: one recorded run simulated under other settings and cards."""

    schema: Literal["snapviz.whatif/1"]
    source: str
    device: int
    recorded: RecordedRun
    fidelity: SimulationFidelity
    scenarios: list[ScenarioRow]
    smallest_card: list[CardFit]  # on a run with an OOM (else none)
    notes: list[str]
    warnings: list[str] | Absent = ABSENT  # what the text sinks clipped (document.bounded)


# --------------------------------------------------------------------------- compare --whatif


@dataclass(frozen=True, kw_only=True)
class RecordedOom:
    """The recording's own OOM in the twins' table: only its event and reserved bytes are known."""

    event_index: int
    stage: None
    requested_bytes: None
    allocated_bytes: None
    reserved_bytes: int
    recorded: Literal[True]


@dataclass(frozen=True, kw_only=True)
class RecordedTwin:
    """The twins' first row: the recording's own figures, replayed from the trace (not simulated)."""

    label: str
    alloc_conf: None
    simulated: Literal[False]
    approximate: bool
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    fragmentation_bytes: int
    device_mallocs: int
    device_frees: int
    retries: int | None  # run.json's num_alloc_retries (None: not collected)
    oom: RecordedOom | None
    survives_recorded_oom: bool
    peak_reserved_delta_bytes: int


@dataclass(frozen=True, kw_only=True)
class SimulatedTwin:
    """Another setting on the recorded card, simulated."""

    label: str
    simulated: Literal[True]
    alloc_conf: str
    approximate: bool
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    fragmentation_bytes: int
    device_mallocs: int
    device_frees: int
    retries: int
    oom: ScenarioOom | None
    survives_recorded_oom: bool
    peak_reserved_delta_bytes: int  # vs the recorded row


TwinRow: TypeAlias = RecordedTwin | SimulatedTwin


@dataclass(frozen=True, kw_only=True)
class WhatIfTwins:
    """``compare --whatif``: the recorded run beside its simulated twins (the compare document's ``whatif``)."""

    label: str
    source: str
    device: int
    recorded: RecordedRun
    fidelity: SimulationFidelity
    rows: list[TwinRow]
    smallest_card: list[CardFit]
    notes: list[str]
