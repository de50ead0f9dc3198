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
