"""Per-snapshot tables of frames and stacks, built once and handed to every analysis.

Everything the frame-based analyses ask is answered per unique frame or per unique stack
(regexes run once per distinct function / file name, then a max-reduction over
``stack_frames``), then mapped onto events with numpy gathers. One :class:`StackTables`
belongs to one snapshot; ``summary.analyze_run`` builds it and passes it along, so
nothing is cached at module level.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.frame_rules import Rule
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.model import Snapshot

# Native frames of stacks="all" / "cpp": no Python line, a C/C++ source or object file.
_NATIVE_FILE = re.compile(r"(^$|^\?\?$|\.(c|cc|cpp|cxx|cu|h|hpp|cuh|so(\.\d+)*|o)$)")


def python_frames(files: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """Bool per frame: a Python source line (not a C++ frame of a ``stacks="all"`` trace)."""
    native = np.fromiter((_NATIVE_FILE.search(str(f)) is not None for f in files), bool, len(files))
    return (lines > 0) & ~native


class StackTables:
    """Frame and stack tables of one snapshot, with the per-stack answers computed so far."""

    def __init__(self, snap: Snapshot) -> None:
        fr = snap.frames
        self.snap = snap
        self.n_frames = len(fr)
        self.n_stacks = len(snap.stacks)
        names = fr["name"].astype(str).to_numpy() if len(fr) else np.empty(0, object)
        files = (
            fr["filename"].astype(str).str.replace("\\", "/", regex=False).to_numpy()
            if len(fr)
            else np.empty(0, object)
        )
        self.names, self.files = names, files
        self.lines = fr["line"].to_numpy().astype(np.int64) if len(fr) else np.empty(0, np.int64)
        self.name_codes, self.name_uniques = pd.factorize(names)
        self.file_codes, self.file_uniques = pd.factorize(files)
        self.is_python = python_frames(files, self.lines)
        sf = snap.stack_frames
        sid = sf["stack_id"].to_numpy().astype(np.int64)
        fid = sf["frame_id"].to_numpy().astype(np.int64)
        depth = sf["depth"].to_numpy().astype(np.int64)
        order = np.lexsort((depth, sid))  # by stack, innermost first
        self.sf_stack, self.sf_frame, self.sf_depth = sid[order], fid[order], depth[order]
        self._starts = (
            np.flatnonzero(np.r_[True, self.sf_stack[1:] != self.sf_stack[:-1]]) if len(sid) else np.empty(0, np.int64)
        )
        self.has_python = self.per_stack_max(self.is_python.astype(np.int8), 0).astype(bool)
        self._masks: dict[tuple[str | None, str | None], np.ndarray] = {}
        self._matches = 0  # regex searches run so far, bounded by Limits.rule_matches
        self._max_matches = Limits.from_env().rule_matches
        self.results: dict[Any, Any] = {}  # per-instance memo of derived per-stack arrays

    def per_stack_max(self, per_frame: np.ndarray, fill: int) -> np.ndarray:
        """Max over each stack's frames of a per-frame value (``fill`` for empty stacks)."""
        out = np.full(self.n_stacks, fill, dtype=per_frame.dtype if per_frame.dtype != bool else np.int8)
        if len(self._starts):
            red = np.maximum.reduceat(per_frame[self.sf_frame], self._starts)
            out[self.sf_stack[self._starts]] = red
        return out

    def innermost(self, frame_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per stack, the depth and frame id of the innermost frame in ``frame_mask`` (-1: none)."""
        depth = np.full(self.n_stacks, -1, np.int64)
        frame = np.full(self.n_stacks, -1, np.int64)
        sel = np.flatnonzero(frame_mask[self.sf_frame]) if len(self.sf_frame) else np.empty(0, np.int64)
        if len(sel):
            first = sel[np.r_[True, self.sf_stack[sel][1:] != self.sf_stack[sel][:-1]]]  # rows sorted innermost first
            depth[self.sf_stack[first]] = self.sf_depth[first]
            frame[self.sf_stack[first]] = self.sf_frame[first]
        return depth, frame

    def frame_mask(self, rule: Rule) -> np.ndarray:
        """Bool per frame: the rule's function and file regexes both match."""
        key = (rule.function, rule.file)
        m = self._masks.get(key)
        if m is None:
            m = np.ones(self.n_frames, bool)
            for rx, uniques, codes in (
                (rule.function_re, self.name_uniques, self.name_codes),
                (rule.file_re, self.file_uniques, self.file_codes),
            ):
                if rx is not None:
                    self._matches += len(uniques)
                    if self._matches > self._max_matches:
                        raise LimitExceeded(f"rules ({rule.name})", "rule_matches", self._matches, self._max_matches)
                    hit = np.fromiter((rx.search(s) is not None for s in uniques), bool, len(uniques))
                    m &= hit[codes] if len(hit) else np.zeros(self.n_frames, bool)
            self._masks[key] = m
        return m

    def rules_mask(self, rules: tuple[Rule, ...] | list[Rule]) -> np.ndarray:
        """Bool per frame: some rule of ``rules`` matches it."""
        m = np.zeros(self.n_frames, bool)
        for r in rules:
            m |= self.frame_mask(r)
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
            np.maximum(frame_rank, np.where(self.frame_mask(r), rank_of[i], -1), out=frame_rank)
        stack_rank = self.per_stack_max(frame_rank, -1)
        out = np.where(
            stack_rank >= 0, np.asarray(order, np.int64)[np.clip(stack_rank, 0, None)] if len(order) else -1, -1
        )
        self.results[key] = out
        return out

    def stacks_matching(self, rules: tuple[Rule, ...] | list[Rule]) -> np.ndarray:
        """Bool per stack: some frame matches one of ``rules``."""
        return self.per_stack_max(self.rules_mask(rules).astype(np.int8), 0).astype(bool)
