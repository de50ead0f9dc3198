"""Which memory a trace's ``[memory]`` events describe, and totals for old traces.

``Device Type`` is c10's ``DeviceType`` enum (c10/core/DeviceType.h, now
torch/headeronly/core/DeviceType.h). A ROCm build of torch reports its GPUs as HIP (6)
in traces although Python code calls them ``cuda:N``; both names are shown.

Profilers of about 2021 (torch 1.8/1.9) wrote ``[memory]`` events with ``Bytes`` only,
no ``Total Allocated``/``Total Reserved``. Their running sum is the allocated memory
*relative to the trace start*; memory allocated before the trace and never freed in it
is unknown. The least baseline consistent with the events is what keeps the running sum
from going negative (bytes freed that the trace never saw allocated), so the series
``floor + running sum`` is a lower bound at every instant and its maximum a lower bound
of the peak. Reserved memory is not recorded at all in those traces.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.load.trace.chrome_trace import ChromeTrace

__all__ = [
    "DEVICE_TYPES",
    "device_label",
    "device_kind",
    "with_running_totals",
    "running_total_floor",
    "pick_trace_device",
    "DEVICE_CPU",
]

DEVICE_CPU = 0

# c10::DeviceType value -> (torch's device string, what a user calls that memory).
DEVICE_TYPES: dict[int, tuple[str, str]] = {
    0: ("cpu", "CPU memory"),
    1: ("cuda", "CUDA GPU memory"),
    2: ("mkldnn", "MKLDNN memory"),
    3: ("opengl", "OpenGL memory"),
    4: ("opencl", "OpenCL memory"),
    5: ("ideep", "IDEEP memory"),
    6: ("hip", "AMD ROCm/HIP GPU memory"),
    7: ("fpga", "FPGA memory"),
    8: ("maia", "MAIA memory"),
    9: ("xla", "XLA/TPU memory"),
    10: ("vulkan", "Vulkan memory"),
    11: ("metal", "Metal memory"),
    12: ("xpu", "Intel XPU GPU memory"),
    13: ("mps", "Apple MPS GPU memory"),
    14: ("meta", "meta-device memory"),
    15: ("hpu", "Intel Gaudi (HPU) memory"),
    16: ("ve", "NEC SX-Aurora (VE) memory"),
    17: ("lazy", "lazy-tensor memory"),
    18: ("ipu", "Graphcore IPU memory"),
    19: ("mtia", "MTIA accelerator memory"),
    20: ("privateuseone", "PrivateUse1 (out-of-tree backend) memory"),
}


def device_label(device_type: int, device_id: int) -> str:
    """``cuda:0``, ``hip:0``, ``cpu``… as torch spells the device (unknown types by number)."""
    name = DEVICE_TYPES.get(int(device_type), (f"device-type-{int(device_type)}", ""))[0]
    return name if device_id < 0 else f"{name}:{int(device_id)}"


def device_kind(device_type: int) -> str:
    """What the memory is, in the user's words (``AMD ROCm/HIP GPU memory``)."""
    kind = DEVICE_TYPES.get(int(device_type), ("", ""))[1]
    return kind or f"memory of device type {int(device_type)} (not a c10 DeviceType this snapviz knows)"


def running_total_floor(running: np.ndarray) -> int:
    """The least pre-trace allocation that keeps ``floor + running`` non-negative."""
    return int(max(0, -int(running.min()))) if len(running) else 0


def with_running_totals(trace: ChromeTrace) -> ChromeTrace:
    """The trace with ``total_allocated`` filled in where events lack it (old profilers).

    For each device with any event without totals, ``total_allocated`` becomes the lower
    bound ``floor + cumsum(bytes)`` (module docstring) and ``total_reserved`` stays 0;
    ``has_totals`` stays False there, so :func:`snapviz.analyses.trace_ops.devices`
    reports the device as not exact. Traces whose events all carry totals come back as is.
    """
    mem = trace.memory
    if not len(mem) or bool(mem["has_totals"].all()):
        return trace
    mem = mem.copy()
    alloc = mem["total_allocated"].to_numpy().copy()
    for _, idx in mem.groupby(["device_type", "device_id"], sort=False).indices.items():
        if bool(mem["has_totals"].to_numpy()[idx].all()):
            continue
        running = np.cumsum(mem["bytes"].to_numpy()[idx])  # rows are in time order already
        alloc[idx] = running + running_total_floor(running)
    mem["total_allocated"] = alloc
    return replace(trace, memory=mem)


def pick_trace_device(devs: pd.DataFrame, index: int | None, source: str) -> tuple[int, int] | None:
    """The (device_type, device_id) to analyse; ``index`` is ``--device N``.

    Default: the accelerator (any non-CPU type) with the highest Total Allocated, else
    the CPU. ``--device N`` picks accelerator N, as it does for snapshots; a number no
    accelerator has is an :class:`InputError` naming the devices the trace holds.
    """
    if not len(devs):
        if index is not None:
            raise InputError(f"{source}: no device {index} in this trace (it has no [memory] events)")
        return None
    accel = devs[devs["device_type"] != DEVICE_CPU]
    if index is None:
        row = (accel if len(accel) else devs).iloc[0]
        return int(row["device_type"]), int(row["device_id"])
    hit = accel[accel["device_id"] == index]
    if not len(hit):
        order = sorted(
            zip(devs["device_type"], devs["device_id"], strict=True), key=lambda d: (d[0] == DEVICE_CPU, d[0], d[1])
        )
        names = ", ".join(device_label(t, i) for t, i in order)
        raise InputError(f"{source}: no device {index} in this trace (devices: {names})")
    return int(hit["device_type"].iloc[0]), int(hit["device_id"].iloc[0])
