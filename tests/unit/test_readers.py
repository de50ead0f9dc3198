"""One loader shape (issue 25): each format's reader chosen in one function and recorded on
what it loads, the fast backend giving the same columns as the object path; one interner type;
no private names imported across ``snapviz/load``."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from paths import ROOT, SAMPLES
from snapviz.compiled import min_size
from snapviz.interning import Interner
from snapviz.load import load_snapshot
from snapviz.load.snapshot import columnar, reader
from snapviz.load.trace import decode
from snapviz.load.trace.chrome_trace import load_chrome_trace

SMALLEST = min(SAMPLES.glob("*/snapshot.pickle*"), key=lambda p: p.stat().st_size)
TRACE = sorted(SAMPLES.glob("*/trace.json.gz"))[0]


def test_the_reader_is_chosen_by_size_in_one_place() -> None:
    assert reader.choose_reader(int(min_size("pickle_tape")) - 1) == reader.UNPICKLER
    assert reader.choose_reader(int(min_size("pickle_tape"))) == reader.PICKLE_VM
    assert set(reader.READERS) == {reader.UNPICKLER, reader.PICKLE_VM}


def test_a_small_snapshot_is_unpickled_and_says_so() -> None:
    assert SMALLEST.stat().st_size < int(min_size("pickle_tape"))
    assert load_snapshot(str(SMALLEST)).reader == reader.UNPICKLER


def test_the_fast_backend_gives_the_object_paths_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    if columnar.run_tape(b"\x80\x04N.", 0) is None:
        pytest.skip("numba absent: the pickle VM is not available")
    slow = load_snapshot(str(SMALLEST))
    monkeypatch.setenv("SNAPVIZ_KERNEL_MIN_SIZE", "pickle_tape=0")
    fast = load_snapshot(str(SMALLEST))
    assert (slow.reader, fast.reader) == (reader.UNPICKLER, reader.PICKLE_VM)
    for name in ("events", "frames", "stack_frames", "segments", "blocks", "annotations"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name), check_dtype=True)
    assert (fast.stacks, fast.strings) == (slow.stacks, slow.strings)


def test_the_trace_decoder_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    got = load_chrome_trace(TRACE)
    assert got.reader == decode.trace_reader() in decode.READERS
    monkeypatch.setattr(decode, "_DECODER", None)
    dicts = load_chrome_trace(TRACE)
    assert dicts.reader == decode.DICTS
    for name in ("memory", "annotations", "ops", "python_functions"):
        pd.testing.assert_frame_equal(getattr(dicts, name), getattr(got, name))


def test_the_interner_codes_in_order_of_first_appearance() -> None:
    one: Interner[str] = Interner([""])
    values = ["b", "a", "b", "", "c", "a"]
    per_call = [one(v) for v in values]
    assert per_call == [1, 2, 1, 0, 3, 2] and one.values == ["", "b", "a", "c"] and len(one) == 4
    bulk: Interner[str] = Interner([""])
    assert bulk.many(values).tolist() == per_call and bulk.many(values).dtype == np.int32
    assert bulk.values == one.values and bulk.get("zz") == -1 and bulk.get("c") == 3
    cat = bulk.categorical(bulk.many(["c", "b"]), str.upper)
    assert list(cat.astype(str)) == ["C", "B"] and list(cat.categories) == ["", "B", "A", "C"]
    rows: Interner[tuple[int, ...]] = Interner()
    assert [rows((1, 2)), rows(()), rows((1, 2))] == [0, 1, 0]


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("snapviz")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_private_names_are_imported_across_load() -> None:
    found = [hit for path in sorted((ROOT / "snapviz" / "load").rglob("*.py")) for hit in _private_imports(path)]
    assert found == []


def test_no_snapviz_module_imports_the_removed_json_kernel() -> None:
    gone = ("json_kernel", "trace_kernel", "trace_kernel_fields")
    for path in (ROOT / "snapviz").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not any(f"import {g}" in text or f".{g} import" in text for g in gone), path
