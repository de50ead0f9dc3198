"""Stage attribution: every trace event gets a stage label.

Sources, best first (docs/design.md, "Stage labels"): ``user_metadata`` stamped by
``_set_memory_metadata`` (per thread: another thread's unlabelled entries without Python frames
take the label in effect, :func:`_from_metadata`); ``external_annotations`` named like pipeline stages; the stage
timeline of a run directory's ``run.json``; then the structure the file has:

* ``frames``: the stage rules (:mod:`snapviz.analyses.frame_labels`), when they
  recognise the program (a diffusers pipeline, or a program a ``--rules`` file knows);
* ``phases``: otherwise, generic PyTorch phases from frames (``forward``, ``backward``,
  ``optimizer``, ``zero_grad``, ``load``; :mod:`snapviz.analyses.phases`); also when the built-in
  rules recognise the model but its frames hold a backward or an optimizer step (fine-tuning a
  pipeline's UNet is training, not denoising);
* over the phases (or nothing), ``record_function`` ranges: the profiler's ``Optimizer.step#…`` and
  ``Optimizer.zero_grad#…`` are the ``optimizer`` and ``zero_grad`` phases,
  ``ProfilerStep#N`` numbers the step (``phase/N``), and a user's own ranges
  (``## forward ##`` → ``forward``) label what they enclose; the ranges torch's data-parallel
  wrappers open (``DistributedDataParallel.forward``, FSDP's ``FSDP::*``) and the collectives'
  (``gloo:all_reduce``) are no user's stages: they belong to the phase that encloses them;
* events with a ``compile_context`` (recorded while ``torch.compile`` compiles) are
  ``compile`` unless a pipeline rule labelled them.

Nothing recognised: every event is ``unlabelled`` and the source is ``none``; nothing
guesses ``load``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.frame_rules import RuleSet, load_rules
from snapviz.analyses.phases import BACKWARD, FORWARD, OPTIMIZER, ZERO_GRAD, label_phases
from snapviz.analyses.stack_tables import StackTables
from snapviz.arrays import unique
from snapviz.load.limits import ENV, Limits
from snapviz.model import Snapshot
from snapviz.vocab import CANONICAL_STAGES, STAGE_SEP, UNLABELLED, stage_group

CANONICAL = CANONICAL_STAGES  # re-exported for the trace analyses


def _looks_like_stage(name: str) -> bool:
    return stage_group(name) in CANONICAL


@dataclass
class StageLabels:
    """Per-event labels for one device's events plus where they came from."""

    labels: np.ndarray  # object array of str, one per event
    source: str  # user_metadata | annotations | run.json | frames | phases | none
    notes: tuple[str, ...] = ()  # what bound_labels grouped, if anything (warnings of the report)


OTHER_STAGES = "other stages"


def bound_labels(labels: np.ndarray, limits: Limits | None = None) -> tuple[np.ndarray, list[str]]:
    """``labels`` with at most ``limits.stages`` distinct labels and ``limits.stage_intervals``
    intervals (runs of one label), and the warnings saying what was grouped (none: nothing).

    Every stage costs a table row, a chart band and a summary entry in every output
    (~1 ms each): a file naming 300,000 stages (distinct user_metadata, steps or ranges)
    ran for minutes. Labels after the first ``stages`` distinct ones (in order of
    appearance) become :data:`OTHER_STAGES`; past ``stage_intervals`` intervals, every
    event from the start of the last one allowed on is :data:`OTHER_STAGES` too."""
    lim = limits or Limits.from_env()
    n = len(labels)
    if n < 2:
        return labels, []
    change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    notes = [range_names_note()] if bool((labels == OTHER_STAGES).any()) else []  # range_labels' cap
    if len(change) + 1 <= min(lim.stages, lim.stage_intervals):
        return labels, notes  # no more labels than intervals: within both bounds
    codes, distinct = pd.factorize(labels)  # in order of first appearance
    keep = max(lim.stages, 1)
    if len(distinct) > keep:
        labels = np.where(codes < keep, labels, OTHER_STAGES).astype(object)
        notes.append(stages_note(len(distinct), keep))
        change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    most = max(lim.stage_intervals, 1)
    if len(change) + 1 > most:
        cut = int(change[most - 2]) if most >= 2 else 0
        labels = labels.copy()
        labels[cut:] = OTHER_STAGES
        notes.append(
            f"{len(change) + 1:,} stage intervals: from event #{cut:,} on, {len(change) + 2 - most:,} "
            f"grouped as '{OTHER_STAGES}' ({ENV['stage_intervals']}={most:,}; docs/security.md)"
        )
    return labels, notes


def stages_note(found: int, keep: int) -> str:
    """The warning for distinct stage names past the bound (snapshots and traces)."""
    return (
        f"{found:,} distinct stage labels: the first {keep:,} are shown, {found - keep:,} more grouped "
        f"as '{OTHER_STAGES}' ({ENV['stages']}={keep:,}; docs/security.md)"
    )


def range_names_note() -> str:
    """The warning for record_function range names past :func:`range_labels`' cap."""
    return (
        f"record_function range names past the first {10 * Limits.from_env().stages:,} distinct ones "
        f"are grouped as '{OTHER_STAGES}' (10 x {ENV['stages']})"
    )


def _from_metadata(snap: Snapshot, ev: pd.DataFrame, tables: StackTables | None = None) -> np.ndarray | None:
    """Labels stamped by ``_set_memory_metadata``, carried over to other threads' entries.

    The metadata is per thread: autograd's backward thread (and any other thread) records
    its entries with no label and no Python frames while the labelling thread's label is in
    effect. The rule (docs/design.md, "Stage labels"): in time order, a labelled entry sets
    the label in effect; an unlabelled entry *with* Python frames clears it (a Python thread
    that carries no label: the user cleared it, or never labelled that thread); an unlabelled
    entry without Python frames belongs to the label in effect, or stays ``unlabelled`` before
    the first label. Python that torch runs on its own threads (its outermost Python frame is
    torch's: autograd hooks, checkpointing's recomputation, DDP's communication hooks; or a
    data-loader thread's loop) counts as frame-less: it takes the label in effect and clears nothing. When the labelled entries carry no Python frames at all (the snapshot was
    recorded without stacks), the two cannot be told apart and unlabelled entries stay
    ``unlabelled``.
    """
    mids = ev["metadata_id"].to_numpy()
    if not (mids > 0).any():
        return None
    strings = np.array(snap.strings, dtype=object)
    # Users may stamp "stage=denoise/3" style strings: keep the value. An empty label is a cleared one.
    values = np.array([s.split("=", 1)[1] if s.startswith("stage=") else s for s in strings], dtype=object)
    labels = values[mids]
    unset = (mids == 0) | (labels == "")
    labels[unset] = UNLABELLED
    if not unset.any() or not len(snap.stacks):
        return labels
    tables = tables if tables is not None else StackTables(snap)
    sids = ev["stack_id"].to_numpy().astype(np.int64)
    framed = sids >= 0
    framed[framed] = tables.has_python[sids[framed]]
    if not framed[~unset].any():
        return labels
    # Python that torch runs on its own threads (autograd hooks, checkpointing's recomputation,
    # DDP's communication hooks, data-loader threads) carries no label either: it belongs to the
    # label in effect like the engine's frame-less entries, and clears nothing.
    helper = framed & unset
    helper[helper] = _torch_thread_stacks(snap, tables)[sids[helper]]
    framed &= ~helper
    # Entries that set the label in effect: labelled ones, and unlabelled ones with Python frames.
    setter = ~unset | framed
    last = np.maximum.accumulate(np.where(setter, np.arange(len(labels)), -1))
    inherit = unset & ~framed & (last >= 0)
    labels[inherit] = labels[last[inherit]]
    return labels


# The outermost Python frame of a stack that torch's C++ entered (the autograd engine calling a
# hook or a custom Function), or a data-loader / process-group helper thread anywhere in it.
_TORCH_FILE = re.compile(r"(?:^|/)torch/")
_HELPER_THREAD_FILE = re.compile(r"(?:^|/)torch/utils/data/_utils/(?:pin_memory|worker)\.py$")


def _torch_thread_stacks(snap: Snapshot, tables: StackTables) -> np.ndarray:
    """Bool per stack: its Python part runs on a thread torch drives, not on the user's: the
    outermost Python frame is torch's own (the engine entered Python at a hook), or it passes
    through a data-loader thread's loop. A user's thread starts in the user's script (or the
    interpreter's ``threading``/``runpy``), never inside torch."""
    out = np.zeros(tables.n_stacks, bool)
    sf = snap.stack_frames
    if not len(sf) or not tables.n_frames:
        return out
    fid = sf["frame_id"].to_numpy()
    py = tables.is_python[fid]
    sid, depth, fid = sf["stack_id"].to_numpy()[py], sf["depth"].to_numpy()[py], fid[py]
    if not len(sid):
        return out
    files = tables.files
    is_torch = np.fromiter((_TORCH_FILE.search(str(f)) is not None for f in files), bool, len(files))
    helper = np.fromiter((_HELPER_THREAD_FILE.search(str(f)) is not None for f in files), bool, len(files))
    order = np.lexsort((-depth, sid))  # per stack, outermost Python frame first
    sid, fid = sid[order], fid[order]
    first = np.r_[True, sid[1:] != sid[:-1]]
    out[sid[first]] = is_torch[fid[first]]
    out |= np.bincount(sid, weights=helper[fid], minlength=tables.n_stacks)[: tables.n_stacks] > 0
    return out


def annotation_intervals(snap: Snapshot, device: int | None = None) -> pd.DataFrame:
    """Pair START/END annotations (a stack per name, so nesting and repeats work): an END
    closes the latest open START of its name (an END with none open is dropped, as is a
    START never closed).

    Vectorized (a loop per annotation cost ~4 us, 1M annotations 2 x 4 s): per name, in file
    order, the open count is the running sum of +1 (START) / -1 (END) reflected at zero (an
    END that would go below is dropped); an END at level L closes the START that last rose
    to L, so within one (name, level) STARTs and ENDs alternate and pair in order."""
    ann = snap.annotations
    if device is not None and len(ann):
        ann = ann[(ann["device"] == device) | (ann["device"] < 0)]
    cols = ["name", "start_us", "end_us"]
    stage = ann["stage"].to_numpy() if len(ann) else np.empty(0, object)
    step = np.where(stage == "START", 1, np.where(stage == "END", -1, 0)).astype(np.int64)
    keep = np.flatnonzero(step != 0)
    if not len(keep):
        return pd.DataFrame([], columns=cols)
    names = ann["name"].to_numpy()[keep]
    times = ann["time_us"].to_numpy()[keep]
    step = step[keep]
    codes, _ = pd.factorize(names)
    order = np.argsort(codes, kind="stable")  # each name's annotations together, in file order
    c, st = codes[order], step[order]
    first = np.r_[True, c[1:] != c[:-1]]
    csum = np.cumsum(st)
    base = np.maximum.accumulate(np.where(first, np.arange(len(c)), 0))  # each row's group start
    prefix = csum - (csum[base] - st[base])  # running sum within the name
    low = np.minimum(_group_running_min(prefix, first), 0)
    prev_low = np.r_[0, low[:-1]]
    prev_low[first] = 0
    valid = ~((st < 0) & (prefix < prev_low))  # an END that would take the open count below zero
    depth = prefix - low  # the reflected open count after each row
    level = np.where(st > 0, depth, depth + 1)
    v = np.flatnonzero(valid)
    o2 = v[np.lexsort((v, level[v], c[v]))]  # by name, level, then file order
    is_start = st[o2] > 0
    pair = is_start[:-1] & ~is_start[1:] & (c[o2][:-1] == c[o2][1:]) & (level[o2][:-1] == level[o2][1:])
    s_rows, e_rows = o2[:-1][pair], o2[1:][pair]
    if not len(s_rows):
        return pd.DataFrame([], columns=cols)
    out = pd.DataFrame({"name": names[order][s_rows], "start_us": times[order][s_rows], "end_us": times[order][e_rows]})
    out = out.iloc[np.argsort(order[e_rows], kind="stable")]  # in the order the ENDs come, as the loop made them
    return out.sort_values(["start_us", "end_us"], ascending=[True, False]).reset_index(drop=True)


def _group_running_min(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running minimum of ``values`` restarting where ``first`` is True (groups contiguous):
    each group is shifted below every earlier one, so one running minimum never looks back
    across a group start."""
    span = int(values.max() - values.min()) + 1
    offset = (np.cumsum(first) - 1) * span
    return np.minimum.accumulate(values - offset) + offset


def label_by_intervals(times: np.ndarray, intervals: pd.DataFrame, default: str = UNLABELLED) -> np.ndarray:
    """Label each time with the innermost interval of ``intervals`` containing it (``default``
    where none does): the one labeller for snapshots and traces.

    Innermost = the interval entered last (latest ``start_us``, bounds inclusive); on equal
    starts, the one that ends first (it lies inside the other); then the later row. For
    ranges nested as a thread's stack nests them this is the deepest one, without needing a
    depth column; for ranges that overlap without nesting (two threads) it is the one most
    recently entered. ``times`` need not be sorted; the result is an object array aligned
    with them.

    Computed as painting the intervals in that order would label the times (later paint
    wins), without painting: a time's label is the last interval, in that order, among those
    starting at or before it, that ends at or after it — found for all times at once by a
    descent over a sparse table of the intervals' running maximum end, O((n + m) log m) for n
    times and m intervals (painting cost O(n x m) when ranges nest: 500,000 nested annotations
    took hours).
    """
    labels = np.full(len(times), default, dtype=object)
    if not len(intervals) or not len(times):
        return labels
    starts, ends = intervals["start_us"].to_numpy(), intervals["end_us"].to_numpy()
    # the paint order: by start, then longer (outer) first, then row order
    order = np.lexsort((np.arange(len(starts)), -ends.astype(np.float64), starts))
    names = intervals["name"].to_numpy()[order]
    start, end = starts[order], ends[order]
    t = np.asarray(times)
    k = np.searchsorted(start, t, "right")  # intervals [0, k) start at or before t
    # table[p][i] = max(end[i : i + 2**p]); descend from k over blocks that all end before t
    table = [end]
    width = 1
    while width * 2 <= len(end):
        prev = table[-1]
        table.append(np.maximum(prev[:-width], prev[width:]))
        width *= 2
    j = k.copy()
    for p in range(len(table) - 1, -1, -1):
        step = 1 << p
        cand = j - step
        ok = cand >= 0
        idx = np.flatnonzero(ok)
        skip = table[p][cand[idx]] < t[idx]
        j[idx[skip]] = cand[idx[skip]]
    # j: the first of the run of intervals before k that all end before t; j - 1 contains t
    hit = j > 0
    hit[hit] = end[j[hit] - 1] >= t[hit]
    labels[hit] = names[j[hit] - 1]
    return labels


def _from_annotations(snap: Snapshot, ev: pd.DataFrame, device: int) -> np.ndarray | None:
    """Labels from annotations named like pipeline stages (``denoise/3``), else None."""
    iv = annotation_intervals(snap, device)
    if not len(iv) or (ev["time_us"] < 0).all():
        return None
    stagey = iv[iv["name"].map(_looks_like_stage)]
    return label_by_intervals(ev["time_us"].to_numpy(), stagey) if len(stagey) else None


_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_OPTIMIZER_RANGE = re.compile(r"^Optimizer\.(zero_grad|step)#")
# The ranges torch's data-parallel wrappers open around the wrapped module's forward.
_PARALLEL_FORWARD = re.compile(r"^(DistributedDataParallel|FullyShardedDataParallel)\.forward$")
# Ranges the process-group backends open around each collective (``gloo:all_reduce``,
# ``nccl:broadcast``, ``record_param_comms``): communication, whatever phase issued it.
_COLLECTIVE_RANGE = re.compile(r"^((gloo|nccl|mpi|ucc|xccl|c10d)::?\w|record_param_comms$)")
COMMUNICATION = "communication"
# Ranges FSDP opens around its own hooks (FSDP2's ``FSDP::pre_forward (layers.3)``,
# ``FSDP::post_backward_reduce``, ``FSDP::all_gather``; FSDP1's
# ``FullyShardedDataParallel._pre_forward``): torch's plumbing inside the training phases, never
# a user's stage. A name that says forward or backward fills that phase where nothing else says
# which; the rest (all-gather, copy-out, reshard) belong to whichever phase encloses them.
_WRAPPER_RANGE = re.compile(r"^(FSDP::|FullyShardedDataParallel\.)")
_WRAPPER_BACKWARD = re.compile(r"backward", re.IGNORECASE)
_WRAPPER_FORWARD = re.compile(r"forward|inputs_to_device", re.IGNORECASE)


def wrapper_range_phase(name: str) -> str | None:
    """For a range FSDP opens (:data:`_WRAPPER_RANGE`): ``backward`` (``FSDP::pre_backward``,
    ``FSDP::post_backward_reduce``, ``FSDP::backward_prefetch for …``), ``forward``
    (``FSDP::pre_forward``, ``FSDP::root_pre_forward``, ``FSDP::cast_forward_inputs``), or ``""``
    (``FSDP::all_gather``, ``FSDP::all_gather_copy_out``: the enclosing phase's). None for any
    other range."""
    if not _WRAPPER_RANGE.match(name) or _PARALLEL_FORWARD.match(name):
        return None
    if _WRAPPER_BACKWARD.search(name):
        return BACKWARD
    return FORWARD if _WRAPPER_FORWARD.search(name) else ""


_HASHES = re.compile(r"^#+\s*|\s*#+$")
_COMPILED_GRAPH = re.compile(r"^Call CompiledFxGraph (\w+)$")


def range_stage(name: str) -> str:
    """The stage a ``record_function`` range names: ``Optimizer.step#AdamW.step`` ->
    ``optimizer``, ``Optimizer.zero_grad#…`` -> ``zero_grad``, ``ProfilerStep#3`` ->
    ``step/3``, inductor's ``## Call CompiledFxGraph <key> ##`` -> ``compiled graph/<key[:8]>``,
    a user's ``## forward ##`` -> ``forward``; any other name as it is."""
    phase = _range_phase(name)
    if phase is not None:
        return phase
    if _COLLECTIVE_RANGE.match(name):
        return COMMUNICATION
    m = _PROFILER_STEP.match(name)
    if m:
        return f"step/{m.group(1)}"
    inner = _HASHES.sub("", name) or name
    m = _COMPILED_GRAPH.match(inner)
    return f"compiled graph/{m.group(1)[:8]}" if m else inner


# Repetitive ranges (torchtitan's ``FSDP::all_gather (layers.3)``, per-layer ``layers.0``,
# ``layers.1`` …) become one phase each, with the detail one level down (``phase/detail``).
MAX_PHASES = 20
_NUMBER = re.compile(r"\d+")
_QUALIFIED = re.compile(r"^(?P<head>.*?\S)\s*\((?P<detail>[^()]*)\)$")
_TRAILING_INDEX = re.compile(r"^(?P<head>.*?[^\d._:#\-\s])[._:#\-\s]*(?P<index>\d+)$")
_PREFIX = re.compile(r"^(?P<head>[^:.\s]+?)(::|\.|\s)(?P<rest>.+)$")


def _repeated_key(name: str) -> tuple[str, str]:
    """(phase, detail) if ``name`` has siblings that differ from it only by a qualifier in
    parentheses or by numbers: ``FSDP::pre_forward (layers.0)`` -> (``FSDP::pre_forward``,
    ``layers.0``); ``layers.12`` -> (``layers``, ``12``); ``block3_conv`` -> (``block#_conv``,
    ``block3_conv``)."""
    m = _QUALIFIED.match(name)
    if m:
        return _NUMBER.sub("#", m["head"]), m["detail"]
    m = _TRAILING_INDEX.match(name)
    if m and not _NUMBER.search(m["head"]):
        return m["head"], m["index"]
    return _NUMBER.sub("#", name), name


def range_labels(names: list[str]) -> dict[str, str]:
    """The stage label of each ``record_function`` range name (:func:`range_stage`), with
    repetitive names grouped so a report has a handful of phases, not one per range:

    1. names that differ only by numbers or by a qualifier in parentheses, when at least
       two share the rest, become that phase, the difference one level down
       (``layers.0``, ``layers.1`` -> ``layers/0``, ``layers/1``; ``FSDP::all_gather
       (layers.3)`` -> ``FSDP::all_gather/layers.3``);
    2. if more than :data:`MAX_PHASES` phases remain, phases sharing a leading name
       (before ``::``, ``.`` or a space) become that name, the full name one level down
       (``FSDP::all_gather/…``, ``FSDP::reduce_scatter/…`` -> ``FSDP/…``).

    Names the profiler gives a meaning (optimizer, ProfilerStep, compiled graphs) and
    names already holding ``/`` keep their :func:`range_stage` label.
    """
    distinct = list(dict.fromkeys(names))
    # Each name costs a few regex matches (~80 us): past 10x the stage limit the rest are
    # 'other stages' at once (bound_labels / the trace's bound then say how many stages were grouped).
    cap = 10 * Limits.from_env().stages
    labels = {n: range_stage(n) for n in distinct[:cap]}
    extra = {n: OTHER_STAGES for n in distinct[cap:]}
    free = [n for n, lab in labels.items() if lab == (_HASHES.sub("", n) or n) and STAGE_SEP not in lab]
    keys = {n: _repeated_key(labels[n]) for n in free}
    count: dict[str, int] = {}
    for phase, _ in keys.values():
        count[phase] = count.get(phase, 0) + 1
    for n, (phase, detail) in keys.items():
        if count[phase] > 1:
            labels[n] = f"{phase}{STAGE_SEP}{detail}"
    groups = {stage_group(lab) for lab in labels.values()}
    if len(groups) > MAX_PHASES:
        heads: dict[str, set[str]] = {}
        for n in free:
            m = _PREFIX.match(stage_group(labels[n]))
            if m:
                heads.setdefault(m["head"], set()).add(stage_group(labels[n]))
        for n in free:
            m = _PREFIX.match(stage_group(labels[n]))
            if m and len(heads[m["head"]]) > 1:
                labels[n] = f"{m['head']}{STAGE_SEP}{_HASHES.sub('', n) or n}"
    return {**labels, **extra}


COMPILE = "compile"
_NO_CONTEXT = ("", "N/A")


def _compiling(snap: Snapshot, ev: pd.DataFrame) -> np.ndarray:
    """Bool per event: recorded inside a ``torch.compile`` compilation (its
    ``compile_context``, e.g. autotuning benchmarks), not while running compiled code."""
    ids = ev["compile_id"].to_numpy() if "compile_id" in ev.columns else np.zeros(len(ev), np.int64)
    real = np.array([s not in _NO_CONTEXT for s in snap.strings], dtype=bool)
    return real[ids] if len(ids) and len(real) else np.zeros(len(ev), bool)


def _range_phase(name: str) -> str | None:
    """``Optimizer.step#AdamW.step`` -> optimizer, ``Optimizer.zero_grad#…`` -> zero_grad,
    ``DistributedDataParallel.forward`` (and FSDP's) -> forward."""
    if _PARALLEL_FORWARD.match(name):
        return FORWARD
    m = _OPTIMIZER_RANGE.match(name)
    return None if m is None else (ZERO_GRAD if m.group(1) == "zero_grad" else OPTIMIZER)


def _paint(labels: np.ndarray, times: np.ndarray, iv: pd.DataFrame) -> np.ndarray:
    """Bool per event: inside one of ``iv``'s ranges (and ``labels`` set to its name there)."""
    got = label_by_intervals(times, iv, default="")
    inside = got != ""
    labels[inside] = got[inside]
    return inside


def _with_annotations(
    snap: Snapshot, ev: pd.DataFrame, device: int, base: np.ndarray | None
) -> tuple[np.ndarray, bool] | None:
    """``base`` (or unlabelled) with the record_function ranges painted over it; the bool
    says whether a user's own range labelled something. None when no range covers an event."""
    iv = annotation_intervals(snap, device)
    times = ev["time_us"].to_numpy()
    if not len(iv) or not len(ev) or (times < 0).all():
        return None
    names = iv["name"].astype(str)
    phase = names.map(_range_phase)
    step = names.map(lambda s: m.group(1) if (m := _PROFILER_STEP.match(s)) else None)
    wrapper = names.map(wrapper_range_phase)
    comm = names.str.match(_COLLECTIVE_RANGE.pattern) | (wrapper == "")
    user = phase.isna() & step.isna() & ~comm & wrapper.isna()
    labels = base.copy() if base is not None else np.full(len(ev), UNLABELLED, dtype=object)
    # FSDP's ranges run inside the phases: where the frames (or the profiler's ranges) say the
    # phase, it holds them; only where nothing does, a range named for forward or backward says it.
    said = wrapper.notna() & (wrapper != "")
    by_wrapper = label_by_intervals(times, iv[said].assign(name=wrapper[said]), default="")
    in_wrapper = (by_wrapper != "") & (labels == UNLABELLED)
    labels[in_wrapper] = by_wrapper[in_wrapper]
    # A collective inside a phase is that phase's (DDP's all-reduce runs in backward, so the
    # backward peak is the allocator's); only outside every phase is it a stage of its own.
    comm_only = label_by_intervals(times, iv[comm].assign(name=COMMUNICATION), default="")
    in_comm = (comm_only != "") & (labels == UNLABELLED)
    labels[in_comm] = COMMUNICATION
    base_step = np.array([str(x).split("/", 1)[1] if "/" in str(x) else "" for x in labels], dtype=object)
    in_phase = _paint(labels, times, iv[phase.notna()].assign(name=phase[phase.notna()]))
    grouped = range_labels(names[user].tolist())
    in_user = _paint(labels, times, iv[user].assign(name=[grouped[n] for n in names[user]]))
    numbered = in_phase & ~in_user & (base_step != "")
    labels[numbered] = labels[numbered] + "/" + base_step[numbered]
    # ProfilerStep#N numbers the steps; with them, no other numbering is kept, but a grouped
    # range keeps its detail beside the step: ``FSDP::pre_forward/1 (layers.15)``.
    steps = label_by_intervals(times, iv[step.notna()].assign(name=step[step.notna()]), default="")
    in_step = (steps != "") & (labels != UNLABELLED)
    if in_step.any():
        detail = np.array([str(a).partition(STAGE_SEP)[2] for a in labels], dtype=object)
        detail = np.where(in_user & (detail != ""), " (" + detail + ")", "")
        labels = np.array([stage_group(str(a)) for a in labels], dtype=object)
        labels[in_step] = labels[in_step] + STAGE_SEP + steps[in_step] + detail[in_step]
    if not (in_phase | in_user | in_step | in_comm | in_wrapper).any():
        return None
    return labels, bool(in_user.any())


def _from_run_json(run_json: dict[str, Any] | None, ev: pd.DataFrame) -> np.ndarray | None:
    stages = (run_json or {}).get("stages") or []
    if not stages or (ev["time_us"] < 0).all():
        return None
    iv = pd.DataFrame(
        [(s["name"], s["start_us"], s["end_us"]) for s in stages if "start_us" in s],
        columns=["name", "start_us", "end_us"],
    )
    return label_by_intervals(ev["time_us"].to_numpy(), iv, default="other")


def _trains(labels: np.ndarray) -> bool:
    """Phase labels that hold a backward or an optimizer step: a training program."""
    return bool({stage_group(str(x)) for x in unique(labels)} & {BACKWARD, OPTIMIZER})


SOURCES = ("user_metadata", "annotations", "run.json", "frames", "phases")


def label_events(
    snap: Snapshot,
    ev: pd.DataFrame,
    device: int,
    use: str = "auto",
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
    run_json: dict[str, Any] | None = None,
) -> StageLabels:
    """Stage label of every event of one device, from the best source present
    (:func:`_label_events`), bounded by :func:`bound_labels` (its warnings in ``notes``)."""
    got = _label_events(snap, ev, device, use, rules, tables, run_json)
    labels, notes = bound_labels(got.labels)
    return StageLabels(labels, got.source, tuple(notes))


def _label_events(
    snap: Snapshot,
    ev: pd.DataFrame,
    device: int,
    use: str = "auto",
    rules: RuleSet | None = None,
    tables: StackTables | None = None,
    run_json: dict[str, Any] | None = None,
) -> StageLabels:
    """Stage label of every event of one device, from the best source present.

    ``use`` forces a source (one of :data:`SOURCES`). ``rules`` defaults to the built-in
    rules, ``tables`` to the snapshot's stack tables (pass both when analysing further).
    ``run_json`` (the run's ``run.json``, if any) supplies the collector's stage timeline.
    """
    want = SOURCES if use == "auto" else (use,)
    if "user_metadata" in want and (labels := _from_metadata(snap, ev, tables)) is not None:
        return StageLabels(labels, "user_metadata")
    if "annotations" in want and (labels := _from_annotations(snap, ev, device)) is not None:
        return StageLabels(labels, "annotations")
    if "run.json" in want and (labels := _from_run_json(run_json, ev)) is not None:
        return StageLabels(labels, "run.json")
    rules = rules if rules is not None else load_rules()
    tables = tables if tables is not None else StackTables(snap)
    base, source = None, "none"
    if "frames" in want:
        base = label_from_frames(snap, ev, rules, tables)
        source = "frames" if base is not None else source
    # Training a pipeline's model: the built-in stage rules call its forward a pipeline stage (a
    # UNet call is 'denoise'), but backward and optimizer frames say what the program does. A
    # user's rules file that names stages is taken at its word.
    if "phases" in want and (base is None or (use == "auto" and rules.source == "builtin")):
        phased = label_phases(ev, rules, tables, UNLABELLED)
        if phased is not None and (base is None or _trains(phased)):
            base, source = phased, "phases"
    # Ranges paint over generic phases only: a pipeline the rules recognise keeps its own
    # stages and step numbers (its ProfilerStep#N counts pipeline calls, not denoising steps).
    if (
        "annotations" in want
        and source != "frames"
        and (painted := _with_annotations(snap, ev, device, base)) is not None
    ):
        base, by_user = painted
        source = "annotations" if by_user or source == "none" else source
    if source in ("phases", "none", "annotations") and (compiling := _compiling(snap, ev)).any():
        base = base if base is not None else np.full(len(ev), UNLABELLED, dtype=object)
        base = np.where(compiling, COMPILE, base)
        source = "phases" if source == "none" else source
    if base is None:
        return StageLabels(np.full(len(ev), UNLABELLED, dtype=object), "none")
    return StageLabels(base, source)


def stage_intervals(labels: np.ndarray, times: np.ndarray) -> pd.DataFrame:
    """Contiguous runs of one label: ``name``, ``start_row``, ``end_row`` (exclusive), times."""
    n = len(labels)
    if n == 0:
        return pd.DataFrame(columns=["name", "start_row", "end_row", "start_us", "end_us"])
    change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    return pd.DataFrame(
        {
            "name": labels[starts],
            "start_row": starts,
            "end_row": ends,
            "start_us": times[starts],
            "end_us": times[ends - 1],
        }
    )


def stage_table(
    intervals: pd.DataFrame, allocated: np.ndarray, reserved: np.ndarray, baseline: int, baseline_reserved: int
) -> pd.DataFrame:
    """Per interval: peak allocated/reserved (as ``max_memory_*`` after a reset at the
    stage's start would report: the peak includes what was live on entry), entry/exit."""
    rows = []
    for name, s, e, t0, t1 in intervals[["name", "start_row", "end_row", "start_us", "end_us"]].itertuples(index=False):
        entry = int(allocated[s - 1]) if s > 0 else baseline
        entry_res = int(reserved[s - 1]) if s > 0 else baseline_reserved
        seg = allocated[s:e]
        k = int(np.argmax(seg))
        peak = max(entry, int(seg[k]))
        rows.append(
            {
                "name": name,
                "group": stage_group(str(name)),
                "start_row": int(s),
                "end_row": int(e),
                "start_us": int(t0),
                "end_us": int(t1),
                "peak_allocated_bytes": peak,
                "peak_row": int(s + k) if int(seg[k]) >= entry else int(s - 1),
                "peak_reserved_bytes": max(entry_res, int(reserved[s:e].max())),
                "allocated_at_entry": entry,
                "allocated_at_exit": int(allocated[e - 1]),
                "duration_s": max(0, int(t1) - int(t0)) / 1e6,
            }
        )
    cols = [
        "name",
        "group",
        "start_row",
        "end_row",
        "start_us",
        "end_us",
        "peak_allocated_bytes",
        "peak_row",
        "peak_reserved_bytes",
        "allocated_at_entry",
        "allocated_at_exit",
        "duration_s",
    ]
    return pd.DataFrame(rows, columns=cols)
