"""``snapviz fit`` end to end: the plan (``--dry-run``), the refusal on CPU, and a whole search
with a fake collector injected in place of the GPU processes (tests/support/fitfake.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from collectors.fit import DEFAULT_CANDIDATES, Card
from collectors.fit import cli as fit_cli
from collectors.matrix.runner import MatrixOptions, VariantResult
from collectors.matrix.variants import Variant
from fitfake import TRUTH, FakeRunner
from paths import ROOT

TECHNIQUES = (
    "fp32",
    "fp16",
    "bf16",
    "vae-tiling",
    "vae-slicing",
    "layerwise-fp8",
    "nf4-transformer",
    "nf4-t5",
    "group-offload",
    "model-offload",
    "sequential-offload",
    "no-t5",
)


@pytest.fixture
def flux_collectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collectors as they are once the Flux pipelines are in (collectors/pipelines.py names)."""
    monkeypatch.setattr(
        fit_cli, "collector_names", lambda: (("sd15", "flux-dev", "sd35-large"), TECHNIQUES, {"bfloat16": "bf16"})
    )


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, flux_collectors: None) -> None:
    res = CliRunner().invoke(
        fit_cli.fit,
        [
            "--pipeline",
            "flux-dev",
            "--gpu-memory",
            "16GiB",
            "--gpu-memory",
            "24GiB",
            "--out",
            str(tmp_path / "never"),
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    plan = [ln.split() for ln in lines if ln.strip()[:1].isdigit()]
    # cards largest first; on each, cheap combinations first (offload last)
    assert [p[1] + p[2] for p in plan[:1]] == ["24GiB"] and plan[-1][1:3] == ["16", "GiB"]
    labels = [p[3] for p in plan if p[1] == "24"]
    assert labels == [p[3] for p in plan if p[1] == "16"] and len(plan) == 2 * len(labels)
    assert labels[-1] == "bf16+sequential-offload" and labels.index("bf16+vae-tiling") < labels.index("bf16")
    assert max(i for i, v in enumerate(labels) if "offload" not in v) < min(
        i for i, v in enumerate(labels) if "offload" in v
    )
    # every default candidate is either planned or skipped with the installed collectors' reason
    skipped = [ln.split()[1].rstrip(":") for ln in lines if ln.strip().startswith("skip ")]
    assert sorted(labels + skipped) == sorted(v.replace(",", "+") for v in DEFAULT_CANDIDATES["flux"])
    assert not (tmp_path / "never").exists()


def test_cpu_exits_2_with_one_line_unless_dry_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "never"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "collectors.fit",
            "--pipeline",
            "sd15",
            "--size",
            "tiny",
            "--variant",
            "fp16",
            "--gpu-memory",
            "8GiB",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "fit needs a CUDA GPU" in res.stderr
    assert not out.exists()
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "collectors.fit",
            "--pipeline",
            "sd15",
            "--size",
            "tiny",
            "--variant",
            "fp16",
            "--variant",
            "fp16,vae-tiling",
            "--gpu-memory",
            "8GiB",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr
    assert "8 GiB" in dry.stdout and "fp16+vae-tiling" in dry.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpu-memory", "lots"], "--gpu-memory 'lots'"),
        (["--variant", "bf16,bogus"], "unknown technique 'bogus'"),
        (["--variant", "bf16", "--variant", "bf16"], "given twice"),
        (["--pipeline", "sd15"], "no default candidate set"),
        (["--pipeline", "kandinsky"], "the installed collectors build"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, flux_collectors: None, args: list[str], message: str) -> None:
    base = ["--pipeline", "flux-dev"] if "--pipeline" not in args else []
    res = CliRunner().invoke(fit_cli.fit, [*base, *args, "--out", str(tmp_path / "never"), "--dry-run"])
    assert res.exit_code == 2 and message in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_search_with_a_fake_collector(tmp_path: Path, flux_collectors: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunner(tmp_path / "fake")
    seen: list[MatrixOptions] = []

    def run_variant(opts: MatrixOptions, v: Variant, card: Card, gpu: str | None) -> VariantResult:
        seen.append(opts)
        return fake(v, card)

    monkeypatch.setattr(fit_cli, "probe_cuda", lambda: "0")
    monkeypatch.setattr(fit_cli, "run_variant", run_variant)
    out = tmp_path / "out"
    args = [
        "--pipeline",
        "flux-dev",
        "--gpu-memory",
        "24GiB",
        "--gpu-memory",
        "12GiB",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    for v in TRUTH:
        args += ["--variant", v]
    res = CliRunner().invoke(fit_cli.fit, args)
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} >= {"fit.json", "fit.md", "fit.html"}
    page = (out / "fit.html").read_text()
    # the page kit's cards: one fit table per card inside the fit card, then a matrix card per card
    assert (
        page.count('id="sv-fit-table-') == 2
        and page.count('id="sv-matrix-0"') == page.count('id="sv-matrix-1"') == 1
        and page.count('id="sv-fit"') == 1
    )
    doc = json.loads((out / "fit.json").read_text())
    assert doc["schema"] == "snapviz.fit/1" and doc["steps"] == 2
    by = {c["label"]: c for c in doc["cards"]}
    assert by["24 GiB"]["fastest"] == "bf16+layerwise-fp8" and by["12 GiB"]["fastest"] == "bf16+nf4-transformer+nf4-t5"
    assert doc["runs"] == len(fake.calls) and doc["pruned"] > 0
    assert doc["pruned"] + doc["inferred"] == 2 * len(TRUTH) - len(fake.calls)
    pruned = [r for r in by["12 GiB"]["rows"] if r["status"] == "pruned"]
    assert pruned and all(r["reason"] for r in pruned)
    assert "Fastest that fits 12 GiB" in res.stdout
    assert all(o.device == "cuda" and o.history is False for o in seen)


def test_registered_beside_matrix() -> None:
    from collectors import cli

    assert cli.fit is fit_cli.fit and "fit" in cli.__all__
