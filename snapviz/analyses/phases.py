"""Generic PyTorch phases from stack frames, for programs no stage rule recognises.

Any PyTorch program shows the same few phases in its frames, whatever the model:
``forward`` (a module call), ``backward`` (``Tensor.backward`` / ``torch.autograd`` on the
main thread, ``torch::autograd::Engine`` frames on the autograd thread when C++ frames
were recorded), ``optimizer`` (``torch/optim``, including user optimizers through its
``step`` wrapper), ``zero_grad``, and ``load`` (module construction, ``.to()``, weight
loading). The ``kind: "phase"`` rules of the rules file say which frames mean which
phase; the ``load`` phase reuses the ``load`` stage rules (they are torch's, not a
pipeline's).

Per framed event (vectorized, per unique stack then gathers):

* the best phase rule of its stack gives its phase;
* a framed event no rule matches (a loss computed outside any module, the data of the
  next batch) joins a ``forward``/``backward`` just before it and is unlabelled
  otherwise: nothing here guesses ``load``;
* frees no rule explains, and events without frames, inherit the previous event's label;
* steps: a ``forward`` that follows a ``backward``, ``optimizer`` or ``zero_grad`` phase
  (after an earlier forward) starts a new micro-batch, an ``optimizer`` phase a new optimizer
  step; with several, ``forward``/``backward`` are numbered ``phase/<micro-batch>`` and
  ``optimizer``/``zero_grad`` ``phase/<step>`` (``load`` is not), as the collector labels them;
* gradient checkpointing's recomputation (module frames under ``torch/utils/checkpoint.py``'s
  unpack hook) is ``backward``: a phase rule says so.

Returns None when no event matches a phase rule (the caller then says it does not know
the program's stages).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.frame_labels import FREE_ACTIONS, ffill_index
from snapviz.analyses.frame_rules import RuleSet
from snapviz.analyses.stack_tables import StackTables

FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD, LOAD = "forward", "backward", "optimizer", "zero_grad", "load"
PHASES = (FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD, LOAD)


def phase_rules(rules: RuleSet) -> tuple:
    """The phase rules, then the ``load`` stage rules that keep their stage (attach self)."""
    return rules.of_kind("phase") + tuple(r for r in rules.of_kind("stage", LOAD) if r.attach == "self")


def label_phases(ev: pd.DataFrame, rules: RuleSet, tables: StackTables, unlabelled: str) -> np.ndarray | None:
    """Phase label of every event of ``ev`` (one device's events, in time order), or None;
    ``unlabelled`` is the label of events no phase explains."""
    n = len(ev)
    prules = phase_rules(rules)
    if not n or not prules or not tables.n_stacks:
        return None
    best = tables.best_rule(prules)
    names = [r.name for r in prules]
    vocab = list(dict.fromkeys([*PHASES, *names, unlabelled]))
    code_of = {s: i for i, s in enumerate(vocab)}
    rule_code = np.array([code_of[nm] for nm in names] + [-1], np.int64)  # [-1]: unmatched

    sids = ev["stack_id"].to_numpy().astype(np.int64)
    has_stack = sids >= 0
    r = np.where(has_stack, best[np.clip(sids, 0, max(tables.n_stacks - 1, 0))], -1)
    code = rule_code[r]
    matched = code >= 0
    if not matched.any():
        return None
    framed = matched | (has_stack & tables.has_python[np.clip(sids, 0, max(tables.n_stacks - 1, 0))])
    framed &= matched | ~np.isin(ev["action"].to_numpy(), FREE_ACTIONS)  # unexplained frees say little

    # Unmatched framed events: join a forward/backward just before them, else unlabelled.
    prev = ffill_index(matched)
    prev_code = np.where(prev >= 0, code[np.clip(prev, 0, None)], -1)
    joins = ~matched & np.isin(prev_code, [code_of[FORWARD], code_of[BACKWARD]])
    code = np.where(matched, code, np.where(joins, prev_code, code_of[unlabelled]))

    # Micro-batches: a forward right after a backward or optimizer phase starts the next one.
    definite = matched
    last = ffill_index(definite)
    before = np.r_[-1, last[:-1]]
    before_code = np.where(before >= 0, code[np.clip(before, 0, None)], -1)
    is_fwd = definite & (code == code_of[FORWARD])
    after_a_forward = (np.cumsum(is_fwd) - is_fwd) > 0
    starts = (
        is_fwd & after_a_forward & np.isin(before_code, [code_of[BACKWARD], code_of[OPTIMIZER], code_of[ZERO_GRAD]])
    )
    micro = np.cumsum(starts)
    # Optimizer steps: a micro-batch that follows an optimizer or zero_grad phase starts the next
    # one. Counted apart, so that with gradient accumulation forward/backward carry the micro-batch
    # and optimizer/zero_grad the step (as `snapviz collect --train` labels them); counted from the
    # forwards, since a step that allocates nothing (fused AdamW once its state exists) leaves no
    # optimizer event to count.
    step = np.cumsum(starts & np.isin(before_code, [code_of[OPTIMIZER], code_of[ZERO_GRAD]]))

    # Frameless events and unexplained frees inherit the previous framed event's label.
    fi = ffill_index(framed)
    src = np.where(fi >= 0, fi, int(np.argmax(framed)) if framed.any() else 0)
    code, micro, step = code[src], micro[src], step[src]
    labels = np.array(vocab, dtype=object)[code]
    if int(micro.max()) > 0 or int(step.max()) > 0:
        by_step = np.isin(code, [code_of[OPTIMIZER], code_of[ZERO_GRAD]])
        number = np.where(by_step, step, micro)
        numbered = ~np.isin(code, [code_of[unlabelled], code_of[LOAD]])  # steps of training, not set-up
        labels = np.where(numbered, labels + "/" + number.astype(str).astype(object), labels)
    return labels
