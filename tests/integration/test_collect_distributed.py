"""``collectors.record`` under torch.distributed: two gloo ranks on the CPU (spawned processes,
loopback only) each write ``OUT/rank<R>/run.json`` with their rank and the world size."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    import collectors

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = torch.nn.Linear(8, 8)
        with collectors.record(model, out, device="cpu", meta={"pipeline": "toy"}) as rec:
            with rec.stage("load"):
                model(torch.ones(2, 8))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_each_rank_writes_its_own_run_directory(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "job"
    mp.spawn(_rank, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    for r in range(2):
        info = json.loads((out / f"rank{r}" / "run.json").read_text())
        assert (info["rank"], info["world_size"], info["local_rank"], info["backend"]) == (r, 2, r, "gloo")
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]


def test_outside_torch_distributed_nothing_changes(tmp_path: Path) -> None:
    from collectors.distributed import rank_info, rank_out_dir

    assert rank_info() == {} and rank_out_dir(tmp_path) == tmp_path


def test_collect_train_under_torchrun_runs_ddp_one_folder_per_rank(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2 -m snapviz collect --train`` (no ``--out``): the collector
    starts the gloo group itself, trains the denoiser under DDP, and both ranks write into the one
    folder rank 0 named (the default name carries a time stamp, which could differ by rank)."""
    import os
    import subprocess
    import sys

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "-m",
        "snapviz",
        "collect",
        "--train",
        "--pipeline",
        "sd15",
        "--size",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "1",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (job,) = list((tmp_path / "runs").iterdir())
    assert sorted(p.name for p in job.iterdir()) == ["rank0", "rank1"]
    for r in range(2):
        info = json.loads((job / f"rank{r}" / "run.json").read_text())
        assert (info["rank"], info["world_size"], info["backend"]) == (r, 2, "gloo")
        assert "ddp" in info["techniques"]
        assert info["train"]["ddp"] == {"backend": "gloo", "world_size": 2, "bucket_cap_mb": 25}


def test_launcher_environment_without_a_group_still_names_the_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun, a program that never starts a process group still writes one folder per
    rank: the launcher's RANK/WORLD_SIZE name it (backend unknown)."""
    from collectors.distributed import rank_info, rank_out_dir

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_info() == {"rank": 3, "world_size": 4, "local_rank": 1, "backend": None}
    assert rank_out_dir(tmp_path) == tmp_path / "rank3"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert rank_info() == {} and rank_out_dir(tmp_path) == tmp_path
