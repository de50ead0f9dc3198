"""The columnar model: what ``snapshot_from_dict`` makes of every snapshot layout."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import synth
from snapviz.load import load, load_snapshot
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.model import A_FREE, A_OOM, A_OTHER, ACTION_CODE, ACTIONS, Snapshot
from synth import MiB, Sim, make_frames, random_workload


def model(d: Any) -> Snapshot:
    return snapshot_from_dict(d, source="<test>")


def entry(action: str = "alloc", addr: int = 0x7F0000000000, size: int = 1280, **kw: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": 1_796_000_000_000_000,
        "compile_context": "N/A",
        "user_metadata": "",
    }
    e.update(kw)
    return e


# ---------------------------------------------------------------- trace entries as columns


def test_columns_match_the_dict_exactly(small_snapshot: dict[str, Any]) -> None:
    snap = model(small_snapshot)
    tr = small_snapshot["device_traces"][0]
    ev = snap.events
    assert len(ev) == len(tr)
    assert ev["addr"].tolist() == [e["addr"] for e in tr]
    assert ev["size"].tolist() == [e["size"] for e in tr]
    assert ev["stream"].tolist() == [e["stream"] for e in tr]
    assert ev["time_us"].tolist() == [e["time_us"] for e in tr]
    assert [ACTIONS[a] for a in ev["action"].tolist()] == [e["action"] for e in tr]
    assert [snap.strings[i] for i in ev["metadata_id"].tolist()] == [e["user_metadata"] for e in tr]
    assert [snap.strings[i] for i in ev["compile_id"].tolist()] == [e["compile_context"] for e in tr]
    assert ev["idx"].tolist() == list(range(len(tr)))
    assert (ev["device"] == 0).all()
    assert ev["time_us"].is_monotonic_increasing
    assert snap.allocator_settings == small_snapshot["allocator_settings"]


def test_frames_interned_by_identity_and_value() -> None:
    shared = make_frames("baddbmm", "/work/attn.py", 621)
    equal_copy = copy.deepcopy(shared)  # same values, another list object
    other = make_frames("conv2d", "/work/resnet.py", 88)
    d = {
        "segments": [],
        "device_traces": [
            [
                entry(addr=1, frames=shared),
                entry(addr=2, frames=shared),
                entry(addr=3, frames=other),
                entry(addr=4, frames=shared),
                entry(addr=5, frames=equal_copy),
            ]
        ],
    }
    before = copy.deepcopy(d)
    # pickle keeps the sharing (memo); the loader sees one list object for entries 1, 2, 4
    d2 = pickle.loads(pickle.dumps(d, protocol=4))
    tr = d2["device_traces"][0]
    assert tr[0]["frames"] is tr[1]["frames"] is tr[3]["frames"] and tr[4]["frames"] is not tr[0]["frames"]
    snap = model(d2)
    sid = snap.events["stack_id"].tolist()
    assert sid[0] == sid[1] == sid[3] == sid[4] != sid[2]
    assert len(snap.stacks) == 2
    # frames are interned once each (the two stacks share their outer frames)
    names = snap.frames["name"].tolist()
    assert len(names) == len(set(zip(names, snap.frames["filename"], snap.frames["line"])))
    assert d == before, "the loader must never mutate the (shared) frame lists"


def test_stack_is_innermost_first() -> None:
    fr = make_frames("get_attention_scores", "/site-packages/diffusers/models/attention_processor.py", 621, depth=5)
    snap = model({"segments": [], "device_traces": [[entry(frames=fr)]]})
    st = snap.stack(int(snap.events["stack_id"].iloc[0]))
    assert st == [{"name": f["name"], "filename": f["filename"], "line": f["line"]} for f in fr]
    assert st[0]["name"] == "get_attention_scores" and st[-1]["name"] == "<module>"
    sf = snap.stack_frames[snap.stack_frames["stack_id"] == snap.events["stack_id"].iloc[0]]
    assert sf["depth"].tolist() == list(range(len(fr)))


def test_cpp_frames_interleaved_are_kept_in_order() -> None:
    fr = make_frames("op", cpp=True)
    snap = model({"segments": [], "device_traces": [[entry(frames=fr)]]})
    st = snap.stack(int(snap.events["stack_id"].iloc[0]))
    assert [f["filename"] for f in st][:2] == ["??", ""] and st[0]["line"] == 0
    assert len(st) == len(fr)


def test_missing_or_empty_frames_are_minus_one() -> None:
    e_missing = entry(addr=1)
    e_empty = entry(addr=2, frames=[])
    e_none = entry(addr=3, frames=None)
    e_with = entry(addr=4, frames=make_frames("x"))
    snap = model({"segments": [], "device_traces": [[e_missing, e_empty, e_none, e_with]]})
    assert snap.events["stack_id"].tolist()[:3] == [-1, -1, -1]
    assert snap.events["stack_id"].iloc[3] >= 0
    assert snap.stack(-1) == [] and snap.stack(10_000) == []


def test_unknown_keys_and_newer_fields_ignored() -> None:
    e = entry(
        frames=make_frames("x"),
        pool_id=(0, 1),
        internal_metadata={"k": "v"},
        forward_frames=["a", "b"],
        something_new=[1, 2, 3],
    )
    seg = {
        "device": 0,
        "address": 4096,
        "total_size": 2 * MiB,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "registration_counter": 7,
        "new_field": {"x": 1},
        "blocks": [
            {
                "address": 4096,
                "size": 2 * MiB,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
                "gc_counter": 3,
                "new_block_field": None,
            }
        ],
    }
    d = {
        "segments": [seg],
        "device_traces": [[e]],
        "allocator_settings": {"expandable_segments": False},
        "external_annotations": [],
        "future_top_level_key": {"a": [1, 2]},
    }
    snap = model(d)
    assert len(snap.events) == 1 and len(snap.segments) == 1 and len(snap.blocks) == 1
    assert ACTIONS[int(snap.events["action"].iloc[0])] == "alloc"


def test_pending_state_spellings_normalised() -> None:
    def seg(state: str) -> dict[str, Any]:
        return {
            "device": 0,
            "address": 0x1000000,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "blocks": [
                {"size": 1 * MiB, "requested_size": 1000, "state": state, "frames": []},
                {"size": 1 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        }

    for spelling in ("active_pending_free", "active_awaiting_free"):
        snap = model({"segments": [seg(spelling)], "device_traces": []})
        assert snap.blocks["state"].tolist() == ["active_pending_free", "inactive"]
        assert snap.blocks["address"].tolist() == [0x1000000, 0x1000000 + MiB]  # computed when absent


def test_pool_ids_tolerated() -> None:
    segs = [
        {
            "device": 0,
            "address": a,
            "total_size": 2 * MiB,
            "stream": 0,
            "segment_type": "small",
            "blocks": [],
            **({"segment_pool_id": p} if p is not None else {}),
        }
        for a, p in ((0x1000000, (0, 1)), (0x2000000, None), (0x3000000, (1, 0)), (0x4000000, [2, 7]))
    ]
    snap = model({"segments": segs, "device_traces": [[entry(pool_id=(2, 7))]]})
    assert snap.segments["pool_id"].tolist() == ["0,1", "0,0", "1,0", "2,7"]


def test_oom_entry_without_addr() -> None:
    oom = {
        "action": "oom",
        "device_free": 149230321664,
        "size": 429496729600,
        "stream": 0,
        "time_us": 1796003368257622,
        "compile_context": "N/A",
        "user_metadata": "",
        "frames": make_frames("f"),
    }
    snap = model({"segments": [], "device_traces": [[entry(), oom]]})
    ev = snap.events
    assert ev["action"].tolist()[1] == A_OOM
    assert ev["device_free"].tolist() == [-1, 149230321664]
    assert int(ev["size"].iloc[1]) == 429496729600


def test_oom_from_the_model_allocator() -> None:
    sim = Sim(capacity=64 * MiB)
    sim.alloc(40 * MiB)
    with pytest.raises(synth.SimOOM):
        sim.alloc(40 * MiB)
    snap = model(sim.snapshot(marker=False))
    oom = snap.events[snap.events["action"] == A_OOM]
    assert len(oom) == 1 and int(oom["device_free"].iloc[0]) == 64 * MiB - 40 * MiB
    assert int(oom["size"].iloc[0]) == 40 * MiB


def test_older_torch_without_time_metadata_or_frames() -> None:
    sim = random_workload(5, 300)
    d = sim.snapshot(omit=("time_us", "user_metadata", "compile_context", "frames"), settings=False, annotations=False)
    snap = model(d)
    assert (snap.events["time_us"] == -1).all()
    assert (snap.events["metadata_id"] == 0).all() and (snap.events["stack_id"] == -1).all()
    assert any("time_us" in n for n in snap.format_notes)
    assert snap.allocator_settings == {} and len(snap.annotations) == 0


def test_labels_and_annotations() -> None:
    sim = Sim()
    with sim.stage("text_encode"):
        a = sim.alloc(77 * 768 * 2)
    with sim.stage("denoise/0"):
        b = sim.alloc(3 * MiB)
        sim.free(a)
    sim.free(b, label="vae_decode")
    snap = model(sim.snapshot(marker=False))
    labels = [snap.strings[i] for i in snap.events["metadata_id"].tolist()]
    assert labels[0] == "text_encode" and labels[-1] == "vae_decode" and "denoise/0" in labels
    ann = snap.annotations
    assert ann["name"].tolist() == ["text_encode", "text_encode", "denoise/0", "denoise/0"]
    assert ann["stage"].tolist() == ["START", "END", "START", "END"]
    assert ann["time_us"].is_monotonic_increasing


# ---------------------------------------------------------------- segments and blocks


def test_segments_and_blocks_from_the_model_allocator() -> None:
    sim = random_workload(11, 600, streams=2, delayed_frees=True)
    d = sim.snapshot(marker=False)
    snap = model(d)
    assert len(snap.segments) == len(d["segments"])
    assert len(snap.blocks) == sum(len(s["blocks"]) for s in d["segments"])
    assert snap.segments["total_size"].sum() == sim.reserved()
    live = snap.blocks[snap.blocks["state"] == "active_allocated"]
    assert dict(zip(live["address"], live["size"])) == sim.live_blocks()
    # blocks tile their segment exactly
    for si, seg in snap.segments.iterrows():
        blk = snap.blocks[snap.blocks["segment"] == si]
        assert int(blk["size"].sum()) == int(seg["total_size"])
        assert blk["address"].tolist()[0] == seg["address"]
        assert (np.diff(blk["address"].to_numpy()) == blk["size"].to_numpy()[:-1]).all()
    # active blocks carry their alloc stack; inactive ones none
    assert (live["stack_id"] >= 0).all()
    assert (snap.blocks.loc[snap.blocks["state"] == "inactive", "stack_id"] == -1).all()


def test_legacy_list_of_segments(legacy_segments_pickle: Path, small_sim: Sim) -> None:
    snap = load_snapshot(str(legacy_segments_pickle))
    assert len(snap.events) == 0
    assert any("legacy" in n for n in snap.format_notes)
    assert snap.segments["total_size"].sum() == small_sim.reserved()
    live = snap.blocks[snap.blocks["state"] == "active_allocated"]
    assert dict(zip(live["address"], live["size"])) == small_sim.live_blocks()
    run = load(str(legacy_segments_pickle))
    assert run.snapshot is not None and len(run.snapshot.segments) == len(snap.segments)


def test_legacy_traces_key_wrapper() -> None:
    """``_memory_viz._read`` wraps lists as ``{"segments": ..., "traces": []}`` (sic)."""
    sim = Sim()
    sim.alloc(5 * MiB)
    snap = model({"segments": sim.snapshot(layout="segments", marker=False), "traces": []})
    assert len(snap.segments) == 1 and len(snap.events) == 0


def test_pre_2_1_history_blocks() -> None:
    sim = random_workload(12, 500)
    modern = model(sim.snapshot(marker=False))
    legacy_d = sim.snapshot(layout="history", marker=False)
    blk0 = next(b for s in legacy_d["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert "history" in blk0 and "frames" not in blk0 and "requested_size" not in blk0
    legacy = model(legacy_d)
    cols = ["address", "size", "state", "requested_size"]
    act = legacy.blocks["state"] != "inactive"
    assert (
        legacy.blocks.loc[act, cols]
        .reset_index(drop=True)
        .equals(modern.blocks.loc[modern.blocks["state"] != "inactive", cols].reset_index(drop=True))
    )
    # the stack of each live block comes from its (newest) history entry
    for (_, lb), (_, mb) in zip(
        legacy.blocks[act].iterrows(), modern.blocks[modern.blocks["state"] != "inactive"].iterrows()
    ):
        assert legacy.stack(int(lb["stack_id"])) == modern.stack(int(mb["stack_id"]))


def test_history_newest_first() -> None:
    """c10 prepends to a block's history: entry 0 is the allocation that is live now."""
    new, old = make_frames("current_alloc"), make_frames("earlier_alloc")
    seg = {
        "device": 0,
        "address": 0x1000000,
        "total_size": 2 * MiB,
        "stream": 0,
        "segment_type": "small",
        "blocks": [
            {
                "size": 2 * MiB,
                "state": "active_allocated",
                "history": [
                    {"addr": 0x1000000, "real_size": 1000, "frames": new},
                    {"addr": 0x1000000, "real_size": 2000, "frames": old},
                ],
            }
        ],
    }
    snap = model({"segments": [seg], "device_traces": []})
    assert snap.stack(int(snap.blocks["stack_id"].iloc[0]))[0]["name"] == "current_alloc"
    assert int(snap.blocks["requested_size"].iloc[0]) == 1000


# ---------------------------------------------------------------- devices


def test_multi_device_events() -> None:
    sim = random_workload(13, 600, devices=2)
    d = sim.snapshot(marker=False)
    # move device 1 to ordinal 2, leaving an idle device 1 (``[]``) between the busy ones
    d["device_traces"] = [d["device_traces"][0], [], d["device_traces"][1]]
    for seg in d["segments"]:
        if seg["device"] == 1:
            seg["device"] = 2
    snap = model(d)
    ev = snap.events
    n0, n2 = len(d["device_traces"][0]), len(d["device_traces"][2])
    assert len(ev) == n0 + n2
    assert set(ev["device"].tolist()) == {0, 2}
    assert snap.devices == [0, 2]
    for dev, n in ((0, n0), (2, n2)):
        de = snap.device_events(dev)
        assert de["idx"].tolist() == list(range(n))
        assert de["addr"].tolist() == [e["addr"] for e in d["device_traces"][dev]]
    assert len(snap.device_events(1)) == 0
    assert set(snap.segments["device"].tolist()) == {0, 2}


def test_loaded_from_files(
    snapshot_pickle: Path, snapshot_gz: Path, snapshot_xz: Path, small_snapshot: dict[str, Any]
) -> None:
    n = sum(len(t) for t in small_snapshot["device_traces"])
    for p in (snapshot_pickle, snapshot_gz, snapshot_xz):
        run = load(str(p))
        assert run.snapshot is not None and len(run.snapshot.events) == n


def test_actions_old_and_unknown(write_pickle: Callable[..., Path]) -> None:
    d = {"segments": [], "device_traces": [[entry("free"), entry("annotate"), entry("snapshot", addr=0, size=123)]]}
    snap = load_snapshot(str(write_pickle(d)))
    assert snap.events["action"].tolist() == [A_FREE, A_OTHER, ACTION_CODE["snapshot"]]
