"""Make the training sample snapshots and the training timing table on one GPU.

    python sample_snapshots/record_train_samples.py samples --out DIR [--only a,b] [--slots 3]
    python sample_snapshots/record_train_samples.py table --out DIR [--only a,b] [--steps 4]

Samples record memory history (2 optimizer steps, so files stay small) and run a few at a
time: each process has its own caching allocator, so memory numbers are unaffected, but their
wall times are not benchmarks. Table runs use ``--no-history --sync-stages`` and run one at a
time, so their per-phase times are honest; their run.json still has the allocator's peaks.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from record_samples import _finish_sample, _run  # its neighbour: scripts run from this folder

SD15 = ["--train", "--pipeline", "sd15", "--size", "full", "--device", "cuda", "--batch", "4"]
SDXL = [
    "--train",
    "--pipeline",
    "sdxl",
    "--size",
    "full",
    "--device",
    "cuda",
    "--batch",
    "1",
    "-t",
    "amp-fp16",
    "--lora-rank",
    "16",
]
AMP = ["-t", "amp-fp16"]

# name -> collect arguments (SD 1.5 at 512² batch 4; SDXL LoRA at 1024² batch 1)
SAMPLES: dict[str, list[str]] = {
    "train-sd15-fp32": [*SD15, "-t", "fp32"],
    "train-sd15-amp-fp16": [*SD15, *AMP],
    "train-sd15-amp-fp16-ckpt": [*SD15, *AMP, "-t", "checkpointing"],
    "train-sd15-amp-fp16-adamw8bit": [*SD15, *AMP, "--optimizer", "adamw8bit"],
    "train-sd15-amp-fp16-accum4": [*SD15[:-1], "1", *AMP, "--accumulate", "4"],
    "train-sd15-amp-fp16-lora16": [*SD15, *AMP, "--lora-rank", "16"],
    "train-sdxl-lora16": SDXL,
    "train-sdxl-lora16-ckpt": [*SDXL, "-t", "checkpointing"],
    "train-sd15-amp-fp16-adamw-fused": [*SD15, *AMP, "--optimizer", "adamw-fused"],
    "train-sd15-amp-fp16-keep-grads": [*SD15, *AMP, "-t", "keep-grads"],
    "train-sd15-amp-fp16-ema": [*SD15, *AMP, "-t", "ema"],
}
# timing/peak-only variants beside the samples (run.json alone)
EXTRA: dict[str, list[str]] = {
    "train-sd15-amp-fp16-adamw-loop": [*SD15, *AMP, "--optimizer", "adamw-loop"],
    "train-sd15-amp-fp16-adafactor": [*SD15, *AMP, "--optimizer", "adafactor"],
    "train-sd15-amp-fp16-sgd": [*SD15, *AMP, "--optimizer", "sgd"],
    "train-sd15-amp-fp16-classic": [*SD15, *AMP, "-t", "classic"],
    "train-sd15-amp-bf16": [*SD15, "-t", "amp-bf16"],
    "train-sd15-bf16": [*SD15, "-t", "bf16"],
}


def cmd_samples(out: Path, names: list[str], slots: int, deadline: float) -> None:
    t_end = time.time() + deadline

    def work(name: str) -> None:
        left = t_end - time.time()
        if left < 60:
            print(f'{{"name": "{name}", "skipped": "deadline"}}', flush=True)
            return
        _run(name, [*SAMPLES[name], "--steps", "2"], out, "0", left)
        _finish_sample(name, out)

    with ThreadPoolExecutor(max_workers=slots) as pool:
        list(pool.map(work, names))


def cmd_table(out: Path, names: list[str], steps: int, deadline: float) -> None:
    t_end = time.time() + deadline
    for name in names:
        left = t_end - time.time()
        if left < 30:
            print(f'{{"name": "table-{name}", "skipped": "deadline"}}', flush=True)
            continue
        args = {**SAMPLES, **EXTRA}[name]
        _run(f"table-{name}", [*args, "--steps", str(steps), "--no-history", "--sync-stages"], out, "0", left)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python sample_snapshots/record_train_samples.py")
    ap.add_argument("what", choices=["samples", "table"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=480.0)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    only = [s for s in a.only.split(",") if s]
    pool = SAMPLES if a.what == "samples" else {**SAMPLES, **EXTRA}
    names = [n for n in pool if not only or n in only]
    if a.what == "samples":
        cmd_samples(a.out, names, a.slots, a.deadline)
    else:
        cmd_table(a.out, names, a.steps, a.deadline)


if __name__ == "__main__":
    main()
