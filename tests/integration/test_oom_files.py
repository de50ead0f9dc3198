"""OOM first on the files that showed the problem (issue 21 item 2): the bundled OOM sample and
a third-party OOM dump lead with the failed request, its size equal to the trace's own ``oom``
entry (read here with plain pickle/lzma, not snapviz) and its site."""

from __future__ import annotations

import json
import lzma
import pickle
from pathlib import Path
from typing import Any

import pytest

from paths import EXTERNAL, SAMPLES
from snapviz.cli import main

OOM_FIELDS = {
    "requested_bytes",
    "stream",
    "site",
    "stack",
    "stage",
    "allocated_bytes",
    "reserved_bytes",
    "cap_bytes",
    "cap_source",
    "device_free_bytes",
    "free_reserved_bytes",
    "largest_free_block_bytes",
    "verdict",
    "bytes_short",
    "live_categories",
    "live_sites",
    "advice",
    "headline",
    "verdict_text",
    "fix",
}


def _raw_oom(path: Path) -> tuple[int, dict[str, Any]]:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rb") as f:
        snap = pickle.load(f)  # noqa: S301 - a test reading a known file, never the product
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace:
            if e["action"] == "oom":
                return dev, e
    raise AssertionError("no oom entry")


def _run(tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any], str]:
    js, md = tmp_path / "s.json", tmp_path / "s.md"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(src), "--json", str(js), "--markdown", str(md)])
    assert exc.value.code == 0
    return capsys.readouterr().out, json.loads(js.read_text()), md.read_text()


def test_sdxl_oom_sample_leads_with_the_failed_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES / "sdxl-fp16-oom-10gb"
    dev, raw = _raw_oom(sample / "snapshot.pickle.xz")
    out, doc, md = _run(tmp_path, sample, capsys)
    oom = doc["oom"]
    assert OOM_FIELDS <= set(oom)
    assert oom["requested_bytes"] == raw["size"] == 1_073_741_824 and oom["device"] == dev
    assert oom["site"] == "diffusers/models/upsampling.py:186 forward" and oom["stage"] == "vae_decode"
    run = json.loads((sample / "run.json").read_text())
    assert oom["cap_bytes"] == run["memory_limit_bytes"] and oom["device_free_bytes"] == raw["device_free"]
    assert f"{oom['allocated_bytes'] / 2**30:.2f}" == "8.51" and f"{oom['reserved_bytes'] / 2**30:.2f}" == "9.34"
    assert oom["free_reserved_bytes"] == oom["reserved_bytes"] - oom["allocated_bytes"]
    assert 0 < oom["largest_free_block_bytes"] <= oom["free_reserved_bytes"]
    # under the cap beside what was allocated, but in no single piece: fragmented
    assert oom["allocated_bytes"] + oom["requested_bytes"] <= oom["cap_bytes"] and oom["verdict"] == "fragmented"
    assert oom["bytes_short"] == oom["requested_bytes"] - max(
        oom["largest_free_block_bytes"], oom["cap_bytes"] - oom["reserved_bytes"]
    )
    assert out.splitlines()[0] == oom["headline"] and "1,073,741,824 B" in oom["headline"]
    assert oom["headline"] in md.split("\n\n")[1] and "CUDA out of memory" in md.splitlines()[0]
    # the peak verdict is unchanged: it is still exact
    assert doc["peak"]["allocated_bytes"] == run["allocator"]["max_memory_allocated"]


@pytest.mark.skipif(not (EXTERNAL / "codeloc_qwen3_dp3gpu_expandable_oom.pickle").exists(), reason="corpus absent")
def test_third_party_expandable_oom_on_cuda1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXTERNAL / "codeloc_qwen3_dp3gpu_expandable_oom.pickle"
    dev, raw = _raw_oom(path)
    out, doc, _ = _run(tmp_path, path, capsys)
    oom = doc["oom"]
    assert dev == 1 and doc["device"] == 1 and oom["device"] == 1
    assert oom["requested_bytes"] == raw["size"] and oom["site"] == "src/train/models.py:181 update_nodes"
    assert oom["cap_bytes"] == oom["reserved_bytes"] + raw["device_free"]
    assert oom["verdict"] == "out of memory"
    assert oom["bytes_short"] == oom["allocated_bytes"] + oom["requested_bytes"] - oom["cap_bytes"]
    assert out.splitlines()[0] == oom["headline"]
