"""A CPU rehearsal (``collect --device cpu``: a run.json and a profiler trace with CPU ``[memory]``
events only) says what it measured in every sink: not "GPU memory", no reserved figure, and no
claim about memory allocated before profiling began (issue 21: titled "GPU MEMORY REPORT", with
"0 bytes were already allocated" although the weights were loaded before the profiler started)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from snapviz.cli import cli
from snapviz.render.fmt import CPU_REHEARSAL

T0 = 1_796_000_000_000_000  # absolute Unix µs


def _mem(ts: float, nbytes: int, total: int, addr: int) -> dict:
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": T0 + ts,
        "args": {
            "Total Reserved": 0,
            "Total Allocated": total,
            "Bytes": nbytes,
            "Device Id": -1,
            "Device Type": 0,
            "Addr": addr,
        },
    }


def _cpu_run(d: Path) -> Path:
    d.mkdir()
    stages = [("load", 0, 100), ("text_encode", 100, 200), ("denoise/0", 200, 300), ("vae_decode", 300, 400)]
    events = [
        {"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": T0 + a, "dur": b - a}
        for n, a, b in stages
    ]
    total = 0
    for k, (n, a, _) in enumerate(stages[1:]):
        size = 4096 << k
        total += size
        events.append(_mem(a + 10, size, total, 0x1000 * (k + 1)))
    (d / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (d / "run.json").write_text(
        json.dumps(
            {
                "schema": "snapviz.run/1",
                "pipeline": "sd15",
                "size": "tiny",
                "techniques": ["fp32"],
                "device": "cpu",
                "device_name": "x86_64",
                "dtype": "fp32",
                "steps": 1,
                "batch": 1,
                "height": 64,
                "width": 64,
                "allocator": {"max_memory_allocated": None, "max_memory_reserved": None},
                "stages": [
                    {"name": n, "start_us": T0 + a, "end_us": T0 + b, "rss_peak_bytes": 400 << 20} for n, a, b in stages
                ],
            }
        )
    )
    return d


def test_a_cpu_rehearsal_is_titled_for_what_it_measured(tmp_path: Path) -> None:
    run = _cpu_run(tmp_path / "run")
    md, js, page = tmp_path / "r.md", tmp_path / "r.json", tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["analyze", str(run), "--markdown", str(md), "--json", str(js), "-o", str(page)])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(js.read_text())
    text = {"terminal": res.stdout, "markdown": md.read_text(), "html": page.read_text()}
    for sink, t in text.items():
        assert CPU_REHEARSAL in t, sink
        assert "GPU memory report" not in t and "GPU memory:" not in t, sink
        assert "0 bytes were already allocated" not in t, sink
    assert text["markdown"].startswith(f"### {CPU_REHEARSAL}: ")
    assert "peak reserved  not recorded" in res.stdout
    assert doc["peak"]["reserved_bytes"] is None and doc["history"]["baseline_allocated_bytes"] is None
    assert doc["peak"]["allocated_bytes"] == 4096 + 8192 + 16384
    assert "is not known" in doc["top_allocations_note"]
    assert any("memory allocated before it" in w for w in doc["warnings"])


def test_a_gpu_run_and_a_cpu_run_are_shown_but_not_compared(tmp_path: Path) -> None:
    """Issue 21: a CUDA snapshot compared with a CPU-only run gave "−100.0%" without a word."""
    from paths import ROOT

    cpu = _cpu_run(tmp_path / "cpu")
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    res = CliRunner().invoke(
        cli,
        [
            "compare",
            str(ROOT / "sample_snapshots" / "sd15-fp16-sdpa"),
            str(cpu),
            "--markdown",
            str(md),
            "--json",
            str(js),
            "-j",
            "1",
        ],
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(js.read_text())
    other = doc["runs"][1]
    assert [r["memory_kind"] for r in doc["runs"]] == ["CUDA GPU memory", "CPU memory"]
    assert other["delta_ratio"] is None and "not compared" in other["verdict"] and "CPU memory" in other["verdict"]
    assert all(s["delta_ratio"][1] is None for s in doc["stages"])
    text = md.read_text()
    assert "%" not in text.split("Peak allocated per stage")[0].split("\n", 3)[3]  # the runs table: no percentage
    assert "-100.0%" not in text and "−100.0%" not in text and "not compared" in text
    assert text.startswith("### Memory of different kinds (CUDA GPU memory, CPU memory) comparison")


def test_two_traces_compare_with_their_timelines(tmp_path: Path) -> None:
    """Issue 21: comparing two traces drew a PNG without lines and an HTML page without a timeline:
    a trace's digest had no timeline. Each trace's memory events are now placed in their stages."""
    import snapviz
    from snapviz.render.picture import compare_picture_data

    a, b = _cpu_run(tmp_path / "a"), _cpu_run(tmp_path / "b")
    cmp = snapviz.compare(str(a), str(b))
    assert set(cmp.timeline["run"]) == {0, 1} and cmp.timeline["x"].notna().all()
    d = compare_picture_data(cmp, cmp.document())
    assert all(len(r["x"]) and r["allocated"].max() == 4096 + 8192 + 16384 for r in d["runs"])
    assert "different kinds" not in cmp.summary()["runs"][1]["verdict"]
