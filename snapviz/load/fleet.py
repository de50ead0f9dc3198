"""The inputs of ``ranks`` and ``history``: files, folders, globs and fsspec URLs expanded into
one entry per run, with the rank and iteration their paths name.

Layouts recognised from names only (general, no per-tool special case beyond the words):
torchtitan's ``memory_snapshot/iteration_N/rankR_memory_snapshot.pickle``, ``rank_R``/``rank-R``
and ``iter_N``/``step_N`` in a file or folder name, and run directories (``run.json``, e.g.
``snapviz collect`` under torchrun: one directory per rank). What the run itself says (run.json's
``rank``, the trace's ``distributedInfo``) is read by the task that digests it.

A URL (``s3://…``, ``gs://…``, anything fsspec knows) is expanded and fetched through fsspec
when its filesystem package is installed; the file is copied to a temporary folder on the
worker, loaded there with the same safe loaders, and removed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from snapviz.errors import InputError
from snapviz.load import SNAPSHOT_NAMES, TRACE_NAMES, sidecar_names

# A snapshot or trace file among others in a folder (a run directory is taken whole).
_RUN_FILE = re.compile(r"\.(pickle|pkl)(\.(gz|xz|zst|bz2))?$|(^|[._-])trace\.json(\.gz)?$", re.IGNORECASE)
_RANK = re.compile(r"(?:^|[^a-z0-9])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)
_ITERATION = re.compile(r"(?:^|[^a-z0-9])(?:iteration|iter|step)[_-]?(\d+)(?![0-9])", re.IGNORECASE)
_GLOB_CHARS = re.compile(r"[*?\[]")
FSSPEC_INSTALL = "pip install 'snapviz[fleet]' (and the filesystem's package, e.g. s3fs, gcsfs)"


@dataclass(frozen=True)
class FleetInput:
    """One run of a fleet: where it is, and the rank and iteration its path names (None: not named)."""

    source: str
    rank: int | None
    iteration: int | None


def is_url(path: str) -> bool:
    """``s3://bucket/x`` and the like (``file://`` too); a Windows drive letter is not one."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://", path)
    return m is not None


def _named(pattern: re.Pattern[str], path: str) -> int | None:
    """The number ``pattern`` finds in the file name, else in the nearest folder name that has one."""
    parts = [p for p in re.split(r"[\\/]+", path.rstrip("/\\")) if p]
    for part in reversed(parts):
        m = pattern.findall(part)
        if m:
            return int(m[-1])
    return None


def rank_from_path(path: str) -> int | None:
    """``…/rank3_memory_snapshot.pickle`` -> 3; ``…/rank_12/run.json`` -> 12; None when no name says."""
    return _named(_RANK, path)


def iteration_from_path(path: str) -> int | None:
    """``…/iteration_20/rank0_memory_snapshot.pickle`` -> 20 (also ``iter_N``, ``step_N``)."""
    return _named(_ITERATION, path)


def _walk_local(folder: str) -> list[str]:
    """Run directories and snapshot/trace files under ``folder``, in name order."""
    out: list[str] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        if "run.json" in files and any(n in files for n in (*SNAPSHOT_NAMES, *TRACE_NAMES)):
            out.append(root)
            dirs[:] = []  # a run directory's files are that run
            continue
        out.extend(os.path.join(root, f) for f in sorted(files) if _RUN_FILE.search(f))
    return out


def _expand_local(item: str) -> list[str]:
    if _GLOB_CHARS.search(item) and not os.path.exists(item):
        found = sorted(glob.glob(item, recursive=True))
        if not found:
            raise InputError(f"{item}: matches no file")
        out: list[str] = []
        for f in found:
            out.extend(_expand_local(f) if os.path.isdir(f) else [f])
        return out
    if not os.path.exists(item):
        raise InputError(f"{item}: no such file or directory")
    if os.path.isdir(item):
        if os.path.isfile(os.path.join(item, "run.json")):
            return [item]
        found = _walk_local(item)
        if not found:
            raise InputError(f"{item}: holds no snapshot, trace or run directory")
        return found
    return [item]


def _fs(url: str) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise InputError(f"{url}: reading URLs needs fsspec: {FSSPEC_INSTALL}") from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as exc:  # the filesystem's package is missing, an unknown scheme
        raise InputError(f"{url}: {exc}") from None


def _expand_url(item: str) -> list[str]:
    fs, path = _fs(item)
    protocol = item.split("://", 1)[0]

    def url(p: str) -> str:
        return p if is_url(p) else f"{protocol}://{p.lstrip('/') if protocol != 'file' else p}"

    try:
        if _GLOB_CHARS.search(path):
            found = sorted(fs.glob(path))
        elif fs.isdir(path):
            found = sorted(p for p in fs.find(path) if _RUN_FILE.search(p.rsplit("/", 1)[-1]))
        else:
            found = [path] if fs.exists(path) else []
    except OSError as exc:
        raise InputError(f"{item}: {exc}") from None
    if not found:
        raise InputError(f"{item}: matches no file")
    return [url(p) for p in found]


def expand_inputs(items: list[str] | tuple[str, ...]) -> list[FleetInput]:
    """Every run the inputs name, once each, in the order given (folders and globs in name order)."""
    seen: set[str] = set()
    out: list[FleetInput] = []
    for item in items:
        for src in _expand_url(item) if is_url(item) else _expand_local(item):
            key = src if is_url(src) else os.path.abspath(src)
            if key in seen:
                continue
            seen.add(key)
            out.append(FleetInput(src, rank_from_path(src), iteration_from_path(src)))
    return out


@contextmanager
def local_copy(source: str) -> Iterator[str]:
    """A local path for ``source``: itself, or for a URL a temporary copy (with its run.json
    when there is one: a run directory's, or the file's own ``rank3_run.json``, so a run's own
    figures come along), removed afterwards."""
    if not is_url(source):
        yield source
        return
    fs, path = _fs(source)
    tmp = tempfile.mkdtemp(prefix="snapviz-fleet-")
    try:
        name = path.rstrip("/").rsplit("/", 1)[-1] or "input"
        dest = os.path.join(tmp, name)
        try:
            if fs.isdir(path):
                os.mkdir(dest)
                for n in ("run.json", *SNAPSHOT_NAMES, *TRACE_NAMES):
                    if fs.exists(f"{path.rstrip('/')}/{n}"):
                        fs.get(f"{path.rstrip('/')}/{n}", os.path.join(dest, n))
            else:
                fs.get(path, dest)
                folder = path.rsplit("/", 1)[0] if "/" in path else ""
                # the run's own figures come along: run.json, or the file's own (rank3_run.json)
                own = sidecar_names(name) if name not in SNAPSHOT_NAMES else ["run.json"]
                for n in own:
                    if folder and fs.exists(f"{folder}/{n}"):
                        fs.get(f"{folder}/{n}", os.path.join(tmp, n))
                        break
        except OSError as exc:
            raise InputError(f"{source}: {exc}") from None
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
