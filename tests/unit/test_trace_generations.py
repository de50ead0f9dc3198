"""Profiler traces of every generation and device, as small hand-made files.

What no real file in the corpus shows: every ``Device Type`` torch emits (c10::DeviceType:
XPU 12, MPS 13, MTIA 19, PrivateUse1 20, …), ``Bytes``-only events whose running sum goes
below zero (memory freed that the trace never saw allocated), and traces without memory
events. Figures are computed here from the events written, not from snapviz.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from placeholders import placeholder_lines, placeholder_strings
from snapviz.cli import main

T0 = 1_700_000_000_000_000
MiB = 1 << 20


def _mem(
    ts: int,
    dtype: int,
    did: int,
    nbytes: int,
    total: int | None = None,
    reserved: int | None = None,
    addr: int | None = None,
) -> dict[str, Any]:
    args: dict[str, Any] = {"Device Type": dtype, "Device Id": did, "Bytes": nbytes}
    if total is not None:
        args.update({"Total Allocated": total, "Total Reserved": reserved, "Addr": addr})
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": T0 + ts, "args": args}


def _exact_events(dtype: int, did: int, sizes: list[int]) -> list[dict[str, Any]]:
    """Alloc/free events with totals: sizes > 0 allocate a new address, < 0 free the last one."""
    out: list[dict[str, Any]] = []
    total = 0
    live: list[int] = []
    for k, n in enumerate(sizes):
        addr = live.pop() if n < 0 else 0x7F00_0000_0000 + k * (1 << 30)
        if n > 0:
            live.append(addr)
        total += n
        out.append(_mem(10 * k, dtype, did, n, total, 2 * max(total, 1), addr))
    return out


def _write(tmp_path: Path, events: list[dict[str, Any]], name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return p


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    out, err = capsys.readouterr()
    return int(ei.value.code or 0), out, err


def _analyze(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict[str, Any], str, str]:
    """(JSON summary, Markdown, terminal text) of one CLI run that must succeed quietly."""
    md = path.with_suffix(".md")
    js = path.with_suffix(".summary.json")
    rc, out, err = _run(["analyze", str(path), "--json", str(js), "--markdown", str(md), *extra], capsys)
    assert rc == 0 and err == "", err
    doc = json.loads(js.read_text())
    for text in (out, md.read_text()):
        assert not placeholder_lines(text), text
    assert not placeholder_strings(doc), placeholder_strings(doc)
    return doc, md.read_text(), out


# c10::DeviceType -> (torch's device name, a word the user knows the memory by)
ACCELERATORS = {
    1: ("cuda", "CUDA"),
    6: ("hip", "ROCm"),
    12: ("xpu", "XPU"),
    13: ("mps", "MPS"),
    19: ("mtia", "MTIA"),
    20: ("privateuseone", "PrivateUse1"),
}


@pytest.mark.parametrize("dtype", sorted(ACCELERATORS), ids=[v[0] for _, v in sorted(ACCELERATORS.items())])
def test_every_accelerator_is_named_and_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int
) -> None:
    sizes = [4 * MiB, 8 * MiB, -8 * MiB, 2 * MiB]
    events = _exact_events(dtype, 0, sizes) + _exact_events(0, -1, [1 * MiB])
    doc, md, term = _analyze(_write(tmp_path, events), capsys)
    name, word = ACCELERATORS[dtype]
    assert doc["device"] == f"{name}:0"
    assert word in doc["device_kind"] and word in md and "CPU memory" not in md
    assert doc["peak"]["allocated_bytes"] == 12 * MiB and doc["peak"]["exact"] is True
    assert {d["device"] for d in doc["devices"]} == {f"{name}:0", "cpu"}


def test_device_flag_on_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As for snapshots: --device N analyses accelerator N, an unknown N exits 2 naming those there."""
    events = _exact_events(1, 0, [4 * MiB]) + _exact_events(1, 1, [16 * MiB]) + _exact_events(0, -1, [MiB])
    path = _write(tmp_path, events)
    doc, _, _ = _analyze(path, capsys)
    assert doc["device"] == "cuda:1" and doc["peak"]["allocated_bytes"] == 16 * MiB  # default: highest peak
    assert any("--device" in w for w in doc["warnings"])
    doc, _, _ = _analyze(path, capsys, "--device", "0")
    assert doc["device"] == "cuda:0" and doc["peak"]["allocated_bytes"] == 4 * MiB
    rc, out, err = _run(["analyze", str(path), "--device", "3", "--json", str(tmp_path / "x.json")], capsys)
    assert rc == 2 and err.count("\n") == 1 and not (tmp_path / "x.json").exists()
    assert "no device 3" in err and "cuda:0, cuda:1, cpu" in err


def test_cpu_only_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, md, _ = _analyze(_write(tmp_path, _exact_events(0, -1, [MiB, 3 * MiB, -3 * MiB])), capsys)
    assert doc["device"] == "cpu" and doc["peak"]["allocated_bytes"] == 4 * MiB
    assert md.startswith("### CPU memory")


def test_bytes_only_trace_is_a_lower_bound_never_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch ~1.9: Bytes only. The trace frees 6 MiB it never saw allocated, so at least 6 MiB
    existed before it; the running sum peaks 2 MiB above the start: at least 8 MiB at the peak."""
    sizes = [2 * MiB, -6 * MiB, 5 * MiB, 1 * MiB, -3 * MiB]
    events = [_mem(10 * k, 1, 0, n) for k, n in enumerate(sizes)]
    doc, md, term = _analyze(_write(tmp_path, events), capsys)
    running = [sum(sizes[: k + 1]) for k in range(len(sizes))]
    floor = -min(0, *running)
    assert floor == 4 * MiB
    assert doc["peak"]["allocated_bytes"] == max(running) + floor == 6 * MiB
    assert doc["peak"]["exact"] is False and doc["peak"]["reserved_bytes"] is None
    assert doc["history"]["baseline_allocated_bytes"] == floor and doc["history"]["baseline_exact"] is False
    assert "at least 6.00 MiB" in term and "at least 6.00 MiB" in md
    assert any("lower bound" in w and "4,194,304" in w for w in doc["warnings"])
    assert any("no addresses" in w for w in doc["warnings"]) and doc["top_allocations"] == []


def test_trace_without_memory_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stages but no [memory] events: no NumPy warning, no zero peaks presented as measured."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 1, "tid": 1, "ts": T0, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": T0 + 1, "dur": 5},
    ]
    path = _write(tmp_path, events)
    html = tmp_path / "r.html"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning here used to reach stderr
        doc, md, term = _analyze(path, capsys, "-o", str(html))
    assert html.stat().st_size > 0
    assert doc["device"] is None and doc["peak"]["event_index"] is None
    assert doc["stages"][0]["peak_allocated_bytes"] is None
    assert "not recorded" in term and "not recorded" in md
    assert any("no [memory] events" in w for w in doc["warnings"])
    assert not any("keys after traceEvents" in w for w in doc["warnings"])  # traceEvents was the last key


@pytest.mark.parametrize("dtype, label", [(9, "xla:0"), (15, "hpu:0"), (99, "device-type-99:0")])
def test_other_device_types_keep_torchs_name_or_their_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: int, label: str
) -> None:
    doc, _, _ = _analyze(_write(tmp_path, _exact_events(dtype, 0, [MiB])), capsys)
    assert doc["device"] == label and doc["peak"]["allocated_bytes"] == MiB


def test_compare_accepts_traces_with_missing_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stage peaks a trace does not hold (null) must not break compare."""
    empty = _write(
        tmp_path,
        [{"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 1, "tid": 1, "ts": T0, "dur": 50}],
        name="empty.json",
    )
    old = _write(tmp_path, [_mem(10 * k, 1, 0, n) for k, n in enumerate([MiB, 2 * MiB])], name="old.json")
    rc, out, err = _run(["compare", str(empty), str(old), "--json", "-"], capsys)
    assert rc == 0, err
    assert json.loads(out)["runs"][1]["peak"]["allocated_bytes"] == 3 * MiB
