"""Chrome trace loader and trace analyses, checked against real torch.profiler traces.

Real traces are recorded on CPU at test time (tmp dirs, nothing big committed) and
every number is compared with an independent ``json.load`` of the same file. The
committed ``data/traces/edge_cases.json.gz`` (see ``make_edge_trace.py`` beside it)
covers what a CPU run cannot: absolute ``ts``, CUDA devices, odd events.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from paths import ROOT, TEST_DATA
from snapviz.analyses import trace_ops
from snapviz.errors import InputError
from snapviz.load.trace import chrome_trace, json_items
from snapviz.load.trace.chrome_trace import ChromeTrace, load_chrome_trace, looks_like_chrome_trace

DATA = TEST_DATA / "traces"
EDGE = DATA / "edge_cases.json.gz"

# The workload's attention sizes: q, k, v are [B, L, D]; scores are [B, L, L].
B, L, D = 4, 256, 32
SCORE_BYTES = B * L * L * 4  # float32


def _workload(torch: Any) -> None:
    """Stage ranges around classic attention (baddbmm / bmm + softmax) and SDPA."""
    from torch.profiler import record_function

    q, k, v = (torch.randn(B, L, D) for _ in range(3))
    with record_function("text_encode"):
        torch.nn.functional.gelu(torch.randn(2, 77, 64) @ torch.randn(64, 64))
    with record_function("denoise"):
        with record_function("denoise/0"):  # diffusers' get_attention_scores: baddbmm then softmax
            scores = torch.baddbmm(torch.empty(B, L, L), q, k.transpose(1, 2), beta=0, alpha=D**-0.5)
            torch.bmm(scores.softmax(dim=-1), v)
            del scores
        with record_function("denoise/1"):  # scores through bmm, then the fused kernel
            probs = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
            torch.bmm(probs, v)
            del probs
            torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
    with record_function("vae_decode"):
        torch.nn.functional.conv2d(torch.randn(1, 4, 32, 32), torch.randn(8, 4, 3, 3), padding=1)


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    d = tmp_path_factory.mktemp("traces")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        _workload(torch)
    plain = d / "trace.json"
    prof.export_chrome_trace(str(plain))
    gz = d / "trace_gz.bin"  # gzip under a name that says nothing: detection is by magic bytes
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    return {"plain": plain, "gzip": gz}


def _raw(path: Path) -> dict[str, Any]:
    """Independent reference parse with the standard library."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _raw_ranges(doc: dict[str, Any], cat: str) -> list[tuple[str, float, float]]:
    base = doc.get("baseTimeNanoseconds", 0) / 1000
    return [
        (e["name"], e["ts"] + base, e["ts"] + e["dur"] + base)
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("cat") == cat and e.get("ph") == "X"
    ]


# --------------------------------------------------------------------------- loader, real traces


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_memory_events_match_independent_parse(real_traces: dict[str, Path], kind: str) -> None:
    path = real_traces[kind]
    tr = load_chrome_trace(path)
    doc = _raw(path)
    base_us = doc["baseTimeNanoseconds"] / 1000
    mem = sorted((e for e in doc["traceEvents"] if e.get("name") == "[memory]"), key=lambda e: e["ts"])

    assert tr.base_us == base_us
    assert tr.event_count == len(doc["traceEvents"])
    assert len(tr.memory) == len(mem) > 10
    np.testing.assert_array_equal(tr.memory["time_us"], [e["ts"] + base_us for e in mem])
    np.testing.assert_array_equal(tr.memory["total_allocated"], [e["args"]["Total Allocated"] for e in mem])
    np.testing.assert_array_equal(tr.memory["bytes"], [e["args"]["Bytes"] for e in mem])
    np.testing.assert_array_equal(tr.memory["addr"], [e["args"]["Addr"] for e in mem])
    assert (tr.memory["device_type"] == 0).all() and (tr.memory["device_id"] == -1).all()
    assert tr.memory["time_us"].is_monotonic_increasing
    # Absolute Unix µs: the trace was made just now.
    assert abs(tr.memory["time_us"].iloc[0] / 1e6 - os.path.getmtime(path)) < 600

    tl = trace_ops.memory_timeline(tr)
    assert len(tl) == len(mem)
    np.testing.assert_array_equal(tl["allocated"], [e["args"]["Total Allocated"] for e in mem])
    assert tl["allocated"].max() >= SCORE_BYTES  # the score matrix was live at some point


def test_tables_and_meta_match_independent_parse(real_traces: dict[str, Path]) -> None:
    tr = load_chrome_trace(real_traces["plain"])
    doc = _raw(real_traces["plain"])
    assert tr.meta == {k: v for k, v in doc.items() if k != "traceEvents"}
    assert tr.meta["profile_memory"] == 1 and "traceName" in tr.meta  # traceName follows the events

    for table, cat in (
        (tr.annotations, "user_annotation"),
        (tr.ops, "cpu_op"),
        (tr.python_functions, "python_function"),
    ):
        expected = _raw_ranges(doc, cat)
        assert len(table) == len(expected) > 0
        assert table["name"].astype(str).tolist() == [n for n, _, _ in expected]
        np.testing.assert_allclose(table["start_us"], [s for _, s, _ in expected], rtol=0, atol=1e-3)
        np.testing.assert_allclose(table["end_us"], [e for _, _, e in expected], rtol=0, atol=1e-3)

    ops_raw = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert tr.ops["input_dims"].astype(str).tolist() == [
        json.dumps(e["args"]["Input Dims"]) if "Input Dims" in e["args"] else "" for e in ops_raw
    ]
    assert tr.ops["input_types"].astype(str).tolist() == [
        json.dumps(e["args"]["Input type"]) if "Input type" in e["args"] else "" for e in ops_raw
    ]
    assert (tr.ops["input_dims"] != "").sum() > 20


def test_no_per_event_python_objects(real_traces: dict[str, Path]) -> None:
    tr = load_chrome_trace(real_traces["gzip"])
    for name in ("memory", "annotations", "ops", "python_functions"):
        df = getattr(tr, name)
        for col, dtype in df.dtypes.items():
            assert dtype is not np.dtype(object), f"{name}.{col} holds Python objects"
    assert isinstance(tr.ops["name"].dtype, pd.CategoricalDtype)
    assert tr.memory.dtypes.to_dict() == {
        "time_us": np.float64,
        "device_type": np.int8,
        "device_id": np.int16,
        "bytes": np.int64,
        "addr": np.int64,
        "total_allocated": np.int64,
        "total_reserved": np.int64,
        "has_totals": np.bool_,
        "tid": np.int64,
    }


def test_analyzer_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from snapviz.load.trace.chrome_trace import load_chrome_trace; from snapviz.analyses import trace_ops; "
        f"trace_ops.analyze_trace(load_chrome_trace({str(EDGE)!r})); assert 'torch' not in sys.modules"
    )
    root = str(ROOT)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)


def test_looks_like_chrome_trace(real_traces: dict[str, Path], tmp_path: Path) -> None:
    assert looks_like_chrome_trace(real_traces["plain"])
    assert looks_like_chrome_trace(real_traces["gzip"])
    assert looks_like_chrome_trace(EDGE)
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"schema": "snapviz.run/1"}')
    (tmp_path / "rand.bin").write_bytes(random.Random(0).randbytes(2048))
    for name in ("list.json", "other.json", "rand.bin", "missing.json"):
        assert not looks_like_chrome_trace(tmp_path / name)


# --------------------------------------------------------------------------- analyses, real traces


def test_stages_and_peaks(real_traces: dict[str, Path]) -> None:
    tr = load_chrome_trace(real_traces["plain"])
    doc = _raw(real_traces["plain"])
    stages = trace_ops.annotation_stages(tr)
    assert stages["name"].tolist() == ["text_encode", "denoise", "denoise/0", "denoise/1", "vae_decode"]
    assert stages["depth"].tolist() == [0, 0, 1, 1, 0]
    assert stages["group"].tolist() == ["text_encode", "denoise", "denoise", "denoise", "vae_decode"]
    outer = stages.set_index("name")
    for step in ("denoise/0", "denoise/1"):
        assert (
            outer.loc["denoise", "start_us"]
            <= outer.loc[step, "start_us"]
            < outer.loc[step, "end_us"]
            <= outer.loc["denoise", "end_us"]
        )

    peaks = trace_ops.stage_peaks(tr, stages).set_index("name")
    base = doc["baseTimeNanoseconds"] / 1000
    mem = sorted(
        (e["ts"] + base, e["args"]["Total Allocated"], e["args"]["Bytes"])
        for e in doc["traceEvents"]
        if e.get("name") == "[memory]"
    )
    for name, row in stages.set_index("name").iterrows():
        inside = [a for t, a, _ in mem if row.start_us <= t <= row.end_us]
        before = [a for t, a, _ in mem if t < row.start_us]
        entry = before[-1] if before else mem[0][1] - mem[0][2]
        assert peaks.loc[name, "events"] == len(inside)
        assert peaks.loc[name, "entry_allocated_bytes"] == entry
        assert peaks.loc[name, "peak_allocated_bytes"] == max([entry, *inside])
    # Each step materialized a [B, L, L] float32 score matrix on top of what it entered with.
    for step in ("denoise/0", "denoise/1"):
        assert peaks.loc[step, "peak_allocated_bytes"] >= peaks.loc[step, "entry_allocated_bytes"] + SCORE_BYTES


def test_attention_ops(real_traces: dict[str, Path]) -> None:
    tr = load_chrome_trace(real_traces["plain"])
    att = trace_ops.attention_ops(tr)
    top = att[~att["nested"]]
    assert top["name"].tolist() == [
        "aten::baddbmm",
        "aten::softmax",
        "aten::bmm",  # denoise/0
        "aten::bmm",
        "aten::softmax",
        "aten::bmm",  # denoise/1, classic
        "aten::scaled_dot_product_attention",  # denoise/1, fused
    ]
    assert top["stage"].tolist() == ["denoise/0"] * 3 + ["denoise/1"] * 4
    assert top["materializes_scores"].tolist() == [True, True, False, True, True, False, False]

    baddbmm = top.iloc[0]
    assert baddbmm["shapes"] == [[B, L, L], [B, L, D], [B, D, L], [], []]
    assert baddbmm["score_shape"] == (B, L, L)
    assert baddbmm["dtype"] == "float" and baddbmm["itemsize"] == 4
    assert baddbmm["score_bytes"] == SCORE_BYTES
    assert top.iloc[3]["shapes"] == [[B, L, D], [B, D, L]] and top.iloc[3]["score_bytes"] == SCORE_BYTES
    pv = top.iloc[2]  # probs @ v: output [B, L, D] is not a score matrix
    assert pv["score_shape"] == (B, L, D) and not pv["materializes_scores"]

    sdpa = att[att["name"].str.contains("scaled_dot_product")]
    assert len(sdpa) >= 2  # the dispatcher op and the CPU fused kernel under it
    assert not sdpa["materializes_scores"].any()
    assert sdpa["shapes"].iloc[0][:3] == [[1, B, L, D]] * 3
    assert sdpa["score_shape"].iloc[0] == (B, L, L)  # what a classic implementation would allocate
    assert att["nested"].sum() >= 3  # _softmax under softmax (x2), the kernel under SDPA
    assert att.loc[att["materializes_scores"], "score_bytes"].sum() == 4 * SCORE_BYTES


def test_sdpa_math_backend_materializes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile, record_function

    q = torch.randn(1, B, L, D)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("denoise/0"), sdpa_kernel(SDPBackend.MATH):  # unfused: scores are built
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    path = tmp_path / "math.json"
    prof.export_chrome_trace(str(path))
    att = trace_ops.attention_ops(load_chrome_trace(path))
    top = att[~att["nested"]]
    assert top["name"].tolist() == ["aten::scaled_dot_product_attention"]
    assert top["materializes_scores"].tolist() == [True] and top["score_bytes"].tolist() == [SCORE_BYTES]
    assert "aten::_scaled_dot_product_attention_math" in att["name"].tolist()
    assert att["materializes_scores"].sum() == 1  # its inner bmm/softmax are not counted again


# --------------------------------------------------------------------------- edge-case fixture


@pytest.fixture(scope="module")
def edge() -> ChromeTrace:
    return load_chrome_trace(EDGE)


def test_edge_fixture_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_edge_trace", DATA / "make_edge_trace.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert gzip.decompress(EDGE.read_bytes()).decode() == mod.document()
    assert EDGE.stat().st_size < 50_000


def test_edge_absolute_ts_and_meta(edge: ChromeTrace) -> None:
    assert edge.base_us == 0.0
    assert edge.memory["time_us"].iloc[0] == 1_796_003_490_000_005.0
    assert edge.meta["otherInfo"] == {"traceEvents": 3}  # a nested key of that name is not the events
    assert edge.meta["extra"] == [1, [2, 3]] and edge.meta["traceName"] == "edge.json"
    assert "traceEvents" not in edge.meta and edge.notes == []
    assert edge.event_count == 33
    # B/E pairs and the GPU-timeline copy are not annotations; the null entry is skipped.
    assert edge.annotations["name"].astype(str).tolist() == [
        "ProfilerStep#0",
        "text_encode",
        "denoise",
        "denoise/0",
        "denoise/1",
        "vae_decode",
        "my_range",
    ]
    assert edge.ops.loc[edge.ops["name"] == "aten::add", "input_dims"].astype(str).tolist() == [""]
    assert edge.python_functions["name"].astype(str).tolist() == ["unet.py(42): forward"]


def test_edge_devices_and_timeline(edge: ChromeTrace) -> None:
    devs = trace_ops.devices(edge)
    assert list(zip(devs["device_type"], devs["device_id"], devs["events"])) == [(1, 1, 5), (1, 0, 2), (0, -1, 2)]
    tl = trace_ops.memory_timeline(edge)  # default: the CUDA device with the larger peak
    assert tl["allocated"].tolist() == [5 << 20, (1 << 30) + (5 << 20), 5 << 20, 7 << 20, 5 << 20]
    assert tl["reserved"].iloc[-1] == (1 << 30) + (6 << 20)
    tl0 = trace_ops.memory_timeline(edge, device_type=1, device_id=0)
    assert tl0["allocated"].tolist() == [1000, (3 << 20) + 1000]
    cpu = trace_ops.memory_timeline(edge, device_type=0)
    assert cpu["allocated"].tolist() == [4096, 0] and (cpu["reserved"] == 0).all()
    assert trace_ops.memory_timeline(edge, device_type=1, device_id=5).empty


def test_edge_stages_and_peaks(edge: ChromeTrace) -> None:
    stages = trace_ops.annotation_stages(edge)
    # canonical names present: ProfilerStep#0 and my_range are not stages
    assert stages["name"].tolist() == ["text_encode", "denoise", "denoise/0", "denoise/1", "vae_decode"]
    assert stages["depth"].tolist() == [0, 0, 1, 1, 0]
    peaks = trace_ops.stage_peaks(edge, stages).set_index("name")
    assert peaks.loc["denoise/0", "peak_allocated_bytes"] == (1 << 30) + (5 << 20)
    # the autograd thread's allocation counts for denoise/1 (time containment, not tid)
    assert peaks.loc["denoise/1", "peak_allocated_bytes"] == 7 << 20
    assert peaks.loc["denoise/1", "entry_allocated_bytes"] == peaks.loc["denoise/1", "exit_allocated_bytes"] == 5 << 20
    # no cuda:1 event inside vae_decode: the level it entered with is its peak
    assert peaks.loc["vae_decode", "events"] == 0
    assert peaks.loc["vae_decode", "peak_allocated_bytes"] == 5 << 20
    assert peaks.loc["vae_decode", "peak_time_us"] == stages.set_index("name").loc["vae_decode", "start_us"]
    # text_encode starts before the device's first event: entry is the level before it
    assert peaks.loc["text_encode", "entry_allocated_bytes"] == 0
    assert peaks.loc["denoise", "peak_reserved_bytes"] == (1 << 30) + (6 << 20)
    # a range holding only a free: the peak is the level it entered with, not the event's
    t0 = 1_796_003_490_000_000.0
    free_only = trace_ops.stage_peaks(edge, pd.DataFrame({"name": ["x"], "start_us": [t0 + 240], "end_us": [t0 + 260]}))
    assert free_only[["events", "entry_allocated_bytes", "exit_allocated_bytes", "peak_allocated_bytes"]].iloc[
        0
    ].tolist() == [1, (1 << 30) + (5 << 20), 5 << 20, (1 << 30) + (5 << 20)]
    early = trace_ops.stage_peaks(edge, pd.DataFrame({"name": ["y"], "start_us": [t0], "end_us": [t0 + 10]})).iloc[0]
    assert early["events"] == 0 and early["peak_allocated_bytes"] == 0 and np.isnan(early["peak_reserved_bytes"])
    p0 = trace_ops.stage_peaks(edge, stages, device_type=1, device_id=0).set_index("name")
    assert p0.loc["vae_decode", "peak_allocated_bytes"] == (3 << 20) + 1000


def test_edge_attention_fp16(edge: ChromeTrace) -> None:
    att = trace_ops.attention_ops(edge)
    gib = 32 * 4096 * 4096 * 2
    row = att.iloc[0]
    assert (row["name"], row["dtype"], row["itemsize"], row["score_bytes"]) == ("aten::baddbmm", "c10::Half", 2, gib)
    assert row["materializes_scores"] and row["stage"] == "denoise/0"
    assert att.loc[att["materializes_scores"], "name"].tolist() == ["aten::baddbmm", "aten::softmax"]
    sdpa = att[att["stage"] == "denoise/1"]
    assert sdpa["name"].tolist() == [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_efficient_attention",
    ]
    assert sdpa["nested"].tolist() == [False, True]
    assert not sdpa["materializes_scores"].any() and (sdpa["score_bytes"] == gib).all()


def _write_trace(path: Path, annotations: list[str]) -> Path:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0}
        for i, n in enumerate(annotations)
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_stage_fallbacks(tmp_path: Path) -> None:
    tr = load_chrome_trace(
        _write_trace(tmp_path / "a.json", ["ProfilerStep#1", "stage:fwd", "Optimizer.step#Adam.step", "stage:bwd"])
    )
    assert trace_ops.annotation_stages(tr)["name"].tolist() == ["step/1", "stage:fwd", "optimizer", "stage:bwd"]
    tr = load_chrome_trace(_write_trace(tmp_path / "b.json", ["ProfilerStep#1", "ProfilerStep#2"]))
    assert trace_ops.annotation_stages(tr)["name"].tolist() == ["step/1", "step/2"]
    tr = load_chrome_trace(
        _write_trace(tmp_path / "e.json", ["## forward ##", "## Call CompiledFxGraph fpd72yoxubab ##"])
    )
    assert trace_ops.annotation_stages(tr)["name"].tolist() == ["forward", "compiled graph/fpd72yox"]
    tr = load_chrome_trace(_write_trace(tmp_path / "c.json", []))
    assert trace_ops.annotation_stages(tr).empty and trace_ops.attention_ops(tr).empty
    assert trace_ops.memory_timeline(tr).empty and trace_ops.devices(tr).empty
    tr = load_chrome_trace(_write_trace(tmp_path / "d.json", ["denoise/0"]))
    peaks = trace_ops.stage_peaks(tr, trace_ops.annotation_stages(tr))
    assert peaks["events"].tolist() == [0] and peaks["peak_allocated_bytes"].isna().all()


def test_stage_depth_is_time_containment(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    start = rng.integers(0, 400, 300).astype(float)
    dur = rng.integers(0, 120, 300).astype(float)
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"denoise/{i}", "pid": 1, "tid": int(i % 3), "ts": s, "dur": d}
        for i, (s, d) in enumerate(zip(start, dur))
    ]
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"traceEvents": events}))
    st = trace_ops.annotation_stages(load_chrome_trace(path))
    s, e = st["start_us"].to_numpy(), st["end_us"].to_numpy()
    # brute force over all pairs; identical intervals: the earlier row counts as the outer one
    expected = [
        sum(
            1
            for j in range(len(st))
            if j != i and s[j] <= s[i] and e[j] >= e[i] and not (s[j] == s[i] and e[j] == e[i] and j > i)
        )
        for i in range(len(st))
    ]
    assert st["depth"].tolist() == expected
    assert (np.diff(s) >= 0).all()


def test_analyze_trace(edge: ChromeTrace) -> None:
    an = trace_ops.analyze_trace(edge)
    assert an.device == (1, 1) and len(an.devices) == 3 and len(an.timeline) == 5
    assert an.stages["name"].tolist() == ["text_encode", "denoise", "denoise/0", "denoise/1", "vae_decode"]
    assert an.stages["peak_allocated_bytes"].max() == (1 << 30) + (5 << 20)
    assert an.attention_ops["materializes_scores"].sum() == 2
    an0 = trace_ops.analyze_trace(edge, device_type=1, device_id=0)
    assert an0.device == (1, 0) and an0.timeline["allocated"].max() == (3 << 20) + 1000


def test_time_helpers(edge: ChromeTrace, real_traces: dict[str, Path]) -> None:
    tr = load_chrome_trace(real_traces["plain"])
    ts = np.array([0.0, 5146464735331.948])
    # float64 Unix µs near 1.8e15 resolve 0.25 µs
    np.testing.assert_allclose(
        trace_ops.unix_us_to_trace_ts(tr, trace_ops.trace_ts_to_unix_us(tr, ts)), ts, rtol=0, atol=0.25
    )
    assert trace_ops.trace_ts_to_unix_us(tr, 1.0) == 1.0 + tr.meta["baseTimeNanoseconds"] / 1000
    assert trace_ops.trace_ts_to_unix_us(edge, 12.5) == 12.5  # absolute ts: unchanged
    stages = trace_ops.annotation_stages(tr)
    snap = pd.DataFrame({"name": stages["name"], "start_us": stages["start_us"] - 250.0})
    assert trace_ops.align_offset_us(tr, snap) == pytest.approx(250.0, abs=0.5)
    assert trace_ops.align_offset_us(tr, snap.assign(name="nope")) == 0.0


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_tiny_read_chunks_give_the_same_trace(monkeypatch: pytest.MonkeyPatch, edge: ChromeTrace, chunk: int) -> None:
    # Key, ':' and '[' split across reads, events across batches: the head/tail and batch
    # bookkeeping must not care.
    monkeypatch.setattr(json_items, "BATCH_READ_BYTES", chunk)
    small = load_chrome_trace(EDGE)
    assert small.meta == edge.meta and small.event_count == edge.event_count
    for name in ("memory", "annotations", "ops", "python_functions"):
        pd.testing.assert_frame_equal(getattr(small, name), getattr(edge, name))


def test_stdlib_parser_gives_the_same_trace(monkeypatch: pytest.MonkeyPatch, edge: ChromeTrace) -> None:
    # orjson is optional (the `fast` extra): without it the stdlib parses the same batches.
    monkeypatch.setattr(json_items, "_fast_loads", json.loads)
    monkeypatch.setattr(json_items, "BATCH_READ_BYTES", 100)
    plain = load_chrome_trace(EDGE)
    assert plain.meta == edge.meta and plain.event_count == edge.event_count
    for name in ("memory", "annotations", "ops", "python_functions"):
        pd.testing.assert_frame_equal(getattr(plain, name), getattr(edge, name))


def test_event_batches_keep_json_strict(tmp_path: Path) -> None:
    # Items are parsed in batches cut at item ends: commas between batches must still be
    # exactly one, and an integer beyond 64 bits (which orjson refuses) still reads.
    head = b'{"traceEvents": ['
    ev = b'{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, "tid": 1}'
    cases = {
        "missing comma": head + ev + b" " + ev + b"]}",
        "trailing comma": head + ev + b",]}",
        "leading comma": head + b"," + ev + b"]}",
    }
    for name, data in cases.items():
        p = tmp_path / f"{name.replace(' ', '_')}.json"
        p.write_bytes(data)
        with pytest.raises(InputError, match="not valid JSON"):
            load_chrome_trace(p)
    big = tmp_path / "big_int.json"
    big.write_bytes(head + ev.replace(b'"tid": 1', b'"tid": 123456789012345678901234567890') + b"]}")
    assert load_chrome_trace(big).ops["tid"].tolist() == [-1]


def test_keys_after_events_beyond_window(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": float(i), "dur": 1.0}
        for i in range(200)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 1000, "traceEvents": events, "traceName": "x" * 5000}))
    assert load_chrome_trace(path).meta["traceName"] == "x" * 5000
    monkeypatch.setattr(chrome_trace, "TAIL_WINDOW_BYTES", 1000)
    tr = load_chrome_trace(path)
    assert "traceName" not in tr.meta and tr.notes and tr.base_us == 1.0 and len(tr.ops) == 200


# --------------------------------------------------------------------------- bad input


def _bad_inputs(tmp_path: Path, real: Path) -> dict[str, Path]:
    gz = gzip.compress(real.read_bytes())
    cases = {
        "truncated gzip": gz[: len(gz) // 2],
        "random bytes": random.Random(0).randbytes(4096),
        "JSON list": b'[{"ph": "X", "name": "a", "ts": 1}]',
        "empty": b"",
        "whitespace": b" \n\t ",
        "object without traceEvents": b'{"schemaVersion": 1, "events": []}',
        "traceEvents not a list": b'{"traceEvents": {"a": 1}}',
        "truncated JSON": real.read_bytes()[:5000],
        "garbage after {": b'{"traceEvents": [ {"ph": nope} ]}',
        "string ts": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}',
        "bad gzip body": b"\x1f\x8b\x08\x00" + random.Random(1).randbytes(300),
    }
    out = {}
    for name, data in cases.items():
        p = tmp_path / (name.replace(" ", "_") + ".json")
        p.write_bytes(data)
        out[name] = p
    out["missing file"] = tmp_path / "nope.json"
    out["directory"] = tmp_path
    return out


def test_bad_input_raises_one_line(real_traces: dict[str, Path], tmp_path: Path) -> None:
    cases = _bad_inputs(tmp_path, real_traces["plain"])
    for name, path in cases.items():
        with pytest.raises(InputError) as info:
            load_chrome_trace(path)
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(str(path)), (name, msg)
        assert len(msg) < 300, (name, msg)
    msgs = {name: str(pytest.raises(InputError, load_chrome_trace, p).value) for name, p in cases.items()}
    assert "truncated gzip" in msgs["truncated gzip"]
    assert "empty file" in msgs["empty"] and "empty file" in msgs["whitespace"]
    assert "no such file" in msgs["missing file"]
    assert "JSON array" in msgs["JSON list"]
    assert "no traceEvents" in msgs["object without traceEvents"]
    assert "not a list" in msgs["traceEvents not a list"]
    assert "not valid JSON" in msgs["truncated JSON"]
    assert "not JSON" in msgs["random bytes"] and "corrupt gzip" in msgs["bad gzip body"]
    assert "malformed" in msgs["string ts"]


def test_truncated_gzip_still_sniffs_as_trace(real_traces: dict[str, Path], tmp_path: Path) -> None:
    gz = real_traces["gzip"].read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gz[: len(gz) // 2])
    assert looks_like_chrome_trace(cut)  # so the CLI reports "truncated gzip", not "not a pickle"
    with pytest.raises(InputError, match="truncated gzip"):
        load_chrome_trace(cut)


def test_args_that_are_not_objects_read_as_no_args(tmp_path: Path) -> None:
    """Other writers put lists or numbers in ``args``: the events still load (no crash, no
    exit 2 for a readable trace), with their arguments unknown."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": [1]},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 4, "dur": 1, "args": 7},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3, "args": [1, 2]},
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 5,
            "args": {"Bytes": 512, "Addr": 16, "Total Allocated": 512, "Device Type": 0},
        },
    ]
    path = tmp_path / "odd_args.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tr = load_chrome_trace(path)
    assert sorted(tr.ops["name"].astype(str)) == ["aten::add", "aten::mm"]
    assert tr.memory["bytes"].tolist() == [0, 512]
