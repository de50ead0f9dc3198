"""--perfetto / --merge-into on real samples, read back with an independent reader.

Perfetto's own trace processor downloads a native binary at first use, which this
offline machine cannot; so the file is checked against the Chrome trace event format
(the JSON importer's rules: required keys per phase, numeric finite ``ts``, slices of one
thread that nest, async begin/end pairs) and its tracks are rebuilt as a viewer would.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from paths import ROOT
from snapviz.analyses.summary import analyze_run
from snapviz.errors import InputError
from snapviz.load import load
from snapviz.load.trace.chrome_trace import load_chrome_trace
from snapviz.model import A_OOM
from snapviz.render.perfetto import PID_BASE, render_perfetto

SAMPLES = ROOT / "sample_snapshots"
PROFILED = SAMPLES / "sd15-fp16-profile-1step"


def read_trace(data: bytes) -> dict[str, Any]:
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc


def validate(events: list[dict[str, Any]]) -> None:
    """The Chrome trace event format as the JSON importers read it."""
    open_async: dict[tuple[Any, str, str], float] = {}
    slices: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        ph = e["ph"]
        assert ph in {"C", "X", "i", "b", "e", "M"}, e
        assert isinstance(e["pid"], int)
        if ph == "M":
            assert e["name"] in {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
            continue
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
        assert isinstance(e["name"], str) and e["name"]
        if ph == "C":
            assert e["args"] and all(isinstance(v, int) for v in e["args"].values()), e
        elif ph == "X":
            assert isinstance(e["tid"], int) and e["dur"] >= 0
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "i":
            assert e["s"] in {"t", "p", "g"}
        elif ph == "b":
            key = (e["pid"], e["cat"], e["id"])
            assert key not in open_async
            open_async[key] = e["ts"]
            assert isinstance(e["args"]["stack"], list) and len(e["args"]["stack"]) <= 21
        elif ph == "e":
            key = (e["pid"], e["cat"], e["id"])
            assert e["ts"] >= open_async.pop(key)
    assert not open_async, "async slices without an end"
    for track, spans in slices.items():  # complete events of one thread must nest, never cross
        stack: list[float] = []
        for t0, t1 in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= t0:
                stack.pop()
            assert not stack or t1 <= stack[-1], f"slices cross on {track}"
            stack.append(t1)


def counter(events: list[dict[str, Any]], pid: int, name: str) -> list[tuple[float, int]]:
    pts = [(e["ts"], e["args"]["bytes"]) for e in events if e["ph"] == "C" and e["pid"] == pid and e["name"] == name]
    return sorted(pts, key=lambda p: p[0])


@pytest.fixture(scope="module", params=["sd15-fp16-classic", "sdxl-fp16-oom-10gb", "sd15-fp16-classic-expandable"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    d = SAMPLES / request.param
    an = analyze_run(load(str(d)))
    out = tmp_path_factory.mktemp("pf") / "mem.json.gz"
    doc = read_trace(render_perfetto(an, str(out)))
    return an, doc, json.loads((d / "run.json").read_text())


def test_counter_maximum_is_the_replayed_peak(exported: Any) -> None:
    an, doc, run = exported
    ev = doc["traceEvents"]
    validate(ev)
    pid = PID_BASE + an.device
    alloc = counter(ev, pid, "allocated")
    resv = counter(ev, pid, "reserved")
    assert max(v for _, v in alloc) == an.replay.peak_allocated == run["allocator"]["max_memory_allocated"]
    assert max(v for _, v in resv) == an.replay.peak_reserved
    # ts is relative to baseTimeNanoseconds (torch.profiler's convention), first event at 0
    assert doc["baseTimeNanoseconds"] == int(an.replay.events["time_us"].iat[0]) * 1000
    assert min(t for t, _ in alloc) == 0


def test_slices_markers_and_allocations(exported: Any) -> None:
    an, doc, run = exported
    ev = doc["traceEvents"]
    pid = PID_BASE + an.device
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"stages", "steps", "peak & OOM"} <= names
    stage_slices = [e["name"] for e in ev if e["ph"] == "X" and e["tid"] == 2]
    groups = [s["name"].split("/", 1)[0] for s in run["stages"]]
    merged = [g for k, g in enumerate(groups) if k == 0 or g != groups[k - 1]]
    # run.json's trailing 'other' stage may allocate nothing, so the snapshot has no event in it
    assert len(stage_slices) >= 4 and stage_slices == merged[: len(stage_slices)]
    steps = [e["name"] for e in ev if e["ph"] == "X" and e["tid"] == 3]
    assert steps == [f"denoise/{i}" for i in range(run["steps"])]
    peak = [e for e in ev if e["ph"] == "i" and e["name"].startswith("peak")]
    assert len(peak) == 1 and peak[0]["args"]["allocated_bytes"] == an.replay.peak_allocated
    ooms = [e for e in ev if e["ph"] == "i" and e["name"].startswith("CUDA OOM")]
    assert len(ooms) == int((an.replay.events["action"] == A_OOM).sum())
    begins = [e for e in ev if e["ph"] == "b"]
    largest = int(an.replay.events["block_size"].max())
    assert max(e["args"]["bytes"] for e in begins) == largest
    assert any(e["args"]["stack"] and ".py:" in e["args"]["stack"][0] for e in begins)
    live_at_peak = {int(r) for r in an.top_allocations["row"]}
    assert live_at_peak <= {int(e["id"].rsplit("-", 1)[1]) for e in begins}
    assert all(e["pid"] == pid for e in ev)


def test_oom_sample_has_an_oom_marker(exported: Any) -> None:
    an, doc, run = exported
    if run.get("status") != "oom" and "oom" not in str(an.run.source):
        pytest.skip("not the OOM sample")
    ooms = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["name"].startswith("CUDA OOM")]
    assert ooms and ooms[0]["args"]["requested_bytes"] > 0


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, dict[str, Any]]:
    an = analyze_run(load(str(PROFILED)))
    out = tmp_path_factory.mktemp("merge") / "merged.json.gz"
    out.write_bytes(render_perfetto(an, str(out), merge_into=str(PROFILED / "trace.json.gz")))
    return an, out, read_trace(out.read_bytes())


def test_merge_keeps_every_user_event_and_adds_ours_on_its_clock(merged: Any) -> None:
    an, out, doc = merged
    orig = read_trace((PROFILED / "trace.json.gz").read_bytes())
    ours = [e for e in doc["traceEvents"] if e.get("pid") == PID_BASE + an.device]
    theirs = [e for e in doc["traceEvents"] if e.get("pid") != PID_BASE + an.device]
    assert theirs == orig["traceEvents"]  # verbatim, in order
    assert doc["baseTimeNanoseconds"] == orig["baseTimeNanoseconds"]
    validate(ours)
    assert max(v for _, v in counter(ours, PID_BASE + an.device, "allocated")) == an.replay.peak_allocated
    # our step slices start inside the profiler's record_function range of the same name
    ua = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in orig["traceEvents"] if e.get("cat") == "user_annotation"}
    steps = [e for e in ours if e["ph"] == "X" and e["name"] in ua]
    assert steps
    for e in steps:
        t0, t1 = ua[e["name"]]
        assert t0 <= e["ts"] <= t1, (e["name"], e["ts"] - t0)
    # snapviz's own trace loader still reads the user's memory events the same way
    before, after = load_chrome_trace(str(PROFILED / "trace.json.gz")), load_chrome_trace(str(out))
    assert after.memory.equals(before.memory) and after.event_count == before.event_count + len(ours)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_cli_refuses_to_overwrite_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json.gz"
    trace.write_bytes((PROFILED / "trace.json.gz").read_bytes())
    r = _cli("analyze", str(SAMPLES / "sd15-fp16-sdpa"), "--perfetto", str(trace), "--merge-into", str(trace), "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is an input" in r.stderr
    assert trace.read_bytes() == (PROFILED / "trace.json.gz").read_bytes()
    r = _cli("analyze", str(SAMPLES / "sd15-fp16-sdpa"), "--merge-into", str(trace), "-q")
    assert r.returncode == 2 and "--merge-into needs --perfetto" in r.stderr


def test_cli_writes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "mem.json"
    r = _cli("analyze", str(SAMPLES / "sd15-fp16-sdpa"), "--perfetto", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    doc = read_trace(out.read_bytes())
    validate(doc["traceEvents"])
    assert max(v for _, v in counter(doc["traceEvents"], PID_BASE, "allocated")) == 2831357440  # README table


def test_merge_refuses_a_trace_recorded_days_away(tmp_path: Path) -> None:
    """Issue 21: --merge-into accepted a trace recorded ~2,000 days away from the snapshot. A trace
    whose time range is more than a day from the snapshot's is refused (the distance said) unless
    --merge-anyway."""
    import gzip
    import json

    doc = json.loads(gzip.decompress((PROFILED / "trace.json.gz").read_bytes()))
    doc["baseTimeNanoseconds"] -= 2000 * 86_400 * 10**9  # the same trace, recorded 2,000 days earlier
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    out = tmp_path / "merged.json"
    r = _cli("analyze", str(PROFILED), "--perfetto", str(out), "--merge-into", str(old), "-q")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "recorded 2,000 days away from the snapshot" in r.stderr and "--merge-anyway" in r.stderr
    assert not out.exists()
    r = _cli("analyze", str(PROFILED), "--perfetto", str(out), "--merge-into", str(old), "--merge-anyway", "-q")
    assert r.returncode == 0 and out.is_file(), r.stderr
    r = _cli(
        "analyze",
        str(PROFILED),
        "--perfetto",
        str(out),
        "--merge-into",  # the same run: merged as before
        str(PROFILED / "trace.json.gz"),
        "-q",
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": []}',
        ' \ufeff{"meta": {"traceEvents": [1]}, "x": "traceEvents", "s": "a\\"traceEvents\\": [", '
        '"traceEvents" : [ {"ph": "i", "ts": 1} ], "after": 2}',
        '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": 1.5, "dur": 2}]}',
    ],
)
def test_splice_keeps_every_byte_of_the_users_trace(tmp_path: Path, text: str) -> None:
    """The merged trace is the user's bytes with our events inserted first in the top-level
    traceEvents list: streamed, nothing of theirs parsed or re-serialized (issue 26)."""
    from snapviz.render.perfetto import splice_events

    src = text
    path = tmp_path / "t.json"
    path.write_bytes(src.encode())
    ours = [{"ph": "C", "name": "allocated", "ts": 0, "args": {"bytes": 1}}, {"ph": "i", "name": "peak", "ts": 3}]
    out = splice_events(str(path), ours)
    merged, orig = json.loads(out.decode().lstrip(" \ufeff")), json.loads(src.lstrip(" \ufeff"))
    assert merged["traceEvents"] == ours + orig["traceEvents"]
    assert {k: v for k, v in merged.items() if k != "traceEvents"} == {
        k: v for k, v in orig.items() if k != "traceEvents"
    }
    assert (
        out.replace(b",".join(json.dumps(e, separators=(",", ":")).encode() for e in ours), b"").replace(b"[,", b"[")
        == src.encode()
    )
    (tmp_path / "bad.json").write_text('{"meta": {"traceEvents": []}}')
    with pytest.raises(InputError, match="no traceEvents list"):
        splice_events(str(tmp_path / "bad.json"), ours)
