"""End-state snapshots as first-class input, and saying what was not recorded (issue 21
items 3 and 4). Snapshots come from the oracle allocator (tests/support/synth.py); the end
state is what torch keeps with ``_record_memory_history(enabled="state")`` (live blocks with
frames, no trace), in the 2.11 and the torch 2.0 (``history``) layouts."""

from __future__ import annotations

from typing import Any

import pytest

import synth
from sdrun import _analyse
from snapviz.analyses.document import from_json
from snapviz.render.html import render_html
from snapviz.render.markdown import render_markdown
from snapviz.render.terminal import render_terminal
from snapviz.vocab import BEFORE_RECORDING, END_STATE, END_STATE_ONLY

MiB = 1 << 20


def _program() -> tuple[synth.Sim, dict[str, int]]:
    """Weights and a KV cache live at the end, with frames; a temporary freed before it."""
    a = synth.Sim()
    sizes = {"load_weights": 96 * MiB, "kv_cache": 40 * MiB}
    a.alloc(sizes["load_weights"], frames=synth.make_frames("load_weights", "/work/model.py", 10))
    a.free(a.alloc(64 * MiB, frames=synth.make_frames("temporary", "/work/model.py", 20)))
    a.alloc(sizes["kv_cache"], frames=synth.make_frames("kv_cache", "/work/cache.py", 30))
    a.alloc(3000, frames=synth.make_frames("small", "/work/cache.py", 40))
    return a, sizes


def _state_only(snap: dict[str, Any]) -> dict[str, Any]:
    snap["device_traces"] = [[] for _ in snap["device_traces"]]  # enabled="state": no history
    return snap


def _sinks(an: Any, doc: dict[str, Any]) -> dict[str, str]:
    return {
        "terminal": render_terminal(from_json(doc)),
        "markdown": render_markdown(from_json(doc)),
        "html": render_html(an, from_json(doc)),
    }


@pytest.mark.parametrize("layout", ["dict", "history"])
def test_end_state_only_is_itemised_by_its_frames(layout: str) -> None:
    a, sizes = _program()
    an, doc = _analyse(_state_only(a.snapshot(layout=layout)))
    live = sum(a.live_blocks().values())
    assert doc["peak"]["allocated_bytes"] == live and doc["peak"]["stage"] == END_STATE
    top = doc["top_allocations"]
    assert [t["site"] for t in top[:2]] == ["/work/model.py:10 load_weights", "/work/cache.py:30 kv_cache"]
    assert [t["bytes"] for t in top[:2]] == [sizes["load_weights"], sizes["kv_cache"]]
    assert all(t["event_index"] is None for t in top)
    assert sum(c["bytes"] for c in doc["categories"]) == live
    assert BEFORE_RECORDING not in {c["category"] for c in doc["categories"]}
    es = doc["end_state"]
    assert es["only"] and es["note"] == END_STATE_ONLY and es["live_bytes"] == live
    assert es["pools"] == [
        {"pool": "0,0", "name": "default pool", "segments": 3, "reserved_bytes": a.reserved(), "allocated_bytes": live}
    ]
    assert any(w.startswith(END_STATE_ONLY) for w in doc["warnings"])
    for sink, text in _sinks(an, doc).items():
        assert END_STATE_ONLY in text, sink
        assert "within the recorded window" not in text and "before the recorded history began" not in text, sink
    assert render_terminal(from_json(doc)).splitlines()[1].startswith("  live allocated")


def test_private_pool_is_named() -> None:
    a, _ = _program()
    snap = _state_only(a.snapshot())
    snap["segments"][0]["segment_pool_id"] = (0, 1)  # a CUDA graph's / MemPool's private pool
    _, doc = _analyse(snap)
    names = {p["name"] for p in doc["end_state"]["pools"]}
    assert names == {"default pool", "private pool (0, 1)"}
    assert any("private pool (0, 1)" in w for w in doc["warnings"])


def test_memory_from_before_recording_is_itemised_where_it_kept_frames() -> None:
    a, sizes = _program()
    snap = a.snapshot()
    trace = snap["device_traces"][0]
    # the recording started late: the weights' segment and alloc are not in the history
    first = next(i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == sizes["load_weights"])
    snap["device_traces"][0] = trace[first + 1 :]
    an, doc = _analyse(snap)
    assert an.replay.baseline_allocated == sizes["load_weights"]
    pre = doc["end_state"]["before_recording"]
    assert pre["bytes"] == pre["itemised_bytes"] == sizes["load_weights"]
    assert pre["sites"][0]["site"] == "/work/model.py:10 load_weights"
    cats = {c["category"]: c["bytes"] for c in doc["categories"]}
    assert BEFORE_RECORDING not in cats
    assert sum(b for c, b in cats.items() if c.startswith(BEFORE_RECORDING + ": ")) == sizes["load_weights"]
    assert sum(cats.values()) == doc["peak"]["allocated_bytes"]
    assert "load_weights" in render_terminal(from_json(doc)) and "load_weights" in render_markdown(from_json(doc))


def test_an_empty_snapshot_says_nothing_was_recorded() -> None:
    an, doc = _analyse({"segments": [], "device_traces": [[]]})
    note = doc["not_recorded"]
    assert note and note.startswith("nothing was recorded") and note in doc["warnings"]
    assert doc["peak"]["stage"] is None
    for sink, text in _sinks(an, doc).items():
        assert "nothing was recorded" in text, sink
    term = render_terminal(from_json(doc))
    assert " 0 B" not in term and "peak" not in term.split("\n", 1)[1].split("nothing")[0]
    assert "0 B" not in render_markdown(from_json(doc))
