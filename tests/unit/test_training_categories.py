"""Training categories from phase labels, on synthetic training steps written by the
reference allocator (tests/support/synth.py): set_to_none on and off, AMP (autocast weight copies)
and plain fp32, checkpoint-style recomputation, a never-freed cuBLAS workspace."""

from __future__ import annotations

import pytest
from test_frame_rules import SP, load_dict

from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.stages import label_events, stage_intervals, stage_table
from snapviz.analyses.training import TRAINING_CATEGORIES, classify_allocations, live_by_category, phase_categories
from synth import MiB, Sim

USER = {"name": "<module>", "filename": "/home/me/train.py", "line": 50}
LINEAR = [{"name": "forward", "filename": SP + "torch/nn/modules/linear.py", "line": 125}, USER]
GELU = [{"name": "gelu", "filename": SP + "torch/nn/functional.py", "line": 1700}, USER]
OPT = [{"name": "_multi_tensor_adamw", "filename": SP + "torch/optim/adamw.py", "line": 500}, USER]


def _train(set_to_none: bool, amp: bool, steps: int = 2) -> tuple:
    sim = Sim()
    sim.set_label("load")
    weights = [sim.alloc(n * MiB, frames=[USER]) for n in (16, 8)]
    grads: list = []
    states: list = []
    for step in range(steps):
        sim.set_label(f"forward/{step}")
        saved = [sim.alloc(w.nbytes // 2, frames=LINEAR) for w in weights] if amp else []
        acts = [sim.alloc(6 * MiB, frames=GELU) for _ in range(2)]
        tmp = sim.alloc(3 * MiB, frames=GELU)
        sim.free(tmp, frames=GELU)
        sim.set_label(f"backward/{step}")
        if step == 0:
            sim.alloc(32 * MiB)  # the autograd thread's cuBLAS workspace, never freed
        if not grads:
            grads = [sim.alloc(w.nbytes) for w in weights]
        recomputed = sim.alloc(5 * MiB)
        sim.free(recomputed)
        for h in acts + saved:
            sim.free(h)
        sim.set_label(f"optimizer/{step}")
        if not states:
            states = [sim.alloc(w.nbytes, frames=OPT) for w in weights for _ in range(2)]
        foreach = [sim.alloc(w.nbytes, frames=OPT) for w in weights]
        for h in foreach:
            sim.free(h, frames=OPT)
        sim.set_label(f"zero_grad/{step}")
        if set_to_none:
            for h in grads:
                sim.free(h, frames=[USER])
            grads = []
    sim.set_label("other")
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    labels = label_events(snap, rep.events, 0).labels
    return snap, rep, labels


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("amp", [True, False])
def test_categories_at_the_optimizer_peak(set_to_none: bool, amp: bool) -> None:
    snap, rep, labels = _train(set_to_none, amp)
    allocs = classify_allocations(snap, rep, labels)
    assert set(allocs["category"]) <= set(TRAINING_CATEGORIES)
    ev = rep.events
    stages = stage_table(
        stage_intervals(labels, ev["time_us"].to_numpy()),
        ev["allocated"].to_numpy(),
        ev["reserved"].to_numpy(),
        rep.baseline_allocated,
        rep.baseline_reserved,
    )
    opt = stages[stages["name"] == "optimizer/1"].iloc[0]
    live = live_by_category(allocs, int(opt["peak_row"]))
    assert live["parameters"] == 24 * MiB
    assert live["gradients"] == 24 * MiB  # kept or not, the workspace is never a gradient
    assert live["optimizer state"] == 48 * MiB
    assert live["temporaries"] == 24 * MiB  # the foreach lists at the optimizer's peak
    assert live["other"] == 32 * MiB
    fwd = stages[stages["name"] == "forward/1"].iloc[0]
    at_fwd = live_by_category(allocs, int(fwd["peak_row"]))
    assert at_fwd["saved activations"] == 12 * MiB
    assert at_fwd["autocast weight copies"] == (12 * MiB if amp else 0)
    assert at_fwd["gradients"] == (0 if set_to_none else 24 * MiB)
    # the table form: every interval, at its peak and exit, sums to the replayed allocator bytes
    table = phase_categories(allocs, stages)
    peak_sums = table[table["at"] == "peak"].groupby("name", sort=False)["bytes"].sum()
    for st in stages.itertuples(index=False):
        assert peak_sums[st.name] == st.peak_allocated_bytes - rep.baseline_allocated, st.name
