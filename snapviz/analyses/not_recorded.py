"""Saying what a file did not record, in the words every sink uses (issue 21 item 4).

A report of nothing must not read as a result: an empty snapshot is not "0 B at its peak",
and a profile whose ``[memory]`` events are all the CPU's is not "Peak 8 B" of a GPU run. The
summary carries the sentence as ``not_recorded`` (null when the file recorded what it is
read for); every sink leads with it instead of a peak.
"""

from __future__ import annotations

from typing import Any

from snapviz.model import Snapshot

GPU_NOT_RECORDED = "GPU memory was not recorded"
NOTHING_RECORDED = "nothing was recorded"


def empty_snapshot_note(snap: Snapshot) -> str | None:
    """The sentence for a snapshot with no segment, no live block and no trace entry."""
    if len(snap.segments) or len(snap.blocks) or len(snap.events):
        return None
    return (
        f"{NOTHING_RECORDED}: the snapshot holds no segments, no live blocks and no trace entries "
        "(memory history was recorded in another process or for another device, or dumped before any "
        "allocation); GPU memory was not recorded, so there is no peak to report"
    )


def gpu_not_recorded_note(meta: dict[str, Any], cpu_only: bool) -> str | None:
    """The sentence for a profile that traced GPUs (``deviceProperties``) but whose memory
    events are all the CPU allocator's (``cpu_only``), or that has no memory events at all."""
    gpus = meta.get("deviceProperties")
    if not cpu_only or not isinstance(gpus, list) or not gpus:
        return None
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")})
    what = f" ({', '.join(names)})" if names else ""
    return (
        f"{GPU_NOT_RECORDED}: the profiler traced {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}{what} "
        "but its [memory] events are all the CPU allocator's (record with torch.profiler(profile_memory=True) "
        "while the model runs on the GPU)"
    )
