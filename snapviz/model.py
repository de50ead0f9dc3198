"""Columnar in-memory model of a memory snapshot (docs/design.md: one table per kind of record).

Nothing here holds a per-event Python object: trace entries, frames, stacks, segments,
blocks and annotations are pandas DataFrames with numpy columns, strings interned once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from snapviz.arrays import unique
from snapviz.safe_text import short_repr

# Trace actions as small ints; the order is part of no file format, only of this model.
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "free",
    "other",
)
ACTION_CODE: dict[str, int] = {a: i for i, a in enumerate(ACTIONS)}
(
    A_ALLOC,
    A_FREE_REQ,
    A_FREE_DONE,
    A_SEG_ALLOC,
    A_SEG_FREE,
    A_SEG_MAP,
    A_SEG_UNMAP,
    A_OOM,
    A_SNAPSHOT,
    A_FREE,
    A_OTHER,
) = range(len(ACTIONS))

BLOCK_STATES: tuple[str, ...] = ("active_allocated", "active_pending_free", "inactive")


@dataclass
class Snapshot:
    """A loaded snapshot.

    Tables (all DataFrames):

    * ``events``: one row per trace entry, all devices, in file order. Columns
      ``device`` (int16), ``idx`` (index within its device's trace), ``time_us`` (int64
      Unix µs, -1 when the entry had none), ``action`` (int8 code, see ``ACTIONS``),
      ``addr``, ``size`` (the *requested* bytes for alloc/free), ``stream``, ``stack_id``
      (int32, -1 = no frames), ``metadata_id`` (int32 into ``strings``; 0 = ''),
      ``compile_id`` (int32 into ``strings``), ``device_free`` (OOM entries, else -1).
    * ``frames``: ``frame_id``, ``name``, ``filename``, ``line``.
    * ``stack_frames``: ``stack_id``, ``depth`` (0 = innermost), ``frame_id``.
    * ``segments``: ``device``, ``address``, ``total_size``, ``allocated_size``,
      ``requested_size``, ``stream``, ``segment_type``, ``pool_id``, ``is_expandable``,
      ``stack_id``.
    * ``blocks``: ``device``, ``segment``, ``address``, ``size``, ``requested_size``,
      ``state``, ``stack_id``.
    * ``annotations``: ``device``, ``time_us``, ``name``, ``stage`` (START/END).
    """

    source: str
    events: pd.DataFrame
    frames: pd.DataFrame
    stack_frames: pd.DataFrame
    stacks: list[tuple[int, ...]]
    strings: list[str]
    segments: pd.DataFrame
    blocks: pd.DataFrame
    annotations: pd.DataFrame
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    format_notes: list[str] = field(default_factory=list)
    # Which reader made it (:data:`snapviz.load.snapshot.reader.READERS`); the same columns either way.
    reader: str = ""

    def __repr__(self) -> str:
        devices = sorted({int(d) for d in unique(self.events["device"].to_numpy())}) if len(self.events) else []
        return short_repr(
            "Snapshot",
            self.source,
            f"devices {devices}",
            f"{len(self.events):,} trace entries",
            f"{len(self.segments):,} segments",
            f"{len(self.blocks):,} blocks",
            f"{len(self.frames):,} frames",
        )

    @property
    def devices(self) -> list[int]:
        """Devices that have trace entries or segments, ascending."""
        devs = set(unique(self.events["device"]).tolist()) if len(self.events) else set()
        if len(self.segments):
            devs |= set(unique(self.segments["device"]).tolist())
        return sorted(int(d) for d in devs)

    def device_events(self, device: int) -> pd.DataFrame:
        """``device``'s events, renumbered from 0. Where every event is on it (one GPU, the usual
        case) the frame is shared, not copied (pandas copies on write: changes stay local)."""
        ev = self.events
        on = ev["device"].to_numpy() == device
        return ev.reset_index(drop=True) if on.all() else ev[on].reset_index(drop=True)

    def stack(self, stack_id: int) -> list[dict[str, Any]]:
        """Frames of one stack as dicts, innermost first."""
        if stack_id < 0 or stack_id >= len(self.stacks):
            return []
        fr = self.frames
        names, files, lines = fr["name"].to_numpy(), fr["filename"].to_numpy(), fr["line"].to_numpy()
        return [{"name": names[f], "filename": files[f], "line": int(lines[f])} for f in self.stacks[stack_id]]
