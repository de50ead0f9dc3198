"""`snapviz analyze` on hostile or broken input, as a user runs it: a fresh process, exit
code 2, exactly one line on stderr, no traceback, nothing executed, no output file left."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from paths import ROOT


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _cases(tmp: Path, marker: Path) -> dict[str, Path]:
    c: dict[str, Path] = {}
    c["reduce_os_system"] = tmp / "evil.pickle"
    c["reduce_os_system"].write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Payload(marker)]]}, protocol=4))
    c["reduce_eval_gzip"] = tmp / "evil2.pickle.gz"
    c["reduce_eval_gzip"].write_bytes(gzip.compress(pickle.dumps(_Payload(marker), protocol=5)))
    good = pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512}]]})
    c["truncated"] = tmp / "cut.pickle"
    c["truncated"].write_bytes(good[: len(good) // 2])
    c["empty"] = tmp / "empty.pickle"
    c["empty"].write_bytes(b"")
    c["random_bytes"] = tmp / "noise.pickle"
    c["random_bytes"].write_bytes(os.urandom(4096))
    c["not_a_snapshot"] = tmp / "int.pickle"
    c["not_a_snapshot"].write_bytes(pickle.dumps({"hello": 1}))
    c["directory"] = tmp / "adir"
    c["directory"].mkdir()
    c["missing"] = tmp / "nope.pickle"
    return c


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    tmp = tmp_path_factory.mktemp("hostile")
    marker = tmp / "PWNED"
    out: dict[str, tuple] = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name, path in _cases(tmp, marker).items():
        html, js = tmp / f"{name}.html", tmp / f"{name}.json"
        p = subprocess.run(
            [sys.executable, "-m", "snapviz", "analyze", str(path), "-o", str(html), "--json", str(js)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
            timeout=120,
        )
        out[name] = (p.returncode, p.stdout, p.stderr, html.exists() or js.exists(), path)
    out["_marker"] = (marker.exists(),)
    out["_leftovers"] = (sorted(f.name for f in tmp.iterdir() if f.name.startswith(".snapviz-")),)
    return out


CASES = [
    "reduce_os_system",
    "reduce_eval_gzip",
    "truncated",
    "empty",
    "random_bytes",
    "not_a_snapshot",
    "directory",
    "missing",
]


@pytest.mark.parametrize("name", CASES)
def test_exit_2_one_line_no_output(results: dict, name: str) -> None:
    rc, stdout, stderr, wrote, path = results[name]
    assert rc == 2, (name, rc, stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, (name, stderr)
    assert "Traceback" not in stderr and str(path) in lines[0]
    assert not wrote, f"{name}: an output file was left behind"


def test_nothing_ran_and_no_temp_files(results: dict) -> None:
    assert results["_marker"] == (False,), "a pickle payload executed"
    assert results["_leftovers"] == ([],)


def test_bad_option_is_exit_2(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(ROOT / "sample_snapshots" / "sd15-fp16-sdpa"),
            "-o",
            str(tmp_path / "no" / "such" / "dir" / "r.html"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


# ----------------------------------------------------------------------------- stdout failures (issue 26)


def _run_with_stdout(tmp: Path, args: list[str], stdout: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m snapviz ARGS`` with stdout closed (``>&-``), a full device, or a pipe whose
    reader reads one byte and goes away; stderr captured."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "snapviz", *args]
    if stdout == "pipe_closed_early":
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp)
        assert p.stdout is not None and p.stderr is not None
        p.stdout.read(1)
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
        return subprocess.CompletedProcess(cmd, p.returncode, b"", err)
    if stdout == "closed":
        return subprocess.run(
            cmd, stderr=subprocess.PIPE, env=env, cwd=tmp, timeout=120, preexec_fn=lambda: os.close(1)
        )
    with open("/dev/full", "wb") as full:
        return subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, env=env, cwd=tmp, timeout=120)


def _big_snapshot(tmp: Path) -> Path:
    path = tmp / "s.pickle"
    trace = [
        {"action": "alloc", "addr": 512 * i, "size": 512, "frames": [{"name": f"f{i}", "filename": "x.py", "line": i}]}
        for i in range(3000)
    ]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    return path


@pytest.mark.parametrize("stdout", ["closed", "dev_full", "pipe_closed_early"])
@pytest.mark.parametrize(
    "args",
    [["analyze", "{in}", "--json", "-"], ["analyze", "{in}"], ["check", "{in}", "--max-peak", "1GiB"]],
    ids=["json-", "terminal", "check"],
)
def test_stdout_failures_are_one_line(tmp_path: Path, stdout: str, args: list[str]) -> None:
    if stdout == "dev_full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = _big_snapshot(tmp_path)
    p = _run_with_stdout(tmp_path, [a.replace("{in}", str(path)) for a in args], stdout)
    err = p.stderr.decode(errors="replace")
    assert "Traceback" not in err and "snapviz bug" not in err, err
    if stdout == "pipe_closed_early":  # as Unix tools: the reader asked for no more
        assert p.returncode == 0 and not err.strip(), (p.returncode, err)
        return
    assert p.returncode == 2, (p.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "standard output" in lines[0], err
