"""Open a report in a real headless Chromium, offline, and say what rendered.

Reusable by every HTML report test::

    from browser import check_report_in_browser, chromium_path
    res = check_report_in_browser("report.html")
    assert not res["errors"] and res["roots"] >= 3

Uses Playwright's Python package (``pip install playwright``; its wheel bundles the
driver) against the system Chromium (Debian ``chromium``): ``playwright install`` is
never needed. Every request that is not ``file:``/``data:``/``blob:``/``about:`` is
aborted and recorded, so a report that reaches for a CDN fails the check.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

# Debian's /usr/bin/chromium is a shell wrapper; Playwright needs the real binary.
_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "/usr/lib/chromium-browser/chromium-browser",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
)


def chromium_path() -> str | None:
    """The Chromium binary to drive (``SNAPVIZ_CHROMIUM`` overrides), or None."""
    env = os.environ.get("SNAPVIZ_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for p in _CANDIDATES:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found


def playwright_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


_COMPLETE = """
() => (window.snapviz_pending === undefined || window.snapviz_pending === 0) && window.Bokeh.index
      && Object.values(window.Bokeh.index).length > 0 && Object.values(window.Bokeh.index).every(v => v.has_finished())
"""

# Runs in the page once Bokeh reports its documents: counts what actually rendered,
# looking inside the shadow roots where Bokeh 3 draws.
_PROBE = """
() => {
  const out = {bokeh: !!window.Bokeh, version: window.Bokeh ? window.Bokeh.version : null,
               documents: 0, roots: 0, canvases: 0, plots: 0, table_rows: 0, tables: 0};
  if (!window.Bokeh || !window.Bokeh.documents) return out;
  out.documents = window.Bokeh.documents.length;
  out.doc_roots = window.Bokeh.documents.map((d) => d.roots().map((r) => r.name));
  for (const d of window.Bokeh.documents) out.roots += d.roots().length;
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "CANVAS") out.canvases++;
      if (el.classList && el.classList.contains("slick-row")) out.table_rows++;
      if (el.classList && el.classList.contains("slick-header")) out.tables++;
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  const views = [];
  for (const v of Object.values(window.Bokeh.index || {})) views.push(v);
  const seen = new Set();
  const count = (v) => {
    if (!v || seen.has(v)) return;
    seen.add(v);
    if (v.model && v.model.type === "Figure") out.plots++;
    const kids = v.child_views || [];
    for (const c of kids) count(c);
  };
  for (const v of views) count(v);
  return out;
}
"""


def check_report_in_browser(
    path: str,
    screenshot_dir: str | None = None,
    width: int = 1400,
    height: int = 2400,
    timeout_ms: int = 30000,
    interact: Callable[[Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load ``path`` over file:// with the network blocked; return what happened.

    Keys: ``errors`` (console errors, page errors, and blocked network requests),
    ``roots`` (Bokeh document roots), ``canvases``, ``plots`` (rendered figures),
    ``tables`` / ``table_rows`` (DataTable headers / rendered rows), ``bokeh_version``,
    ``screenshot`` (a full-page PNG), ``blocked`` (URLs that were refused), ``text``
    (the page's visible text).
    """
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    if exe is None:
        raise RuntimeError("no Chromium binary found (install Debian's 'chromium' or set SNAPVIZ_CHROMIUM)")
    url = "file://" + os.path.abspath(path)
    errors: list[str] = []
    blocked: list[str] = []
    shot_dir = screenshot_dir or tempfile.mkdtemp(prefix="snapviz-browser-")
    shot = os.path.join(shot_dir, os.path.splitext(os.path.basename(path))[0] + ".png")

    def on_route(route: Any) -> None:
        u = route.request.url
        if u.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            blocked.append(u)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=exe,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"],
        )
        try:
            ctx = browser.new_context(
                viewport={"width": width, "height": min(height, 1600)}, offline=True, device_scale_factor=1
            )
            ctx.route("**/*", on_route)
            page = ctx.new_page()
            page.on(
                "console",
                lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.goto(url, wait_until="load", timeout=timeout_ms)
            page.wait_for_function(
                "() => window.Bokeh && window.Bokeh.documents && window.Bokeh.documents.length > 0 && "
                "window.Bokeh.documents[0].roots().length > 0",
                timeout=timeout_ms,
            )
            # Views are built asynchronously after the document, and snapviz pages add the roots
            # below the first screen one per frame (render/html/assets/lazy_embed.js): wait until
            # every root is added and every view has finished rendering. (Document.is_idle stays
            # false for roots added after the first idle notification, so it cannot tell.)
            try:
                page.wait_for_function(_COMPLETE, timeout=timeout_ms)
            except Exception as exc:  # noqa: BLE001 - reported, and the counts below tell the rest
                errors.append(f"timeout waiting for Bokeh to finish rendering: {type(exc).__name__}")
            page.wait_for_timeout(300)
            probe = page.evaluate(_PROBE)
            text = page.inner_text("body")
            cells = page.locator(".slick-cell").all_inner_texts()  # Playwright pierces shadow roots
            page.screenshot(path=shot, full_page=True)
            extra = interact(page) if interact is not None else {}
        finally:
            browser.close()
    return {
        "errors": errors + [f"blocked request: {u}" for u in blocked],
        "blocked": blocked,
        "roots": int(probe.get("roots", 0)),
        "documents": int(probe.get("documents", 0)),
        "doc_roots": probe.get("doc_roots", []),
        "canvases": int(probe.get("canvases", 0)),
        "plots": int(probe.get("plots", 0)),
        "tables": int(probe.get("tables", 0)),
        "table_rows": int(probe.get("table_rows", 0)),
        "bokeh_version": probe.get("version"),
        "screenshot": shot,
        "text": text,
        "table_text": "\n".join(cells),
        **extra,
    }
