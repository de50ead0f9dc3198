"""The run directory's ``run.json`` (schema ``snapviz.run/1``): what the recorder measured,
the stages, the allocator's peaks per device, and the environment that produced them."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from snapviz.vocab import RUN_SCHEMA

from .alloc_conf import allocator_counters, recorded_alloc_conf
from .distributed import rank_info

if TYPE_CHECKING:  # the recorder imports this module; the name is for annotations only
    from .recorder import Recorder


def run_info(rec: Recorder, status: str | None = None) -> dict[str, Any]:
    """The run.json document of ``rec`` as it stands (``status`` overrides the recorder's)."""

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    info: dict[str, Any] = {"schema": RUN_SCHEMA}
    info.update(rec.meta)
    info["status"] = status or rec.status
    info["device"] = str(rec.device)
    info["device_name"] = (
        torch.cuda.get_device_name(rec.device) if rec.cuda else (platform.processor() or platform.machine() or "cpu")
    )
    info["num_devices"] = len(rec.devices) if rec.cuda else 1
    info["torch_version"] = torch.__version__
    info["diffusers_version"] = version("diffusers")
    info["transformers_version"] = version("transformers")
    info["python_version"] = platform.python_version()
    info["history"] = {
        "enabled": rec.history,
        "context": rec.context if rec.history else None,
        "stacks": rec.stacks if rec.history else None,
        "max_entries": rec.max_entries if rec.history else None,
    }
    info["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    info.update(rank_info())  # rank, world_size, local_rank, backend under torch.distributed
    info["record_start_us"] = rec._start_us
    stages = [s for s in rec.stages]
    info["stages"] = stages
    if rec.cuda:
        final = getattr(rec, "_final", None) or rec._allocator_now()
        per_dev = []
        for d in rec.devices:
            found = [next((p for p in s["per_device"] if p["device"] == d), None) for s in stages]
            rows = [r for r in found if r is not None]
            per_dev.append(
                {
                    "device": d,
                    "max_memory_allocated": max((r["peak_allocated_bytes"] for r in rows), default=0),
                    "max_memory_reserved": max((r["peak_reserved_bytes"] for r in rows), default=0),
                    "final_allocated": final["devices"][d]["allocated"],
                    "final_reserved": final["devices"][d]["reserved"],
                }
            )
        prim = next(p for p in per_dev if p["device"] == rec.device.index)
        info["allocator"] = {
            "device": rec.device.index,
            "max_memory_allocated": prim["max_memory_allocated"],
            "max_memory_reserved": prim["max_memory_reserved"],
            "final_allocated": prim["final_allocated"],
            "final_reserved": prim["final_reserved"],
            "devices": per_dev,
            # the settings in force (None: PyTorch's defaults), the cap if any, and the counters
            "conf": recorded_alloc_conf(),
            "cap": (
                {"bytes": rec.meta["memory_limit_bytes"], "fraction": rec.meta.get("memory_fraction")}
                if rec.meta.get("memory_limit_bytes")
                else None
            ),
            "stats": allocator_counters(rec.device),
        }
    else:
        info["allocator"] = None
    info["rss_peak_bytes"] = max((s["rss_peak_bytes"] for s in stages), default=None)
    files = [n for n in ("snapshot.pickle", "trace.json.gz", "image.png") if (rec.out_dir / n).exists()]
    info["files"] = files
    return info


def write_run_json(out_dir: Path, info: dict[str, Any]) -> Path:
    """Write ``info`` as ``out_dir/run.json`` atomically (a reader never sees half a file)."""
    path = out_dir / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path
