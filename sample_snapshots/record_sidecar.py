"""What the sample-recording scripts for programs that are not ours share: the allocator's
figures per phase, the run.json sidecar (schema ``snapviz.run/1``), the OOM record and the
snapshot.

The programs (``record_user_train.py``, ``record_ddp_ranks.py``) are written as a user writes a
training loop; this module only measures them. Per phase, :class:`Phases` resets the
allocator's peak counters (``reset_peak_memory_stats``) at the boundary and reads
``max_memory_allocated``/``max_memory_reserved`` at the next, so each phase's peak is the
allocator's own; the phases are contiguous from the start of recording, so the run's peak is
the max over them. Labels (``_set_memory_metadata``) are stamped only where the program asks
(``label=True``), on the calling thread alone, as a user's labels are.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: collectors.alloc_conf
from collectors.alloc_conf import allocator_counters, recorded_alloc_conf  # noqa: E402

MAX_ENTRIES = 1_000_000
_TRIED = re.compile(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)")


def now_us() -> int:
    return time.time_ns() // 1000


class Phases:
    """Contiguous phases with the allocator's own peaks (after a reset at each boundary)."""

    def __init__(self, device: torch.device, label: bool = False) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.label = label and self.cuda
        self.rows: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def _now(self) -> tuple[int, int]:
        if not self.cuda:
            return 0, 0
        return torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)

    def mark(self, name: str | None, **extra: Any) -> None:
        """Close the phase in flight and open ``name`` (None: just close)."""
        alloc, res = self._now()
        t_us, t_pc = now_us(), time.perf_counter()
        if self._open is not None:
            row = self._open
            row.update(
                end_us=t_us,
                wall_s=round(t_pc - row.pop("_pc"), 6),
                peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device) if self.cuda else 0,
                peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device) if self.cuda else 0,
                allocated_at_end=alloc,
                reserved_at_end=res,
            )
            self.rows.append(row)
            self._open = None
        if self.label:
            torch.cuda.memory._set_memory_metadata(name or "")
        if name is None:
            return
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._open = {
            "name": name,
            "start_us": t_us,
            "_pc": t_pc,
            "allocated_at_start": alloc,
            "reserved_at_start": res,
            **extra,
        }

    @property
    def current(self) -> dict[str, Any] | None:
        return self._open


def start_history(device: torch.device, max_entries: int = MAX_ENTRIES) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python", context="all")
    return {"enabled": device.type == "cuda", "context": "all", "stacks": "python", "max_entries": max_entries}


def set_cap(device: torch.device, fraction: float | None) -> dict[str, Any] | None:
    """``set_per_process_memory_fraction``: the allocator refuses to reserve past it."""
    if fraction is None or device.type != "cuda":
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    total = torch.cuda.get_device_properties(device).total_memory
    return {"fraction": fraction, "bytes": int(fraction * total), "device_total_bytes": total}


class OomWatch:
    """The exact request of a CUDA OOM, from the allocator's OOM observer (the exception's text
    rounds it)."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] | None = None
        if torch.cuda.is_available() and hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
            torch.cuda.init()  # the observer attaches to the per-device allocators CUDA's start makes
            torch._C._cuda_attach_out_of_memory_observer(self._observe)

    def _observe(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        self.seen = {
            "device": device,
            "requested_bytes": int(alloc),
            "device_allocated": int(device_alloc),
            "device_free": int(device_free),
        }

    def record(self, err: BaseException, phase: dict[str, Any] | None) -> dict[str, Any]:
        text = str(err)
        m = _TRIED.search(text)
        out = dict(self.seen or {})
        out.update(
            message_requested=m.group(1) if m else None,
            message=text.splitlines()[0][:300] if text else "",
            phase=phase["name"] if phase else None,
        )
        return out


def allocator_doc(
    device: torch.device, phases: list[dict[str, Any]], cap: dict[str, Any] | None
) -> dict[str, Any] | None:
    if device.type != "cuda":
        return None
    alloc = max((p["peak_allocated_bytes"] for p in phases), default=0)
    res = max((p["peak_reserved_bytes"] for p in phases), default=0)
    final = {
        "final_allocated": torch.cuda.memory_allocated(device),
        "final_reserved": torch.cuda.memory_reserved(device),
    }
    d = device.index if device.index is not None else torch.cuda.current_device()
    return {
        "device": d,
        "max_memory_allocated": alloc,
        "max_memory_reserved": res,
        **final,
        "devices": [{"device": d, "max_memory_allocated": alloc, "max_memory_reserved": res, **final}],
        "conf": recorded_alloc_conf(),
        "cap": cap,
        "stats": allocator_counters(device),
    }


def versions() -> dict[str, Any]:
    def v(name: str) -> str | None:
        try:
            return __import__(name).__version__
        except Exception:
            return None

    return {
        "torch_version": torch.__version__,
        "transformers_version": v("transformers"),
        "diffusers_version": None,
        "python_version": platform.python_version(),
    }


def command_line() -> str:
    return shlex.join(["python", *sys.argv])


def sidecar(
    device: torch.device,
    *,
    phases: list[dict[str, Any]],
    labelled: bool,
    cap: dict[str, Any] | None,
    history: dict[str, Any],
    status: str,
    record_start_us: int,
    **fields: Any,
) -> dict[str, Any]:
    """The run.json document. ``phases[]`` holds the allocator's per-phase figures; ``stages[]``
    repeats them only when the program labelled its phases (``_set_memory_metadata``): a
    snapshot of a program that labels nothing is attributed from the snapshot alone, so its
    timeline is not offered to the analyzer as stage intervals."""
    info: dict[str, Any] = {"schema": "snapviz.run/1", **fields, "status": status}
    info["device"] = str(device)
    info["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    info["num_devices"] = 1
    info.update(versions())
    info["command"] = command_line()
    info["history"] = history
    info["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    info["record_start_us"] = record_start_us
    info["labels"] = "main-thread" if labelled else None
    info["phases"] = phases
    info["stages"] = phases if labelled else []
    info["allocator"] = allocator_doc(device, phases, cap)
    return info


def write_json(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
    tmp.replace(path)


def dump_snapshot(path: Path) -> Path | None:
    """``_dump_snapshot`` to ``path`` (raw pickle; ``record_user_samples.py`` packs it as
    ``.xz`` once the process has let the GPU go)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    torch.cuda.memory._dump_snapshot(str(path))
    return path


def _local(t: Any) -> Any:
    """A DTensor's local shard (FSDP2), else the tensor: the bytes this rank holds."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(tensors: Any) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    """Device-resident optimizer state by key (``exp_avg``, ``momentum_buffer``...)."""
    out: dict[str, int] = {}
    for st in opt.state.values():
        for k, t in st.items():
            if torch.is_tensor(t) and t.device.type != "cpu":
                out[k] = out.get(k, 0) + _local(t).numel() * t.element_size()
    return out
