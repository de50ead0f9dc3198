"""The HTML report: decimation, the data handed to the renderer, and the page itself.

Tests assert on ``report_data`` (what the renderer is given), not on HTML strings; the
page is only checked for being self-contained and small. Real-browser checks live in
test_browser.py.
"""

from __future__ import annotations

import html as html_mod
import json
import os
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest

import synth
from paths import SAMPLES
from sdrun import STACKS, GiB, MiB, _analyse, fake_trace_analysis, make_run, write_run  # noqa: F401
from snapviz.analyses.decimate import decimate_minmax, was_decimated
from snapviz.analyses.document import from_json
from snapviz.category_vocab import CATEGORY_ORDER
from snapviz.render.fmt import fmt_bytes
from snapviz.render.html import render_html
from snapviz.render.html.palette import stage_palette
from snapviz.render.html.view_models import SnapshotReport


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run
    from snapviz.load import load

    d = write_run(str(tmp_path_factory.mktemp("run") / "sd15"), steps=4, filler=40, evil=True)
    an = analyze_run(load(d))
    return an, summary_of(an)


@pytest.fixture(scope="module")
def data(analysed: tuple[Any, dict[str, Any]]) -> SnapshotReport:

    an, doc = analysed
    return report_data(an, doc, max_points=300)


def report_data(an: Any, doc: dict[str, Any], max_points: int = 20000) -> SnapshotReport:
    """The snapshot report's view-model, after the report's own analysis step (as render_html does)."""
    from snapviz.analyses.report_view import report_view
    from snapviz.render.html.snapshot_data import report_data as build

    return build(an, from_json(doc), report_view(an, max_points), max_points=max_points)


# --------------------------------------------------------------------------------------
# decimate_minmax
# --------------------------------------------------------------------------------------


def _series(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.integers(-1000, 1001, n)).astype(np.int64)
    return a, a + rng.integers(0, 10_000, n)


@pytest.mark.parametrize("n,max_points", [(10, 100), (1000, 100), (100_000, 2000), (12345, 7)])
def test_decimate_keeps_extremes_and_endpoints(n: int, max_points: int) -> None:
    a, r = _series(n)
    idx = decimate_minmax(np.arange(n), a, r, max_points=max_points)
    assert idx.dtype == np.int64
    assert np.all(np.diff(idx) > 0), "sorted and unique"
    assert idx[0] == 0 and idx[-1] == n - 1
    for y in (a, r):
        assert np.argmax(y) in idx and np.argmin(y) in idx
        assert y[idx].max() == y.max() and y[idx].min() == y.min()
    assert len(idx) <= max(max_points, 2 + 2 * 2)
    assert was_decimated(n, max_points) == (len(idx) < n)


def test_decimate_returns_everything_when_small() -> None:
    a, _ = _series(50)
    assert np.array_equal(decimate_minmax(np.arange(50), a, max_points=50), np.arange(50))
    assert not was_decimated(50, 50) and was_decimated(51, 50)


def test_decimate_envelope_per_bucket() -> None:
    # Every bucket's max survives: the decimated max over any window of the kept rows
    # equals the true max over the rows it spans.
    n = 200_000
    a, _ = _series(n, seed=5)
    idx = decimate_minmax(np.arange(n), a, max_points=4000)
    assert len(idx) >= 2000, "the budget is used"
    kept = a[idx]
    for lo, hi in ((0, 50_000), (123_456, 170_000)):
        inside = (idx >= lo) & (idx < hi)
        assert kept[inside].max() <= a[lo:hi].max()
        # A window twice a bucket wide always contains a whole bucket: its max is close.
    span = n / 1000
    true_max = np.maximum.reduceat(a, np.arange(0, n, int(span)))
    assert np.isin(true_max.max(), kept)


def test_decimate_by_time_with_uneven_spacing() -> None:
    # 90% of the rows in the last 1% of the time: buckets follow x, so the sparse part
    # is kept whole and the dense part is reduced.
    n = 100_000
    t = np.concatenate([np.linspace(0, 99, n // 10), np.linspace(99.0001, 100, n - n // 10)])
    a, _ = _series(n, seed=2)
    idx = decimate_minmax(t, a, max_points=5000)
    assert np.argmax(a) in idx and idx[0] == 0 and idx[-1] == n - 1
    assert (idx < n // 10).sum() > (idx >= n // 10).sum()


def test_decimate_ignores_nan_and_rejects_mismatched_lengths() -> None:
    y = np.arange(1000, dtype=np.float64)
    y[::7] = np.nan
    idx = decimate_minmax(np.arange(1000), y, max_points=50)
    assert np.nanargmax(y) in idx
    with pytest.raises(ValueError):
        decimate_minmax(np.arange(10), np.arange(9), max_points=5)


def test_decimate_million_points_keeps_the_peak() -> None:
    # Speed is measured by benchmarks/bench_analyze.py (whole process), not here.
    n = 1_000_000
    a, r = _series(n)
    idx = decimate_minmax(np.arange(n), a, r, r - a, a // 2, max_points=20_000)
    assert np.argmax(a) in idx and len(idx) <= 20_000


# --------------------------------------------------------------------------------------
# report_data: what the renderer is handed
# --------------------------------------------------------------------------------------


def test_timeline_columns_are_aligned_and_decimated(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    tl = data.timeline
    n = len(tl.index)
    assert n <= 300 + 3 and all(len(v) == n for v in tl.columns().values())
    ev = an.replay.events
    rows = tl.index
    assert tl.requested is not None, "a snapshot's timeline has requested bytes"
    assert np.array_equal(tl.allocated, ev["allocated"].to_numpy()[rows])
    assert np.array_equal(tl.reserved, ev["reserved"].to_numpy()[rows])
    assert np.array_equal(tl.requested, ev["requested"].to_numpy()[rows])
    assert np.array_equal(tl.fragmentation, tl.reserved - tl.allocated)
    assert tl.time_s[0] == 0.0 and np.all(np.diff(tl.time_s) >= 0)
    us = ev["time_us"].to_numpy()
    assert np.allclose(tl.time_s, (us[rows] - us[0]) / 1e6)
    dec = data.decimation
    assert dec.decimated and dec.total == len(ev) and dec.shown == n
    assert dec.note == f"showing {n:,} of {len(ev):,} points (min/max per bucket, peak kept)"


def test_peak_is_kept_and_marked(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    p = data.peak
    assert p.allocated == doc["peak"]["allocated_bytes"] == doc["allocator_truth"]["max_memory_allocated"]
    assert p.index == doc["peak"]["event_index"] and p.stage == doc["peak"]["stage"]
    tl = data.timeline
    k = int(np.flatnonzero(tl.index == p.index)[0])
    assert tl.allocated[k] == p.allocated == tl.allocated.max()
    assert p.time_s == pytest.approx(tl.time_s[k])
    assert p.label == f"peak {fmt_bytes(p.allocated)} · {p.stage}"
    assert data.peak.reserved_index in set(tl.index.tolist())


def test_point_stage_action_size_and_site(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    from snapviz.model import A_ALLOC, ACTIONS

    an, _ = analysed
    tl, ev = data.timeline, an.replay.events
    rows = tl.index
    labels = np.asarray(an.labels.labels, dtype=object)
    assert tl.action is not None and tl.size is not None and tl.stack is not None, "a snapshot's columns"
    assert [data.stage_names[c] for c in tl.stage] == [str(x) for x in labels[rows]]
    assert [data.action_names[c] for c in tl.action] == [ACTIONS[a] for a in ev["action"].to_numpy()[rows]]
    is_alloc = ev["action"].to_numpy()[rows] == A_ALLOC
    assert is_alloc.any()
    assert np.array_equal(tl.size[is_alloc], ev["block_size"].to_numpy()[rows][is_alloc])
    stacks = data.stacks
    for k, row in zip(tl.stack[is_alloc], rows[is_alloc]):
        sid = int(ev["stack_id"].iat[row])
        assert stacks.stack_id[k] == sid
        assert stacks.site[k] == an.sites.site(sid)
        assert data.stacks.text(int(k)) == an.sites.stack_text(sid)


def test_stage_bands_and_colors(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, _ = analysed
    b = data.bands
    assert b.name == ["load", "text_encode", "denoise/0", "denoise/1", "denoise/2", "denoise/3", "vae_decode"]
    assert b.group == ["load", "text_encode", "denoise", "denoise", "denoise", "denoise", "vae_decode"]
    colors = dict(zip(b.name, b.color))
    assert len({colors[f"denoise/{i}"] for i in range(4)}) == 1, "steps share their stage's color"
    assert len({colors["load"], colors["text_encode"], colors["denoise/0"], colors["vae_decode"]}) == 4
    assert colors == {k: v for k, v in data.stage_colors.items() if k in colors}
    assert b.alpha[2] != b.alpha[3], "consecutive steps alternate shade"
    assert np.array_equal(b.start_index, an.stages["start_row"].to_numpy())
    assert np.all(b.end_s >= b.start_s) and np.all(b.start_s[1:] >= b.end_s[:-1] - 1e-9)
    assert stage_palette(["denoise/7", "my_stage", "load"]) == stage_palette(["denoise/7", "my_stage", "load"])
    assert stage_palette(["denoise/0"])["denoise/0"] == stage_palette(["denoise"])["denoise"]


def test_stage_peak_bars_match_the_allocator(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    bars = data.stage_bars
    assert bars.label == data.bands.name
    assert np.array_equal(bars.peak_allocated, an.stages["peak_allocated_bytes"].to_numpy())
    truth = [s["peak_allocated_bytes"] for s in an.run.run_json["stages"]]
    assert bars.allocator_peak.tolist() == truth, "per-stage peaks equal the allocator's own"
    assert bars.color[2] == bars.color[5] == data.stage_colors["denoise/0"]


def test_repeated_stage_names_get_unique_bar_labels() -> None:
    from snapviz.render.html.view_common import unique_labels as _unique_labels

    assert _unique_labels(["other", "denoise/0", "other", "other"]) == ["other", "denoise/0", "other (2)", "other (3)"]


def test_many_stage_intervals_collapse_to_one_bar_per_stage() -> None:
    from snapviz.analyses.report_view import MAX_STAGE_BARS

    snap, run = make_run(steps=2, filler=100)
    for i, e in enumerate(snap["device_traces"][0]):  # labels that flip every few events
        e["user_metadata"] = f"stage_{(i // 2) % 3}"
    an, doc = _analyse(snap, None)
    assert len(an.stages) > MAX_STAGE_BARS
    d = report_data(an, doc)
    bars = d.stage_bars
    assert bars.label == ["stage_0", "stage_1", "stage_2"] and "intervals" in bars.note
    assert bars.peak_allocated.max() == d.peak.allocated
    assert len(set(d.stage_colors.values())) == 3
    b = d.stage_breakdown
    assert b.label == bars.label and "one bar per stage" in b.note
    assert np.array_equal(b.total, bars.peak_allocated), "each stage's bar is its highest interval"
    assert np.array_equal(sum(b.bytes.values()), b.total)
    assert set(d.stage_top.interval.tolist()) <= set(b.interval.tolist())
    _assert_self_contained(render_html(an, from_json(doc)))


def test_categories_at_the_peak(data: SnapshotReport) -> None:
    c = data.categories
    assert c.bytes.sum() == data.peak.allocated
    assert list(c.bytes) == sorted(c.bytes, reverse=True)
    assert "attention scores" in c.category and "parameter" in c.category
    assert c.share.sum() == pytest.approx(1.0)
    assert all(col.startswith("#") for col in c.color)


def test_top_allocations_with_stacks(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    top = data.top_allocations
    assert list(top.bytes) == [t["bytes"] for t in doc["top_allocations"]]
    assert list(top.bytes) == sorted(top.bytes, reverse=True)
    assert top.size[0] == fmt_bytes(top.bytes[0])
    assert top.site == [t["site"] for t in doc["top_allocations"]]
    assert all(s in txt for s, txt in zip(top.site, top.stack_text) if s != "(no frames recorded)")
    assert all(e <= data.peak.index for e in top.event_index)
    assert "get_attention_scores" in top.site[0], "the score matrix is the largest block at the peak"


def test_attention_table(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    att = data.attention
    assert att.count == doc["attention"]["count"] == 12
    assert att.largest_bytes == doc["attention"]["largest"]["bytes"] > 0
    assert att.implementation == doc["attention"]["implementation"]
    rows = att.rows
    assert rows is not None
    assert len(rows.bytes) == 12 and set(rows.shape) == {"16×4096×4096"}
    assert set(rows.stage) == {f"denoise/{i}" for i in range(4)}
    assert all(lt.endswith("(1 event)") for lt in rows.lifetime)
    assert all("get_attention_scores" in t for t in rows.stack_text)


def test_stage_breakdown_by_category(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    """One stacked bar per stage interval: bytes by category at the interval's own peak."""
    an, doc = analysed
    b = data.stage_breakdown
    assert b.label == data.stage_bars.label and b.note == ""
    assert b.interval.tolist() == list(range(len(an.stages)))
    assert np.array_equal(b.total, an.stages["peak_allocated_bytes"].to_numpy())
    assert np.array_equal(sum(b.bytes.values()), b.total), "each bar adds up to the interval's peak"
    assert np.allclose(sum(b.share.values()), 1.0)
    # Same numbers as the summary's stages[].intervals[].categories_at_peak.
    intervals = [it for g in doc["stages"] for it in g["intervals"]]
    for j, it in enumerate(intervals):
        got = {c: int(b.bytes[c][j]) for c in b.categories if b.bytes[c][j]}
        assert got == it["categories_at_peak"], it["name"]
    cats = dict(zip(b.label, range(len(b.label))))
    att = b.bytes["attention scores"]
    assert all(att[cats[f"denoise/{i}"]] == 512 * MiB for i in range(4)), "each step's peak holds a score matrix"
    assert att[cats["load"]] == att[cats["text_encode"]] == att[cats["vae_decode"]] == 0
    assert b.top_category[cats["vae_decode"]] == "vae buffers"
    assert {b.top_category[cats[f"denoise/{i}"]] for i in range(4)} == {"activation"}
    assert b.top_category[cats["load"]] == "parameter" and b.top_share[cats["load"]] == 1.0
    assert b.categories == [c for c in CATEGORY_ORDER if c in b.categories], "the vocabulary's stacking order"
    assert np.array_equal(b.allocator_peak, data.stage_bars.allocator_peak)


def test_category_colors_are_the_same_everywhere(data: SnapshotReport) -> None:
    from snapviz.render.html.palette import CATEGORY_COLORS, category_palette

    colors = data.category_colors
    b, ct, c = data.stage_breakdown, data.category_timeline, data.categories
    assert b.colors == [colors[x] for x in b.categories]
    assert c.color == [colors[x] for x in c.category]
    assert all(x in colors for x in ct.categories), "the timeline stacks only named, coloured categories"
    assert all(colors[k] == CATEGORY_COLORS[k] for k in colors if k in CATEGORY_COLORS)
    assert len(set(colors.values())) == len(colors), "no two categories share a color"
    # Categories a user rule adds get their own colors, in order of appearance (like stages).
    extra = category_palette(["parameter", "my cache", "lora"])
    assert extra == category_palette(["parameter", "my cache", "lora", "parameter"])
    assert list(extra) == ["parameter", "my cache", "lora"], "canonical categories first, then rule order"
    assert len({extra["my cache"], extra["lora"], *CATEGORY_COLORS.values()}) == len(CATEGORY_COLORS) + 2


def test_category_timeline_stacks_to_allocated(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    from snapviz.analyses.categories import category_timeline

    an, _ = analysed
    ct = data.category_timeline
    ev = an.replay.events
    ref = category_timeline(an.replay, an.labels.labels, an.allocations, max_points=300)
    assert np.array_equal(ct.index, ref["row"].to_numpy()), "category_timeline's own sampling"
    assert ct.total == len(ev) and len(ct.index) < len(ev) and "sampled at" in ct.note
    assert np.array_equal(ct.allocated, ev["allocated"].to_numpy()[ct.index])
    assert np.array_equal(sum(ct.bytes[k] for k in ct.categories), ct.allocated)
    for k in ct.categories:
        assert np.array_equal(ct.bytes[k], ref[k].to_numpy()) and ct.bytes[k].any()
    us = ev["time_us"].to_numpy()
    assert np.allclose(ct.time_s, (us[ct.index] - us[0]) / 1e6), "the same x as the main timeline"
    assert [data.stage_names[k] for k in data.category_stage] == [str(x) for x in an.labels.labels[ct.index]]
    p = data.peak
    at = np.flatnonzero(ct.index == p.index)
    assert len(at) == 1 and ct.allocated[at[0]] == p.allocated, "the peak is kept"
    assert ct.bytes["attention scores"][at[0]] == 512 * MiB


def test_largest_blocks_each_stage_allocated(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    t = data.stage_top
    st = an.stages
    assert list(t.bytes) == an.stage_top["bytes"].tolist() and t.stage == an.stage_top["stage"].tolist()
    assert set(t.stage) == set(data.stage_breakdown.label)
    for iv, row, size, site, txt in zip(t.interval, t.event_index, t.bytes, t.site, t.stack_text):
        assert st["start_row"].iat[iv] <= row <= st["peak_row"].iat[iv], "allocated by the stage, live at its peak"
        assert size == an.replay.events["block_size"].iat[row]
        assert site in txt or site == "(no frames recorded)"
    vae = [s for s, g in zip(t.site, t.stage) if g == "vae_decode"]
    assert vae and all("autoencoders/vae.py" in s for s in vae)
    att = [s for s, g in zip(t.site, t.stage) if g == "denoise/0"]
    assert "get_attention_scores" in att[0], "the score matrix is denoise/0's largest own block"
    by_doc = [
        (it["name"], a["bytes"], a["site"])
        for g in doc["stages"]
        for it in g["intervals"]
        for a in it.get("top_allocations") or []
    ]
    assert by_doc == list(zip(t.stage, [int(x) for x in t.bytes], t.site))


def test_advice_is_handed_over(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    _, doc = analysed
    adv = data.advice
    assert [a.technique for a in adv] == [a["technique"] for a in doc["advice"]]
    first = adv[0]
    assert first.technique.startswith("SDPA") and first.saves_up_to_bytes == 512 * MiB
    assert first.saves == "up to 512.00 MiB"
    assert first.share == pytest.approx(512 * MiB / doc["peak"]["allocated_bytes"])
    assert "set_attn_processor" in first.how


def test_trace_ops_next_to_live_blocks(analysed: tuple[Any, dict[str, Any]]) -> None:
    import dataclasses

    an, doc = analysed
    assert report_data(an, doc, max_points=300).top_allocations.has_ops is False
    top = an.top_allocations.copy()
    top["op"] = ["aten::baddbmm"] + [""] * (len(top) - 1)
    top["op_input_dims"] = ["[[16, 4096, 40], [16, 40, 4096], [], []]"] + [""] * (len(top) - 1)
    d = report_data(dataclasses.replace(an, top_allocations=top), doc, max_points=300).top_allocations
    assert d.has_ops is True
    assert d.op[:2] == ["aten::baddbmm", ""]
    assert d.op_input_dims[:2] == ["16×4096×40, 16×40×4096", ""]


SAMPLE_WITH_TRACE = os.path.join(str(SAMPLES), "sd15-fp16-profile-1step")


@pytest.mark.skipif(not os.path.isdir(SAMPLE_WITH_TRACE), reason="sample with a profiler trace not present")
def test_real_trace_ops_in_the_live_table() -> None:
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run
    from snapviz.load import load

    an = analyze_run(load(SAMPLE_WITH_TRACE))
    doc = summary_of(an)
    top = report_data(an, doc, max_points=2000).top_allocations
    assert top.has_ops
    assert top.op == [t.get("op") or "" for t in doc["top_allocations"]]
    k = top.op.index("aten::cudnn_convolution")
    assert top.op_input_dims[k].count("×") >= 4 and "[]" not in top.op_input_dims[k]
    _assert_self_contained(render_html(an, from_json(doc), max_points=2000))


def test_no_attention_says_which_implementation_ran() -> None:

    an, doc = _analyse(*make_run(steps=2, with_attention=False))
    d = report_data(an, doc, max_points=1000)
    assert d.attention.rows is None
    assert d.attention.count == 0
    impl = d.attention.implementation
    assert impl and impl == doc["attention"]["implementation"]
    html = render_html(an, from_json(doc))
    assert 'id="sv-attention-none"' in html and html_mod.escape(impl) in html


def test_headline_metadata_and_truth(data: SnapshotReport, analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    h = data.headline
    assert h.title == "sd15 · full · 512×512 · fp16 · fp16+classic-attention"
    assert h.verdict.startswith(
        f"Peak {fmt_bytes(doc['peak']['allocated_bytes'])} allocated "
        f"({fmt_bytes(doc['peak']['reserved_bytes'])} reserved) in {doc['peak']['stage']}"
    )
    assert f"event {doc['peak']['event_index']:,}" in h.verdict
    assert h.truth is not None
    assert h.truth.status == "match" and h.truth.diff_bytes == 0
    assert any("attention score matrices" in line for line in h.lines)
    meta = dict(data.metadata)
    assert meta["run.torch_version"] == "2.11.0+cu128" and meta["run.device_name"] == "NVIDIA H200"
    assert meta["allocator.expandable_segments"] == "False"
    assert meta["source"] == doc["source"] and meta["stages from"] == doc["stage_source"]
    assert meta["history events"] == f"{doc['history']['events']:,}"


def test_truth_mismatch_is_reported() -> None:

    snap, run = make_run(steps=1)
    run["allocator"]["max_memory_allocated"] += 3 * MiB
    an, doc = _analyse(snap, run)
    truth = report_data(an, doc).headline.truth
    assert truth is not None
    assert truth.status == "close" and truth.diff_bytes == -3 * MiB
    assert "-3.00 MiB" in truth.text


def test_warnings_and_oom_markers() -> None:

    snap, run = make_run(steps=2, oom=True, max_entries=150)
    an, doc = _analyse(snap, run)
    d = report_data(an, doc, max_points=100)
    assert d.warnings == doc["warnings"] and any("wrapped" in w for w in d.warnings)
    # OOM first (issue 21): the failed request is the verdict, the peak the first line under it
    assert d.headline.verdict == doc["oom"]["headline"] and d.headline.verdict.startswith("CUDA out of memory")
    assert d.headline.lines[0].endswith("(within the recorded window only)")
    assert len(d.oom.index) == 1
    assert d.oom.requested[0] == doc["oom"]["requested_bytes"] and d.oom.lines[0] == doc["oom"]["headline"]
    assert d.oom.index[0] in set(d.timeline.index.tolist()), "OOM rows are always kept"


def test_end_state_only_snapshot() -> None:

    sim = synth.random_workload(seed=1, n_ops=200)
    an, doc = _analyse(sim.snapshot(layout="segments", marker=False))
    d = report_data(an, doc)
    assert d.decimation.total == 0 and len(d.timeline.index) == 0
    assert "end state only" in d.headline.verdict and "Peak" not in d.headline.verdict
    html = render_html(an, from_json(doc))
    assert 'id="sv-no-timeline"' in html


def test_no_time_us_uses_the_event_axis() -> None:

    sim = synth.random_workload(seed=1, n_ops=200)
    an, doc = _analyse(sim.snapshot(omit=("time_us",), marker=False))
    d = report_data(an, doc)
    assert d.has_time is False and d.peak.time_s is None
    assert np.isnan(d.timeline.time_s).all()


def test_max_points_bounds_a_big_timeline() -> None:

    an, doc = _analyse(*make_run(steps=3, filler=3000))
    n = len(an.replay.events)
    for mp in (500, 5000):
        d = report_data(an, doc, max_points=mp)
        tl = d.timeline
        assert len(tl.index) <= mp + 3 < n
        assert d.peak.index in set(tl.index.tolist())
        # Both axes stay faithful: the slow 'load' stage is not flattened into one bucket.
        load_rows = (tl.index < int(an.stages["end_row"].iat[0])).sum()
        assert load_rows >= 20


# --------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------


class _Refs(HTMLParser):
    """Every URL that an HTML tag would fetch (scripts, styles, images, frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("src", "href", "data"):
            if a.get(key) and tag in ("script", "link", "img", "iframe", "object", "embed", "source", "audio", "video"):
                self.urls.append(str(a[key]))
        if tag == "script" and not a.get("src"):
            self.inline_scripts += 1


def _assert_self_contained(html: str) -> None:
    assert html.lstrip().lower().startswith("<!doctype html>")
    refs = _Refs()
    refs.feed(html)
    assert refs.urls == [], f"the page fetches {refs.urls}"
    assert refs.inline_scripts >= 3 and "Bokeh" in html, "BokehJS is inline"
    assert "MathJax.Hub" not in html and len(html.encode()) < 5 * MiB, "no 1.8 MB MathJax bundle"


def test_html_is_self_contained_and_escaped(analysed: tuple[Any, dict[str, Any]]) -> None:
    an, doc = analysed
    html = render_html(an, from_json(doc), max_points=2000)
    _assert_self_contained(html)
    assert "<script>alert(1)</script>" not in html and "<b>evil</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, "the hostile site is shown, escaped"
    assert 'id="sv-verdict"' in html and 'id="sv-footer"' in html


def test_html_size_stays_small_for_many_events() -> None:
    an, doc = _analyse(*make_run(steps=3, filler=6000))
    assert len(an.replay.events) > 50_000
    html = render_html(an, from_json(doc), max_points=20_000)
    _assert_self_contained(html)
    assert len(html.encode()) < 5 * MiB


@pytest.mark.slow
def test_html_size_for_a_million_events() -> None:
    snap, run = make_run(steps=20, filler=16_700)
    an, doc = _analyse(snap, run)
    assert len(an.replay.events) >= 1_000_000
    html = render_html(an, from_json(doc), max_points=20_000)
    assert len(html.encode()) < 5 * MiB, f"{len(html.encode()) / MiB:.2f} MiB"
    from snapviz.analyses.report_view import MAX_CATEGORY_POINTS

    d = report_data(an, doc, max_points=20_000)
    assert len(d.category_timeline.index) <= MAX_CATEGORY_POINTS + 3, "the category area is sampled too"
    assert len(d.stage_breakdown.label) == len(an.stages)


def test_stage_names_never_pull_in_mathjax() -> None:
    snap, run = make_run(steps=1)
    for e in snap["device_traces"][0]:
        if e.get("user_metadata") == "load":
            e["user_metadata"] = "$$x^2$$ \\(y\\)"
    an, doc = _analyse(snap, run)
    html = render_html(an, from_json(doc))
    assert len(html.encode()) < 3 * MiB, "the MathJax bundle was not included"


def test_cli_writes_the_report(tmp_path: Any) -> None:
    from snapviz.cli import main

    d = write_run(str(tmp_path / "run"), steps=2)
    out = tmp_path / "r.html"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", d, "-o", str(out), "-q", "--max-points", "500"])
    assert exc.value.code == 0
    html = out.read_text()
    _assert_self_contained(html)
    assert "showing all" in html or "min/max per bucket" in html


def test_build_page_mixes_html_and_models() -> None:
    from bokeh.models import Div

    from snapviz.render.html import build_page

    page = build_page("t <1>", ["<p id='first'>a &amp; b</p>", Div(text="x", name="only"), "<p id='last'>z</p>"])
    _assert_self_contained(page)
    assert page.index("id='first'") < page.index("data-root-id") < page.index("id='last'")
    assert "<title>t &lt;1&gt;</title>" in page
    assert "<p id='first'>a &amp; b</p>" in build_page("x", ["<p id='first'>a &amp; b</p>"])


def test_page_paints_before_bokeh_and_defers_later_roots() -> None:
    """The blocks come before BokehJS (the header paints first); roots after the first are
    named in the lazy list that assets/lazy_embed.js renders one per frame."""
    import re

    from bokeh.models import Div

    from snapviz.render.html import build_page

    page = build_page(
        "t",
        ["<header id='hero'>h</header>", Div(text="a", name="sv-first"), Div(text="b"), Div(text="c", name="sv-third")],
    )
    assert page.index("id='hero'") < page.index("/* BEGIN bokeh.min.js */") < page.index("Bokeh.embed.embed_items = ")
    lazy = re.search(r'<script type="application/json" id="sv-lazy-roots">(.*?)</script>', page, re.S)
    assert lazy is not None and json.loads(lazy.group(1))["roots"] == ["sv-root-1", "sv-third"]
    assert len(json.loads(lazy.group(1))["docs"]) == 2, "each unlinked later root is a document deferred whole"
    eager = re.search(
        r'id="sv-lazy-roots">(.*?)</script>', build_page("t", [Div(text="a"), Div(text="b")], eager_roots=2)
    )
    assert eager is not None and json.loads(eager.group(1)) == {"roots": [], "docs": []}


def _page_documents(page: str) -> list[list[str]]:
    """The root names of each Bokeh document a page embeds, in the page's order."""
    import html as html_mod
    import re

    m = re.search(r'<script type="application/json" id="[0-9a-f-]{36}">(.*?)</script>', page, re.S)
    assert m is not None
    docs = json.loads(html_mod.unescape(m.group(1)))
    return [[r["attributes"]["name"] for r in d["roots"]] for d in docs.values()]


def test_linked_roots_share_a_document_and_tables_load_later() -> None:
    """Roots that share a model (here a source) are one document, so their selections stay
    linked; an unlinked root is a document of its own, and the tables bundle, needed only by
    later roots, is kept out of the scripts that run before the first screen."""
    from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn
    from bokeh.plotting import figure

    from snapviz.render.html import build_page

    src = ColumnDataSource({"x": [1, 2], "y": [3, 4]})
    fig = figure(name="sv-plot")
    fig.scatter("x", "y", source=src)
    table = DataTable(source=src, columns=[TableColumn(field="x")], name="sv-table")
    other = DataTable(source=ColumnDataSource({"a": [1]}), columns=[TableColumn(field="a")], name="sv-other")
    page = build_page("t", [Div(text="first", name="sv-first"), fig, "<p>x</p>", other, table])
    assert _page_documents(page) == [["sv-first"], ["sv-plot", "sv-table"], ["sv-other"]]
    deferred = page.index('<script type="text/plain" id="sv-deferred-js">')
    assert page.index("/* BEGIN bokeh-tables.min.js */") > deferred
    assert page.count("/* BEGIN bokeh-tables.min.js */") == 1
    # A table on the first screen needs the bundle at once: nothing is deferred then.
    eager = build_page("t", [DataTable(source=ColumnDataSource({"a": [1]}), columns=[TableColumn(field="a")])])
    assert 'id="sv-deferred-js"' not in eager and "/* BEGIN bokeh-tables.min.js */" in eager


# --------------------------------------------------------------------------------------
# Trace-only runs (a stand-in analysis: snapviz.analyses.trace_summary provides the real one)
# --------------------------------------------------------------------------------------


def test_trace_report_data() -> None:
    from snapviz.render.html.trace_data import trace_report_data

    tan, doc = fake_trace_analysis()
    d = trace_report_data(tan, doc, max_points=400)
    tl = d.timeline
    assert len(tl.index) <= 400 and d.decimation.total == 5000
    assert tl.allocated.max() == doc.peak.allocated_bytes == d.peak.allocated
    assert d.bands.name == ["text_encode", "denoise/0", "denoise/1", "vae_decode"]
    assert d.bands.color[1] == d.bands.color[2]
    assert d.stage_bars.peak_allocated.tolist() == tan.stages["peak_allocated_bytes"].tolist()
    assert d.attention_ops.columns == ["name", "stage", "shape", "dur_us"]
    assert d.attention_ops.rows[0][2] == "2×8×4096×64"
    assert d.warnings == ["trace has no snapshot"]
    assert d.peak.stage in d.bands.name


def test_trace_html() -> None:
    from snapviz.render.html import render_trace_html

    tan, doc = fake_trace_analysis()
    html = render_trace_html(tan, doc, max_points=400)
    _assert_self_contained(html)
    assert "profiler trace" in html and "aten::_scaled_dot_product_flash_attention" in html
