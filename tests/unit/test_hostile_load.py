"""Hostile inputs stop with exit 2 and one line, in bounded time and memory (issue 9 item 2,
issue 8 item 1). Every case runs ``snapviz analyze`` in a fresh process and measures it:
no case may run 30 s or reach 4 GiB RSS. The generators live in tests/support/hostile.py."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostile
from snapviz.errors import InputError
from snapviz.load import _sniff, load
from snapviz.load.limits import ENV, LimitExceeded, Limits
from snapviz.load.snapshot.pickle_scan import FULL_SCAN_BYTES, fast_scan, scan_pickle

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, rlimits and wait4 are POSIX")

LIMIT_WORDS = (
    "nesting depth",
    "shared references",
    "length of one string",
    "decompressed size",
    "CPU time spent decompressing",
    "number of objects",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[hostile.Result, str, Path]]:
    out = {}
    for kind, build in hostile.BUILDERS.items():
        d = tmp_path_factory.mktemp(kind)
        for name, (path, word) in build(d).items():
            before = hostile.digest(path)
            res = hostile.run_analyze(path)
            assert hostile.digest(path) == before, f"{kind}:{name}: the command changed its input"
            out[f"{kind}:{name}"] = (res, word, path)
    return out


CASES = (
    [
        f"pickle:{n}"
        for n in (
            "deep_tuple_dict_key_gz",
            "deep_tuple_frozenset_gz",
            "flat_frozenset",
            "tuple_dict_key",
            "deep_tuple_action_gz",
            "billion_laughs_frame_name",
            "billion_laughs_settings",
            "billion_laughs_padded_2MiB",
            "memo_index_2_31",
            "binunicode8_length_2_62",
            "string_32MiB_plain",
            "size_2_63_minus_1",
            "size_negative",
            "addr_2_62",
            "valid_control",
            "gzip_bomb_512MiB",
            "gzip_string_300MiB",
            "name_16MiB_in_2000_frames_xz",
            "shared_trace_8_devices",
            "same_entry_repeated",
            "shared_segment_blocks",
            "same_annotation_repeated",
            "shared_trace_8_devices_25MiB_xz",
            "empty_dicts_63M_xz",
            "empty_lists_60M_xz",
            "stage_names_50k",
            "stage_steps_50k",
            "stage_annotations_50k",
            "distinct_frames_1M",
            "distinct_frames_1500k_xz",
        )
    ]
    + [
        f"trace:{n}"
        for n in (
            "deep_array_gz",
            "nested_traceEvents_keys_gz",
            "many_traceEvents_keys_gz",
            "metadata_26KB_first",
            "leading_whitespace",
            "long_string_200MiB_gz",
            "gzip_bomb_whitespace",
            "range_names_50k",
        )
    ]
    + [
        f"special:{n}"
        for n in (
            "fifo_pickle",
            "fifo_trace",
            "dev_zero",
            "run_json_fifo",
            "run_snapshot_proc_mem",
            "run_trace_proc_mem",
            "gzip_zero_padding_100MiB",
        )
    ]
)


@pytest.mark.parametrize("name", CASES)
def test_hostile_input_is_bounded(results: dict[str, Any], name: str) -> None:
    res, word, path = results[name]
    assert not res.timed_out and res.wall_s < hostile.TIME_BOUND, (name, res.wall_s)
    assert res.maxrss < hostile.RSS_BOUND, (name, res.maxrss)
    assert "Traceback" not in res.stderr, (name, res.stderr[-2000:])
    if not word:  # valid input, odd but legal
        assert res.rc == 0, (name, res.rc, res.stderr)
        return
    assert res.rc == 2, (name, res.rc, res.stderr[-500:])
    assert len(res.lines) == 1, (name, res.stderr)
    line = res.lines[0]
    assert line.startswith("snapviz: error: ") and str(path) in line, (name, line)
    assert word in line, (name, line)
    if word in LIMIT_WORDS:  # names the limit and how to raise it
        assert "SNAPVIZ_MAX_INPUT_" in line, line


def test_every_case_is_tested(results: dict[str, Any]) -> None:
    assert sorted(results) == sorted(CASES)


# ----------------------------------------------------------------------------- limits


def test_limit_names_its_variable_and_raising_it_loads(
    write_pickle: Any, small_snapshot: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_pickle(small_snapshot, name="snapshot.pickle")
    monkeypatch.setenv(ENV["depth"], "4")
    with pytest.raises(InputError, match=ENV["depth"]) as info:
        load(str(path))
    assert "nesting depth is over 4" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv(ENV["depth"], "50")
    snap = load(str(path)).snapshot
    assert snap is not None and len(snap.events) > 0


def test_bad_limit_value_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV["objects"], "lots")
    with pytest.raises(InputError, match="SNAPVIZ_MAX_INPUT_OBJECTS='lots'"):
        Limits.from_env()
    monkeypatch.setenv(ENV["objects"], "2G")
    assert Limits.from_env().objects == 2 * 10**9


@pytest.mark.parametrize(
    "name, data",
    [
        ("objects", b"\x80\x02(" + b"K\x01" * 50 + b"l."),
        ("string_bytes", b"\x80\x02(" + b"\x8c\x0a" + b"a" * 10 + b"\x8c\x0a" + b"b" * 10 + b"l."),
        ("expansion", pickle.dumps(hostile.billion_laughs(4, 3), protocol=2)),
        ("depth", b"\x80\x02" + b"]" * 20 + b"a" * 19 + b"."),
    ],
)
def test_each_pickle_limit_is_enforced(name: str, data: bytes) -> None:
    tight = Limits(objects=40, string_bytes=15, expansion=100, depth=10)
    with pytest.raises(LimitExceeded) as info:
        scan_pickle(data, "f.pickle", tight)
    assert info.value.limit_name == name
    scan_pickle(data, "f.pickle", Limits())  # fine under the defaults


def test_real_pickles_fit_the_defaults_with_margin() -> None:
    """Counts of the largest real files (docs/security.md quotes them): each at least 10x under."""
    import glob

    found = glob.glob(str(hostile.ROOT / "sample_snapshots" / "*" / "snapshot.pickle.xz"))
    found += glob.glob(str(hostile.ROOT.parent / "shared" / "external" / "*.pickle"))
    if not found:
        pytest.skip("no real snapshots here")
    from snapviz.load.decompress import open_decompressed, read_all

    lim = Limits()
    for f in sorted(found, key=lambda p: Path(p).stat().st_size)[-3:]:
        with open_decompressed(f) as fh:
            data = read_all(fh)
        counts = scan_pickle(data, f, lim, exact=True)
        assert counts is not None
        assert counts["depth"] * 10 <= lim.depth and counts["objects"] * 10 <= lim.objects
        assert counts["expansion"] * 10 <= lim.expansion and counts["string_bytes"] * 10 <= lim.string_bytes
        if len(data) > FULL_SCAN_BYTES:
            assert fast_scan(data, f, lim), f"{f}: real snapshots take the fast path"


# ----------------------------------------------------------------------------- the scan itself

_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=5), inner, max_size=5)
        | st.tuples(st.integers(), st.text(max_size=3))
    ),
    max_leaves=40,
)


def _depth(obj: Any) -> int:
    """Container nesting the reference way (recursion is fine: hypothesis data is shallow)."""
    if isinstance(obj, dict):
        return 1 + max(map(_depth, obj.values()), default=0)
    if isinstance(obj, (list, tuple)):
        return 1 + max(map(_depth, obj), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(obj=_plain, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_scan_accepts_plain_data_and_counts_depth(obj: Any, protocol: int) -> None:
    data = pickle.dumps(obj, protocol=protocol)
    counts = scan_pickle(data, "p", Limits(), exact=True)
    assert counts is not None and counts["depth"] == _depth(obj)
    if protocol >= 4:
        assert fast_scan(data + b"", "p", Limits()) in (True, False)  # never raises on plain data


@settings(max_examples=200, deadline=None)
@given(obj=_plain, cut=st.integers(0, 400), flip=st.integers(0, 255))
def test_scan_never_crashes_on_damaged_pickles(obj: Any, cut: int, flip: int) -> None:
    data = bytearray(pickle.dumps(obj, protocol=4))
    if data:
        data[cut % len(data)] ^= flip
    try:
        scan_pickle(bytes(data), "p", Limits(), exact=True)
    except InputError as exc:
        assert "\n" not in str(exc)


# ----------------------------------------------------------------------------- detection


def test_large_metadata_before_traceEvents_is_a_trace(tmp_path: Path) -> None:
    meta = {f"k{i}": "v" * 200 for i in range(5000)}  # ~1 MB before traceEvents
    path = tmp_path / "t.json"
    body = ", ".join(f'"{k}": "{v}"' for k, v in meta.items())
    path.write_text("\n\n  {" + body + ', "traceEvents": [' + hostile.memory_events() + '], "after": 7}')
    assert _sniff(str(path)) == "trace"
    tr = load(str(path)).trace
    assert tr is not None
    assert tr.meta["after"] == 7 and tr.meta["k4999"] == "v" * 200 and len(tr.memory) == 2


def test_real_tracelens_trace_is_detected() -> None:
    path = hostile.ROOT.parent / "shared" / "external" / "tracelens_h100_qwen05b.json.gz"
    if not path.exists():
        pytest.skip("external corpus absent")
    assert _sniff(str(path)) == "trace"
    tr = load(str(path)).trace
    assert tr is not None and len(tr.memory) > 0


@pytest.mark.parametrize(
    "env, value, limit_name",
    [
        ("string_length", "100", "string_length"),  # shorter than a read: the exact per-quote path
        ("depth", "3", "depth"),
        ("objects", "5", "objects"),
        ("header_bytes", "1000", "header_bytes"),
    ],
)
def test_each_json_limit_is_enforced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, value: str, limit_name: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        '{"meta": "'
        + "m" * 2000
        + '", "traceEvents": ['
        + hostile.memory_events()
        + ', {"name": "'
        + "x" * 200
        + '", "args": {"a": [[1]]}}]}'
    )
    tr = load(str(path)).trace
    assert tr is not None and len(tr.memory) == 2  # fine under the defaults
    monkeypatch.setenv(ENV[env], value)
    with pytest.raises(LimitExceeded) as info:
        load(str(path))
    assert info.value.limit_name == limit_name and ENV[env] in str(info.value)


# ----------------------------------------------------------------------------- the opener (issue 26)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=3000), min_size=1, max_size=5),
    pads=st.lists(st.integers(0, 70_000), min_size=5, max_size=5),
)
def test_gzip_members_and_zero_padding_read_as_gzip_does(
    tmp_path_factory: pytest.TempPathFactory, parts: list[bytes], pads: list[int]
) -> None:
    """Members one after another, each followed by any amount of zero padding, decompress to
    what ``gzip.decompress`` gives (which skips the padding one byte per Python call)."""
    import gzip

    from snapviz.load.decompress import open_decompressed, read_all

    blob = b"".join(gzip.compress(p) + b"\0" * pad for p, pad in zip(parts, pads))
    path = tmp_path_factory.mktemp("gz") / "x.gz"
    path.write_bytes(blob)
    with open_decompressed(str(path)) as f:
        assert read_all(f) == gzip.decompress(blob) == b"".join(parts)
    path.write_bytes(blob[: len(gzip.compress(parts[0])) - 3])  # cut inside the first member's trailer
    with pytest.raises(InputError, match="truncated|corrupt"):
        with open_decompressed(str(path)) as f:
            read_all(f)


def test_decompression_time_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    path = tmp_path / "s.pickle.gz"
    path.write_bytes(gzip.compress(b" " * (32 << 20) + pickle.dumps({"segments": [], "device_traces": [[]]})))
    monkeypatch.setenv("SNAPVIZ_MAX_INPUT_SECONDS", "0")  # any CPU time spent decompressing is too much
    with pytest.raises(LimitExceeded, match="SNAPVIZ_MAX_INPUT_SECONDS"):
        load(path)


@pytest.mark.parametrize(
    "target", ["/proc/self/mem", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled", "/dev/null"]
)
@pytest.mark.parametrize("member", ["snapshot.pickle", "trace.json.gz", "run.json"])
def test_run_folder_links_to_kernel_files_are_refused(tmp_path: Path, target: str, member: str) -> None:
    if not os.path.exists(target):
        pytest.skip(f"{target} missing here")
    rd = tmp_path / "rd"
    rd.mkdir()
    (rd / "run.json").write_text('{"schema": "snapviz.run/1"}')
    if member == "run.json":
        (rd / "run.json").unlink()
        (rd / "snapshot.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    os.symlink(target, rd / member)
    for path in (rd, rd / "run.json"):
        with pytest.raises(InputError) as info:
            load(path)
        assert "\n" not in str(info.value) and member in str(info.value)


# ----------------------------------------------------------------------------- arguments and limits (issue 26)


@pytest.mark.parametrize(
    "text,ok",
    [
        ("1e99999999GiB", False),
        ("1e-99999999GiB", True),
        ("0e99999999", True),
        ("9" * 5000 + "GiB", False),
        ("1.5e3MiB", True),
    ],
)
def test_sizes_with_any_exponent_parse_in_constant_time(text: str, ok: bool) -> None:
    import time

    from snapviz.units import parse_size

    t0 = time.perf_counter()
    if ok:
        assert parse_size(text) >= 0
    else:
        with pytest.raises(InputError, match="implausibly large"):
            parse_size(text)
    assert time.perf_counter() - t0 < 0.1


def test_an_environment_limit_with_thousands_of_digits_is_one_error() -> None:
    with pytest.raises(InputError, match="not a number"):
        Limits.from_env({ENV["depth"]: "9" * 5000})


@pytest.mark.parametrize("path_kind", ["exact", "grammar", "compiled"])
def test_the_string_limit_holds_for_short_strings_on_every_path(path_kind: str) -> None:
    """SNAPVIZ_MAX_INPUT_STRING=100 refuses a 200-byte label on the exact scan (small pickles),
    the regex grammar check and the compiled one (big pickles: short strings inline)."""
    from snapviz.load.snapshot import pickle_scan
    from snapviz.load.snapshot.pickle_scan_fast import KERNEL, fast_scan, fast_scan_compiled

    n = 10 if path_kind == "exact" else 9000
    trace = [
        {
            "action": "alloc",
            "addr": 512 * i,
            "size": 512,
            "frames": [{"name": "x" * 200 + str(i), "filename": "a.py", "line": 1}],
        }
        for i in range(n)
    ]
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    limits = Limits(string_length=100)
    if path_kind == "compiled":
        if KERNEL.compiled() is None:
            pytest.skip("numba not installed")
        assert fast_scan_compiled(data, "p", limits) is False  # steps aside: the exact scan decides
    elif path_kind == "grammar":
        assert len(data) > pickle_scan.FULL_SCAN_BYTES
        assert fast_scan(data, "p", limits) is False
    with pytest.raises(LimitExceeded, match="SNAPVIZ_MAX_INPUT_STRING"):
        scan_pickle(data, "p", limits)
    scan_pickle(data, "p", Limits())  # within the default: accepted


def test_huge_counts_are_one_usage_line_without_numpy_warnings(tmp_path: Path) -> None:
    import os
    import subprocess

    from paths import ROOT

    (tmp_path / "s.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    for args in (
        ["compare", "s.pickle", "s.pickle", "--max-points", "9" * 20],
        ["analyze", "s.pickle", "--device", "9" * 20],
        ["check", "s.pickle", "--max-peak", "1e99999999GiB"],
    ):
        p = subprocess.run(
            [sys.executable, "-m", "snapviz", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
        assert "Warning" not in p.stderr and "Traceback" not in p.stderr, p.stderr
