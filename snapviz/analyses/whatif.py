"""What if: one recorded run re-run through the allocator simulator under other settings and cards.

A *scenario* is an allocator configuration (a ``PYTORCH_CUDA_ALLOC_CONF`` string, or the
recorded settings) and a memory limit (a card's size, the recorded cap, or none). The recorded
scenario is simulated first and compared with the recording event by event
(:func:`snapviz.analyses.simulate.fidelity`): when it is reproduced exactly the other scenarios
are exact simulations of the same requests; when it is not, every figure is marked approximate
and the document says from which event and why the simulation diverged.

The document (:func:`whatif_document`) is ``snapviz.whatif/1``, typed
(:class:`~snapviz.analyses.whatif_document.WhatIfDocument`); every renderer reads only it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from snapviz.analyses.allocator_rules import AllocatorSettings, parse_alloc_conf, settings_from_record
from snapviz.analyses.document import CardFit, FittingSetting, OomSimulation, SimulatedAdvice
from snapviz.analyses.replay import ReplayResult
from snapviz.analyses.simulate import (
    R_ALLOC,
    R_OOM,
    Cap,
    Fidelity,
    RequestStream,
    SimResult,
    fidelity,
    request_stream,
    run,
)
from snapviz.analyses.simulate import run as run_sim
from snapviz.analyses.whatif_document import (
    RecordedOom,
    RecordedRun,
    RecordedTwin,
    ScenarioOom,
    ScenarioRow,
    SimulatedTwin,
    SimulationFidelity,
    TwinRow,
    WhatIfDocument,
    WhatIfTwins,
)
from snapviz.errors import InputError
from snapviz.load import Run
from snapviz.model import A_ALLOC, A_OOM, A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP
from snapviz.units import fmt_bytes
from snapviz.vocab import WHATIF_SCHEMA

GiB = 1 << 30
# The default sweep: the settings PyTorch's documentation and OOM message suggest.
DEFAULT_CONFS: tuple[str, ...] = (
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.8",
)
COMMON_CARDS: tuple[int, ...] = tuple(g * GiB for g in (8, 12, 16, 24, 40, 48, 80))
# The cards the smallest-card answer names (an H200's 141 GiB included); caps are searched in 1 GiB steps.
FIT_CARDS: tuple[int, ...] = (*COMMON_CARDS, 141 * GiB)
CARD_SEARCH_MAX = 4096 * GiB  # a run that does not fit under 4 TiB is answered "not found"


@dataclass(frozen=True)
class Scenario:
    alloc_conf: str | None  # None: the recorded settings
    gpu_memory: int | None  # None: the recorded card (its cap when the run had one, else no limit)
    settings: AllocatorSettings
    cap: Cap

    @property
    def recorded(self) -> bool:
        return self.alloc_conf is None and self.gpu_memory is None


@dataclass
class ScenarioResult:
    scenario: Scenario
    sim: SimResult
    stage_at_oom: str | None
    simulated: bool  # False: shares the result of an equal scenario (a card above what it ever holds)


@dataclass
class WhatIf:
    source: str
    device: int
    recorded_settings: AllocatorSettings
    recorded_cap: Cap
    stream: RequestStream
    fidelity: Fidelity
    recorded_peak_reserved: int
    recorded_peak_allocated: int
    recorded_oom_event: int | None
    recorded_reserved: np.ndarray  # per event
    results: list[ScenarioResult]
    notes: list[str] = field(default_factory=list)
    cards: list[CardFit] = field(default_factory=list)  # on a run with an OOM: the smallest card it fits on
    recorded_fragmentation: int = 0  # reserved - allocated at the recorded reserved peak
    oom_ended_run: bool = False  # the last recorded OOM came after the last allocation


def parse_conf(text: str) -> AllocatorSettings:
    """A ``--alloc-conf`` value as settings; a bad one is an input error (exit 2)."""
    try:
        s = parse_alloc_conf(text)
    except ValueError as exc:
        raise InputError(f"--alloc-conf {text!r}: {exc}") from None
    if s.backend != "native":
        raise InputError(f"--alloc-conf {text!r}: backend {s.backend} does not use the caching allocator")
    return s


def recorded_cap(run: Run) -> Cap:
    """The limit the recorded run had: :func:`cap_from_run_json` of its run.json."""
    return cap_from_run_json(run.run_json)


def simulation_cap(run: Run, rep: ReplayResult) -> Cap:
    """The limit the simulation of the recorded run meets: the recorded cap (:func:`recorded_cap`),
    else, for a history with an ``oom`` entry that says how much the device had free, reserved
    then plus that free memory (what cudaMalloc could still have had: the card's memory left to
    this process; the same cap the OOM report uses). The fidelity check then says whether the
    simulation under it reproduces the recording."""
    cap = recorded_cap(run)
    ev = rep.events
    if cap.limit is not None or not len(ev):
        return cap
    rows = np.flatnonzero(ev["action"].to_numpy() == A_OOM)
    if not len(rows):
        return cap
    row = int(rows[-1])  # the OOM the report explains (oom.explained_oom)
    free = int(ev["device_free"].iat[row])
    return Cap(int(ev["reserved"].iat[row]) + free) if free >= 0 else cap


def cap_from_run_json(run_json: dict[str, Any] | None) -> Cap:
    """The limit a run had (``set_per_process_memory_fraction``), from its run.json:
    ``allocator.cap`` (``fraction`` x ``device_total_bytes`` is the allocator's own
    ``allowed_memory_maximum``; else ``bytes``) or ``memory_limit_bytes``. None: no limit recorded."""
    rj = run_json or {}
    alloc = rj.get("allocator")
    cap = alloc.get("cap") if isinstance(alloc, dict) else None
    if isinstance(cap, dict):
        frac, total, nbytes = (
            _number(cap.get("fraction")),
            _whole(cap.get("device_total_bytes")),
            _whole(cap.get("bytes")),
        )
        if frac is not None and total is not None and 0 < frac <= 1:
            return Cap(int(frac * total), True, total)
        if nbytes is not None and nbytes > 0:
            return Cap(nbytes, True)
    lim = _whole(rj.get("memory_limit_bytes"))
    if lim is not None and lim > 0:
        return Cap(lim, True)
    return Cap()


def _whole(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def scenarios(
    recorded: AllocatorSettings, cap: Cap, confs: list[str] | None, cards: list[int] | None
) -> list[Scenario]:
    """The grid: (recorded settings + ``confs``) x (recorded card + ``cards``); defaults: the sweep.

    ``garbage_collection_threshold`` acts only under a memory fraction, so on a card it is
    simulated as ``set_per_process_memory_fraction(1.0)`` of that card; other settings meet the
    card's capacity as cudaMalloc does.
    """
    conf_list = list(DEFAULT_CONFS) if confs is None else list(dict.fromkeys(confs))
    card_list = list(COMMON_CARDS) if cards is None else list(dict.fromkeys(cards))
    settings: list[tuple[str | None, AllocatorSettings]] = [(None, recorded)]
    settings += [(c, parse_conf(c)) for c in conf_list]
    out = []
    for conf, s in settings:
        out.append(Scenario(conf, None, s, cap))
        out.extend(card_scenario(conf, s, g) for g in card_list)
    return out


def card_scenario(conf: str | None, settings: AllocatorSettings, gpu: int) -> Scenario:
    """``settings`` on a card of ``gpu`` bytes: the card's capacity meets cudaMalloc, and under
    ``garbage_collection_threshold`` (which acts only under a memory fraction) the card is
    ``set_per_process_memory_fraction(1.0)`` of itself."""
    return Scenario(conf, gpu, settings, Cap(gpu, settings.garbage_collection_threshold > 0.0, gpu))


def what_if(
    run: Run,
    *,
    device: int | None = None,
    alloc_confs: list[str] | None = None,
    gpu_memories: list[int] | None = None,
    stage_source: str = "auto",
) -> WhatIf:
    """Simulate ``run``'s requests under every scenario (see the module docstring)."""
    from snapviz.analyses.frame_rules import load_rules  # noqa: PLC0415 - heavy, only here
    from snapviz.analyses.stack_tables import StackTables  # noqa: PLC0415
    from snapviz.analyses.stages import label_events  # noqa: PLC0415
    from snapviz.analyses.summary import pick_device

    snap = run.snapshot
    if snap is None:
        raise InputError(f"{run.source}: what-if needs a memory snapshot (a trace has no allocator requests)")
    rec_settings = settings_from_record(snap.allocator_settings)
    if rec_settings.backend != "native":
        raise InputError(f"{run.source}: recorded with backend {rec_settings.backend}: no caching allocator")
    grid = scenarios(rec_settings, recorded_cap(run), alloc_confs, gpu_memories)  # bad options fail first
    dev, replays, _why = pick_device(run, device)
    rep = replays[dev]
    ev = rep.events
    if not len(ev):
        raise InputError(f"{run.source}: the snapshot has no allocation history to simulate")
    cap = simulation_cap(run, rep)
    grid = scenarios(rec_settings, cap, alloc_confs, gpu_memories)
    actions = ev["action"].to_numpy()
    stream = replay_stream(rep, rec_settings, cap)
    labels = label_events(
        snap, ev, dev, use=stage_source, rules=load_rules(), tables=StackTables(snap), run_json=run.run_json
    ).labels
    notes: list[str] = []
    if not rec_settings.recorded:
        notes.append("the snapshot does not record its allocator settings (torch < 2.3): the defaults are assumed")
    notes.extend(rec_settings.notes)
    from snapviz.analyses.simulate_loop import use_compiled  # noqa: PLC0415

    # the compiled kernel pays its load (about a second) back over the whole sweep, not one scenario
    compiled = use_compiled(len(stream.kind) * len(grid))
    results: list[ScenarioResult] = []
    uncapped: dict[str | None, SimResult] = {}
    fid: Fidelity | None = None
    for sc in grid:
        base = uncapped.get(sc.alloc_conf)
        if base is None and sc.cap.limit is not None:
            base = uncapped[sc.alloc_conf] = run_scenario(stream, replace(sc, cap=Cap()), compiled)
        sim = base if base is not None and _same_as_uncapped(sc, base) else None
        simulated = sim is None
        if sim is None:
            sim = run_scenario(stream, sc, compiled)
            if sc.cap.limit is None:
                uncapped[sc.alloc_conf] = sim
        if sc.recorded:
            fid = fidelity(stream, sim)
        stage = str(labels[sim.oom.event_index]) if sim.oom is not None else None
        results.append(ScenarioResult(sc, sim, stage, simulated))
    assert fid is not None
    oom_rows = np.flatnonzero(actions == A_OOM)
    cards = (
        card_fits(must_fit(stream, int(oom_rows[-1])), rec_settings, compiled, uncapped) if len(oom_rows) else []
    )  # the OOM an analysis explains: the last (oom.explained_oom); a caught one fails no card
    return WhatIf(
        source=run.source,
        device=dev,
        recorded_settings=rec_settings,
        recorded_cap=cap,
        stream=stream,
        fidelity=fid,
        recorded_peak_reserved=rep.peak_reserved,
        recorded_peak_allocated=rep.peak_allocated,
        recorded_oom_event=int(oom_rows[0]) if len(oom_rows) else None,
        recorded_reserved=ev["reserved"].to_numpy(),
        recorded_fragmentation=_fragmentation(ev, stream.event),
        oom_ended_run=bool(len(oom_rows)) and not bool((actions[int(oom_rows[-1]) :] == A_ALLOC).any()),
        results=results,
        notes=notes,
        cards=cards,
    )


def _fragmentation(ev: Any, requests: np.ndarray) -> int:
    """Reserved - allocated at the recorded reserved peak, measured after requests (the trace
    entries ``requests``) as the simulation measures it: a ``segment_alloc`` entry, between the
    cudaMalloc and the block it is for, is no moment of its own."""
    if not len(requests):
        return 0
    res = ev["reserved"].to_numpy()[requests]
    i = int(np.argmax(res))
    return int(res[i]) - int(ev["allocated"].to_numpy()[requests][i])


def replay_stream(rep: ReplayResult, settings: AllocatorSettings, cap: Cap) -> RequestStream:
    """The request stream of one device's replayed events (what every scenario simulates)."""
    ev = rep.events
    return request_stream(
        ev["action"].to_numpy(),
        ev["addr"].to_numpy(),
        ev["size"].to_numpy(),
        ev["stream"].to_numpy(),
        ev["reserved"].to_numpy(),
        settings,
        cap,
        baseline_allocated=rep.baseline_allocated,
        baseline_reserved=rep.baseline_reserved,
        orphan_frees=rep.orphan_frees,
    )


def run_scenario(stream: RequestStream, sc: Scenario, compiled: bool | None = None) -> SimResult:
    """One scenario through the simulator (``compiled``: see :func:`~snapviz.analyses.simulate.run`)."""
    return run(stream, sc.settings, sc.cap, compiled=compiled)


def _same_as_uncapped(sc: Scenario, uncapped: SimResult) -> bool:
    """Whether ``sc`` must behave exactly as the same settings with no limit did: a limit is only
    ever consulted before cudaMalloc (is reserved + the new segment above it?) and, under a memory
    fraction with ``garbage_collection_threshold``, at threshold x limit; a limit above everything
    the uncapped run ever reserved (or its threshold above that) is never met."""
    lim = sc.cap.limit
    if lim is None or uncapped.oom is not None:
        return lim is None
    gc = sc.settings.garbage_collection_threshold if sc.cap.fraction else 0.0
    reach = uncapped.peak_reserved
    return reach <= lim and (gc <= 0.0 or reach <= int(gc * lim))


# --------------------------------------------------------------------------- the document


def _conf_label(conf: str | None) -> str:
    return "recorded settings" if conf is None else conf


def _card_label(w: WhatIf, gpu: int | None) -> str:
    if gpu is not None:
        return fmt_bytes(gpu)
    if w.recorded_cap.limit is not None:
        return f"recorded ({fmt_bytes(w.recorded_cap.limit)} cap)"
    return "recorded (no limit)"


def whatif_document(w: WhatIf) -> WhatIfDocument:
    """The ``snapviz.whatif/1`` document: every renderer's only input."""
    approximate = not w.fidelity.reproduced
    rows = []
    for r in w.results:
        sc, sim = r.scenario, r.sim
        oom = None
        if sim.oom is not None:
            oom = ScenarioOom(
                event_index=sim.oom.event_index,
                stage=r.stage_at_oom,
                requested_bytes=sim.oom.requested_bytes,
                allocated_bytes=sim.oom.allocated_bytes,
                reserved_bytes=sim.oom.reserved_bytes,
                recorded=sim.oom.recorded,
            )
        rows.append(
            ScenarioRow(
                alloc_conf=sc.alloc_conf,
                gpu_memory_bytes=sc.gpu_memory,
                card=_card_label(w, sc.gpu_memory),
                memory_fraction=sc.cap.fraction and sc.cap.limit is not None,
                peak_reserved_bytes=sim.peak_reserved,
                peak_allocated_bytes=sim.peak_allocated,
                fragmentation_bytes=sim.fragmentation,
                device_mallocs=sim.device_mallocs,
                device_frees=sim.device_frees,
                retries=sim.retries,
                oom=oom,
                survives_recorded_oom=sim.survived_recorded_oom is not None,
                reproduces_recording=bool(sc.recorded and w.fidelity.reproduced),
                approximate=approximate,
                simulated=r.simulated,
            )
        )
    f = w.fidelity
    return WhatIfDocument(
        schema=WHATIF_SCHEMA,
        source=w.source,
        device=w.device,
        recorded=RecordedRun(
            alloc_conf=_settings_text(w.recorded_settings),
            gpu_memory_bytes=w.recorded_cap.limit,
            memory_fraction=bool(w.recorded_cap.fraction and w.recorded_cap.limit is not None),
            peak_reserved_bytes=w.recorded_peak_reserved,
            peak_allocated_bytes=w.recorded_peak_allocated,
            oom_event_index=w.recorded_oom_event,
            oom_ended_run=w.oom_ended_run,
            events=w.stream.n_events,
            requests=int(len(w.stream.kind)),
            empty_cache_calls=w.stream.empty_cache_calls,
        ),
        fidelity=SimulationFidelity(reproduced=f.reproduced, diverged_at_event=f.diverged_at, reason=f.reason),
        scenarios=rows,
        smallest_card=list(w.cards),
        notes=list(w.notes),
    )


def _settings_text(s: AllocatorSettings) -> str:
    """The recorded settings in ``PYTORCH_CUDA_ALLOC_CONF`` words ('' for the defaults)."""
    from snapviz.analyses.allocator_rules import DEFAULT_SETTINGS, NO_LIMIT  # noqa: PLC0415

    parts = []
    if s.expandable_segments:
        parts.append("expandable_segments:True")
    if s.max_split_size < NO_LIMIT:
        parts.append(f"max_split_size_mb:{s.max_split_size >> 20}")
    if s.rounds_power2:
        d = s.roundup_divisions
        parts.append(
            f"roundup_power2_divisions:{d[0]}"
            if len(set(d)) == 1
            else "roundup_power2_divisions:[" + ",".join(f"{1 << i}:{v}" for i, v in enumerate(d)) + "]"
        )
    if s.garbage_collection_threshold > 0:
        parts.append(f"garbage_collection_threshold:{s.garbage_collection_threshold:g}")
    if s.large_segment_size != DEFAULT_SETTINGS.large_segment_size:
        parts.append(f"large_segment_size_mb:{s.large_segment_size >> 20}")
    if s.max_non_split_rounding_size != DEFAULT_SETTINGS.max_non_split_rounding_size:
        parts.append(f"max_non_split_rounding_mb:{s.max_non_split_rounding_size >> 20}")
    return ",".join(parts)


# --------------------------------------------------------------------------- compare --whatif


def twin_document(
    w: WhatIf, label: str, recorded_retries: int | None = None, doc: WhatIfDocument | None = None
) -> WhatIfTwins:
    """The recorded run beside its simulated twins (``compare --whatif``; the compare document's
    ``whatif``): one row of the recording's own figures (replayed from the trace, not simulated),
    then one per setting on the recorded card, ``simulated`` and ``approximate`` where the
    simulation did not reproduce the recording, with differences to the recorded row."""
    acts = w.stream.seg_action
    rec_oom = None
    if w.recorded_oom_event is not None:
        i = w.recorded_oom_event
        rec_oom = RecordedOom(
            event_index=i,
            stage=None,
            requested_bytes=None,
            allocated_bytes=None,
            reserved_bytes=int(w.recorded_reserved[i]),
            recorded=True,
        )
    base = w.recorded_peak_reserved
    rows: list[TwinRow] = [
        RecordedTwin(
            label="recorded",
            alloc_conf=None,
            simulated=False,
            approximate=False,
            peak_reserved_bytes=base,
            peak_allocated_bytes=w.recorded_peak_allocated,
            fragmentation_bytes=w.recorded_fragmentation,
            device_mallocs=int(np.isin(acts, (A_SEG_ALLOC, A_SEG_MAP)).sum()),
            device_frees=int(np.isin(acts, (A_SEG_FREE, A_SEG_UNMAP)).sum()),
            retries=recorded_retries,  # not in the trace: run.json's num_alloc_retries when collected
            oom=rec_oom,
            survives_recorded_oom=False,
            peak_reserved_delta_bytes=0,
        )
    ]
    doc = whatif_document(w) if doc is None else doc  # ``doc``: whatif_document(w) where the caller has it
    for sc in doc.scenarios:
        if sc.gpu_memory_bytes is not None or sc.alloc_conf is None:
            continue  # the twins: other settings on the recorded card
        rows.append(
            SimulatedTwin(
                label=f"{sc.alloc_conf} (simulated)",
                simulated=True,
                alloc_conf=sc.alloc_conf,
                approximate=sc.approximate,
                peak_reserved_bytes=sc.peak_reserved_bytes,
                peak_allocated_bytes=sc.peak_allocated_bytes,
                fragmentation_bytes=sc.fragmentation_bytes,
                device_mallocs=sc.device_mallocs,
                device_frees=sc.device_frees,
                retries=sc.retries,
                oom=sc.oom,
                survives_recorded_oom=sc.survives_recorded_oom,
                peak_reserved_delta_bytes=sc.peak_reserved_bytes - base,
            )
        )
    return WhatIfTwins(
        label=label,
        source=w.source,
        device=w.device,
        recorded=doc.recorded,
        fidelity=doc.fidelity,
        rows=rows,
        smallest_card=doc.smallest_card,
        notes=doc.notes,
    )


# --------------------------------------------------------------------------- analyze's advice

ADVICE_CONF = "expandable_segments:True"
ADVICE_MAX_REQUESTS = 2_000_000  # above this analyze does not simulate (whatif does)
ADVICE_MIN_SAVING = 256 << 20  # and at least ADVICE_MIN_FRACTION of the reserved peak
ADVICE_MIN_FRACTION = 0.05


@dataclass
class RecordedSim:
    """The recorded scenario simulated once, for ``analyze``: every simulated claim it makes
    starts here, and only where ``fidelity.reproduced``."""

    stream: RequestStream
    settings: AllocatorSettings
    cap: Cap
    base: SimResult
    fidelity: Fidelity
    compiled: bool
    oom_event: int | None = None  # the explained OOM's trace entry (None: no OOM in the history)
    fit_stream: RequestStream | None = None  # :func:`must_fit` of it (None: no OOM)


def simulate_recorded(run: Run, rep: ReplayResult, oom_event: int | None = None) -> RecordedSim | None:
    """The recorded settings and cap simulated on ``rep``'s requests, with the fidelity check;
    None where analyze does not simulate (no history, another backend, over
    :data:`ADVICE_MAX_REQUESTS` requests). ``oom_event``: the trace entry of the OOM the report
    explains, whose request a fix has to fit (:func:`must_fit`)."""
    from snapviz.analyses.simulate_loop import use_compiled  # noqa: PLC0415 - the kernel loads lazily

    snap = run.snapshot
    if snap is None or not len(rep.events):
        return None
    rec = settings_from_record(snap.allocator_settings)
    if rec.backend != "native":
        return None
    cap = simulation_cap(run, rep)
    stream = replay_stream(rep, rec, cap)
    n = len(stream.kind)
    if not n or n > ADVICE_MAX_REQUESTS:
        return None
    compiled = use_compiled(2 * n)
    base = run_sim(stream, rec, cap, compiled=compiled)
    fit = must_fit(stream, oom_event) if oom_event is not None else None
    return RecordedSim(stream, rec, cap, base, fidelity(stream, base), compiled, oom_event, fit)


def must_fit(stream: RequestStream, oom_event: int) -> RequestStream:
    """``stream`` with the recorded OOM at ``oom_event`` as a request the program needs: it stops
    the simulation where it fails (``SimResult.stopped_at``). Every other recorded OOM stays what
    it was, a request the program went on after when it failed (cuDNN's workspace retries), so a
    fix is judged by the request that failed, not by ones the program already tolerated."""
    kind = stream.kind.copy()
    kind[(stream.event == oom_event) & (kind == R_OOM)] = R_ALLOC
    return replace(stream, kind=kind)  # the settings-free columns (``derived``) do not depend on kind


def fits(sim: SimResult) -> bool:
    """The simulated program ran to its end: no request it needed failed."""
    return sim.stopped_at is None


def allocator_advice(run: Run, rs: RecordedSim | None, fatal_oom: bool) -> SimulatedAdvice | None:
    """``analyze``'s one advice entry from the simulator (``kind: "simulated"``), or None.

    Only where the simulation under the recorded settings and cap reproduces the recording event
    by event (:func:`~snapviz.analyses.simulate.fidelity`) and the stream is small enough to cost
    little (:func:`simulate_recorded`). Simulated: ``expandable_segments:True`` under the recorded
    cap and, for a run that ran out of memory under a memory fraction, the recorded settings on the
    whole card. Kept: the setting when the run ran out of memory and it would not have, or when it
    lowers the reserved peak by at least 5% and 256 MiB; else the whole card when that would have
    fit. ``fatal_oom``: the run ended on an OOM (one it survived, e.g. cuDNN's workspace retries,
    asks for no fix).
    """
    if rs is None or not rs.fidelity.reproduced:
        return None
    stream, rec, cap, base, compiled = rs.stream, rs.settings, rs.cap, rs.base, rs.compiled
    failed = fatal_oom and base.oom is not None  # an OOM the program caught and went on after is no failure
    before = base.peak_reserved
    if not rec.expandable_segments:
        target = rs.fit_stream if failed and rs.fit_stream is not None else stream
        sim = run_sim(target, parse_conf(ADVICE_CONF), cap, compiled=compiled)
        saving = before - sim.peak_reserved
        ok = fits(sim) if target is not stream else sim.oom is None
        if ok and (failed or saving >= max(ADVICE_MIN_SAVING, int(ADVICE_MIN_FRACTION * before))):
            return _advice_entry(f"PYTORCH_CUDA_ALLOC_CONF={ADVICE_CONF}", before, sim, failed, ADVICE_CONF)
    total = _card_total(run)
    if failed and cap.limit is not None and total is not None and total > cap.limit:
        sim = run_sim(stream, rec, Cap(), compiled=compiled)  # the card's capacity is met only above its peak
        if sim.oom is None and sim.peak_reserved <= total:
            return _advice_entry("the whole card (no memory fraction)", before, sim, failed, None)
    return None


# --------------------------------------------------------------------------- what would have fit


def smallest_card(
    stream: RequestStream,
    conf: str | None,
    settings: AllocatorSettings,
    compiled: bool,
    uncapped: SimResult | None = None,
) -> CardFit:
    """The smallest cap, in steps of 1 GiB, on which ``settings`` run ``stream`` to its end
    (:func:`fits`; pass :func:`must_fit` of it so that a recorded OOM's request has to fit), and
    the smallest of :data:`FIT_CARDS` they fit on.

    Bisection between 0 and a cap known to fit (the uncapped reserved peak, rounded up, doubled
    until it fits): the answer fits and 1 GiB less does not, both simulated. A card at or above
    what the uncapped run reserves behaves as no limit and is not simulated again.
    """
    free = uncapped if uncapped is not None else run_sim(stream, settings, Cap(), compiled=compiled)
    seen: dict[int, SimResult] = {}

    def at(gib: int) -> SimResult:
        if gib not in seen:
            sc = card_scenario(conf, settings, gib * GiB)
            seen[gib] = free if _same_as_uncapped(sc, free) else run_scenario(stream, sc, compiled)
        return seen[gib]

    if not fits(free):  # fails with no limit at all: no card helps
        return CardFit(alloc_conf=conf, smallest_bytes=None, common_card_bytes=None, peak_reserved_bytes=None)
    hi = max(1, -(-free.peak_reserved // GiB))
    while not fits(at(hi)):
        if hi * GiB >= CARD_SEARCH_MAX:
            return CardFit(alloc_conf=conf, smallest_bytes=None, common_card_bytes=None, peak_reserved_bytes=None)
        hi *= 2
    lo = 0  # no memory at all fails (the run allocates)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(at(mid)):
            hi = mid
        else:
            lo = mid
    common = next((c for c in FIT_CARDS if c >= hi * GiB and fits(at(c // GiB))), None)
    return CardFit(
        alloc_conf=conf,
        smallest_bytes=hi * GiB,
        common_card_bytes=common,
        peak_reserved_bytes=int(at(hi).peak_reserved),
    )


def card_fits(
    stream: RequestStream,
    recorded: AllocatorSettings,
    compiled: bool,
    uncapped: dict[str | None, SimResult] | None = None,
) -> list[CardFit]:
    """The smallest card under the recorded settings and under ``expandable_segments:True``
    (one entry when the recorded settings already are that). ``uncapped``: results the caller
    already has, by ``alloc_conf``."""
    have = uncapped or {}
    out = [smallest_card(stream, None, recorded, compiled, have.get(None))]
    if not recorded.expandable_segments:
        out.append(smallest_card(stream, ADVICE_CONF, parse_conf(ADVICE_CONF), compiled, have.get(ADVICE_CONF)))
    return out


def card_fit_text(cards: Sequence[CardFit], ended: bool = False) -> str:
    """The smallest cards in words (every sink: analyze's OOM fix line, whatif's report).
    ``ended``: the OOM ended the run, so what the program would have done after it is unknown.
    A card given in its JSON form (the OOM section while the summary builder still holds it as
    JSON) is read as a :class:`CardFit` first."""
    parts = []
    for c in cards:
        who = "the recorded settings" if c.alloc_conf is None else c.alloc_conf
        if c.smallest_bytes is None:
            parts.append(f"none with {who}")
            continue
        common = (
            f"common card {fmt_bytes(c.common_card_bytes)}"
            if c.common_card_bytes is not None
            else "larger than the common cards"
        )
        parts.append(f"{fmt_bytes(c.smallest_bytes)} with {who} ({common})")
    what = "smallest card the recorded requests fit on" if ended else "smallest card it fits on"
    after = "; the program after the OOM was not recorded" if ended else ""
    return f"{what} (simulated, 1 GiB steps{after}): " + ", ".join(parts)


OOM_FIX_MAX_REQUESTS = 500_000  # above this analyze's OOM line does not search settings and cards (~30 simulations)
FIT_CONFS: tuple[str, ...] = (ADVICE_CONF, *(c for c in DEFAULT_CONFS if c != ADVICE_CONF))


def oom_simulation(rs: RecordedSim | None) -> OomSimulation | None:
    """What would have let an OOM's failed request fit, simulated: the summary's ``oom.simulation``.

    ``simulated`` false (with ``why_not`` in a few words and ``reason``) where the simulator does
    not reproduce the recording, the failed request is not in the history, or the stream has over
    :data:`OOM_FIX_MAX_REQUESTS` requests; else ``setting``: the first of :data:`FIT_CONFS`
    (expandable segments first) under which the run goes to its end under the recorded cap, the
    failed request fitting (:func:`must_fit`; None: none; not tried when no cap is recorded), with
    its reserved peak; and ``cards``: :func:`card_fits`. None: not simulated at all (no history,
    too large a stream).
    """
    if rs is None:
        return None
    n = len(rs.stream.kind)
    why_not = (
        ("the simulator did not reproduce this run", rs.fidelity.reason)
        if not rs.fidelity.reproduced
        else ("the failed request is not in the allocation history",) * 2
        if rs.fit_stream is None
        else (f"over {OOM_FIX_MAX_REQUESTS:,} requests: snapviz whatif answers it",) * 2
        if n > OOM_FIX_MAX_REQUESTS
        else None
    )
    if why_not is not None:
        return OomSimulation(
            simulated=False, why_not=why_not[0], reason=why_not[1], setting=None, settings_tried=[], cards=[]
        )
    stream = rs.fit_stream
    assert stream is not None
    setting: FittingSetting | None = None
    tried: list[str] = []
    if rs.cap.limit is not None:
        for conf in FIT_CONFS:
            s = parse_conf(conf)
            if _settings_text(s) == _settings_text(rs.settings):  # the recorded settings: already failed
                continue
            tried.append(conf)
            sim = run_sim(stream, s, rs.cap, compiled=rs.compiled)
            if fits(sim):
                setting = FittingSetting(alloc_conf=conf, peak_reserved_bytes=int(sim.peak_reserved))
                break
    return OomSimulation(
        simulated=True,
        why_not=None,
        reason=rs.fidelity.reason,
        setting=setting,
        settings_tried=tried,
        cards=card_fits(stream, rs.settings, rs.compiled),
    )


def _card_total(run: Run) -> int | None:
    """The card's memory under a recorded memory fraction: ``allocator.cap.device_total_bytes``, else
    the cap's bytes / fraction less 1% (the fraction is a rounded float: never claim the last bytes)."""
    alloc = (run.run_json or {}).get("allocator")
    cap = alloc.get("cap") if isinstance(alloc, dict) else None
    if not isinstance(cap, dict):
        return None
    total = _whole(cap.get("device_total_bytes"))
    if total is not None and total > 0:
        return total
    nbytes, frac = _whole(cap.get("bytes")), _number(cap.get("fraction"))
    if nbytes is not None and frac is not None and 0 < frac < 1 and nbytes > 0:
        return int(nbytes / frac * 0.99)
    return None


def _advice_entry(technique: str, before: int, sim: SimResult, failed: bool, conf: str | None) -> SimulatedAdvice:
    after = sim.peak_reserved
    why = f"reserved peak {fmt_bytes(before)} → {fmt_bytes(after)} (simulated)"
    if failed:
        why += "; the failed request would have fit"
    how = (
        f"export PYTORCH_CUDA_ALLOC_CONF={conf}  (before the first CUDA allocation; "
        "snapviz whatif compares more settings and cards)"
        if conf is not None
        else "drop torch.cuda.set_per_process_memory_fraction (or run on a card that size)"
    )
    return SimulatedAdvice(
        technique=technique,
        why=why,
        saves_up_to_bytes=int(before - after) if after < before else None,
        how=how,
        kind="simulated",
    )
