"""Collectors on CPU with tiny pipelines: stage contract, run.json, traces, option errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from click.testing import CliRunner, Result  # noqa: E402

from collectors.cli import collect  # noqa: E402

REQUIRED_RUN_KEYS = {
    "schema",
    "pipeline",
    "size",
    "techniques",
    "height",
    "width",
    "steps",
    "batch",
    "dtype",
    "device",
    "device_name",
    "num_devices",
    "torch_version",
    "diffusers_version",
    "transformers_version",
    "command",
    "status",
    "history",
    "alloc_conf",
    "allocator",
    "stages",
    "wall_s",
}
REQUIRED_STAGE_KEYS = {
    "name",
    "start_us",
    "end_us",
    "wall_s",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "allocated_at_start",
    "allocated_at_end",
    "per_device",
    "rss_peak_bytes",
}


def _collect(tmp_path: Path, *args: str) -> tuple[Result, Path]:
    out = tmp_path / "run"
    result = CliRunner().invoke(collect, ["--device", "cpu", "--size", "tiny", *args, "--out", str(out)])
    return result, out


def _run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def _assert_contract(info: dict, steps: int) -> list[str]:
    assert info["schema"] == "snapviz.run/1"
    assert REQUIRED_RUN_KEYS <= set(info), REQUIRED_RUN_KEYS - set(info)
    assert info["status"] == "ok"
    stages = info["stages"]
    for s in stages:
        assert REQUIRED_STAGE_KEYS <= set(s), REQUIRED_STAGE_KEYS - set(s)
        assert s["end_us"] >= s["start_us"]
        assert s["rss_peak_bytes"] > 0
    # contiguous from start to finish
    for a, b in zip(stages, stages[1:]):
        assert a["end_us"] == b["start_us"], (a["name"], b["name"])
    names = [s["name"] for s in stages]
    denoise = [n for n in names if n.startswith("denoise/")]
    assert denoise == [f"denoise/{i}" for i in range(steps)]
    return names


@pytest.mark.parametrize(
    "pipeline,techniques,expect",
    [
        ("sd15", ["fp32", "sdpa"], ["fp32", "sdpa"]),
        ("sd15", ["fp32", "classic", "vae-slicing"], ["fp32", "classic", "vae-slicing"]),
        ("sdxl", ["bf16", "tiny-vae"], ["bf16", "sdpa", "tiny-vae"]),
        ("pixart-sigma", ["sliced", "vae-tiling"], ["fp32", "sliced", "vae-tiling"]),
    ],
)
def test_stage_order_and_run_json(tmp_path: Path, pipeline: str, techniques: list[str], expect: list[str]) -> None:
    args = ["--pipeline", pipeline, "--steps", "3"]
    for t in techniques:
        args += ["-t", t]
    result, out = _collect(tmp_path, *args)
    assert result.exit_code == 0, result.output
    info = _run_json(out)
    names = _assert_contract(info, steps=3)
    assert names == ["load", "text_encode", "denoise/0", "denoise/1", "denoise/2", "vae_decode", "other"]
    assert info["techniques"] == expect
    assert info["pipeline"] == pipeline and info["steps"] == 3
    assert info["device"] == "cpu" and info["allocator"] is None
    assert info["history"]["enabled"] is False  # no memory history on CPU
    assert not (out / "snapshot.pickle").exists()
    assert (out / "image.png").exists()
    assert "--pipeline " + pipeline in info["command"]
    for t in expect:
        assert f"--technique {t}" in info["command"]


def test_staged_pixart_repeats_load(tmp_path: Path) -> None:
    result, out = _collect(tmp_path, "--pipeline", "pixart-sigma", "--steps", "2", "-t", "staged")
    assert result.exit_code == 0, result.output
    info = _run_json(out)
    names = _assert_contract(info, steps=2)
    assert names[:2] == ["load", "text_encode"]
    # text encoder, then transformer, then VAE: three loads, the VAE's right before decode
    assert names.count("load") == 3
    assert names.index("load", 1) < names.index("denoise/0")
    assert names[-2:] == ["load", "vae_decode"]
    assert "staged" in info["techniques"]


def test_profile_trace_has_memory_and_stage_ranges(tmp_path: Path) -> None:
    result, out = _collect(tmp_path, "--pipeline", "sd15", "--steps", "2", "--profile")
    assert result.exit_code == 0, result.output
    info = _run_json(out)
    stage_names = [s["name"] for s in info["stages"]]
    with gzip.open(out / "trace.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    assert any(e.get("name") == "[memory]" for e in events)
    ranges = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert ranges == stage_names
    assert "trace.json.gz" in info["files"]


def test_profile_after_load_skips_load_range(tmp_path: Path) -> None:
    result, out = _collect(tmp_path, "--pipeline", "sd15", "--steps", "1", "--profile", "--profile-scope", "after-load")
    assert result.exit_code == 0, result.output
    with gzip.open(out / "trace.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    ranges = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert ranges == ["text_encode", "denoise/0", "vae_decode", "other"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-t", "model-offload"], "CUDA"),
        (["-t", "sequential-offload"], "CUDA"),
        (["-t", "nf4-text-encoder"], "CUDA"),
        (["-t", "staged"], "pixart-sigma"),
        (["-t", "balanced"], "CUDA"),
        (["-t", "fp16", "-t", "bf16"], "one dtype"),
        (["-t", "classic", "-t", "sliced"], "attention"),
        (["-t", "warp-drive"], "unknown technique"),
        (["--height", "100"], "multiples of 8"),
    ],
)
def test_impossible_options_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    result, out = _collect(tmp_path, "--pipeline", "sd15", *args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert needle in lines[0]
    assert not out.exists()  # nothing written before validation


def test_record_api_with_user_pipeline(tmp_path: Path) -> None:
    import collectors
    from collectors.pipelines import build_pipeline

    pipe = build_pipeline("sd15", "tiny", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    cls = type(pipe)
    with collectors.record(pipe, tmp_path / "mine", device="cpu", meta={"pipeline": "sd15"}) as rec:
        with rec.stage("load"):
            pipe.to("cpu")
        pipe("a cat", num_inference_steps=2, height=64, width=64)
        pipe("a dog", num_inference_steps=1, height=64, width=64)
    assert type(pipe) is cls  # hooks removed, class restored
    info = _run_json(tmp_path / "mine")
    names = [s["name"] for s in info["stages"]]
    assert names == [
        "other",
        "load",
        "other",
        "text_encode",
        "denoise/0",
        "denoise/1",
        "vae_decode",
        "other",
        "text_encode",
        "denoise/0",
        "vae_decode",
        "other",
    ]
    # hooks are gone: calling again outside the recorder records nothing more
    pipe("a cow", num_inference_steps=1, height=64, width=64)
    assert len(_run_json(tmp_path / "mine")["stages"]) == len(names)


@pytest.mark.parametrize("train", [False, True])
def test_alloc_conf_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    """--alloc-conf sets PYTORCH_CUDA_ALLOC_CONF before CUDA starts; a CPU run has no caching
    allocator, so there it is only recorded (run.json and the reproducing command)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)  # restored after the test
    conf = "roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6"
    result, out = _collect(
        tmp_path,
        "--pipeline",
        "sd15",
        "--steps",
        "1",
        "--alloc-conf",
        conf,
        *(["--train", "--batch", "1"] if train else []),
    )
    assert result.exit_code == 0, result.output
    info = _run_json(out)
    assert info["alloc_conf"] == conf
    assert info["allocator"] is None  # no caching allocator on the CPU
    assert f"--alloc-conf '{conf}'" in info["command"]


def test_alloc_conf_unset_is_recorded_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    result, out = _collect(tmp_path, "--pipeline", "sd15", "--steps", "1")
    assert result.exit_code == 0, result.output
    info = _run_json(out)
    assert info["alloc_conf"] == "" and "--alloc-conf" not in info["command"]


@pytest.mark.parametrize("conf", ["", "  ", "expandable_segments:True\x1b[31m"])
def test_bad_alloc_conf_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf: str) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    result, out = _collect(tmp_path, "--pipeline", "sd15", "--alloc-conf", conf)
    assert result.exit_code == 2, result.output
    assert "--alloc-conf" in result.output and not out.exists()


def test_caught_oom_does_not_fail_the_run(tmp_path: Path) -> None:
    """An OOM that PyTorch catches (cuDNN retries with a smaller workspace) fires the OOM observer
    but the run goes on: run.json says ok and keeps it as caught_oom; one that escapes is the
    run's failure."""
    from collectors.oom import save_on_oom
    from collectors.recorder import Recorder

    rec = Recorder(None, tmp_path / "caught", device="cpu", meta={"pipeline": "none"})
    with rec:
        save_on_oom(rec, 0, 270532608, 1 << 30, 0)
        assert _run_json(tmp_path / "caught")["status"] == "oom"  # what a crash would leave
    info = _run_json(tmp_path / "caught")
    assert info["status"] == "ok" and "oom" not in info
    assert info["caught_oom"]["requested_bytes"] == 270532608 and info["ooms_seen"] == 1

    rec = Recorder(None, tmp_path / "raised", device="cpu", meta={"pipeline": "none"})
    with pytest.raises(torch.OutOfMemoryError), rec:
        save_on_oom(rec, 0, 4096, 1 << 30, 0)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 KiB.")
    info = _run_json(tmp_path / "raised")
    assert info["status"] == "oom" and info["oom"]["requested_bytes"] == 4096
