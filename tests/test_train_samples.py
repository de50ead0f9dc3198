"""The analyzer against the allocator on the real H200 training samples (sample_snapshots/train-*).

run.json holds torch.cuda.max_memory_allocated()/max_memory_reserved() per phase (after
reset_peak_memory_stats() at each phase start) and, from the tensors themselves after the last
optimizer step, the gradient and optimizer-state bytes.
"""
from __future__ import annotations

import pathlib

import pytest

from snapviz.analyses.summary import analyze_run, summary_dict
from snapviz.load import load

ROOT = pathlib.Path(__file__).resolve().parents[1] / "sample_snapshots"
SAMPLES = sorted(p.parent for p in ROOT.glob("train-*/snapshot.pickle*"))
EXPECTED = {"train-sd15-fp32", "train-sd15-amp-fp16", "train-sd15-amp-fp16-ckpt",
            "train-sd15-amp-fp16-adamw8bit", "train-sd15-amp-fp16-accum4",
            "train-sd15-amp-fp16-lora16", "train-sdxl-lora16", "train-sdxl-lora16-ckpt"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def test_training_samples_present() -> None:
    assert {p.name for p in SAMPLES} == EXPECTED


@pytest.fixture(scope="module", params=SAMPLES, ids=lambda p: p.name)
def sample(request: pytest.FixtureRequest) -> tuple[pathlib.Path, dict, dict]:
    run = load(str(request.param))
    assert run.run is not None and run.run["mode"] == "train"
    return request.param, run.run, summary_dict(analyze_run(run))


def test_every_phase_peak_equals_the_allocator(sample: tuple) -> None:
    path, rj, doc = sample
    assert doc["stage_source"] == "user_metadata"
    assert doc["peak"]["allocated_bytes"] == rj["allocator"]["max_memory_allocated"]
    intervals = {it["name"]: it for g in doc["stages"] for it in g["intervals"]}
    for stage in rj["stages"]:
        if stage["name"] == "other" and stage["name"] not in intervals:
            continue  # the closing stage may see no allocator event
        it = intervals[stage["name"]]  # every phase is found (names are unique)
        assert it["peak_allocated_bytes"] == stage["peak_allocated_bytes"], (path.name, stage["name"])
        assert it["peak_reserved_bytes"] == stage["peak_reserved_bytes"], (path.name, stage["name"])


def test_backward_allocations_carry_the_backward_label(sample: tuple) -> None:
    """Backward runs on autograd's device thread: the collector's hook labelled it, so no
    allocation is unlabelled and the backward phases hold the gradients' allocations."""
    path, rj, doc = sample
    assert rj["train"]["backward_threads_labelled"] >= 1
    groups = {g["name"] for g in doc["stages"]}
    assert "unlabelled" not in groups
    assert {"load", "forward", "backward", "optimizer", "zero_grad"} <= groups
    backward = next(g for g in doc["stages"] if g["name"] == "backward")
    assert len(backward["intervals"]) == rj["steps"] * rj["train"]["accumulate"]


def test_gradient_and_state_bytes_follow_the_parameter_count(sample: tuple) -> None:
    path, rj, _ = sample
    train = rj["train"]
    params = train["params"]
    (dtype, n), = params["trainable_dtypes"].items()
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
