"""The analyzer against the allocator on the real H200 training samples (sample_snapshots/train-*).

run.json holds torch.cuda.max_memory_allocated()/max_memory_reserved() per phase (after
reset_peak_memory_stats() at each phase start) and, from the tensors themselves after the last
optimizer step, the gradient and optimizer-state bytes.
"""

from __future__ import annotations

import pathlib

import pandas as pd
import pytest

from paths import ROOT
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.analyses.training import classify_allocations, live_by_category
from snapviz.load import load

ROOT = ROOT / "sample_snapshots"
# a run directory per sample, or (collected under torchrun) one per rank: train-*/rank<R>/
SAMPLES = sorted(
    p.parent for pattern in ("train-*/snapshot.pickle*", "train-*/rank*/snapshot.pickle*") for p in ROOT.glob(pattern)
)
EXPECTED = {
    "train-sd15-fp32",
    "train-sd15-amp-fp16",
    "train-sd15-amp-fp16-ckpt",
    "train-sd15-amp-fp16-adamw8bit",
    "train-sd15-amp-fp16-accum4",
    "train-sd15-amp-fp16-lora16",
    "train-sdxl-lora16",
    "train-sdxl-lora16-ckpt",
    "train-sd15-amp-fp16-adamw-fused",
    "train-sd15-amp-fp16-keep-grads",
    "train-sd15-amp-fp16-ema",
    "train-sd15-ddp-nccl-1rank",
    "train-sd15-ddp-gloo-2rank/rank0",
    "train-sd15-ddp-gloo-2rank/rank1",
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _name(path: pathlib.Path) -> str:
    """The sample's name: its folder, with the rank folder of a run collected under torchrun."""
    return path.relative_to(ROOT).as_posix()


def test_training_samples_present() -> None:
    assert {_name(p) for p in SAMPLES} == EXPECTED


@pytest.fixture(scope="module", params=SAMPLES, ids=_name)
def analysed(request: pytest.FixtureRequest) -> tuple[pathlib.Path, dict, dict, pd.DataFrame, pd.DataFrame]:
    run = load(str(request.param))
    assert run.run_json is not None and run.run_json["mode"] == "train"
    an = analyze_run(run)
    assert run.snapshot is not None
    allocs = classify_allocations(run.snapshot, an.replay, an.labels.labels)
    return request.param, run.run_json, summary_of(an), an.stages, allocs


@pytest.fixture()
def sample(analysed: tuple) -> tuple[pathlib.Path, dict, dict]:
    return analysed[:3]


@pytest.fixture()
def categorized(analysed: tuple) -> tuple[pathlib.Path, dict, pd.DataFrame, pd.DataFrame]:
    return analysed[0], analysed[1], analysed[3], analysed[4]


def test_every_phase_peak_equals_the_allocator(sample: tuple) -> None:
    path, rj, doc = sample
    assert doc["stage_source"] == "user_metadata"
    assert doc["peak"]["allocated_bytes"] == rj["allocator"]["max_memory_allocated"]
    intervals = {it["name"]: it for g in doc["stages"] for it in g["intervals"]}
    for stage in rj["stages"]:
        if stage["name"] not in intervals:
            # a phase with no allocator event (the closing `other`; zero_grad(set_to_none=False)
            # zeroes in place) is invisible in the trace: the allocator agrees nothing happened
            assert stage["peak_allocated_bytes"] == stage["allocated_at_start"] == stage["allocated_at_end"]
            continue
        it = intervals[stage["name"]]  # every other phase is found (names are unique)
        assert it["peak_allocated_bytes"] == stage["peak_allocated_bytes"], (path.name, stage["name"])
        assert it["peak_reserved_bytes"] == stage["peak_reserved_bytes"], (path.name, stage["name"])


def test_backward_allocations_carry_the_backward_label(sample: tuple) -> None:
    """Backward runs on autograd's device thread: the collector's hook labelled it, so no
    allocation is unlabelled and the backward phases hold the gradients' allocations."""
    path, rj, doc = sample
    assert rj["train"]["backward_threads_labelled"] >= 1
    groups = {g["name"] for g in doc["stages"]}
    assert "unlabelled" not in groups
    assert {"load", "forward", "backward", "optimizer"} <= groups
    assert ("zero_grad" in groups) == rj["train"]["set_to_none"]  # set_to_none frees
    backward = next(g for g in doc["stages"] if g["name"] == "backward")
    assert len(backward["intervals"]) == rj["steps"] * rj["train"]["accumulate"]


def test_gradient_and_state_bytes_follow_the_parameter_count(sample: tuple) -> None:
    path, rj, _ = sample
    train = rj["train"]
    params = train["params"]
    ((dtype, n),) = params["trainable_dtypes"].items()
    assert n == params["trainable"]
    width = DTYPE_BYTES[dtype]
    # one gradient per trainable weight, in the weight's dtype
    assert train["gradient_bytes"] == width * n
    states = train["optimizer_state_bytes"]
    if train["optimizer"] == "adamw8bit":
        # bitsandbytes: two uint8 moments (tensors under 4096 elements keep fp32 ones)
        moments = states["state1"] + states["state2"]
        assert abs(moments - 2 * n) / (2 * n) < 0.01
    else:
        assert states == {"exp_avg": width * n, "exp_avg_sq": width * n}
    if params["frozen"]:  # LoRA: the frozen base runs in the autocast dtype
        assert set(params["frozen_dtypes"]) == {"float16"}


def test_analyzer_categories_match_the_tensors(categorized: tuple) -> None:
    """After the last optimizer step the analyzer's gradients and optimizer state (from the
    snapshot alone) equal the bytes of the tensors the collector counted (within 1%)."""
    path, rj, stages, allocs = categorized
    train = rj["train"]
    last_opt = stages[stages["group"] == "optimizer"].iloc[-1]
    live = live_by_category(allocs, int(last_opt["end_row"]) - 1)
    assert live["gradients"] == pytest.approx(train["gradient_bytes"], rel=0.01)
    assert live["optimizer state"] == pytest.approx(sum(train["optimizer_state_bytes"].values()), rel=0.01)
    # EMA's shadow weights are made in load: parameters too
    weights = train["params"]["trainable_bytes"] + train["params"]["frozen_bytes"] + train["ema_bytes"]
    assert live["parameters"] == pytest.approx(weights, rel=0.01)


def test_checkpointing_shrinks_saved_activations() -> None:
    """The lesson's claim, read from the snapshots: with checkpointing far fewer bytes are
    saved for backward at the forward peak, and autocast's weight copies appear under AMP only."""

    def at_forward_peak(name: str) -> dict[str, int]:
        run = load(str(ROOT / name))
        an = analyze_run(run)
        assert run.snapshot is not None
        allocs = classify_allocations(run.snapshot, an.replay, an.labels.labels)
        fwd = an.stages[an.stages["name"] == "forward/1"].iloc[0]
        return live_by_category(allocs, int(fwd["peak_row"]))

    amp, ckpt, fp32, lora = (
        at_forward_peak(n)
        for n in ("train-sd15-amp-fp16", "train-sd15-amp-fp16-ckpt", "train-sd15-fp32", "train-sdxl-lora16")
    )
    assert ckpt["saved activations"] < 0.2 * amp["saved activations"]
    # no cast: fp32 runs without autocast, and LoRA's frozen base is already fp16
    assert fp32["autocast weight copies"] == 0 and lora["autocast weight copies"] == 0
    # one fp16 copy of every conv/linear weight: about half of the fp32 parameters
    assert 0.4 < amp["autocast weight copies"] / amp["parameters"] < 0.5


def test_categories_at_every_phase_peak_add_up_to_it(sample: tuple) -> None:
    """Each phase's and step's peak is split into categories that add up to it (memory from
    before the recording, none here, included), and the step holding the run's peak is in the
    phase run.json measured the highest."""
    path, rj, doc = sample
    training = doc["training"]
    for block in (*training["phases"], *training["steps"]):
        assert sum(block["categories_at_peak"].values()) == block["peak_allocated_bytes"], (
            path.name,
            block["name"] if "name" in block else block,
        )
    top = max(s["peak_allocated_bytes"] for s in rj["stages"])
    holders = {s["name"] for s in rj["stages"] if s["peak_allocated_bytes"] == top}
    assert doc["peak"]["stage"] in holders, (path.name, doc["peak"]["stage"], holders)
