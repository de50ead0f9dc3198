"""The caching allocator's settings for one recorded run: ``--alloc-conf`` and the counters.

``PYTORCH_CUDA_ALLOC_CONF`` is read once, when CUDA's caching allocator starts; so
:func:`apply_alloc_conf` sets it before anything touches CUDA (and, where CUDA already runs in
this process, hands the same string to ``torch.cuda.memory._set_allocator_settings``, which
takes the settings that may change at run time). :func:`allocator_counters` keeps the
``torch.cuda.memory_stats()`` counters that say how the allocator behaved (cudaMalloc/cudaFree
calls, retries, OOMs, segments), for run.json.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV = "PYTORCH_CUDA_ALLOC_CONF"

# memory_stats() keys worth keeping: event counters, and the segment/block figures at the end
COUNTERS = (
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
    "max_split_size",
    "segment.all.current",
    "segment.all.peak",
    "segment.all.allocated",
    "segment.all.freed",
    "segment.large_pool.allocated",
    "segment.small_pool.allocated",
    "oversize_allocations.current",
    "oversize_allocations.peak",
    "oversize_segments.current",
    "oversize_segments.peak",
    "inactive_split.all.current",
    "inactive_split_bytes.all.current",
    "allocation.all.allocated",
    "allocated_bytes.all.allocated",
    "requested_bytes.all.allocated",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.freed",
)


def apply_alloc_conf(conf: str | None) -> None:
    """Make ``conf`` the caching allocator's settings for this process (None: leave as is)."""
    if conf is None:
        return
    os.environ[ENV] = conf
    torch = sys.modules.get("torch")  # imported already only when a caller brought it in
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(conf)


def recorded_alloc_conf() -> str | None:
    """The settings string in force (``PYTORCH_CUDA_ALLOC_CONF``), or None when unset."""
    return os.environ.get(ENV) or None


def allocator_counters(device: Any) -> dict[str, int]:
    """The counters of :data:`COUNTERS` that this torch reports for ``device``."""
    import torch

    stats = torch.cuda.memory_stats(device)
    return {k: int(stats[k]) for k in COUNTERS if k in stats}
