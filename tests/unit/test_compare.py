"""``snapviz compare``: stage/step alignment, exact deltas, N runs, verdict, JSON, Markdown, HTML.

Runs are recorded by the reference allocator model (tests/support/synth.py), with the allocator's
own per-stage peaks (``reset_peak`` at each stage start, as collectors do) as the truth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pytest

from paths import ROOT
from snapviz.analyses.compare import build_compare, compare_runs, merge_orders
from snapviz.analyses.digest import digest_run, stage_normalised_timeline
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from snapviz.load.snapshot.builder import snapshot_from_dict
from synth import GiB, MiB, Sim, make_frames

REPO = ROOT
SP = "/usr/lib/python3/site-packages/"
FRAMES = {
    "weights": make_frames("load_model_dict_into_meta", SP + "diffusers/models/model_loading_utils.py", 231),
    "text": make_frames("encode_prompt", SP + "diffusers/pipelines/pipeline_sdxl.py", 420),
    "unet": make_frames("forward", SP + "diffusers/models/resnet.py", 372),
    "extra": make_frames("forward", SP + "diffusers/models/attention_processor.py", 1510),
    "vae": make_frames("forward", SP + "diffusers/models/autoencoders/vae.py", 300),
    "tile": make_frames("tiled_decode", SP + "diffusers/models/autoencoders/autoencoder_kl.py", 420),
}


class PipelineChanges(TypedDict, total=False):
    """What a variant changes of :func:`pipeline_snapshot`'s base run (its keyword arguments)."""

    steps: int
    denoise: int
    tiles: int
    extra_stage: str


def pipeline_snapshot(
    *,
    steps: int = 4,
    denoise: int = GiB,
    vae: int = 3 * GiB,
    tiles: int = 0,
    extra_step_allocs: int = 0,
    slow: bool = False,
    extra_stage: str | None = None,
    seed: int = 0,
) -> tuple[dict[str, Any], dict[str, int]]:
    """A labelled diffusion run and the allocator's own peak of every stage label.

    ``tiles``: decode in that many tiles of ``vae / tiles`` (VAE tiling) instead of one buffer.
    ``extra_step_allocs``: small extra allocations per step (shifts event indices).
    ``slow``: seconds pass between stages (shifts wall time).
    """
    sim = Sim(seed=seed)
    truth: dict[str, int] = {}

    def stage(name: str) -> Any:
        if slow:
            sim.now_us += 7_000_000
        sim.reset_peak()
        return sim.stage(name)

    with stage("load"):
        sim.alloc(2 * GiB, frames=FRAMES["weights"])
    truth["load"] = sim.peak_allocated()
    with stage("text_encode"):
        emb = sim.alloc(10 * MiB, frames=FRAMES["text"])
        tmp = sim.alloc(300 * MiB, frames=FRAMES["text"])
        sim.free(tmp)
    truth["text_encode"] = sim.peak_allocated()
    for i in range(steps):
        with stage(f"denoise/{i}"):
            a = sim.alloc(denoise + i * MiB, frames=FRAMES["unet"])
            for _ in range(extra_step_allocs):
                sim.free(sim.alloc(MiB, frames=FRAMES["extra"]))
            sim.free(a)
        truth[f"denoise/{i}"] = sim.peak_allocated()
    if extra_stage:
        with stage(extra_stage):
            sim.free(sim.alloc(100 * MiB, frames=FRAMES["unet"]))
        truth[extra_stage] = sim.peak_allocated()
    with stage("vae_decode"):
        if tiles:
            for _ in range(tiles):
                sim.free(sim.alloc(vae // tiles, frames=FRAMES["tile"]))
        else:
            sim.free(sim.alloc(vae, frames=FRAMES["vae"]))
        sim.free(emb)
    truth["vae_decode"] = sim.peak_allocated()
    return sim.snapshot(marker=False), truth


def digest(snap: dict[str, Any], label: str) -> Any:
    run = Run(source=label, label=label, snapshot=snapshot_from_dict(snap, label), trace=None, run_json=None)
    return digest_run(analyze_run(run), label)


def group_truth(truth: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in truth.items():
        g = k.split("/", 1)[0]
        out[g] = max(out.get(g, 0), v)
    return out


@pytest.fixture(scope="module")
def pair() -> dict[str, Any]:
    base, tb = pipeline_snapshot(seed=1)
    tiled, tt = pipeline_snapshot(seed=2, tiles=4, extra_step_allocs=3, slow=True)
    cmp = compare_runs([digest(base, "base"), digest(tiled, "tiled")])
    return {"cmp": cmp, "truth": [tb, tt], "snaps": [base, tiled]}


# --------------------------------------------------------------------------- alignment


def test_steps_align_by_label_whatever_the_timing(pair: dict[str, Any]) -> None:
    cmp, (tb, tt) = pair["cmp"], pair["truth"]
    # The runs differ in event count per step and in wall time, yet every step lines up.
    assert cmp.digests[0].events != cmp.digests[1].events
    assert cmp.slots == ["load", "text_encode", "denoise/0", "denoise/1", "denoise/2", "denoise/3", "vae_decode"]
    steps = cmp.steps
    assert steps["name"].unique().tolist() == ["denoise/0", "denoise/1", "denoise/2", "denoise/3"]
    for r, truth in enumerate((tb, tt)):
        got = dict(
            zip(steps.loc[steps["run"] == r, "name"], steps.loc[steps["run"] == r, "peak_allocated_bytes"].astype(int))
        )
        assert got == {k: v for k, v in truth.items() if k.startswith("denoise/")}


def test_timeline_slots_hold_each_stage_and_keep_its_peak(pair: dict[str, Any]) -> None:
    cmp, truths = pair["cmp"], pair["truth"]
    tl = cmp.timeline
    for r, truth in enumerate(truths):
        part = tl[tl["run"] == r]
        for k, name in enumerate(cmp.slots):
            in_slot = part[(part["x"] >= k) & (part["x"] < k + 1)]
            assert set(in_slot["name"]) == {name}
            # The stage's allocator peak may be its entry level (set by the previous stage).
            assert in_slot["allocated"].max() <= truth[name]
        assert part["allocated"].max() == max(truth.values())


def test_decimated_timeline_keeps_every_labels_extremes() -> None:
    rng = np.random.default_rng(0)
    labels = np.array(["a"] * 50_000 + ["b/0"] * 30_000 + ["b/1"] * 20_000, dtype=object)
    alloc = rng.integers(0, 10**9, len(labels))
    res = rng.integers(0, 10**9, len(labels))
    tl = stage_normalised_timeline(labels, alloc, res, points_per_label=50)
    assert len(tl) <= 3 * 50 * 3 + 6
    for name, sl in (("a", slice(0, 50_000)), ("b/0", slice(50_000, 80_000)), ("b/1", slice(80_000, None))):
        part = tl[tl["name"] == name]
        assert part["allocated"].max() == alloc[sl].max() and part["allocated"].min() == alloc[sl].min()
        assert part["reserved"].max() == res[sl].max()
        assert part["pos"].is_monotonic_increasing and part["pos"].iloc[0] == 0.0


def test_merge_orders_inserts_new_stages_where_they_ran() -> None:
    assert merge_orders(
        [
            ["load", "denoise/0", "vae_decode"],
            ["load", "denoise/0", "refine", "vae_decode"],
            ["prep", "load", "vae_decode"],
        ]
    ) == ["prep", "load", "denoise/0", "refine", "vae_decode"]


# --------------------------------------------------------------------------- deltas


def test_stage_deltas_are_exact(pair: dict[str, Any]) -> None:
    cmp, (tb, tt) = pair["cmp"], pair["truth"]
    gb, gt = group_truth(tb), group_truth(tt)
    st = cmp.stages
    assert st["name"].unique().tolist() == ["load", "text_encode", "denoise", "vae_decode"]
    for g in gb:
        row = st[(st["name"] == g) & (st["run"] == 1)].iloc[0]
        assert int(row["peak_allocated_bytes"]) == gt[g]
        assert int(row["delta_bytes"]) == gt[g] - gb[g]
        assert float(row["delta_ratio"]) == pytest.approx((gt[g] - gb[g]) / gb[g])
    runs = cmp.runs
    assert int(runs["delta_bytes"].iat[1]) == max(tt.values()) - max(tb.values())
    # vae_decode: 3 GiB in one buffer vs 768 MiB tiles
    assert gt["vae_decode"] - gb["vae_decode"] == -(3 * GiB - 768 * MiB)


def test_sites_that_grew_appeared_or_vanished(pair: dict[str, Any]) -> None:
    sites = pair["cmp"].sites
    other = sites[sites["run"] == 1].set_index("site")
    assert other.loc["diffusers/models/autoencoders/vae.py:300 forward", "status"] == "vanished"
    tile = other.loc["diffusers/models/autoencoders/autoencoder_kl.py:420 tiled_decode"]
    assert tile["status"] == "appeared" and tile["total_bytes"] == 4 * 768 * MiB and tile["allocs"] == 4
    extra = other.loc["diffusers/models/attention_processor.py:1510 forward"]
    assert extra["status"] == "appeared" and extra["total_bytes"] == 4 * 3 * MiB
    # The weights are live at both peaks and unchanged.
    w = other.loc["diffusers/models/model_loading_utils.py:231 load_model_dict_into_meta"]
    assert w["status"] == "same" and w["peak_live_bytes"] == 2 * GiB


def test_verdict_names_the_stage_that_changed(pair: dict[str, Any]) -> None:
    cmp, (tb, tt) = pair["cmp"], pair["truth"]
    d = max(tb.values()) - max(tt.values())
    pct = d / max(tb.values()) * 100
    v = cmp.verdict[0]
    assert f"{d / GiB:.2f}" == "2.00" and f"{pct:.1f}" == "39.8"
    assert v.startswith("tiled lowers peak allocated by 2.00 GiB (−39.8%), mostly in vae_decode; ")
    assert v.endswith("mostly in vae_decode; denoise unchanged (±0.0%); peak moves from vae_decode to denoise")


def test_verdict_for_an_increase_and_for_no_change() -> None:
    base, _ = pipeline_snapshot(seed=1)
    bigger, _ = pipeline_snapshot(seed=3, denoise=GiB + 512 * MiB, vae=4 * GiB)
    same, _ = pipeline_snapshot(seed=4, extra_step_allocs=1)
    cmp = compare_runs([digest(base, "base"), digest(bigger, "bigger"), digest(same, "same")])
    up, flat = cmp.verdict
    assert up.startswith(
        "bigger raises peak allocated by 1.00 GiB (+20.0%), mostly in vae_decode; denoise +512.00 MiB (+16.6%)"
    )
    # 1 MiB more per step (+0.03% of the denoise peak) reads as unchanged.
    assert flat == "same leaves peak allocated unchanged at 5.01 GiB (±0.0%); vae_decode unchanged (±0.0%)"


def test_n_runs_against_one_base() -> None:
    base, tb = pipeline_snapshot(seed=1)
    variants: dict[str, PipelineChanges] = {
        "slicing": dict(denoise=GiB // 2),
        "tiling": dict(tiles=8),
        "both": dict(denoise=GiB // 2, tiles=8),
        "refiner": dict(extra_stage="refine"),
        "fewer-steps": dict(steps=2),
    }
    digests, truths = [digest(base, "base")], [tb]
    for i, (name, kw) in enumerate(variants.items()):
        snap, t = pipeline_snapshot(seed=10 + i, **kw)
        digests.append(digest(snap, name))
        truths.append(t)
    cmp = compare_runs(digests)
    doc = cmp.summary()
    assert [r["label"] for r in doc["runs"]] == ["base", *variants]
    assert len(doc["verdict"]) == 5
    assert cmp.slots.index("refine") == cmp.slots.index("denoise/3") + 1
    by_name = {s["name"]: s for s in doc["stages"]}
    assert by_name["vae_decode"]["peak_allocated_bytes"] == [group_truth(t)["vae_decode"] for t in truths]
    assert by_name["vae_decode"]["delta_bytes"] == [
        group_truth(t)["vae_decode"] - group_truth(tb)["vae_decode"] for t in truths
    ]
    assert by_name["refine"]["peak_allocated_bytes"] == [None, None, None, None, truths[4]["refine"], None]
    steps = {s["name"]: s for s in doc["steps"]}
    assert (
        steps["denoise/3"]["peak_allocated_bytes"][5] is None
        and steps["denoise/1"]["peak_allocated_bytes"][5] == truths[5]["denoise/1"]
    )
    assert "; new stage refine" in doc["verdict"][3] and "2 denoise steps instead of 4" in doc["verdict"][4]
    assert (
        doc["verdict"][1]
        == "tiling lowers peak allocated by 2.00 GiB (−39.8%), mostly in vae_decode; denoise unchanged (±0.0%); peak moves from vae_decode to denoise"
    )


# --------------------------------------------------------------------------- JSON / Markdown


def test_json_schema_keys(pair: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(pair["cmp"].summary(fail_over=5.0)))
    assert doc["schema"] == "snapviz.compare/1"
    for r in doc["runs"]:
        assert {"label", "source", "peak", "delta_bytes", "verdict"} <= set(r)
        assert {"allocated_bytes", "reserved_bytes", "stage"} <= set(r["peak"])
    for s in doc["stages"] + doc["steps"]:
        assert {"name", "peak_allocated_bytes", "delta_bytes", "peak_reserved_bytes"} <= set(s)
        assert len(s["peak_allocated_bytes"]) == len(s["delta_bytes"]) == 2 and s["delta_bytes"][0] == 0
    assert {"stage", "step"} <= set(doc["steps"][0])
    assert doc["sites"] and {"site", "status", "total_bytes", "peak_live_bytes"} <= set(doc["sites"][0])
    assert isinstance(doc["verdict"], list) and doc["verdict"][0] == doc["runs"][1]["verdict"]
    assert doc["fail_over"] == {"percent": 5.0, "passed": True, "failures": []}


def test_markdown_fits_an_issue(pair: dict[str, Any]) -> None:
    from snapviz.render.compare_md import render_compare_markdown

    md = render_compare_markdown(build_compare(pair["cmp"]))
    assert len(md.splitlines()) <= 60
    assert pair["cmp"].verdict[0] in md
    assert "| `vae_decode` | 5.01 GiB | 2.76 GiB (-2.25 GiB, -44.9%) |" in md
    # ten runs with many steps still fit
    base, _ = pipeline_snapshot(seed=1, steps=30)
    ds = [digest(base, "base")] + [
        digest(pipeline_snapshot(seed=20 + i, steps=30, tiles=i + 1)[0], f"t{i}") for i in range(9)
    ]
    md = render_compare_markdown(build_compare(compare_runs(ds)))
    assert len(md.splitlines()) <= 60


# --------------------------------------------------------------------------- CLI


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from snapviz.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, pair: dict[str, Any]) -> dict[str, str]:
    import pickle

    d = tmp_path_factory.mktemp("cmp")
    out = {}
    for name, snap in zip(("base", "tiled"), pair["snaps"]):
        (d / f"{name}.pickle").write_bytes(pickle.dumps(snap, protocol=4))
        out[name] = str(d / f"{name}.pickle")
    out["dir"] = str(d)
    return out


def test_cli_writes_json_and_markdown(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    j, m = tmp_path / "c.json", tmp_path / "c.md"
    rc, out, err = _cli(["compare", files["base"], files["tiled"], "--json", str(j), "--markdown", str(m)], capsys)
    assert rc == 0, err
    doc = json.loads(j.read_text())
    assert [r["label"] for r in doc["runs"]] == ["base", "tiled"]
    assert doc["verdict"][0].startswith("tiled lowers peak allocated by 2.00 GiB")
    assert "tiled lowers peak allocated" in out and m.read_text().startswith("### GPU memory comparison")


def test_cli_fail_over(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # tiled vs base: lower, passes
    assert _cli(["compare", files["base"], files["tiled"], "--fail-over", "5%", "-q"], capsys)[0] == 0
    # base vs tiled: +81.5% > 5%: exit 1 with one FAIL line
    rc, out, err = _cli(
        ["compare", files["tiled"], files["base"], "--fail-over", "5", "-q", "--label", "main", "--label", "pr"], capsys
    )
    assert rc == 1
    assert err == "FAIL pr peak allocated 5.01 GiB exceeds base main 3.01 GiB by +66.2% (allowed +5%)\n"
    assert _cli(["compare", files["tiled"], files["base"], "--fail-over", "90%", "-q"], capsys)[0] == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["{base}"], "compare needs at least two inputs"),
        (["{base}", "{dir}/missing.pickle"], "missing.pickle: no such file or directory"),
        (["{base}", "{tiled}", "--fail-over", "five"], "--fail-over: invalid percentage 'five'"),
        (["{base}", "{tiled}", "--label", "a", "--label", "b", "--label", "c"], "3 --label values for 2 inputs"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    out_json = tmp_path / "never.json"
    rc, out, err = _cli(["compare", *[a.format(**files) for a in args], "--json", str(out_json)], capsys)
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out_json.exists()


# --------------------------------------------------------------------------- HTML


def test_html_data_aligns_runs_and_page_is_self_contained(pair: dict[str, Any], tmp_path: Path) -> None:
    from snapviz.render.html import render_compare_report_data
    from snapviz.render.html.compare_data import compare_report_data

    cmp = pair["cmp"]
    data = compare_report_data(cmp, build_compare(cmp))
    assert data.slots == cmp.slots and list(data.bands.left) == list(range(len(cmp.slots)))
    k = cmp.slots.index("vae_decode")
    peaks = [float(t.allocated[(t.x >= k) & (t.x < k + 1)].max()) for t in data.timelines]
    assert peaks == [5 * GiB + 10 * MiB, 2 * GiB + 10 * MiB + 768 * MiB]
    assert ("vae_decode", "tiled") in data.bars.factors
    assert data.site_rows[0].name.startswith("diffusers/models/autoencoders/")
    html = render_compare_report_data(data)
    assert "<script src=" not in html and "<link " not in html
    # A lead block (the matrix's card) goes right after the header, before the first card.
    led = render_compare_report_data(data, lead=['<section id="sv-lead"></section>'])
    assert led.index("</header>") < led.index('id="sv-lead"') < led.index('id="sv-cmp-timeline-card"')
    assert led.replace('<section id="sv-lead"></section>', "").count("sv-card") == html.count("sv-card")
    assert "tiled lowers peak allocated" in html
    path = tmp_path / "compare.html"
    path.write_text(html)
    try:
        from browser import check_report_in_browser, chromium_path, playwright_available  # tests/support/browser.py
    except ImportError:
        pytest.skip("tests/support/browser.py (real-browser check) not available")
    if not playwright_available() or chromium_path() is None:
        pytest.skip("no Playwright or no Chromium for the real-browser check")
    res = check_report_in_browser(str(path))
    assert res["errors"] == []
    assert res["plots"] >= 2 and res["canvases"] >= 2  # the aligned timeline and the stage bars rendered
    assert "tiled lowers peak allocated by 2.00 GiB" in res["text"] and "denoise/3" in res["text"]


# --------------------------------------------------------------------------- real samples


def _sample(name: str) -> Path | None:
    d = REPO / "sample_snapshots" / name
    if (d / "run.json").is_file() and any(
        (d / f).is_file() for f in ("snapshot.pickle.xz", "snapshot.pickle", "snapshot.pickle.gz")
    ):
        return d
    return None


@pytest.mark.skipif(
    not (_sample("sdxl-fp16") and _sample("sdxl-fp16-vae-tiling")),
    reason="sample_snapshots/sdxl-fp16 and sdxl-fp16-vae-tiling not present yet",
)
def test_sdxl_vae_tiling_sample_matches_the_allocator() -> None:
    from snapviz.cli.inputs import digest_input

    base_dir, tiled_dir = _sample("sdxl-fp16"), _sample("sdxl-fp16-vae-tiling")
    assert base_dir and tiled_dir

    def truth(d: Path, group: str) -> int:
        rj = json.loads((d / "run.json").read_text())
        return max(int(s["peak_allocated_bytes"]) for s in rj["stages"] if s["name"].split("/", 1)[0] == group)

    cmp = compare_runs([digest_input(str(base_dir), "fp16"), digest_input(str(tiled_dir), "tiling")])
    st = cmp.stages.set_index(["name", "run"])
    expected = truth(tiled_dir, "vae_decode") - truth(base_dir, "vae_decode")
    got = int(st.loc[("vae_decode", 1), "delta_bytes"])
    assert expected < 0
    assert abs(got - expected) <= 0.001 * abs(expected), (got, expected)
    assert abs(float(st.loc[("denoise", 1), "delta_ratio"])) <= 0.01
    assert "mostly in vae_decode" in cmp.verdict[0]


def test_default_labels_are_unique_and_readable(tmp_path: Path) -> None:
    from snapviz.load.labels import unique_labels

    for d in ("fp16/snap", "tiling/snap", "runs/sdxl"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "snapshot.pickle").touch()
    p = [
        str(tmp_path / x)
        for x in ("fp16/snap", "tiling/snap", "runs/sdxl", "a/snapshot.pickle", "base.pickle.xz", "fp16/snap")
    ]
    assert unique_labels(p, []) == ["fp16/snap", "tiling/snap", "sdxl", "a", "base", "fp16/snap#2"]
    assert unique_labels(p[:2], ["main"]) == ["main", "snap"]
