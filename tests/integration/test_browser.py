"""The HTML reports in a real headless Chromium, offline.

Needs Debian's ``chromium`` (CI installs it with apt) and the ``playwright`` Python
package (the ``test`` extra; its wheel bundles the driver, and the system Chromium is
used, so ``playwright install`` is never run). Skipped only when no Chromium exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from browser import check_report_in_browser, chromium_path, playwright_available

pytestmark = [
    pytest.mark.skipif(chromium_path() is None, reason="no Chromium binary (apt-get install chromium)"),
]


@pytest.fixture(scope="module", autouse=True)
def _needs_playwright() -> None:
    if not playwright_available():
        pytest.fail("the browser tests need the 'playwright' Python package: pip install -e '.[test]'", pytrace=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``snapviz analyze RUN -o report.html`` on a synthetic SD-like run (via the CLI)."""
    from sdrun import write_run
    from snapviz.cli import main

    d = tmp_path_factory.mktemp("browser")
    run = write_run(str(d / "run"), steps=4, filler=40, evil=True)
    out = d / "report.html"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", run, "-o", str(out), "-q", "--max-points", "2000"])
    assert exc.value.code == 0
    return out


def _shots_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # SNAPVIZ_SCREENSHOTS keeps the PNGs somewhere a person (or CI artifacts) can look.
    keep = os.environ.get("SNAPVIZ_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        return keep
    return str(tmp_path_factory.mktemp("shots"))


def _is_png(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_renders_offline_without_errors(report: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    res = check_report_in_browser(str(report), _shots_dir(tmp_path_factory))
    assert res["errors"] == [], res["errors"]
    assert res["blocked"] == [], "the report reached for the network"
    # Roots that share models are one document (linked); the others are documents of their own,
    # deserialized when their turn comes.
    together = [set(names) for names in res["doc_roots"]]
    assert len(together) == res["documents"] >= 2
    assert {"sv-timeline", "sv-timeline-detail"} in together, res["doc_roots"]
    assert any({"sv-stage-breakdown", "sv-stage-top-table"} <= d for d in together), res["doc_roots"]
    # timeline (tabs + stack pane), stage bars, categories, top allocations, attention table
    assert res["roots"] >= 5
    assert res["plots"] >= 4 and res["canvases"] >= 8
    assert res["table_rows"] >= 10, "the DataTables rendered their rows"
    assert res["bokeh_version"]
    assert _is_png(res["screenshot"]) and os.path.getsize(res["screenshot"]) > 20_000
    text = res["text"]
    assert "Peak " in text and "allocated" in text and "Memory over time" in text
    assert "<script>alert(1)</script>" in res["table_text"], "the hostile site is shown as text, not run"


def test_clicks_show_stacks(report: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    def interact(page: Any) -> dict[str, Any]:
        panes_before = page.locator("pre").all_inner_texts()
        # A click anywhere on the timeline selects the event in force there.
        canvas = page.locator("#sv-timeline-card canvas").first
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
        page.wait_for_timeout(200)
        page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
        page.wait_for_timeout(300)
        after_click = page.locator("pre").all_inner_texts()
        # Selecting the first row of "Live at the peak" shows its stack.
        page.locator("#sv-top .slick-cell").nth(2).click()
        page.wait_for_timeout(300)
        after_row = page.locator("pre").all_inner_texts()
        # The event-index view renders too.
        page.get_by_text("By event", exact=True).click()
        page.wait_for_timeout(500)
        return {"before": panes_before, "after_click": after_click, "after_row": after_row}

    res = check_report_in_browser(str(report), _shots_dir(tmp_path_factory), interact=interact)
    assert res["errors"] == [], res["errors"]
    assert res["before"][0].startswith("Click a point")
    assert res["after_click"][0].startswith("event "), res["after_click"][0]
    assert ".py:" in res["after_click"][0] or "no frames" in res["after_click"][0]
    assert "get_attention_scores" in res["after_row"][1]


# The timeline's state as BokehJS holds it: the x column each line, marker and band reads,
# the shared x range, the strip's axis title, and how many rows the lines draw.
_TIMELINE_STATE = """() => {
  const find = (name) => Bokeh.documents.map((d) => d.get_model_by_name(name)).find((m) => m != null);
  const main = find("sv-timeline"), detail = find("sv-timeline-detail");
  const figs = [...main.children, ...detail.children].filter((c) => c.renderers !== undefined);
  const fields = new Set();
  for (const f of figs) for (const r of f.renderers) {
    if (!r.data_source.get_length()) continue;  // the legend's empty swatches
    const g = r.glyph;
    for (const a of ["x", "left"]) if (g[a] != null && typeof g[a] === "object" && "field" in g[a]) fields.add(g[a].field);
  }
  const src = figs[0].renderers.find((r) => r.data_source.data.index !== undefined).data_source;
  const views = Object.values(Bokeh.index);
  return {fields: [...fields].sort(), start: figs[0].x_range.start, end: figs[0].x_range.end,
          label: figs[figs.length - 1].below.find((m) => "axis_label" in m).axis_label, rows: src.data.index.length,
          max_index: Math.max(...src.data.index), max_time: Math.max(...src.data.time_s),
          finished: views.every((v) => v.has_finished()), figures: figs.length};
}"""


def test_by_event_tab_shows_the_event_axis(report: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """One set of figures serves both tabs: "By event" swaps every x column to the event index
    and re-fits the range; "By time" swaps back."""
    shots = _shots_dir(tmp_path_factory)

    def interact(page: Any) -> dict[str, Any]:
        before = page.evaluate(_TIMELINE_STATE)
        page.get_by_text("By event", exact=True).click()
        page.wait_for_timeout(600)
        by_event = page.evaluate(_TIMELINE_STATE)
        page.locator("#sv-timeline-card").screenshot(path=os.path.join(shots, "by-event.png"))
        page.get_by_text("By time", exact=True).click()
        page.wait_for_timeout(600)
        return {"by_time": before, "by_event": by_event, "back": page.evaluate(_TIMELINE_STATE)}

    res = check_report_in_browser(str(report), shots, interact=interact)
    assert res["errors"] == [], res["errors"]
    by_time, by_event, back = res["by_time"], res["by_event"], res["back"]
    assert by_time["figures"] == 3 and by_time["rows"] > 100
    assert by_time["max_index"] > 10 * by_time["max_time"], "the two axes must be told apart by their range"
    assert by_time["fields"] == ["start_s", "time_s"] and by_time["label"].startswith("time")
    assert by_time["end"] < 2 * by_time["max_time"]
    # every glyph now reads the event columns, and the range spans the events
    assert by_event["fields"] == ["index", "start_index"], by_event["fields"]
    assert by_event["label"] == "event index" and by_event["finished"]
    assert by_event["start"] <= 0.05 * by_event["max_index"] and by_event["end"] >= by_event["max_index"]
    assert back["fields"] == by_time["fields"] and back["end"] < 2 * by_time["max_time"]
    assert _is_png(os.path.join(shots, "by-event.png"))


def test_trace_report_renders(tmp_path_factory: pytest.TempPathFactory) -> None:
    from sdrun import fake_trace_analysis
    from snapviz.render.html import render_trace_html

    tan, doc = fake_trace_analysis()
    path = tmp_path_factory.mktemp("trace") / "trace-report.html"
    path.write_text(render_trace_html(tan, doc, max_points=1000), encoding="utf-8")
    res = check_report_in_browser(str(path), _shots_dir(tmp_path_factory))
    assert res["errors"] == [], res["errors"]
    assert res["roots"] >= 3 and res["plots"] >= 3 and res["table_rows"] >= 3
    assert "profiler trace" in res["text"]


def test_end_state_only_report_renders(tmp_path_factory: pytest.TempPathFactory) -> None:
    import synth
    from sdrun import _analyse
    from snapviz.analyses.document import from_json
    from snapviz.render.html import render_html

    an, doc = _analyse(synth.random_workload(seed=1, n_ops=200).snapshot(layout="segments", marker=False))
    path = tmp_path_factory.mktemp("legacy") / "legacy.html"
    path.write_text(render_html(an, from_json(doc)), encoding="utf-8")
    res = check_report_in_browser(str(path), _shots_dir(tmp_path_factory))
    assert res["errors"] == [], res["errors"]
    assert "No trace history" in res["text"]


# Where the first OOM marker is drawn, in page pixels: found by its own column (oom_request).
_OOM_MARKER = """() => {
  const all = [];
  const walk = (v) => { if (!v || all.includes(v)) return; all.push(v); for (const c of (v.child_views || [])) walk(c); };
  Object.values(Bokeh.index).forEach(walk);
  for (const v of all) {
    if (!v.model || v.model.type !== "Figure") continue;
    for (const r of v.model.renderers) {
      const d = r.data_source && r.data_source.data;
      if (d && d.oom_request !== undefined && d.oom_request.length) {
        const rect = v.canvas_view.el.getBoundingClientRect();
        return {x: rect.left + v.frame.x_scale.compute(d[r.glyph.x.field][0]),
                y: rect.top + v.frame.y_scale.compute(d.allocated[0]), request: d.oom_request[0]};
      }
    }
  }
  return null;
}"""


def test_oom_marker_hover_names_the_failed_request(tmp_path_factory: pytest.TempPathFactory) -> None:
    """issue 21: hovering the OOM marker showed an unrelated 512 B event; it names the failed
    1 GiB request of the sample (its size equal to the trace's oom entry) and its site."""
    from paths import SAMPLES
    from snapviz.cli import main

    sample = SAMPLES / "sdxl-fp16-oom-10gb"
    out = tmp_path_factory.mktemp("oom") / "oom.html"
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(sample), "-o", str(out), "-q"])
    assert exc.value.code == 0

    def interact(page: Any) -> dict[str, Any]:
        page.locator("#sv-timeline-card").scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        pos = page.evaluate(_OOM_MARKER)
        page.mouse.move(pos["x"], pos["y"])
        page.wait_for_timeout(500)
        tip = page.get_by_text("request of").all_inner_texts()
        rows = page.get_by_text(" B", exact=False).all_inner_texts()
        return {"pos": pos, "tip": tip, "rows": rows, "card": page.locator("#sv-oom").inner_text()}

    res = check_report_in_browser(str(out), _shots_dir(tmp_path_factory), interact=interact)
    assert res["errors"] == [], res["errors"]
    import snapviz
    from snapviz.model import A_OOM

    run = snapviz.load(str(sample))
    assert run.snapshot is not None
    ev = run.snapshot.events
    request = int(ev.loc[ev["action"] == A_OOM, "size"].iat[0])  # the trace's own oom entry
    assert res["pos"]["request"] == request
    assert res["tip"] == ["request of 1 GiB failed"], res["tip"]
    assert any(f"{request:,} B" in r for r in res["rows"]), res["rows"]
    assert "CUDA out of memory: a 1.00 GiB request (1,073,741,824 B)" in res["card"]
    assert "upsampling.py:186" in res["card"] and "verdict: fragmented" in res["card"]
    # the hero leads with the failure, the peak comes under it
    assert res["text"].index("CUDA out of memory") < res["text"].index("Peak 9.03 GiB")


def test_a_page_that_fetches_is_caught(tmp_path: Path) -> None:
    """The check itself: a page reaching for a CDN or throwing is reported, not passed."""
    from snapviz.render.html import build_page

    page = build_page(
        "bad", ['<img src="https://cdn.example.invalid/x.png">', "<script>throw new Error('boom')</script>"]
    )
    p = tmp_path / "bad.html"
    p.write_text(page, encoding="utf-8")
    res = check_report_in_browser(str(p), str(tmp_path))
    assert any("cdn.example.invalid" in u for u in res["blocked"])
    assert any("boom" in e for e in res["errors"])
