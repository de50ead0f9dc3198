"""Why did it OOM (issue 21 item 2): the failed request, the state then, and the verdict.

Built with the oracle allocator (tests/support/synth.py), an independent model of the
caching allocator that records an ``oom`` entry when it gives up: the expected numbers are
its own (allocated, reserved, device free), never snapviz's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import synth
from sdrun import _analyse
from snapviz.analyses.document import (
    Advice,
    AnyAdvice,
    FittingSetting,
    Oom,
    OomSimulation,
    SimulatedAdvice,
    Summary,
    from_json,
)
from snapviz.analyses.oom import FRAGMENTED, NOT_DETERMINED, OUT_OF_MEMORY, RULE_OF_THUMB, oom_lines, pick_advice
from snapviz.render.markdown import render_markdown
from snapviz.render.terminal import render_terminal

MiB = 1 << 20


def _fragmented(expandable: bool = False) -> tuple[synth.Sim, int]:
    """Three 20 MiB segments, each with an 8 MiB hole in front of a live 8 MiB block, under a
    64 MiB cap: 24 MiB allocated, 36 MiB free in pieces of at most 8 MiB; 14 MiB fails."""
    a = synth.Sim(capacity=64 * MiB, expandable=expandable)
    pairs = [
        (
            a.alloc(8 * MiB, frames=synth.make_frames(f"front{i}")),
            a.alloc(8 * MiB, frames=synth.make_frames(f"back{i}")),
        )
        for i in range(3)
    ]
    assert a.reserved() == 60 * MiB
    for front, _ in pairs:
        a.free(front)
    with pytest.raises(synth.SimOOM):
        a.alloc(14 * MiB, frames=synth.make_frames("big_request", "/work/model.py", 77))
    return a, 14 * MiB


def test_fragmented_request_is_explained_with_the_oracles_numbers() -> None:
    a, req = _fragmented()
    an, doc = _analyse(a.snapshot())
    oom = doc["oom"]
    assert oom["requested_bytes"] == req
    assert oom["allocated_bytes"] == a.allocated() == 24 * MiB
    assert oom["reserved_bytes"] == a.reserved() == 60 * MiB
    assert oom["cap_bytes"] == 64 * MiB  # reserved + the oom entry's device_free
    assert oom["free_reserved_bytes"] == 36 * MiB
    assert oom["largest_free_block_bytes"] == 8 * MiB
    assert oom["verdict"] == FRAGMENTED
    assert oom["bytes_short"] == req - 8 * MiB
    assert oom["site"] == "/work/model.py:77 big_request"
    # the simulator reproduced the oracle's run under the cap the oom entry shows (reserved + free)
    # and says no setting fits it: the oracle agrees under expandable segments, where the 14 MiB
    # request needs a 20 MiB page beyond the 60 MiB mapped
    sim = oom["simulation"]
    assert sim["simulated"] and sim["setting"] is None and "expandable_segments:True" in sim["settings_tried"]
    _fragmented(expandable=True)  # raises inside: the oracle runs out of memory there too
    assert oom["advice"] is None and "no allocator setting" in oom["fix"] and "(simulated)" in oom["fix"]
    assert "expandable" not in oom["fix"]  # no rule of thumb beside the simulation's answer
    typed = from_json(doc, Summary).oom
    assert isinstance(typed, Oom) and typed.headline == oom["headline"] == oom_lines(typed)[0]
    # every text sink leads with the same sentence
    assert render_terminal(from_json(doc)).splitlines()[0] == oom["headline"]
    assert oom["headline"] in render_markdown(from_json(doc)).split("\n\n")[1]


def test_really_out_of_memory_says_how_much_is_missing() -> None:
    a = synth.Sim(capacity=100 * MiB)
    a.alloc(40 * MiB, frames=synth.make_frames("weights"))
    a.alloc(30 * MiB, frames=synth.make_frames("activations"))
    with pytest.raises(synth.SimOOM):
        a.alloc(50 * MiB, frames=synth.make_frames("too_big"))
    _, doc = _analyse(a.snapshot())
    oom = doc["oom"]
    assert oom["verdict"] == OUT_OF_MEMORY
    assert oom["allocated_bytes"] == 70 * MiB and oom["cap_bytes"] == 100 * MiB
    assert oom["bytes_short"] == 70 * MiB + 50 * MiB - 100 * MiB
    assert sum(s["bytes"] for s in oom["live_sites"]) == 70 * MiB
    assert {c["category"] for c in oom["live_categories"]} and oom["shrink"]["bytes"] <= 70 * MiB
    assert "really out of memory" in oom["verdict_text"] and "20.00 MiB" in oom["verdict_text"]


def test_no_oom_is_null_and_no_cap_is_not_determined() -> None:
    a = synth.Sim(capacity=100 * MiB)
    a.alloc(10 * MiB)
    _, doc = _analyse(a.snapshot())
    assert doc["oom"] is None
    # the collectors' record without a cap (no memory limit, no device_free): not determined
    _, doc = _analyse(a.snapshot(), run={"oom": {"device": 0, "requested_bytes": 200 * MiB, "stage": "denoise"}})
    oom = doc["oom"]
    assert oom["source"] == "run.json" and oom["stage"] == "denoise" and oom["requested_bytes"] == 200 * MiB
    assert oom["verdict"] == NOT_DETERMINED and oom["bytes_short"] is None
    # with the run's memory limit it is decided
    _, doc = _analyse(
        a.snapshot(), run={"memory_limit_bytes": 150 * MiB, "oom": {"device": 0, "requested_bytes": 200 * MiB}}
    )
    assert doc["oom"]["verdict"] == OUT_OF_MEMORY and doc["oom"]["bytes_short"] == 10 * MiB + 200 * MiB - 150 * MiB


def test_the_device_that_failed_is_shown_by_default() -> None:
    a = synth.Sim(devices=2, capacity=100 * MiB)
    a.alloc(90 * MiB, device=0)  # the higher peak
    a.alloc(20 * MiB, device=1)
    with pytest.raises(synth.SimOOM):
        a.alloc(90 * MiB, device=1)
    an, doc = _analyse(a.snapshot())
    assert an.device == 1 and doc["oom"]["device"] == 1
    assert any("ran out of memory" in w for w in doc["warnings"])


def test_another_devices_oom_is_pointed_at() -> None:
    a = synth.Sim(devices=2, capacity=100 * MiB)
    a.alloc(20 * MiB, device=0)
    with pytest.raises(synth.SimOOM):
        a.alloc(200 * MiB, device=1)
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run
    from snapviz.load import Run
    from snapviz.load.snapshot.builder import snapshot_from_dict

    sn = snapshot_from_dict(a.snapshot(), "snap")
    doc = summary_of(analyze_run(Run(source="snap", label="snap", snapshot=sn, trace=None, run_json=None), device=0))
    assert doc["oom"] is None and any("--device 1 explains it" in w for w in doc["warnings"])


def test_a_hostile_site_stays_text_in_every_sink() -> None:
    from snapviz.render.html import render_html

    evil = "<script>alert(1)</script>\x1b[2J|`**"
    a = synth.Sim(capacity=100 * MiB)
    a.alloc(60 * MiB, frames=synth.make_frames("weights"))
    with pytest.raises(synth.SimOOM):
        a.alloc(60 * MiB, frames=synth.make_frames(evil, "/work/evil.py", 1))
    an, doc = _analyse(a.snapshot())
    assert evil in doc["oom"]["site"]
    term, md, html = render_terminal(from_json(doc)), render_markdown(from_json(doc)), render_html(an, from_json(doc))
    assert "\x1b" not in term and "\x1b" not in md and "\x1b[2J" not in html
    assert "<script>alert(1)</script>" not in md.replace("\\<", "<").split("CUDA out of memory", 1)[0]
    assert "<script>alert(1)</script>" not in html


def _oom(verdict: str, short: int | None, simulation: OomSimulation | None = None) -> Oom:
    """A typed OOM section with the facts :func:`pick_advice` reads (the rest plausible)."""
    return Oom(
        source="trace",
        count=1,
        device=0,
        event_index=7,
        survived=False,
        time_us=None,
        requested_bytes=50 * MiB,
        stream=0,
        site=None,
        stack=[],
        stage="denoise",
        allocated_bytes=70 * MiB,
        reserved_bytes=80 * MiB,
        cap_bytes=100 * MiB,
        cap_source="the run's memory limit",
        device_free_bytes=None,
        free_reserved_bytes=10 * MiB,
        largest_free_block_bytes=4 * MiB,
        verdict=verdict,
        bytes_short=short,
        live_categories=[],
        live_sites=[],
        shrink=None,
        advice=None,
        simulation=simulation,
        headline="",
        state="",
        verdict_text="",
        fix=None,
    )


def _advice(technique: str, saves: int | None) -> Advice:
    return Advice(technique=technique, why="", saves_up_to_bytes=saves, how="")


def test_pick_advice_takes_the_first_typed_entry_that_frees_the_shortfall() -> None:
    """Simulated entries are never the fix line's pick (the simulation answers for them); an
    entry that saves less than the shortfall (or an unknown amount) is passed over."""
    entries: list[AnyAdvice] = [
        SimulatedAdvice(
            technique="PYTORCH_CUDA_ALLOC_CONF=x", why="", saves_up_to_bytes=1 << 40, how="", kind="simulated"
        ),
        _advice("too little", 19 * MiB),
        _advice("unknown", None),
        _advice("enough", 20 * MiB),
        _advice("also enough", 30 * MiB),
    ]
    assert pick_advice(_oom(OUT_OF_MEMORY, 20 * MiB), entries) == "enough"
    assert pick_advice(_oom(OUT_OF_MEMORY, 21 * MiB), entries) == "also enough"
    assert pick_advice(_oom(OUT_OF_MEMORY, 31 * MiB), entries) is None
    assert pick_advice(_oom(NOT_DETERMINED, None), entries) is None
    # fragmented, not simulated: the rule of thumb; simulated and a setting fits: that setting
    assert pick_advice(_oom(FRAGMENTED, 4 * MiB), entries) == RULE_OF_THUMB
    fits = OomSimulation(
        simulated=True, why_not=None, reason="", setting=None, settings_tried=["expandable_segments:True"], cards=[]
    )
    with_setting = replace(
        fits, setting=FittingSetting(alloc_conf="garbage_collection_threshold:0.6", peak_reserved_bytes=1)
    )
    assert pick_advice(_oom(FRAGMENTED, 4 * MiB, with_setting), entries) == (
        "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6"
    )
    # simulated, no setting fits: never the expandable-segments rule of thumb beside that answer
    expandable: list[AnyAdvice] = [_advice("expandable segments", 1 << 40), _advice("enough", 20 * MiB)]
    assert pick_advice(_oom(OUT_OF_MEMORY, 20 * MiB, fits), expandable) == "enough"
    assert pick_advice(_oom(OUT_OF_MEMORY, 20 * MiB), expandable) == "expandable segments"
