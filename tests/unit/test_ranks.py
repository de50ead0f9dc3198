"""``ranks`` and ``history`` on data: per-rank snapshots written by the oracle allocator
(tests/support/fleet_synth.py), digested through the engine, compared with the oracle's peaks."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import markupsafe
import pytest

import fleet_synth
from snapviz.analyses.document import from_json, to_json
from snapviz.analyses.fleet_document import RankAllocator, RanksDocument, StageDelta, load_history
from snapviz.analyses.history import WHOLE_RUN, analyse_history, history_document
from snapviz.analyses.ranks import FleetRow, analyse_ranks, ranks_document
from snapviz.cli.inputs import fleet_digest
from snapviz.engine import TaskFailed, run_tasks
from snapviz.errors import InputError
from snapviz.load.fleet import expand_inputs, iteration_from_path, rank_from_path
from snapviz.load.labels import unique_labels
from snapviz.render.fleet_md import (
    render_history_markdown,
    render_history_terminal,
    render_ranks_markdown,
    render_ranks_terminal,
)
from snapviz.render.html.fleet import heatmap_columns, render_history_html, render_ranks_html
from synth import MiB

ACTS = [10, 10, 12, 10, 30, 10, 11, 10]  # rank 4 holds 3x the activations: the planted outlier
LATE = 1_796_003_367_990_000  # rank 2 starts 10 ms after the others


def digest_rows(inputs: list[str], jobs: int = 1) -> list[FleetRow]:
    found = expand_inputs(inputs)
    labels = unique_labels([f.source for f in found], [])
    res = run_tasks(
        fleet_digest,
        [f.source for f in found],
        [(f.source, lab, "auto") for f, lab in zip(found, labels)],
        jobs=jobs,
        show_progress=False,
    )
    return [
        FleetRow(
            f.source,
            lab,
            f.rank,
            f.iteration,
            None if isinstance(r, TaskFailed) else r,
            r.reason if isinstance(r, TaskFailed) else None,
        )
        for f, lab, r in zip(found, labels, res)
    ]


@pytest.fixture(scope="module")
def titan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[fleet_synth.RankTruth]]:
    root = tmp_path_factory.mktemp("titan")
    # ranks 2 and 6 run on a small card and OOM; rank 6 first in time (rank 2 starts later)
    truth = fleet_synth.write_torchtitan(str(root), ACTS, capacity_of={2: 150 * MiB, 6: 150 * MiB}, start_of={2: LATE})
    return root, truth


@pytest.fixture(scope="module")
def titan_doc(titan: Any) -> RanksDocument:
    root, _ = titan
    return ranks_document(analyse_ranks(digest_rows([str(root)])))


def test_names_say_rank_and_iteration() -> None:
    p = "out/memory_snapshot/iteration_20/rank13_memory_snapshot.pickle"
    assert rank_from_path(p) == 13 and iteration_from_path(p) == 20
    assert rank_from_path("runs/rank_7/run.json") == 7 and rank_from_path("runs/job-rank-3") == 3
    assert rank_from_path("runs/frank2.pickle") is None  # a word ending in "rank" is not a rank
    assert iteration_from_path("a/step_5/b.pickle") == 5 and iteration_from_path("a/b.pickle") is None


def test_per_rank_table_equals_the_oracle(titan: Any, titan_doc: RanksDocument) -> None:
    _, truth = titan
    ranks = titan_doc.ranks
    assert [r.rank for r in ranks] == list(range(len(ACTS)))
    for r, t in zip(ranks, truth):
        assert r.status == "ok" and r.rank_from == "path" and r.iteration == 10
        assert r.peak.allocated_bytes == t.peak_allocated
        assert r.peak.reserved_bytes == t.peak_reserved
        assert ((r.oom.count or 0) > 0) == t.oom
        assert r.oom.first_time_us == t.oom_time_us


def test_outlier_imbalance_and_first_oom(titan: Any, titan_doc: RanksDocument) -> None:
    _, truth = titan
    (it,) = titan_doc.iterations
    peaks = sorted(t.peak_allocated for t in truth)
    worst = max(truth, key=lambda t: t.peak_allocated)
    assert it.max is not None and it.max.rank == worst.rank == 4
    median = (peaks[3] + peaks[4]) / 2
    assert it.imbalance == pytest.approx(worst.peak_allocated / median, abs=1e-4)
    assert 4 in [o.rank for o in it.outliers]
    assert not {0, 1, 3, 5, 7} & {o.rank for o in it.outliers}
    first = min((t for t in truth if t.oom), key=lambda t: t.oom_time_us)
    assert it.first_oom is not None and it.first_oom.rank == first.rank == 6
    assert sorted(it.oom_ranks) == ["rank 2", "rank 6"]
    # worst vs median: the forward stage holds the difference the workload planted (20 MiB a layer more)
    fwd = next(s for s in it.worst_vs_median if s.stage == "forward")
    assert fwd.delta_bytes == 4 * (ACTS[4] - 10) * MiB


def test_the_document_round_trips(titan_doc: RanksDocument) -> None:
    """The typed document is its JSON (``ranks --json``) read back: one type from builder to renderers."""
    assert from_json(json.loads(json.dumps(to_json(titan_doc))), RanksDocument) == titan_doc


def test_a_stage_only_one_rank_has(titan_doc: RanksDocument) -> None:
    """The worst rank has a stage the median rank lacks: no difference to state ("—"), in the
    Markdown and the page alike (the page used to fail on it)."""
    (it,) = titan_doc.iterations
    only = StageDelta(stage="warmup", worst_bytes=5 * MiB, median_bytes=None, delta_bytes=None)
    doc = replace(titan_doc, iterations=[replace(it, worst_vs_median=[*it.worst_vs_median, only])])
    assert "| `warmup` | 5.00 MiB | — | — |" in render_ranks_markdown(doc)
    assert "<td>warmup</td><td>5.00 MiB</td><td>n/a</td><td>—</td>" in render_ranks_html(doc).replace("\n", "")


def test_one_story_in_every_output(titan_doc: RanksDocument) -> None:
    md, term, html = render_ranks_markdown(titan_doc), render_ranks_terminal(titan_doc), render_ranks_html(titan_doc)
    assert len(md.splitlines()) <= 60
    for line in titan_doc.verdict:
        assert line in md and line in term
        assert str(markupsafe.escape(line)) in html or line in html
    cells = heatmap_columns(titan_doc)
    assert len(cells["stage"]) == sum(v is not None for r in titan_doc.ranks for v in r.stage_peak_allocated_bytes)
    assert max(cells["bytes"]) == max(max(v for v in r.stage_peak_allocated_bytes if v) for r in titan_doc.ranks)
    # the heatmap's rows of the ranks that ran out of memory (2 and 6) say so, the others do not
    oom_rows = sorted({y for y in cells["rank"] if y.endswith(" · OOM")})
    assert oom_rows == ["rank 2 · OOM", "rank 6 · OOM"]


def test_a_bad_file_is_one_row_not_the_end(tmp_path: Path, titan: Any) -> None:
    root, truth = titan
    bad = tmp_path / "rank9_memory_snapshot.pickle"
    bad.write_bytes(b"not a pickle at all")
    evil = tmp_path / "rank8_memory_snapshot.pickle"
    evil.write_bytes(pickle.dumps(os.system))  # a global: refused, never called
    doc = ranks_document(analyse_ranks(digest_rows([truth[0].path, truth[4].path, str(bad), str(evil)])))
    by_rank = {r.rank: r for r in doc.ranks}
    assert by_rank[0].status == by_rank[4].status == "ok"
    assert by_rank[8].status == by_rank[9].status == "failed"
    assert by_rank[8].reason and by_rank[9].reason and doc.failed == 2
    assert any("could be analysed (see the table)" in v or "could not be analysed" in v for v in doc.verdict)


def test_several_iterations_side_by_side(tmp_path: Path) -> None:
    fleet_synth.write_torchtitan(str(tmp_path), [10, 10, 10], iteration=10)
    fleet_synth.write_torchtitan(str(tmp_path), [10, 25, 10], iteration=20)
    doc = ranks_document(analyse_ranks(digest_rows([str(tmp_path / "memory_snapshot" / "iteration_*")])))
    assert [v.iteration for v in doc.iterations] == [10, 20]
    mx = doc.iterations[1].max
    assert mx is not None and mx.rank == 1 and doc.iterations[0].outliers == []
    assert [o.rank for o in doc.iterations[1].outliers] == [1]
    assert any(v.startswith("iteration 20: ") for v in doc.verdict)


def test_run_json_rank_wins_and_disagreement_is_said(tmp_path: Path) -> None:
    # run directories named rank_0.. but the runs say otherwise for one of them
    truth = fleet_synth.write_run_dirs(str(tmp_path), [10, 12, 10], extra={2: {"rank": 5}})
    doc = ranks_document(analyse_ranks(digest_rows([str(tmp_path)])))
    ranks = {r.rank: r for r in doc.ranks}
    assert sorted(r for r in ranks if r is not None) == [0, 1, 5]
    assert ranks[5].rank_from == "run.json" and "rank 2 by its path" in ranks[5].notes[0]
    # world size 3 stated by every run: rank 2 has no input (the run in rank_2/ says it is rank 5)
    assert doc.iterations[0].missing_ranks == [2]
    assert "world size 3: no input for rank(s) 2" in doc.verdict
    for t in truth[:2]:
        r = ranks[t.rank]
        assert r.world_size == 3 and r.allocator is not None
        assert r.allocator.max_memory_allocated == r.peak.allocated_bytes == t.peak_allocated


def test_per_rank_run_json_beside_each_snapshot(tmp_path: Path) -> None:
    # record_ddp_ranks.py's layout: rank<r>_memory_snapshot.pickle with rank<r>_run.json beside it
    truth = fleet_synth.write_torchtitan(str(tmp_path), [10, 16, 10, 10], iteration=4, sidecars=True)
    found = expand_inputs([str(tmp_path)])
    assert [f.source for f in found] == [t.path for t in truth]  # the sidecars are not inputs
    doc = ranks_document(analyse_ranks(digest_rows([str(tmp_path)])))
    for r, t in zip(doc.ranks, truth):
        assert r.rank == t.rank and r.rank_from == "run.json" and r.world_size == 4 and r.iteration == 4
        assert r.allocator == RankAllocator(max_memory_allocated=t.peak_allocated, max_memory_reserved=t.peak_reserved)
        assert r.peak.allocated_bytes == t.peak_allocated and r.peak.reserved_bytes == t.peak_reserved
    mx = doc.iterations[0].max
    assert doc.iterations[0].missing_ranks == [] and mx is not None and mx.rank == 1
    assert "= allocator" in render_ranks_terminal(doc)


def test_inputs_expand_and_refuse(tmp_path: Path, titan: Any) -> None:
    root, truth = titan
    found = expand_inputs([str(root / "memory_snapshot" / "iteration_10" / "rank[0-3]_*.pickle"), truth[0].path])
    assert [f.rank for f in found] == [0, 1, 2, 3]  # the repeat is dropped
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs([str(tmp_path / "nothing_*.pickle")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no snapshot"):
        expand_inputs([str(tmp_path / "empty")])


def test_process_pool_gives_the_same_digests(titan: Any, titan_doc: RanksDocument) -> None:
    root, _ = titan
    assert ranks_document(analyse_ranks(digest_rows([str(root)], jobs=2))) == titan_doc


def _raise_for(x: int) -> int:
    if x == 2:
        raise ValueError("two is bad\nsecond line")
    return x * 10


def test_engine_keeps_order_and_turns_errors_into_rows() -> None:
    out = run_tasks(_raise_for, ["a", "b", "c"], [(1,), (2,), (3,)], jobs=2, show_progress=False)
    assert out[0] == 10 and out[2] == 30
    assert out[1] == TaskFailed("b", "ValueError: two is bad")


def test_history_orders_by_a_run_json_key_and_finds_the_jump(tmp_path: Path) -> None:
    # five runs of one pipeline; the commit order differs from the folder order; run c4 jumps
    acts = {"a": 10, "b": 10, "c": 11, "d": 25, "e": 25}
    commit = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    names = ["e", "c", "a", "d", "b"]
    fleet_synth.write_run_dirs(
        str(tmp_path),
        [acts[n] for n in names],
        extra={i: {"commit": commit[n], "rank": 0} for i, n in enumerate(names)},
        folder_of=lambda r: f"run-{names[r]}",
    )
    rows = digest_rows([str(tmp_path)])
    res = analyse_history(rows, order_by="commit", jump_pct=5.0)
    doc = history_document(res)
    assert [r.label for r in doc.runs] == ["run-a", "run-b", "run-c", "run-d", "run-e"]
    assert [r.order_key for r in doc.runs] == [1, 2, 3, 4, 5]
    fwd = next(s for s in doc.stages if s.stage == "forward")
    assert fwd.jump is not None and fwd.jump.run == "run-d" and fwd.jump.after == "run-c"
    assert fwd.jump.delta_bytes == 4 * (25 - 11) * MiB
    whole = next(s for s in doc.stages if s.stage == WHOLE_RUN)
    first = next(r for r in rows if r.label == "run-a").digest
    assert first is not None and whole.first_bytes == first.peak_allocated
    load = next(s for s in doc.stages if s.stage == "load")
    assert load.jump is None and load.change_bytes == 0
    md, term, html = render_history_markdown(doc), render_history_terminal(doc), render_history_html(doc)
    for line in doc.verdict:
        assert line in md and line in term
    assert "run-d" in html and len(md.splitlines()) <= 60
    # a key no run has: input order kept, and said
    res2 = analyse_history(rows, order_by="nope")
    assert [r.label for r in rows] == res2.runs["label"].tolist() == ["run-a", "run-b", "run-c", "run-d", "run-e"]
    assert any("no run.json key 'nope'" in n for n in res2.notes)
    js = json.loads(json.dumps(res.summary()))  # plain JSON types only
    assert load_history(js) == doc  # ``check --baseline history.json`` reads it back as it was built
    with pytest.raises(InputError, match=r"malformed snapviz.history/1 document: runs\[0\]\.peak: missing field"):
        load_history({**js, "runs": [{**js["runs"][0], "peak": {}}]}, "h.json")


def test_fsspec_urls_are_expanded_and_fetched(titan: Any) -> None:
    fsspec = pytest.importorskip("fsspec")
    _, truth = titan
    fs = fsspec.filesystem("memory")
    for t in truth[:3]:
        fs.pipe(f"/job42/memory_snapshot/iteration_10/{os.path.basename(t.path)}", Path(t.path).read_bytes())
    fs.pipe(
        "/job42/memory_snapshot/iteration_10/rank1_run.json",
        json.dumps(
            {
                "schema": "snapviz.run/1",
                "rank": 1,
                "world_size": 3,
                "allocator": {"max_memory_allocated": truth[1].peak_allocated},
            }
        ).encode(),
    )
    try:
        rows = digest_rows(["memory://job42/memory_snapshot/"])
        assert [r.source for r in rows] == [
            f"memory://job42/memory_snapshot/iteration_10/rank{i}_memory_snapshot.pickle" for i in range(3)
        ]
        doc = ranks_document(analyse_ranks(rows))
        assert [r.peak.allocated_bytes for r in doc.ranks] == [t.peak_allocated for t in truth[:3]]
        assert [r.iteration for r in doc.ranks] == [10, 10, 10]
        # rank 1's own run.json was fetched with it
        assert [r.rank_from for r in doc.ranks] == ["path", "run.json", "path"]
        alloc = doc.ranks[1].allocator
        assert alloc is not None and alloc.max_memory_allocated == truth[1].peak_allocated
        with pytest.raises(InputError, match="matches no file"):
            expand_inputs(["memory://job42/nothing_*.pickle"])
    finally:
        fs.rm("/job42", recursive=True)
