"""Hostile and broken inputs: the loader never runs code, never crashes, always says why.

Every failure must be :class:`snapviz.errors.InputError` (the CLI maps it to exit 2)
with a single-line message that names the file.
"""

from __future__ import annotations

import builtins
import bz2
import gzip
import lzma
import os
import pickle
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from snapviz.errors import InputError
from snapviz.load import load, load_snapshot
from snapviz.load.decompress import open_decompressed, read_all
from snapviz.load.snapshot.safe_pickle import safe_load_pickle

LOADERS: dict[str, Callable[[str], Any]] = {
    "safe_load_pickle": safe_load_pickle,
    "load_snapshot": load_snapshot,
    "load": load,
}
COMPRESS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}
VALID = {
    "segments": [],
    "device_traces": [
        [{"action": "alloc", "addr": 139810526199808, "size": 1280, "stream": 0, "time_us": 1796003473007644}]
    ],
}


def assert_input_error(path: Path, loaders: tuple[str, ...] = ("safe_load_pickle", "load")) -> list[str]:
    msgs = []
    for name in loaders:
        with pytest.raises(InputError) as ei:
            LOADERS[name](str(path))
        msg = str(ei.value)
        assert "\n" not in msg and msg.strip() == msg, f"{name}: not one line: {msg!r}"
        assert str(path) in msg, f"{name}: message does not name the file: {msg!r}"
        assert "Traceback" not in msg
        msgs.append(msg)
    return msgs


# ---------------------------------------------------------------- code execution


class _OsSystem:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _Exec:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


class _Subprocess:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (subprocess.call, (["touch", str(self.marker)],))


class _Harmless:
    """Even an innocent class is a global: snapshots never contain one."""


PAYLOADS = [_OsSystem, _Eval, _Exec, _Subprocess]


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("where", ["top", "inside_snapshot"])
def test_reduce_payload_never_runs(tmp_path: Path, marker_path: Path, protocol: int, payload: type, where: str) -> None:
    evil = payload(marker_path)
    obj: Any = (
        evil
        if where == "top"
        else {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "frames": evil}]]}
    )
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    msgs = assert_input_error(path, ("safe_load_pickle", "load_snapshot", "load"))
    assert not marker_path.exists(), "the payload ran"
    assert any("refusing" in m for m in msgs)


def test_payload_is_real(tmp_path: Path, marker_path: Path) -> None:
    """Guard for the guard: the same bytes *do* run under ``pickle.loads``."""
    data = pickle.dumps(_Exec(marker_path))
    pickle.loads(data)  # noqa: S301 - the point of the test
    assert marker_path.exists()


@pytest.mark.parametrize(
    "raw",
    [
        b"cos\nsystem\n(S'touch {m}'\ntR.",  # protocol 0 GLOBAL + REDUCE
        b"(S'touch {m}'\nios\nsystem\n.",  # INST
        b"\x80\x02cbuiltins\neval\nX\x10\x00\x00\x00__import__('os')\x85R.",
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x08touch {m}\x85R.",
        b"\x80\x02\x82\x01.",  # EXT1: the copyreg extension registry
        b"\x80\x02X\x01\x00\x00\x00aQ.",  # BINPERSID
    ],
)
def test_handwritten_opcodes_refused(tmp_path: Path, marker_path: Path, raw: bytes) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(raw.replace(b"{m}", str(marker_path).encode()))
    assert_input_error(path)
    assert not marker_path.exists()


def test_harmless_class_refused(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Harmless()], "device_traces": []}))
    (msg, *_) = assert_input_error(path)
    assert "_Harmless" in msg


# ---------------------------------------------------------------- valid inputs, odd wrappers


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_all_protocols_load(write_pickle: Callable[..., Path], small_snapshot: dict[str, Any], protocol: int) -> None:
    path = write_pickle(small_snapshot, name=f"p{protocol}.pickle", protocol=protocol)
    data = safe_load_pickle(str(path))
    assert data == small_snapshot
    run = load(str(path))
    assert run.snapshot is not None
    assert len(run.snapshot.events) == sum(len(t) for t in small_snapshot["device_traces"])


def test_protocol5_out_of_band_buffer_refused(tmp_path: Path) -> None:
    path = tmp_path / "oob.pickle"
    path.write_bytes(pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=lambda b: False))
    assert_input_error(path)


@pytest.mark.parametrize(
    "compress, name",
    [
        ("gzip", "snapshot.pickle"),
        ("gzip", "snapshot.json"),
        ("xz", "snapshot.pickle.gz"),
        ("xz", "snapshot.txt"),
        ("bz2", "snapshot.pickle.xz"),
        ("gzip", "snapshot"),
    ],
)
def test_compression_detected_by_magic_not_extension(
    write_pickle: Callable[..., Path], small_snapshot: dict[str, Any], compress: str, name: str
) -> None:
    path = write_pickle(small_snapshot, name=name, compress=compress)
    assert safe_load_pickle(str(path)) == small_snapshot
    snap = load(str(path)).snapshot
    assert snap is not None and len(snap.events) > 0


def test_plain_pickle_named_gz(write_pickle: Callable[..., Path], small_snapshot: dict[str, Any]) -> None:
    path = write_pickle(small_snapshot, name="snapshot.pickle.gz")
    assert safe_load_pickle(str(path)) == small_snapshot


def test_zstd_needs_zstandard(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(64))
    try:
        import zstandard  # noqa: F401
    except ImportError:
        (msg, *_) = assert_input_error(path)
        assert "zstandard" in msg
    else:  # random frame body: still one clean line
        assert_input_error(path)


# ---------------------------------------------------------------- broken files


def test_truncated_pickle(tmp_path: Path, small_snapshot: dict[str, Any]) -> None:
    raw = pickle.dumps(small_snapshot, protocol=4)
    for cut in (1, 2, 11, len(raw) // 3, len(raw) - 1):
        path = tmp_path / f"cut{cut}.pickle"
        path.write_bytes(raw[:cut])
        msgs = assert_input_error(path, ("safe_load_pickle", "load"))
        assert any("truncated" in m or "not a readable" in m for m in msgs)


@pytest.mark.parametrize("compress", ["gzip", "xz", "bz2"])
def test_truncated_compressed(tmp_path: Path, small_snapshot: dict[str, Any], compress: str) -> None:
    raw = pickle.dumps(small_snapshot, protocol=4)
    packed = COMPRESS[compress](raw)
    for cut in (len(packed) // 2, len(packed) - 4):
        path = tmp_path / f"cut{cut}.bin"
        path.write_bytes(packed[:cut])
        assert_input_error(path)


@pytest.mark.parametrize("compress", ["gzip", "xz", "bz2"])
def test_corrupt_compressed_body(tmp_path: Path, small_snapshot: dict[str, Any], compress: str) -> None:
    raw = pickle.dumps(small_snapshot, protocol=4)
    packed = bytearray(COMPRESS[compress](raw))
    rng = random.Random(7)
    for k in range(20):
        bad = bytearray(packed)
        i = rng.randrange(12, len(bad))
        bad[i] ^= rng.randrange(1, 256)
        path = tmp_path / f"bad{k}.pickle"
        path.write_bytes(bytes(bad))
        for loader in (safe_load_pickle, load):
            try:
                loader(str(path))  # a flip the checksum misses may still load; that is fine
            except InputError as exc:
                assert "\n" not in str(exc) and str(path) in str(exc)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pickle"
    path.write_bytes(b"")
    (msg, *_) = assert_input_error(path, ("safe_load_pickle",))
    assert "empty" in msg
    assert_input_error(path, ("load",))


def test_empty_gzip(tmp_path: Path) -> None:
    path = tmp_path / "empty.pickle.gz"
    path.write_bytes(gzip.compress(b""))
    assert_input_error(path)


@pytest.mark.parametrize("seed", range(40))
def test_random_bytes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "random.pickle"
    head = rng.choice([b"", b"\x80\x04", b"\x80\x05\x95", b"\x80\x02", b"\x1f\x8b", b"\xfd7zXZ\x00", b"BZh"])
    path.write_bytes(head + bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))))
    assert_input_error(path)


@pytest.mark.parametrize("seed", range(40))
def test_bit_flipped_snapshot(tmp_path: Path, small_snapshot: dict[str, Any], seed: int) -> None:
    """Flipped bytes inside a real snapshot: it loads, or fails with one clean line."""
    rng = random.Random(seed)
    raw = bytearray(pickle.dumps(small_snapshot, protocol=rng.choice([2, 4, 5])))
    for _ in range(rng.randint(1, 6)):
        raw[rng.randrange(len(raw))] = rng.getrandbits(8)
    path = tmp_path / "flipped.pickle"
    path.write_bytes(bytes(raw))
    try:
        load(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)


@pytest.mark.parametrize(
    "obj",
    [
        42,
        "hello",
        None,
        3.5,
        {},
        {"foo": 1, "bar": 2},
        [1, 2, 3],
        (1, 2),
        b"bytes",
        {"segments": 5},
        {"device_traces": {"a": 1}},
    ],
    ids=lambda o: type(o).__name__ + str(len(o) if hasattr(o, "__len__") else ""),
)
def test_valid_pickle_not_a_snapshot(write_pickle: Callable[..., Path], obj: Any) -> None:
    path = write_pickle(obj, name="thing.pickle")
    safe_load_pickle(str(path))  # a fine pickle ...
    msgs = assert_input_error(path, ("load_snapshot", "load"))  # ... but not a snapshot
    assert all("snapshot" in m for m in msgs)


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "somedir.pickle"
    d.mkdir()
    for loader in (safe_load_pickle, load_snapshot, load):
        with pytest.raises(InputError) as ei:
            loader(str(d))
        assert str(d) in str(ei.value) and "\n" not in str(ei.value)


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.pickle"
    for loader in (safe_load_pickle, load_snapshot, load):
        with pytest.raises(InputError) as ei:
            loader(str(p))
        assert str(p) in str(ei.value)


# ---------------------------------------------------------------- nesting and odd values


def _deep_list_ops(n: int) -> bytes:
    return b"]" * n + b"a" * (n - 1)  # EMPTY_LIST x n, then APPEND each into its parent


def _with_deep(obj: Any, n: int = 150_000) -> bytes:
    raw = pickle.dumps(obj, protocol=2)
    tok = b"X\x04\x00\x00\x00DEEP"
    assert raw.count(tok) == 1
    return raw.replace(tok, _deep_list_ops(n))


DEEP_CASES = dict(
    [
        ("top", b"\x80\x02" + _deep_list_ops(200_000) + b"."),
        ("tuple", b"\x80\x02" + b"(" * 100_000 + b"t" * 100_000 + b"."),
        ("segments", _with_deep({"segments": "DEEP", "device_traces": []})),
        ("traces", _with_deep({"segments": [], "device_traces": "DEEP"})),
        (
            "frames",
            _with_deep(
                {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 1, "frames": "DEEP"}]]}
            ),
        ),
        (
            "frame_name",
            _with_deep(
                {
                    "segments": [],
                    "device_traces": [
                        [
                            {
                                "action": "alloc",
                                "addr": 1,
                                "size": 1,
                                "frames": [{"name": "DEEP", "filename": "x", "line": 1}],
                            }
                        ]
                    ],
                }
            ),
        ),
        (
            "metadata",
            _with_deep(
                {
                    "segments": [],
                    "device_traces": [
                        [{"action": "alloc", "addr": 1, "size": 1, "stream": 0, "time_us": 1, "user_metadata": "DEEP"}]
                    ],
                }
            ),
        ),
        ("annotation", _with_deep({"segments": [], "device_traces": [], "external_annotations": [{"name": "DEEP"}]})),
        ("settings", _with_deep({"segments": [], "device_traces": [], "allocator_settings": "DEEP"})),
    ]
)


@pytest.mark.parametrize("name", sorted(DEEP_CASES))
def test_deeply_nested_pickles_do_not_crash(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"deep_{name}.pickle"
    path.write_bytes(DEEP_CASES[name])
    try:
        load(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)


@pytest.mark.parametrize(
    "entry",
    [
        {"action": "alloc", "addr": 2**70, "size": 1},
        {"action": "alloc", "addr": float("inf"), "size": 1},
        {"action": "alloc", "addr": 1, "size": 1, "frames": [{"name": "f", "filename": "x", "line": float("inf")}]},
        {"action": ["alloc"], "addr": 1, "size": 1},
        # an alloc without a size would replay as 0 bytes and skew every figure after it
        {"action": "alloc", "addr": "12", "size": None},
        {"action": "free_requested", "size": 512},
        {"addr": 1, "size": 512},
    ],
)
def test_out_of_range_values_are_input_errors(write_pickle: Callable[..., Path], entry: dict[str, Any]) -> None:
    path = write_pickle({"segments": [], "device_traces": [[entry]]}, name="odd.pickle")
    assert_input_error(path, ("load_snapshot", "load"))


@pytest.mark.parametrize(
    "entry",
    [
        {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1, "user_metadata": {"stage": "denoise"}},
        {"action": "alloc", "addr": 1, "size": 512, "frames": "not a list"},
        {"action": "alloc", "addr": 1, "size": 512, "frames": [{"name": "f"}, 5, None]},
        {"action": "alloc", "addr": "12", "size": "512"},
        {"action": "user_defined", "addr": 0, "size": 0, "frames": [{"name": "stage", "filename": "", "line": 0}]},
    ],
)
def test_tolerated_odd_entries_load(write_pickle: Callable[..., Path], entry: dict[str, Any]) -> None:
    path = write_pickle({"segments": [], "device_traces": [[entry]]}, name="odd.pickle")
    snap = load_snapshot(str(path))
    assert len(snap.events) == 1


@pytest.mark.parametrize("compress", [None, gzip.compress, lzma.compress])
def test_read_all_returns_every_byte_once(tmp_path: Path, compress: Callable[[bytes], bytes] | None) -> None:
    """The whole stream, whatever the magic-byte check read ahead, and the reader at its end."""
    body = bytes(random.Random(5).randrange(256) for _ in range(300_000))
    p = tmp_path / "f.bin"
    p.write_bytes(compress(body) if compress else body)
    with open_decompressed(p) as f:
        assert read_all(f) == body
        assert f.read() == b""
        if compress is None:  # the loader reads a plain file again from the start
            f.seek(0)
            assert f.read(10) == body[:10]
