"""Record the Flux.1 and SD 3.5 sample snapshots (issue 12) on one CUDA GPU.

Each sample runs as its own ``python -m collectors`` process (a fresh caching allocator, so no
sample's peaks carry another's leftovers) under a per-run deadline; a failing or timed-out run
is reported and the next one starts. Each finished run is checked and packed as
record_samples.py packs the others: ``run.json`` (the allocator's truth: max_memory_allocated/
reserved and per-stage peaks) + ``snapshot.pickle.xz``, and must stay within 2 MB, which 4
denoising steps do (the snapshot grows with steps, not with the model's size).

    python sample_snapshots/record_flux_samples.py --out DIR [--only a,b] [--run-timeout 600]
    python sample_snapshots/record_flux_samples.py --out DIR --size tiny --device cpu   # CPU check
    python sample_snapshots/record_flux_samples.py --out DIR --dry-run                  # commands

One summary line (JSON) per run is printed as it finishes; ``DIR/summary.json`` holds them all.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the helpers that check and pack the H200 samples; this file sits beside record_samples.py
from record_samples import MAX_SAMPLE_BYTES, check_sample, pack_sample

ROOT = Path(__file__).resolve().parent.parent

# name -> collect arguments (size and device are added from the command line)
SAMPLES: dict[str, list[str]] = {
    "flux-dev-bf16": ["--pipeline", "flux-dev", "--steps", "4", "-t", "bf16"],
    # block-level, one transformer block at a time, no CUDA stream: diffusers' default shape
    "flux-dev-bf16-group-offload": ["--pipeline", "flux-dev", "--steps", "4", "-t", "bf16", "-t", "group-offload"],
    "flux-dev-bf16-nf4-transformer": ["--pipeline", "flux-dev", "--steps", "4", "-t", "bf16", "-t", "nf4-transformer"],
    "sd35-large-bf16": ["--pipeline", "sd35-large", "--steps", "4", "-t", "bf16"],
    "sd35-large-bf16-no-t5": ["--pipeline", "sd35-large", "--steps", "4", "-t", "bf16", "-t", "no-t5"],
}


def command(name: str, out: Path, size: str, device: str) -> list[str]:
    """The collect command of one sample (1024² at full size: every pipeline's default)."""
    return [
        sys.executable,
        "-m",
        "collectors",
        *SAMPLES[name],
        "--size",
        size,
        "--device",
        device,
        "--out",
        str(out / name),
    ]


def run_one(name: str, out: Path, size: str, device: str, timeout_s: float) -> dict[str, Any]:
    """Run one sample in a fresh process; the log goes to DIR/<name>.log."""
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    cmd = command(name, out, size, device)
    t0 = time.time()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc: int | str = subprocess.run(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=max(timeout_s, 1)
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"name": name, "rc": rc, "elapsed_s": round(time.time() - t0, 1)}


def summarize(res: dict[str, Any], run_dir: Path, log: Path) -> dict[str, Any]:
    """One line's worth: status, allocator peaks, the peak stage, the packed size."""
    line = dict(res)
    info_path = run_dir / "run.json"
    if info_path.exists():
        info = json.loads(info_path.read_text())
        alloc = info.get("allocator") or {}
        line["status"] = info.get("status")
        line["max_memory_allocated"] = alloc.get("max_memory_allocated")
        line["max_memory_reserved"] = alloc.get("max_memory_reserved")
        stages = [s for s in info.get("stages", []) if s.get("peak_allocated_bytes") is not None]
        if stages:
            top = max(stages, key=lambda s: s["peak_allocated_bytes"])
            line["peak_stage"] = top["name"]
            line["stage_peak_max"] = top["peak_allocated_bytes"]
    if res["rc"] != 0 and log.exists():  # the log's last line says why
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        line["why"] = tail[-1][:300] if tail else ""
    return line


def finish(run_dir: Path) -> dict[str, Any]:
    """Check the run (labels, trace length), then xz-pack its snapshot; DIR/<name>.check.json."""
    res: dict[str, Any] = {}
    try:
        res["check"] = check_sample(run_dir)
    except Exception as err:  # a broken snapshot is reported, and the next run still starts
        res["check_error"] = repr(err)
    res["sizes"] = pack_sample(run_dir)
    (run_dir.parent / f"{run_dir.name}.check.json").write_text(json.dumps(res, indent=1, default=str))
    out = {"bytes": res["sizes"]["total"], "fits_2MB": res["sizes"]["fits_2MB"]}
    if "check_error" in res:
        out["check_error"] = res["check_error"][:200]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python sample_snapshots/record_flux_samples.py")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", default="", help="comma-separated sample names")
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=3000.0, help="seconds for all runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    unknown = [s for s in only if s not in SAMPLES]
    if unknown:
        print(f"unknown sample {unknown[0]!r}; choose from {', '.join(SAMPLES)}", file=sys.stderr)
        return 2
    names = [n for n in SAMPLES if not only or n in only]
    if a.dry_run:
        for n in names:
            print(shlex.join(command(n, a.out, a.size, a.device)))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    t_end = time.time() + a.deadline
    lines = []
    for name in names:
        left = t_end - time.time()
        if left < 60:
            line: dict[str, Any] = {"name": name, "skipped": "deadline"}
        else:
            res = run_one(name, a.out, a.size, a.device, min(a.run_timeout, left))
            line = summarize(res, a.out / name, a.out / f"{name}.log")
            if (a.out / name / "run.json").exists():
                line.update(finish(a.out / name))
        print(json.dumps(line), flush=True)
        lines.append(line)
    (a.out / "summary.json").write_text(json.dumps(lines, indent=1))
    ok = sum(1 for ln in lines if ln.get("rc") == 0 and ln.get("fits_2MB"))
    print(f"{ok}/{len(lines)} samples recorded within {MAX_SAMPLE_BYTES // 2**20} MB", file=sys.stderr)
    return 0 if ok == len(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
