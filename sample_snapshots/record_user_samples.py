"""Record the allocator-settings, user-training and DDP samples in one GPU session.

    python sample_snapshots/record_user_samples.py --out WORKDIR --pack PACKDIR [--deadline 540]
        [--only NAME,NAME]

Runs every job as its own process (each has its own caching allocator, so jobs that share the
GPU do not change each other's memory numbers; only ``wall_s`` is not a benchmark):

* settings (issues 23, 28): two workloads, a GPT-2 training loop written as a user writes it
  (``record_user_train.py``, varying sequence lengths) and SD 1.5 fp16 inference through the
  collectors (``python -m collectors ... --alloc-conf``), each under the default settings,
  ``expandable_segments:True``, ``max_split_size_mb:64``, ``roundup_power2_divisions:4`` and
  ``roundup_power2_divisions:[256:1,512:2,>:4]``. Once a workload's default run is done, its
  allocated peak P sets the capped runs (``CAPPED``): ``garbage_collection_threshold:0.6`` under
  a cap of 1.25 P (so 0.6 of the cap, 0.75 P, lies below the default's reserved peak and
  collection happens), and a cap of 1.02 P with the default settings and with
  ``expandable_segments:True`` (SD 1.5 survives 1.02 P, so its OOM run is capped at 0.90 P).
  The GPT-2 ``max_split_size_mb:64`` run goes last and alone: without a cap its cache can grow
  to the whole card, which would starve runs beside it.
* user training (issue 22): GPT-2 labelled on the main thread only, the same unlabelled, and a
  plain ``nn.Module`` loop.
* ranks (issue 24): DDP over gloo, 4 ranks on the one GPU (``record_ddp_ranks.py``).

Each run directory is then packed as the samples are (``record_samples.pack_sample``:
``snapshot.pickle`` → ``snapshot.pickle.xz``, preset 9), and the groups are written to
``PACKDIR`` as tar files (logs and a summary beside them).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from record_samples import pack_sample  # noqa: E402

GPT2_VARLEN = ["--model", "gpt2", "--batch", "4", "--seq-lens", "512,1024,256,768,1024,384,896,640,1024,512"]
SD15 = [
    "--pipeline",
    "sd15",
    "--size",
    "full",
    "--device",
    "cuda",
    "--steps",
    "4",
    "-t",
    "fp16",
    "--batch",
    "1",
    "--stacks",
    "python",
    "--context",
    "all",
    "--seed",
    "0",
]
SETTINGS = {  # name suffix -> PYTORCH_CUDA_ALLOC_CONF (None: unset)
    "default": None,
    "expandable": "expandable_segments:True",
    "maxsplit64": "max_split_size_mb:64",
    "roundup4": "roundup_power2_divisions:4",
    "roundup-intervals": "roundup_power2_divisions:[256:1,512:2,>:4]",
}
# workload -> name suffix -> (PYTORCH_CUDA_ALLOC_CONF, cap as a multiple of the default run's
# allocated peak). At 1.02x the GPT-2 loop runs out of memory; SD 1.5 does not (cuDNN catches its
# workspace OOMs and retries smaller; freeing the cache does the rest), so its OOM run is capped
# at 0.90x and its 1.02x run is kept under its own name.
CAPPED = {
    "gpt2": {
        "gc06": ("garbage_collection_threshold:0.6", 1.25),
        "cap-oom": (None, 1.02),
        "cap-expandable": ("expandable_segments:True", 1.02),
    },
    "sd15": {
        "gc06": ("garbage_collection_threshold:0.6", 1.25),
        "cap102": (None, 1.02),
        "cap-oom": (None, 0.90),
        "cap-expandable": ("expandable_segments:True", 1.02),
    },
}
GROUPS = {  # tar file -> sample name prefixes, in the order the samples are wanted
    "roundup": ["gpt2-train-varlen-roundup", "sd15-fp16-alloc-roundup"],
    "settings-gpt2": ["gpt2-train-varlen-"],
    "settings-sd15": ["sd15-fp16-alloc-"],
    "train": ["gpt2-train-labels-main-thread", "gpt2-train-nolabels", "mlp-train-plain"],
    "ranks": ["ddp-gloo-4rank"],
}


class Session:
    def __init__(self, work: Path, deadline: float) -> None:
        self.work = work
        self.t0 = time.time()
        self.t_end = self.t0 + deadline
        self.results: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="2",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DEACTIVATE_ASYNC_LOAD="1",
        )
        self.env.pop("PYTORCH_CUDA_ALLOC_CONF", None)

    def left(self) -> float:
        return self.t_end - time.time()

    def run(self, name: str, cmd: list[str]) -> dict[str, Any]:
        t = time.time()
        timeout = self.left() - 45  # leave time to pack
        res: dict[str, Any] = {"name": name, "cmd": cmd, "start_s": round(t - self.t0, 1)}
        if timeout < 30:
            res["rc"] = "skipped (deadline)"
        else:
            with open(self.work / f"{name}.log", "w") as log:
                try:
                    res["rc"] = subprocess.run(
                        cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, timeout=timeout
                    ).returncode
                except subprocess.TimeoutExpired:
                    res["rc"] = "timeout"
        res["elapsed_s"] = round(time.time() - t, 1)
        with self.lock:
            self.results[name] = res
        print(json.dumps({k: v for k, v in res.items() if k != "cmd"}), flush=True)
        return res


SMOKE: list[bool] = [False]  # --smoke: the same jobs, tiny, on the CPU (tests the orchestration)
TINY_GPT2 = ["--device", "cpu", "--layers", "1", "--embd", "64", "--heads", "2"]


def user_train(out: Path, *args: str) -> list[str]:
    extra = TINY_GPT2 if SMOKE[0] else []
    if SMOKE[0] and "--seq-lens" in args:
        i = args.index("--seq-lens") + 1
        args = (*args[:i], "32,64", *args[i + 1 :])
    return [sys.executable, str(HERE / "record_user_train.py"), *args, *extra, "--out", str(out)]


def collect(out: Path, *args: str) -> list[str]:
    base = (
        [a.replace("full", "tiny").replace("cuda", "cpu").replace("fp16", "fp32") for a in SD15] if SMOKE[0] else SD15
    )
    return [sys.executable, "-m", "collectors", *base, *args, "--out", str(out)]


def peak(run_dir: Path) -> int | None:
    if SMOKE[0] and (run_dir / "run.json").exists():
        return 1 << 30  # CPU runs have no allocator: a stand-in peak
    try:
        return int(json.loads((run_dir / "run.json").read_text())["allocator"]["max_memory_allocated"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def jobs_first(work: Path) -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    for suffix, conf in SETTINGS.items():
        extra = ["--alloc-conf", conf] if conf else []
        if suffix != "maxsplit64":  # the GPT-2 one runs alone, last
            jobs[f"gpt2-train-varlen-{suffix}"] = user_train(work / f"gpt2-train-varlen-{suffix}", *GPT2_VARLEN, *extra)
        jobs[f"sd15-fp16-alloc-{suffix}"] = collect(work / f"sd15-fp16-alloc-{suffix}", *extra)
    gpt2 = ["--model", "gpt2", "--batch", "4", "--seq-lens", "1024,1024,1024"]
    jobs["gpt2-train-labels-main-thread"] = user_train(
        work / "gpt2-train-labels-main-thread", *gpt2, "--labels", "main-thread"
    )
    jobs["gpt2-train-nolabels"] = user_train(work / "gpt2-train-nolabels", *gpt2)
    jobs["mlp-train-plain"] = user_train(work / "mlp-train-plain", "--model", "mlp", "--steps", "3", "--batch", "4")
    jobs["ddp-gloo-4rank"] = [
        sys.executable,
        str(HERE / "record_ddp_ranks.py"),
        "--out",
        str(work / "ddp-gloo-4rank"),
        "--world-size",
        "4",
        "--iterations",
        "4",
        "--seq-lens",
        "256,512,768,1024",
    ]
    if SMOKE[0]:
        jobs["ddp-gloo-4rank"] += [
            "--device",
            "cpu",
            "--world-size",
            "2",
            "--iterations",
            "1",
            "--layers",
            "1",
            "--embd",
            "64",
            "--heads",
            "2",
            "--seq-lens",
            "16,32",
        ]
        jobs["mlp-train-plain"] += ["--device", "cpu", "--batch", "1", "--steps", "1"]
    return jobs


def jobs_capped(work: Path, workload: str, total: int) -> dict[str, list[str]]:
    """The capped runs of one workload, sized from its default run's allocated peak."""
    base = "gpt2-train-varlen" if workload == "gpt2" else "sd15-fp16-alloc"
    p = peak(work / f"{base}-default")
    if p is None:
        return {}
    jobs: dict[str, list[str]] = {}
    for suffix, (conf, factor) in CAPPED[workload].items():
        name = f"{base}-{suffix}"
        extra = ["--alloc-conf", conf] if conf else []
        if workload == "gpt2":
            frac = f"{factor * p / total:.6f}"
            jobs[name] = user_train(work / name, *GPT2_VARLEN, *extra, "--memory-fraction", frac)
        elif not SMOKE[0]:  # the collectors refuse a cap on the CPU
            gib = f"{factor * p / 2**30:.4f}"
            jobs[name] = collect(work / name, *extra, "--memory-limit-gb", gib)
    return jobs


def pack(work: Path, name: str) -> dict[str, Any]:
    d = work / name
    if name.startswith("ddp"):
        sizes: dict[str, Any] = {}
        for pkl in sorted(d.glob("memory_snapshot/*/*.pickle")):
            pkl.with_name(pkl.name + ".xz").write_bytes(lzma.compress(pkl.read_bytes(), preset=9))
            pkl.unlink()
        for f in sorted(d.rglob("*")):
            if f.is_file():
                sizes[str(f.relative_to(d))] = f.stat().st_size
        return sizes
    return pack_sample(d) if (d / "run.json").exists() else {"error": "no run.json"}


def write_tars(work: Path, dest: Path, names: list[str]) -> dict[str, list[str]]:
    done: dict[str, list[str]] = {}
    left = [n for n in names if (work / n).is_dir()]
    for group, prefixes in GROUPS.items():
        members = [n for n in left if any(n.startswith(p) for p in prefixes)]
        left = [n for n in left if n not in members]
        if not members:
            continue
        with tarfile.open(dest / f"{group}.tar", "w") as tar:
            for n in members:
                tar.add(work / n, arcname=n)
        done[group] = members
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="work directory (run directories)")
    ap.add_argument("--pack", required=True, type=Path, help="where the tar files go")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    ap.add_argument("--only", default="", help="comma-separated job names (default: all)")
    ap.add_argument(
        "--device-total", type=int, default=None, help="the card's bytes (default: torch.cuda.get_device_properties)"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny versions of every job on the CPU (checks this script, not memory)"
    )
    a = ap.parse_args()
    SMOKE[0] = a.smoke
    a.out.mkdir(parents=True, exist_ok=True)
    a.pack.mkdir(parents=True, exist_ok=True)
    s = Session(a.out, a.deadline)
    total = a.device_total
    if total is None:
        import torch  # only the card's size: this process allocates nothing on the GPU

        total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 150 << 30
    only = {n for n in a.only.split(",") if n}

    def want(name: str) -> bool:
        return not only or name in only

    first = {n: c for n, c in jobs_first(a.out).items() if want(n)}
    pool = ThreadPoolExecutor(max_workers=32)
    futures = []

    def then_capped(workload: str) -> None:
        for n, c in jobs_capped(a.out, workload, total).items():
            if want(n):
                futures.append(pool.submit(s.run, n, c))

    for n, c in first.items():
        if n == "gpt2-train-varlen-default":
            futures.append(pool.submit(lambda n=n, c=c: (s.run(n, c), then_capped("gpt2"))))
        elif n == "sd15-fp16-alloc-default":
            futures.append(pool.submit(lambda n=n, c=c: (s.run(n, c), then_capped("sd15"))))
        else:
            futures.append(pool.submit(s.run, n, c))
    while any(not f.done() for f in futures):  # capped jobs are appended while this waits
        time.sleep(1)
    last = "gpt2-train-varlen-maxsplit64"
    if want(last):  # alone: its cache may grow to the whole card
        s.run(last, user_train(a.out / last, *GPT2_VARLEN, "--alloc-conf", "max_split_size_mb:64"))
    names = sorted(s.results)
    with ThreadPoolExecutor(max_workers=16) as packers:
        sizes = dict(zip(names, packers.map(lambda n: pack(a.out, n), names), strict=True))
    tars = write_tars(a.out, a.pack, names)
    summary = {
        "results": s.results,
        "sizes": sizes,
        "tars": tars,
        "device_total": total,
        "elapsed_s": round(time.time() - s.t0, 1),
    }
    (a.pack / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(a.pack / "logs.tar", "w") as tar:
        for log in sorted(a.out.glob("*.log")):
            tar.add(log, arcname=log.name)
    print(json.dumps({"elapsed_s": summary["elapsed_s"], "tars": tars}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
