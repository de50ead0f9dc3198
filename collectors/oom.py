"""CUDA out-of-memory: tell an OOM apart, and save the recorder's run before torch raises."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the recorder imports this module; the name is for annotations only
    from .recorder import Recorder


_ACTIVE: list[Recorder] = []
_OBSERVER_ATTACHED = False


def attach_oom_observer(rec: Recorder) -> None:
    # there is no detach in torch; one process-wide observer dispatches to the active recorder
    global _OBSERVER_ATTACHED
    _ACTIVE.append(rec)
    if not _OBSERVER_ATTACHED and hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):

        def observer(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
            if _ACTIVE:
                save_on_oom(_ACTIVE[-1], device, alloc, device_alloc, device_free)

        torch._C._cuda_attach_out_of_memory_observer(observer)
        _OBSERVER_ATTACHED = True


def detach_oom_observer(rec: Recorder) -> None:
    if rec in _ACTIVE:
        _ACTIVE.remove(rec)


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def save_on_oom(rec: Recorder, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
    """Called by the allocator before it raises OutOfMemoryError: save what we have."""
    # Not every OOM ends the run: PyTorch catches some and goes on (cuDNN retries a convolution
    # with a smaller workspace), so the run keeps status "ok" until an OOM escapes the recording
    # (Recorder.__exit__); this saves what a crash would otherwise lose.
    try:
        rec.meta["oom"] = {
            "device": device,
            "requested_bytes": alloc,
            "device_allocated": device_alloc,
            "device_free": device_free,
            "stage": rec._current["name"] if rec._current else None,
        }
        rec.meta["ooms_seen"] = rec.meta.get("ooms_seen", 0) + 1
        if rec.history and not rec._snapshot_dumped:
            torch.cuda.memory._dump_snapshot(str(rec.out_dir / "snapshot.pickle"))
            rec._snapshot_dumped = True
        info = rec.run_info(status="oom")
        if rec._current is not None:  # the stage in flight, unclosed
            info["stages"] = info["stages"] + [
                {"name": rec._current["name"], "start_us": rec._current["start_us"], "end_us": None, "open": True}
            ]
        rec.write_run_json(info)
    except Exception as err:  # never mask the OOM itself
        print(f"snapviz: could not save the OOM snapshot: {err}", file=sys.stderr)
