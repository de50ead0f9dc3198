"""Input limits: how much structure an input file may make the loader build.

Snapshots and traces come from strangers' bug tickets, so every quantity the file
controls is bounded while it is read, before the objects exist (docs/security.md,
"Limits"). Each limit is set by one environment variable, read when a file is opened,
so it reaches every entry point alike: ``snapviz analyze``/``compare``/``check``,
their worker processes, the pytest plugin and the library API. A file over a limit is
an :class:`InputError` (exit 2) whose one line names the limit and the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from snapviz.errors import InputError

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_VALUE_RE = re.compile(r"^\s*([0-9]+)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Limits:
    """Every bound with its default. Real inputs sit far below them: the largest real
    file we know (a 1M-event snapshot) has nesting depth 10, ~9M objects, strings under
    1 KiB; real traces compress 20-40x (see docs/security.md for the measurements)."""

    depth: int = 100  # container nesting (pickle and JSON)
    # objects a pickle creates / values in a JSON file: ~72 bytes each at worst when unpickled
    # (an empty dict and its list slot), so 30M stay under 2.2 GiB (30M empty dicts: 2.3 GiB
    # RSS in all); a real snapshot makes ~8 per trace entry, so ~3.7M entries fit
    objects: int = 30_000_000
    expansion: int = 20_000_000_000  # pickle tree size, counting every memo reference in full
    string_length: int = 16 << 20  # one string (or bytes / big int) in bytes
    string_bytes: int = 4 << 30  # all strings a pickle creates, in bytes
    ratio: int = 200  # decompressed size / file size ...
    ratio_floor: int = 64 << 20  # ... once more than this many bytes came out
    header_bytes: int = 64 << 20  # JSON before the "traceEvents" list starts
    decompress_seconds: int = 60  # CPU time spent decompressing one file
    rule_matches: int = 5_000_000  # rule regexes run x distinct frame/file names they run on
    # trace entries, segments, blocks and annotations read again through a shared reference
    # (torch writes a fresh dict per row, so a real file has none): each costs a row built
    # from 2 bytes of pickle
    shared_rows: int = 10_000
    # Stage labels and intervals shown: beyond them the rest is grouped as "other stages" and
    # said in the notes (not refused). Every per-stage table, chart and summary entry costs
    # ~1 ms; a real pipeline has tens of stages, a training snapshot a few per step.
    stages: int = 1_000  # distinct stage labels of one device (or trace)
    stage_intervals: int = 2_000  # stage intervals (runs of one label, or trace ranges)
    # Distinct stack frames (name, file, line) of a snapshot: beyond it the frames met later are
    # one '<frames beyond limit>' frame, said in the notes (not refused). Each costs ~250 bytes and
    # 10 µs (unpickled) to 40 µs (compiled tape) to intern, more in the per-frame tables; a real
    # snapshot holds a few thousand, while 19 bytes of pickle make one (15M within the object limit)
    frames: int = 50_000

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Limits:
        env = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = env.get(ENV[f.name])
            if raw is None or not raw.strip():
                continue
            m = _VALUE_RE.match(raw)
            factor = _SUFFIX.get(m.group(2).lower()) if m else None
            if m is None or factor is None or len(m.group(1)) > 30:
                raise InputError(f"{ENV[f.name]}={raw!r}: not a number (write e.g. 1000000, 64MiB or 2G)")
            values[f.name] = int(m.group(1)) * factor
        return cls(**values)


ENV: dict[str, str] = {
    "depth": "SNAPVIZ_MAX_INPUT_DEPTH",
    "objects": "SNAPVIZ_MAX_INPUT_OBJECTS",
    "expansion": "SNAPVIZ_MAX_INPUT_EXPANSION",
    "string_length": "SNAPVIZ_MAX_INPUT_STRING",
    "string_bytes": "SNAPVIZ_MAX_INPUT_STRING_BYTES",
    "ratio": "SNAPVIZ_MAX_INPUT_RATIO",
    "ratio_floor": "SNAPVIZ_MAX_INPUT_RATIO_FLOOR",
    "header_bytes": "SNAPVIZ_MAX_INPUT_HEADER",
    "decompress_seconds": "SNAPVIZ_MAX_INPUT_SECONDS",
    "rule_matches": "SNAPVIZ_MAX_INPUT_RULE_MATCHES",
    "shared_rows": "SNAPVIZ_MAX_INPUT_SHARED_ROWS",
    "stages": "SNAPVIZ_MAX_INPUT_STAGES",
    "stage_intervals": "SNAPVIZ_MAX_INPUT_STAGE_INTERVALS",
    "frames": "SNAPVIZ_MAX_INPUT_FRAMES",
}
DESCRIPTION: dict[str, str] = {
    "depth": "nesting depth",
    "objects": "number of objects",
    "expansion": "size with shared references expanded",
    "string_length": "length of one string",
    "string_bytes": "total size of its strings",
    "ratio": "decompressed size relative to the file size",
    "ratio_floor": "decompressed size",
    "header_bytes": "size of the JSON before traceEvents",
    "decompress_seconds": "CPU time spent decompressing it",
    "rule_matches": "number of rule regex matches (distinct patterns x distinct frame names)",
    "shared_rows": "number of trace entries, segments, blocks and annotations it repeats by shared references",
    "stages": "number of distinct stage labels",
    "stage_intervals": "number of stage intervals",
    "frames": "number of distinct stack frames",
}


class LimitExceeded(InputError):
    """An input over one of :class:`Limits`; the message names the variable to raise."""

    def __init__(self, path: str, name: str, value: int | None, limit: int, unit: str = "") -> None:
        got = f" ({value:,}{unit} or more)" if value is not None else ""
        super().__init__(
            f"{path}: input limit exceeded: {DESCRIPTION[name]} is over {limit:,}{unit}{got}; "
            f"if the file is trusted, raise it with {ENV[name]}=<n> (docs/security.md)"
        )
        self.limit_name = name


class SharedRows:
    """Counts the rows a snapshot reader is about to build (trace entries, segments, blocks,
    annotations) that are shared references to a row already read: a pickle can list one
    trace (or one entry) a million times at 2 bytes a reference ("billion laughs" over the
    rows, or 8 devices holding one trace list), and every reference would become a row of
    the model and of every analysis. Both readers of a snapshot pickle (the unpickled dicts'
    and the compiled tape's) count their rows here, by identity (``id()`` of the dict, or
    the tape's container number), before they build them; more repeats than
    ``limits.shared_rows`` is :class:`LimitExceeded`."""

    def __init__(self, source: str, limits: Limits | None = None) -> None:
        self._source = source
        self._limit = (limits or Limits.from_env()).shared_rows
        self._seen: set[int] = set()
        self.shared = 0

    def add(self, ids: Iterable[int], n: int) -> None:
        """Count ``n`` rows with the identities ``ids``; raise once too many were seen before."""
        before = len(self._seen)
        self._seen.update(ids)
        self.shared += n - (len(self._seen) - before)
        if self.shared > self._limit:
            raise LimitExceeded(self._source, "shared_rows", self.shared, self._limit)
