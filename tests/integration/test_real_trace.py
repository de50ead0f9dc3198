"""A real profiler trace from our collectors (H200, SD 1.5 fp16, 512², 1 step, SDPA)
against the run's allocator truth: the trace's [memory] events carry the allocator's own
totals, so per-stage peaks must equal run.json's, and op shapes must match the geometry."""

from __future__ import annotations

import json

import pytest

from paths import ROOT
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.analyses.trace_ops import analyze_trace
from snapviz.load import load

SAMPLE = ROOT / "sample_snapshots" / "sd15-fp16-profile-1step"
pytestmark = pytest.mark.skipif(not (SAMPLE / "trace.json.gz").is_file(), reason="profiled sample missing")


@pytest.fixture(scope="module")
def trace_and_truth() -> tuple:
    run = load(str(SAMPLE / "trace.json.gz"))
    truth = json.loads((SAMPLE / "run.json").read_text())
    assert run.trace is not None
    return analyze_trace(run.trace), truth


def test_stages_from_trace_annotations(trace_and_truth: tuple) -> None:
    ta, truth = trace_and_truth
    # profiled with --profile-scope after-load: every stage but the first load
    expected = [s["name"] for s in truth["stages"]][1:]
    assert ta.stages["name"].tolist() == expected


def test_stage_peaks_equal_the_allocators(trace_and_truth: tuple) -> None:
    ta, truth = trace_and_truth
    by_name = {s["name"]: s for s in truth["stages"]}
    for row in ta.stages.itertuples(index=False):
        assert int(row.peak_allocated_bytes) == by_name[row.name]["peak_allocated_bytes"], row.name
        assert int(row.peak_reserved_bytes) == by_name[row.name]["peak_reserved_bytes"], row.name
    assert int(ta.timeline["allocated"].max()) == truth["allocator"]["max_memory_allocated"]


def test_attention_ops_have_the_geometry_of_the_run(trace_and_truth: tuple) -> None:
    ta, truth = trace_and_truth
    ops = ta.attention_ops
    assert len(ops) and not ops["materializes_scores"].any()  # SDPA: nothing materialized
    tokens = (truth["height"] // 8) * (truth["width"] // 8)  # 64x64 latent at level 0
    cfg_batch = 2 * truth["batch"]
    unet = ops[(ops["stage"] == "denoise/0") & ops["name"].str.contains("scaled_dot_product")]
    shapes = {tuple(s) for s in unet["score_shape"]}
    assert (cfg_batch * 8, tokens, tokens) in shapes  # SD 1.5: 8 heads at every level
    text = ops[ops["stage"] == "text_encode"]
    assert {tuple(s)[1:] for s in text["score_shape"]} == {(77, 77)}


def test_snapshot_and_trace_join_on_one_time_axis() -> None:
    an = analyze_run(load(str(SAMPLE)))
    doc = summary_of(an)
    # the same run, both files: allocations get the op that made them, with exact shapes
    ops = [t.get("op") for t in doc["top_allocations"] if t["stage"] != "load"]
    assert ops and all(ops)
    assert abs(doc["attention"]["trace_offset_us"]) < 10_000


def test_live_set_at_the_trace_peak_adds_up(trace_and_truth: tuple) -> None:
    """Allocations paired with their frees by address: what was live at the peak plus what
    predates the trace is exactly the allocator's peak; each has a Python site and its op."""
    from snapviz.analyses.trace_live import live_at_trace_peak

    ta, truth = trace_and_truth
    run = load(str(SAMPLE / "trace.json.gz"))
    live = live_at_trace_peak(run.trace, ta.device, limit=10**9)
    tl = ta.timeline
    before = int(tl["allocated"].iat[0] - tl["bytes"].iat[0])
    assert int(live["bytes"].sum()) + before == truth["allocator"]["max_memory_allocated"]
    big = live.iloc[0]
    assert big["op"].startswith("aten::") and "diffusers/" in big["site"]
