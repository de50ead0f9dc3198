"""Flux.1 and SD 3.5 tiny pipelines on CPU: collect -> analyze end to end, T5 dropped, the
prompt length option, option errors; and the GPU sample script's CPU path."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from paths import ROOT

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from click.testing import CliRunner, Result  # noqa: E402

from collectors.cli import collect  # noqa: E402
from snapviz.cli import main  # noqa: E402

if TYPE_CHECKING:
    from collectors.techniques import Plan

STAGES_2 = ["load", "text_encode", "denoise/0", "denoise/1", "vae_decode", "other"]


def _collect(out: Path, *args: str) -> Result:
    return CliRunner().invoke(collect, ["--device", "cpu", "--size", "tiny", "--steps", "2", *args, "--out", str(out)])


def _analyze(run: Path, tmp_path: Path) -> dict:
    with pytest.raises(SystemExit) as ei:
        main(["analyze", str(run), "--json", str(tmp_path / "s.json"), "-q"])
    assert int(ei.value.code or 0) == 0
    return json.loads((tmp_path / "s.json").read_text())


@pytest.mark.parametrize("pipeline", ["flux-dev", "sd35-large"])
def test_collect_then_analyze(tmp_path: Path, pipeline: str) -> None:
    out = tmp_path / "run"
    result = _collect(out, "--pipeline", pipeline, "-t", "bf16")
    assert result.exit_code == 0, result.output
    info = json.loads((out / "run.json").read_text())
    assert [s["name"] for s in info["stages"]] == STAGES_2
    assert info["techniques"] == ["bf16", "sdpa"]
    assert info["max_sequence_length"] == (512 if pipeline == "flux-dev" else 256)
    doc = _analyze(out, tmp_path)
    denoise = next(s for s in doc["stages"] if s["name"] == "denoise")
    assert [st["name"] for st in denoise["steps"]] == ["denoise/0", "denoise/1"]
    text = next(s for s in doc["stages"] if s["name"] == "text_encode")
    assert text["peak_allocated_bytes"] > 0  # CLIP and T5 ran inside the labelled stage


def test_sd35_without_t5_runs_no_t5_code(tmp_path: Path) -> None:
    t5_frames = {}
    for name, extra in (("t5", []), ("no-t5", ["-t", "no-t5", "--max-sequence-length", "32"])):
        out = tmp_path / name
        result = _collect(out, "--pipeline", "sd35-medium", "-t", "bf16", *extra)
        assert result.exit_code == 0, result.output
        info = json.loads((out / "run.json").read_text())
        assert [s["name"] for s in info["stages"]] == STAGES_2
        # the CPU trace keeps Python stacks: T5's module file shows up only when T5 ran
        t5_frames[name] = "modeling_t5.py" in gzip.open(out / "trace.json.gz", "rt").read()
        if extra:
            assert info["techniques"] == ["bf16", "sdpa", "no-t5"]
            assert info["max_sequence_length"] == 32
            assert "--max-sequence-length 32" in info["command"]
            _analyze(out, tmp_path)
    assert t5_frames == {"t5": True, "no-t5": False}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--pipeline", "flux-schnell", "-t", "no-t5"], "cannot run without its T5"),
        (["--pipeline", "flux-dev", "--max-sequence-length", "600"], "between 1 and 512"),
        (["--pipeline", "sd15", "--max-sequence-length", "64"], "only CLIP"),
        (["--pipeline", "sd35-large", "-t", "nf4-transformer"], "CUDA"),
        (["--pipeline", "flux-dev", "--train"], "--train fine-tunes"),
    ],
)
def test_impossible_options_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "run"
    result = _collect(out, *args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], lines
    assert not out.exists()


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "sample_snapshots" / "record_flux_samples.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_sample_script_dry_run_lists_the_five_gpu_samples(tmp_path: Path) -> None:
    res = _script("--out", str(tmp_path), "--dry-run")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 5
    assert all("--size full --device cuda" in ln for ln in lines)
    wanted = [
        "flux-dev --steps 4 -t bf16 --size",
        "-t group-offload",
        "-t nf4-transformer",
        "sd35-large --steps 4 -t bf16 --size",
        "-t no-t5",
    ]
    assert [next(i for i, ln in enumerate(lines) if w in ln) for w in wanted] == [0, 1, 2, 3, 4]
    assert _script("--out", str(tmp_path), "--only", "nope").returncode == 2


def test_sample_script_on_cpu_records_what_cpu_allows(tmp_path: Path) -> None:
    """The CPU path: a tiny sample is recorded and packed; a CUDA-only one fails, is reported in
    its summary line with the reason, and does not stop the script."""
    res = _script(
        "--out",
        str(tmp_path),
        "--size",
        "tiny",
        "--device",
        "cpu",
        "--only",
        "sd35-large-bf16-no-t5,flux-dev-bf16-nf4-transformer",
    )
    lines = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [ln["name"] for ln in lines] == ["flux-dev-bf16-nf4-transformer", "sd35-large-bf16-no-t5"]
    nf4, no_t5 = lines
    assert nf4["rc"] == 2 and "CUDA" in nf4["why"]
    assert no_t5["rc"] == 0 and no_t5["status"] == "ok" and no_t5["fits_2MB"]
    assert res.returncode == 1  # not every sample was recorded
    assert json.loads((tmp_path / "summary.json").read_text()) == lines


def _tiny(pipeline: str, techniques: list[str]) -> tuple[Any, Plan]:
    from collectors import techniques as tq
    from collectors.pipelines import build_pipeline

    p = tq.plan(techniques, device="cpu", pipeline=pipeline, num_gpus=0)
    pipe = build_pipeline(pipeline, "tiny", p.dtype)
    pipe.set_progress_bar_config(disable=True)
    tq.apply_module_techniques(pipe, p, height=64, width=64)
    tq.quantize_after_load(pipe, p)
    return pipe, p


def test_layerwise_fp8_stores_the_transformer_in_fp8(tmp_path: Path) -> None:
    import torch

    pipe, _ = _tiny("sd35-large", ["bf16", "layerwise-fp8"])
    linear = pipe.transformer.transformer_blocks[0].attn.to_q
    assert linear.weight.dtype == torch.float8_e4m3fn  # stored in fp8, upcast per layer to run
    assert pipe("a cat", num_inference_steps=1, height=64, width=64).images[0].size == (64, 64)


@pytest.mark.parametrize(
    "technique,module,cls", [("qint8", "optimum.quanto", "QLinear"), ("int8", "torchao", "Linear")]
)
def test_weight_quantization_replaces_the_denoiser_weights(technique: str, module: str, cls: str) -> None:
    pytest.importorskip(module)
    pipe, _ = _tiny("pixart-sigma", ["fp32", technique])
    q = pipe.transformer.transformer_blocks[0].attn1.to_q
    assert type(q).__name__ == cls
    assert type(q.weight).__name__ not in ("Parameter", "Tensor")  # a quantized tensor subclass
    assert pipe(
        "a cat", num_inference_steps=1, height=64, width=64, clean_caption=False, use_resolution_binning=False
    ).images[0].size == (64, 64)
