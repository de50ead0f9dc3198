"""Training right on snapshots recorded by code that is not ours (issue 22, "Done when").

The samples were recorded on an H200 by sample_snapshots/record_user_train.py (a transformers
GPT-2 loop labelled on the main thread only, as users label; the same without labels; a plain
nn.Module loop with SGD momentum) and record_ddp_ranks.py (DDP over gloo, four ranks). Each
run.json holds the allocator's own figures: ``phases[]`` (max_memory_allocated after a reset at
every phase start) and ``train`` (gradient and optimizer-state bytes counted from the tensors).
Nothing expected here was computed with snapviz.

record_ddp_ranks.py --parallel fsdp2 recorded the same GPT-2 under FSDP2 (``fully_shard`` per block
and the root, bf16 parameters, fp32 reductions): two gloo ranks and one NCCL rank, torchtitan's
layout, no labels but FSDP2's own ``FSDP::*`` ranges. record_ddp_ranks.py --parallel fsdp1 recorded
it under FSDP1 (``FullyShardedDataParallel``, a unit per block, flat parameters, bf16 parameters,
fp32 reductions): two gloo ranks (``FULL_SHARD``) and one NCCL rank, which FSDP1 runs as
``NO_SHARD`` (no all-gather, the gradients all-reduced in place).

The cs336 LLM training step (third party, external corpus) has no run.json: what is checked
there follows from AdamW itself (one gradient and two moments per parameter) and from the
allocator's own peak.
"""

from __future__ import annotations

import json

import pytest

from paths import EXTERNAL, SAMPLES
from snapviz.analyses.analysis import Analysis
from snapviz.analyses.categories import live_by_category
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.category_vocab import (
    BEFORE_RECORDING,
    DDP_BUCKETS,
    FSDP_GATHER,
    FSDP_REDUCE,
    FSDP_SHARDED,
    GRADIENT,
    OPTIMIZER_STATE,
)
from snapviz.load import load

PHASES = ("forward", "backward", "optimizer", "zero_grad")
DDP = SAMPLES / "ddp-gloo-4rank" / "memory_snapshot" / "iteration_4"
FSDP = {
    "fsdp2-gloo-rank0": SAMPLES / "fsdp2-gloo-2rank" / "memory_snapshot" / "iteration_3" / "rank0",
    "fsdp2-gloo-rank1": SAMPLES / "fsdp2-gloo-2rank" / "memory_snapshot" / "iteration_3" / "rank1",
    "fsdp2-nccl-rank0": SAMPLES / "fsdp2-nccl-1rank" / "memory_snapshot" / "iteration_3" / "rank0",
    "fsdp1-gloo-rank0": SAMPLES / "fsdp1-gloo-2rank" / "memory_snapshot" / "iteration_3" / "rank0",
    "fsdp1-gloo-rank1": SAMPLES / "fsdp1-gloo-2rank" / "memory_snapshot" / "iteration_3" / "rank1",
    "fsdp1-nccl-rank0": SAMPLES / "fsdp1-nccl-1rank" / "memory_snapshot" / "iteration_3" / "rank0",
}
# (snapshot, its run.json, relative tolerance of a phase peak: labels 0.1%, frames alone 3%)
CASES = {
    "gpt2-train-labels-main-thread": (SAMPLES / "gpt2-train-labels-main-thread", None, 0.001),
    "gpt2-train-nolabels": (SAMPLES / "gpt2-train-nolabels", None, 0.03),
    "mlp-train-plain": (SAMPLES / "mlp-train-plain", None, 0.03),
    **{
        f"ddp-gloo-rank{r}": (DDP / f"rank{r}_memory_snapshot.pickle.xz", DDP / f"rank{r}_run.json", 0.03)
        for r in range(4)
    },
    # FSDP2, FSDP1: the phases from frames alone match the allocator to the byte (0.1% asked)
    **{
        name: (stem.with_name(stem.name + "_memory_snapshot.pickle.xz"), stem.with_name(stem.name + "_run.json"), 0.001)
        for name, stem in FSDP.items()
    },
}


@pytest.fixture(scope="module", params=sorted(CASES), ids=str)
def case(request: pytest.FixtureRequest) -> tuple[str, dict, Analysis, dict, float]:
    path, rj_path, tol = CASES[request.param]
    run = load(str(path))  # the snapshot as a user has it: a DDP rank's pickle alone
    rj = json.loads((rj_path or path / "run.json").read_text())
    an = analyze_run(run)
    return request.param, rj, an, summary_of(an), tol


def _truth(rj: dict) -> dict[str, dict]:
    return {p["name"]: p for p in rj["phases"] if p["name"].split("/")[0] in PHASES}


def test_stage_source_is_what_the_file_has(case: tuple) -> None:
    name, rj, an, _, _ = case
    labelled = rj["train"].get("labels") == "main-thread"
    assert an.labels.source == ("user_metadata" if labelled else "phases"), name


def test_each_phase_peak_equals_the_allocator(case: tuple) -> None:
    name, rj, an, _, tol = case
    found = {r.name: int(r.peak_allocated_bytes) for r in an.stages.itertuples() if r.group in PHASES}
    truth = _truth(rj)
    assert set(found) <= set(truth), sorted(set(found) - set(truth))
    for phase, st in truth.items():
        if phase not in found:
            # no allocator event in it (SGD momentum once its buffers exist): the allocator agrees
            # nothing happened there
            assert st["peak_allocated_bytes"] == st["allocated_at_start"] == st["allocated_at_end"], phase
            continue
        assert found[phase] == pytest.approx(st["peak_allocated_bytes"], rel=tol), (name, phase)


def test_the_stage_holding_the_peak_is_the_allocators(case: tuple) -> None:
    name, rj, an, doc, tol = case
    truth = _truth(rj)
    top = max(p["peak_allocated_bytes"] for p in truth.values())
    assert doc["peak"]["allocated_bytes"] == rj["allocator"]["max_memory_allocated"]
    # equal peaks in several steps: any of them holds it
    holders = {n for n, p in truth.items() if p["peak_allocated_bytes"] >= top * (1 - tol)}
    assert doc["peak"]["stage"] in holders, (name, doc["peak"]["stage"], holders)


def test_gradients_and_optimizer_state_at_the_optimizer_step(case: tuple) -> None:
    """Right after the last optimizer step: gradients = parameter bytes (±1%), the optimizer's
    state = the bytes of its tensors (AdamW's two fp32 moments, SGD's momentum; ±2%)."""
    name, rj, an, _, _ = case
    train = rj["train"]
    last_opt = an.stages[an.stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(an.allocations, int(last_opt["end_row"]) - 1, "size")  # tensor bytes
    assert live[GRADIENT] == pytest.approx(train["params"]["trainable_bytes"], rel=0.01), name
    assert live[GRADIENT] == pytest.approx(train["gradient_bytes"], rel=0.01), name
    state = sum(train["optimizer_state_bytes"].values())
    if train["optimizer"] == "adamw":
        assert state == 2 * train["params"]["trainable_bytes"]  # the sidecar agrees with AdamW
    assert live[OPTIMIZER_STATE] == pytest.approx(state, rel=0.02), name
    if "ddp_bucket_cap_mb" in train:
        # DDP's reducer keeps a flat bucket copy of every gradient (gradient_as_bucket_view=False)
        assert live[DDP_BUCKETS] == pytest.approx(train["params"]["trainable_bytes"], rel=0.01)
    else:
        assert live.get(DDP_BUCKETS, 0) == 0


def test_categories_at_each_phase_peak_add_up_to_it(case: tuple) -> None:
    name, _, _, doc, _ = case
    training = doc["training"]
    for block in (*training["phases"], *training["steps"]):
        assert sum(block["categories_at_peak"].values()) == block["peak_allocated_bytes"], (name, block)


def test_advice_names_the_frameworks_api(case: tuple) -> None:
    """GPT-2 runs through transformers: its checkpointing advice is transformers' call; the
    plain nn.Module loop gets torch.utils.checkpoint; no one gets a diffusers UNet's."""
    name, _, an, doc, _ = case
    hows = {a["technique"]: a["how"] for a in doc["advice"] if a.get("kind") == "training"}
    assert an.training.framework == ("torch" if name.startswith("mlp") else "transformers")
    assert not any("unet." in h for h in hows.values()), hows
    if "gradient checkpointing" in hows:
        want = "torch.utils.checkpoint" if name.startswith("mlp") else "model.gradient_checkpointing_enable()"
        assert want in hows["gradient checkpointing"]


def test_ddp_ranks_without_their_ranges_splitting_phases() -> None:
    """The gloo:all_reduce ranges DDP opens inside backward are no stage of their own: the
    backward interval holds them (one backward per iteration)."""
    run = load(str(CASES["ddp-gloo-rank0"][0]))
    an = analyze_run(run)
    groups = an.stages["group"].tolist()
    assert "communication" not in groups and "gloo:all_reduce" not in groups
    rj_path = CASES["ddp-gloo-rank0"][1]
    assert rj_path is not None
    rj = json.loads(rj_path.read_text())
    assert groups.count("backward") == sum(1 for p in rj["phases"] if p["name"].startswith("backward/"))


@pytest.fixture(scope="module")
def cs336() -> Analysis:
    path = EXTERNAL / "cs336_kk_ctx128_fullstep.pickle"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the external corpus is not part of the repository)")
    return analyze_run(load(str(path)))


def test_llm_step_categories_add_up_to_the_peak_memory_from_before_included(cs336: Analysis) -> None:
    """cs336: 12.85 GiB were allocated before the recording; the categories at the peak say so
    and add up to the peak (they read 38.5 of 51.30 GiB before)."""
    doc = summary_of(cs336)
    (step,) = doc["training"]["steps"]
    cats = step["categories_at_peak"]
    assert step["peak_allocated_bytes"] == doc["peak"]["allocated_bytes"]
    assert sum(cats.values()) == step["peak_allocated_bytes"]
    assert cats[BEFORE_RECORDING] == cs336.replay.baseline_allocated > 0


def test_llm_step_gradients_found_though_parameters_predate_the_recording(cs336: Analysis) -> None:
    """The parameters were allocated before the recording, so no parameter sizes are recorded:
    the gradients (born in backward on autograd's thread, kept) are matched to the sizes of
    AdamW's moments, and are half of its state (one gradient, two moments per parameter)."""
    opt = cs336.stages[cs336.stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(cs336.allocations, int(opt["end_row"]) - 1, "size")
    assert live[OPTIMIZER_STATE] > 0
    assert live[GRADIENT] == pytest.approx(live[OPTIMIZER_STATE] / 2, rel=0.02)


def test_llm_step_gets_no_unet_advice(cs336: Analysis) -> None:
    doc = summary_of(cs336)
    assert cs336.training is not None and cs336.training.framework == "torch"
    hows = [a["how"] for a in doc["advice"]]
    assert hows and not any("unet" in h.lower() for h in hows), hows
    ckpt = [a["how"] for a in doc["advice"] if a["technique"] == "gradient checkpointing"]
    assert ckpt and "torch.utils.checkpoint" in ckpt[0]


@pytest.fixture(scope="module", params=sorted(FSDP), ids=str)
def fsdp(request: pytest.FixtureRequest) -> tuple[str, dict, Analysis, dict]:
    path, rj_path, _ = CASES[request.param]
    assert rj_path is not None  # torchtitan's layout: the sidecar beside the snapshot
    an = analyze_run(load(str(path)))
    return request.param, json.loads(rj_path.read_text()), an, summary_of(an)


def test_fsdp_ranges_are_no_stages(fsdp: tuple) -> None:
    """FSDP2's ``FSDP::pre_forward``, ``FSDP::all_gather``, ``FSDP::post_backward_reduce`` …
    ranges (FSDP1's ``FullyShardedDataParallel._pre_forward`` …) run inside the phases: the stages are the program's phases only (they were 14 groups,
    eight of them ``FSDP::…``, and the phases' peaks were split among them), and wrapping the model
    with ``fully_shard`` is ``load`` (it was ``unlabelled``) with the allocator's load peak."""
    name, rj, an, doc = fsdp
    groups = set(an.stages["group"])
    assert not any(g.startswith("FSDP") for g in groups), sorted(groups)
    assert {"load", "forward", "backward", "optimizer", "zero_grad"} <= groups
    (load_stage,) = [p for p in rj["phases"] if p["name"] == "load"]
    (found,) = an.stages[an.stages["group"] == "load"].itertuples()
    assert found.peak_allocated_bytes == load_stage["peak_allocated_bytes"], name
    assert all("FSDP::" not in str(s["name"]) for s in doc["stages"])


def test_fsdp_buffers_and_shards_are_named(fsdp: tuple) -> None:
    """Each rank's parameter shards are FSDP sharded parameters (their bytes: the rank's
    parameters, as the sidecar counted them from the DTensors' local shards, or FSDP1's flat
    parameters), the unsharded parameters gathered for forward and backward are FSDP all-gather
    buffers (live at the run's peak; FSDP1's made through ``torch/storage.py``), what
    reduce-scatters the gradients is FSDP reduce-scatter buffers (FSDP1's fp32 cast of the
    unsharded gradient too), and the sharded gradient it leaves is the gradient. FSDP1 runs one
    rank as ``NO_SHARD``: its bf16 working copies of the flat parameters are the all-gather
    buffers, and the fp32 cast, all-reduced in place, is the gradient: no reduce-scatter buffer."""
    name, rj, an, doc = fsdp
    no_shard = rj["train"]["fsdp"].get("sharding_strategy") == "NO_SHARD"
    params = rj["train"]["params"]["trainable_bytes"]
    last_opt = an.stages[an.stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(an.allocations, int(last_opt["end_row"]) - 1, "size")
    assert live[FSDP_SHARDED] == pytest.approx(params, rel=0.001), name
    assert live[GRADIENT] == pytest.approx(rj["train"]["gradient_bytes"], rel=0.001), name
    at_peak = {c["category"]: c["bytes"] for c in doc["categories"]}
    assert at_peak.get(FSDP_GATHER, 0) > 0 and at_peak.get(FSDP_SHARDED, 0) > 0, at_peak
    assert sum(at_peak.values()) == doc["peak"]["allocated_bytes"]
    made = an.allocations.groupby("category", observed=True)["size"].sum()
    assert made.get(FSDP_GATHER, 0) > 0
    if no_shard:
        assert made.get(FSDP_REDUCE, 0) == 0
        # one fp32 gradient per iteration, each kept until zero_grad
        assert made[GRADIENT] == rj["iteration"] * rj["train"]["gradient_bytes"], name
        return
    assert made.get(FSDP_REDUCE, 0) > 0
    # every reduce-scatter buffer is made and freed in a backward
    reduce = an.allocations[an.allocations["category"] == FSDP_REDUCE]
    assert set(reduce["phase"]) == {"backward"}
