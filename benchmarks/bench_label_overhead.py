#!/usr/bin/env python3
"""Wall-time cost of the collectors' stage labels.

Times the same ``pipe(...)`` call, in one process after a warm-up, alternating:

  bare:     memory history on (as any user recording a snapshot would), no labels;
  labelled: the same under ``collectors.record`` — a forward pre-hook per denoising step,
            and at every stage boundary: synchronize, read the allocator's peaks, stamp
            ``_set_memory_metadata``, ``reset_peak_memory_stats``, ``record_function``.

Only the ``pipe(...)`` call is timed (snapshot dumping and run.json writing are the same
work with or without labels). Prints a Markdown table; the target is < 3% overhead.

    python benchmarks/bench_label_overhead.py [--pipeline sd15] [--size full] [--steps 20] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    from collectors.pipelines import build_pipeline, default_resolution
    from collectors.recorder import Recorder

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipeline", default="sd15")
    ap.add_argument("--size", default=None, help="tiny or full (default: full on CUDA, tiny on CPU)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    size = args.size or ("full" if cuda else "tiny")
    dev = "cuda" if cuda else "cpu"
    dtype = torch.float16 if cuda else torch.float32
    pipe = build_pipeline(args.pipeline, size, dtype=dtype).to(dev)
    res = default_resolution(args.pipeline, size)
    kw = dict(
        prompt="a photo of an astronaut",
        num_inference_steps=args.steps,
        height=res,
        width=res,
        output_type="latent" if not cuda else "pil",
    )

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def call() -> float:
        sync()
        t0 = time.perf_counter()
        pipe(**kw, generator=torch.Generator(dev).manual_seed(0))
        sync()
        return time.perf_counter() - t0

    def bare() -> float:
        if cuda:
            torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=1_000_000)
        try:
            return call()
        finally:
            if cuda:
                torch.cuda.memory._record_memory_history(enabled=None)

    def labelled(sync: bool = False) -> float:
        with tempfile.TemporaryDirectory() as d, Recorder(pipe, d, device=dev, history=cuda, sync_stages=sync) as rec:
            t = call()
            rec.mark(None)
        return t

    for _ in range(2):  # warm-up: cuDNN autotuning, allocator growth, clocks, lazy imports
        bare()
        labelled()
        labelled(True)
    times: dict[str, list[float]] = {"bare": [], "labelled": [], "labelled, --sync-stages": []}
    for _ in range(args.reps):  # interleaved, so drifting clocks hit every variant alike
        times["bare"].append(bare())
        times["labelled"].append(labelled())
        times["labelled, --sync-stages"].append(labelled(True))
    mb, ml = statistics.median(times["bare"]), statistics.median(times["labelled"])
    over = (ml - mb) / mb
    over_sync = (statistics.median(times["labelled, --sync-stages"]) - mb) / mb
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(
        f"### Stage-label overhead: {args.pipeline} {size} {res}², {args.steps} steps, {name}, torch {torch.__version__}\n"
    )
    print("| recording | median pipe() wall | runs (s) |")
    print("|---|---:|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.3f} s | {', '.join(f'{x:.3f}' for x in v)} |")
    print(
        f"\noverhead of the labels: {over * 100:+.2f}% (target < 3%); with a device sync at every stage "
        f"boundary (--sync-stages, exact per-stage wall times): {over_sync * 100:+.2f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
