"""``snapviz ranks`` / ``history`` from the command line: on a Dask ``LocalCluster`` (loopback
only, no network) the same JSON as through the local process pool; exit codes and outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fleet_synth
from paths import ROOT
from synth import MiB

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "SNAPVIZ_PROGRESS": "never"}


def snapviz(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args], capture_output=True, text=True, timeout=300, env=env or ENV
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[fleet_synth.RankTruth]]:
    root = tmp_path_factory.mktemp("job")
    truth = fleet_synth.write_torchtitan(str(root), [10, 10, 24, 10, 10, 10], capacity_of={3: 150 * MiB})
    return root, truth


def test_dask_local_cluster_gives_the_process_pools_json(
    job: tuple[Path, list[fleet_synth.RankTruth]], tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    root, truth = job
    pool_json = tmp_path / "pool.json"
    r = snapviz("ranks", str(root), "-j", "2", "--json", str(pool_json), "-q")
    assert r.returncode == 0, r.stderr
    dask_json = tmp_path / "dask.json"
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, host="127.0.0.1", protocol="tcp", dashboard_address=None
    ) as cluster:
        # the address through the environment, as a CI farm would set it
        r = snapviz(
            "ranks",
            str(root),
            "--json",
            str(dask_json),
            "-q",
            env={**ENV, "SNAPVIZ_DASK_SCHEDULER": cluster.scheduler_address},
        )
    assert r.returncode == 0, r.stderr
    on_dask, on_pool = json.loads(dask_json.read_text()), json.loads(pool_json.read_text())
    assert on_dask == on_pool
    assert [r["peak"]["allocated_bytes"] for r in on_dask["ranks"]] == [t.peak_allocated for t in truth]
    (it,) = on_dask["iterations"]
    assert it["max"]["rank"] == 2 and [o["rank"] for o in it["outliers"]] == [2, 3]
    assert it["first_oom"]["rank"] == 3


def test_unreachable_scheduler_is_one_line(job: tuple[Path, list[fleet_synth.RankTruth]]) -> None:
    pytest.importorskip("distributed")
    root, _ = job
    r = snapviz(
        "ranks",
        str(root),
        "--scheduler",
        "tcp://127.0.0.1:9",
        "-q",
        env={**ENV, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"},
    )
    assert r.returncode == 2 and "Dask scheduler" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_outputs_and_refusals(job: tuple[Path, list[fleet_synth.RankTruth]], tmp_path: Path) -> None:
    root, truth = job
    (tmp_path / "bad_rank0.pickle").write_bytes(b"\x80\x04junk")
    html, md = tmp_path / "ranks.html", tmp_path / "ranks.md"
    r = snapviz("ranks", str(root), "-j", "1", "-o", str(html), "--markdown", str(md))
    assert r.returncode == 0, r.stderr
    assert "rank 2 peaks highest" in r.stdout and "rank 3 ran out of memory first" in r.stdout
    page = html.read_text()
    assert "<script" in page and '<script src="http' not in page and 'id="sv-heatmap-card"' in page
    assert "rank 2 peaks highest" in md.read_text()
    for args, words in [
        ([str(tmp_path / "nothing*.pickle")], "matches no file"),
        ([str(root), "-o", str(tmp_path / "x.png")], "writes .html, .md or .json"),
        ([str(root), "--json", truth[0].path], ""),  # never overwrite an input
        ([str(tmp_path / "bad_rank0.pickle")], "none of the 1 input(s) could be analysed"),
    ]:
        r = snapviz("ranks", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert os.path.getsize(truth[0].path) > 1000


def test_history_cli(tmp_path: Path) -> None:
    names = ["r1", "r2", "r3"]
    fleet_synth.write_run_dirs(
        str(tmp_path),
        [10, 10, 20],
        extra={i: {"date": f"2026-12-0{i + 1}"} for i in range(3)},
        folder_of=lambda r: names[r],
    )
    out = tmp_path / "h.json"
    r = snapviz(
        "history",
        str(tmp_path / "r*"),
        "--order-by",
        "date",
        "-j",
        "1",
        "--json",
        str(out),
        "-o",
        str(tmp_path / "h.html"),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "snapviz.history/1" and [x["order_key"] for x in doc["runs"]] == [
        "2026-12-01",
        "2026-12-02",
        "2026-12-03",
    ]
    assert any("jumped" in v and "r3" in v for v in doc["verdict"])
    assert doc["verdict"][0] in r.stdout
    r = snapviz("history", str(tmp_path), "--jump", "lots")
    assert r.returncode == 2 and "--jump" in r.stderr
    # check --baseline takes the history's last (r3 itself: +0%) or best run (r1: far lower)
    r3 = str(tmp_path / "r3")
    r = snapviz("check", r3, "--baseline", str(out), "--max-increase", "5%")
    assert r.returncode == 0 and "PASS peak allocated vs baseline" in r.stdout, r.stdout + r.stderr
    r = snapviz("check", r3, "--baseline", str(out), "--baseline-pick", "best", "--max-increase", "5%")
    best = min(x["peak"]["allocated_bytes"] for x in doc["runs"])
    assert r.returncode == 1 and "FAIL peak allocated vs baseline" in r.stdout
    from snapviz.units import fmt_bytes

    assert f"baseline {fmt_bytes(best)}" in r.stdout


# real jobs recorded on one H200 (the FSDP1 ones on one H100): (folder, world size, backend).
# NCCL refuses two ranks on one GPU, so its samples are one rank; gloo lets several ranks share it.
RANK_SAMPLES = [
    ("ddp-gloo-4rank", 4, "gloo"),  # transformers GPT-2 under DDP, torchtitan layout
    ("fsdp2-gloo-2rank", 2, "gloo"),  # the same model under FSDP2 (fully_shard)
    ("fsdp2-nccl-1rank", 1, "nccl"),
    ("fsdp1-gloo-2rank", 2, "gloo"),  # under FSDP1 (FullyShardedDataParallel, flat parameters)
    ("fsdp1-nccl-1rank", 1, "nccl"),  # FSDP1 runs one rank as NO_SHARD
    ("train-sd15-ddp-gloo-2rank", 2, "gloo"),  # torchrun -m snapviz collect --train
    ("train-sd15-ddp-nccl-1rank", 1, "nccl"),
]


def _rank_sidecar(source: Path, rank: int) -> dict:
    """The rank's run.json: a run directory's own, or torchtitan's ``rank<r>_run.json`` beside
    the snapshot."""
    if source.is_dir():
        return json.loads((source / "run.json").read_text())
    return json.loads((source.parent / f"rank{rank}_run.json").read_text())


@pytest.mark.parametrize(("name", "world", "backend"), RANK_SAMPLES, ids=[s[0] for s in RANK_SAMPLES])
def test_rank_samples_per_rank_table_equals_each_ranks_allocator(
    tmp_path: Path, name: str, world: int, backend: str
) -> None:
    """Real distributed jobs on one GPU (H200; FSDP1's on an H100): every rank's replayed peaks
    are its allocator's own max_memory_allocated / max_memory_reserved, and the rank, world size
    and backend come from the run itself."""
    sample = ROOT / "sample_snapshots" / name
    if not sample.is_dir():
        pytest.skip(f"{name} is not in this checkout")
    out = tmp_path / "ranks.json"
    r = snapviz("ranks", str(sample), "-j", "2", "--json", str(out), "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [x["rank"] for x in doc["ranks"]] == list(range(world))
    for x in doc["ranks"]:
        side = _rank_sidecar(Path(x["source"]), x["rank"])
        assert (side["world_size"], side["backend"]) == (world, backend)
        assert x["rank_from"] == "run.json" and x["world_size"] == world and x["status"] == "ok"
        assert x["peak"]["allocated_bytes"] == side["allocator"]["max_memory_allocated"]
        assert x["peak"]["reserved_bytes"] == side["allocator"]["max_memory_reserved"]


def test_ddp_sample_imbalance_is_the_highest_over_the_median(tmp_path: Path) -> None:
    """The 4-rank DDP sample trains each rank on a different sequence length: the highest rank
    and the imbalance (highest / median of the two middle ranks) follow from the allocator's own
    peaks."""
    sample = ROOT / "sample_snapshots" / "ddp-gloo-4rank"
    if not sample.is_dir():
        pytest.skip("the DDP sample is not in this checkout")
    out = tmp_path / "ddp.json"
    r = snapviz("ranks", str(sample), "-j", "2", "--json", str(out), "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    (it,) = doc["iterations"]
    peaks = [_rank_sidecar(Path(x["source"]), x["rank"])["allocator"]["max_memory_allocated"] for x in doc["ranks"]]
    assert it["max"]["rank"] == peaks.index(max(peaks)) and it["missing_ranks"] == []
    assert it["imbalance"] == round(max(peaks) / ((sorted(peaks)[1] + sorted(peaks)[2]) / 2), 4)
