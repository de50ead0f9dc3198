"""--png/--svg pictures of real samples, decoded and checked pixel by pixel."""

from __future__ import annotations

import io
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from paths import ROOT  # noqa: E402
from snapviz.analyses.compare import compare_runs  # noqa: E402
from snapviz.analyses.document import from_json  # noqa: E402
from snapviz.analyses.pipeline import summary_of  # noqa: E402
from snapviz.analyses.summary import analyze_run  # noqa: E402
from snapviz.cli.inputs import digest_input  # noqa: E402
from snapviz.load import load  # noqa: E402
from snapviz.render.picture import (  # noqa: E402
    MIN_STAGE_SHARE,
    PEAK_COLOR,
    PEAK_STAGE_SHARE,
    compare_picture_data,
    picture_data,
    render_compare_picture,
    render_timeline_picture,
    stage_axis,
    timeline_figure,
)

SAMPLES = ROOT / "sample_snapshots"


def _rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _pixels(png: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG"
    return np.asarray(img.convert("RGB"))


def _mask(px: np.ndarray, color: str) -> np.ndarray:
    return (px == np.array(_rgb(color), np.uint8)).all(axis=2)


@pytest.fixture(scope="module", params=["sdxl-fp16-oom-10gb", "sd15-fp16-classic"])
def run(request: pytest.FixtureRequest) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    an = analyze_run(load(str(SAMPLES / request.param)))
    doc = summary_of(an)
    return an, doc, picture_data(an, from_json(doc))


def test_picture_data_holds_the_peak_and_the_stages(run: Any) -> None:
    an, doc, d = run
    assert d["peak"]["bytes"] == an.replay.peak_allocated == int(d["allocated"].max())
    title = d["title"] if isinstance(d["title"], str) else "\n".join(d["title"])  # an OOM: its request, then the peak
    assert d["peak"]["stage"] == doc["peak"]["stage"] and d["peak"]["stage"] in title
    # the stage axis: 0..1, in event order, the peak's stage at least PEAK_STAGE_SHARE wide
    assert d["x"][0] >= 0 and d["x"][-1] <= 1 and (np.diff(d["x"]) >= 0).all()
    peak_span = next(s for s in d["spans"] if s["start"] <= d["peak"]["x"] <= s["end"])
    assert peak_span["group"] == doc["peak"]["stage"].split("/")[0]
    assert peak_span["end"] - peak_span["start"] >= PEAK_STAGE_SHARE - 1e-9
    assert min(s["end"] - s["start"] for s in d["spans"]) >= MIN_STAGE_SHARE / len(d["spans"]) - 1e-9
    assert [s["group"] for s in d["spans"]][:3] == ["load", "text_encode", "denoise"]
    # the categories stack up to the allocated series at every drawn point
    total = sum(c["bytes"] for c in d["categories"])
    assert np.array_equal(total.astype(np.int64), d["allocated"].astype(np.int64))


def test_png_is_issue_width_with_the_peak_marker_where_the_peak_is(run: Any) -> None:
    an, doc, d = run
    px = _pixels(render_timeline_picture(an, from_json(doc), "png"))
    assert px.shape == (440, 900, 3)
    red = _mask(px, PEAK_COLOR)
    assert red.sum() > 60  # a filled marker, not just anti-aliased text
    # the marker's column follows the peak's time: rightmost for the OOM run's final decode
    _, xs = np.nonzero(red)
    x_frac = d["peak"]["x"]
    big = np.bincount(xs).argmax() / px.shape[1]  # the column with most red: the marker's centre
    assert abs(big - (0.07 + 0.915 * x_frac)) < 0.04, (big, x_frac)
    assert _mask(px, "#1f3b73").sum() > 200  # the allocated line


def test_svg_is_valid_and_names_the_peak(run: Any) -> None:
    an, doc, _ = run
    svg = render_timeline_picture(an, from_json(doc), "svg")
    root = ET.fromstring(svg)
    assert root.get("width") == "648pt"  # 9 in: 900 px at 100 dpi
    text = svg.decode()
    assert "allocated" in text and "peak" in text


def test_compare_picture_overlays_runs_aligned_by_stage() -> None:
    digests = [digest_input(str(SAMPLES / n), n) for n in ("sd15-fp16-sdpa", "sd15-fp16-classic")]
    cmp = compare_runs(digests)
    d = compare_picture_data(cmp, cmp.document())
    assert [r["label"] for r in d["runs"]] == ["sd15-fp16-sdpa", "sd15-fp16-classic"]
    assert [r["peak_bytes"] for r in d["runs"]] == [2831357440, 3324129280]  # README table
    slots = list(cmp.slots)
    # classic peaks in a denoise step, sdpa in vae_decode: the markers sit in those slots
    assert slots[int(d["runs"][1]["peak_x"])].startswith("denoise/")
    assert slots[int(d["runs"][0]["peak_x"])] == "vae_decode"
    px = _pixels(render_compare_picture(cmp, cmp.document(), "png"))
    assert px.shape == (440, 900, 3)
    for r in d["runs"]:
        assert _mask(px, r["color"]).sum() > 50, r["label"]


def test_cli_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "t.png"
    r = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(SAMPLES / "sd15-fp16-sdpa"), "--png", str(out), "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert _pixels(out.read_bytes()).shape == (440, 900, 3)


def test_markdown_shows_the_picture_relative_to_itself(tmp_path: Path) -> None:
    """With --markdown and --png, the summary embeds the picture by a path relative to the
    Markdown file, so both uploaded to a ticket (or committed side by side) show together."""
    (tmp_path / "md").mkdir()
    (tmp_path / "img dir").mkdir()
    md, png = tmp_path / "md" / "s.md", tmp_path / "img dir" / "t.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(SAMPLES / "sd15-fp16-sdpa"),
            "--png",
            str(png),
            "--markdown",
            str(md),
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "![memory timeline](../img%20dir/t.png)" in md.read_text().splitlines()[:4]
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("sample", ["sdxl-fp16", "sdxl-fp16-oom-10gb", "train-sd15-amp-fp16", "flux-dev-bf16"])
def test_labels_do_not_overlap_and_the_peak_label_is_off_the_lines(sample: str) -> None:
    """Issue 21: stage labels overprinted into a blob (training: nine stages), the peak's label sat on
    the lines, and the peak's stage was squeezed into the last few percent of the width."""
    an = analyze_run(load(str(SAMPLES / sample)))
    doc = summary_of(an)
    d = picture_data(an, from_json(doc))
    fig = timeline_figure(d)
    ax = fig.axes[0]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    from matplotlib.text import Text

    labels = [t for t in ax.texts if t.get_visible()]
    boxes = [Text.get_window_extent(t, r) for t in labels]  # the words, not an annotation's leader line
    for i, a in enumerate(boxes):
        assert all(not a.overlaps(b) for b in boxes[i + 1 :]), [t.get_text() for t in labels]
    assert {t.get_text().split(" ")[0] for t in labels} >= {"load", doc["peak"]["stage"].split("/")[0]}
    [peak_label] = [
        c for c in ax.get_children() if type(c).__name__ == "Annotation" and c.get_text().startswith("peak")
    ]
    top = ax.transData.transform((0, max(d["allocated"].max(), d["reserved"].max()) / 2**30))[1]

    assert Text.get_window_extent(peak_label, r).y0 > top  # its words (not its leader) above every line
    span = next(s for s in d["spans"] if s["start"] <= d["peak"]["x"] <= s["end"])
    assert span["end"] - span["start"] >= PEAK_STAGE_SHARE - 1e-9


def test_stage_axis_widens_short_stages_and_the_peaks() -> None:
    # a long first stage (90% of events), three short ones, the peak in the last
    x = stage_axis(1000, [(0, 900), (900, 950), (950, 990), (990, 1000)], peak_span=3)
    edges = [0.0, x[900], x[950], x[990], 1.0]
    widths = np.diff(edges)
    assert widths[3] >= PEAK_STAGE_SHARE - 1e-3 and (widths[1:3] >= MIN_STAGE_SHARE / 4 - 1e-3).all()
    assert (np.diff(x) > 0).all() and x[0] == 0


def test_a_trace_gets_a_picture_and_every_output(tmp_path: Path) -> None:
    """Issue 21: ``analyze TRACE --png`` failed after loading and wrote none of the other outputs."""
    trace = SAMPLES / "sd15-fp16-profile-1step" / "trace.json.gz"
    png, md, js = tmp_path / "t.png", tmp_path / "t.md", tmp_path / "t.json"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(trace),
            "--png",
            str(png),
            "--markdown",
            str(md),
            "--json",
            str(js),
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    px = _pixels(png.read_bytes())
    assert px.shape == (440, 900, 3) and _mask(px, PEAK_COLOR).sum() > 60 and _mask(px, "#1f3b73").sum() > 200
    assert md.is_file() and js.is_file()
    # what cannot be made is refused before any work, and nothing else is written
    out = tmp_path / "p.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(trace),
            "--perfetto",
            str(out),
            "--json",
            str(tmp_path / "x.json"),
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is a trace only" in r.stderr
    assert not out.exists() and not (tmp_path / "x.json").exists()
