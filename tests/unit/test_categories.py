"""Memory categories (``snapviz.analyses.categories``) against what each allocation is.

Every allocation of the synthetic pipelines in ``test_frame_rules`` is tagged, as it is
made, with what a person reading the pipeline would call it (weights moved in by
``.to()`` or an offload hook, activations inside one forward, score matrices, latents
that live across steps, VAE decode buffers). The categories must come back from frames
and lifetimes, with labels from the collector or from the frames themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_frame_rules import SP, diffusion_run, frames_labels, load_dict

from snapviz.analyses.categories import (
    BEFORE_RECORDING,
    CATEGORIES,
    allocation_table,
    category_names,
    category_timeline,
    live_categories,
)
from snapviz.analyses.decimate import decimate_minmax
from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.frame_rules import RuleSet, load_rules
from snapviz.analyses.replay import ReplayResult, live_at, replay_allocator
from snapviz.analyses.sites import SiteNamer
from snapviz.category_vocab import canonical_category
from snapviz.model import A_ALLOC, Snapshot
from synth import MiB, Sim


def categorize_allocs(
    snap: Snapshot, rep: ReplayResult, labels: np.ndarray, rows: np.ndarray, rules: RuleSet | None = None
) -> np.ndarray:
    """The allocation table's category at each of ``rows`` (alloc event rows)."""
    t = allocation_table(snap, rep, labels, rules)
    return t.set_index("row")["category"].astype(object).reindex(rows).to_numpy()


def categorize_live(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, row: int) -> Any:
    return live_categories(allocation_table(snap, rep, labels), row, rep.baseline_allocated)


def truth_and_rows(pr: Any, rep: Any) -> tuple[np.ndarray, np.ndarray]:
    """The builder's categories, aligned with the replay's alloc rows."""
    ev = rep.events
    rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    by_idx = dict(pr.alloc_categories)
    idx = ev["idx"].to_numpy()[rows]
    assert set(by_idx) == set(idx.tolist())
    # the builders tag with the names snapviz used before the one vocabulary: said as it says them now
    return rows, np.array([canonical_category(by_idx[i]) for i in idx], dtype=object)


@pytest.mark.parametrize(
    "case",
    [
        dict(pipe="sd15"),
        dict(pipe="sdxl"),
        dict(pipe="pixart", steps=3),
        dict(pipe="sd15", attention="sdpa"),
        dict(pipe="sd15", offload="model"),
        dict(pipe="sd15", offload="sequential"),
    ],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)
@pytest.mark.parametrize("source", ["collector labels", "frames"])
def test_every_allocation_gets_its_category(case: dict[str, Any], source: str) -> None:
    pr = diffusion_run(**case)
    if source == "frames":
        snap, rep, labels = frames_labels(pr)
    else:
        snap = load_dict(pr.snapshot_dict())
        rep = replay_allocator(snap, 0)
        labels = pr.truth_labels()
    rows, truth = truth_and_rows(pr, rep)
    got = categorize_allocs(snap, rep, labels, rows)
    bad = np.flatnonzero(got != truth)
    assert not len(bad), [
        (truth[i], got[i], SiteNamer(snap).site(int(rep.events["stack_id"].iat[rows[i]]))) for i in bad[:6]
    ]


def test_categorize_live_adds_up_to_the_peak() -> None:
    pr = diffusion_run("sd15", images=2)
    snap, rep, labels = frames_labels(pr)
    df = categorize_live(snap, rep, labels, rep.peak_index)
    assert int(df["bytes"].sum()) == rep.peak_allocated
    # brute force: the live set at the peak, by the builder's categories
    rows, truth = truth_and_rows(pr, rep)
    live = set(live_at(rep, rep.peak_index).index.tolist())
    want: dict[str, int] = {}
    for r, c in zip(rows, truth):
        if r in live:
            want[c] = want.get(c, 0) + int(rep.events["block_size"].iat[r])
    assert dict(zip(df["category"], df["bytes"].astype(int))) == want
    assert df["category"].iat[0] in ("attention scores", "parameter")


def test_category_timeline_is_a_stacked_area_of_the_live_bytes() -> None:
    pr = diffusion_run("sd15", steps=3)
    snap, rep, labels = frames_labels(pr)
    ev = rep.events
    tl = category_timeline(rep, labels, allocation_table(snap, rep, labels), max_points=10**9)
    assert list(tl.columns) == ["row", "time_us", "stage", "allocated", *CATEGORIES, BEFORE_RECORDING]
    assert len(tl) == len(ev)
    cats = list(CATEGORIES) + [BEFORE_RECORDING]
    np.testing.assert_array_equal(tl[cats].sum(axis=1).to_numpy(), ev["allocated"].to_numpy())
    # independent: walk the events, keep the live set by category
    rows, truth = truth_and_rows(pr, rep)
    cat_of = dict(zip(rows.tolist(), truth.tolist()))
    free_of = {int(r): int(f) for r, f in zip(rows, ev["free_row"].to_numpy()[rows])}
    ends: dict[int, list[int]] = {}
    for r, f in free_of.items():
        ends.setdefault(f, []).append(r)
    live = {c: 0 for c in CATEGORIES}
    for i in range(len(ev)):
        if i in cat_of:
            live[cat_of[i]] += int(ev["block_size"].iat[i])
        for r in ends.get(i, []):
            live[cat_of[r]] -= int(ev["block_size"].iat[r])
        if i % 97 == 0 or i == len(ev) - 1:
            assert {c: int(tl[c].iat[i]) for c in CATEGORIES} == live, i


def test_category_timeline_decimates_and_keeps_the_peak() -> None:
    pr = diffusion_run("sd15", steps=6)
    snap, rep, labels = frames_labels(pr)
    tl = category_timeline(rep, labels, allocation_table(snap, rep, labels), max_points=200)
    assert len(tl) <= 200
    assert rep.peak_index in set(tl["row"].tolist())
    assert int(tl["allocated"].max()) == rep.peak_allocated
    assert tl["row"].is_monotonic_increasing
    # the timeline samples with the one min/max decimator
    assert (
        tl["row"].tolist()
        == decimate_minmax(np.arange(len(rep.events)), rep.events["allocated"].to_numpy(), max_points=200).tolist()
    )


def test_memory_from_before_the_recording() -> None:
    """Recording started after the weights were loaded: they are 'before recording'."""
    sim = Sim(record=False)
    w = [sim.alloc(64 * MiB, frames=None) for _ in range(3)]
    sim.start_recording()
    fwd = [
        {"name": "forward", "filename": SP + "diffusers/models/unets/unet_2d_condition.py", "line": 1143},
        {
            "name": "__call__",
            "filename": SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py",
            "line": 962,
        },
    ]
    a = sim.alloc(8 * MiB, frames=fwd)
    sim.free(a, frames=fwd)
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    tl = category_timeline(rep, labels, allocation_table(snap, rep, labels))
    assert (tl[BEFORE_RECORDING] == 3 * 64 * MiB).all()
    live = categorize_live(snap, rep, labels, rep.peak_index)
    assert dict(zip(live["category"], live["bytes"])) == {BEFORE_RECORDING: 3 * 64 * MiB, "activation": 8 * MiB}
    assert len(w) == 3


def training_snapshot(evidence: bool) -> tuple[dict[str, Any], dict[int, str]]:
    """A training step: forward in the main thread, backward on the autograd engine thread
    (no Python frames), an Adam step in torch/optim."""
    sim = Sim()
    want: dict[int, str] = {}
    tr = sim.devices[0].trace
    user = {"name": "<module>", "filename": "/home/me/train.py", "line": 50}
    build = [{"name": "__init__", "filename": SP + "torch/nn/modules/linear.py", "line": 106}, user]
    fwd = [
        {"name": "forward", "filename": SP + "torch/nn/modules/linear.py", "line": 125},
        {"name": "forward", "filename": SP + "diffusers/models/unets/unet_2d_condition.py", "line": 1143},
        user,
    ]
    bwd = [
        {"name": "_engine_run_backward", "filename": SP + "torch/autograd/graph.py", "line": 829},
        {"name": "backward", "filename": SP + "torch/_tensor.py", "line": 625},
        user,
    ]
    opt = [
        {"name": "_single_tensor_adam", "filename": SP + "torch/optim/adam.py", "line": 400},
        {"name": "step", "filename": SP + "torch/optim/optimizer.py", "line": 480},
        user,
    ]

    def a(n: int, frames: Any, cat: str) -> Any:
        h = sim.alloc(n, frames=frames)
        want[len(tr) - 1] = cat
        return h

    w = a(32 * MiB, build, "parameter")
    for _ in range(2):
        acts = [a(4 * MiB, fwd, "activation") for _ in range(3)]
        if evidence:
            a(512, bwd, "autograd detail")  # inside backward(), on the main thread
        # the engine thread's: gradients or backward temporaries; no phases to tell them apart by
        grads = [a(2 * MiB, None, "autograd detail") for _ in range(3)]
        for h in acts:
            sim.free(h, frames=[])  # freed by the engine thread during backward
        if evidence:
            st = [a(2 * MiB, opt, "optimizer state") for _ in range(2)]
            for h in st:
                sim.free(h, frames=opt)
        for h in grads:
            sim.free(h, frames=[])
    assert w
    return sim.snapshot(marker=False), want


def test_training_frames_without_training_phases() -> None:
    """Backward and optimizer frames inside a pipeline's stages (no training phases, so no
    lifetime classification): the engine thread's allocations are autograd's, the optimizer's
    its state."""
    d, want = training_snapshot(evidence=True)
    snap = load_dict(d)
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    rows = np.flatnonzero(rep.events["action"].to_numpy() == A_ALLOC)
    got = categorize_allocs(snap, rep, labels, rows)
    idx = rep.events["idx"].to_numpy()[rows]
    assert list(got) == [want[i] for i in idx]
    # one training step per forward; backward and the optimizer step join it
    runs = [s for i, s in enumerate(labels) if i == 0 or labels[i - 1] != s]
    assert runs == ["load", "denoise/0", "denoise/1"]


def test_frameless_allocations_without_training_are_not_gradients() -> None:
    d, want = training_snapshot(evidence=False)
    snap = load_dict(d)
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    rows = np.flatnonzero((rep.events["action"].to_numpy() == A_ALLOC) & (rep.events["stack_id"].to_numpy() < 0))
    got = categorize_allocs(snap, rep, labels, rows)
    assert len(rows) and "autograd detail" not in set(got)


def test_user_category_rule(tmp_path: Path) -> None:
    """A user rule adds a category (a LoRA's weights, moved in by peft)."""
    pr = diffusion_run("sd15", steps=2)
    d = pr.snapshot_dict(labels=False)
    lora = [
        {"name": "_move_adapter_to_device", "filename": SP + "peft/tuners/lora/layer.py", "line": 300},
        {"name": "<module>", "filename": "/home/me/run.py", "line": 3},
    ]
    tr = d["device_traces"][0]
    t0 = tr[-1]["time_us"]
    tr.append(
        {
            "action": "alloc",
            "addr": 1 << 45,
            "size": 4 * MiB,
            "stream": 0,
            "time_us": t0 + 1,
            "frames": lora,
            "user_metadata": "",
            "compile_context": "N/A",
        }
    )
    rules = tmp_path / "r.json"
    rules.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "rules": [
                    {
                        "kind": "category",
                        "name": "lora adapters",
                        "function": "^_move_adapter_to_device$",
                        "file": "peft/",
                        "priority": 400,
                    }
                ],
            }
        )
    )
    snap = load_dict(d)
    rep = replay_allocator(snap, 0)
    rs = load_rules(str(rules))
    labels = label_from_frames(snap, rep.events, rs)
    assert labels is not None
    assert "lora adapters" in category_names(rs)
    got = categorize_allocs(snap, rep, labels, np.array([len(rep.events) - 1]), rs)
    assert list(got) == ["lora adapters"]
    tl = category_timeline(rep, labels, allocation_table(snap, rep, labels, rs))
    assert int(tl["lora adapters"].iat[-1]) == 4 * MiB


@pytest.mark.parametrize("set_to_none", [True, False])
def test_training_lifetime_in_the_one_column(set_to_none: bool) -> None:
    """A training run's allocation table: the lifetime classifier's verdicts in the vocabulary's
    words, what it leaves undecided judged by frames (the autograd thread's never-freed cuBLAS
    workspace is autograd's), and every phase's categories add up to its peak."""
    from test_training_categories import _train

    from snapviz.analyses.categories import is_training_run, live_by_category
    from snapviz.analyses.stages import stage_intervals, stage_table

    snap, rep, labels = _train(set_to_none, amp=True)
    assert is_training_run(labels)
    t = allocation_table(snap, rep, labels)
    ev = rep.events
    stages = stage_table(
        stage_intervals(labels, ev["time_us"].to_numpy()),
        ev["allocated"].to_numpy(),
        ev["reserved"].to_numpy(),
        rep.baseline_allocated,
        rep.baseline_reserved,
    )
    opt = stages[stages["name"] == "optimizer/1"].iloc[0]
    live = {c: b for c, b in live_by_category(t, int(opt["peak_row"])).items() if b}
    assert live == {
        "parameter": 24 * MiB,
        "gradient": 24 * MiB,
        "optimizer state": 48 * MiB,
        "temporary": 24 * MiB,
        "autograd detail": 32 * MiB,
    }
    fwd = stages[stages["name"] == "forward/1"].iloc[0]
    at_fwd = live_by_category(t, int(fwd["peak_row"]))
    assert at_fwd["activation"] == 12 * MiB and at_fwd["autocast weight copies"] == 12 * MiB
    for st in stages.itertuples(index=False):
        got = live_categories(t, int(st.peak_row), rep.baseline_allocated)
        assert int(got["bytes"].sum()) == st.peak_allocated_bytes, st.name
    assert not {"gradients & optimizer", "weights", "parameters", "other"} & set(t["category"].astype(str))


def test_the_vocabulary_is_one() -> None:
    """Every name the training classifier can give maps into the vocabulary (a new one must be
    added there, with its colour), every category has one colour of its own, and an old name
    said the new way is a category of the vocabulary."""
    from snapviz.analyses.training import TRAINING_CATEGORIES
    from snapviz.category_vocab import CATEGORY_COLORS, CATEGORY_ORDER, FROM_TRAINING, OLD_NAMES

    assert set(TRAINING_CATEGORIES) <= set(FROM_TRAINING)
    assert {v for v in FROM_TRAINING.values() if v} <= set(CATEGORIES)
    assert list(CATEGORY_COLORS) == list(CATEGORY_ORDER) and len(set(CATEGORY_COLORS.values())) == len(CATEGORY_ORDER)
    assert set(OLD_NAMES.values()) <= set(CATEGORY_ORDER)
    assert {"parameter", "gradient", "optimizer state", "activation", "temporary", "input", "autograd detail"} <= set(
        CATEGORIES
    ), "PyTorch's memory-profiler categories"


def test_user_rules_are_told_from_the_built_in_ones(tmp_path: Path) -> None:
    """Step 1 of the chain is a user's rules only: the built-ins as shipped are step 4's, a
    user's rule (new, or replacing a built-in by its id) is step 1's."""
    from snapviz.analyses.categories import _split_rules

    builtin, user = _split_rules(load_rules())
    assert len(builtin) == len(load_rules().of_kind("category")) and user == ()
    rules = tmp_path / "r.json"
    rules.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "rules": [
                    {
                        "id": "cat-vae",
                        "kind": "category",
                        "name": "vae buffers",
                        "function": "^decode$",
                        "priority": 100,
                    },
                    {"kind": "category", "name": "my cache", "function": "^fill_cache$", "priority": 10},
                ],
            }
        )
    )
    b2, u2 = _split_rules(load_rules(str(rules)))
    assert {r.name for r in u2} == {"vae buffers", "my cache"} and len(b2) == len(builtin) - 1
