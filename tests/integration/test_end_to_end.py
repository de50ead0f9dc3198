"""snapviz collect -> snapviz analyze on CPU, end to end, for several technique combinations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from snapviz.cli import main  # noqa: E402

COMBOS = [
    ["fp32", "sdpa"],
    ["fp32", "classic", "vae-slicing"],
    ["bf16", "tiny-vae"],
]


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    return int(ei.value.code or 0)


@pytest.mark.parametrize("techniques", COMBOS, ids=["+".join(c) for c in COMBOS])
def test_collect_then_analyze(tmp_path: Path, techniques: list[str]) -> None:
    out = tmp_path / "run"
    args = [
        "collect",
        "--pipeline",
        "sd15",
        "--size",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--profile",
        "--out",
        str(out),
    ]
    for t in techniques:
        args += ["--technique", t]
    assert _run(args) == 0
    rj = json.loads((out / "run.json").read_text())
    assert _run(["analyze", str(out), "--json", str(tmp_path / "s.json"), "-o", str(tmp_path / "r.html"), "-q"]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["stage_source"] == "annotations"
    names = [s["name"] for s in doc["stages"]]
    assert names[:3] == ["text_encode", "denoise", "vae_decode"] or names[:4] == [
        "load",
        "text_encode",
        "denoise",
        "vae_decode",
    ]
    denoise = next(s for s in doc["stages"] if s["name"] == "denoise")
    assert [st["name"] for st in denoise["steps"]] == ["denoise/0", "denoise/1"]
    # the trace's CPU allocator totals peak somewhere inside the recorded stages
    assert doc["peak"]["allocated_bytes"] > 0
    assert doc["peak"]["stage"].split("/")[0] in {"load", "text_encode", "denoise", "vae_decode", "other"}
    rss = {s["name"]: s.get("rss_peak_bytes") for s in rj["stages"]}
    assert all(v and v > 0 for v in rss.values())
    assert (tmp_path / "r.html").stat().st_size > 100_000
    if "classic" in techniques:
        # classic attention materializes scores: the trace shows baddbmm + softmax shapes
        assert doc["attention"]["count"] > 0
    else:
        assert doc["attention"]["count"] == 0


def test_cpu_run_without_profile_flag_is_analysable(tmp_path: Path) -> None:
    """What a new user without a GPU types first: no --profile. The run directory must still
    hold a memory record (the trace, profiled by default on CPU) that analyze reads."""
    out = tmp_path / "run"
    assert (
        _run(["collect", "--pipeline", "sd15", "--size", "tiny", "--device", "cpu", "--steps", "1", "--out", str(out)])
        == 0
    )
    rj = json.loads((out / "run.json").read_text())
    assert rj["profile"] is True and (out / "trace.json.gz").is_file()
    assert _run(["analyze", str(out), "--json", str(tmp_path / "s.json"), "-q"]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["device"] == "cpu" and doc["history"]["events"] > 0 and doc["peak"]["allocated_bytes"] > 0
    assert [s["name"] for s in doc["stages"]][:3] == ["load", "text_encode", "denoise"]


def test_cpu_run_refuses_no_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert (
        _run(
            [
                "collect",
                "--pipeline",
                "sd15",
                "--size",
                "tiny",
                "--device",
                "cpu",
                "--steps",
                "1",
                "--no-profile",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to analyse" in err[0]
    assert not out.exists()
