"""A bounded-time fuzz target per input kind (issue 26): snapshot, trace, run folder, rules
file and command-line arguments. Each runs a few seconds of hypothesis examples in the normal
suite; the only acceptable outcomes are a result or one :class:`InputError` (exit 2 and one
line for the CLI), within a per-example deadline. ``benchmarks/fuzz_loader.py`` fuzzes the
loader for longer."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapviz.errors import InputError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /proc are POSIX")

# A few seconds each: examples are small, the deadline catches one that hangs or explodes.
FUZZ = settings(max_examples=25, deadline=5000, suppress_health_check=list(HealthCheck), derandomize=False)
CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)

_NAMES = st.text(
    st.sampled_from(["a", "_", "/", "\x1b", "\u202e", "\u061c", "\ud800", "<", "|", "\n", "é"]), max_size=12
)


def _entry(draw: Any) -> dict[str, Any]:
    return {
        "action": draw(st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc", "oom", "x", 3])),
        "addr": draw(st.one_of(st.integers(-5, 1 << 64), st.floats(allow_nan=True), st.none(), _NAMES)),
        "size": draw(st.one_of(st.integers(-5, 1 << 64), st.floats(allow_nan=True), st.text(max_size=3))),
        "frames": draw(
            st.lists(
                st.fixed_dictionaries({"name": _NAMES, "filename": _NAMES, "line": st.integers(-1, 99)}), max_size=3
            )
        ),
    }


@st.composite
def snapshots(draw: Any) -> bytes:
    """A snapshot-like pickle (any protocol, maybe gzip), maybe damaged."""
    traces = draw(
        st.lists(
            st.lists(st.builds(lambda: None).flatmap(lambda _: st.composite(lambda d: _entry(d))()), max_size=6),
            max_size=3,
        )
    )
    doc: Any = {"segments": [], "device_traces": traces}
    if draw(st.booleans()):
        doc["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": draw(_NAMES), "x": draw(st.floats())}
    if draw(st.booleans()):
        shared = traces[0] if traces else []
        doc["device_traces"] = [shared] * draw(st.integers(1, 8))  # shared references
    data = pickle.dumps(doc, protocol=draw(st.integers(0, 5)))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(max_size=4)) + data[i + draw(st.integers(0, 4)) :]
    return gzip.compress(data) if draw(st.booleans()) else data


@st.composite
def traces(draw: Any) -> bytes:
    events = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "ph": st.sampled_from(["X", "B", "E", "i", "C", "M", "f", 1]),
                    "name": _NAMES,
                    "cat": st.sampled_from(["cpu_op", "kernel", "gpu_user_annotation", "", "[memory]"]),
                    "ts": st.one_of(st.integers(-10, 10**12), st.floats(allow_nan=False), st.text(max_size=2)),
                    "dur": st.one_of(st.integers(-10, 10**6), st.none()),
                    "pid": st.integers(0, 3),
                    "tid": st.integers(0, 3),
                    "args": st.dictionaries(
                        st.sampled_from(["Bytes", "Total Allocated", "Device Id", "Addr", "x"]),
                        st.one_of(st.integers(-(1 << 63), 1 << 64), _NAMES, st.none()),
                        max_size=3,
                    ),
                }
            ),
            max_size=10,
        )
    )
    text = json.dumps({"traceEvents": events, "schemaVersion": 1})
    if draw(st.booleans()):
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(st.sampled_from('{}[]",:\\ 0a'), max_size=4)) + text[i:]
    data = text.encode("utf-8", "surrogatepass")
    return gzip.compress(data) if draw(st.booleans()) else data


def _loaded_or_input_error(path: Path) -> None:
    from snapviz.load import load

    try:
        load(path)
    except InputError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(data=snapshots())
def test_fuzz_snapshot(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fz") / "s.pickle"
    path.write_bytes(data)
    _loaded_or_input_error(path)


@FUZZ
@given(data=traces())
def test_fuzz_trace(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fz") / "t.json"
    path.write_bytes(data)
    _loaded_or_input_error(path)


_MEMBER = st.sampled_from(["valid", "garbage", "empty", "fifo", "dev_null", "proc", "dir", "missing_link", "none"])


@FUZZ
@given(
    run_json=st.one_of(
        st.just({"schema": "snapviz.run/1"}),
        st.dictionaries(_NAMES, _NAMES, max_size=3),
        st.lists(st.integers(), max_size=2),
    ),
    snap=_MEMBER,
    trace=_MEMBER,
    rj=_MEMBER,
    by_run_json=st.booleans(),
)
def test_fuzz_run_folder(
    tmp_path_factory: pytest.TempPathFactory, run_json: Any, snap: str, trace: str, rj: str, by_run_json: bool
) -> None:
    d = tmp_path_factory.mktemp("fz")
    valid = {
        "snapshot.pickle": pickle.dumps({"segments": [], "device_traces": [[]]}),
        "trace.json": json.dumps({"traceEvents": []}).encode(),
        "run.json": json.dumps(run_json, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    }
    for name, kind in (("snapshot.pickle", snap), ("trace.json", trace), ("run.json", rj)):
        p = d / name
        if kind == "valid" or (name == "run.json" and kind == "none"):
            p.write_bytes(valid[name])
        elif kind == "garbage":
            p.write_bytes(b"\x80\x05garbage\x00")
        elif kind == "empty":
            p.write_bytes(b"")
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "dev_null":
            p.symlink_to("/dev/null")
        elif kind == "proc":
            p.symlink_to("/proc/self/mem")
        elif kind == "dir":
            p.mkdir()
        elif kind == "missing_link":
            p.symlink_to(d / "nowhere")
    t0 = time.monotonic()
    _loaded_or_input_error(d / "run.json" if by_run_json else d)
    assert time.monotonic() - t0 < 5


_REGEX_PARTS = ["a", "a+", "a*", "(", ")", "|", "?", ".", r"\w", "{2,}", "$", "^", "[ab]", "(?:", r"\1", "+", "*"]


@FUZZ
@given(
    patterns=st.lists(st.lists(st.sampled_from(_REGEX_PARTS), max_size=8).map("".join), min_size=1, max_size=3),
    extra=st.sampled_from([None, "builtin"]),
)
def test_fuzz_rules_file(tmp_path_factory: pytest.TempPathFactory, patterns: list[str], extra: str | None) -> None:
    """Any rules file loads or is refused in one line; a loaded one matches adversarial names
    (``aaaa…!``, the worst case of backtracking) quickly."""
    from snapviz.analyses.frame_rules import load_rules

    d = tmp_path_factory.mktemp("fz")
    doc: dict[str, Any] = {"rules": [{"name": f"s{i}", "function": p} for i, p in enumerate(patterns)]}
    if extra:
        doc["extends"] = extra
    (d / "r.json").write_text(json.dumps(doc))
    try:
        rules = load_rules(d / "r.json")
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    names = ["a" * k + "!" for k in (10, 35, 300)]
    t0 = time.monotonic()
    for r in rules.rules:
        if r.function_re is not None:
            for n in names:
                r.function_re.search(n)
    assert time.monotonic() - t0 < 1.0, [r.function for r in rules.rules]


_ARGS = st.lists(
    st.sampled_from(
        [
            "--max-peak",
            "--max-reserved",
            "--max-points",
            "--device",
            "--max-increase",
            "--json",
            "--markdown",
            "--baseline",
            "-q",
            "1e99999999GiB",
            "99999999999999999999",
            "-1",
            "0",
            "12GiB",
            "5%",
            "1e-9999MiB",
            "NaN",
            "-",
            "x.json",
            "s.pickle",
            "\x1b[31m",
            "\ud800",
            "--stages-from",
            "frames",
            "--max-stage-peak",
            "a=1GiB",
        ]
    ),
    max_size=7,
)


@settings(FUZZ, deadline=None)  # the first example pays the imports (pandas, the analyses)
@given(verb=st.sampled_from(["analyze", "check", "compare"]), args=_ARGS)
def test_fuzz_cli_arguments(tmp_path_factory: pytest.TempPathFactory, verb: str, args: list[str]) -> None:
    """Any argument list: exit 0, 1 or 2; with 2, exactly one clean line on stderr; no traceback."""
    from click.testing import CliRunner

    from snapviz.cli import cli

    d = tmp_path_factory.mktemp("fz")
    (d / "s.pickle").write_bytes(
        pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 512, "size": 512, "frames": []}]]})
    )
    cwd = os.getcwd()
    os.chdir(d)
    try:
        result = CliRunner().invoke(cli, [verb, "s.pickle", *args], catch_exceptions=True)
    finally:
        os.chdir(cwd)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    err = result.stderr
    assert "Traceback" not in err and not CONTROL.search(err), (args, err)
    if result.exit_code == 2:
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, (args, err)
