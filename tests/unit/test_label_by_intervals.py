"""The one interval labeller (stages.label_by_intervals), used for snapshot events and trace
events alike: the cases of its two former call sites (a snapshot's sorted event times, a
trace's unsorted op times with a depth column) and its rule for "innermost"."""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.stages import label_by_intervals
from snapviz.analyses.trace_ops import annotation_stages


def _iv(*rows: tuple[str, float, float]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["name", "start_us", "end_us"])


def test_nested_ranges_inner_wins_bounds_inclusive() -> None:
    iv = _iv(("denoise", 10, 100), ("denoise/0", 10, 40), ("denoise/1", 40, 90))
    t = np.array([0, 10, 20, 40, 41, 90, 95, 100, 101])
    got = label_by_intervals(t, iv, default="x").tolist()
    # equal starts: the shorter one (inside the other) wins; a shared bound goes to the later start
    assert got == ["x", "denoise/0", "denoise/0", "denoise/1", "denoise/1", "denoise/1", "denoise", "denoise", "x"]


def test_row_order_does_not_decide_nesting() -> None:
    a = _iv(("outer", 0, 100), ("inner", 0, 50))
    b = _iv(("inner", 0, 50), ("outer", 0, 100))
    t = np.array([0, 25, 75])
    assert label_by_intervals(t, a).tolist() == label_by_intervals(t, b).tolist() == ["inner", "inner", "outer"]


def test_unsorted_times_match_sorted() -> None:
    rng = np.random.default_rng(7)
    iv = _iv(("a", 0, 50), ("b", 20, 30), ("c", 45, 80), ("d", 60, 61))
    t = rng.uniform(-5, 90, 500)
    s = np.sort(t)
    back = np.argsort(np.argsort(t, kind="stable"), kind="stable")
    assert label_by_intervals(t, iv, default="").tolist() == label_by_intervals(s, iv, default="")[back].tolist()
    # brute force: the containing interval with the latest start, then the earliest end
    for x, got in zip(t.tolist(), label_by_intervals(t, iv, default="").tolist(), strict=True):
        inside = [(s0, -e0, n) for n, s0, e0 in iv.itertuples(index=False) if s0 <= x <= e0]
        assert got == (max(inside)[2] if inside else "")


def test_overlap_without_nesting_latest_entered_wins() -> None:
    """Two threads' ranges overlapping: the one entered last, whatever the depth column says
    (the former trace labeller preferred the deeper one; the snapshot labeller the later start)."""
    iv = _iv(("x", 0, 100), ("y", 5, 60), ("y2", 6, 30), ("z", 25, 70)).assign(depth=[0, 1, 2, 1])
    assert label_by_intervals(np.array([28.0, 40.0, 65.0]), iv).tolist() == ["z", "z", "z"]


def test_empty_inputs() -> None:
    assert label_by_intervals(np.array([1, 2]), _iv(), default="u").tolist() == ["u", "u"]
    assert label_by_intervals(np.array([]), _iv(("a", 0, 1))).tolist() == []


def test_trace_stage_table_labels_as_before() -> None:
    """annotation_stages' table (with depth) labels op times innermost-first."""
    from types import SimpleNamespace

    ann = pd.DataFrame(
        {
            "name": pd.Categorical(["denoise", "denoise/0", "denoise/1", "vae_decode"]),
            "start_us": [0.0, 0.0, 50.0, 200.0],
            "end_us": [100.0, 50.0, 100.0, 300.0],
            "tid": [1, 1, 1, 1],
        }
    )
    ops = pd.DataFrame({"name": pd.Categorical([]), "start_us": [], "end_us": [], "tid": []})
    st = annotation_stages(SimpleNamespace(annotations=ann, ops=ops))  # type: ignore[arg-type]
    t = np.array([250.0, 10.0, 75.0, 150.0, 50.0])
    assert label_by_intervals(t, st, default="").tolist() == ["vae_decode", "denoise/0", "denoise/1", "", "denoise/1"]
