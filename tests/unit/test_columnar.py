"""The snapshot read off the pickle's tape (snapviz.load.snapshot.columnar) equals the one built from
the unpickled objects (snapviz.load.snapshot.builder), or the tape path declines and the file is
unpickled: on every bundled sample, the external snapshots, drifted synthetic snapshots
(old layouts, missing and extra keys, broken entries, every pickle protocol that has the
opcodes) and odd values. The tape itself gives back the objects the unpickler makes."""

from __future__ import annotations

import lzma
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
import synth
from paths import EXTERNAL, SAMPLES
from snapviz.errors import InputError
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.columnar import columnar_snapshot
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.load.snapshot.tape import available, run_tape
from snapviz.load.snapshot.tape_read import Objects
from snapviz.model import Snapshot

pytestmark = pytest.mark.skipif(not available(), reason="numba not installed (the fast extra)")

FRAMES = ("events", "frames", "stack_frames", "segments", "blocks", "annotations")


def _assert_same(a: Snapshot, b: Snapshot) -> None:
    for f in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, f), getattr(b, f), obj=f)
    assert a.stacks == b.stacks
    assert a.strings == b.strings
    assert a.allocator_settings == b.allocator_settings
    assert a.format_notes == b.format_notes


def _both(data: bytes, source: str = "x.pickle") -> tuple[Any, Any]:
    """(the dict route's Snapshot or InputError, the tape route's Snapshot / InputError / None)."""
    try:
        ref: Any = snapshot_from_dict(pickle.loads(data), source)
    except InputError as exc:
        ref = exc
    try:
        finish = columnar_snapshot(data, source)
        got: Any = finish() if finish is not None else None
    except InputError as exc:
        got = exc
    return ref, got


def _check(data: bytes, must_take: bool = False) -> Any:
    ref, got = _both(data)
    if must_take:
        assert got is not None, "the tape path declined a file in torch's shape"
    if got is None:
        return None
    if isinstance(ref, InputError):
        assert isinstance(got, InputError) and str(got) == str(ref)
    else:
        assert not isinstance(got, InputError), got
        _assert_same(ref, got)
    return got


def _pickles() -> list[Path]:
    out = sorted(SAMPLES.glob("*/snapshot.pickle*"))
    return out + (sorted(EXTERNAL.glob("*.pickle")) if EXTERNAL.exists() else [])


@pytest.mark.parametrize("path", _pickles(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_tape_equals_unpickled_on_real_files(path: Path) -> None:
    """Every real file we have is in torch's shape: the tape path must take it and agree."""
    f = columnar_snapshot  # through the loader's own hook, as `analyze` runs it on a big file
    got = safe_load_pickle(path, build=lambda data: f(data, str(path)))
    assert isinstance(got, Snapshot), "the tape path declined a real file"
    _assert_same(snapshot_from_dict(safe_load_pickle(path), str(path)), got)


drift = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 10_000),
        "layout": st.sampled_from(["dict", "dict", "history", "segments"]),
        "omit": st.sets(st.sampled_from(("time_us", "frames", "user_metadata", "compile_context")), max_size=2),
        "protocol": st.sampled_from([2, 3, 4, 5]),
        "mutate": st.sampled_from(
            [None, "drop_addr", "drop_stream", "float_size", "bool_addr", "big_int", "odd_metadata", "share_frames"]
        ),
        "oom": st.booleans(),
    }
)


def _drifted(d: dict[str, Any]) -> Any:
    sim = synth.random_workload(seed=d["seed"], n_ops=120, context="all", budget=4 * synth.GiB)
    snap = sim.snapshot(layout=d["layout"], omit=tuple(d["omit"]))
    if d["layout"] == "segments":
        return snap
    trace = snap["device_traces"][0]
    rng = random.Random(d["seed"])
    if d["oom"]:
        trace.append({"action": "oom", "size": 1 << 30, "device_free": 123, "stream": 0, "time_us": 9})
    e = trace[rng.randrange(len(trace))] if trace else {}
    m = d["mutate"]
    if m == "drop_addr":
        e.pop("addr", None)
    elif m == "drop_stream":
        e.pop("stream", None)
    elif m == "float_size":
        e["size"] = float(e.get("size", 0))
    elif m == "bool_addr":
        e["addr"] = True
    elif m == "big_int":
        e["addr"] = 1 << 70
    elif m == "odd_metadata":
        e["user_metadata"] = {"step": 3}
    elif m == "share_frames" and trace:
        for x in trace[::2]:
            x["frames"] = trace[0].get("frames")  # one list object for many entries
    return snap


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(drift)
def test_tape_equals_unpickled_or_declines_on_drifted_snapshots(d: dict[str, Any]) -> None:
    snap = _drifted(d)
    clean = d["layout"] == "dict" and d["mutate"] in (None, "drop_stream", "share_frames")
    _check(pickle.dumps(snap, protocol=d["protocol"]), must_take=clean)


def test_out_of_range_values_give_the_same_error() -> None:
    base = synth.random_workload(seed=1, n_ops=40, context="all", budget=4 * synth.GiB).snapshot()
    base["device_traces"][0][0]["size"] = -512
    ref, got = _both(pickle.dumps(base, protocol=4))
    assert isinstance(ref, InputError) and isinstance(got, InputError) and str(got) == str(ref)


def test_old_protocols_are_declined_not_misread() -> None:
    snap = synth.random_workload(seed=2, n_ops=40, context="all", budget=4 * synth.GiB).snapshot()
    for protocol in (0, 1):
        assert run_tape(pickle.dumps(snap, protocol=protocol), 0) is None


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 80), max_value=1 << 80),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-300, 300)), inner, max_size=5),
        st.tuples(inner, inner),
        st.tuples(inner),
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values, st.sampled_from([2, 3, 4, 5]))
def test_tape_gives_back_what_the_unpickler_makes(obj: Any, protocol: int) -> None:
    data = pickle.dumps(obj, protocol=protocol)
    tape = run_tape(data, 0)
    assert tape is not None
    got = Objects(tape).value(tape.root_kind, tape.root, 0)
    assert got == obj and type(got) is type(obj)


def test_shared_and_self_holding_containers_stay_shared() -> None:
    inner = [1, "a"]
    obj: list[Any] = [inner, inner, {"k": inner}]
    obj.append(obj)
    tape = run_tape(pickle.dumps(obj, protocol=4), 0)
    assert tape is not None
    got = Objects(tape).value(tape.root_kind, tape.root, 0)
    assert got[0] is got[1] is got[2]["k"] and got[3] is got


def test_memoized_numbers_keep_their_values() -> None:
    # pickle.dumps never memoizes an int or a float, but a pickle may: [5, 5, 1.5, 1.5]
    data = b"\x80\x04]\x94(K\x05\x94h\x01G?\xf8\x00\x00\x00\x00\x00\x00\x94h\x02e."
    tape = run_tape(data, 0)
    assert tape is not None
    assert Objects(tape).value(tape.root_kind, tape.root, 0) == pickle.loads(data) == [5, 5, 1.5, 1.5]


def test_a_key_set_twice_keeps_its_last_value() -> None:
    # {"a": 1, "a": 2} as SETITEMS writes it: pickle.loads keeps the last
    data = b"\x80\x04}(\x8c\x01aK\x01\x8c\x01aK\x02u."
    assert pickle.loads(data) == {"a": 2}
    tape = run_tape(data, 0)
    assert tape is not None
    assert Objects(tape).value(tape.root_kind, tape.root, 0) == {"a": 2}


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04c__builtin__\neval\n.",  # GLOBAL
        b"\x80\x04]\x94(K\x01\x91.",  # FROZENSET
        b"\x80\x04K\x01K\x02.",  # two values at STOP
        b"\x80\x04K\x01e.",  # APPENDS without MARK
        b"\x80\x04}(K\x01u\x94.",  # SETITEMS with an odd count
        b"\x80\x04K\x01h\x05.",  # BINGET of an empty slot
        b"\x80\x04](]K\x01s.",  # SETITEM on a list
        b"\x80\x04}(]K\x01u.",  # a list as a dict key
        b"\x80\x04\x8c\x05ab",  # truncated
        b"\x80\x04]",  # no STOP
    ],
)
def test_what_is_not_plain_data_is_declined(data: bytes) -> None:
    assert run_tape(data, 0) is None


def test_arrays_too_short_for_the_first_guess_are_sized_exactly() -> None:
    obj: list[list[Any] | None] = [None] * 100_000 + [[]] * 5000  # one row per byte: more than the first guess holds
    tape = run_tape(pickle.dumps(obj, protocol=4), 0)
    assert tape is not None and len(tape.r_kind) == 105_000
    assert Objects(tape).value(tape.root_kind, tape.root, 0) == obj


def _outcome(path: Path, build: Any) -> Any:
    try:
        out = safe_load_pickle(path, build=build)
        return out if isinstance(out, Snapshot) else snapshot_from_dict(out, str(path))
    except InputError as exc:
        return str(exc)


def test_hostile_pickles_end_as_they_do_without_the_tape(tmp_path: Path) -> None:
    """The loader's hostile pickles (deep nesting, shared-reference bombs, huge strings,
    out-of-range sizes) through the tape path: the same error line or the same snapshot."""
    for name, (path, _) in hostile.pickle_cases(tmp_path).items():
        if path.stat().st_size > 64 << 20 or name.startswith("gzip_"):
            continue  # decompression bombs stop before any bytes reach a reader

        ref = _outcome(path, None)
        got = _outcome(path, lambda data, p=path: columnar_snapshot(data, str(p)))
        if isinstance(ref, str) or isinstance(got, str):
            assert got == ref, name
        else:
            _assert_same(ref, got)


@pytest.mark.parametrize("compress", [False, True])
def test_a_declined_file_is_unpickled_after_its_bytes_were_let_go(tmp_path: Path, compress: bool) -> None:
    """The tape is made, the bytes let go, and only then does the reader decline (an entry
    outside torch's shape): the loader reads the file again, decompressing it where needed."""
    snap = synth.random_workload(seed=3, n_ops=60, context="all", budget=4 * synth.GiB).snapshot()
    snap["device_traces"][0][0]["size"] = 1.5  # a float size: the careful dict reader's case
    raw = pickle.dumps(snap, protocol=4)
    path = tmp_path / ("s.pickle.xz" if compress else "s.pickle")
    path.write_bytes(lzma.compress(raw) if compress else raw)
    calls: list[bool] = []

    def build(data: bytes) -> Any:
        finish = columnar_snapshot(data, str(path))
        assert finish is not None
        calls.append(True)
        return finish

    got = safe_load_pickle(path, build=build)
    assert calls and not isinstance(got, Snapshot)
    assert got == pickle.loads(raw)


def test_arrays_it_cannot_get_send_the_file_to_the_unpickler(monkeypatch: pytest.MonkeyPatch) -> None:
    real = np.empty

    def scarce(shape: Any, *a: Any, **k: Any) -> Any:
        if isinstance(shape, int) and shape > 10_000:
            raise MemoryError
        return real(shape, *a, **k)

    monkeypatch.setattr(np, "empty", scarce)
    assert run_tape(pickle.dumps(list(range(50_000)), protocol=4), 0) is None
