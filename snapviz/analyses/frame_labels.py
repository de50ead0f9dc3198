"""Stage labels from stack frames, for snapshots nobody labelled.

The ``kind: "stage"`` rules of a :class:`~snapviz.analyses.frame_rules.RuleSet` decide
a stage per unique stack (:class:`~snapviz.analyses.stack_tables.StackTables`), mapped
onto events with numpy gathers, plus one vectorized pass that numbers denoising steps
and resolves ``attach``:

* ``self``: the event takes the rule's stage.
* ``previous``: the event joins the stage that encloses it in time: the nearest earlier
  event with a stage of its own. If that is ``load``/``other`` (outside the pipeline,
  e.g. the first events of a ``__call__``), it joins the next one instead.
* ``next``: the event joins the next stage (an offload hook moves a model in just
  before that model runs).

``denoise`` events are numbered ``denoise/<i>``: a new step starts at a denoiser event
whose previous framed event was not one (the scheduler step or the CFG combine sits
between two denoiser calls); numbering restarts after another stage
(``text_encode``/``vae_decode``: a new pipeline call). Events without frames (frees
under ``context="alloc"``, the autograd engine thread) inherit the label of the previous
event, and so do frees no rule explains (they only say where the last reference died).
Other framed events no rule matches are ``load`` before the first pipeline frame and
``other`` after it. When no event takes a pipeline stage of its own (the rules do not
know the program), there are no labels from here at all.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.frame_rules import ATTACH, RuleSet, load_rules
from snapviz.analyses.stack_tables import StackTables
from snapviz.model import A_FREE, A_FREE_DONE, A_FREE_REQ, A_SEG_FREE, A_SEG_UNMAP, Snapshot

ATTACH_SELF, ATTACH_PREVIOUS, ATTACH_NEXT = range(3)
OUTSIDE_PIPELINE = ("load", "other")
FREE_ACTIONS = np.array([A_FREE_REQ, A_FREE_DONE, A_FREE, A_SEG_FREE, A_SEG_UNMAP], dtype=np.int8)


# --- stage labels ------------------------------------------------------------------------------------


def ffill_index(valid: np.ndarray) -> np.ndarray:
    """Index of the last ``valid`` position at or before each position (-1: none)."""
    idx = np.where(valid, np.arange(len(valid)), -1)
    return np.maximum.accumulate(idx) if len(idx) else idx


def bfill_index(valid: np.ndarray) -> np.ndarray:
    """Index of the first ``valid`` position at or after each position (-1: none)."""
    n = len(valid)
    if not n:
        return np.empty(0, np.int64)
    idx = np.where(valid, np.arange(n), n)
    out = np.minimum.accumulate(idx[::-1])[::-1]
    return np.where(out == n, -1, out)


def _device_rows(snap: Snapshot, ev: pd.DataFrame) -> np.ndarray | None:
    """Rows of ``snap.events`` that ``ev`` is (``snap.device_events(d)``), when it is one
    device of a multi-device snapshot with times; else None."""
    allev = snap.events
    if len(ev) == len(allev) or not len(ev) or "device" not in ev.columns:
        return None
    dev = ev["device"].to_numpy()
    if (dev != dev[0]).any() or (allev["time_us"].to_numpy() < 0).any():
        return None
    rows = np.flatnonzero(allev["device"].to_numpy() == dev[0])
    if len(rows) != len(ev) or not np.array_equal(allev["stack_id"].to_numpy()[rows], ev["stack_id"].to_numpy()):
        return None
    return rows


def label_from_frames(
    snap: Snapshot, ev: pd.DataFrame, rules: RuleSet | None = None, tables: StackTables | None = None
) -> np.ndarray | None:
    """Stage label of every event of ``ev`` (one device's events, in order) from its stack.

    With several devices, the stages run on one process timeline: events of every device
    are labelled together in time order (text encoders on cuda:1 still see the denoising
    and decode that cuda:0 runs), then ``ev``'s rows are returned.
    Returns an object array of str, or None when no event has Python frames or when no
    stage rule recognises the program (no event takes a pipeline stage of its own: then
    every event would be ``load``/``other``, which says nothing; see
    :mod:`snapviz.analyses.phases` for programs the rules do not know).
    """
    rules = rules if rules is not None else load_rules()
    tables = tables if tables is not None else StackTables(snap)
    if len(ev) == 0 or not len(snap.stacks):
        return None
    rows = _device_rows(snap, ev)
    if rows is not None:
        allev = snap.events
        order = np.argsort(allev["time_us"].to_numpy(), kind="stable")
        merged = _label_events(allev.iloc[order], rules, tables)
        if merged is None:
            return None
        out = np.empty(len(allev), dtype=object)
        out[order] = merged
        return out[rows]
    return _label_events(ev, rules, tables)


def _label_events(ev: pd.DataFrame, rules: RuleSet, tables: StackTables) -> np.ndarray | None:
    n = len(ev)
    stage_rules = rules.of_kind("stage")
    best = tables.best_rule(stage_rules)

    sids = ev["stack_id"].to_numpy().astype(np.int64)
    framed = sids >= 0
    framed[framed] = tables.has_python[sids[framed]]
    if not framed.any():
        return None
    # A free no rule explains says only where the last reference died (a pipeline's locals
    # die in its caller's frame when __call__ returns; gc.collect() frees a dropped model):
    # it inherits the stage before it, like a free without frames.
    freeing = np.isin(ev["action"].to_numpy(), FREE_ACTIONS)
    framed &= ~(freeing & (np.where(framed, best[np.clip(sids, 0, None)], -1) < 0))
    if not framed.any():
        return None

    # Label vocabulary: rule names, then load/other; denoise steps are appended below.
    vocab: list[str] = list(dict.fromkeys([r.name for r in stage_rules] + ["load", "other", "denoise"]))
    code_of = {s: i for i, s in enumerate(vocab)}
    LOAD, OTHER, DENOISE = code_of["load"], code_of["other"], code_of["denoise"]
    outside_codes = [code_of[x] for x in OUTSIDE_PIPELINE]
    rule_code = np.array([code_of[r.name] for r in stage_rules] + [OTHER], np.int64)  # [-1] -> unmatched
    rule_attach = np.array([ATTACH.index(r.attach) for r in stage_rules] + [ATTACH_SELF], np.int64)

    F = np.flatnonzero(framed)
    r = best[sids[F]]
    code = rule_code[r]  # r == -1 picks the trailing 'unmatched' entry
    attach = rule_attach[r]
    matched = r >= 0

    # Framed events no rule explains: 'load' before the pipeline shows up, 'other' after.
    pipeline_hit = matched & ((attach != ATTACH_SELF) | ~np.isin(code, outside_codes))
    if not (matched & (attach == ATTACH_SELF) & ~np.isin(code, outside_codes)).any():
        return None  # no pipeline stage of its own anywhere: the rules do not know this program
    first_pipe = int(np.argmax(pipeline_hit)) if pipeline_hit.any() else len(F)
    code = np.where(~matched & (np.arange(len(F)) < first_pipe), LOAD, code)

    # Denoising steps: one per run of consecutive denoiser events (among framed events).
    definite = attach == ATTACH_SELF
    is_den = definite & (code == DENOISE)
    starts = is_den & ~np.r_[False, is_den[:-1]]
    calls = np.cumsum(starts)  # calls started so far
    reset = definite & ~np.isin(code, [DENOISE, *outside_codes])  # text_encode / vae_decode: a new call
    last_reset = ffill_index(reset)
    calls_at_reset = np.where(last_reset >= 0, calls[np.clip(last_reset, 0, None)], 0)
    step = calls - calls_at_reset - 1
    if is_den.any():
        n_steps = int(step[is_den].max()) + 1
        base = len(vocab)
        vocab += [f"denoise/{i}" for i in range(n_steps)]
        code = np.where(is_den, base + step, code)

    # attach=previous / next: join the enclosing stage in time.
    prev_i = ffill_index(definite)
    next_i = bfill_index(definite)
    prev_c = np.where(prev_i >= 0, code[np.clip(prev_i, 0, None)], -1)
    next_c = np.where(next_i >= 0, code[np.clip(next_i, 0, None)], -1)
    outside = (prev_c < 0) | np.isin(prev_c, outside_codes)
    want_prev = attach == ATTACH_PREVIOUS
    want_next = attach == ATTACH_NEXT
    res_prev = np.where(outside & (next_c >= 0), next_c, np.where(prev_c >= 0, prev_c, code))
    res_next = np.where(next_c >= 0, next_c, np.where(prev_c >= 0, prev_c, code))
    code = np.where(want_prev, res_prev, np.where(want_next, res_next, code))

    # Frameless events inherit the previous event's label (the first ones, the next).
    all_codes = np.full(n, -1, np.int64)
    all_codes[F] = code
    fi = ffill_index(framed)
    bi = bfill_index(framed)
    src = np.where(fi >= 0, fi, bi)
    all_codes = all_codes[src]
    return np.array(vocab, dtype=object)[all_codes]
