"""Per-rank snapshots of a made-up data-parallel training job, written by the oracle allocator
(``synth.Sim``) in torchtitan's layout (``memory_snapshot/iteration_N/rankR_memory_snapshot.pickle``)
or as one run directory per rank; each returns the oracle's own peaks to check against."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass

from synth import DEFAULT_CAPACITY, MiB, Sim, SimOOM, make_frames


@dataclass(frozen=True)
class RankTruth:
    path: str
    rank: int
    peak_allocated: int
    peak_reserved: int
    oom: bool
    oom_time_us: int | None


def rank_workload(
    rank: int,
    act_mib: int,
    *,
    capacity: int | None = None,
    steps: int = 2,
    start_time_us: int = 1_796_003_367_980_133,
    seed: int = 0,
) -> tuple[Sim, bool]:
    """Weights, then per step forward (activations ``act_mib`` each layer), backward, optimizer.
    With ``capacity`` the allocator may run out: the run stops there (an ``oom`` entry)."""
    sim = Sim(seed=seed + rank, start_time_us=start_time_us, capacity=capacity or DEFAULT_CAPACITY)
    oom = False
    try:
        with sim.stage("load"):
            weights = [sim.alloc(20 * MiB, frames=make_frames("init_weights", "/job/model.py", 10)) for _ in range(4)]
        for step in range(steps):
            with sim.stage(f"forward/{step}"):
                acts = [
                    sim.alloc(act_mib * MiB, frames=make_frames("attention", "/job/model.py", 40)) for _ in range(4)
                ]
            with sim.stage(f"backward/{step}"):
                grads = [sim.alloc(20 * MiB, frames=make_frames("backward", "/job/train.py", 77)) for _ in weights]
                for a in acts:
                    sim.free(a)
            with sim.stage(f"optimizer/{step}"):
                tmp = sim.alloc(40 * MiB, frames=make_frames("adam_step", "/job/optim.py", 12))
                sim.free(tmp)
                for g in grads:
                    sim.free(g)
    except SimOOM:
        oom = True
    return sim, oom


def _oom_time(d: dict) -> int | None:
    times = [e["time_us"] for t in d["device_traces"] for e in t if e["action"] == "oom"]
    return min(times) if times else None


def write_torchtitan(
    root: str,
    acts_mib: list[int],
    *,
    iteration: int = 10,
    capacity_of: dict[int, int] | None = None,
    start_of: dict[int, int] | None = None,
    sidecars: bool = False,
) -> list[RankTruth]:
    """One pickle per rank under ``root/memory_snapshot/iteration_N/``; returns the oracle's truth.
    ``sidecars``: also ``rank<r>_run.json`` beside each (rank, world size, the allocator's figures)."""
    folder = os.path.join(root, "memory_snapshot", f"iteration_{iteration}")
    os.makedirs(folder, exist_ok=True)
    out = []
    for rank, act in enumerate(acts_mib):
        kw = {}
        if start_of and rank in start_of:
            kw["start_time_us"] = start_of[rank]
        sim, oom = rank_workload(rank, act, capacity=(capacity_of or {}).get(rank), **kw)
        d = sim.snapshot(marker=False)
        path = os.path.join(folder, f"rank{rank}_memory_snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(d, f)
        if sidecars:
            rj = {
                "schema": "snapviz.run/1",
                "pipeline": "gpt2",
                "rank": rank,
                "world_size": len(acts_mib),
                "backend": "gloo",
                "iteration": iteration,
                "allocator": {"max_memory_allocated": sim.peak_allocated(), "max_memory_reserved": sim.peak_reserved()},
            }
            with open(os.path.join(folder, f"rank{rank}_run.json"), "w") as f:
                json.dump(rj, f)
        out.append(RankTruth(path, rank, sim.peak_allocated(), sim.peak_reserved(), oom, _oom_time(d)))
    return out


def write_run_dirs(
    root: str, acts_mib: list[int], *, extra: dict[int, dict] | None = None, folder_of=lambda r: f"rank_{r}"
) -> list[RankTruth]:
    """One run directory per rank (``snapshot.pickle`` + run.json with rank, world size and the
    allocator's figures), as ``snapviz collect`` under torchrun writes them."""
    out = []
    for rank, act in enumerate(acts_mib):
        sim, oom = rank_workload(rank, act)
        d = sim.snapshot(marker=False)
        run = os.path.join(root, folder_of(rank))
        os.makedirs(run, exist_ok=True)
        with open(os.path.join(run, "snapshot.pickle"), "wb") as f:
            pickle.dump(d, f)
        rj = {
            "schema": "snapviz.run/1",
            "pipeline": "ddp-toy",
            "rank": rank,
            "world_size": len(acts_mib),
            "allocator": {"max_memory_allocated": sim.peak_allocated(), "max_memory_reserved": sim.peak_reserved()},
            "stages": [],
        }
        rj.update((extra or {}).get(rank, {}))
        with open(os.path.join(run, "run.json"), "w") as f:
            json.dump(rj, f)
        out.append(RankTruth(run, rank, sim.peak_allocated(), sim.peak_reserved(), oom, _oom_time(d)))
    return out
