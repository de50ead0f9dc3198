"""A fake collector for the fit finder's tests: per-combination peaks of a Flux-like model played
back under a card's cap (fits exactly when the peak is at most the cap; out of memory otherwise,
during load when the weights alone are over it), written as the collector writes run.json. The
allocator reserves 1.5 GiB more than it allocates at the peak (RESERVE_SLACK), as real runs do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collectors.fit import Card
from collectors.matrix.ranking import measure
from collectors.matrix.runner import VariantResult
from collectors.matrix.variants import Variant

G = 2**30
RESERVE_SLACK = int(1.5 * G)

# (peak GiB, weights after load GiB, call s) of a Flux-like model, by combination
TRUTH: dict[str, tuple[float, float, float]] = {
    "bf16": (35.0, 33.0, 10.0),
    "bf16+vae-tiling": (34.0, 33.0, 11.0),
    "bf16+layerwise-fp8": (23.0, 20.0, 12.0),
    "bf16+layerwise-fp8+vae-tiling": (22.0, 20.0, 13.0),
    "bf16+nf4-transformer": (17.0, 15.5, 14.0),
    "bf16+nf4-transformer+nf4-t5": (11.0, 9.5, 15.0),
    "bf16+group-offload": (6.0, 0.5, 30.0),
    "bf16+model-offload": (24.5, 0.1, 40.0),
    "bf16+sequential-offload": (2.0, 0.0, 300.0),
}


def run_json(label: str, cap: int, steps: int = 2) -> dict[str, Any]:
    """What the collector writes: the stages up to an OOM, or all of them with allocator truth."""
    peak, load, call = (int(TRUTH[label][0] * G), int(TRUTH[label][1] * G), TRUTH[label][2])
    stages = [
        {
            "name": "load",
            "start_us": 0,
            "end_us": 1,
            "peak_allocated_bytes": load,
            "peak_reserved_bytes": load,
            "wall_s": 5.0,
        }
    ]
    if load > cap:
        stages[0].update(end_us=None, open=True)
        return {"status": "oom", "oom": {"stage": "load"}, "stages": stages}
    names = ["text_encode", *(f"denoise/{i}" for i in range(steps)), "vae_decode"]
    for i, n in enumerate(names):
        p = peak if n == "vae_decode" else (load + peak) // 2
        stages.append(
            {
                "name": n,
                "start_us": i + 1,
                "end_us": i + 2,
                "peak_allocated_bytes": p,
                "peak_reserved_bytes": p,
                "wall_s": call / len(names),
            }
        )
    if peak > cap:
        stages[-1].update(end_us=None, open=True)
        return {"status": "oom", "oom": {"stage": "vae_decode"}, "stages": stages}
    return {
        "schema": "snapviz.run/1",
        "status": "ok",
        "pipeline": "flux-dev",
        "height": 1024,
        "width": 1024,
        "device_name": "NVIDIA H200",
        "stages": stages,
        "allocator": {"max_memory_allocated": peak, "max_memory_reserved": peak + RESERVE_SLACK},
    }


class FakeRunner:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, str]] = []  # (card label, variant label)

    def __call__(self, v: Variant, c: Card) -> VariantResult:
        self.calls.append((c.label, v.label))
        info = run_json(v.label, c.bytes)
        rd = self.root / c.label.replace(" ", "") / v.label
        rd.mkdir(parents=True)
        (rd / "run.json").write_text(json.dumps(info))
        status = info["status"]
        res = VariantResult(
            v,
            status,
            None if status == "ok" else "CUDA out of memory",
            rd,
            rd.with_suffix(".log"),
            0 if status == "ok" else 1,
            1.0,
            "0",
            run=info,
        )
        res.measure = measure(info) if status == "ok" else None
        return res
