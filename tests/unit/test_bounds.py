"""Issue 26 item 3: bounds on what an input makes snapviz build, the same on every path.

* Rows repeated by shared references (8 devices holding one trace list, one entry a million
  times, one segment's blocks, one annotation): the unpickled dicts' reader and the compiled
  tape's reader count them alike and stop at SNAPVIZ_MAX_INPUT_SHARED_ROWS, with the same
  hostile files (tests/support/hostile.py).
* The object limit: the exact scan and the compiled grammar check stop at the same count.
* Stage labels and intervals past SNAPVIZ_MAX_INPUT_STAGES / _STAGE_INTERVALS are grouped as
  'other stages' and said in every output's warnings; traces' ranges too.
* The interval algorithms that replaced per-range loops give the loops' results.
The end-to-end measurements (RSS, time, input unchanged) are in test_hostile_load.py.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

import hostile
from snapviz.analyses.stages import OTHER_STAGES, annotation_intervals, bound_labels, label_by_intervals
from snapviz.load.limits import ENV, LimitExceeded, Limits
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.load.snapshot.columns import FRAMES_BEYOND, StackInterner, frames_note
from snapviz.load.snapshot.pickle_scan import scan_pickle
from snapviz.model import Snapshot

numba = pytest.importorskip("numba")

from snapviz.load.snapshot.columnar import columnar_snapshot  # noqa: E402
from snapviz.load.snapshot.pickle_scan_fast import fast_scan_compiled  # noqa: E402


def _tape_path(data: bytes) -> Any:
    finish = columnar_snapshot(data, "f.pickle")
    assert finish is not None, "the tape runs plain-data pickles"
    return finish()


def _dict_path(data: bytes) -> Any:
    return snapshot_from_dict(pickle.loads(data), "f.pickle")


@pytest.mark.parametrize("name", sorted(hostile.shared_row_pickles(100)))
def test_both_pickle_readers_bound_shared_rows_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = hostile.shared_row_pickles(2_000)[name]
    monkeypatch.setenv(ENV["shared_rows"], "500")
    for read in (_dict_path, _tape_path):
        with pytest.raises(LimitExceeded) as info:
            read(data)
        assert info.value.limit_name == "shared_rows", read
        assert "SNAPVIZ_MAX_INPUT_SHARED_ROWS" in str(info.value) and "\n" not in str(info.value)
    # raised over the repeats, the file loads, the same on both paths (every reference a row)
    monkeypatch.setenv(ENV["shared_rows"], "100000")
    a, b = _dict_path(data), _tape_path(data)
    assert b is not None, "this shape stays on the tape"
    assert len(a.events) == len(b.events) and len(a.blocks) == len(b.blocks)
    assert len(a.annotations) == len(b.annotations) and len(a.segments) == len(b.segments)
    assert len(a.events) + len(a.blocks) + len(a.annotations) >= 2_000  # the repeats are rows


def test_distinct_rows_are_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain trace of distinct entries passes a zero limit on both paths."""
    monkeypatch.setenv(ENV["shared_rows"], "0")
    data = pickle.dumps(
        {
            "segments": [hostile._segment([hostile._block(i) for i in range(5)])],
            "device_traces": [hostile._trace(500), hostile._trace(300)],
        },
        protocol=4,
    )
    a, b = _dict_path(data), _tape_path(data)
    assert len(a.events) == len(b.events) == 1_600


@pytest.mark.parametrize("token", [b"}", b"]"])
def test_object_limit_is_the_same_on_the_exact_and_compiled_scans(token: bytes) -> None:
    data = hostile.empty_containers(token, 5_000)
    lim = Limits(objects=4_000)
    errors = []
    for scan in (
        lambda d, li: scan_pickle(d, "f.pickle", li, exact=True),
        lambda d, li: fast_scan_compiled(d, "f.pickle", li),
    ):
        with pytest.raises(LimitExceeded) as info:
            scan(data, lim)
        errors.append(str(info.value))
        assert info.value.limit_name == "objects"
    assert errors[0] == errors[1]
    assert fast_scan_compiled(data, "f.pickle", Limits(objects=5_001))  # 5,000 + the list: within
    scan_pickle(data, "f.pickle", Limits(objects=5_001), exact=True)


def test_default_object_limit_holds_the_largest_real_snapshot_tenfold() -> None:
    """The default (30M) was lowered from 400M so that unpickled objects stay under ~2.2 GiB;
    real snapshots make ~8 objects per trace entry (458k for the 59k-event pixart sample)."""
    assert Limits().objects == 30_000_000 and Limits().shared_rows == 10_000


# ----------------------------------------------------------------------------- stage bounds


def test_bound_labels_groups_the_excess_and_says_so() -> None:
    labels = np.array([f"s{i // 3}" for i in range(3_000)], dtype=object)  # 1,000 labels, 3 events each
    got, notes = bound_labels(labels, Limits(stages=100, stage_intervals=10_000))
    assert len(notes) == 1 and "1,000 distinct stage labels" in notes[0] and "900 more grouped" in notes[0]
    assert ENV["stages"] in notes[0] and len(notes[0]) < 300  # whole in every output (texts are clipped at 300)
    assert list(pd.unique(got))[:100] == [f"s{i}" for i in range(100)] and set(got[300:]) == {OTHER_STAGES}
    # alternating labels: few names, many intervals
    alt = np.array(["a", "b"] * 500, dtype=object)
    got, notes = bound_labels(alt, Limits(stages=100, stage_intervals=50))
    runs = 1 + int((got[1:] != got[:-1]).sum())
    assert runs == 50 and len(notes) == 1 and ENV["stage_intervals"] in notes[0] and len(notes[0]) < 300
    assert list(got[:49]) == list(alt[:49]) and set(got[49:]) == {OTHER_STAGES}
    same, none = bound_labels(alt[:40], Limits(stages=100, stage_intervals=50))
    assert none == [] and (same == alt[:40]).all()


def _many_stages_snapshot(n: int) -> dict[str, Any]:
    ev = []
    for i in range(n):
        meta = f"stage{i}"
        a = (1 << 20) + 512 * i
        ev.append(hostile._entry(addr=a, time_us=2 * i, user_metadata=meta, frames=[]))
        ev.append(hostile._entry(addr=a, time_us=2 * i + 1, user_metadata=meta, frames=[], action="free_completed"))
    return {"segments": [], "device_traces": [ev]}


def test_stage_limit_is_said_in_every_output(tmp_path: Path) -> None:
    src = tmp_path / "many.pickle"
    src.write_bytes(pickle.dumps(_many_stages_snapshot(300), protocol=4))
    before = hostile.digest(src)
    env = {ENV["stages"]: "20", ENV["stage_intervals"]: "1000"}
    res = hostile.run_analyze(src, "--markdown", str(tmp_path / "r.md"), env=env)
    assert res.rc == 0, res.stderr
    assert hostile.digest(src) == before
    md = (tmp_path / "r.md").read_text()
    assert "300 distinct stage labels" in md and f"'{OTHER_STAGES}'" in md and ENV["stages"] in md


def test_stage_limit_in_json_and_terminal(tmp_path: Path) -> None:
    src = tmp_path / "many.pickle"
    src.write_bytes(pickle.dumps(_many_stages_snapshot(300), protocol=4))
    env = {**__import__("os").environ, "PYTHONPATH": str(hostile.ROOT), ENV["stages"]: "20"}
    out = tmp_path / "s.json"
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(src), "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    note = [w for w in doc["warnings"] if ENV["stages"] in w]
    assert len(note) == 1 and "280 more grouped" in note[0]
    names = {iv["name"] for g in doc["stages"] for iv in g["intervals"]}
    assert len(names) == 21 and OTHER_STAGES in names
    assert "280 more grouped" in p.stdout + p.stderr  # the terminal report shows the warning


def test_trace_ranges_are_bounded(tmp_path: Path) -> None:
    ev = []
    for i in range(400):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"r{i}x", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5})
        ev.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": 10 * i + 1,
                "args": {
                    "Addr": 1 << 20,
                    "Bytes": 512 if i % 2 == 0 else -512,
                    "Total Allocated": 512 if i % 2 == 0 else 0,
                    "Total Reserved": 2097152,
                    "Device Id": 0,
                    "Device Type": 1,
                },
            }
        )
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"traceEvents": ev}))
    env = {
        **__import__("os").environ,
        "PYTHONPATH": str(hostile.ROOT),
        ENV["stages"]: "30",
        ENV["stage_intervals"]: "50",
    }
    out = tmp_path / "s.json"
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(src), "--json", str(out), "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    note = " ".join(w for w in doc["warnings"] if ENV["stage_intervals"] in w)
    assert "400 stage ranges" in note and "other stages" in note
    # 400 distinct names over range_labels' cap (10 x 30): the rest skip its regexes, and that is said too
    assert any("range names past the first 300" in w for w in doc["warnings"])
    names = {iv["name"] for g in doc["stages"] for iv in g.get("intervals", [g])}
    assert len(names) <= 31 and OTHER_STAGES in names


# ----------------------------------------------------------------------------- the interval algorithms


def _painted(times: np.ndarray, iv: pd.DataFrame, default: str) -> np.ndarray:
    """The painting label_by_intervals replaced (the reference): in start order, on equal starts
    the longer (outer) one first, then row order; later paint wins."""
    labels = np.full(len(times), default, dtype=object)
    order = np.lexsort((np.arange(len(iv)), -iv["end_us"].to_numpy().astype(np.float64), iv["start_us"].to_numpy()))
    s = iv.iloc[order]
    for name, a, b in zip(s["name"].tolist(), s["start_us"].to_numpy(), s["end_us"].to_numpy(), strict=True):
        labels[np.searchsorted(times, a, "left") : np.searchsorted(times, b, "right")] = name
    return labels


def _paired(ann: pd.DataFrame) -> pd.DataFrame:
    """The loop annotation_intervals replaced (the reference)."""
    rows, open_ = [], {}  # type: ignore[var-annotated]
    for t, name, stage in zip(ann["time_us"].tolist(), ann["name"].tolist(), ann["stage"].tolist(), strict=True):
        if stage == "START":
            open_.setdefault(name, []).append(t)
        elif stage == "END" and open_.get(name):
            rows.append((name, open_[name].pop(), t))
    out = pd.DataFrame(rows, columns=["name", "start_us", "end_us"])
    return out.sort_values(["start_us", "end_us"], ascending=[True, False]).reset_index(drop=True)


def test_interval_algorithms_equal_their_loops() -> None:
    rng = np.random.default_rng(26)
    for _ in range(1_500):
        n, m = int(rng.integers(0, 30)), int(rng.integers(0, 12))
        times = np.sort(rng.integers(0, 40, n))
        s = rng.integers(0, 40, m)
        iv = pd.DataFrame({"name": [f"n{i}" for i in range(m)], "start_us": s, "end_us": s + rng.integers(-2, 20, m)})
        assert (label_by_intervals(times, iv, "u") == _painted(times, iv, "u")).all()
        k = int(rng.integers(0, 25))
        ann = pd.DataFrame(
            {
                "device": 0,
                "time_us": rng.integers(0, 15, k),
                "name": rng.choice(["a", "b", "c"], k),
                "stage": rng.choice(["START", "END", "X"], k, p=[0.45, 0.45, 0.1]),
            }
        )
        snap = cast("Snapshot", SimpleNamespace(annotations=ann))  # annotation_intervals reads .annotations only
        assert annotation_intervals(snap).values.tolist() == _paired(ann).values.tolist()


def test_nested_ranges_are_not_quadratic() -> None:
    """200,000 ranges nested in one another over 400,000 times: painting wrote 4e10 labels."""
    import time

    n = 200_000
    iv = pd.DataFrame(
        {"name": [f"r{i}" for i in range(n)], "start_us": np.arange(n), "end_us": 2 * n - 1 - np.arange(n)}
    )
    t0 = time.process_time()
    got = label_by_intervals(np.arange(2 * n), iv)
    assert time.process_time() - t0 < 10
    assert got[0] == "r0" and got[n - 1] == got[n] == f"r{n - 1}" and got[-1] == "r0"


# ----------------------------------------------------------------------------- frame bound


@pytest.mark.parametrize("vary", ["line", "name"])
def test_both_pickle_readers_group_frames_past_the_bound(vary: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct frames past SNAPVIZ_MAX_INPUT_FRAMES are one '<frames beyond limit>' frame, the
    same on the unpickled dicts' reader and the compiled tape's, and said in the notes. The bound
    falls inside entry 3's frame list (300 frames an entry): its first 100 frames keep theirs."""
    data = hostile.distinct_frames(5_000, per_entry=300, vary=vary)
    monkeypatch.setenv(ENV["frames"], "1000")
    snaps = [_dict_path(data), _tape_path(data)]
    for s in snaps:
        assert len(s.frames) == 1_001
        assert tuple(s.frames.iloc[-1][["name", "filename", "line"]]) == FRAMES_BEYOND
        assert s.frames["line"].tolist()[:1_000] == list(range(1_000))
        notes = [n for n in s.format_notes if ENV["frames"] in n]
        assert notes == [frames_note(1_000)] and "1,000 distinct stack frames" in notes[0] and len(notes[0]) < 300
        # entries 0-2 own stacks, entry 3 half and half, 4-15 all beyond (one stack), 16 a shorter one
        assert len(s.stacks) == 6
        assert s.stacks[int(s.events["stack_id"][3])] == (*range(900, 1_000), *[1_000] * 200)
    a, b = snaps
    pd.testing.assert_frame_equal(a.frames, b.frames)
    pd.testing.assert_frame_equal(a.stack_frames, b.stack_frames)
    assert a.stacks == b.stacks and (a.events["stack_id"].to_numpy() == b.events["stack_id"].to_numpy()).all()
    # raised to the file's count, every frame is its own and nothing is said
    monkeypatch.setenv(ENV["frames"], "5000")
    for read in (_dict_path, _tape_path):
        s = read(data)
        assert len(s.frames) == 5_000 and FRAMES_BEYOND[0] not in set(s.frames["name"])
        assert not [n for n in s.format_notes if ENV["frames"] in n]


def test_frames_past_the_bound_are_not_remembered_one_by_one() -> None:
    """Past the bound a new frame object is the one frame beyond it, whether or not it equals one
    interned (both readers look frames up by identity first; the tape does not make them), and
    anything but a frame dict is still skipped."""
    it = StackInterner(max_frames=2)
    f = [{"name": f"n{i}", "filename": "x.py", "line": i} for i in range(4)]
    same_as_f0 = dict(f[0])
    assert it.stack_id([f[0], f[1], 5, f[2], f[2], f[0]]) == 0
    assert it.stacks[0] == (0, 1, 2, 2, 0) and it.frame_rows[2] == FRAMES_BEYOND
    assert it.stack_id([f[3], same_as_f0]) == 1 and it.stacks[1] == (2, 2)
    assert sorted(it.frame_by_identity.values()) == [-1, 0, 1]  # the interned frames and the skipped 5 only


def test_frame_bound_is_said_in_json_markdown_and_terminal(tmp_path: Path) -> None:
    src = tmp_path / "frames.pickle"
    src.write_bytes(hostile.distinct_frames(3_000, per_entry=500))
    before = hostile.digest(src)
    env = {**__import__("os").environ, "PYTHONPATH": str(hostile.ROOT), ENV["frames"]: "1000"}
    out, md = tmp_path / "s.json", tmp_path / "r.md"
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", str(src), "--json", str(out), "--markdown", str(md)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert hostile.digest(src) == before
    assert [w for w in json.loads(out.read_text())["warnings"] if ENV["frames"] in w] == [frames_note(1_000)]
    assert "1,000 distinct stack frames" in md.read_text() and ENV["frames"] in md.read_text()
    assert "1,000 distinct stack frames" in p.stdout + p.stderr


def test_default_frame_bound_holds_the_largest_real_snapshot_tenfold() -> None:
    """3,295 distinct frames in the largest real file seen (mosaic's test output; the samples:
    at most 440); 50,000 is 15 times that, and at 50 µs a frame (~250 bytes) costs ~2.5 s."""
    assert Limits().frames == 50_000
