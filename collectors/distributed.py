"""Recording under ``torch.distributed`` (torchrun, DDP, FSDP): every rank writes its own run
directory, ``OUT/rank<R>/`` (run.json + snapshot.pickle), with its rank and the world size in
run.json, so ``snapviz ranks OUT/`` reads the job with each rank named by the run itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _group() -> Any:
    """``torch.distributed`` when a process group is initialized, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank_info() -> dict[str, Any]:
    """``rank``, ``world_size``, ``local_rank`` and ``backend`` of this process's group; ``{}``
    outside torch.distributed."""
    dist = _group()
    if dist is None:
        return {}
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
