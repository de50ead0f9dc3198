"""The worst case for distinct stack frames within the input limits (issue 26, docs/security.md
"Distinct frames"): 14.9M frames of their own line number, 2 objects each (just under the object
limit), as a raw pickle and as xz, and 9.9M of their own names too; ``snapviz analyze --json`` on
the compiled tape's way and on the unpickler's, in a child process under a 6 GiB address-space
cap. Prints wall and CPU seconds and peak RSS per case; exit 1 when one runs past 30 s of CPU or
4 GiB (the issue's target; wall time on a shared machine says more about the other jobs).

    python benchmarks/bench_hostile_frames.py [--frames N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import lzma
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

import hostile  # noqa: E402  (tests/support/hostile.py: the hostile generators)

PATHS = {"tape": "pickle_tape=1,pickle_scan=1", "unpickler": "pickle_tape=never"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=14_900_000, help="distinct frames of the line case")
    ap.add_argument("--keep", type=Path, help="write the files here (default: a temporary folder)")
    a = ap.parse_args()
    d = a.keep or Path(tempfile.mkdtemp(prefix="snapviz-frames-"))
    d.mkdir(parents=True, exist_ok=True)
    cases = {}
    line = d / f"frames_{a.frames}_line.pickle"
    if not line.exists():
        line.write_bytes(hostile.distinct_frames(a.frames))
    cases["line"] = line
    xz = line.with_suffix(".pickle.xz")
    if not xz.exists():
        xz.write_bytes(lzma.compress(line.read_bytes(), preset=1))
    cases["line_xz"] = xz
    n_names = a.frames * 2 // 3
    names = d / f"frames_{n_names}_name.pickle"
    if not names.exists():
        names.write_bytes(hostile.distinct_frames(n_names, vary="name"))
    cases["name"] = names
    failed = False
    for case, path in cases.items():
        for way, kernels in PATHS.items():
            r = hostile.run_analyze(path, timeout=300, env={"SNAPVIZ_KERNEL_MIN_SIZE": kernels})
            over = r.rc != 0 or r.timed_out or r.cpu_s > hostile.TIME_BOUND or r.maxrss >= hostile.RSS_BOUND
            failed |= over
            print(
                f"{case:8} {way:9} {path.stat().st_size / 2**20:7.1f} MiB  exit {r.rc}  wall {r.wall_s:5.1f} s  "
                f"cpu {r.cpu_s:5.1f} s  rss {r.maxrss / 2**20:6.0f} MiB  load {os.getloadavg()[0]:.1f}"
                + ("  OVER" if over else ""),
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
