"""``snapviz collect --train``: option checks, progress and exit codes around
:func:`collectors.train.run_training` (same contract as inference collection)."""

from __future__ import annotations

import sys
from typing import Any

import click
import torch

from snapviz.progress import Bar, wanted

from .errors import OptionError
from .techniques import TechniqueError
from .train import TrainOptions, run_training, validate


def collect_train(*, model: str | None, **kwargs: Any) -> None:
    if model:
        raise OptionError("--model is not supported with --train (the denoiser is built from the in-code config)")
    opts = TrainOptions(**kwargs)
    try:
        plan = validate(opts)
    except (TechniqueError, ValueError) as err:
        raise OptionError(str(err)) from None
    bar = Bar(opts.steps, "train", show=wanted())
    try:
        run_dir = run_training(opts, plan, on_step=lambda step: bar.update(1))
    except torch.OutOfMemoryError:
        bar.close()
        click.echo(f"out of memory; the snapshot up to the failure is in {opts.out}", err=True)
        sys.exit(1)
    finally:
        bar.close()
    click.echo(str(run_dir))
