"""``snapviz`` ends through the interpreter's normal exit (snapviz.cli.run): the verb's exit
code, no traceback and no "Exception ignored" line when the reader closes the pipe early."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paths import SAMPLES

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = SAMPLES / "sd15-fp16-classic"


def _snapviz(*args: str, **kw: object) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "snapviz", *args], env=env, cwd=ROOT, **kw)  # type: ignore[call-overload]


def test_exit_codes_and_atexit_handlers_run(tmp_path: Path) -> None:
    p = _snapviz("analyze", str(tmp_path / "none.pickle"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and out == b"" and err.decode().count("\n") == 1, err
    p = _snapviz("--version", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and out.startswith(b"snapviz, version") and err == b""


def test_a_reader_closing_the_pipe_early_gets_no_noise() -> None:
    p = _snapviz("analyze", str(SAMPLE), "--json", "-", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before anything is written: every write to stdout meets a closed pipe
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert (p.returncode, err) == (0, ""), "a reader that stopped reading is no error of the input's"
