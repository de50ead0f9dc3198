"""Compare benchmark: ``snapviz compare`` of 10 runs of 1,000,000 events vs one ``analyze``.

    python benchmarks/bench_compare.py [--runs 10] [--events 1000000] [--html] [--keep DIR]

1. Builds ``--runs`` labelled snapshots of ``--events`` trace entries each, as
   ``benchmarks/bench_analyze.py`` does: a base repeated until it is big enough, the base of
   run *i* being the *i*-th ``sample_snapshots/*/snapshot.pickle.xz`` (so the runs are real,
   different pipelines and techniques). Without bench_analyze.py (or with ``--own-builder``)
   a synthetic builder here makes diffusion-like runs: weights in ``load``, activations in
   every ``denoise/k`` step, big buffers in ``vae_decode``, sizes and step counts per run.
2. Runs ``snapviz analyze`` on the first and ``snapviz compare`` on all of them, each in its
   own process (``python -m snapviz``), and reports each process's wall time and peak RSS
   (``os.wait4``: whole-process figures, interpreter start and imports included).
3. Prints a Markdown table and whether compare stayed under 10x one analysis.

The target: comparing N runs costs less than N analyses (each run is analysed once and
reduced to a small digest; only one full analysis is held in memory at a time).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import platform
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
GiB = 1 << 30
SP = "/usr/lib/python3/site-packages/"


def _stacks(rng: random.Random, n: int, kind: str) -> list[list[dict[str, Any]]]:
    """Shared frame lists (as torch pickles them: one list object per distinct traceback)."""
    files = {
        "weights": SP + "diffusers/models/model_loading_utils.py",
        "text": SP + "transformers/models/clip/modeling_clip.py",
        "unet": SP + "diffusers/models/unets/unet_2d_blocks.py",
        "attn": SP + "diffusers/models/attention_processor.py",
        "vae": SP + "diffusers/models/autoencoders/vae.py",
    }
    out = []
    for i in range(n):
        depth = rng.randint(6, 14)
        fr = [{"filename": files[kind], "line": 100 + 7 * i, "name": f"{kind}_op{i}"}]
        fr += [
            {"filename": SP + "torch/nn/modules/module.py", "line": 1750, "name": "_call_impl"},
            {"filename": SP + "diffusers/pipelines/pipeline_utils.py", "line": 980 + i % 5, "name": "__call__"},
        ]
        fr += [{"filename": "/work/run.py", "line": 10 + d, "name": f"frame{d}"} for d in range(depth)]
        out.append(fr)
    return out


def build_snapshot(
    n_events: int, seed: int, steps: int = 30, vae_scale: float = 1.0, act_scale: float = 1.0
) -> dict[str, Any]:
    """A consistent labelled snapshot of about ``n_events`` entries.

    Every block is its own segment, sized exactly (block sizes are multiples of 512, so
    requested == block size): a freed block is cached and reused by the next request of
    the same size, as the caching allocator does for exact fits.
    """
    rng = random.Random(seed)
    stacks = {
        k: _stacks(rng, n, k) for k, n in (("weights", 40), ("text", 20), ("unet", 150), ("attn", 20), ("vae", 30))
    }
    trace: list[dict[str, Any]] = []
    t = 1_796_000_000_000_000 + seed * 10**9
    next_addr = 0x7F0000000000
    cache: dict[int, list[int]] = {}  # block size -> cached segment addresses
    seg_of: dict[int, int] = {}  # address -> size (every segment ever made, live or cached)
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    label = ""

    def ev(action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        nonlocal t
        t += rng.randint(1, 30)
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": t,
                "compile_context": "N/A",
                "user_metadata": label,
                "frames": frames,
            }
        )

    def alloc(size: int, kind: str) -> int:
        nonlocal next_addr
        size = max(512, (size + 511) // 512 * 512)
        frames = rng.choice(stacks[kind])
        pool = cache.get(size)
        if pool:
            addr = pool.pop()
        else:
            addr = next_addr
            next_addr += size + 2 * MiB
            seg_of[addr] = size
            ev("segment_alloc", addr, size, frames)
        ev("alloc", addr, size, frames)
        live[addr] = (size, frames)
        return addr

    def free(addr: int) -> None:
        size, frames = live.pop(addr)
        ev("free_requested", addr, size, frames)
        ev("free_completed", addr, size, frames)
        cache.setdefault(size, []).append(addr)

    def act_size() -> int:
        r = rng.random()
        if r < 0.6:
            return int(rng.randint(1, 256) * 4096 * act_scale)
        if r < 0.95:
            return int(rng.randint(1, 64) * MiB * act_scale)
        return int(rng.randint(100, 400) * MiB * act_scale)

    label = "load"
    for _ in range(1500):
        alloc(rng.randint(1, 2000) * 4096, "weights")
    label = "text_encode"
    emb = [alloc(77 * 2048 * 2, "text") for _ in range(4)]
    tmp = [alloc(act_size(), "text") for _ in range(200)]
    for a in tmp:
        free(a)
    budget = max(1, n_events - len(trace) - 2000)
    per_step = budget // (steps + 1) // 3  # allocations per step (3 entries each, plus segments)
    for k in range(steps):
        label = f"denoise/{k}"
        stack: list[int] = []
        for _ in range(per_step):
            if stack and (len(stack) > 40 or rng.random() < 0.48):
                free(stack.pop(rng.randrange(max(0, len(stack) - 3), len(stack))))
            else:
                stack.append(alloc(act_size(), "attn" if rng.random() < 0.05 else "unet"))
        for a in stack:
            free(a)
    label = "vae_decode"
    stack = []
    while len(trace) < n_events - 2 * len(emb) - 3:
        if stack and (len(stack) > 12 or rng.random() < 0.45):
            free(stack.pop())
        else:
            stack.append(alloc(int(rng.randint(8, 600) * MiB * vae_scale), "vae"))
    for a in stack + emb:
        free(a)
    label = ""
    segments = []
    for addr, size in seg_of.items():
        state = "active_allocated" if addr in live else "inactive"
        frames = live[addr][1] if addr in live else []
        segments.append(
            {
                "device": 0,
                "address": addr,
                "total_size": size,
                "allocated_size": size if addr in live else 0,
                "active_size": size if addr in live else 0,
                "requested_size": size if addr in live else 0,
                "stream": 0,
                "segment_type": "large" if size > MiB else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [{"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames}],
            }
        )
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False},
        "external_annotations": [],
    }


def _bench_analyze_builder() -> Any:
    """bench_analyze.py's way of making a big snapshot: a base (a real sample when there are
    some, else tests/support/synth.py) repeated to the target size. None when that file is absent."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import bench_analyze  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - absent or broken: use ours
        return None
    if not all(hasattr(bench_analyze, n) for n in ("load_base", "repeat_snapshot")):
        return None
    samples = sorted(glob.glob(os.path.join(REPO, "sample_snapshots", "*", "snapshot.pickle.xz")))

    def build(n_events: int, i: int) -> tuple[dict[str, Any], str]:
        path = samples[i % len(samples)] if samples else None
        base, _, _ = bench_analyze.load_base(path, 3000, i)
        snap, _ = bench_analyze.repeat_snapshot(base, n_events)
        name = os.path.basename(os.path.dirname(path)) if path else f"synthetic{i}"
        return snap, name

    return build


def run_measured(cmd: list[str]) -> dict[str, Any]:
    """Wall time and peak RSS of one child process (reaped with ``os.wait4``, so ru_maxrss is its own)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = subprocess.Popen(
            cmd,
            stdout=out_f,
            stderr=err_f,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")),
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err_f.seek(0)
        err = err_f.read().decode(errors="replace")
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return {"wall_s": wall, "rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--html", action="store_true", help="also time analyze -o / compare -o (HTML reports)")
    ap.add_argument("--keep", metavar="DIR", help="build the snapshots here and keep them (reused if present)")
    ap.add_argument(
        "--own-builder",
        action="store_true",
        help="use this file's synthetic builder, not bench_analyze.py's repeated samples",
    )
    args = ap.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="snapviz-bench-compare-")
    os.makedirs(work, exist_ok=True)
    builder = None if args.own_builder else _bench_analyze_builder()
    paths = []
    t_build = time.perf_counter()
    for i in range(args.runs):
        done = sorted(glob.glob(os.path.join(work, f"{i:02d}-*.pickle")))
        if done:
            paths.append(done[0])
            continue
        if builder is not None:
            snap, name = builder(args.events, i)
        else:
            snap, name = (
                build_snapshot(args.events, seed=i, steps=30 - i, vae_scale=1.0 - 0.07 * i, act_scale=1.0 + 0.05 * i),
                f"run{i}",
            )
        path = os.path.join(work, f"{i:02d}-{name}.pickle")
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=4)
        del snap
        paths.append(path)
    t_build = time.perf_counter() - t_build
    py = [sys.executable, "-m", "snapviz"]
    out_dir = tempfile.mkdtemp(prefix="snapviz-bench-out-")
    rows = []
    one = run_measured(py + ["analyze", paths[0], "--json", os.path.join(out_dir, "a.json"), "-q"])
    many = run_measured(py + ["compare", *paths, "--json", os.path.join(out_dir, "c.json"), "-q"])
    rows.append(("analyze --json", 1, one))
    rows.append(("compare --json", args.runs, many))
    if args.html:
        one_h = run_measured(py + ["analyze", paths[0], "-o", os.path.join(out_dir, "a.html"), "-q"])
        many_h = run_measured(py + ["compare", *paths, "-o", os.path.join(out_dir, "c.html"), "-q"])
        rows.append(("analyze -o report.html", 1, one_h))
        rows.append(("compare -o compare.html", args.runs, many_h))
    with open(os.path.join(out_dir, "c.json")) as f:
        doc = json.load(f)
    n_events = [r["events"] for r in doc["runs"]]

    print(f"### snapviz compare: {args.runs} runs of ~{args.events:,} events\n")
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"snapshots built in {t_build:.0f} s ({'bench_analyze.py: samples repeated' if builder else 'bench_compare.py builder'}), "
        f"{os.path.getsize(paths[0]) / MiB:.0f} MiB each; events per run {min(n_events):,}..{max(n_events):,}\n"
    )
    print("| command | runs | wall (s) | peak RSS (MiB) | wall / one analysis |")
    print("|---|---:|---:|---:|---:|")
    for i in range(0, len(rows), 2):
        base = rows[i][2]["wall_s"]
        for name, n, m in rows[i : i + 2]:
            print(f"| `snapviz {name}` | {n} | {m['wall_s']:.1f} | {m['rss_mib']:.0f} | {m['wall_s'] / base:.2f}× |")
    ratio = many["wall_s"] / one["wall_s"]
    verdict = "PASS" if ratio < 10 else "FAIL"
    print(
        f"\n{verdict}: compare of {args.runs} runs took {ratio:.2f}× one analysis (target < 10×); "
        f"peak RSS {many['rss_mib']:.0f} MiB vs {one['rss_mib']:.0f} MiB for one analysis."
    )
    if not args.keep:
        for p in paths:
            os.unlink(p)
    if verdict == "FAIL":
        sys.exit(1)


if __name__ == "__main__":
    main()
