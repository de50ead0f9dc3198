"""What each entry point imports: pandas only once a file is read, Bokeh only for HTML.

Module lists, not timings (timings live in benchmarks/bench_speed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from paths import ROOT, SAMPLES

PROBE = (
    "import sys, runpy; sys.argv = {argv!r}; {run}\nprint('MODULES=' + __import__('json').dumps(sorted(sys.modules)))"
)


def _modules(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120
    )
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MODULES="))
    return {m.split(".")[0] for m in json.loads(line.removeprefix("MODULES="))}


def _cli_modules(*args: str) -> set[str]:
    run = "from snapviz.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass"
    return _modules(PROBE.format(argv=["snapviz", *args], run=run))


def test_import_snapviz_leaves_pandas_and_bokeh_out() -> None:
    mods = _modules(PROBE.format(argv=["x"], run="import snapviz"))
    assert "snapviz" in mods
    assert not {"pandas", "bokeh"} & mods


def test_help_imports_no_pandas() -> None:
    assert not {"pandas", "bokeh"} & _cli_modules("--help")


def test_json_analysis_imports_no_bokeh(tmp_path) -> None:
    mods = _cli_modules("analyze", str(SAMPLES / "sdxl-fp16"), "--json", str(tmp_path / "s.json"), "-q")
    assert (tmp_path / "s.json").exists()
    assert "pandas" in mods and "bokeh" not in mods
