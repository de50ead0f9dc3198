"""The bulk stack interning (``StackInterner.stack_ids``) against one ``stack_id`` call per list:
same ids, same stack table, same frame table, on real samples and on adversarial lists."""

from __future__ import annotations

import random
from itertools import repeat
from typing import Any

import pytest

from paths import SAMPLES
from snapviz.load.snapshot.columns import StackInterner, _factorize
from snapviz.load.snapshot.safe_pickle import safe_load_pickle


def _one_by_one(lists: list) -> tuple[list[int], StackInterner]:
    it = StackInterner()
    return [it.stack_id(fl) for fl in lists], it


def _bulk(lists: list) -> tuple[list[int], StackInterner]:
    it = StackInterner()
    return it.stack_ids(lists), it


def _assert_same(lists: list) -> None:
    (a, ia), (b, ib) = _bulk(lists), _one_by_one(lists)
    assert a == b
    assert ia.stacks == ib.stacks
    assert ia.frame_rows == ib.frame_rows


@pytest.mark.parametrize("sample", ["sdxl-fp16", "train-sd15-amp-fp16"])
def test_bulk_equals_one_by_one_on_samples(sample: str) -> None:
    path = SAMPLES / sample / "snapshot.pickle.xz"
    if not path.exists():
        pytest.skip(f"{sample} not bundled")
    entries = [e for t in safe_load_pickle(path)["device_traces"] for e in t]
    _, lists = _factorize(list(map(dict.get, entries, repeat("frames"))))
    # torch writes a list per entry: copies make every list distinct, as in a long history
    lists = [list(fl) if type(fl) is list else fl for fl in lists for _ in range(2)]
    assert len(lists) > 1000
    _assert_same(lists)


def test_bulk_equals_one_by_one_on_adversarial_lists() -> None:
    rng = random.Random(7)
    plain = [{"name": f"f{i}", "filename": f"m{i % 3}.py", "line": i} for i in range(12)]
    twins = [dict(f) for f in plain]  # equal values, other objects
    odd = [
        {"name": 1, "filename": "x.py", "line": 2},
        {"name": 1.0, "filename": "x.py", "line": 2},  # == the one above, another name as text
        {"name": True, "filename": "x.py", "line": 2.0},
        "not a frame",
        {"filename": "y.py"},
    ]
    pool = plain + twins + odd
    lists: list = []
    heads: list[list[Any]] = [plain[:4], twins[:4], odd[:2], []]
    for _ in range(3000):
        k = rng.choice([0, 1, 2, 4, 5, 8, 9])
        head = rng.choice(heads)
        lists.append(head + [rng.choice(pool) for _ in range(k)])
    lists += [None, [], "text", (plain[0],)]
    rng.shuffle(lists)
    _assert_same(lists)
    # numeric names that compare equal must still be told apart by their text
    ids, it = _bulk([[odd[0]], [odd[1]], [odd[2]]] * 3)
    names = [it.frame_rows[it.stacks[s][0]][0] for s in ids[:3]]
    assert names == ["1", "1.0", "True"]
