#!/usr/bin/env python3
"""Coverage-guided fuzzing of the loader for a fixed time budget (docs/security.md).

Every input is written to a file and given to ``snapviz.load.load`` exactly as the CLI
does (detection, decompression, the opcode scan or the JSON guard, the unpickler, the
snapshot reader, the trace parser). The only acceptable outcomes are a loaded run or an
:class:`InputError` with one line; anything else (another exception, a crash, more than
``--timeout`` seconds or ``--rss-mb`` MiB for one input) is a finding.

With ``atheris`` installed (``pip install atheris``) libFuzzer drives the inputs from
coverage of the snapviz modules; without it, hypothesis generates mutated seeds for the
same budget. Seeds: small valid snapshots (protocols 0-5, gzip), a small trace, and the
small hostile files of tests/support/hostile.py.

    python benchmarks/fuzz_loader.py --seconds 300 [--corpus DIR]
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

import hostile  # noqa: E402  (tests/support/hostile.py: the hostile generators)

WORK = Path(tempfile.mkdtemp(prefix="snapviz-fuzz-"))
TARGET = WORK / "input"


def seeds() -> list[bytes]:
    snap = {
        "segments": [
            {
                "device": 0,
                "address": 1 << 21,
                "total_size": 2 << 20,
                "allocated_size": 512,
                "requested_size": 500,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "blocks": [
                    {
                        "size": 512,
                        "requested_size": 500,
                        "state": "active_allocated",
                        "frames": [{"name": "f", "filename": "a.py", "line": 3}],
                    }
                ],
            }
        ],
        "device_traces": [
            [
                hostile._entry(frames=[{"name": "f", "filename": "a.py", "line": 3}]),
                hostile._entry(action="free_requested"),
                hostile._entry(action="free_completed"),
            ]
        ],
        "allocator_settings": {"expandable_segments": False},
    }
    out = [pickle.dumps(snap, protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    out.append(gzip.compress(out[-1]))
    out.append(
        ('{"schemaVersion": 1, "traceEvents": [' + hostile.memory_events() + '], "baseTimeNanoseconds": 1}').encode()
    )
    out += [
        b"\x80\x02}(" + hostile.deep_tuple(300) + b"K\x01u.",
        b"\x80\x02Nr\xff\xff\xff\x7f.",
        pickle.dumps(hostile.billion_laughs(12), protocol=4),
        b'{"m": ' + b'{"traceEvents": ' * 300 + b"1" + b"}" * 301,
    ]
    return out


def one_input(data: bytes) -> None:
    from snapviz.errors import InputError
    from snapviz.load import load

    TARGET.write_bytes(data)
    try:
        load(str(TARGET))
    except InputError as exc:
        if "\n" in str(exc):
            raise AssertionError(f"multi-line error: {str(exc)[:200]!r}") from None
    fast_path(data)


def fast_path(data: bytes) -> None:
    """The grammar check used above 1 MiB, on every (small) input: whatever it accepts
    must unpickle without a crash, whatever the limits of the exact scan would say."""
    import io
    import pickle

    from snapviz.errors import InputError
    from snapviz.load.limits import Limits
    from snapviz.load.snapshot.pickle_scan import fast_scan
    from snapviz.load.snapshot.safe_pickle import _RefuseGlobals

    try:
        accepted = fast_scan(data, "input", Limits())
    except (InputError, IndexError, ValueError):  # scan_pickle falls back to the exact scan on the last two
        return
    if accepted:
        try:
            _RefuseGlobals(io.BytesIO(data)).load()
        except (
            InputError,
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            AttributeError,
            OverflowError,
            MemoryError,
            UnicodeDecodeError,
        ):
            pass  # refused cleanly; safe_load_pickle maps each of these to one line


def run_atheris(seconds: int, corpus: Path, timeout: int, rss_mb: int) -> int:
    import atheris

    with atheris.instrument_imports(include=["snapviz"]):
        import snapviz.load  # noqa: F401
        import snapviz.load.snapshot.pickle_scan  # noqa: F401
        import snapviz.load.trace.chrome_trace  # noqa: F401
    corpus.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds()):
        (corpus / f"seed{i}").write_bytes(s)
    args = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={seconds}",
        f"-timeout={timeout}",
        f"-rss_limit_mb={rss_mb}",
        "-max_len=65536",
        f"-artifact_prefix={corpus}/finding-",
        "-print_final_stats=1",
    ]
    atheris.Setup(args, one_input)
    atheris.Fuzz()
    return 0


def run_hypothesis(seconds: int) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base = seeds()
    deadline = time.monotonic() + seconds
    count = [0]

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        st.integers(0, len(base) - 1), st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(max_size=8)), max_size=8)
    )
    def fuzz(i: int, edits: list[tuple[int, bytes]]) -> None:
        data = bytearray(base[i])
        for at, blob in edits:
            at %= len(data) + 1
            data[at : at + len(blob)] = blob
        count[0] += 1
        one_input(bytes(data))

    while time.monotonic() < deadline:
        fuzz()  # a finding raises, with hypothesis's minimal example
    print(f"hypothesis: {count[0]:,} inputs in {seconds} s, no finding")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--corpus", type=Path, default=WORK / "corpus")
    ap.add_argument("--timeout", type=int, default=30, help="seconds one input may take")
    ap.add_argument("--rss-mb", type=int, default=4096, help="peak RSS allowed (MiB)")
    ap.add_argument("--hypothesis", action="store_true", help="use hypothesis even when atheris is installed")
    args = ap.parse_args(argv)
    try:
        import atheris  # noqa: F401
    except ImportError:
        args.hypothesis = True
    if args.hypothesis:
        return run_hypothesis(args.seconds)
    return run_atheris(args.seconds, args.corpus, args.timeout, args.rss_mb)


if __name__ == "__main__":
    sys.exit(main())
