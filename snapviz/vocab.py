"""The words every part of snapviz shares: stage grammar, canonical names, schema ids.

A stage label is ``name`` or ``name/step`` (``denoise/3``); analyses group by the part before
the ``/`` (docs/design.md, "Stage labels"). Each word is defined here once.
"""

from __future__ import annotations

from typing import Any, Final

STAGE_SEP = "/"
# inference stages, then the training phases written by ``snapviz collect --train``
CANONICAL_STAGES: tuple[str, ...] = (
    "load",
    "text_encode",
    "denoise",
    "vae_decode",
    "other",
    "forward",
    "backward",
    "optimizer",
    "zero_grad",
)
UNLABELLED = "unlabelled"
BEFORE_RECORDING = "before recording"  # memory allocated before the recorded history starts
END_STATE = "end state"  # the stage of a file that holds only the blocks live when it was taken
# The one sentence every sink says about such a file (docs/design.md, "End-state snapshots").
END_STATE_ONLY = "end state only: blocks live when the snapshot was taken, not a peak"

SUMMARY_SCHEMA: Final = "snapviz.summary/1"
COMPARE_SCHEMA: Final = "snapviz.compare/1"
WHATIF_SCHEMA: Final = "snapviz.whatif/1"
RUN_SCHEMA = "snapviz.run/1"
MATRIX_SCHEMA = "snapviz.matrix/1"
RANKS_SCHEMA: Final = "snapviz.ranks/1"
HISTORY_SCHEMA: Final = "snapviz.history/1"
RULES_SCHEMA = "snapviz.rules/1"

# What a summary carries over from a run directory's run.json (the snapviz.run/1 fields that say
# how the run was made), and the allocator's own figures it is checked against.
RUN_SUMMARY_KEYS = (
    "pipeline",
    "size",
    "techniques",
    "height",
    "width",
    "steps",
    "batch",
    "dtype",
    "device_name",
    "torch_version",
    "diffusers_version",
    "command",
)
ALLOCATOR_TRUTH_KEYS = ("max_memory_allocated", "max_memory_reserved")


def allocator_figures(run_json: dict[str, Any] | None, device: int | None) -> dict[str, Any]:
    """The allocator's own figures in run.json for ``device`` (every key None where unknown).

    run.json's ``allocator`` holds the figures of the device it names (``device``) and, on
    a multi-GPU run, one entry per device under ``devices``. The figures of one device are
    never compared with another device's replay: a device run.json has no entry for gets
    None (not checked), not the figures of device 0.
    """
    truth = (run_json or {}).get("allocator") or {}
    if not isinstance(truth, dict):
        return dict.fromkeys(ALLOCATOR_TRUTH_KEYS)
    per = [d for d in truth.get("devices") or [] if isinstance(d, dict)]
    if device is not None:
        hit = next((d for d in per if d.get("device") == device), None)
        if hit is None and truth.get("device", 0 if not per else None) == device:
            hit = truth
        truth = hit or {}
    return {k: truth.get(k) for k in ALLOCATOR_TRUTH_KEYS}


def run_summary_fields(
    run_json: dict[str, Any] | None, device: int | None = None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(allocator_truth, run) of a summary document from run.json; (None, None) without one.
    ``device``: the CUDA device shown (see :func:`allocator_figures`)."""
    if not run_json:
        return None, None
    return allocator_figures(run_json, device), {k: run_json.get(k) for k in RUN_SUMMARY_KEYS}


def stage_group(label: object) -> str:
    """``denoise/3`` -> ``denoise``; a label without a step is its own group."""
    return str(label).split(STAGE_SEP, 1)[0]


def stage_step(label: object) -> int | None:
    """``denoise/3`` -> 3; ``None`` for a label without a numeric step."""
    _, sep, step = str(label).partition(STAGE_SEP)
    return int(step) if sep and step.isdigit() else None


def stage_label(group: str, step: int | None = None) -> str:
    """The inverse of :func:`stage_group`/:func:`stage_step`."""
    return group if step is None else f"{group}{STAGE_SEP}{step}"
