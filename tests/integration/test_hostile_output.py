"""Outputs that cannot destroy and cannot be injected (issue 9, docs/security.md).

Every case runs ``python -m snapviz`` in a fresh process, as a user or CI would: an output
that is (or leads to) an input, a special file, or an unwritable place is refused with exit
2 and one stderr line before any work, and nothing changes on disk; outputs are committed
together; strings from a hostile snapshot come out clipped and escaped for each sink.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import re
import resource
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import synth
from paths import ROOT
from synth import MiB

ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")

# What a stranger's file can carry into a report: HTML, links, images, table breaks, code-span
# breaks, terminal title/colour escapes, a fake extra line, C1 CSI and DEL.
PAYLOAD = (
    "<img src=x onerror=alert(1)> [a](http://x) ![i](http://y) <svg/onload=1> <script>alert(1)</script> "
    "| `tick` ``two`` *b* _i_ \x1b]0;title\x07 \x1b[31mred\r\n  peak allocated 1.00 GiB (all good)\n\x9b2J\x7f\\"
)
# Control characters a terminal acts on (tab and newline excepted: they are the layout).
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def run_sv(*args: str, cwd: Path, preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec_fn,
    )


def tree_state(d: Path) -> dict[str, Any]:
    """Every entry under ``d``: kind, and content hash of regular files (links not followed)."""
    out: dict[str, Any] = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(d))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(st.st_mode))
        else:
            out[str(p.relative_to(d))] = (stat.S_IFMT(st.st_mode), os.readlink(p) if p.is_symlink() else None)
    return out


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    """The one error line; an option click's parser refuses comes after the usage and --help lines."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    if len(lines) == 3 and lines[0].startswith("Usage: ") and lines[1].startswith("Try '"):
        lines = lines[2:]
    assert len(lines) == 1 and lines[0].startswith("snapviz: error: "), p.stderr
    assert "Traceback" not in p.stderr and "snapviz bug" not in p.stderr, p.stderr
    return lines[0]


def _small_snapshot(label_prefix: str = "") -> dict[str, Any]:
    sim = synth.Sim()
    handles = []
    for st in ("load", "text_encode", "denoise/0", "vae_decode"):
        sim.set_label(label_prefix + st)
        sim.annotate(label_prefix + st, "START")
        for i in range(3):
            handles.append(sim.alloc((i + 1) * 3 * MiB, frames=synth.make_frames(f"op{i}", "/work/pipe.py", 10 + i)))
        sim.annotate(label_prefix + st, "END")
    return sim.snapshot()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot file, a second one, and a run directory (run.json + snapshot.pickle)."""
    d = tmp_path_factory.mktemp("inputs")
    raw = pickle.dumps(_small_snapshot(), protocol=4)
    (d / "a.pickle").write_bytes(raw)
    (d / "b.pickle").write_bytes(pickle.dumps(_small_snapshot(), protocol=4))
    run = d / "run"
    run.mkdir()
    (run / "snapshot.pickle").write_bytes(raw)
    (run / "run.json").write_text(json.dumps({"schema": "snapviz.run/1", "pipeline": "sd15", "size": "tiny"}))
    tr = d / "tr"  # a run directory holding a trace
    tr.mkdir()
    (tr / "trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    (tr / "run.json").write_text(json.dumps({"schema": "snapviz.run/1", "pipeline": "sd15", "size": "tiny"}))
    (d / "rules.json").write_text(json.dumps({"extends": "builtin", "rules": []}))
    (d / "var" / "fp16").mkdir(parents=True)  # a matrix --from-dir
    (d / "var" / "fp16" / "run.json").write_text("{}")
    return d


@pytest.fixture
def work(inputs: Path, tmp_path: Path) -> Path:
    d = tmp_path / "w"
    shutil.copytree(inputs, d, symlinks=True)
    return d


# ----------------------------------------------------------------------------- outputs that cannot destroy

DESTROYING = {
    "analyze -o input": ["analyze", "a.pickle", "-o", "a.pickle"],
    "analyze --json input": ["analyze", "a.pickle", "--json", "a.pickle"],
    "analyze --markdown input": ["analyze", "a.pickle", "--markdown", "a.pickle"],
    "analyze --json ./input": ["analyze", "a.pickle", "--json", "./sub/../a.pickle"],
    "check --junit-xml input": ["check", "a.pickle", "--max-peak", "1GiB", "--junit-xml", "a.pickle"],
    "check --junit-xml baseline": [
        "check",
        "a.pickle",
        "--baseline",
        "b.pickle",
        "--max-increase",
        "5%",
        "--junit-xml",
        "b.pickle",
    ],
    "compare a b -o b": ["compare", "a.pickle", "b.pickle", "-o", "b.pickle"],
    "compare a b --markdown a": ["compare", "a.pickle", "b.pickle", "--markdown", "a.pickle"],
    "ranks glob --json a member": ["ranks", "*.pickle", "--json", "a.pickle"],
    "ranks DIR -o DIR/snapshot": ["ranks", "run", "-o", "run/snapshot.pickle"],
    "history a b --markdown b": ["history", "a.pickle", "b.pickle", "--markdown", "b.pickle"],
    "analyze RUN --json RUN/run.json": ["analyze", "run", "--json", "run/run.json"],
    "analyze RUN -o RUN/snapshot": ["analyze", "run", "-o", "run/snapshot.pickle"],
    "analyze RUN/snapshot --json RUN/run.json": ["analyze", "run/snapshot.pickle", "--json", "run/run.json"],
    "analyze input --json symlink-to-input": ["analyze", "a.pickle", "--json", "link.json"],
    "analyze input --json hardlink-to-input": ["analyze", "a.pickle", "--json", "hard.json"],
    # issue 26: a run.json path loads its whole folder; rules files and merged traces are inputs too
    "analyze RUN/run.json --json RUN/snapshot": ["analyze", "run/run.json", "--json", "run/snapshot.pickle"],
    "check RUN/run.json --junit-xml RUN/snapshot": [
        "check",
        "run/run.json",
        "--max-peak",
        "1GiB",
        "--junit-xml",
        "run/snapshot.pickle",
    ],
    "analyze RUN/run.json --markdown RUN/trace": ["analyze", "tr/run.json", "--markdown", "tr/trace.json.gz"],
    "analyze input --rules R --json R": ["analyze", "a.pickle", "--rules", "rules.json", "--json", "rules.json"],
    "analyze input --rules R --json link-to-R": [
        "analyze",
        "a.pickle",
        "--rules",
        "rules.json",
        "--json",
        "rules-link.json",
    ],
    "check RUN/run.json --baseline RUN2/run.json --junit-xml RUN2/trace": [
        "check",
        "run/run.json",
        "--baseline",
        "tr/run.json",
        "--max-increase",
        "5%",
        "--junit-xml",
        "tr/trace.json.gz",
    ],
    "analyze input --merge-into T --perfetto x --json T": [
        "analyze",
        "a.pickle",
        "--perfetto",
        "m.json",
        "--merge-into",
        "tr/trace.json.gz",
        "--json",
        "tr/trace.json.gz",
    ],
    "matrix --from-dir D --json D/variant/run.json": [
        "matrix",
        "--pipeline",
        "sd15",
        "--from-dir",
        "var",
        "--json",
        "var/fp16/run.json",
    ],
}


@pytest.mark.parametrize("case", list(DESTROYING))
def test_output_that_is_an_input_is_refused(work: Path, case: str) -> None:
    (work / "sub").mkdir()
    (work / "link.json").symlink_to("a.pickle")
    os.link(work / "a.pickle", work / "hard.json")
    (work / "rules-link.json").symlink_to("rules.json")
    before = tree_state(work)
    p = run_sv(*DESTROYING[case], cwd=work)
    assert p.returncode == 2, (case, p.returncode, p.stderr)
    line = one_error_line(p)
    assert "input" in line, line
    assert tree_state(work) == before, f"{case}: a file changed"


def _symlink_to_fifo(w: Path) -> None:
    os.mkfifo(w / "f")
    (w / "out").symlink_to("f")


def _symlink_to_device(w: Path) -> None:
    _null_device(w / "null")
    (w / "out").symlink_to("null")


SPECIAL: dict[str, Callable[[Path], None]] = {
    "fifo": lambda w: os.mkfifo(w / "out"),
    "directory": lambda w: (w / "out").mkdir(),
    "symlink to fifo": _symlink_to_fifo,
    "symlink to directory": lambda w: (w / "out").symlink_to("run"),
    "dangling symlink": lambda w: (w / "out").symlink_to("nowhere"),
    "symlink to a device": _symlink_to_device,
}


def _null_device(path: Path) -> None:
    """A character device like /dev/null (1, 3), made here: a regression in these tests must
    never replace the machine's own /dev/null (old snapviz did, as root)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")


@pytest.mark.parametrize("case", list(SPECIAL))
@pytest.mark.parametrize("flag", ["-o", "--json", "--markdown"])
def test_special_output_stays_special(work: Path, case: str, flag: str) -> None:
    SPECIAL[case](work)
    before = tree_state(work)
    p = run_sv("analyze", "a.pickle", flag, "out", cwd=work)
    assert p.returncode == 2, (case, p.stderr)
    one_error_line(p)
    assert tree_state(work) == before


def test_a_device_like_dev_null_stays_a_device(work: Path) -> None:
    _null_device(work / "null")
    st = os.stat(work / "null")
    for args in (
        ["analyze", "a.pickle", "--json", "null"],
        ["check", "a.pickle", "--max-peak", "1GiB", "--junit-xml", "null"],
    ):
        p = run_sv(*args, cwd=work)
        assert p.returncode == 2 and "character device" in one_error_line(p)
    after = os.stat(work / "null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == st.st_rdev and after.st_ino == st.st_ino


@pytest.mark.parametrize("verb", [["analyze", "a.pickle"], ["compare", "a.pickle", "b.pickle"]])
def test_stdout_at_most_once_and_no_duplicate_outputs(work: Path, verb: list[str]) -> None:
    for outs in (["--json", "-", "--markdown", "-"], ["--json", "x.out", "--markdown", "./x.out"]):
        p = run_sv(*verb, *outs, cwd=work)
        assert p.returncode == 2 and p.stdout == "", (outs, p.stdout[:200])
        one_error_line(p)
    assert not (work / "x.out").exists()


def test_unwritable_directory_fails_before_the_analysis(work: Path) -> None:
    p = run_sv("analyze", "a.pickle", "--json", "ok.json", "-o", "/proc/x.html", cwd=work)
    assert p.returncode == 2
    assert "/proc" in one_error_line(p)
    assert not (work / "ok.json").exists()


def test_existing_output_keeps_its_mode_and_symlinks_keep_pointing(work: Path) -> None:
    out, target = work / "report.md", work / "target.json"
    out.write_text("old")
    os.chmod(out, 0o640)
    target.write_text("old")
    os.chmod(target, 0o604)
    (work / "via.json").symlink_to("target.json")
    p = run_sv("analyze", "a.pickle", "--markdown", "report.md", "--json", "via.json", "-q", cwd=work)
    assert p.returncode == 0, p.stderr
    assert out.read_text().startswith("### GPU memory") and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert (work / "via.json").is_symlink() and json.loads(target.read_text())["schema"] == "snapviz.summary/1"
    assert stat.S_IMODE(target.stat().st_mode) == 0o604
    assert not [f for f in os.listdir(work) if f.startswith(".snapviz-")]


def _limit_file_size() -> None:
    # Files over 256 KiB cannot be written (EFBIG, as a full disk would fail): the JSON
    # (tens of KiB) fits, the HTML page (megabytes of inline Bokeh) does not.
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))


def test_outputs_are_committed_together(work: Path) -> None:
    (work / "old.json").write_text("previous report")
    before = tree_state(work)
    p = run_sv(
        "analyze",
        "a.pickle",
        "--json",
        "old.json",
        "--markdown",
        "new.md",
        "-o",
        "r.html",
        cwd=work,
        preexec_fn=_limit_file_size,
    )
    assert p.returncode == 2, p.stderr
    assert "r.html" in one_error_line(p)
    assert tree_state(work) == before, "an output was written although a later one failed"


# ----------------------------------------------------------------------------- escaping and bounds


def _payload_snapshot(long_name: str | None = None, frames_per_alloc: int = 3) -> dict[str, Any]:
    """Payloads in stage labels, annotations, frame names and file names, and allocator
    settings (a NaN included); ``long_name`` replaces the frame names (amplification)."""
    sim = synth.Sim()
    handles = []
    for st in ("load", PAYLOAD, "denoise/0", "vae_decode" + PAYLOAD):
        sim.set_label(st)
        sim.annotate(st, "START")
        for i in range(3):
            fr = [
                {"filename": PAYLOAD + ".py", "line": 10 + j, "name": long_name or (PAYLOAD + str(i))}
                for j in range(frames_per_alloc)
            ]
            handles.append(sim.alloc((i + 1) * 3 * MiB, frames=fr))
        sim.annotate(st, "END")
    snap = sim.snapshot()
    settings = snap.setdefault("allocator_settings", {})
    settings["PYTORCH_CUDA_ALLOC_CONF"] = PAYLOAD
    settings["garbage_collection_threshold"] = float("nan")
    return snap


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    for name in ("run", "run2"):
        (d / name).mkdir()
        (d / name / "snapshot.pickle").write_bytes(pickle.dumps(_payload_snapshot(), protocol=4))
        (d / name / "run.json").write_text(
            json.dumps(
                {
                    "schema": "snapviz.run/1",
                    "pipeline": PAYLOAD,
                    "size": PAYLOAD,
                    "dtype": PAYLOAD,
                    "height": 64,
                    "width": 64,
                    "techniques": [PAYLOAD, "fp16"],
                    "torch_version": PAYLOAD,
                    "device_name": PAYLOAD,
                    "command": PAYLOAD,
                }
            )
        )
    # a control character and an escape sequence in the input's own file name
    (d / "snap\x01\x1b[2J.pickle").write_bytes(pickle.dumps(_payload_snapshot(), protocol=4))
    return d


def assert_safe_markdown(md: str) -> None:
    """Rendered by a CommonMark parser with GFM tables and raw HTML on: no live HTML, links or
    images anywhere, every table row has its header's cell count, no terminal controls."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": True}).enable("table")
    html = parser.render(md)
    for tag in ("<img", "<a ", "<a>", "<svg", "<script"):
        assert tag not in html, (tag, html[html.find(tag) - 200 : html.find(tag) + 200])
    tokens = parser.parse(md)
    assert not [t for t in tokens if t.type == "html_block"]
    inline = [c for t in tokens if t.children for c in t.children]
    assert not [c.type for c in inline if c.type in ("image", "link_open")]
    assert {c.content for c in inline if c.type == "html_inline"} <= {"<sub>", "</sub>"}, "only snapviz's own <sub>"
    lines = md.splitlines()
    cells = None
    for ln in lines:
        if not ln.startswith("|"):
            cells = None
            continue
        n = len(re.split(r"(?<!\\)\|", ln))
        cells = cells or n
        assert n == cells, f"a table row splits differently from its header: {ln[:200]}"
    n_rows = sum(1 for ln in lines if ln.startswith("|") and not ln.startswith("|---"))
    assert html.count("<tr>") == n_rows, "a table lost or gained rows"
    assert not TERMINAL_CONTROL.search(md)


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_analyze_outputs_are_escaped(hostile: Path, tmp_path: Path) -> None:
    p = run_sv("analyze", str(hostile / "run"), "--markdown", "r.md", "--json", "r.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert_safe_markdown((tmp_path / "r.md").read_text())
    doc = strict_json((tmp_path / "r.json").read_text())
    assert doc["allocator_settings"]["garbage_collection_threshold"] is None
    assert any("garbage_collection_threshold" in w for w in doc["warnings"])
    assert not TERMINAL_CONTROL.search(p.stdout + p.stderr)
    assert sum(1 for ln in p.stdout.splitlines() if ln.startswith("  peak allocated")) == 1, "a name added a line"
    md = run_sv("analyze", str(hostile / "run"), "--markdown", "-", cwd=tmp_path)
    assert md.returncode == 0 and not TERMINAL_CONTROL.search(md.stdout)


def test_compare_outputs_are_escaped(hostile: Path, tmp_path: Path) -> None:
    p = run_sv(
        "compare",
        str(hostile / "run"),
        str(hostile / "run2"),
        "--label",
        PAYLOAD,
        "--markdown",
        "c.md",
        "--json",
        "c.json",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert_safe_markdown((tmp_path / "c.md").read_text())
    from snapviz.analyses.compare_document import load_compare

    doc = load_compare(strict_json((tmp_path / "c.json").read_text()), "c.json")  # the typed document
    assert doc.runs[0].label != PAYLOAD and not TERMINAL_CONTROL.search(doc.runs[0].label)
    assert not TERMINAL_CONTROL.search(p.stdout + p.stderr)


def test_check_junit_and_lines_are_clean(hostile: Path, tmp_path: Path) -> None:
    name = next(f for f in os.listdir(hostile) if f.startswith("snap"))
    p = run_sv("check", str(hostile / name), "--max-peak", "1MiB", "--junit-xml", "j.xml", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    root = ET.fromstring((tmp_path / "j.xml").read_bytes())
    assert root.find(".//failure") is not None
    assert not TERMINAL_CONTROL.search(p.stdout + p.stderr)


def test_error_line_quoting_file_names_stays_one_line(hostile: Path, tmp_path: Path) -> None:
    p = run_sv("check", str(hostile / "run"), "--max-stage-peak", "nosuch=1GiB", cwd=tmp_path)
    assert p.returncode == 2
    line = one_error_line(p)
    assert "nosuch" in line and not TERMINAL_CONTROL.search(p.stderr)


def test_output_size_follows_the_report_not_the_strings(tmp_path: Path) -> None:
    """One 64 KiB frame name shared by every frame: before, it was copied into every stack of
    every output (tens of MB); now each copy is clipped."""
    long_name = "N" * (64 << 10)
    (tmp_path / "big.pickle").write_bytes(pickle.dumps(_payload_snapshot(long_name, frames_per_alloc=40), protocol=4))
    p = run_sv("analyze", "big.pickle", "--json", "b.json", "--markdown", "b.md", "-o", "b.html", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    sizes = {f: (tmp_path / f).stat().st_size for f in ("b.json", "b.md", "b.html")}
    assert sizes["b.json"] < 400_000 and sizes["b.md"] < 60_000 and sizes["b.html"] < 4_000_000, sizes
    doc = strict_json((tmp_path / "b.json").read_text())
    assert re.search(r"… \(6\d,\d{3} chars\)", json.dumps(doc, ensure_ascii=False)), "a cut states the full length"


# ----------------------------------------------------------------------------- the helpers themselves


def test_safe_text_helpers() -> None:
    from snapviz.safe_text import bound, clip, md_code, printable, xml_text

    c = clip("x" * 1000)
    assert c.endswith("… (1,000 chars)") and clip(c) == c and len(c) < 330
    assert md_code("a `b` ``c``") == "``` a `b` ``c`` ```" and md_code("x|y") == "`x\\|y`"
    assert printable("a\nb\x1b[31m\x9b") == "a\\nb\\x1b[31m\\x9b"
    ET.fromstring(f"<a b='{xml_text(chr(1) + chr(0xFFFE))}'/>")
    deep: list[Any] = []
    node = deep
    for _ in range(100_000):  # deeper than Python's recursion limit
        node.append([])
        node = node[0]
    notes: list[str] = []
    out = bound({"x": deep, "n": float("inf"), "l": list(range(5000))}, notes)
    assert out["n"] is None and len(out["l"]) == 1000 and len(notes) == 2


@pytest.mark.parametrize("verb", [["ranks"], ["history", "--order-by", "pipeline"]])
def test_ranks_and_history_outputs_are_escaped(hostile: Path, tmp_path: Path, verb: list[str]) -> None:
    # the folder walk finds both run directories and the file with controls in its name
    p = run_sv(*verb, str(hostile), "-j", "1", "--markdown", "f.md", "--json", "f.json", "-o", "f.html", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert_safe_markdown((tmp_path / "f.md").read_text())
    doc = strict_json((tmp_path / "f.json").read_text())
    assert len(doc.get("ranks") or doc.get("runs")) == 3
    page = (tmp_path / "f.html").read_text()
    for raw in ("<img src=x", "<svg/onload", "<script>alert(1)"):
        assert raw not in page
    assert not TERMINAL_CONTROL.search(p.stdout + p.stderr + page)


# ----------------------------------------------------------------------------- every sink clean (issue 26)

# What a file can carry besides markup: terminal controls, C1, every bidi control (U+061C
# included) and a lone surrogate (legal in a pickle and as a JSON escape, unencodable as UTF-8).
CONTROLS = "\x1b]0;t\x07 \x08\r\x85\x9b \u061c \u202e \u2067 \ud800 end"
# Raw characters no output may contain (tab and newline excepted: they are the layout).
RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _controls_snapshot() -> dict[str, Any]:
    sim = synth.Sim()
    handles = []
    for st in ("load", "text" + CONTROLS, "denoise/0", "vae" + CONTROLS):
        sim.set_label(st)
        sim.annotate(st, "START")
        for i in range(3):
            fr = [{"filename": CONTROLS + ".py", "line": 10 + j, "name": CONTROLS + str(i)} for j in range(3)]
            handles.append(sim.alloc((i + 1) * 3 * MiB, frames=fr))
        sim.annotate(st, "END")
    return sim.snapshot()


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("controls")
    data = pickle.dumps(_controls_snapshot(), protocol=4)
    (d / "c.pickle").write_bytes(data)
    os.mkdir(os.path.join(os.fsencode(d), b"dir\xff"))  # a file name that is not UTF-8
    with open(os.path.join(os.fsencode(d), b"dir\xff", b"snap\xfe.pickle"), "wb") as f:
        f.write(data)
    return d


def _assert_clean_text(name: str, data: bytes) -> str:
    text = data.decode("utf-8")  # strict: a lone surrogate cannot have been written raw
    m = RAW_CONTROL.search(text)
    assert m is None, (name, repr(text[max(0, m.start() - 80) : m.end() + 80]))
    return text


def test_every_sink_is_clean(controls: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = run_sv(
        "analyze",
        str(controls / "c.pickle"),
        "--json",
        "r.json",
        "--markdown",
        "r.md",
        "-o",
        "r.html",
        "--svg",
        "r.svg",
        "--png",
        "r.png",
        "--perfetto",
        "r.perfetto.json",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    _assert_clean_text("stdout+stderr", (p.stdout + p.stderr).encode("utf-8", "surrogatepass"))
    for name in ("r.json", "r.md", "r.html", "r.svg", "r.perfetto.json"):
        _assert_clean_text(name, (tmp_path / name).read_bytes())
    ET.fromstring((tmp_path / "r.svg").read_bytes())  # well-formed XML
    strict_json((tmp_path / "r.json").read_text())
    json.loads((tmp_path / "r.perfetto.json").read_text())
    assert "\\u061c" in (tmp_path / "r.md").read_text() and "\\ud800" in (tmp_path / "r.json").read_text()
    from PIL import Image  # the PNG's text chunks

    with Image.open(tmp_path / "r.png") as im:
        for k, v in im.info.items():
            if isinstance(v, str):
                assert not RAW_CONTROL.search(k + v), (k, v)
    c = run_sv("check", str(controls / "c.pickle"), "--max-peak", "1MiB", "--junit-xml", "j.xml", cwd=tmp_path)
    assert c.returncode == 1, c.stderr
    _assert_clean_text("check", (c.stdout + c.stderr).encode("utf-8", "surrogatepass"))
    ET.fromstring(_assert_clean_text("j.xml", (tmp_path / "j.xml").read_bytes()))


def test_a_file_name_that_is_not_utf8_is_read(controls: Path, tmp_path: Path) -> None:
    path = os.path.join(os.fsencode(controls), b"dir\xff", b"snap\xfe.pickle")
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", path, "--json", "o.json", "--markdown", "-"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    _assert_clean_text("stdout+stderr", p.stdout + p.stderr)
    strict_json(_assert_clean_text("o.json", (tmp_path / "o.json").read_bytes()))


def test_notebook_page_is_clean(controls: Path) -> None:
    import snapviz
    from snapviz.notebook import report

    r = report(snapviz.analyze(str(controls / "c.pickle")))
    _assert_clean_text("notebook", r._repr_html_().encode("utf-8"))
    _assert_clean_text("notebook md", r._repr_markdown_().encode("utf-8"))
