"""snapviz collect --train on CPU with tiny configs: phases, run.json, techniques, exit codes,
and collect -> analyze end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

from click.testing import CliRunner, Result  # noqa: E402

from collectors.cli import collect  # noqa: E402
from snapviz.cli import main  # noqa: E402


def _collect(tmp_path: Path, *args: str, name: str = "run") -> tuple[Result, Path]:
    out = tmp_path / name
    result = CliRunner().invoke(collect, ["--train", "--device", "cpu", "--size", "tiny", *args, "--out", str(out)])
    return result, out


def _phases(info: dict) -> list[str]:
    return [s["name"] for s in info["stages"]]


def _contiguous(info: dict) -> None:
    stages = info["stages"]
    for a, b in zip(stages, stages[1:]):
        assert a["end_us"] == b["start_us"] or b["start_us"] - a["end_us"] < 1000, (a["name"], b["name"])


def test_train_then_analyze(tmp_path: Path) -> None:
    """The brief's end to end: a tiny fine-tune on CPU, then snapviz analyze exits 0."""
    res, out = _collect(tmp_path, "--pipeline", "sd15", "--steps", "2", "--profile")
    assert res.exit_code == 0, res.output
    info = json.loads((out / "run.json").read_text())
    assert _phases(info) == [
        "load",
        "forward/0",
        "backward/0",
        "optimizer/0",
        "zero_grad/0",
        "forward/1",
        "backward/1",
        "optimizer/1",
        "zero_grad/1",
        "other",
    ]
    _contiguous(info)
    train = info["train"]
    params = train["params"]
    assert params["frozen"] == 0 and params["trainable"] > 0
    # fp32 AdamW: gradients = weights, two fp32 moments per trainable weight
    assert train["gradient_bytes"] == params["trainable_bytes"] == 4 * params["trainable"]
    assert train["optimizer_state_bytes"] == {"exp_avg": 4 * params["trainable"], "exp_avg_sq": 4 * params["trainable"]}
    assert len(train["step_wall_s"]) == 2
    assert [s["step"] for s in info["stages"][1:-1]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "--train" in info["command"] and info["mode"] == "train"
    with pytest.raises(SystemExit) as ei:
        main(["analyze", str(out), "--json", str(tmp_path / "s.json"), "-q"])
    assert ei.value.code == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    groups = {s["name"]: [st["name"] for st in s["steps"]] for s in doc["stages"]}
    for phase in ("forward", "backward", "optimizer", "zero_grad"):
        assert groups[phase] == [f"{phase}/0", f"{phase}/1"], groups


def test_accumulation_indexes_micro_batches(tmp_path: Path) -> None:
    res, out = _collect(tmp_path, "--pipeline", "sd15", "--steps", "2", "--accumulate", "2", "--no-history")
    assert res.exit_code == 0, res.output
    info = json.loads((out / "run.json").read_text())
    assert _phases(info)[1:-1] == [
        "forward/0",
        "backward/0",
        "forward/1",
        "backward/1",
        "optimizer/0",
        "zero_grad/0",
        "forward/2",
        "backward/2",
        "forward/3",
        "backward/3",
        "optimizer/1",
        "zero_grad/1",
    ]
    assert [s.get("micro") for s in info["stages"][1:7]] == [0, 0, 1, 1, None, None]
    assert info["train"]["effective_batch"] == 2


@pytest.mark.parametrize(
    "pipeline,args",
    [
        ("sdxl", ["--lora-rank", "4", "-t", "checkpointing", "-t", "amp-bf16"]),
        ("pixart-sigma", ["-t", "ema", "-t", "keep-grads", "--optimizer", "adafactor"]),
        ("sd15", ["-t", "bf16", "-t", "classic", "--optimizer", "sgd"]),
        ("sd15", ["--optimizer", "adamw-fused", "--batch", "2"]),
    ],
    ids=["sdxl-lora-ckpt-ampbf16", "pixart-ema-keep-adafactor", "sd15-bf16-classic-sgd", "sd15-fused-b2"],
)
def test_techniques(tmp_path: Path, pipeline: str, args: list[str]) -> None:
    if "--lora-rank" in args:
        pytest.importorskip("peft")
    res, out = _collect(tmp_path, "--pipeline", pipeline, "--steps", "1", *args)
    assert res.exit_code == 0, res.output
    info = json.loads((out / "run.json").read_text())
    train = info["train"]
    params = train["params"]
    if "--lora-rank" in args:
        # LoRA: base weights frozen in the autocast dtype, adapters trainable in fp32
        assert params["frozen_dtypes"] == {"bfloat16": params["frozen"]}
        assert params["trainable_dtypes"] == {"float32": params["trainable"]}
        assert 0 < params["trainable"] < params["frozen"] / 2
        assert train["gradient_bytes"] == 4 * params["trainable"]
    if "bf16" in args:
        assert params["trainable_dtypes"] == {"bfloat16": params["trainable"]}
        assert train["gradient_bytes"] == 2 * params["trainable"]
    if "sgd" in args:
        assert train["optimizer_state_bytes"] == {}
    if "adafactor" in args:  # factored second moments: far below one value per weight
        assert 0 < sum(train["optimizer_state_bytes"].values()) < 4 * params["trainable"]
    if "ema" in args:
        assert train["ema_bytes"] == params["trainable_bytes"]
    if "keep-grads" in args:
        assert train["set_to_none"] is False
    assert train["checkpointing"] == ("checkpointing" in args)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-t", "amp-fp16"], "amp-fp16 (autocast float16 + GradScaler) needs a CUDA device"),
        (["--optimizer", "adamw8bit"], "adamw8bit (bitsandbytes AdamW8bit) needs a CUDA device"),
        (["--optimizer", "lion"], "unknown optimizer 'lion'"),
        (["-t", "fp16"], "fp16 is an inference technique"),
        (["-t", "vae-tiling"], "vae-tiling is an inference technique"),
        (["-t", "fp32", "-t", "bf16"], "pick one precision"),
        (["--model", "/nonexistent"], "--model is not supported with --train"),
    ],
)
def test_impossible_training_options_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    res, out = _collect(tmp_path, "--pipeline", "sd15", *args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output
    assert not out.exists()


def test_training_options_need_train(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        collect, ["--pipeline", "sd15", "--device", "cpu", "--accumulate", "2", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "need --train" in result.output


def test_record_api_around_own_loop(tmp_path: Path) -> None:
    """collectors.record(model, ..., train=True) around a plain PyTorch loop."""
    import collectors

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with collectors.record(model, tmp_path / "mine", device="cpu", train=True) as rec:
        with rec.stage("load"):
            model.to("cpu")
        for _ in range(2):
            with rec.phase("forward"):
                loss = model(torch.randn(4, 8)).pow(2).mean()
            rec.backward(loss)
            with rec.phase("optimizer"):
                opt.step()
            with rec.phase("zero_grad"):
                opt.zero_grad()
            rec.next_step()
    info = json.loads((tmp_path / "mine" / "run.json").read_text())
    names = [s["name"] for s in info["stages"] if s["name"] != "other"]
    assert names == [
        "load",
        "forward/0",
        "backward/0",
        "optimizer/0",
        "zero_grad/0",
        "forward/1",
        "backward/1",
        "optimizer/1",
        "zero_grad/1",
    ]
