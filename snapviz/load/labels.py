"""Names of runs in a comparison, from their paths (``runs/sdxl-fp16/`` -> ``sdxl-fp16``)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

from snapviz.errors import InputError

_SUFFIXES = (".gz", ".xz", ".zst", ".bz2", ".pickle", ".pkl", ".json")


def default_label(path: str) -> str:
    """``runs/sdxl-fp16/`` -> ``sdxl-fp16``; ``base.pickle.xz`` -> ``base``; a run directory's
    ``snapshot.pickle`` or ``trace.json.gz`` -> the directory's name."""
    norm = os.path.normpath(path)
    if os.path.isdir(norm):
        return os.path.basename(os.path.abspath(norm))
    name = os.path.basename(norm)
    if name.startswith(("snapshot.", "trace.json")) and os.path.basename(os.path.dirname(os.path.abspath(norm))):
        return os.path.basename(os.path.dirname(os.path.abspath(norm)))
    stem = name
    while True:
        for suf in _SUFFIXES:
            if stem.endswith(suf) and len(stem) > len(suf):
                stem = stem[: -len(suf)]
                break
        else:
            return stem or name


def unique_labels(paths: Sequence[str], given: Sequence[str], what: str = "labels") -> list[str]:
    """``given`` names in input order; the rest from file or directory names, made unique.
    ``what`` names the given names in the error when there are more than inputs."""
    if len(given) > len(paths):
        raise InputError(f"{len(given)} {what} for {len(paths)} inputs")
    labels = list(given)
    for p in paths[len(given) :]:
        labels.append(default_label(p))
    counts = Counter(labels)  # linear: a fleet has thousands of inputs
    dups = {lab for lab, n in counts.items() if n > 1}
    for i, lab in enumerate(labels):
        if lab in dups and i >= len(given):
            parent = os.path.basename(os.path.dirname(os.path.abspath(paths[i])))
            labels[i] = f"{parent}/{lab}" if parent else lab
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        if lab in seen:
            seen[lab] += 1
            labels[i] = f"{lab}#{seen[lab]}"
        else:
            seen[lab] = 1
    return labels
