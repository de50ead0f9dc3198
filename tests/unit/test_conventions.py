"""-o picks the format by extension; progress bars stay off when stderr is not a terminal."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from paths import ROOT

SAMPLE = ROOT / "sample_snapshots" / "sd15-fp16-sdpa"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_output_format_follows_the_extension(tmp_path: Path) -> None:
    outs = {ext: tmp_path / f"r.{ext}" for ext in ("md", "json", "html")}
    for ext, path in outs.items():
        r = _cli("analyze", str(SAMPLE), "-o", str(path), "-q")
        assert r.returncode == 0, r.stderr
    assert json.loads(outs["json"].read_text())["peak"]["allocated_bytes"] == 2831357440
    assert outs["md"].read_text().startswith("### GPU memory")
    assert outs["html"].read_text().lstrip().lower().startswith("<!doctype html")
    if importlib.util.find_spec("matplotlib") is not None:
        r = _cli("analyze", str(SAMPLE), "-o", str(tmp_path / "r.png"), "-q")
        assert r.returncode == 0 and (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = _cli("analyze", str(SAMPLE), "-o", str(tmp_path / "a.md"), "--markdown", str(tmp_path / "b.md"), "-q")
    assert r.returncode == 2 and "give one" in r.stderr and not (tmp_path / "a.md").exists()


def test_compare_without_a_terminal_prints_no_progress(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    r = _cli(
        "compare", str(SAMPLE), str(ROOT / "sample_snapshots" / "sd15-fp16-classic"), "-o", str(out), "-q", "-j", "1"
    )
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""
    from snapviz.analyses.compare_document import load_compare

    assert load_compare(json.loads(out.read_text()), str(out)).schema == "snapviz.compare/1"
