"""The typed trace decode (msgspec, ``snapviz/load/trace/decode.py``) gives exactly what the
reference gives: the same batches parsed into dicts (by orjson, or by the stdlib's ``json``
where orjson is absent) and copied one event at a time (``Columns.add``). Compared on every
trace we have (bundled, hand-made, external) and on generated events full of odd values, so
the fast path cannot drift. The two plain parsers differ on integers beyond 64 bits (orjson
reads them as floats), and the typed decode follows whichever is installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paths import EXTERNAL, SAMPLES, TEST_DATA
from snapviz.errors import InputError
from snapviz.load.trace import decode as trace_decode
from snapviz.load.trace import json_items
from snapviz.load.trace.chrome_trace import ChromeTrace, load_chrome_trace

pytest.importorskip("msgspec")

TABLES = ("memory", "annotations", "ops", "python_functions")
BUNDLED = sorted(SAMPLES.glob("*/trace.json.gz")) + [TEST_DATA / "traces" / "edge_cases.json.gz"]
EXTERNAL_TRACES = [
    "kineto_resnet50_v100_2021.pt.trace.json.gz",
    "hta_df_index_resolver_rank1.json.gz",
    "tracelens_h100_qwen05b.json.gz",
    "tracelens_mi300_vllm_decode.pt.trace.json.gz",
]


@pytest.fixture(params=["orjson", "json"])
def plain_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both runs of a comparison with orjson (when installed), then both with the stdlib."""
    if request.param == "json":
        monkeypatch.setattr(json_items, "_fast_loads", json.loads)
    else:
        pytest.importorskip("orjson")
    return str(request.param)


def _reference(path: Path, monkeypatch: pytest.MonkeyPatch) -> ChromeTrace | str:
    """The dict path: no typed decode."""
    with monkeypatch.context() as m:
        m.setattr(trace_decode, "_DECODER", None)
        return _load(path)


def _typed(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ChromeTrace | str, int]:
    """The fast path (msgspec's typed decode), and how many batches it took (the rest went
    the reference way)."""
    taken = [0]
    with monkeypatch.context() as m:
        add_events = trace_decode.add_events

        def counted(cols: Any, events: list[Any]) -> None:
            add_events(cols, events)
            taken[0] += 1

        m.setattr(trace_decode, "add_events", counted)
        return _load(path), taken[0]


def _load(path: Path) -> ChromeTrace | str:
    try:
        return load_chrome_trace(path)
    except InputError as exc:
        return str(exc)


def _assert_same(got: ChromeTrace | str, want: ChromeTrace | str) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert (got.meta, got.base_us, got.event_count, got.notes) == (
        want.meta,
        want.base_us,
        want.event_count,
        want.notes,
    )
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(got, name), getattr(want, name), check_exact=True)


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.parent.name + "/" + p.name)
def test_bundled_traces_equal_the_reference(path: Path, plain_parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    got, _ = _typed(path, monkeypatch)
    _assert_same(got, _reference(path, monkeypatch))
    # Small reads: batches with and without the edge trace's null items, so one trace
    # mixes typed and reference batches through the same interners.
    monkeypatch.setattr(json_items, "BATCH_READ_BYTES", 700)
    mixed, typed_batches = _typed(path, monkeypatch)
    assert typed_batches > 0
    _assert_same(mixed, got)


@pytest.mark.parametrize("name", EXTERNAL_TRACES)
def test_external_traces_equal_the_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = EXTERNAL / name
    if not path.exists():
        pytest.skip("external corpus absent")
    got, typed_batches = _typed(path, monkeypatch)
    assert typed_batches > 0  # real traces take the typed decode
    _assert_same(got, _reference(path, monkeypatch))


# --------------------------------------------------------------------------- generated events

_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_edges = st.sampled_from(
    [-(1 << 63), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -(1 << 63) - 1, 2.5, 1e19, "12", "x"]
)
_ids = st.one_of(
    _edges,
    st.integers(-5, 5),
    _int64,
    st.integers(-(1 << 70), 1 << 70),
    st.floats(-1e20, 1e20),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
_times = st.one_of(st.floats(-1e16, 1e16), st.integers(-(1 << 66), 1 << 66), st.just(-0.0), st.just(0))
_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(1 << 65), 1 << 65),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=4),
    ),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=2),
    max_leaves=6,
)
_args = st.fixed_dictionaries(
    {},
    optional={
        "Input Dims": _json,
        "Input type": _json,
        "Device Type": _ids,
        "Device Id": _ids,
        "Bytes": _ids,
        "Addr": _ids,
        "Total Allocated": _ids,
        "Total Reserved": _ids,
        "Other": _json,
    },
)
# Mostly events the typed decode takes (so its conversions are what is compared), now and
# then one it refuses (a null item, a numeric cat or name, a bool ts, args null).
_rare = st.integers(0, 15).map(lambda i: i == 0)
_event = st.fixed_dictionaries(
    {},
    optional={
        "cat": st.sampled_from(
            ["cpu_op", "python_function", "python_function", "user_annotation", "cpu_instant_event", "kernel"]
        ),
        "name": st.one_of(st.sampled_from(["[memory]", "aten::mm", "f", 'é\n"\\']), st.text(max_size=5)),
        "ph": st.sampled_from(["X", "X", "i", "B", "M"]),
        "ts": _times,
        "dur": _times,
        "tid": _ids,
        "pid": _ids,
        "args": _args,
    },
)
_odd = st.sampled_from([None, 3, {"cat": 7}, {"name": 5}, {"ts": True}, {"args": None}, {"cat": "cpu_op", "ph": "x"}])
_item = st.tuples(_rare, _event, _odd).map(lambda t: t[2] if t[0] else t[1])


@settings(max_examples=150, deadline=None)
@given(events=st.lists(_item, max_size=40), read=st.sampled_from([60, 1 << 20]), stdlib=st.booleans())
def test_generated_events_equal_the_reference(
    tmp_path_factory: pytest.TempPathFactory, events: list[Any], read: int, stdlib: bool
) -> None:
    path = tmp_path_factory.mktemp("gen") / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 1_700_000_000_000_000_123, "traceEvents": events}))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(json_items, "BATCH_READ_BYTES", read)
        if stdlib:
            m.setattr(json_items, "_fast_loads", json.loads)
        got, _ = _typed(path, m)
        _assert_same(got, _reference(path, m))


def test_refused_batches_go_the_reference_way(
    tmp_path: Path, plain_parser: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Values the typed decode refuses (a bool ts, a numeric name, args null) are still read
    # as the reference reads them; a string ts is still refused with one line.
    ok = {"ph": "X", "cat": "python_function", "name": "f", "ts": 1.5, "dur": 2, "tid": 3}
    odd = [{**ok, "ts": True}, {**ok, "name": 12}, {**ok, "cat": "cpu_op", "args": None}, None]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": [ok, *odd]}))
    got, typed_batches = _typed(path, monkeypatch)
    assert typed_batches == 0 and not isinstance(got, str)
    assert got.python_functions["start_us"].tolist() == [1.5, 1.0, 1.5]
    assert got.python_functions["name"].astype(str).tolist() == ["f", "f", "12"]
    assert len(got.ops) == 1 and got.event_count == 5
    _assert_same(got, _reference(path, monkeypatch))
    path.write_text(json.dumps({"traceEvents": [ok, {**ok, "ts": "soon"}]}))
    with pytest.raises(InputError, match="malformed trace event"):
        load_chrome_trace(path)


@pytest.mark.parametrize("only_int64", [False, True])
def test_edge_values_equal_the_reference(
    tmp_path: Path, plain_parser: str, monkeypatch: pytest.MonkeyPatch, only_int64: bool
) -> None:
    # Every boundary of the id conversion (int64 ends, the uint64 wrap, beyond 64 bits,
    # strings, floats, bools, null) in every kept kind, all in typed batches; with int64s
    # only, a column converts in one call and must still refuse -2**63 as the reference does.
    values: list[Any] = [-(1 << 63), -(1 << 63) + 1, (1 << 63) - 1, 0, -1]
    if not only_int64:
        values += [
            1 << 63,
            (1 << 64) - 1,
            1 << 64,
            -(1 << 63) - 1,
            1 << 70,
            2.5,
            -0.0,
            1e19,
            "12",
            " 7 ",
            "x",
            True,
            False,
            None,
        ]
    events = []
    for i, v in enumerate(values):
        base = {"ph": "X", "name": f"n{i % 3}", "ts": i * 1.25, "dur": 1, "tid": v, "pid": v}
        mem = {"Device Type": v, "Device Id": v, "Bytes": v, "Addr": v, "Total Allocated": v, "Total Reserved": v}
        events += [
            {**base, "cat": "python_function"},
            {**base, "cat": "user_annotation"},
            {**base, "cat": "cpu_op", "args": {"Input Dims": [[i, v]], "Input type": [str(v)]}},
            {**base, "cat": "cpu_instant_event", "name": "[memory]", "ph": "i", "args": mem},
        ]
    path = tmp_path / "edges.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got, typed_batches = _typed(path, monkeypatch)
    assert typed_batches > 0 and not isinstance(got, str)
    _assert_same(got, _reference(path, monkeypatch))
    assert len(got.memory) == len(got.python_functions) == len(values)
    assert got.python_functions["tid"].tolist()[:3] == [-1, -(1 << 63) + 1, (1 << 63) - 1]
