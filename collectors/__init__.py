"""Collectors: run diffusion pipelines with stage labels and record their memory.

``collectors.record(pipe, out_dir, ...)`` is the Python API; ``collectors.cli.collect`` is the
``snapviz collect`` command. Importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["record", "Recorder", "run", "RunOptions", "TrainRecorder", "record_training"]


def __getattr__(name: str) -> Any:
    # lazy, so `import collectors` (and snapviz --help) stays free of torch. ``record`` is the
    # function collectors.api.record (no submodule shares its name).
    if name == "record":
        return importlib.import_module("collectors.api").record
    if name == "Recorder":
        return importlib.import_module("collectors.recorder").Recorder
    if name in ("TrainRecorder", "record_training"):
        return getattr(importlib.import_module("collectors.train_record"), name)
    if name in ("run", "RunOptions"):
        return getattr(importlib.import_module("collectors.runner"), name)
    raise AttributeError(name)
