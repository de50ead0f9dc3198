"""Golden outputs: the JSON, Markdown and terminal text of every bundled sample, byte for byte.

They pin behaviour across refactors (a change of layout must not change a report). A deliberate
change of output regenerates them, and the diff of ``tests/data/golden/`` is then reviewed like
code: ``SNAPVIZ_UPDATE_GOLDEN=1 python -m pytest tests/integration/test_golden.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paths import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden"
SAMPLES = sorted(p.name for p in (ROOT / "sample_snapshots").iterdir() if (p / "run.json").is_file())
UPDATE = bool(os.environ.get("SNAPVIZ_UPDATE_GOLDEN"))
_VERSION = re.compile(r"(snapviz\W{1,4}(?:version\W{1,4})?)\d+\.\d+\.\d+\S*")  # none today; kept stable if added


def _normalise(text: str) -> str:
    return _VERSION.sub(r"\1X.Y.Z", text)


def _outputs(sample: str, tmp: Path) -> dict[str, str]:
    """The three text outputs as a user gets them: one CLI run, in a fresh process."""
    js, md = tmp / "summary.json", tmp / "summary.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            f"sample_snapshots/{sample}",
            "--json",
            str(js),
            "--markdown",
            str(md),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    terminal = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("  wrote ")) + "\n"
    return {"json": js.read_text(), "md": md.read_text(), "txt": terminal}


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_outputs_match_golden(sample: str, tmp_path: Path) -> None:
    got = {k: _normalise(v) for k, v in _outputs(sample, tmp_path).items()}
    for kind, text in got.items():
        path = GOLDEN / f"{sample}.{kind}"
        if UPDATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            continue
        if not path.exists():
            pytest.fail(f"no golden file {path.relative_to(ROOT)}: run with SNAPVIZ_UPDATE_GOLDEN=1 and review it")
        assert text == path.read_text(), f"{sample}.{kind} differs from its golden file"
