"""The analyzer against the allocator's own numbers on real H200 snapshots.

Every sample in sample_snapshots/ was recorded by our collectors on a real GPU; run.json
holds what torch.cuda.max_memory_allocated()/max_memory_reserved() reported in the same
process, overall and per stage (after reset_peak_memory_stats() at each stage start).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from paths import ROOT
from snapviz.analyses.document import from_json
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.load import load

SAMPLES = sorted(p.parent for p in ROOT.glob("sample_snapshots/*/snapshot.pickle*"))


def _ids(p: pathlib.Path) -> str:
    return p.name


def test_samples_present() -> None:
    assert len(SAMPLES) >= 2, "real GPU samples are missing from sample_snapshots/"


def test_samples_cover_both_roundup_forms() -> None:
    """Issue 28: runs under roundup_power2_divisions, one number and per interval, are among the
    samples whose replayed peaks must equal the allocator's (test_overall_peaks_match_allocator)."""
    confs = [json.loads((p / "run.json").read_text()).get("alloc_conf") or "" for p in SAMPLES]
    assert any(
        c.startswith("roundup_power2_divisions:") and c[len("roundup_power2_divisions:") :].isdigit() for c in confs
    )
    assert any(c.startswith("roundup_power2_divisions:[") for c in confs)


@pytest.fixture(scope="module", params=SAMPLES, ids=_ids)
def sample(request: pytest.FixtureRequest) -> tuple[pathlib.Path, dict, list]:
    run = load(str(request.param))
    rj = run.run_json
    assert rj is not None and rj["schema"] == "snapviz.run/1"
    devices = [d["device"] for d in (rj["allocator"].get("devices") or [{"device": rj["allocator"]["device"]}])]
    docs = [(d, summary_of(analyze_run(run, device=d))) for d in devices]
    return request.param, rj, docs


def _device_truth(rj: dict, device: int) -> dict:
    for d in rj["allocator"].get("devices") or []:
        if d["device"] == device:
            return d
    return rj["allocator"]


def test_overall_peaks_match_allocator(sample: tuple) -> None:
    path, rj, docs = sample
    for device, doc in docs:
        truth = _device_truth(rj, device)
        assert doc["peak"]["allocated_bytes"] == truth["max_memory_allocated"], (path.name, device)
        assert doc["peak"]["reserved_bytes"] == truth["max_memory_reserved"], (path.name, device)
        assert doc["history"]["end_state_matches"] is True
        assert doc["history"]["truncated"] is False
        assert "approximate" not in doc["peak"], doc["warnings"]  # the recorded settings are honoured


def test_stage_peaks_match_allocator(sample: tuple) -> None:
    """Each stage interval's peak equals max_memory_allocated/reserved after the reset at its start."""
    path, rj, docs = sample
    device, doc = docs[0]
    intervals = [it for g in doc["stages"] for it in g["intervals"]]
    checked = 0
    for it in intervals:
        if it.get("allocator_peak_allocated_bytes") is None:
            continue
        assert it["peak_allocated_bytes"] == it["allocator_peak_allocated_bytes"], (path.name, it["name"])
        assert it["peak_reserved_bytes"] == it["allocator_peak_reserved_bytes"], (path.name, it["name"])
        checked += 1
    if rj.get("mode") == "train":
        # phases, not denoise steps; phases without allocator events: tests/integration/test_train_samples.py
        return
    # Every run.json stage that saw an allocation event was matched.
    assert checked >= len([s for s in rj["stages"] if s["name"] != "other"]) - 1
    steps = [s for s in doc["stages"] if s["name"] == "denoise"]
    assert steps and len(steps[0]["steps"]) == rj["steps"]


def test_requested_replay_would_be_wrong(sample: tuple) -> None:
    """Rounding matters: summing requested sizes underestimates the allocator's peak."""
    path, rj, docs = sample
    _, doc = docs[0]
    assert doc["peak"]["requested_bytes"] < doc["peak"]["allocated_bytes"]


def test_sidecar_documents_how_it_was_made(sample: tuple) -> None:
    path, rj, _ = sample
    for key in ("command", "torch_version", "device_name", "pipeline", "techniques"):
        assert rj.get(key), (path.name, key)
    # the allocator's own figures per stage; a program that labels nothing (recorded by
    # sample_snapshots/record_user_train.py) has them per phase, kept out of the stage timeline
    assert rj.get("stages") or rj.get("phases"), path.name
    assert all("peak_allocated_bytes" in s for s in rj.get("stages") or rj["phases"]), path.name
    assert "H200" in rj["device_name"]
    assert path.joinpath("snapshot.pickle.xz").stat().st_size <= 2 * 1024 * 1024


def test_no_placeholders_in_reports(sample: tuple) -> None:
    """Terminal, Markdown and JSON strings of real runs carry no 'None', '-1' or empty values."""
    from placeholders import placeholder_lines, placeholder_strings
    from snapviz.render.markdown import render_markdown
    from snapviz.render.terminal import render_terminal

    path, _, docs = sample
    for _, doc in docs:
        for text in (render_terminal(from_json(doc)), render_markdown(from_json(doc))):
            assert not placeholder_lines(text), (path.name, placeholder_lines(text)[:3])
        assert not placeholder_strings(doc), (path.name, placeholder_strings(doc)[:5])


def test_allocator_truth_is_the_shown_devices(sample: tuple) -> None:
    """Each device's replay is compared with that device's own max_memory_allocated/reserved
    (run.json's per-device figures), never with another device's."""
    from snapviz.render.html.view_common import allocator_truth
    from snapviz.render.markdown import render_markdown
    from snapviz.render.terminal import render_terminal

    path, rj, docs = sample
    for device, doc in docs:
        truth = _device_truth(rj, device)
        assert doc["allocator_truth"] == {
            "max_memory_allocated": truth["max_memory_allocated"],
            "max_memory_reserved": truth["max_memory_reserved"],
        }, (path.name, device)
        term = render_terminal(from_json(doc))
        assert "(exact match)" in term and "replay differs" not in term, (path.name, device)
        assert f"| {truth['max_memory_allocated']:,} |" in render_markdown(from_json(doc))
        badge = allocator_truth(from_json(doc))
        assert badge is not None and badge.status == "match", (path.name, device, badge)
        if len(docs) > 1:  # the device was chosen: the warning says so, not "highest peak"
            chosen = [w for w in doc["warnings"] if "devices in this snapshot" in w]
            assert chosen == [f"{len(docs)} devices in this snapshot; showing device {device} (chosen with --device)"]


def test_device_flag_on_the_balanced_sample() -> None:
    """``analyze sdxl-fp16-balanced --device 1``: device 1's own maximum (in run.json) equals
    the replay; before, device 0's figures were used (-8,984,042,496 B, "-84.24% off")."""
    import subprocess
    import sys

    path = ROOT / "sample_snapshots" / "sdxl-fp16-balanced"
    rj = json.loads((path / "run.json").read_text())
    dev1 = next(d for d in rj["allocator"]["devices"] if d["device"] == 1)
    out = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(path), "--device", "1", "--json", "-", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["device"] == 1
    assert (
        doc["peak"]["allocated_bytes"] == dev1["max_memory_allocated"] == doc["allocator_truth"]["max_memory_allocated"]
    )
    assert doc["peak"]["reserved_bytes"] == dev1["max_memory_reserved"] == doc["allocator_truth"]["max_memory_reserved"]
    assert "showing device 1 (chosen with --device)" in " ".join(doc["warnings"])
    assert "highest peak" not in " ".join(doc["warnings"])
