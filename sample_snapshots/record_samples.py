"""Make the GPU sample snapshots and the technique-table measurements.

Runs each spec as its own ``python -m collectors`` process (one allocator per process, so
concurrent runs on one GPU do not disturb each other's memory numbers), then checks and packs
each sample: ``run.json`` + ``snapshot.pickle.xz`` (xz preset 9) + ``trace.json.gz``.

    python sample_snapshots/record_samples.py samples --out DIR [--only a,b] [--deadline 480]
    python sample_snapshots/record_samples.py table --out DIR [--steps 10]

Table runs use ``--no-history`` and run one at a time per GPU, so their wall times are honest.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FULL = ["--size", "full", "--device", "cuda"]

# name -> (collect arguments, GPUs needed)
SAMPLES: dict[str, tuple[list[str], int]] = {
    "sd15-fp16-sdpa": (["--pipeline", "sd15", *FULL, "--steps", "4", "-t", "fp16"], 1),
    "sd15-fp16-classic": (["--pipeline", "sd15", *FULL, "--steps", "4", "-t", "fp16", "-t", "classic"], 1),
    "sdxl-fp16": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16"], 1),
    "sdxl-fp16-vae-tiling": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16", "-t", "vae-tiling"], 1),
    "sdxl-fp32": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp32"], 1),
    "sdxl-fp16-model-offload": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16", "-t", "model-offload"], 1),
    "sdxl-fp16-sequential-offload": (
        ["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16", "-t", "sequential-offload"],
        1,
    ),
    # the profiler starts after load: pipe.to() alone adds ~100k Python events (+2 MB gzipped)
    "sd15-fp16-profile": (
        ["--pipeline", "sd15", *FULL, "--steps", "2", "-t", "fp16", "--profile", "--profile-scope", "after-load"],
        1,
    ),
    "sd15-fp16-profile-1step": (
        ["--pipeline", "sd15", *FULL, "--steps", "1", "-t", "fp16", "--profile", "--profile-scope", "after-load"],
        1,
    ),
    "pixart-staged-int8-nf4": (
        [
            "--pipeline",
            "pixart-sigma",
            *FULL,
            "--steps",
            "3",
            "-t",
            "fp16",
            "-t",
            "staged",
            "-t",
            "int8",
            "-t",
            "nf4-text-encoder",
        ],
        1,
    ),
    # a 10 GiB card: SDXL fp16 fits for text encoding and denoising, then OOMs in VAE decode
    "sdxl-fp16-oom-10gb": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16", "--memory-limit-gb", "10"], 1),
    "sdxl-fp16-balanced": (["--pipeline", "sdxl", *FULL, "--steps", "3", "-t", "fp16", "-t", "balanced"], 2),
}

_TECHS: dict[str, list[str]] = {
    "fp32": ["-t", "fp32"],
    "fp16": ["-t", "fp16"],
    "fp16-classic": ["-t", "fp16", "-t", "classic"],
    "fp16-vae-slicing": ["-t", "fp16", "-t", "vae-slicing"],
    "fp16-vae-tiling": ["-t", "fp16", "-t", "vae-tiling"],
    "fp16-tiny-vae": ["-t", "fp16", "-t", "tiny-vae"],
    "fp16-model-offload": ["-t", "fp16", "-t", "model-offload"],
    "fp16-sequential-offload": ["-t", "fp16", "-t", "sequential-offload"],
    "bf16": ["-t", "bf16"],
}
# batch 1 (Félix Sanz's setup) for every technique; batch 4 (the HF blog's setup) for the rows
# the blog published
TABLE: dict[str, list[str]] = {f"b1-{k}": ["--batch", "1", *v] for k, v in _TECHS.items()}
TABLE.update(
    {
        f"b4-{k}": ["--batch", "4", *v]
        for k, v in {
            "fp32-classic": ["-t", "fp32", "-t", "classic"],
            "fp16-classic": _TECHS["fp16-classic"],
            "fp16": _TECHS["fp16"],
            "fp16-vae-slicing": _TECHS["fp16-vae-slicing"],
            "fp16-tiny-vae": _TECHS["fp16-tiny-vae"],
            "fp16-model-offload": _TECHS["fp16-model-offload"],
            "fp16-sequential-offload": _TECHS["fp16-sequential-offload"],
        }.items()
    }
)

MAX_SAMPLE_BYTES = 2 * 1024 * 1024


def _run(name: str, args: list[str], out: Path, gpus: str, timeout: float) -> dict[str, Any]:
    run_dir = out / name
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES=gpus,
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "8"),
    )
    cmd = [sys.executable, "-m", "collectors", *args, "--out", str(run_dir)]
    t0 = time.time()
    log = out / f"{name}.log"
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=max(timeout, 1)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    res = {"name": name, "rc": rc, "elapsed_s": round(time.time() - t0, 1), "gpus": gpus}
    print(json.dumps(res), flush=True)
    return res


def check_sample(run_dir: Path) -> dict[str, Any]:
    """Sanity checks on one recorded run (no snapviz analyzer needed)."""
    info = json.loads((run_dir / "run.json").read_text())
    out: dict[str, Any] = {
        "status": info.get("status"),
        "allocator": {k: info["allocator"].get(k) for k in ("max_memory_allocated", "max_memory_reserved")}
        if info.get("allocator")
        else None,
        "stages": [(s["name"], s["peak_allocated_bytes"], s["wall_s"]) for s in info["stages"]],
    }
    snap = run_dir / "snapshot.pickle"
    if snap.exists():
        from snapviz.load.snapshot.safe_pickle import safe_load_pickle  # never plain pickle.load

        data = safe_load_pickle(snap)
        traces = data.get("device_traces", [])
        out["trace_len"] = [len(t) for t in traces]
        labels: Counter[str] = Counter()
        actions: Counter[str] = Counter()
        for t in traces:
            for e in t:
                labels[(e.get("user_metadata") or "").split("/")[0] or "<none>"] += 1
                actions[e.get("action")] += 1
        out["labels"] = dict(labels)
        out["actions"] = dict(actions)
        ann = Counter(a.get("name") for a in data.get("external_annotations", []))
        out["annotations"] = len(ann)
        out["segments"] = len(data.get("segments", []))
        out["allocator_settings"] = {
            k: v for k, v in data.get("allocator_settings", {}).items() if k != "roundup_power2_divisions"
        }
        active = sum(
            b["size"]
            for s in data.get("segments", [])
            for b in s.get("blocks", [])
            if b.get("state") == "active_allocated"
        )
        out["end_active_bytes"] = active
    trace = run_dir / "trace.json.gz"
    if trace.exists():
        import gzip

        ev = json.load(gzip.open(trace)).get("traceEvents", [])
        out["trace_events"] = len(ev)
        out["trace_memory_events"] = sum(1 for e in ev if e.get("name") == "[memory]")
        out["trace_user_annotations"] = sorted({e["name"] for e in ev if e.get("cat") == "user_annotation"})[:20]
    return out


def pack_sample(run_dir: Path) -> dict[str, Any]:
    """snapshot.pickle -> snapshot.pickle.xz (preset 9); drop the image; report sizes."""
    snap = run_dir / "snapshot.pickle"
    sizes: dict[str, Any] = {}
    if snap.exists():
        raw = snap.read_bytes()
        sizes["snapshot_raw"] = len(raw)
        (run_dir / "snapshot.pickle.xz").write_bytes(lzma.compress(raw, preset=9))
        snap.unlink()
    img = run_dir / "image.png"
    if img.exists():
        img.unlink()
    for f in ("run.json", "snapshot.pickle.xz", "trace.json.gz"):
        if (run_dir / f).exists():
            sizes[f] = (run_dir / f).stat().st_size
    sizes["total"] = sum(v for k, v in sizes.items() if k != "snapshot_raw")
    sizes["fits_2MB"] = sizes["total"] <= MAX_SAMPLE_BYTES
    return sizes


def _finish_sample(name: str, out: Path) -> dict[str, Any]:
    run_dir = out / name
    res: dict[str, Any] = {"name": name}
    if not (run_dir / "run.json").exists():
        res["error"] = "no run.json"
        return res
    try:
        res["check"] = check_sample(run_dir)
    except Exception as err:  # report, keep going
        res["check_error"] = repr(err)
    res["sizes"] = pack_sample(run_dir)
    (run_dir.parent / f"{name}.check.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({"name": name, "sizes": res["sizes"]}), flush=True)
    return res


def cmd_samples(out: Path, only: list[str] | None, deadline: float, slots: int) -> None:
    names = [n for n in SAMPLES if not only or n in only]
    t_end = time.time() + deadline
    single = [n for n in names if SAMPLES[n][1] == 1]
    multi = [n for n in names if SAMPLES[n][1] > 1]
    jobs: list[tuple[str, str]] = [(n, str(i % 2)) for i, n in enumerate(single)]
    jobs += [(n, "0,1") for n in multi]
    packers = ThreadPoolExecutor(max_workers=8)
    futures = []

    def work(job: tuple[str, str]) -> None:
        name, gpus = job
        left = t_end - time.time()
        if left < 60:
            print(json.dumps({"name": name, "skipped": "deadline"}), flush=True)
            return
        _run(name, SAMPLES[name][0], out, gpus, left)
        futures.append(packers.submit(_finish_sample, name, out))

    with ThreadPoolExecutor(max_workers=slots) as pool:
        list(pool.map(work, jobs))
    for f in futures:
        f.result()
    packers.shutdown()


def cmd_table(out: Path, steps: int, deadline: float, pipeline: str, only: list[str] | None = None) -> None:
    t_end = time.time() + deadline
    names = [n for n in TABLE if not only or n in only]
    # slowest first so a deadline cuts the cheap rows, which are easiest to redo
    names.sort(key=lambda n: ("sequential" not in n, "b4" not in n))
    queues = [names[0::2], names[1::2]]

    def worker(gpu: int) -> None:
        for name in queues[gpu]:
            left = t_end - time.time()
            if left < 30:
                print(json.dumps({"name": name, "skipped": "deadline"}), flush=True)
                continue
            args = ["--pipeline", pipeline, *FULL, "--steps", str(steps), "--no-history", *TABLE[name]]
            _run(f"table-{name}", args, out, str(gpu), left)
            img = out / f"table-{name}" / "image.png"
            if img.exists():
                img.unlink()

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(worker, [0, 1]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python sample_snapshots/record_samples.py")
    ap.add_argument("what", choices=["samples", "table", "check"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--deadline", type=float, default=480.0)
    ap.add_argument("--slots", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pipeline", default="sdxl")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    only = [s for s in a.only.split(",") if s] or None
    if a.what == "samples":
        cmd_samples(a.out, only, a.deadline, a.slots)
    elif a.what == "table":
        cmd_table(a.out, a.steps, a.deadline, a.pipeline, only)
    else:
        print(json.dumps(check_sample(a.out), indent=1, default=str))


if __name__ == "__main__":
    main()
