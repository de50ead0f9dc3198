"""Training on programs the collectors did not write, on synthetic steps written by the reference
allocator (tests/support/synth.py): no labels, phases from frames; a data-parallel wrapper's
ranges and buffers (DDP, FSDP); parameters allocated before the recording; the framework whose
API the advice names."""

from __future__ import annotations

from typing import Any

import numpy as np
from test_frame_rules import SP, load_dict

from snapviz.analyses.categories import allocation_table
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.stages import label_events, range_stage, stage_intervals, stage_table
from snapviz.analyses.training import (
    DDP_BUCKETS,
    FSDP_GATHER,
    FSDP_REDUCE,
    FSDP_SHARDED,
    classify_allocations,
    framework,
    live_by_category,
)
from snapviz.analyses.training_advice import advise_training, how_to, phase_peaks
from snapviz.analyses.training_view import training_dict, training_view
from snapviz.category_vocab import BEFORE_RECORDING
from synth import MiB, Sim

USER = {"name": "train", "filename": "/home/me/train.py", "line": 50}
MODULE = {"name": "_call_impl", "filename": SP + "torch/nn/modules/module.py", "line": 1700}
DDP_FWD = {"name": "forward", "filename": SP + "torch/nn/parallel/distributed.py", "line": 1600}
GELU = [{"name": "gelu", "filename": SP + "torch/nn/functional.py", "line": 1700}, MODULE, DDP_FWD, MODULE, USER]
BUCKETS = [
    {"name": "_pre_forward", "filename": SP + "torch/nn/parallel/distributed.py", "line": 1500},
    DDP_FWD,
    MODULE,
    USER,
]
BACKWARD = [{"name": "backward", "filename": SP + "torch/_tensor.py", "line": 600}, USER]
OPT = [
    {"name": "_multi_tensor_adamw", "filename": SP + "torch/optim/adamw.py", "line": 500},
    {"name": "wrapper", "filename": SP + "torch/optim/optimizer.py", "line": 480},
    USER,
]
ZERO = [{"name": "zero_grad", "filename": SP + "torch/optim/optimizer.py", "line": 900}, USER]
TO = [
    {"name": "convert", "filename": SP + "torch/nn/modules/module.py", "line": 1300},
    {"name": "to", "filename": SP + "torch/nn/modules/module.py", "line": 1350},
    USER,
]


def _ddp_steps(before: bool = False, steps: int = 2) -> tuple:
    """A DDP training loop with no labels: weights (loaded in the recording, or before it), the
    reducer's buckets rebuilt in the first forwards, an all-reduce range inside backward whose
    copy is a temporary, gradients on autograd's thread (no frames), AdamW."""
    sim = Sim(record=not before)
    weights = [sim.alloc(n * MiB, frames=TO) for n in (16, 8)]
    if before:
        sim.start_recording()
    sim.annotate("gloo:broadcast", "START")
    sim.free(sim.alloc(MiB, frames=BUCKETS[1:]), frames=BUCKETS[1:])
    sim.annotate("gloo:broadcast", "END")
    states: list = []
    for step in range(steps):
        sim.annotate("DistributedDataParallel.forward", "START")
        if step == 0:
            sim.alloc(24 * MiB, frames=BUCKETS)  # the rebuilt buckets: one flat copy of the grads
        acts = [sim.alloc(6 * MiB, frames=GELU) for _ in range(2)]
        sim.annotate("DistributedDataParallel.forward", "END")
        sim.free(sim.alloc(MiB, frames=BACKWARD), frames=BACKWARD)
        grads = [sim.alloc(w.nbytes) for w in weights]  # autograd thread: no frames
        sim.annotate("gloo:all_reduce", "START")
        sim.free(sim.alloc(4 * MiB))  # the collective's staging copy
        sim.annotate("gloo:all_reduce", "END")
        for h in acts:
            sim.free(h, frames=BACKWARD)
        if not states:
            states = [sim.alloc(w.nbytes, frames=OPT) for w in weights for _ in range(2)]
        for h in [sim.alloc(w.nbytes, frames=OPT) for w in weights]:
            sim.free(h, frames=OPT)
        for h in grads:
            sim.free(h, frames=ZERO)
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    lab = label_events(snap, rep.events, 0)
    ev = rep.events
    stages = stage_table(
        stage_intervals(lab.labels, ev["time_us"].to_numpy()),
        ev["allocated"].to_numpy(),
        ev["reserved"].to_numpy(),
        rep.baseline_allocated,
        rep.baseline_reserved,
    )
    return snap, rep, lab, stages


def test_collective_ranges_do_not_split_the_frame_phases() -> None:
    snap, rep, lab, stages = _ddp_steps()
    assert lab.source == "phases"
    # the all-reduce inside backward stays backward; DDP's forward range is the forward phase
    assert [n for n in stages["name"] if n.split("/")[0] in ("forward", "backward")] == [
        "forward/0",
        "backward/0",
        "forward/1",
        "backward/1",
    ]
    assert "gloo:all_reduce" not in set(lab.labels) and "communication" not in set(lab.labels)
    assert range_stage("nccl:all_reduce") == "communication" and range_stage("record_param_comms") == "communication"
    assert range_stage("DistributedDataParallel.forward") == "forward"


def test_a_collective_outside_every_phase_is_communication() -> None:
    """With no frames to give phases, a collective's range still says what it is."""
    sim = Sim()
    sim.annotate("nccl:all_reduce", "START")
    sim.free(sim.alloc(4 * MiB))
    sim.annotate("nccl:all_reduce", "END")
    sim.alloc(MiB)
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    labels = label_events(snap, rep.events, 0).labels
    size = rep.events["size"].to_numpy()
    assert set(labels[size == 4 * MiB].tolist()) == {"communication"}  # its alloc and free
    assert set(labels[size == MiB].tolist()) == {"unlabelled"}  # after the range


def test_ddp_buckets_gradients_and_state_without_labels() -> None:
    snap, rep, lab, stages = _ddp_steps()
    allocs = classify_allocations(snap, rep, lab.labels)
    opt = stages[stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(allocs, int(opt["peak_row"]))
    assert live[DDP_BUCKETS] == 24 * MiB
    assert live["parameters"] == 24 * MiB
    assert live["gradients"] == 24 * MiB
    assert live["optimizer state"] == 48 * MiB
    assert live["temporaries"] == 24 * MiB
    # the forward allocations run under DDP's forward too, but DDP did not make them
    fwd = stages[stages["name"] == "forward/1"].iloc[0]
    assert live_by_category(allocs, int(fwd["peak_row"]))["saved activations"] == 12 * MiB


def test_parameters_from_before_the_recording() -> None:
    """The weights predate the recording: gradients (born in backward, kept till zero_grad) are
    still gradients, matched to the optimizer state's sizes; the phase peaks add up with the
    memory from before the recording."""
    snap, rep, lab, stages = _ddp_steps(before=True)
    allocs = classify_allocations(snap, rep, lab.labels)
    assert rep.baseline_allocated == 24 * MiB
    opt = stages[stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(allocs, int(opt["peak_row"]))
    assert live["gradients"] == 24 * MiB and live["optimizer state"] == 48 * MiB and live["parameters"] == 0
    # the training view of the allocation table: each phase peak adds up, before recording included
    view = training_view(allocation_table(snap, rep, lab.labels), stages, snap)
    assert view is not None
    block = training_dict(view)
    assert block.phases
    for p in block.phases:
        assert sum(p.categories_at_peak.values()) == p.peak_allocated_bytes, p.name
        assert p.categories_at_peak[BEFORE_RECORDING] == 24 * MiB, p.name


def _categories_by_size(sim: Sim) -> Any:
    """The training classifier's category of each allocation of ``sim``, by its size."""
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    labels = label_events(snap, rep.events, 0).labels
    return classify_allocations(snap, rep, labels).set_index("size")["category"]


def test_fsdp_buffers_are_named() -> None:
    fsdp = SP + "torch/distributed/fsdp/"
    flat = [{"name": "_init_flat_param_and_metadata", "filename": fsdp + "_flat_param.py", "line": 700}, USER]
    gather = [
        {"name": "_alloc_storage", "filename": SP + "torch/distributed/utils.py", "line": 300},
        {"name": "_alloc_padded_unsharded_flat_param", "filename": fsdp + "_flat_param.py", "line": 1400},
        {"name": "unshard", "filename": fsdp + "_flat_param.py", "line": 1350},
        MODULE,
        USER,
    ]
    wrapped = [
        {"name": "gelu", "filename": SP + "torch/nn/functional.py", "line": 1700},
        MODULE,
        {"name": "forward", "filename": fsdp + "fully_sharded_data_parallel.py", "line": 850},
        MODULE,
        USER,
    ]
    # FSDP2: post_backward reduce-scatters the unsharded gradients; its sharded output is kept
    # as the gradient (until zero_grad), the padded input is a buffer of the collective
    reduce = [
        {"name": "allocate", "filename": fsdp + "_fully_shard/_fsdp_collectives.py", "line": 60},
        {"name": "foreach_reduce", "filename": fsdp + "_fully_shard/_fsdp_collectives.py", "line": 400},
        {"name": "post_backward", "filename": fsdp + "_fully_shard/_fsdp_param_group.py", "line": 450},
        BACKWARD[0],
    ]
    sim = Sim()
    sim.set_label("load")
    sim.alloc(8 * MiB, frames=flat)
    sim.set_label("forward/0")
    full = sim.alloc(32 * MiB, frames=gather)
    act = sim.alloc(2 * MiB, frames=wrapped)
    sim.free(full, frames=gather)
    sim.set_label("backward/0")
    sim.free(act, frames=BACKWARD)
    unsharded = sim.alloc(16 * MiB, frames=reduce)
    grad = sim.alloc(4 * MiB, frames=reduce)
    sim.free(unsharded, frames=reduce)
    sim.set_label("optimizer/0")
    sim.free(sim.alloc(MiB, frames=OPT), frames=OPT)
    sim.set_label("zero_grad/0")
    sim.free(grad, frames=ZERO)
    cats = _categories_by_size(sim)
    assert cats[8 * MiB] == FSDP_SHARDED
    assert cats[32 * MiB] == FSDP_GATHER
    assert cats[2 * MiB] == "saved activations"  # made by the module FSDP wraps, not by FSDP
    assert cats[16 * MiB] == FSDP_REDUCE
    assert cats[4 * MiB] == "gradients"  # the sharded output, kept until zero_grad


def test_fsdp1_flat_parameter_buffers_are_named() -> None:
    """FSDP1 (``FullyShardedDataParallel``, flat parameters) as its frames are recorded: the
    unsharded flat parameter is a storage ``_alloc_storage`` resizes through ``torch/storage.py``
    (its innermost frame, yet FSDP made it: an all-gather buffer, not an activation); the
    ``_post_backward_hook`` casts the unsharded gradient to fp32 for ``_reduce_grad`` (a
    reduce-scatter buffer) and, inside the same hook, prefetches the next all-gather (the
    innermost of FSDP's functions says which job an allocation serves); under ``NO_SHARD`` the cast
    is kept as the gradient until zero_grad."""
    fsdp = SP + "torch/distributed/fsdp/"
    runtime = fsdp + "_runtime_utils.py"
    hook = {"name": "_post_backward_hook", "filename": runtime, "line": 760}
    shard = [
        {"name": "_get_shard", "filename": fsdp + "_flat_param.py", "line": 1136},
        {"name": "shard", "filename": fsdp + "_flat_param.py", "line": 960},
        {"name": "__init__", "filename": fsdp + "fully_sharded_data_parallel.py", "line": 480},
        USER,
    ]
    resize = [
        {"name": "_resize_", "filename": SP + "torch/storage.py", "line": 1100},
        {"name": "_alloc_storage", "filename": SP + "torch/distributed/utils.py", "line": 300},
        {"name": "_alloc_padded_unsharded_flat_param", "filename": fsdp + "_flat_param.py", "line": 1400},
        {"name": "unshard", "filename": fsdp + "_flat_param.py", "line": 1370},
        {"name": "_unshard", "filename": runtime, "line": 300},
    ]
    gather = [*resize, {"name": "_pre_forward", "filename": runtime, "line": 380}, MODULE, USER]
    prefetch = [*resize, {"name": "_prefetch_handle", "filename": runtime, "line": 1200}, hook]
    cast = [hook, {"name": "decorate_context", "filename": SP + "torch/utils/_contextlib.py", "line": 120}]
    sharded_grad = [
        {"name": "_get_reduce_scatter_tensors", "filename": runtime, "line": 900},
        {"name": "_reduce_grad", "filename": runtime, "line": 850},
        hook,
    ]
    sim = Sim()
    sim.set_label("load")
    sim.alloc(8 * MiB, frames=shard)
    sim.set_label("forward/0")
    sim.free(sim.alloc(32 * MiB, frames=gather), frames=gather)
    sim.set_label("backward/0")
    sim.free(sim.alloc(24 * MiB, frames=prefetch), frames=prefetch)
    unsharded = sim.alloc(64 * MiB, frames=cast)
    grad = sim.alloc(4 * MiB, frames=sharded_grad)
    sim.free(unsharded, frames=sharded_grad)
    kept = sim.alloc(16 * MiB, frames=cast)  # NO_SHARD: the cast is the gradient
    sim.set_label("optimizer/0")
    sim.free(sim.alloc(MiB, frames=OPT), frames=OPT)
    sim.set_label("zero_grad/0")
    sim.free(grad, frames=ZERO)
    sim.free(kept, frames=ZERO)
    cats = _categories_by_size(sim)
    assert cats[8 * MiB] == FSDP_SHARDED
    assert cats[32 * MiB] == FSDP_GATHER  # was a temporary: its innermost frame is torch/storage.py
    assert cats[24 * MiB] == FSDP_GATHER  # prefetched from inside the reduce hook
    assert cats[64 * MiB] == FSDP_REDUCE  # was temporaries
    assert cats[4 * MiB] == "gradients"
    assert cats[16 * MiB] == "gradients"


def test_framework_from_frames_and_advice_in_its_api() -> None:
    snap, rep, lab, stages = _ddp_steps()
    sids = rep.events["stack_id"].to_numpy()
    assert framework(snap, sids) == "torch"
    hf = {"name": "forward", "filename": SP + "transformers/models/gpt2/modeling_gpt2.py", "line": 300}
    sim = Sim()
    sim.alloc(MiB, frames=[hf, USER])
    snap2 = load_dict(sim.snapshot(marker=False))
    assert framework(snap2, np.zeros(1, np.int64)) == "transformers"
    assert "model.gradient_checkpointing_enable()" in how_to("checkpointing", "transformers")
    assert "unet.enable_gradient_checkpointing()" in how_to("checkpointing", "diffusers")
    assert "torch.utils.checkpoint" in how_to("checkpointing", "torch")
    assert "unet" not in how_to("lora", "torch") and "unet" not in how_to("lora", "transformers")
    phases = phase_peaks(stages, allocation_table(snap, rep, lab.labels))
    for fw in ("torch", "transformers"):
        assert not any("unet" in a.how for a in advise_training(phases, None, fw))


def test_python_on_torchs_threads_keeps_the_label_in_effect() -> None:
    """Labels on the main thread only: checkpointing's recomputation and DDP's communication
    hooks run Python on autograd's thread, unlabelled. Their outermost Python frame is torch's
    (the engine entered Python at a hook), so they belong to the label in effect and clear
    nothing; a user's own unlabelled Python still clears it."""
    ckpt = [
        {"name": "gelu", "filename": SP + "torch/nn/functional.py", "line": 1700},
        MODULE,
        {"name": "recompute_fn", "filename": SP + "torch/utils/checkpoint.py", "line": 1100},
        {"name": "unpack_hook", "filename": SP + "torch/utils/checkpoint.py", "line": 1150},
    ]
    hook = [
        {
            "name": "allreduce_hook",
            "filename": SP + "torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py",
            "line": 60,
        }
    ]
    sim = Sim()
    sim.set_label("forward/0")
    sim.alloc(MiB, frames=GELU)
    sim.set_label("backward/0")
    sim.alloc(2 * MiB, frames=BACKWARD)
    sim.alloc(3 * MiB, label="")  # the engine: no Python frames
    sim.alloc(4 * MiB, frames=ckpt, label="")  # recomputation on the engine's thread
    sim.alloc(5 * MiB, frames=hook, label="")  # DDP's all-reduce hook
    sim.alloc(6 * MiB, label="")
    sim.alloc(7 * MiB, frames=[USER], label="")  # the user's own thread, unlabelled: clears
    sim.alloc(8 * MiB, label="")
    snap = load_dict(sim.snapshot(marker=False))
    rep = replay_allocator(snap, 0)
    lab = label_events(snap, rep.events, 0)
    assert lab.source == "user_metadata"
    ev = rep.events
    got = {int(s) // MiB: str(x) for s, x, a in zip(ev["size"], lab.labels, ev["action"]) if a == 0}
    assert got == {
        1: "forward/0",
        2: "backward/0",
        3: "backward/0",
        4: "backward/0",
        5: "backward/0",
        6: "backward/0",
        7: "unlabelled",
        8: "unlabelled",
    }
