#!/usr/bin/env python3
"""How fast does a snapviz report appear in a browser? Headless Chromium, offline, median of N.

For every bundled sample (``sample_snapshots/*``) the script writes the report with
``snapviz analyze DIR -o report.html`` (each in its own process), plus any HTML files or
snapshots given as arguments (a big snapshot: ``benchmarks/bench_analyze.py --keep DIR``
leaves ``DIR/bench_snapshot.pickle``). Each page is then opened ``--runs`` times, each in a
fresh browser context (no cache shared between runs), and three moments are read from the
page's own clock (``performance.now()``, milliseconds since navigation started):

* **first paint**: the browser's ``first-contentful-paint`` (the header and verdict on screen);
* **first view**: the first screen drawn: every Bokeh root whose place on the page is in the
  first viewport has rendered (what the reader sees without scrolling), lazy roots included;
* **all drawn**: Bokeh says every document is idle (every root of the page rendered).

Beside them, the CPU time the Chromium processes spent up to first view and up to all drawn
(read from /proc through psutil): on a shared machine the wall-clock moments grow with the
other processes' load, the CPU time much less. Pages are loaded in turn, run after run, so
reports given side by side (before/after) see the same load.

Target (issue 14): first view <= 1 s (median) for every report, page <= 5 MB.

    python benchmarks/bench_paint.py [--runs 5] [--no-samples] [--keep DIR] [FILE.html|SNAPSHOT ...]

Needs the ``playwright`` package and a system Chromium (``tests/support/browser.py`` finds it).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 1000.0
TARGET_PAGE_BYTES = 5 * 1000 * 1000

# Polled in the page: the first-view moment is recorded the first time every root placeholder
# (``<div class="sv-root">``, one per Bokeh root, ``assets/page.html``) that starts inside the
# viewport holds a finished root view (`has_finished()`). A root still waiting in the lazy queue
# counts as not drawn where its placeholder is on screen, so deferring a root only helps once
# the roots drawn before it have pushed it below the fold.
_INIT = """
window.__sv = {fcp: null, first_view: null, idle: null};
new PerformanceObserver((l) => { for (const e of l.getEntries())
  if (e.name === "first-contentful-paint") window.__sv.fcp = e.startTime; }).observe({type: "paint", buffered: true});
const __svPoll = () => {
  const B = window.Bokeh;
  if (B && B.documents && B.documents.length && B.index) {
    const views = Object.values(B.index);
    const roots = B.documents.flatMap((d) => d.roots());
    if (views.length && window.__sv.first_view === null) {
      const top = [...document.querySelectorAll(".sv-root")].filter((w) => w.getBoundingClientRect().top < window.innerHeight);
      if (top.every((w) => views.some((v) => w.contains(v.el) && v.has_finished()))) window.__sv.first_view = performance.now();
    }
    if (roots.length && views.length >= roots.length && (window.snapviz_pending ?? 0) === 0
        && views.every((v) => v.has_finished())) { window.__sv.idle = performance.now(); return; }
  }
  requestAnimationFrame(__svPoll);
};
requestAnimationFrame(__svPoll);
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def write_report(source: str, out: Path) -> None:
    """``snapviz analyze SOURCE -o OUT`` in its own process."""
    cmd = [sys.executable, "-m", "snapviz", "analyze", source, "-o", str(out), "-q"]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"failed (rc {res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")


def _chromium_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) used so far by each Chromium process this script started: a
    figure other processes' load cannot inflate, beside the wall-clock moments."""
    out: dict[int, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name():
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
        except psutil.Error:  # exited between listing and reading
            continue
    return out


def _cpu_ms_since(start: dict[int, float]) -> float:
    """CPU milliseconds the Chromium processes used since ``start`` (processes that exited in
    between, such as the previous page's renderer, drop out of both ends)."""
    return sum(t - start.get(pid, 0.0) for pid, t in _chromium_cpu_s().items()) * 1000


def measure(pages: list[Path], runs: int, timeout_ms: int = 60000) -> list[dict[str, Any]]:
    """For each page: milliseconds to first paint, first view and all drawn, and the browser's
    CPU milliseconds to first view and to all drawn, one list each (one value a run). The pages
    are loaded in turn, run after run, so a change of load on the machine hits them all alike."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional, benchmark only

    from browser import chromium_path  # noqa: PLC0415 - test helper: finds the system Chromium

    exe = chromium_path()
    if exe is None:
        raise SystemExit("no Chromium binary found (apt-get install chromium, or set SNAPVIZ_CHROMIUM)")
    out: list[dict[str, Any]] = [
        {"fcp": [], "first_view": [], "idle": [], "cpu_first_view": [], "cpu_idle": [], "errors": []} for _ in pages
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=exe,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"],
        )
        try:
            for _ in range(runs):
                for path, res in zip(pages, out, strict=True):
                    ctx = browser.new_context(viewport={"width": 1400, "height": 900}, offline=True)
                    ctx.add_init_script(_INIT)
                    page = ctx.new_page()
                    page.on("pageerror", lambda e, errs=res["errors"]: errs.append(str(e)))
                    cpu0 = _chromium_cpu_s()
                    page.goto("file://" + str(path.resolve()), wait_until="commit", timeout=timeout_ms)
                    page.wait_for_function("() => window.__sv.first_view !== null", timeout=timeout_ms, polling=20)
                    cpu1 = _cpu_ms_since(cpu0)
                    page.wait_for_function("() => window.__sv.idle !== null", timeout=timeout_ms, polling=20)
                    cpu2 = _cpu_ms_since(cpu0)
                    got = page.evaluate("() => window.__sv")
                    for k in ("fcp", "first_view", "idle"):
                        res[k].append(float(got[k]) if got[k] is not None else float("nan"))
                    res["cpu_first_view"].append(cpu1)
                    res["cpu_idle"].append(cpu2)
                    ctx.close()
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="HTML reports, or snapshots/run directories to write reports of")
    ap.add_argument("--runs", type=int, default=5, help="page loads per report (the median counts)")
    ap.add_argument("--no-samples", action="store_true", help="skip the bundled samples")
    ap.add_argument("--keep", help="directory to keep the written reports in (default: a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="snapviz-paint-"))
    work.mkdir(parents=True, exist_ok=True)

    pages: list[tuple[str, Path]] = []
    sources = [] if args.no_samples else sorted(glob.glob(str(ROOT / "sample_snapshots" / "*" / "run.json")))
    for run_json in sources:
        name = Path(run_json).parent.name
        out = work / f"{name}.html"
        write_report(str(Path(run_json).parent), out)
        pages.append((name, out))
    for x in args.inputs:
        p = Path(x)
        if p.suffix == ".html":
            pages.append((f"{p.parent.name}/{p.name}", p))
        else:
            out = work / f"{p.stem}.html"
            write_report(str(p), out)
            pages.append((p.name, out))

    print(f"### First paint in headless Chromium (median of {args.runs}, ms since navigation; CPU: browser ms)\n")
    print(
        "| report | page | first paint | first view | all drawn | CPU to first view | CPU to all drawn "
        "| target (first view <= 1 s, <= 5 MB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    missed = False
    for (name, path), m in zip(pages, measure([p for _, p in pages], args.runs), strict=True):
        size = path.stat().st_size
        med = {k: statistics.median(m[k]) for k in ("fcp", "first_view", "idle", "cpu_first_view", "cpu_idle")}
        ok = med["first_view"] <= TARGET_MS and size <= TARGET_PAGE_BYTES and not m["errors"]
        missed |= not ok
        note = "ok" if ok else "**MISSED**" + (f" ({len(m['errors'])} page errors)" if m["errors"] else "")
        print(
            f"| {name} | {size / 2**20:.2f} MiB | {med['fcp']:.0f} | {med['first_view']:.0f} | {med['idle']:.0f} "
            f"| {med['cpu_first_view']:.0f} | {med['cpu_idle']:.0f} | {note} |",
            flush=True,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
