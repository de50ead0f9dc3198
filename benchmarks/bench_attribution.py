#!/usr/bin/env python3
"""What does stage attribution cost on a 1,000,000-event snapshot?

Builds the same ~1M-event snapshot as ``bench_analyze.py`` (a real sample repeated), then
a copy with every label stripped (no ``user_metadata``, no ``external_annotations``), the
way a snapshot from someone who only called ``_record_memory_history()`` looks. Each job
runs in its own process (whole-process wall time and peak RSS):

  core:       load + exact allocator replay + the peak (issue 2's analyzer, no attribution);
  labelled:   ``snapviz analyze --json`` (stages from user_metadata, categories, attention);
  unlabelled: ``snapviz analyze --json`` on the stripped copy (stages from stack-frame rules).

Target: attribution within 1.5x the core analyzer's time for the same file.

    python benchmarks/bench_attribution.py [--events 1000000] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import ROOT, _spawn_reaped, fmt_bytes, load_base, repeat_snapshot  # noqa: E402

TARGET = 1.5
CORE = (
    "import sys, json; sys.path.insert(0, {root!r});"
    "from snapviz.load import load; from snapviz.analyses.replay import replay_allocator;"
    "r = load({path!r}); rep = replay_allocator(r.snapshot, 0);"
    "print(json.dumps({{'peak': rep.peak_allocated}}))"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--base", help="base snapshot (default: the largest sample)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each job; the best wall time counts")
    ap.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="snapviz-attr-"))
    base, base_name, _ = load_base(args.base, 6000, 1)
    big, reps = repeat_snapshot(base, args.events)
    labelled, unlabelled = work / "labelled.pickle", work / "unlabelled.pickle"
    with open(labelled, "wb") as f:
        pickle.dump(big, f, protocol=4)
    for trace in big["device_traces"]:
        for e in trace:
            e["user_metadata"] = ""
    big["external_annotations"] = []
    with open(unlabelled, "wb") as f:
        pickle.dump(big, f, protocol=4)
    n = sum(len(t) for t in big["device_traces"])
    del big, base
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    jobs = {
        "core (load + replay)": [sys.executable, "-c", CORE.format(root=str(ROOT), path=str(labelled))],
        "analyze, labelled (user_metadata)": [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(labelled),
            "--json",
            str(work / "l.json"),
            "-q",
        ],
        "analyze, unlabelled (frame rules)": [
            sys.executable,
            "-m",
            "snapviz",
            "analyze",
            str(unlabelled),
            "--json",
            str(work / "u.json"),
            "-q",
        ],
    }
    best: dict[str, dict] = {}
    for _ in range(max(1, args.repeat)):
        for name, cmd in jobs.items():
            r = _spawn_reaped(cmd, env)
            if r["rc"] != 0:
                print(f"{name} failed: {r['stderr'][-2000:]}", file=sys.stderr)
                return 2
            if name not in best or r["wall_s"] < best[name]["wall_s"]:
                best[name] = r
    core = best["core (load + replay)"]["wall_s"]
    print(f"### Attribution cost: {n:,} events ({base_name}, x{reps})\n")
    print("| job | wall | vs core | peak RSS |")
    print("|---|---:|---:|---:|")
    worst = 0.0
    for name, r in best.items():
        ratio = r["wall_s"] / core
        worst = max(worst, ratio)
        print(f"| {name} | {r['wall_s']:.2f} s | {ratio:.2f}x | {fmt_bytes(r['rss'])} |")
    lj = json.loads((work / "l.json").read_text())
    uj = json.loads((work / "u.json").read_text())
    steps = lambda d: sum(len(s["steps"]) for s in d["stages"] if s["name"] == "denoise")  # noqa: E731
    print(
        f"\nstage source: {lj['stage_source']} vs {uj['stage_source']}; denoise steps found: {steps(lj)} vs {steps(uj)}; "
        f"same peak: {lj['peak']['allocated_bytes'] == uj['peak']['allocated_bytes']}; target <= {TARGET}x: "
        f"{'ok' if worst <= TARGET else 'MISSED'}"
    )
    for p in work.iterdir():
        p.unlink()
    work.rmdir()
    return 1 if (args.check and worst > TARGET) else 0


if __name__ == "__main__":
    raise SystemExit(main())
