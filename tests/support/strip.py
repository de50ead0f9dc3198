"""Take the labels out of a snapshot, to test what the analyzer finds without them.

``strip_labels`` returns a copy of a loaded snapshot dict (``torch.cuda.memory._snapshot()``'s
shape) without ``_set_memory_metadata``'s ``user_metadata`` on trace entries and without the
profiler's ``external_annotations`` (``record_function`` ranges, ``Optimizer.step#…``): what a
user who recorded plain history hands over. Frames, times and the allocator's record stay.
"""

from __future__ import annotations

from typing import Any


def strip_labels(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``raw`` without stage labels or profiler annotations (``raw`` is not changed)."""
    out = {k: v for k, v in raw.items() if k != "external_annotations"}
    out["device_traces"] = [
        [{k: v for k, v in entry.items() if k != "user_metadata"} for entry in trace]
        for trace in raw.get("device_traces") or []
    ]
    return out
