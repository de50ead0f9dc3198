#!/usr/bin/env python3
"""Compare benchmark results of two commits, from the JSON lines the benchmarks append
(``benchmarks/results/*.jsonl``).

    python benchmarks/compare_results.py BASE NEW [--file benchmarks/results/bench_speed.jsonl]

BASE and NEW are commit prefixes as recorded (``git rev-parse --short=12``; ``+dirty`` marks
uncommitted changes). For every (bench, case) measured under both, the latest row of each is
shown: CPU seconds, peak RSS, the ratio to the run's floor where there is one, and NEW/BASE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results" / "bench_speed.jsonl"


def latest(rows: list[dict], commit: str) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r["commit"].startswith(commit):
            out[(r["bench"], r["case"])] = r  # the file is in time order: the last one wins
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--file", default=str(DEFAULT))
    a = ap.parse_args(argv)
    try:
        rows = [json.loads(line) for line in Path(a.file).read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"compare_results: {a.file}: {exc}", file=sys.stderr)
        return 2
    base, new = latest(rows, a.base), latest(rows, a.new)
    both = [k for k in new if k in base]
    if not both:
        print(f"compare_results: no case measured under both {a.base!r} and {a.new!r}", file=sys.stderr)
        return 2
    print(f"| bench | case | CPU {a.base} | CPU {a.new} | new/base | ×floor {a.base} | ×floor {a.new} | RSS new/base |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for k in both:
        b, n = base[k], new[k]
        fx = [f"{r['cpu_x']:.2f}×" if "cpu_x" in r else "" for r in (b, n)]
        print(
            f"| {k[0]} | {k[1]} | {b['cpu_s']:.2f} s | {n['cpu_s']:.2f} s | {n['cpu_s'] / b['cpu_s']:.2f} | "
            f"{fx[0]} | {fx[1]} | {n['rss'] / b['rss']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
