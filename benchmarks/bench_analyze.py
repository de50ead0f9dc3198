#!/usr/bin/env python3
"""How much does ``snapviz analyze`` cost next to merely unpickling the snapshot?

Builds a ~1,000,000-event snapshot from a base snapshot by repeating its trace: every
repetition is shifted to its own address range (segment events included, so the replay
stays an exact allocator history) and later in time. The base is the largest
``sample_snapshots/*/snapshot.pickle.xz`` if there is one, else a synthetic diffusion-like
run from ``tests/support/synth.py`` that ends with everything freed and ``empty_cache()`` (so
each repetition is one more pipeline call and the peak is known exactly).

Then, each in its own process (peak RSS per process from ``os.wait4``):

  (a) ``snapviz.load.snapshot.safe_pickle.safe_load_pickle(FILE)``: the restricted ``pickle.load``
      with the interpreter's defaults, the floor any tool that reads the pickle pays
      (snapviz's own loader pauses the cyclic GC, see ``snapviz.load.paused_gc``; the
      in-process line below shows that figure too);
  (b) ``snapviz analyze FILE -o OUT.html --json OUT.json -q``.

Targets: analyze wall time <= 3x the load, peak RSS <= 2x, HTML <= 5 MB. ``--check``
exits 1 when one is missed.

    python benchmarks/bench_analyze.py [--events 1000000] [--base PATH] [--check]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_TIME_RATIO = 3.0
TARGET_RSS_RATIO = 2.0
TARGET_HTML_BYTES = 5 * 1000 * 1000

# ---------------------------------------------------------------------------- base snapshot


def _largest_sample() -> str | None:
    found = glob.glob(str(ROOT / "sample_snapshots" / "*" / "snapshot.pickle.xz"))
    return max(found, key=os.path.getsize) if found else None


def _synthetic_base(n_ops: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    import synth  # noqa: PLC0415 - test helper, only needed here

    sim = synth.random_workload(seed, n_ops, streams=2, delayed_frees=True)
    sim.free_all()  # the pipeline call ends: every tensor freed ...
    sim.empty_cache()  # ... and the cache emptied, so repetitions are independent calls
    truth = {"peak_allocated": sim.peak_allocated(0), "peak_reserved": sim.peak_reserved(0)}
    return sim.snapshot(marker=False), truth


def load_base(path: str | None, n_ops: int, seed: int) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    path = path or _largest_sample()
    if path:
        sys.path.insert(0, str(ROOT))
        from snapviz.load.snapshot.safe_pickle import safe_load_pickle  # noqa: PLC0415

        data = safe_load_pickle(path)
        if isinstance(data, list):
            raise SystemExit(f"{path}: a list of segments has no trace to repeat")
        return data, path, None
    data, truth = _synthetic_base(n_ops, seed)
    return data, f"synthetic (tests/support/synth.py, {n_ops} ops)", truth


# ---------------------------------------------------------------------------- repetition


def _span(values: list[int]) -> tuple[int, int]:
    return (min(values), max(values)) if values else (0, 0)


def repeat_snapshot(base: dict[str, Any], target_events: int) -> tuple[dict[str, Any], int]:
    """``base`` repeated until about ``target_events`` entries; returns (snapshot, repetitions)."""
    traces: list[list[dict[str, Any]]] = base.get("device_traces") or []
    n_base = sum(len(t) for t in traces)
    if n_base == 0:
        raise SystemExit("the base snapshot has no trace entries")
    reps = max(1, round(target_events / n_base))
    segs = base.get("segments") or []
    # one address window per repetition, larger than everything the base touches
    touched = [a for t in traces for e in t if "addr" in e for a in (e["addr"], e["addr"] + e.get("size", 0))]
    touched += [a for s in segs for a in (s["address"], s["address"] + s["total_size"])]
    lo, hi = _span(touched)
    window = 1 << max(30, (hi - lo + (1 << 30)).bit_length())  # power of two, >= 1 GiB slack
    if (hi + reps * window) >= (1 << 63):
        raise SystemExit("address windows would overflow int64; use fewer events")
    times = [e["time_us"] for t in traces for e in t if "time_us" in e]
    t_lo, t_hi = _span(times)
    t_step = (t_hi - t_lo) + 1_000

    out_traces: list[list[dict[str, Any]]] = []
    for t in traces:
        rows: list[dict[str, Any]] = []
        for k in range(reps):
            da, dt = k * window, k * t_step
            lists: dict[int, Any] = {}  # one new frame list per list of the base, shared as the base shares it
            for e in t:
                e2 = dict(e)
                fr = e.get("frames")
                if type(fr) is list:
                    # torch writes a list object per entry (the frame dicts in it are shared):
                    # a repetition must not share the base's lists, or the model build looks
                    # ~20x cheaper than on a real file of this size.
                    e2["frames"] = lists.get(id(fr)) or lists.setdefault(id(fr), list(fr))
                if "addr" in e2 and e2.get("action") != "snapshot":
                    e2["addr"] = e2["addr"] + da
                if "time_us" in e2:
                    e2["time_us"] = e2["time_us"] + dt
                rows.append(e2)
        out_traces.append(rows)
    out_segs = []
    for k in range(reps):
        da = k * window
        for s in segs:
            s2 = dict(s)
            s2["address"] = s["address"] + da
            s2["blocks"] = [
                dict(b, address=b["address"] + da) if "address" in b else dict(b) for b in s.get("blocks", [])
            ]
            out_segs.append(s2)
    ann = []
    for k in range(reps):
        for a in base.get("external_annotations") or []:
            a2 = dict(a)
            if "time_us" in a2:
                a2["time_us"] = a2["time_us"] + k * t_step
            ann.append(a2)
    out = dict(base)
    out["device_traces"] = out_traces
    out["segments"] = out_segs
    out["external_annotations"] = ann
    return out, reps


# ---------------------------------------------------------------------------- measuring


def _child_load(path: str, paused: bool = False) -> None:
    sys.path.insert(0, str(ROOT))
    from snapviz.load import paused_gc  # noqa: PLC0415
    from snapviz.load.snapshot.safe_pickle import safe_load_pickle  # noqa: PLC0415 (imports snapviz: numpy, pandas)

    if paused:
        gc_ctx = paused_gc()
        gc_ctx.__enter__()
    t0 = time.perf_counter()
    data = safe_load_pickle(path)
    t1 = time.perf_counter()
    n = sum(len(t) for t in data.get("device_traces", [])) if isinstance(data, dict) else 0
    print(json.dumps({"load_s": t1 - t0, "events": n}))


def _spawn_reaped(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Popen without communicate(): stream output to temp files, reap with wait4 for exact rusage."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=str(ROOT))
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
    rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"cmd": cmd, "rc": p.returncode, "wall_s": wall, "rss": rss, "stdout": out, "stderr": err}


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="trace entries to build (about)")
    ap.add_argument(
        "--base", help="base snapshot (default: largest sample_snapshots/*/snapshot.pickle.xz, else synthetic)"
    )
    ap.add_argument("--synthetic-ops", type=int, default=6000, help="ops of the synthetic base workload")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="directory to keep the built snapshot and outputs in (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the best wall time counts")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--child-load", help=argparse.SUPPRESS)
    ap.add_argument("--child-load-paused", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_load:
        _child_load(args.child_load)
        return 0
    if args.child_load_paused:
        _child_load(args.child_load_paused, paused=True)
        return 0

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="snapviz-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base, base_name, truth = load_base(args.base, args.synthetic_ops, args.seed)
    big, reps = repeat_snapshot(base, args.events)
    n_events = sum(len(t) for t in big["device_traces"])
    snap_path = work / "bench_snapshot.pickle"
    with open(snap_path, "wb") as f:
        pickle.dump(big, f, protocol=4)  # what _dump_snapshot writes on Python <= 3.13
    del big, base
    build_s = time.perf_counter() - t0
    print(
        f"built {snap_path} from {base_name}: {reps} repetitions, {n_events:,} events, "
        f"{fmt_bytes(snap_path.stat().st_size)} in {build_s:.1f} s",
        file=sys.stderr,
    )

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    html, js = work / "bench_report.html", work / "bench_summary.json"
    loads, analyses = [], []
    for _ in range(max(1, args.repeat)):
        loads.append(
            _spawn_reaped([sys.executable, str(Path(__file__).resolve()), "--child-load", str(snap_path)], env)
        )
        analyses.append(
            _spawn_reaped(
                [sys.executable, "-m", "snapviz", "analyze", str(snap_path), "-o", str(html), "--json", str(js), "-q"],
                env,
            )
        )
    for r in loads + analyses:
        if r["rc"] != 0:
            print(f"command failed (rc {r['rc']}): {' '.join(r['cmd'])}\n{r['stderr'][-3000:]}", file=sys.stderr)
            return 2
    load = min(loads, key=lambda r: r["wall_s"])
    ana = min(analyses, key=lambda r: r["wall_s"])
    load_inproc = json.loads(load["stdout"].strip().splitlines()[-1])["load_s"]
    paused = _spawn_reaped([sys.executable, str(Path(__file__).resolve()), "--child-load-paused", str(snap_path)], env)
    paused_inproc = (
        json.loads(paused["stdout"].strip().splitlines()[-1])["load_s"] if paused["rc"] == 0 else float("nan")
    )
    html_bytes = html.stat().st_size if html.exists() else -1
    summary = json.loads(js.read_text()) if js.exists() else {}

    t_ratio = ana["wall_s"] / load["wall_s"]
    r_ratio = ana["rss"] / load["rss"]
    ok_t, ok_r, ok_h = t_ratio <= TARGET_TIME_RATIO, r_ratio <= TARGET_RSS_RATIO, 0 <= html_bytes <= TARGET_HTML_BYTES
    mark = {True: "ok", False: "**MISSED**"}
    print(
        f"\n### snapviz analyze vs. bare load: {n_events:,} events "
        f"({fmt_bytes(snap_path.stat().st_size)} pickle; base: {base_name}, x{reps})\n"
    )
    print("| measure | load (safe_load_pickle) | analyze (-o html --json) | ratio | target | |")
    print("|---|---:|---:|---:|---:|---|")
    print(
        f"| wall time (process) | {load['wall_s']:.2f} s | {ana['wall_s']:.2f} s | {t_ratio:.2f}x | "
        f"<= {TARGET_TIME_RATIO:g}x | {mark[ok_t]} |"
    )
    print(
        f"| peak RSS | {fmt_bytes(load['rss'])} | {fmt_bytes(ana['rss'])} | {r_ratio:.2f}x | "
        f"<= {TARGET_RSS_RATIO:g}x | {mark[ok_r]} |"
    )
    print(f"| HTML size | | {fmt_bytes(html_bytes)} | | <= {TARGET_HTML_BYTES / 1e6:g} MB | {mark[ok_h]} |")
    print(
        f"\nunpickling alone (in process, after imports): {load_inproc:.2f} s with the GC on, "
        f"{paused_inproc:.2f} s with it paused as snapviz does; build: {build_s:.1f} s; "
        f"best of {max(1, args.repeat)} run(s) each."
    )
    peak = (summary.get("peak") or {}).get("allocated_bytes")
    if truth is not None and peak is not None:
        same = "matches" if peak == truth["peak_allocated"] else f"DIFFERS from {truth['peak_allocated']:,}"
        print(f"reported peak allocated {peak:,} B {same} the synthetic ground truth.")
    if not args.keep:
        for p in (snap_path, html, js):
            p.unlink(missing_ok=True)
        try:
            work.rmdir()
        except OSError:
            pass
    if args.check and not (ok_t and ok_r and ok_h):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
