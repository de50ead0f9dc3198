"""Record a training loop with phase labels: ``forward/<i>``, ``backward/<i>``, ``optimizer/<i>``,
``zero_grad/<i>`` (plus ``load`` and ``other``), the same three ways as inference stages
(memory-history metadata, profiler ranges, run.json with the allocator's per-phase peaks).

``_set_memory_metadata`` is per thread, and on CUDA the autograd engine runs backward on its
own device thread, so a label set on the Python thread does not reach the allocations made
in backward (gradients, recomputed activations, temporaries). :meth:`TrainRecorder.backward`
registers a hook on the tensor it differentiates: the hook runs first on that thread, before
the root node allocates anything, and stamps the current phase label there too.

Usage around your own loop::

    import collectors
    with collectors.record(model, "runs/mine", train=True) as rec:
        with rec.stage("load"):
            model.to("cuda")
        for batch in batches:
            with rec.phase("forward"):
                loss = model(batch).mean()
            rec.backward(loss)                  # the phase backward/<i>, autograd thread labelled
            with rec.phase("optimizer"):
                opt.step()
            with rec.phase("zero_grad"):
                opt.zero_grad()
            rec.next_step()
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .recorder import STAGE_OTHER, Recorder

PHASES = ("forward", "backward", "optimizer", "zero_grad")


def _set_label(label: str) -> None:
    if hasattr(torch.cuda.memory, "_set_memory_metadata"):  # torch >= 2.10
        torch.cuda.memory._set_memory_metadata(label)


class TrainRecorder(Recorder):
    """A :class:`Recorder` for training: phases indexed by step, backward's thread labelled.

    Forward and backward phases are indexed by micro-batch (``forward/<i>``), optimizer and
    zero_grad phases by optimizer step; with gradient accumulation the two differ. Each phase's
    run.json stage also carries ``step`` (its optimizer step) and, for forward and backward,
    ``micro`` (the micro-batch), so every name is unique and the loop's structure readable.
    """

    def __init__(self, model: Any, out_dir: Any, **kwargs: Any) -> None:
        kwargs.setdefault("initial_stage", STAGE_OTHER)
        super().__init__(None, out_dir, **kwargs)
        self.model = model
        self.step = 0
        self.micro = 0
        # ident of each thread the hook labelled: the run says which threads backward used
        self.backward_threads: set[int] = set()
        self._main_thread = threading.get_ident()

    def next_step(self) -> None:
        """The optimizer step is done: later optimizer/zero_grad phases get the next index."""
        self.step += 1

    def phase_label(self, name: str) -> str:
        index = self.micro if name in ("forward", "backward") else self.step
        return f"{name}/{index}"

    @contextlib.contextmanager
    def phase(self, name: str, after: str = STAGE_OTHER, chain: bool = False) -> Iterator[str]:
        """Run a block as ``name/<index>``; ``after`` starts when it ends unless ``chain``
        (then the phase stays open until the next :meth:`mark`, so phases stay contiguous)."""
        label = self.phase_label(name)
        self.mark(label)
        try:
            yield label
        finally:
            if name == "backward":
                self.micro += 1
            if not chain:
                self.mark(after)

    def label_autograd(self, tensor: torch.Tensor, label: str | None = None) -> None:
        """Stamp ``label`` (default: the current phase) on the thread that runs ``tensor``'s
        backward, before its first node allocates."""
        if not (self.history and tensor.requires_grad and tensor.grad_fn is not None):
            return
        label = label or (self._current["name"] if self._current else "")
        rec = self

        def hook(grad: torch.Tensor) -> None:
            ident = threading.get_ident()
            if ident != rec._main_thread:
                _set_label(label)
                rec.backward_threads.add(ident)

        tensor.register_hook(hook)

    def backward(self, loss: torch.Tensor, chain: bool = False, **kwargs: Any) -> None:
        """``loss.backward(**kwargs)`` as phase ``backward/<micro>``, the autograd thread too."""
        with self.phase("backward", chain=chain) as label:
            self.label_autograd(loss, label)
            loss.backward(**kwargs)

    def mark(self, label: str | None) -> None:
        super().mark(label)
        # indices as of the phase's start (it closes only when the next phase opens)
        if label is not None and self._current is not None and label.split("/")[0] in PHASES:
            self._current["step"] = self.step
            if label.split("/")[0] in ("forward", "backward"):
                self._current["micro"] = self.micro

    def _close(self, cur: dict[str, Any], *args: Any) -> None:
        super()._close(cur, *args)
        self.stages[-1].update({k: cur[k] for k in ("step", "micro") if k in cur})

    def run_info(self, status: str | None = None) -> dict[str, Any]:
        info = super().run_info(status)
        info.setdefault("train", {})["backward_threads_labelled"] = len(self.backward_threads)
        return info


def record_training(model: Any, out_dir: Any, **kwargs: Any) -> TrainRecorder:
    """A :class:`TrainRecorder` for ``model`` writing to ``out_dir``; use it as a context
    manager (keyword arguments as :func:`collectors.record`)."""
    return TrainRecorder(model, out_dir, **kwargs)
