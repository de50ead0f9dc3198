"""Recording under ``torch.distributed`` (torchrun, DDP, FSDP): every rank writes its own run
directory, ``OUT/rank<R>/`` (run.json + snapshot.pickle), with its rank and the world size in
run.json, so ``snapviz ranks OUT/`` reads the job with each rank named by the run itself.

``snapviz collect --train`` launched by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in
the environment) starts the process group itself (:func:`init_from_launcher`: NCCL on CUDA,
gloo on the CPU, or ``SNAPVIZ_DIST_BACKEND``), puts each rank on ``cuda:<LOCAL_RANK>``, wraps the
denoiser in ``DistributedDataParallel`` (:func:`wrap_ddp`), agrees on one output folder
(:func:`agree`, rank 0's) and ends the group when the run is written (:func:`finish`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _group() -> Any:
    """``torch.distributed`` when a process group is initialized, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _launcher_env() -> dict[str, int] | None:
    """``rank``, ``world_size``, ``local_rank`` set by a launcher (torchrun), or None."""
    env = {k: os.environ.get(k, "") for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if not (env["RANK"].isdigit() and env["WORLD_SIZE"].isdigit()):
        return None
    local = env["LOCAL_RANK"]
    return {
        "rank": int(env["RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "local_rank": int(local) if local.isdigit() else int(env["RANK"]),
    }


def rank_info() -> dict[str, Any]:
    """``rank``, ``world_size``, ``local_rank`` and ``backend`` of this process's group (a
    launcher's environment without a group: ``backend`` None); ``{}`` outside
    torch.distributed."""
    dist = _group()
    if dist is None:
        env = _launcher_env()
        return {**env, "backend": None} if env is not None and env["world_size"] > 1 else {}
    local = os.environ.get("LOCAL_RANK")
    return {
        "rank": int(dist.get_rank()),
        "world_size": int(dist.get_world_size()),
        "local_rank": int(local) if local is not None and local.isdigit() else None,
        "backend": str(dist.get_backend()),
    }


def rank_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir/rank<R>`` for a rank of a job of several, else ``out_dir`` itself."""
    info = rank_info()
    if info.get("world_size", 1) > 1:
        return Path(out_dir) / f"rank{info['rank']}"
    return Path(out_dir)


def init_from_launcher(device_type: str) -> bool:
    """Start the process group a launcher (torchrun) prepared, if none is running: NCCL on CUDA,
    gloo on the CPU (``SNAPVIZ_DIST_BACKEND`` overrides). True when this call started it (the
    caller then ends it with :func:`finish`); False outside a launcher or with a group already
    initialized by the program."""
    import torch.distributed as dist

    env = _launcher_env()
    if env is None or not dist.is_available() or dist.is_initialized():
        return False
    backend = os.environ.get("SNAPVIZ_DIST_BACKEND") or ("nccl" if device_type == "cuda" else "gloo")
    kwargs: dict[str, Any] = {}
    if device_type == "cuda":  # bound to this rank's GPU (barrier() would otherwise guess it)
        kwargs["device_id"] = local_device("cuda")
        import torch

        torch.cuda.set_device(kwargs["device_id"])
    dist.init_process_group(backend, rank=env["rank"], world_size=env["world_size"], **kwargs)
    return True


def local_device(device_type: str) -> Any:
    """This rank's device: ``cuda:<LOCAL_RANK>`` (modulo the GPUs present) on CUDA."""
    import torch

    env = _launcher_env() or {"local_rank": 0}
    if device_type != "cuda":
        return torch.device(device_type)
    return torch.device("cuda", env["local_rank"] % max(1, torch.cuda.device_count()))


def wrap_ddp(model: Any, device: Any) -> Any:
    """``model`` under ``DistributedDataParallel`` inside a process group (gradient buckets of
    25 MiB, the default), else ``model`` itself."""
    if _group() is None:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def agree(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (one output folder for the job); ``value`` alone
    outside a group."""
    dist = _group()
    if dist is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def finish(started: bool) -> None:
    """Wait for every rank, then end the group this process started (nothing otherwise)."""
    dist = _group()
    if not started or dist is None:
        return
    dist.barrier()
    dist.destroy_process_group()
