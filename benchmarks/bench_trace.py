"""Chrome trace loader benchmark: parse a synthesized ~500 MB torch.profiler trace.

    python benchmarks/bench_trace.py [--mb 500] [--formats plain,gzip] [--repeat 3] [--baseline]

1. Records a real small trace on CPU with torch.profiler (profile_memory, record_shapes,
   with_stack) around a toy diffusion-like workload with stage ranges.
2. Synthesizes a big trace by repeating its events with shifted ``ts``, adding what a
   CUDA run has on top (``kernel`` / ``cuda_runtime`` events, flow events, CUDA
   ``[memory]`` events), written in torch's own indented layout.
3. Parses it with ``snapviz.load.trace.chrome_trace.load_chrome_trace`` in a separate
   process, and prints wall time, events/s and that process's peak RSS
   (``getrusage(RUSAGE_CHILDREN).ru_maxrss``).

Why a launcher process in between: Linux keeps ``ru_maxrss`` across fork and exec, so a
child forked from this process (torch loaded, ~300 MB) would report at least that much.
A small launcher forks the parser and reads ``RUSAGE_CHILDREN``, which then holds the
parser's peak alone.

The synthesized files are deleted afterwards. ``--baseline`` also times ``json.load``
of the same file, for contrast (it needs several GB of RAM). Needs torch
(CPU build is enough) for step 1 only; the parsing process never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

LAUNCHER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
proc = subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], capture_output=True, text=True)
wall = time.perf_counter() - t
if proc.returncode:
    sys.exit(proc.stderr)
res = json.loads(proc.stdout)
res["wall_s"] = wall
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
res["peak_rss_kib"] = ru.ru_maxrss  # KiB on Linux
res["cpu_s"] = ru.ru_utime + ru.ru_stime  # less sensitive than wall time to a busy machine
print(json.dumps(res))
"""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TS_MARK = "__TS__"

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from snapviz.load.trace.chrome_trace import load_chrome_trace
t1 = time.perf_counter()
tr = load_chrome_trace(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "events": tr.event_count,
                  "memory": len(tr.memory), "ops": len(tr.ops), "annotations": len(tr.annotations),
                  "python_functions": len(tr.python_functions)}))
"""


def record_small_trace(path: str) -> None:
    """A real trace: classic attention (baddbmm + softmax), SDPA, convs, stage ranges."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ w).chunk(3, dim=-1)
        scores = torch.baddbmm(
            torch.empty(q.shape[0], q.shape[1], k.shape[1]), q, k.transpose(1, 2), beta=0, alpha=0.125
        )
        return torch.bmm(scores.softmax(dim=-1), v)

    x = torch.randn(4, 256, 64)
    w = torch.randn(64, 192)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        with record_function("text_encode"):
            torch.nn.functional.gelu(torch.randn(2, 77, 64) @ torch.randn(64, 64))
        for step in range(2):
            with record_function(f"denoise/{step}"):
                h = attention(x, w)
                q = x.view(1, 4, 256, 64)
                h = h + torch.nn.functional.scaled_dot_product_attention(q, q, q).view(4, 256, 64)
                torch.nn.functional.layer_norm(h, (64,))
        with record_function("vae_decode"):
            torch.nn.functional.conv2d(torch.randn(1, 4, 32, 32), torch.randn(16, 4, 3, 3), padding=1)
    prof.export_chrome_trace(path)


def _render(ev: dict[str, Any]) -> list[str]:
    """Event as torch lays it out (2-space indented object), split around its ts."""
    ev = dict(ev)
    ev["ts"] = TS_MARK
    text = "  " + json.dumps(ev, indent=2).replace("\n", "\n  ")
    before, after = text.split(f'"{TS_MARK}"')
    return [before, after]


def cuda_side(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a CUDA run adds: launches, kernels, flows, device [memory] events."""
    out: list[dict[str, Any]] = []
    corr = 1
    for ev in events:
        if ev.get("cat") == "cpu_op":
            ts, tid, pid = ev["ts"], ev["tid"], ev["pid"]
            out.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": tid,
                    "ts": ts + 0.5,
                    "dur": 3.1,
                    "args": {"External id": corr, "cbid": 211, "correlation": corr},
                }
            )
            out.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "void at::native::elementwise_kernel<128, 4>(int, at::native::FillFunctor<float>)",
                    "pid": 0,
                    "tid": 7,
                    "ts": ts + 6.0,
                    "dur": 2.4,
                    "args": {
                        "External id": corr,
                        "queued": 0,
                        "device": 0,
                        "context": 1,
                        "stream": 7,
                        "correlation": corr,
                        "registers per thread": 16,
                        "shared memory": 0,
                        "blocks per SM": 0.5,
                        "warps per SM": 2.0,
                        "grid": [66, 1, 1],
                        "block": [128, 1, 1],
                        "est. achieved occupancy %": 3,
                    },
                }
            )
            out.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts + 0.5, "cat": "ac2g", "name": "ac2g"})
            out.append(
                {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": ts + 6.0, "cat": "ac2g", "name": "ac2g", "bp": "e"}
            )
            corr += 1
        elif ev.get("name") == "[memory]":
            cuda = json.loads(json.dumps(ev))
            cuda["args"].update(
                {
                    "Device Type": 1,
                    "Device Id": 0,
                    "Addr": 139_900_000_000_000 + abs(cuda["args"]["Addr"]) % 10**9,
                    "Total Reserved": 2 << 30,
                }
            )
            out.append(cuda)
        elif ev.get("cat") == "user_annotation":
            gpu = dict(ev, cat="gpu_user_annotation", pid=0, tid=7)
            out.append(gpu)
    return out


def synthesize(small: str, big: str, target_bytes: int) -> tuple[int, int]:
    """Repeat ``small``'s events (plus CUDA-side ones) with shifted ts up to ~target_bytes."""
    with open(small) as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    metadata = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    events += cuda_side(events)
    events.sort(key=lambda e: e["ts"])
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - t0 + 100.0
    pieces = [_render(e) for e in events]
    offsets = [e["ts"] - t0 for e in events]
    head = {k: v for k, v in doc.items() if k not in ("traceEvents", "traceName")}
    n = 0
    written = 0
    with open(big, "w") as out:
        text = json.dumps(head, indent=2)[:-2] + ',\n  "traceEvents": [\n'
        # At least one event must precede the ",\n"-led blocks below.
        metadata = metadata or [
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": t0, "args": {"name": "python"}}
        ]
        text += ",\n".join(_render(m)[0] + repr(m["ts"]) + _render(m)[1] for m in metadata)
        out.write(text)
        written += len(text)
        rep = 0
        while written < target_bytes:
            shift = t0 + rep * span
            block = "".join(
                ",\n" + b + repr(round(shift + o, 3)) + a for (b, a), o in zip(pieces, offsets, strict=True)
            )
            out.write(block)
            written += len(block)
            n += len(pieces)
            rep += 1
        tail = '\n],\n  "traceName": "synthesized.json"\n}\n'
        out.write(tail)
    return n + len(metadata), os.path.getsize(big)


BASELINE = r"""
import json, sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    doc = json.load(f)
print(json.dumps({"parse_s": time.perf_counter() - t, "events": len(doc["traceEvents"])}))
"""


def measure(child: str, path: str) -> dict[str, Any]:
    """Run ``child`` on ``path`` in a fresh process (via the launcher); its figures."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, child, path], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"parser process failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def gzip_copy(src: str, dst: str) -> None:
    import gzip
    import shutil

    with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=1) as fo:
        shutil.copyfileobj(fi, fo, 4 << 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=500.0, help="uncompressed size to synthesize (MB)")
    ap.add_argument("--formats", default="plain,gzip", help="comma list of plain, gzip (gzip level 1)")
    ap.add_argument("--repeat", type=int, default=3, help="parses per format (fresh process each)")
    ap.add_argument("--baseline", action="store_true", help="also time json.load of the plain file")
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]

    import ijson
    import pandas

    tmp = tempfile.mkdtemp(prefix="snapviz-bench-")
    small = os.path.join(tmp, "small.json")
    plain = os.path.join(tmp, "big.json")
    rows: list[str] = []
    worst_rss = 0.0
    try:
        t = time.perf_counter()
        record_small_trace(small)
        events, size = synthesize(small, plain, int(args.mb * 1e6))
        print(f"synthesized {size / 1e6:.0f} MB, {events:,} events in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        for fmt in formats:
            path = plain
            if fmt == "gzip":
                path = plain + ".gz"
                gzip_copy(plain, path)
            runs = [measure(CHILD, path) for _ in range(args.repeat)]
            parse = sorted(r["parse_s"] for r in runs)
            med = parse[len(parse) // 2]
            wall = sorted(r["wall_s"] for r in runs)[len(runs) // 2]
            rss = max(r["peak_rss_kib"] for r in runs) / 1024
            cpu = sorted(r["cpu_s"] for r in runs)[len(runs) // 2]
            worst_rss = max(worst_rss, rss)
            res = runs[0]
            rows.append(
                f"| {args.mb:.0f} MB JSON, {fmt} ({os.path.getsize(path) / 1e6:.0f} MB file) | {res['events']:,} "
                f"| {med:.1f} s ({parse[0]:.1f}–{parse[-1]:.1f}) | {wall:.1f} s | {cpu:.1f} s | {res['events'] / med:,.0f} "
                f"| {args.mb / med:.0f} | {rss:,.0f} MiB |"
            )
            print(rows[-1], file=sys.stderr)
            if path != plain:
                os.remove(path)
        if args.baseline:
            b = measure(BASELINE, plain)
            rows.append(
                f"| `json.load` baseline, plain | {b['events']:,} | {b['parse_s']:.1f} s | {b['wall_s']:.1f} s | {b['cpu_s']:.1f} s "
                f"| {b['events'] / b['parse_s']:,.0f} | {args.mb / b['parse_s']:.0f} | {b['peak_rss_kib'] / 1024:,.0f} MiB |"
            )
    finally:
        for p in (small, plain, plain + ".gz"):
            if os.path.exists(p):
                os.remove(p)
        os.rmdir(tmp)

    print()
    print(f"### Chrome trace loading ({time.strftime('%Y-%m-%d')})")
    print()
    print(
        f"`python benchmarks/bench_trace.py --mb {args.mb:.0f}`: a real CPU torch.profiler trace (profile_memory, "
        "record_shapes, with_stack) repeated with shifted ts, plus kernel / cuda_runtime / flow / CUDA [memory] "
        "events, in torch's indented layout; parsed by `load_chrome_trace` in a fresh process."
    )
    print()
    print(
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
        f"pandas {pandas.__version__}, ijson {ijson.__version__} (backend `{ijson.backend}`). "
        f"Parse time: median of {args.repeat} (min–max)."
    )
    print()
    print("| trace | events | parse | whole process | process CPU | events/s | MB/s | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print(
        f"Kept per run: {res['memory']:,} memory, {res['ops']:,} cpu_op, {res['python_functions']:,} python_function, "
        f"{res['annotations']:,} user_annotation rows. Target: peak RSS < 2 GiB "
        f"({'met' if worst_rss < 2048 else 'MISSED'})."
    )
    return 0 if worst_rss < 2048 else 1


if __name__ == "__main__":
    sys.exit(main())
