"""docs/notebook.ipynb executed headless (nbclient), and its reports rendered in Chromium.

Also ``snapviz.show`` / the display hooks without a kernel. The notebook needs torch and
diffusers (part 1 records the tiny pipeline on a CPU); skipped without them or without
nbclient/ipykernel (the ``test`` extra installs those).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import snapviz
from paths import ROOT
from snapviz.notebook import Report, report

SAMPLES = ROOT / "sample_snapshots"
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"


def test_report_of_a_path_holds_the_page_and_the_summary() -> None:
    rep = report(str(SAMPLES / "sd15-fp16-sdpa"))
    assert isinstance(rep, Report) and len(repr(rep)) < 300 and "save(path)" in repr(rep)
    assert rep.summary["peak"]["allocated_bytes"] == 2831357440
    frame = rep._repr_html_()
    assert frame.startswith("<iframe") and frame.count("<") == 2  # the page is one escaped attribute
    srcdoc = re.search(r'srcdoc="([^"]*)"', frame)
    assert srcdoc is not None
    assert html.unescape(srcdoc.group(1)) == rep.page
    assert "https://" not in rep.page.split("<body", 1)[0].replace("https://bokeh.org", "")  # inline resources
    assert "2.64 GiB" in rep._repr_markdown_()


def test_show_outside_a_notebook_writes_the_page_and_returns_its_path(tmp_path: Path) -> None:
    """Issue 21: ``snapviz.show()`` in a script returned the 2.7 MB page (a REPL printed all of it)."""
    code = (
        "import snapviz, os\n"
        f"p = snapviz.show({str(SAMPLES / 'sd15-fp16-sdpa')!r})\n"
        "print(repr(p)); print(os.path.getsize(p))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    path_repr, size = res.stdout.splitlines()
    path = Path(eval(path_repr))  # a str: its repr is a quoted path
    try:
        assert path.suffix == ".html" and int(size) > 100_000 and path.read_text().startswith("<!DOCTYPE html>")
        assert res.stderr.strip() == f"snapviz: report written to {path}"
    finally:
        path.unlink()
    out = tmp_path / "given.html"
    assert snapviz.show(str(SAMPLES / "sd15-fp16-sdpa"), path=out) == str(out)  # a given path: there, even here
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and len(page) > 100_000 and "sd15-fp16-sdpa" in page


def test_ipython_displays_analyses_as_reports() -> None:
    ip_mod = pytest.importorskip("IPython.core.interactiveshell")
    shell = ip_mod.InteractiveShell.instance()
    snapviz.load_ipython_extension(shell)
    an = snapviz.analyze(str(SAMPLES / "sd15-fp16-sdpa"))
    data, _ = shell.display_formatter.format(an)
    assert data["text/html"].startswith("<iframe") and "vae_decode" in data["text/markdown"]
    cmp = snapviz.compare(str(SAMPLES / "sd15-fp16-sdpa"), str(SAMPLES / "sd15-fp16-classic"))
    data, _ = shell.display_formatter.format(cmp)
    assert "sd15-fp16-classic" in data["text/markdown"] and data["text/html"].startswith("<iframe")


def test_show_rejects_other_objects() -> None:
    with pytest.raises(TypeError):
        report(42)  # type: ignore[arg-type]  # deliberately not a path or an analysis


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + old if old else "")  # the kernel imports this checkout
    try:
        nbclient.NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        ).execute()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return nb


def test_notebook_executes_and_shows_three_reports(executed: Any) -> None:
    frames = [
        o["data"]["text/html"]
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {}) and o["data"]["text/html"].startswith("<iframe")
    ]
    assert len(frames) == 3  # the CPU run, the H200 sample (an analysis), the comparison
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "replayed peak 2,824,281,088 B, allocator 2,824,281,088 B" in text  # sample_snapshots/README.md


def test_saved_notebook_renders_in_chromium(executed: Any, tmp_path: Path) -> None:
    """The executed notebook's HTML outputs, saved as a page, render offline in headless Chromium."""
    from browser import chromium_path, playwright_available

    if chromium_path() is None or not playwright_available():
        pytest.skip("no Chromium / playwright")
    from playwright.sync_api import sync_playwright

    outputs = [
        o["data"]["text/html"]
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    page_path = tmp_path / "notebook.html"
    page_path.write_text("<!DOCTYPE html><html><body>" + "\n".join(outputs) + "</body></html>", encoding="utf-8")
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            ctx = browser.new_context(offline=True, viewport={"width": 1200, "height": 1000})

            def local_only(r: Any) -> None:
                if r.request.url.startswith(("file:", "data:", "blob:", "about:")):
                    r.continue_()
                else:
                    problems.append(f"blocked {r.request.url}")
                    r.abort()

            ctx.route("**/*", local_only)
            page = ctx.new_page()
            page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.goto("file://" + str(page_path), wait_until="load", timeout=60000)
            frames = [f for f in page.frames if f != page.main_frame]
            assert len(frames) == 3
            roots = []
            for f in frames:
                f.wait_for_function(
                    "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].roots().length > 0",
                    timeout=60000,
                )
                roots.append(f.evaluate("() => Bokeh.documents.reduce((n, d) => n + d.roots().length, 0)"))
        finally:
            browser.close()
    assert problems == [] and all(r >= 2 for r in roots), (problems, roots)  # a comparison page has 2 roots
