"""The compiled batch decode (``snapviz/load/trace/trace_kernel.py``) against the reference, one
batch at a time: every batch the kernel takes must give exactly the columns the reference
(a plain parse into dicts, ``Columns.add``) gives, and every batch the reference refuses
must be given back. Checked on real batches, on randomly damaged ones, and on hand-made
texts at the edges of the JSON grammar (numbers, escapes, UTF-8, keys). Whole traces are
compared in ``test_trace_decode.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from paths import SAMPLES, TEST_DATA

from snapviz.errors import InputError
from snapviz.load.limits import ENV, Limits
from snapviz.load.trace import decode as trace_decode
from snapviz.load.trace import json_items
from snapviz.load.trace.columns import Columns
from snapviz.load.trace.json_items import array_item_docs, parse_items
from snapviz.load.trace.json_stream import TapReader, open_json, scan_top_level

KERNEL = trace_decode.kernel_batches()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="numba absent")
TRACE = SAMPLES / "sd15-fp16-profile-1step" / "trace.json.gz"
EDGE = TEST_DATA / "traces" / "edge_cases.json.gz"


def _docs(path: Path, read: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, int]]:
    """The batch texts a load of ``path`` hands to the decoders, with ``read``-byte reads."""
    limits = Limits.from_env()
    top = scan_top_level(str(path), limits)
    reader = TapReader(str(path), open_json(str(path), limits), limits, watch=top.events_index)
    monkeypatch.setattr(json_items, "BATCH_READ_BYTES", read)
    with reader.stream:
        return list(array_item_docs(reader, str(path)))


def _reference(doc: bytes, skip: int) -> Columns | None:
    cols = Columns()
    try:
        cols.add(parse_items(doc, "t")[skip:])
    except (InputError, TypeError, ValueError, OverflowError):
        return None  # a load would stop here with one line
    return cols


def _kernel(doc: bytes, skip: int) -> Columns | None:
    assert KERNEL is not None
    cols = Columns()
    return cols if KERNEL.add(cols, doc, skip) else None


def _same(got: Columns, want: Columns) -> None:
    assert got.count == want.count
    g, w = got.frames(0.0), want.frames(0.0)
    for name in w:
        pd.testing.assert_frame_equal(g[name], w[name], check_exact=True)
        for col in w[name]:  # bit for bit: -0.0 and 0.0 differ here, not in assert_frame_equal
            if w[name][col].dtype == np.float64:
                assert (g[name][col].to_numpy().view(np.int64) == w[name][col].to_numpy().view(np.int64)).all()


def _check(doc: bytes, skip: int = 0) -> bool:
    """Compare both ways on one batch; True when the kernel took it."""
    got = _kernel(doc, skip)
    if got is None:
        return False
    want = _reference(doc, skip)
    assert want is not None, f"the kernel took a batch the reference refuses: {doc[:200]!r}"
    _same(got, want)
    return True


def test_real_batches_are_taken_and_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(TRACE, 4000, monkeypatch)
    assert len(docs) > 100
    for doc, skip in docs[:80] + docs[-20:]:
        assert _check(doc, skip)


def test_damaged_batches_are_equal_or_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # Single-byte damage at random places, with the bytes that change JSON's meaning most.
    rng = random.Random(14)
    docs = _docs(TRACE, 3000, monkeypatch)[:60]
    alphabet = b'"\\{}[],:0123456789.eE-+ ntfu\x00\x1f\x7f\xc3\xa9\xed\xa0\xff/'
    taken = refused = 0
    for doc, skip in docs:
        for _ in range(12):
            at = rng.randrange(len(doc))
            byte = bytes([rng.choice(alphabet)])
            how = rng.randrange(3)
            bad = doc[:at] + (byte if how < 2 else b"") + doc[at + (how != 1) :]
            if _check(bad, skip):
                taken += 1
            else:
                refused += 1
    assert taken > 50 and refused > 50  # both outcomes are exercised


_OK = {"ph": "X", "cat": "python_function", "name": "f", "ts": 1.5, "dur": 2, "tid": 3, "pid": 4}


@pytest.mark.parametrize(
    "number",
    [
        "0", "-0.0", "0.1", "4.35", "1e5", "1E-7", "-2.5e+3", "123456789012345678", "1234567890123456789",
        "9007199254740993", "9007199254740993.0", "10302116038536.879", "1732989012345678.123",
        "1.7976931348623157e307", "2.2250738585072011e-280", "0.000001234567890123456789",
        "12345678901234567890123", "1e22", "1e23", "123456.0000000000000000001",
    ],
)
def test_times_read_bit_for_bit(number: str) -> None:
    for kind in ("python_function", "cpu_op", "user_annotation"):
        doc = b'[{"ph": "X", "cat": "%s", "name": "f", "ts": %s, "dur": %s, "tid": 1}]' % (
            kind.encode(), number.encode(), number.encode())
        assert _check(doc)
    mem = b'[{"ph": "i", "name": "[memory]", "ts": %s, "args": {"Bytes": 5}}]' % number.encode()
    assert _check(mem)


@pytest.mark.parametrize(
    "number, taken",
    [("-0", False), ("1e400", False), ("1e-400", False), ("2.2250738585072011e-308", False), ("5e-324", False), ("01", False), ("1.", False), (".5", False), ("+1", False),
     ("NaN", False), ("Infinity", False), ("1e", False), ("-", False), ("2.5", True)],
)
def test_odd_times_are_given_back(number: str, taken: bool) -> None:
    doc = b'[{"ph": "X", "cat": "python_function", "name": "f", "ts": %s}]' % number.encode()
    assert _check(doc) is taken
    # On an event that is not kept the value only has to be JSON, of a magnitude all parsers read alike.
    doc = b'[{"ph": "X", "cat": "kernel", "name": "f", "ts": %s}]' % number.encode()
    assert _check(doc) is (number in ("-0", "2.5"))


@pytest.mark.parametrize(
    "name",
    [
        '"plain"', '""', '"\\u00e9t\\u00e9"', '"tab\\there \\"q\\" \\\\ \\/"', '"\\u0000"', '"été 日本 \U0001f600"',
        '"[memory\\u005d"', '"\\u005bmemory]"', '"[memory]"', '"\\ud83d\\ude00"', '"\\ud800"',
    ],
)
@pytest.mark.parametrize("cat", ["cpu_op", "python_function", "user_annotation", "cpu_instant_event"])
def test_names_equal_the_reference(name: str, cat: str) -> None:
    doc = ('[{"ph": "X", "cat": "%s", "name": %s, "ts": 1, "args": {"Bytes": 7}}, {"cat": "%s", "name": %s}]'
           % (cat, name, cat, name)).encode()
    took = _check(doc)
    assert took or "\\ud8" in name  # surrogates are the only names it gives back


@pytest.mark.parametrize(
    "text",
    [
        b'[{"c\\u0061t": "cpu_op", "name": "f"}]',  # an escaped key
        b'[{"cat": "cpu_op", "cat": "python_function", "name": "f"}]',  # a duplicated key
        b'[{"cat": "cpu\\u005fop", "name": "f"}]',  # an escaped cat
        b'[{"cat": "cpu_op", "name": "f", "args": null}]',
        b'[{"cat": "cpu_op", "name": "f", "args": [1]}]',
        b'[{"cat": "cpu_op", "name": "f", "tid": "7"}]',
        b'[{"cat": "cpu_op", "name": "f", "tid": 7.0}]',
        b'[{"cat": "cpu_op", "name": "f", "tid": true}]',
        b'[{"cat": "cpu_op", "name": "f", "tid": -9223372036854775808}]',
        b'[{"cat": "cpu_op", "name": 5}]',
        b'[{"cat": 5, "name": "[memory]"}]',
        b'[{"name": "[memory]", "args": {"Bytes": "12"}}]',
        b'[{"name": "[memory]", "args": {"Addr": 1, "Addr": 2}}]',
        b'[{"cat": "cpu_op", "name": "f\xff"}]',  # invalid UTF-8
        b'[{"cat": "cpu_op", "name": "f\xc0\xaf"}]',  # overlong
        b'[{"cat": "cpu_op", "name": "f\xed\xa0\x80"}]',  # an encoded surrogate
        b'[{"cat": "cpu_op", "name": "f\x01"}]',  # a raw control character
        b'[{"cat": "cpu_op", "name": "f"}] x',
        b'[{"cat": "cpu_op", "name": "f"},]',
        b'[{"cat": "cpu_op" "name": "f"}]',
        b'[{"cat": "cpu_op", "name": "f", "x": [1, 2}]',
        b'[{"cat": "cpu_op", "name": "f", "x": {"a" 1}}]',
        b'[{"cat": "cpu_op", "name": "f", "x": tru}]',
        b'[{"cat": "cpu_op", "name": "f", "x": ' + b"[" * 600 + b"]" * 600 + b"}]",  # deeper than its stack
    ],
)
def test_texts_outside_the_subset_are_given_back(text: bytes) -> None:
    assert not _check(text)


@pytest.mark.parametrize(
    "text",
    [
        b"[]", b" [ ] ", b"[{}]", b"[null, 3, \"x\", [1, {}], {}]",
        b'[{"cat": null, "ph": null, "name": "[memory]", "tid": null, "args": {"Total Allocated": null}}]',
        b'[{"cat": "kernel", "name": "k", "tid": "stream 7", "pid": "Spans", "ts": "soon", "args": null}]',
        b'[{"cat": "cpu_op", "name": "f", "args": {"Input Dims": [[1, 2], []], "Input type": ["float", ""], '
        b'"Concrete Inputs": ["", "4"]}}, {"cat": "cpu_op", "name": "g", "args": {"Input Dims":  [[1,2],[]], '
        b'"Input type": null}}, {"cat": "cpu_op", "name": "f", "args": {"Input Dims": "", "Input type": {"a": 1}}}]',
        b'[{"cat": "user_annotation", "ph": "i", "name": "a"}, {"cat": "user_annotation", "ph": "X", "name": "a",'
        b' "pid": -3, "tid": 123456789012345678}]',
        b'[{"name": "[memory]", "ph": "i", "ts": 2, "tid": 1, "args": {"Device Type": 300, "Device Id": -70000, '
        b'"Bytes": -512, "Addr": 140000000000000, "Total Allocated": 5, "Total Reserved": 9}}]',
    ],
)
def test_texts_inside_the_subset_are_taken(text: bytes) -> None:
    assert _check(text)
    if b"{" in text:  # as a later batch, after the leading {} the reader adds
        assert _check(b"[{}," + text.lstrip()[1:], 1)


def test_generated_numbers_and_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many times and ids in one batch: long mantissas go to the text path, the rest are exact.
    rng = random.Random(7)
    events = []
    for i in range(3000):
        ts = rng.choice([rng.uniform(0, 1e16), rng.randrange(1 << 60) / 1000, rng.random(), float(rng.randrange(10**17))])
        events.append({"ph": "X", "cat": rng.choice(["cpu_op", "python_function"]), "name": f"n{i % 37}",
                       "ts": ts, "dur": round(rng.uniform(0, 1e4), rng.randrange(6)), "tid": rng.randrange(-(10**17), 10**17),
                       "args": {"Input Dims": [[rng.randrange(4)]], "Input type": ["float"]}})
    doc = json.dumps(events).encode()
    assert _check(doc)
    # Reused buffers: a second, smaller batch after a larger one, then the large one again.
    assert _check(json.dumps(events[:5]).encode())
    assert _check(doc)


def test_outputs_grow_when_a_batch_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Room for one kept event: every output array fills (rows, distinct spans, hard numbers
    # and their text), the kernel says so, and the batch is decoded again with room to spare.
    kernel = trace_decode.kernel_batches()
    assert kernel is not None
    doc = b'[{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 10302116038536.879, "dur": 1, "args": {"Input Dims": [[1]]}},' \
          b' {"ph": "X", "cat": "python_function", "name": "b", "ts": 10302116038537.879, "dur": 1732989012345678.123}]'
    for text, skip in [(doc, 0), *_docs(TRACE, 1 << 20, monkeypatch)[:3]]:
        kernel._size(1)
        cols = Columns()
        assert kernel.add(cols, text, skip) and kernel.cap > 1
        want = _reference(text, skip)
        assert want is not None
        _same(cols, want)


# --------------------------------------------------------------------------- the stream, guard skipped

_EV = b'{"ph": "X", "cat": "cpu_op", "name": "n%d", "ts": %d.5, "dur": 1, "tid": 2, "args": {"Input Dims": [[1, %d]]}}'


def _stream(path: Path, read: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict], str | Columns]:
    """The guard's state before every read and after the last, and the columns (or the error
    line) of a load of ``path`` with ``read``-byte reads, with or without the compiled decoder."""
    limits = Limits.from_env()
    states: list[dict] = []
    try:
        top = scan_top_level(str(path), limits)
    except InputError as exc:
        return states, str(exc)
    reader = TapReader(str(path), open_json(str(path), limits), limits, watch=top.events_index)
    read_ = reader.read

    def read_noting(size: int = -1, guarded: bool = True) -> bytes:
        states.append({k: v for k, v in vars(reader.guard).items() if k not in ("path", "limits")})
        return read_(size, guarded)

    monkeypatch.setattr(reader, "read", read_noting)
    monkeypatch.setattr(json_items, "BATCH_READ_BYTES", read)
    cols = Columns()
    decoders = trace_decode.kernel_batches(limits.depth)
    assert decoders is not None
    decoder = decoders.items(cols)
    try:
        with reader.stream:
            for doc, skip in array_item_docs(reader, str(path), (lambda _: decoder) if compiled else None):
                trace_decode.add_batch(cols, doc, skip, str(path))
    except InputError as exc:
        return states, str(exc)
    states.append({k: v for k, v in vars(reader.guard).items() if k not in ("path", "limits")})
    return states, cols


def _same_stream(path: Path, read: int, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Both ways read alike: the guard's state at every read, and the same columns or error."""
    plain_states, plain = _stream(path, read, False, monkeypatch)
    fast_states, fast = _stream(path, read, True, monkeypatch)
    assert fast_states == plain_states
    if isinstance(plain, str) or isinstance(fast, str):
        assert fast == plain
        return str(plain)
    _same(fast, plain)
    return None


@pytest.mark.parametrize("path, read", [(TRACE, 1 << 20), (TRACE, 4000), (EDGE, 700), (EDGE, 97), (EDGE, 5)])
def test_the_guard_skips_what_the_kernel_read(path: Path, read: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The guard's state at every read (depth, strings, value count, the item ends, the array's
    # end) is the one scanning every byte gives, and so are the columns.
    assert _same_stream(path, read, monkeypatch) is None


@pytest.mark.parametrize("env, value", [("depth", "5"), ("depth", "6"), ("string_length", "60"), ("objects", "40"),
                                        ("objects", "400"), ("depth", "100")])
@pytest.mark.parametrize("bad", [b"", b'{"a": [[[[[[1]]]]]]}', b'{"name": "' + b"s" * 90 + b'"}', b'{"a": 1,}', b"{]",
                                 b'{"a": tru}', b'"x" "y"', b"[" * 30 + b"]" * 29, b'{"a": "\\,"}', b"{" * 8])
@pytest.mark.parametrize("read", [64, 300, 1 << 20])
def test_stream_errors_are_the_plain_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, value: str,
                                          bad: bytes, read: int) -> None:
    # A bad item (or a limit) early, late or nowhere: the same error line at the same read,
    # whether the compiled decoder read the items before it or not.
    events = [_EV % (i, i, i) for i in range(40)]
    for at in (1, 25, 40):
        body = b", ".join(events[:at] + ([bad] if bad else []) + events[at:])
        path = tmp_path / f"t{at}.json"
        path.write_bytes(b'{"schemaVersion": 1, "traceEvents": [' + body + b'], "after": [1, {"k": 2}]}')
        monkeypatch.setenv(ENV[env], value)
        _same_stream(path, read, monkeypatch)
    path.write_bytes(b'{"traceEvents": [' + b", ".join(events)[:-7])  # cut short
    assert _same_stream(path, read, monkeypatch) is not None  # "ends inside the traceEvents list", or a limit


def test_long_decimal_times_are_rounded_as_float_does() -> None:
    # Times of 16-18 digits with decimals (absolute µs: most profiler traces) are read in the
    # kernel (trace_kernel_fields.quotient), not as text: exact ties between two doubles
    # (half to even), texts one unit either side of a tie, and near-ties of random doubles.
    rng = random.Random(3)
    texts = []
    for _ in range(1500):
        x = rng.randrange(1 << 52, 1 << 53)  # spacing 1: x + 0.5 is a tie
        k = rng.randrange(1, 4)
        m = (2 * x + 1) * 10**k // 2
        texts += [f"{mm // 10**k}.{mm % 10**k:0{k}d}" for mm in (m - 1, m, m + 1)]
        d = rng.uniform(1e3, 1e16)
        texts.append(repr(d)[:18].rstrip("."))
        texts.append(f"{rng.randrange(10**17, 10**18)}e-{rng.randrange(1, 20)}")
    events = [b'{"ph": "X", "cat": "python_function", "name": "f", "ts": %s, "dur": %s}' % (t.encode(), t.encode())
              for t in texts]
    doc = b"[" + b", ".join(events) + b"]"
    assert _check(doc)
    values = [float(t) for t in texts]
    cols = _kernel(doc, 0)
    assert cols is not None
    assert np.array_equal(cols.frames(0.0)["python_functions"]["start_us"].to_numpy(), np.array(values))
