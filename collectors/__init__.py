"""Collectors: run diffusion pipelines with stage labels and record their memory.

``collectors.record(pipe, out_dir, ...)`` is the Python API; ``collectors.cli.collect`` is the
``snapviz collect`` command. Importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["record", "Recorder", "run", "RunOptions", "TrainRecorder", "record_training"]


def __getattr__(name: str) -> Any:
    # lazy, so `import collectors` (and snapviz --help) stays free of torch. The submodule
    # collectors.record is itself callable (it forwards to record.record), so the name works
    # whether Python resolves it to the module or to the function.
    if name in ("record", "Recorder"):
        module = importlib.import_module("collectors.record")
        return module if name == "record" else module.Recorder
    if name in ("TrainRecorder", "record_training"):
        return getattr(importlib.import_module("collectors.train_record"), name)
    if name in ("run", "RunOptions"):
        return getattr(importlib.import_module("collectors.runner"), name)
    raise AttributeError(name)
