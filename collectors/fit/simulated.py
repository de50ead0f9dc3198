"""Cells of the fit table decided by the allocator simulator instead of a run.

A combination that completed under a larger card's cap with memory history recorded (``--history``:
its run directory holds ``snapshot.pickle``) is the same program on a smaller card, allocation for
allocation, until the smaller cap is met. Where ``snapviz whatif``'s simulator reproduces that run
event by event under its own cap (the fidelity check), it decides the smaller card: fits (the
simulated reserved peak stays under the cap, or the cap's retries free enough) or out of memory (at
which event, stage and request). Where it does not reproduce the run, or no snapshot was recorded,
the cell is measured (run) as before. Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.matrix.runner import VariantResult

from .plan import Card


@dataclass(frozen=True)
class Simulated:
    """A card's cell decided by the simulator from a larger card's recording."""

    fits: bool
    reason: str  # says "simulated", from which run, and what happened
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    source_run_dir: str


def simulate_card(res: VariantResult, source: Card, card: Card) -> Simulated | None:
    """``res`` (a completed run under ``source``'s cap) simulated under ``card``'s cap, or None
    when the simulator cannot decide (no snapshot, or the simulation does not reproduce the run)."""
    from snapviz.analyses.whatif import what_if  # noqa: PLC0415 - the analyzer only when simulating
    from snapviz.errors import InputError  # noqa: PLC0415
    from snapviz.load import load  # noqa: PLC0415
    from snapviz.units import fmt_bytes  # noqa: PLC0415

    if not (res.run_dir / "snapshot.pickle").is_file():
        return None
    try:
        w = what_if(load(str(res.run_dir)), alloc_confs=[], gpu_memories=[card.bytes])
    except InputError:
        return None
    if not w.fidelity.reproduced:
        return None
    r = next(r for r in w.results if r.scenario.alloc_conf is None and r.scenario.gpu_memory == card.bytes)
    sim = r.sim
    src = f"simulated from the {source.label} run's snapshot"
    if sim.stopped_at is None:
        why = f"{src}: reserved peak {fmt_bytes(sim.peak_reserved)} under the {card.label} cap"
        return Simulated(True, why, sim.peak_allocated, sim.peak_reserved, str(res.run_dir))
    assert sim.oom is not None
    stage = f" in {r.stage_at_oom}" if r.stage_at_oom else ""
    why = (
        f"{src}: out of memory at event {sim.oom.event_index:,}{stage} (a {fmt_bytes(sim.oom.requested_bytes)} "
        f"request with {fmt_bytes(sim.oom.allocated_bytes)} allocated, {fmt_bytes(sim.oom.reserved_bytes)} reserved)"
    )
    return Simulated(False, why, sim.peak_allocated, sim.peak_reserved, str(res.run_dir))
