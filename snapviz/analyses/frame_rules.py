"""Stage labels and memory categories from stack frames, for snapshots nobody labelled.

Rules live in a JSON data file (``snapviz/rules/diffusers.json``; format in
``docs/rules.md``). Each rule names a stage (``kind: "stage"``) or a memory category
(``kind: "category"``) and matches a frame by a ``function`` regex on the bare
``co_name`` and a ``file`` regex on the path (both on the same frame). A stack takes
the highest-``priority`` rule matching any of its frames; ties go to the rule listed
first.

Everything is computed once per unique stack (regexes run once per unique function
name / file name, then a max-reduction over ``stack_frames``) and mapped onto events
with numpy gathers, plus one vectorized pass that numbers denoising steps and resolves
``attach``:

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
``other`` after it.
"""
from __future__ import annotations

import json
import os
import re
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from snapviz.errors import InputError
from snapviz.model import A_FREE, A_FREE_DONE, A_FREE_REQ, A_SEG_FREE, A_SEG_UNMAP, Snapshot

RULES_SCHEMA = "snapviz.rules/1"
KINDS = ("stage", "category")
ATTACH = ("self", "previous", "next")
LIFETIMES = ("any", "short", "long")
ATTACH_SELF, ATTACH_PREVIOUS, ATTACH_NEXT = range(3)
OUTSIDE_PIPELINE = ("load", "other")
FREE_ACTIONS = np.array([A_FREE_REQ, A_FREE_DONE, A_FREE, A_SEG_FREE, A_SEG_UNMAP], dtype=np.int8)
RULE_KEYS = frozenset({"id", "name", "function", "file", "priority", "kind", "attach", "lifetime", "note"})


@dataclass(frozen=True)
class Rule:
    """One rule of a rules file (see docs/rules.md)."""

    name: str
    function: str | None
    file: str | None
    priority: int
    kind: str = "stage"
    attach: str = "self"
    lifetime: str = "any"
    id: str | None = None

    @property
    def function_re(self) -> re.Pattern[str] | None:
        return _compile(self.function)

    @property
    def file_re(self) -> re.Pattern[str] | None:
        return _compile(self.file)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    source: str

    def of_kind(self, kind: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == kind)


_RE_CACHE: dict[str, re.Pattern[str]] = {}


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    rx = _RE_CACHE.get(pattern)
    if rx is None:
        rx = _RE_CACHE[pattern] = re.compile(pattern)
    return rx


# --- loading ------------------------------------------------------------------------------------

def builtin_rules_text() -> str:
    return resources.files("snapviz").joinpath("rules/diffusers.json").read_text(encoding="utf-8")


def _parse_rule(raw: Any, where: str, i: int) -> Rule:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: rule {i} is not an object")
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise InputError(f"{where}: rule {i} has unknown key(s) {', '.join(sorted(unknown))} "
                         f"(allowed: {', '.join(sorted(RULE_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: rule {i} needs a non-empty string 'name' (the stage or category)")
    kind = raw.get("kind", "stage")
    if kind not in KINDS:
        raise InputError(f"{where}: rule {i} ({name}): 'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    attach = raw.get("attach", "self")
    if attach not in ATTACH:
        raise InputError(f"{where}: rule {i} ({name}): 'attach' must be one of {', '.join(ATTACH)}, not {attach!r}")
    lifetime = raw.get("lifetime", "any")
    if lifetime not in LIFETIMES:
        raise InputError(f"{where}: rule {i} ({name}): 'lifetime' must be one of {', '.join(LIFETIMES)}, not {lifetime!r}")
    prio = raw.get("priority", 0)
    if isinstance(prio, bool) or not isinstance(prio, (int, float)):
        raise InputError(f"{where}: rule {i} ({name}): 'priority' must be a number")
    pats: dict[str, str | None] = {}
    for key in ("function", "file"):
        pat = raw.get(key)
        if pat is not None:
            if not isinstance(pat, str):
                raise InputError(f"{where}: rule {i} ({name}): '{key}' must be a regular expression string")
            try:
                _compile(pat)
            except re.error as exc:
                raise InputError(f"{where}: rule {i} ({name}): bad '{key}' regex {pat!r}: {exc}") from None
        pats[key] = pat
    if pats["function"] is None and pats["file"] is None:
        raise InputError(f"{where}: rule {i} ({name}): give a 'function' or a 'file' regex (or both)")
    rid = raw.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InputError(f"{where}: rule {i} ({name}): 'id' must be a string")
    return Rule(name=name, function=pats["function"], file=pats["file"], priority=int(prio), kind=kind,
                attach=attach, lifetime=lifetime, id=rid)


def parse_rules(data: Any, where: str) -> tuple[list[Rule], bool, set[str]]:
    """Rules of one file, whether it extends the built-ins, and the built-in ids it disables."""
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise InputError(f"{where}: a rules file is a JSON object with a 'rules' list")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        raise InputError(f"{where}: a rules file is a JSON object with a 'rules' list")
    ext = data.get("extends")
    if ext not in (None, "builtin"):
        raise InputError(f"{where}: 'extends' can only be \"builtin\", not {ext!r}")
    disable = data.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(x, str) for x in disable):
        raise InputError(f"{where}: 'disable' must be a list of rule ids")
    return [_parse_rule(r, where, i) for i, r in enumerate(raw_rules)], ext == "builtin", set(disable)


_RULESET_CACHE: dict[tuple[str, float], RuleSet] = {}


def load_rules(path: str | os.PathLike[str] | None = None) -> RuleSet:
    """The built-in rules, or a user file (replacing them, or ``"extends": "builtin"``).

    With ``extends``, a user rule whose ``id`` equals a built-in rule's replaces it and
    ``"disable": [ids]`` drops built-in rules. Raises InputError (exit 2) on a bad file.
    """
    if path is None:
        key = ("<builtin>", 0.0)
    else:
        p = os.fspath(path)
        try:
            key = (os.path.abspath(p), os.path.getmtime(p))
        except OSError as exc:
            raise InputError(f"{p}: cannot read rules file ({exc.strerror or exc})") from None
    hit = _RULESET_CACHE.get(key)
    if hit is not None:
        return hit
    builtin, _, _ = parse_rules(json.loads(builtin_rules_text()), "built-in rules")
    if path is None:
        rs = RuleSet(tuple(builtin), "builtin")
    else:
        p = os.fspath(path)
        try:
            with open(p, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            raise InputError(f"{p}: cannot read rules file ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise InputError(f"{p}: rules file is not valid JSON ({str(exc).splitlines()[0]})") from None
        user, extends, disable = parse_rules(data, p)
        if extends:
            known = {r.id for r in builtin if r.id}
            missing = sorted(disable - known)
            if missing:
                raise InputError(f"{p}: 'disable' names no built-in rule: {', '.join(missing)}")
            replaced = {r.id for r in user if r.id}
            rules = [r for r in builtin if r.id not in disable and r.id not in replaced] + user
        else:
            rules = user
        rs = RuleSet(tuple(rules), p)
    _RULESET_CACHE[key] = rs
    return rs


# --- per-stack matching ---------------------------------------------------------------------------

class _StackTables:
    """Per-snapshot cache of everything computed per frame / per stack."""

    def __init__(self, snap: Snapshot) -> None:
        fr = snap.frames
        self.n_frames = len(fr)
        self.n_stacks = len(snap.stacks)
        names = fr["name"].astype(str).to_numpy() if len(fr) else np.empty(0, object)
        files = fr["filename"].astype(str).str.replace("\\", "/", regex=False).to_numpy() if len(fr) else np.empty(0, object)
        self.name_codes, self.name_uniques = pd.factorize(names)
        self.file_codes, self.file_uniques = pd.factorize(files)
        lines = fr["line"].to_numpy() if len(fr) else np.empty(0, np.int64)
        is_py = (lines > 0) & ~np.isin(files, np.array(["", "??"], dtype=object))
        sf = snap.stack_frames
        sid = sf["stack_id"].to_numpy().astype(np.int64)
        fid = sf["frame_id"].to_numpy().astype(np.int64)
        depth = sf["depth"].to_numpy()
        if len(sid) and np.any(sid[1:] < sid[:-1]):
            order = np.argsort(sid, kind="stable")
            sid, fid, depth = sid[order], fid[order], depth[order]
        self.sf_stack, self.sf_frame, self.sf_depth = sid, fid, depth
        self._starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]]) if len(sid) else np.empty(0, np.int64)
        self.has_python = self.per_stack_max(is_py.astype(np.int8), 0).astype(bool)
        self.frame_masks: dict[tuple[str | None, str | None], np.ndarray] = {}
        self.results: dict[Any, Any] = {}

    def per_stack_max(self, per_frame: np.ndarray, fill: int) -> np.ndarray:
        out = np.full(self.n_stacks, fill, dtype=per_frame.dtype if per_frame.dtype != bool else np.int8)
        if len(self._starts):
            red = np.maximum.reduceat(per_frame[self.sf_frame], self._starts)
            out[self.sf_stack[self._starts]] = red
        return out

    def frame_mask(self, rule: Rule) -> np.ndarray:
        key = (rule.function, rule.file)
        m = self.frame_masks.get(key)
        if m is None:
            m = np.ones(self.n_frames, bool)
            frx, filerx = rule.function_re, rule.file_re
            if frx is not None:
                hit = np.fromiter((frx.search(s) is not None for s in self.name_uniques), bool, len(self.name_uniques))
                m &= hit[self.name_codes] if len(hit) else np.zeros(self.n_frames, bool)
            if filerx is not None:
                hit = np.fromiter((filerx.search(s) is not None for s in self.file_uniques), bool, len(self.file_uniques))
                m &= hit[self.file_codes] if len(hit) else np.zeros(self.n_frames, bool)
            self.frame_masks[key] = m
        return m

    def best_rule(self, rules: tuple[Rule, ...] | list[Rule]) -> np.ndarray:
        """Index into ``rules`` of the winning rule per stack (-1: none matches)."""
        key = ("best", tuple(rules))
        hit = self.results.get(key)
        if hit is not None:
            return hit
        # Rank rules so that a larger rank wins: priority, then the earlier rule.
        order = sorted(range(len(rules)), key=lambda i: (rules[i].priority, -i))
        rank_of = np.empty(len(rules), np.int64)
        rank_of[order] = np.arange(len(rules))
        frame_rank = np.full(self.n_frames, -1, np.int64)
        for i, r in enumerate(rules):
            m = self.frame_mask(r)
            np.maximum(frame_rank, np.where(m, rank_of[i], -1), out=frame_rank)
        stack_rank = self.per_stack_max(frame_rank, -1)
        out = np.where(stack_rank >= 0, np.asarray(order, np.int64)[np.clip(stack_rank, 0, None)] if len(order) else -1, -1)
        self.results[key] = out
        return out

    def stacks_matching(self, rules: tuple[Rule, ...] | list[Rule]) -> np.ndarray:
        """Bool per stack: some frame matches one of ``rules``."""
        m = np.zeros(self.n_frames, bool)
        for r in rules:
            m |= self.frame_mask(r)
        return self.per_stack_max(m.astype(np.int8), 0).astype(bool)


_TABLES: dict[int, tuple[weakref.ref[Snapshot], _StackTables]] = {}
_ACTIVE_RULES: dict[int, tuple[weakref.ref[Snapshot], str | None]] = {}


def stack_tables(snap: Snapshot) -> _StackTables:
    hit = _TABLES.get(id(snap))
    if hit is not None and hit[0]() is snap and hit[1].n_stacks == len(snap.stacks) and hit[1].n_frames == len(snap.frames):
        return hit[1]
    tables = _StackTables(snap)
    for k in [k for k, (ref, _) in _TABLES.items() if ref() is None]:
        del _TABLES[k]
    _TABLES[id(snap)] = (weakref.ref(snap), tables)
    return tables


def remember_rules(snap: Snapshot, rules_path: str | None) -> None:
    """Record the rules file used for ``snap`` so category/attention analyses use it too."""
    _ACTIVE_RULES[id(snap)] = (weakref.ref(snap), rules_path)


def rules_for(snap: Snapshot, rules_path: str | None = None) -> RuleSet:
    """``rules_path`` if given, else the file last used for ``snap``, else the built-ins."""
    if rules_path is None:
        hit = _ACTIVE_RULES.get(id(snap))
        if hit is not None and hit[0]() is snap:
            rules_path = hit[1]
    return load_rules(rules_path)


# --- stage labels ------------------------------------------------------------------------------------

def _ffill_index(valid: np.ndarray) -> np.ndarray:
    """Index of the last ``valid`` position at or before each position (-1: none)."""
    idx = np.where(valid, np.arange(len(valid)), -1)
    return np.maximum.accumulate(idx) if len(idx) else idx


def _bfill_index(valid: np.ndarray) -> np.ndarray:
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


def label_from_frames(snap: Snapshot, ev: pd.DataFrame, rules_path: str | None = None) -> np.ndarray | None:
    """Stage label of every event of ``ev`` (one device's events, in order) from its stack.

    With several devices, the stages run on one process timeline: events of every device
    are labelled together in time order (text encoders on cuda:1 still see the denoising
    and decode that cuda:0 runs), then ``ev``'s rows are returned.
    Returns an object array of str, or None when no event has Python frames.
    """
    if len(ev) == 0 or not len(snap.stacks):
        return None
    rows = _device_rows(snap, ev)
    if rows is not None:
        allev = snap.events
        order = np.argsort(allev["time_us"].to_numpy(), kind="stable")
        merged = _label_events(snap, allev.iloc[order], rules_path)
        if merged is None:
            return None
        out = np.empty(len(allev), dtype=object)
        out[order] = merged
        return out[rows]
    return _label_events(snap, ev, rules_path)


def _label_events(snap: Snapshot, ev: pd.DataFrame, rules_path: str | None) -> np.ndarray | None:
    n = len(ev)
    rules = load_rules(rules_path)
    remember_rules(snap, rules_path)
    tables = stack_tables(snap)
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
    code = rule_code[r]            # r == -1 picks the trailing 'unmatched' entry
    attach = rule_attach[r]
    matched = r >= 0

    # Framed events no rule explains: 'load' before the pipeline shows up, 'other' after.
    pipeline_hit = matched & ((attach != ATTACH_SELF) | ~np.isin(code, outside_codes))
    first_pipe = int(np.argmax(pipeline_hit)) if pipeline_hit.any() else len(F)
    code = np.where(~matched & (np.arange(len(F)) < first_pipe), LOAD, code)

    # Denoising steps: one per run of consecutive denoiser events (among framed events).
    definite = attach == ATTACH_SELF
    is_den = definite & (code == DENOISE)
    starts = is_den & ~np.r_[False, is_den[:-1]]
    calls = np.cumsum(starts)                                  # calls started so far
    reset = definite & ~np.isin(code, [DENOISE, *outside_codes])   # text_encode / vae_decode: a new call
    last_reset = _ffill_index(reset)
    calls_at_reset = np.where(last_reset >= 0, calls[np.clip(last_reset, 0, None)], 0)
    step = calls - calls_at_reset - 1
    if is_den.any():
        n_steps = int(step[is_den].max()) + 1
        base = len(vocab)
        vocab += [f"denoise/{i}" for i in range(n_steps)]
        code = np.where(is_den, base + step, code)

    # attach=previous / next: join the enclosing stage in time.
    prev_i = _ffill_index(definite)
    next_i = _bfill_index(definite)
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
    fi = _ffill_index(framed)
    bi = _bfill_index(framed)
    src = np.where(fi >= 0, fi, bi)
    all_codes = all_codes[src]
    return np.array(vocab, dtype=object)[all_codes]


# --- categories -------------------------------------------------------------------------------------

def stack_category_rules(snap: Snapshot, rules: RuleSet, exclude: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per stack, the category a rule gives a short-lived and a long-lived allocation.

    Returns (short, long, names): codes into ``names`` (-1: no rule).
    """
    cat_rules = [r for r in rules.of_kind("category") if r.name not in exclude]
    names = list(dict.fromkeys(r.name for r in cat_rules))
    tables = stack_tables(snap)
    out = []
    for life in ("short", "long"):
        sub = tuple(r for r in cat_rules if r.lifetime in ("any", life))
        best = tables.best_rule(sub)
        codes = np.array([names.index(r.name) for r in sub] + [-1], np.int64)
        out.append(codes[best])
    return out[0], out[1], names


def training_evidence(snap: Snapshot) -> bool:
    """Frames of an optimizer or of ``backward``: allocations without Python frames are then
    the autograd engine thread's (gradients)."""
    tables = stack_tables(snap)
    key = ("training",)
    hit = tables.results.get(key)
    if hit is None:
        probe = (Rule("t", None, "torch/optim/", 0), Rule("t", "^(backward|run_backward|_engine_run_backward)$",
                                                          "torch/(autograd/|_tensor\\.py$)", 0))
        hit = bool(any(tables.frame_mask(r).any() for r in probe))
        tables.results[key] = hit
    return hit
