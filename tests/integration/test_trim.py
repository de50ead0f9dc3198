"""``snapviz trim`` on real snapshots: the trimmed file replays its window exactly."""

from __future__ import annotations

import io
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paths import ROOT
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.summary import analyze_run
from snapviz.analyses.trim import Window, trim_snapshot, window_from_stage, window_from_times, window_from_top
from snapviz.cli.trim import encode_snapshot
from snapviz.load import load
from snapviz.load.snapshot.safe_pickle import safe_load_pickle
from snapviz.model import A_ALLOC

SAMPLES = ROOT / "sample_snapshots"
EXTERNAL = ROOT.parent / "shared" / "external"


def _original(path: Path) -> tuple[Any, dict[str, Any]]:
    snap_file = path / "snapshot.pickle.xz" if path.is_dir() else path
    return analyze_run(load(str(path))), safe_load_pickle(str(snap_file))


@pytest.fixture(scope="module", params=["sd15-fp16-classic", "sd15-fp16-classic-expandable", "sdxl-fp16-vae-tiling"])
def original(request: pytest.FixtureRequest) -> tuple[Any, dict[str, Any]]:
    return _original(SAMPLES / request.param)


def _windows(an: Any) -> list[Window]:
    t = an.replay.events["time_us"].to_numpy()
    span = (t[-1] - t[0]) / 1e6
    return [
        window_from_stage(an, "vae_decode"),
        window_from_stage(an, "denoise"),
        window_from_times(an, f"{span / 3:.3f}:{2 * span / 3:.3f}"),
    ]


def _assert_window_replays_exactly(an: Any, trimmed_path: Path, w: Window) -> Any:
    """Replay of the trimmed file (read back through snapviz's restricted loader) == the window."""
    run = load(str(trimmed_path))
    assert run.snapshot is not None
    rep = replay_allocator(run.snapshot, an.device)
    a = an.replay.events["allocated"].to_numpy()
    r = an.replay.events["reserved"].to_numpy()
    assert len(rep.events) == w.last - w.first + 1
    assert np.array_equal(rep.events["allocated"].to_numpy(), a[w.first : w.last + 1])
    assert np.array_equal(rep.events["reserved"].to_numpy(), r[w.first : w.last + 1])
    before = int(a[w.first - 1]) if w.first else an.replay.baseline_allocated
    assert rep.peak_allocated == max(before, int(a[w.first : w.last + 1].max()))
    assert rep.end_state_matches is not False
    return run


def test_trimmed_windows_replay_like_the_original(original: Any, tmp_path: Path) -> None:
    an, raw = original
    for k, w in enumerate(_windows(an)):
        out = tmp_path / f"w{k}.pickle"
        out.write_bytes(encode_snapshot(trim_snapshot(raw, an, w), str(out)))
        run = _assert_window_replays_exactly(an, out, w)
        # frames kept: every allocation names the same source line as in the original
        ev, orig = run.snapshot.events, an.replay.events
        rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
        assert rows.size and all(
            run.snapshot.stack(int(ev["stack_id"].iat[i]))
            == an.run.snapshot.stack(int(orig["stack_id"].iat[w.first + i]))
            for i in rows[:200]
        )


def test_peak_window_holds_the_allocator_exact_peak(original: Any, tmp_path: Path) -> None:
    """--stage of the peak's stage, and --top: the trimmed file alone reproduces max_memory_allocated."""
    an, raw = original
    truth = an.run.run_json["allocator"]["max_memory_allocated"]
    for w in (window_from_stage(an, an.peak_stage), window_from_top(an, 3)):
        out = tmp_path / "peak.pickle.xz"
        data = encode_snapshot(trim_snapshot(raw, an, w), str(out))
        out.write_bytes(data)
        assert analyze_run(load(str(out))).replay.peak_allocated == truth


def test_trimmed_file_is_plain_builtins_and_smaller(original: Any) -> None:
    an, raw = original
    w = window_from_stage(an, "denoise/1")
    data = encode_snapshot(trim_snapshot(raw, an, w), "x.pickle")
    ops = {op.name for op, _, _ in pickletools.genops(io.BytesIO(data))}
    assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "PERSID", "BINPERSID"}
    assert data[:2] == b"\x80\x04"
    # the size follows the share of the history kept (the end state adds a little)
    kept = (w.last - w.first + 1) / len(an.replay.events)
    assert len(data) / len(pickle.dumps(raw, protocol=4)) < kept + 0.1


def test_pytorch_memory_viz_reads_it(original: Any) -> None:
    mv = pytest.importorskip("torch.cuda._memory_viz")
    an, raw = original
    data = pickle.loads(encode_snapshot(trim_snapshot(raw, an, window_from_stage(an, "denoise/1")), "x.pickle"))
    n = len(data["device_traces"][an.device])
    assert mv.trace(data).splitlines()[1] == f"{n} entries"
    assert "segments" in mv.segsum(data).splitlines()[0] or mv.segsum(data)
    assert "snapshot.pickle" in mv.trace_plot(data) and "snapshot.pickle" in mv.segment_plot(data)


def test_external_training_snapshot_with_cpp_frames(tmp_path: Path) -> None:
    src = EXTERNAL / "cs336_kk_ctx128_fullstep.pickle"
    if not src.exists():
        pytest.skip("shared/external corpus not present")
    an, raw = _original(src)
    n = len(an.replay.events)
    w = Window(n // 3, 2 * n // 3, "middle third")
    out = tmp_path / "cs336.pickle"
    out.write_bytes(encode_snapshot(trim_snapshot(raw, an, w), str(out)))
    _assert_window_replays_exactly(an, out, w)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", "trim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "step1.pickle.xz"
    r = _cli(str(SAMPLES / "sd15-fp16-classic"), "--stage", "denoise/1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "kept entries 6,972–11,087 of 20,220" in r.stdout and "3.10 GiB" in r.stdout
    assert analyze_run(load(str(out))).replay.peak_allocated == 3324129280  # README: the run's peak is in denoise/1
    bad = [
        (["--stage", "denoise/1", "--top", "3"], "exactly one of"),
        (["--stage", "denoise/9"], "no such stage"),
        (["--window", "abc"], "expected T0:T1"),
        (["--window", "900:901"], "no event in it"),
    ]
    for args, msg in bad:
        r = _cli(str(SAMPLES / "sd15-fp16-classic"), *args, "-o", str(tmp_path / "x.pickle"))
        assert r.returncode == 2 and msg in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
        assert not (tmp_path / "x.pickle").exists()
    src = tmp_path / "in.pickle"
    src.write_bytes((SAMPLES / "sd15-fp16-sdpa" / "snapshot.pickle.xz").read_bytes())
    r = _cli(str(src), "--top", "2", "-o", str(src))
    assert r.returncode == 2 and "is an input" in r.stderr
