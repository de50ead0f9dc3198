"""The Python API and the CLI give the same documents and verdicts: snapviz.analyze's summary is
the golden ``analyze --json`` output, snapviz.compare's the ``compare --json`` output, and
snapviz.check's gates the lines and exit code of ``snapviz check``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import snapviz
from paths import ROOT, SAMPLES
from snapviz.render.json_summary import render_json
from snapviz.safe_text import bounded_doc

GOLDEN = ROOT / "tests" / "data" / "golden"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("sample", ["sd15-fp16-classic", "sd15-fp16-profile-1step", "train-sd15-amp-fp16"])
def test_analyze_summary_is_the_golden_json(sample: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the golden files hold the relative source path
    doc = snapviz.analyze(f"sample_snapshots/{sample}").summary()
    assert render_json(bounded_doc(doc)) == (GOLDEN / f"{sample}.json").read_text()


def test_trace_only_run_as_the_cli_sees_it(tmp_path: Path) -> None:
    for name in ("run.json", "trace.json.gz"):
        shutil.copy(SAMPLES / "sd15-fp16-profile-1step" / name, tmp_path / name)
    out = tmp_path / "summary.json"
    proc = _cli("analyze", str(tmp_path), "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert render_json(bounded_doc(snapviz.analyze(str(tmp_path)).summary())) == out.read_text()


def test_compare_summary_is_the_cli_json(tmp_path: Path) -> None:
    a, b = str(SAMPLES / "sdxl-fp16"), str(SAMPLES / "sdxl-fp16-vae-tiling")
    out = tmp_path / "compare.json"
    proc = _cli("compare", a, b, "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert render_json(bounded_doc(snapviz.compare(a, b).summary())) == out.read_text()


@pytest.mark.parametrize(
    "limits",
    [
        {"max_peak": "3GiB", "max_stage_peak": {"vae_decode": "3GiB", "denoise/0": "3GiB"}},
        {"max_reserved": "4GiB"},
    ],
)
def test_check_verdict_is_the_cli_verdict(limits: dict[str, object]) -> None:
    sample = str(SAMPLES / "sd15-fp16-classic")
    args = []
    for key, value in limits.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for stage, size in items:
            args += [f"--{key.replace('_', '-')}", f"{stage}={size}" if stage else str(size)]
    proc = _cli("check", sample, *args)
    result = snapviz.check(sample, **limits)  # type: ignore[arg-type]
    assert proc.returncode == (0 if result.passed else 1), proc.stderr
    assert proc.stdout.splitlines()[:-1] == [g.message for g in result.gates]
    assert result.passed == (limits.get("max_reserved") is not None)  # the sample reserves 3.64 GiB, peaks at 3.10
