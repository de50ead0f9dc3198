#!/usr/bin/env python3
"""``snapviz ranks`` on a fleet: N per-rank snapshots made from a real sample, digested through
the local process pool and through a Dask ``LocalCluster`` (worker processes, loopback only),
with 1 and 2 workers each.

The fleet (torchtitan's layout, ``memory_snapshot/iteration_1/rankR_memory_snapshot.pickle.xz``):
every rank is the real sample (default ``sample_snapshots/sd15-fp16-profile-1step``, the
smallest, so the run stays short on a small machine) shifted in time by R ms; rank
``--outlier`` also holds a 1 GiB block from before the recording (one more end-state segment:
the allocator's own peak is then the sample's plus 1 GiB, exactly), and rank ``--oom`` ends
with a CUDA OOM entry. Checks: every rank's peak equals the sample's (plus 1 GiB for the
outlier), the outlier is the only outlier, the OOM rank is the first (and only) to OOM.

Per configuration: wall time, throughput (files/s and pickle MB/s), and the peak RSS of each
worker process (``ru_maxrss`` reported by the task itself: a worker holds one analysis at a time).

    python benchmarks/bench_ranks.py [--ranks 256] [--base DIR] [--configs pool:1,pool:2,dask:1,dask:2]
"""

from __future__ import annotations

import argparse
import lzma
import os
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from snapviz.analyses.ranks import FleetRow, analyse_ranks, ranks_document  # noqa: E402
from snapviz.cli.inputs import fleet_digest  # noqa: E402
from snapviz.engine import TaskFailed, run_tasks  # noqa: E402
from snapviz.load.fleet import expand_inputs  # noqa: E402
from snapviz.load.snapshot.safe_pickle import safe_load_pickle  # noqa: E402

GiB = 1 << 30


def measured_digest(source: str, label: str) -> tuple[Any, int, float, int]:
    """The fleet digest, this worker's peak RSS so far (KiB), the task's own seconds, the worker's pid."""
    t = time.perf_counter()
    d = fleet_digest(source, label)
    return d, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - t, os.getpid()


def make_fleet(base: dict[str, Any], root: Path, n: int, outlier: int, oom: int) -> int:
    folder = root / "memory_snapshot" / "iteration_1"
    folder.mkdir(parents=True)
    total = 0
    trace = base["device_traces"][0]
    top = max(s["address"] + s["total_size"] for s in base["segments"])
    for r in range(n):
        off = r * 1000
        d = dict(base)
        d["device_traces"] = [[{**e, "time_us": e["time_us"] + off} for e in trace]]
        if "external_annotations" in base:
            d["external_annotations"] = [{**a, "time_us": a["time_us"] + off} for a in base["external_annotations"]]
        if r == outlier:  # 1 GiB allocated before the recording began: one more live segment
            seg = {
                **base["segments"][0],
                "address": top + (64 << 20),
                "total_size": GiB,
                "allocated_size": GiB,
                "active_size": GiB,
                "requested_size": GiB,
            }
            seg["blocks"] = [
                {
                    "address": seg["address"],
                    "size": GiB,
                    "requested_size": GiB,
                    "state": "active_allocated",
                    "frames": [],
                }
            ]
            d["segments"] = [*base["segments"], seg]
        if r == oom:
            last = d["device_traces"][0][-1]
            d["device_traces"][0].append(
                {
                    **last,
                    "action": "oom",
                    "addr": 1 << 30,
                    "size": 80 * GiB,
                    "time_us": last["time_us"] + 10,
                    "frames": [],
                }
            )
        data = lzma.compress(pickle.dumps(d, protocol=4), preset=1)
        (folder / f"rank{r}_memory_snapshot.pickle.xz").write_bytes(data)
        total += len(data)
    return total


def run_config(kind: str, workers: int, sources: list[str]) -> tuple[list[Any], float]:
    args = [(s, f"r{i}") for i, s in enumerate(sources)]
    t = time.perf_counter()
    if kind == "pool":
        out = run_tasks(measured_digest, sources, args, jobs=workers, show_progress=False)
    else:
        from distributed import LocalCluster

        with LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster:
            t = time.perf_counter()  # the cluster's start is not the digests' time
            out = run_tasks(measured_digest, sources, args, scheduler=cluster.scheduler_address, show_progress=False)
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--base", default=str(ROOT / "sample_snapshots" / "sd15-fp16-profile-1step"))
    ap.add_argument("--outlier", type=int, default=137)
    ap.add_argument("--oom", type=int, default=201)
    ap.add_argument("--configs", default="pool:1,pool:2,dask:1,dask:2")
    a = ap.parse_args()
    snap = next(p for p in (Path(a.base) / "snapshot.pickle.xz", Path(a.base)) if p.is_file())
    base = safe_load_pickle(str(snap))
    truth = fleet_digest(str(snap), "base")
    expected = [truth.peak_allocated + (GiB if r == a.outlier else 0) for r in range(a.ranks)]
    with tempfile.TemporaryDirectory(prefix="snapviz-bench-ranks-") as tmp:
        t = time.perf_counter()
        size = make_fleet(base, Path(tmp), a.ranks, a.outlier, a.oom)
        print(
            f"fleet: {a.ranks} ranks of {Path(a.base).name} ({truth.events:,} events each), "
            f"{size / 1e6:.1f} MB of .pickle.xz, written in {time.perf_counter() - t:.1f} s; "
            f"base peak {truth.peak_allocated:,} B (run.json: {truth.run_info.get('allocator_max_memory_allocated')})"
        )
        found = expand_inputs([tmp])  # name order (rank0, rank1, rank10, …): the rank is read from the name
        sources = [f.source for f in found]
        print(
            "| engine | workers | wall s | files/s | MB/s (xz) | task s (median) | peak RSS per worker (MiB) | "
            "outlier found | first OOM | peaks exact |"
        )
        print("|---|---:|---:|---:|---:|---:|---|---|---|---|")
        for cfg in a.configs.split(","):
            kind, w = cfg.split(":")
            out, wall = run_config(kind, int(w), sources)
            failed = [o for o in out if isinstance(o, TaskFailed)]
            if failed:
                print(f"{cfg}: {len(failed)} failed, e.g. {failed[0]}")
                return 1
            rows = [
                FleetRow(f.source, f"r{i}", f.rank, f.iteration, o[0])
                for i, (f, o) in enumerate(zip(found, out, strict=True))
            ]
            doc = ranks_document(analyse_ranks(rows))
            it = doc.iterations[0]
            first_oom = it.first_oom.rank if it.first_oom is not None else None
            exact = [r.peak.allocated_bytes for r in doc.ranks] == expected
            peak_of: dict[int, int] = {}
            for o in out:  # a worker's peak: its largest ru_maxrss over its tasks
                peak_of[o[3]] = max(peak_of.get(o[3], 0), o[1])
            where = " (in this process)" if os.getpid() in peak_of else ""
            tasks = sorted(o[2] for o in out)
            print(
                f"| {kind} | {w} | {wall:.1f} | {len(sources) / wall:.1f} | {size / 1e6 / wall:.2f} | "
                f"{tasks[len(tasks) // 2]:.2f} | {', '.join(f'{x / 1024:.0f}' for x in sorted(peak_of.values()))}{where} | "
                f"{[o.rank for o in it.outliers]} | {first_oom} | {exact} |"
            )
            if [o.rank for o in it.outliers] != [a.outlier] or first_oom != a.oom or not exact:
                print("CHECK FAILED: " + "; ".join(doc.verdict))
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
