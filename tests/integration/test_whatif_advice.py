"""``analyze``'s simulated allocator advice: present, with the simulator's own figures, only where
the simulator reproduced the recording; absent (no claim) where it did not."""

from __future__ import annotations

from paths import SAMPLES

from snapviz.analyses.summary import analyze_run
from snapviz.analyses.whatif import ADVICE_CONF, what_if
from snapviz.load import load
from snapviz.units import fmt_bytes


def _simulated(doc: dict) -> list[dict]:
    return [a for a in doc["advice"] if a.get("kind") == "simulated"]


def test_fragmented_oom_gets_expandable_segments_verified_by_the_simulator() -> None:
    run = load(SAMPLES / "sdxl-fp16-oom-10gb")
    doc = analyze_run(run).summary()
    assert doc["oom"] is not None
    # the simulator's own answer, through whatif's driver: reproduced, and the setting survives the cap
    w = what_if(run, alloc_confs=[ADVICE_CONF], gpu_memories=[])
    assert w.fidelity.reproduced
    rec = next(r for r in w.results if r.scenario.recorded)
    alt = next(r for r in w.results if r.scenario.alloc_conf == ADVICE_CONF and r.scenario.gpu_memory is None)
    assert rec.sim.oom is not None and alt.sim.oom is None
    (entry,) = _simulated(doc)
    assert entry["technique"] == f"PYTORCH_CUDA_ALLOC_CONF={ADVICE_CONF}"
    before, after = rec.sim.peak_reserved, alt.sim.peak_reserved
    assert before == doc["peak"]["reserved_bytes"]
    assert f"reserved peak {fmt_bytes(before)} → {fmt_bytes(after)} (simulated)" in entry["why"]
    assert entry["why"].endswith("the failed request would have fit")
    assert entry["saves_up_to_bytes"] == (before - after if after < before else None)


def test_no_simulated_advice_where_the_simulator_is_not_exact() -> None:
    run = load(SAMPLES / "gpt2-train-varlen-cap-expandable")
    w = what_if(run, alloc_confs=[], gpu_memories=[])
    assert not w.fidelity.reproduced  # the premise: this sample is one the simulator does not reproduce
    doc = analyze_run(run).summary()
    assert _simulated(doc) == []
    assert not any("simulated" in str(a.get("why", "")) for a in doc["advice"])


def test_a_run_already_on_expandable_segments_gets_no_setting() -> None:
    # sd15-fp16-alloc-expandable already runs with expandable segments and did not run out of memory:
    # nothing to suggest, whatever the simulator says
    doc = analyze_run(load(SAMPLES / "sd15-fp16-alloc-expandable")).summary()
    assert _simulated(doc) == []


def test_capped_oom_where_no_setting_fits_names_the_whole_card() -> None:
    run = load(SAMPLES / "sd15-fp16-alloc-cap-oom")
    doc = analyze_run(run).summary()
    assert doc["oom"] is not None and not doc["oom"]["survived"]
    w = what_if(run, alloc_confs=[ADVICE_CONF], gpu_memories=[])
    assert w.fidelity.reproduced
    alt = next(r for r in w.results if r.scenario.alloc_conf == ADVICE_CONF and r.scenario.gpu_memory is None)
    assert alt.sim.oom is not None  # the setting alone does not fit under the cap
    (entry,) = _simulated(doc)
    assert entry["technique"] == "the whole card (no memory fraction)"
    assert entry["why"].endswith("(simulated); the failed request would have fit")


def test_survived_ooms_ask_for_no_card() -> None:
    doc = analyze_run(load(SAMPLES / "sd15-fp16-alloc-cap102")).summary()
    assert doc["oom"] is not None and doc["oom"]["survived"]
    assert not any(a.get("technique") == "the whole card (no memory fraction)" for a in _simulated(doc))
