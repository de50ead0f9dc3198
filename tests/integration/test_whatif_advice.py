"""``analyze``'s simulated allocator advice: present, with the simulator's own figures, only where
the simulator reproduced the recording; absent (no claim) where it did not."""

from __future__ import annotations

import html as html_lib
import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

import synth
from paths import SAMPLES
from snapviz.analyses.document import Oom, OomSimulation, Summary, from_json
from snapviz.analyses.oom import FRAGMENTED, oom_card, oom_fix, oom_fix_short, pick_advice
from snapviz.analyses.summary import analyze_run
from snapviz.analyses.whatif import ADVICE_CONF, FIT_CARDS, what_if
from snapviz.cli import main
from snapviz.load import load
from snapviz.render.picture import picture_data
from snapviz.render.terminal import render_terminal as terminal_text
from snapviz.safe_text import md_text
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


def test_no_simulated_advice_where_the_simulator_is_not_exact(tmp_path: Path) -> None:
    # every bundled sample is reproduced now: a recording that started late (memory in use before it
    # began, where it lay unknown) is one the simulator cannot check
    model = synth.random_workload(5, n_ops=500, record_from=0.5)
    snap = tmp_path / "late.pickle"
    snap.write_bytes(pickle.dumps(model.snapshot(marker=False)))
    run = load(str(snap))
    w = what_if(run, alloc_confs=[], gpu_memories=[])
    assert not w.fidelity.reproduced  # the premise: a run the simulator does not reproduce
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


# --------------------------------------------------------------- the OOM's fix line (issue 23)

GiB = 1 << 30


def _scenarios(run, conf: str | None, cards: list[int]) -> dict:
    w = what_if(run, alloc_confs=[conf] if conf else [], gpu_memories=cards)
    assert w.fidelity.reproduced
    return {r.scenario.gpu_memory: r.sim for r in w.results if r.scenario.alloc_conf == conf}


def test_oom_fix_line_names_the_setting_and_the_card_the_simulation_fits(tmp_path: Path) -> None:
    run = load(SAMPLES / "sdxl-fp16-oom-10gb")
    an = analyze_run(run)
    doc = an.summary()
    oom = doc["oom"]
    sim = oom["simulation"]
    assert sim["simulated"] and sim["setting"]["alloc_conf"] == ADVICE_CONF
    # whatif's driver, on its own: the setting under the recorded cap fits, with that reserved peak
    alt = _scenarios(run, ADVICE_CONF, [])[None]
    assert alt.oom is None and alt.peak_reserved == sim["setting"]["peak_reserved_bytes"]
    assert oom["advice"] == f"PYTORCH_CUDA_ALLOC_CONF={ADVICE_CONF}"
    assert f"{oom['advice']} (simulated: " in oom["fix"] and fmt_bytes(alt.peak_reserved) in oom["fix"]
    # the smallest cards: fit there and not 1 GiB below; the common card is the first of the list that fits
    assert [c["alloc_conf"] for c in sim["cards"]] == [None, ADVICE_CONF]
    for c in sim["cards"]:
        g, common = c["smallest_bytes"], c["common_card_bytes"]
        by = _scenarios(run, c["alloc_conf"], [g - GiB, g, *FIT_CARDS])
        assert by[g].oom is None and by[g - GiB].oom is not None
        assert by[g].peak_reserved == c["peak_reserved_bytes"]
        assert common == min(k for k in FIT_CARDS if k >= g and by[k].oom is None)
        assert fmt_bytes(g) in oom["card"]
    # the OOM ended the run: the answer is about the recorded requests, and says so
    assert oom["card"].startswith("smallest card the recorded requests fit on (simulated, 1 GiB steps; the program")
    assert "(simulated: the recorded requests fit under the same cap" in oom["fix"]
    # every sink says the same lines: terminal, Markdown, JSON, HTML; the picture its short form
    js, md, html = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "r.html"
    with pytest.raises(SystemExit) as exc:
        main(
            ["analyze", str(SAMPLES / "sdxl-fp16-oom-10gb"), "--json", str(js), "--markdown", str(md), "-o", str(html)]
        )
    assert exc.value.code == 0
    page = html.read_text()
    got = json.loads(js.read_text())["oom"]
    assert (got["fix"], got["card"], got["simulation"]) == (oom["fix"], oom["card"], oom["simulation"])
    term = terminal_text(from_json(doc))
    assert oom["fix"] in term and oom["card"] in term
    assert f"- {md_text(oom['fix'])}" in md.read_text() and f"- {md_text(oom['card'])}" in md.read_text()
    assert html_lib.escape(oom["card"], quote=False) in page and html_lib.escape(oom["fix"], quote=False) in page
    title = picture_data(an, from_json(doc))["title"]
    typed = from_json(doc, Summary).oom
    assert isinstance(typed, Oom)
    assert title[-1] == oom_fix_short(typed) and "expandable_segments:True (simulated)" in title[-1]


def test_oom_no_setting_fits_says_so_and_checks_with_whatif() -> None:
    run = load(SAMPLES / "sd15-fp16-alloc-cap-oom")
    doc = analyze_run(run).summary()
    oom = doc["oom"]
    sim = oom["simulation"]
    assert sim["simulated"] and sim["setting"] is None and len(sim["settings_tried"]) == 9
    w = what_if(run, alloc_confs=sim["settings_tried"], gpu_memories=[])
    assert all(r.sim.oom is not None for r in w.results)  # whatif's table: every one of them fails too
    assert "no allocator setting" in oom["fix"] and "(simulated)" in oom["fix"]
    assert "expandable" not in oom["fix"]
    # the 80 OOMs cuDNN caught before do not count against a card: it fits on a few GiB
    rec = sim["cards"][0]
    assert rec["alloc_conf"] is None and rec["smallest_bytes"] <= 4 * GiB


def test_oom_not_reproduced_keeps_the_rule_of_thumb_and_says_not_simulated() -> None:
    oom = Oom(
        source="trace",
        count=1,
        device=0,
        event_index=3,
        survived=False,
        time_us=None,
        requested_bytes=9 << 20,
        stream=0,
        site=None,
        stack=[],
        stage="x",
        allocated_bytes=20 << 20,
        reserved_bytes=40 << 20,
        cap_bytes=None,
        cap_source=None,
        device_free_bytes=None,
        free_reserved_bytes=20 << 20,
        largest_free_block_bytes=8 << 20,
        verdict=FRAGMENTED,
        bytes_short=1 << 20,
        live_categories=[],
        live_sites=[],
        shrink=None,
        advice=None,
        simulation=OomSimulation(
            simulated=False, why_not=None, reason="from event 3: ...", setting=None, settings_tried=[], cards=[]
        ),
        headline="",
        state="",
        verdict_text="",
        fix=None,
    )
    oom = replace(oom, advice=pick_advice(oom, []))
    assert oom.advice == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    fix = oom_fix(oom)
    assert fix is not None and "not simulated: the simulator did not reproduce this run" in fix
    assert oom_card(oom) is None and "(not simulated)" in str(oom_fix_short(oom))


def test_oom_line_on_a_large_stream_is_not_simulated_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import snapviz.analyses.whatif as whatif_mod

    monkeypatch.setattr(whatif_mod, "OOM_FIX_MAX_REQUESTS", 1000)  # gpt2-train-varlen-cap-oom has 5,673
    oom = analyze_run(load(SAMPLES / "gpt2-train-varlen-cap-oom")).summary()["oom"]
    sim = oom["simulation"]
    assert sim["simulated"] is False and sim["why_not"] == "over 1,000 requests: snapviz whatif answers it"
    assert oom["verdict"] == FRAGMENTED and oom["card"] is None
    assert "not simulated: over 1,000 requests" in oom["fix"]
