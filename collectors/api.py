"""``collectors.record``: the Python API around a pipeline (or a model being trained).

Its own module, beside :mod:`collectors.recorder` and :mod:`collectors.train_record`, because it
picks between the two (and train_record subclasses the recorder).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .recorder import DEFAULT_MAX_ENTRIES, STAGE_OTHER, Recorder
from .train_record import TrainRecorder


def record(
    pipe: Any,
    out_dir: str | os.PathLike[str],
    *,
    stacks: str = "python",
    context: str = "all",
    max_entries: int = DEFAULT_MAX_ENTRIES,
    profile: bool = False,
    profile_scope: str = "all",
    history: bool = True,
    device: str | torch.device | None = None,
    devices: list[int] | None = None,
    meta: dict[str, Any] | None = None,
    initial_stage: str = STAGE_OTHER,
    on_step: Callable[[int], None] | None = None,
    sync_stages: bool = False,
    train: bool = False,
) -> Recorder:
    """A :class:`Recorder` for ``pipe`` writing to ``out_dir``; use it as a context manager.

    ``train=True``: ``pipe`` is the model being trained, and the recorder is a
    :class:`collectors.train_record.TrainRecorder` (phases, step marker, backward labelled)."""
    if train:
        return TrainRecorder(
            pipe,
            out_dir,
            stacks=stacks,
            context=context,
            max_entries=max_entries,
            profile=profile,
            profile_scope=profile_scope,
            history=history,
            device=device,
            devices=devices,
            meta=meta,
            initial_stage=initial_stage,
            sync_stages=sync_stages,
        )
    return Recorder(
        pipe,
        out_dir,
        stacks=stacks,
        context=context,
        max_entries=max_entries,
        profile=profile,
        profile_scope=profile_scope,
        history=history,
        device=device,
        devices=devices,
        meta=meta,
        initial_stage=initial_stage,
        on_step=on_step,
        sync_stages=sync_stages,
    )
