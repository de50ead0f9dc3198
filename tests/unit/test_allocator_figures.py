"""run.json's allocator figures are read for the device shown, never for another one."""

from __future__ import annotations

from typing import Any

import pytest

from snapviz.vocab import allocator_figures, run_summary_fields

TWO = {
    "allocator": {
        "device": 0,
        "max_memory_allocated": 100,
        "max_memory_reserved": 200,
        "devices": [
            {"device": 0, "max_memory_allocated": 100, "max_memory_reserved": 200},
            {"device": 1, "max_memory_allocated": 7, "max_memory_reserved": 9},
        ],
    }
}
ONE = {"allocator": {"device": 2, "max_memory_allocated": 5, "max_memory_reserved": 6}}
OLD = {"allocator": {"max_memory_allocated": 5, "max_memory_reserved": 6}}  # no device named: device 0


@pytest.mark.parametrize(
    "run, device, want",
    [
        (TWO, 0, (100, 200)),
        (TWO, 1, (7, 9)),
        (TWO, 3, (None, None)),  # no figures for device 3: not checked (not device 0's)
        (TWO, None, (100, 200)),  # the device run.json names
        (ONE, 2, (5, 6)),
        (ONE, 0, (None, None)),
        (OLD, 0, (5, 6)),
        (OLD, 1, (None, None)),
        ({"allocator": "junk"}, 0, (None, None)),
    ],
)
def test_allocator_figures(run: dict[str, Any], device: int | None, want: tuple[Any, Any]) -> None:
    got = allocator_figures(run, device)
    assert (got["max_memory_allocated"], got["max_memory_reserved"]) == want
    truth, _ = run_summary_fields(run, device)
    assert truth == got


def test_no_run_json() -> None:
    assert run_summary_fields(None, 1) == (None, None)
