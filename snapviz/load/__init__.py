"""Files in, model out: snapshot pickles, Chrome traces and run directories."""

from __future__ import annotations

import gc
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from snapviz.errors import InputError
from snapviz.load.json_stream import scan_top_level
from snapviz.load.limits import LimitExceeded, Limits
from snapviz.load.opener import check_regular_file, read_bounded
from snapviz.load.safe_pickle import open_decompressed, safe_load_pickle
from snapviz.safe_text import printable, short_repr

if TYPE_CHECKING:
    from snapviz.load.chrome_trace import ChromeTrace
    from snapviz.model import Snapshot

# The table builders (snapshot, chrome_trace) need pandas, about a third of a second to
# import: they are imported when a file is read, so `import snapviz`, `--help` and the
# CLI's option checks stay light.

SNAPSHOT_NAMES = ("snapshot.pickle", "snapshot.pickle.gz", "snapshot.pickle.xz", "snapshot.pickle.zst", "snapshot.pkl")
TRACE_NAMES = ("trace.json.gz", "trace.json")


@dataclass(frozen=True)
class Run:
    """Everything known about one run: a snapshot, a Chrome trace, and/or ``run.json``.

    ``run.json`` is held here only: analyses that read it (the stage timeline, the image
    geometry) take it as an argument, so a snapshot is the file's content and nothing else.
    """

    source: str
    label: str
    snapshot: Snapshot | None
    trace: ChromeTrace | None
    run_json: dict[str, Any] | None  # run.json (schema snapviz.run/1), a run directory's or a sidecar

    def __repr__(self) -> str:
        rj = self.run_json or {}
        alloc = rj.get("allocator") if isinstance(rj.get("allocator"), dict) else {}
        peak = alloc.get("max_memory_allocated") if alloc else None
        return short_repr(
            "Run",
            self.label,
            f"source {printable(self.source, 120)!r}",
            repr(self.snapshot) if self.snapshot is not None else "no snapshot",
            repr(self.trace) if self.trace is not None else "no trace",
            f"run.json: pipeline {printable(rj.get('pipeline'), 40)!r}, device {printable(rj.get('device_name'), 60)!r}"
            + (f", allocator peak {peak:,} B" if isinstance(peak, int) else "")
            if self.run_json is not None
            else "no run.json",
        )


RUN_JSON_MAX_BYTES = 16 << 20  # run.json is a few KiB; collectors write nothing larger


_SNAPSHOT_SUFFIX = re.compile(r"(_memory_snapshot|_snapshot)?\.(pickle|pkl)(\.(gz|xz|zst|bz2))?$", re.IGNORECASE)


def sidecar_names(base: str) -> list[str]:
    """The names a snapshot file's own run.json may have beside it, most specific first:
    ``rank3_memory_snapshot.pickle.xz`` -> ``rank3_run.json``, ``rank3.run.json``,
    ``rank3_memory_snapshot_run.json``…; none for a name that is only a suffix."""
    m = _SNAPSHOT_SUFFIX.search(base)
    if m is None or m.start() == 0:
        return []
    stems = dict.fromkeys([base[: m.start()], base[: m.start() + len(m.group(1) or "")]])
    return [name for stem in stems for name in (f"{stem}_run.json", f"{stem}.run.json")]


def file_sidecar(path: str) -> str | None:
    """The run.json of one snapshot among others in a folder (torchtitan-style per-rank files:
    :func:`sidecar_names`), or None."""
    folder, base = os.path.split(path)
    return next((c for n in sidecar_names(base) if os.path.isfile(c := os.path.join(folder, n))), None)


def _read_run_json(path: str) -> dict[str, Any]:
    raw = read_bounded(path, RUN_JSON_MAX_BYTES, "run.json")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable run.json ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("snapviz.run/"):
        raise InputError(f"{path}: not a snapviz run.json (no 'schema': 'snapviz.run/1')")
    return data


def _sniff(path: str) -> str:
    """'trace', 'json' (other JSON) or 'pickle', decided by structure, not by a prefix.

    JSON (first byte after whitespace and a BOM is ``{`` or ``[``; no pickle opcode is
    either) has its top-level keys streamed until ``traceEvents``, however large the
    values before it; everything else goes to the pickle reader, whose opcode scan
    says precisely what is wrong with it.
    """
    limits = Limits.from_env()
    try:
        with open_decompressed(path, limits=limits) as f:
            first = b""
            seen = 0
            while not first:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                if seen == 0:
                    chunk = chunk.removeprefix(b"\xef\xbb\xbf")
                first = chunk.lstrip()[:1]
                seen += len(chunk)
                if seen > limits.header_bytes and not first:
                    raise LimitExceeded(path, "header_bytes", seen, limits.header_bytes, " bytes")
    except InputError:
        raise
    except (OSError, EOFError, ValueError) as exc:  # bad gzip/xz header and the like
        raise InputError(
            f"{path}: corrupt compressed file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None
    if first not in (b"{", b"["):
        return "pickle"
    if first == b"[":
        return "trace"  # load_chrome_trace explains: a JSON array is not a trace object
    top = scan_top_level(path, limits)
    return "trace" if top.has_events or "schemaVersion" in top.meta else "json"


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk load.

    Unpickling a snapshot creates millions of dicts; each allocation burst triggers a GC
    pass over everything already loaded, which makes a default ``pickle.load`` about 3x
    slower than the unpickling itself. Snapshots contain no reference cycles (plain
    dicts/lists of scalars), so refcounting frees them and nothing is lost by pausing.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_snapshot(path: str) -> Snapshot:
    """A snapshot pickle (any compression) as the columnar model."""
    from snapviz.compiled import min_size
    from snapviz.load.columnar import columnar_snapshot  # pandas: see the imports above
    from snapviz.load.snapshot import snapshot_from_dict
    from snapviz.model import Snapshot

    def columnar(data: bytes) -> Callable[[], Snapshot | None] | None:
        # From ``pickle_tape`` bytes on (snapviz.compiled.MIN_SIZE) numba is loaded for the safety
        # scan anyway, so the tape costs only its run.
        return columnar_snapshot(data, path) if len(data) >= min_size("pickle_tape") else None

    with paused_gc():
        raw = safe_load_pickle(path, build=columnar)
        return raw if isinstance(raw, Snapshot) else snapshot_from_dict(raw, source=path)


def load(path: str | os.PathLike[str], label: str | None = None) -> Run:
    """Load a snapshot pickle, a Chrome trace, or a run directory (``run.json`` + files)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InputError(f"{p}: no such file or directory")
    check_regular_file(p)  # a FIFO would block here forever, a device never end
    run_json: dict[str, Any] | None = None
    snap_path = trace_path = None
    if os.path.isdir(p):
        rj = os.path.join(p, "run.json")
        if not os.path.lexists(rj):
            raise InputError(
                f"{p}: is a directory without run.json (pass a snapshot file, a trace, or a run directory)"
            )
        run_json = _read_run_json(rj)
        # A member that exists in any form is the run's file: a FIFO, a device or a link into
        # /proc named snapshot.pickle is refused by the opener, not skipped.
        snap_path = next((os.path.join(p, n) for n in SNAPSHOT_NAMES if os.path.lexists(os.path.join(p, n))), None)
        trace_path = next((os.path.join(p, n) for n in TRACE_NAMES if os.path.lexists(os.path.join(p, n))), None)
        if snap_path is None and trace_path is None:
            raise InputError(f"{p}: run directory holds neither a snapshot nor a trace")
    else:
        kind = _sniff(p)
        if kind == "json":
            if os.path.basename(p) == "run.json":
                return load(os.path.dirname(p) or ".", label)
            raise InputError(f"{p}: JSON, but neither a Chrome trace nor a snapviz run.json")
        if kind == "trace":
            trace_path = p
        else:
            snap_path = p
        # A snapshot or trace inside a run directory picks up the run's sidecar.
        sidecar = os.path.join(os.path.dirname(p), "run.json")
        base = os.path.basename(p)
        if os.path.lexists(sidecar) and (base in SNAPSHOT_NAMES or base in TRACE_NAMES):
            run_json = _read_run_json(sidecar)
        elif (own := file_sidecar(p)) is not None:
            run_json = _read_run_json(own)
    snapshot = load_snapshot(snap_path) if snap_path else None
    trace = None
    if trace_path:
        from snapviz.load.chrome_trace import load_chrome_trace  # pandas: see the imports above

        trace = load_chrome_trace(trace_path)
    name = label or (os.path.basename(os.path.normpath(p)) if os.path.isdir(p) else os.path.basename(p))
    return Run(source=p, label=name, snapshot=snapshot, trace=trace, run_json=run_json)
