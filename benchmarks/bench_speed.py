#!/usr/bin/env python3
"""Where ``snapviz analyze`` spends its time, next to the floors measured in the same run.

    python benchmarks/bench_speed.py [--events 1000000] [--source SAMPLE ...] [--trace-mb 500]
                                     [--repeat 1] [--keep DIR] [--no-html] [--results FILE]

For every ``--source`` (a sample name under ``sample_snapshots/`` or a snapshot path; default:
the PixArt and SDXL fp16 samples, whose ratios differ) it builds a ``--events``-entry snapshot
by repeating the sample's trace in shifted address windows (``bench_analyze.repeat_snapshot``:
still an exact allocator history), pickled with protocol 4 as ``_dump_snapshot`` writes it.
Then, each in a fresh process (wall time and peak RSS of that process alone, read by a small
launcher from ``RUSAGE_CHILDREN``, so the large parent never inflates a child's figure):

* floors: the restricted unpickle (a ``pickle.Unpickler`` refusing every global: what any tool
  that reads the pickle without running its code pays; the process ends without the
  interpreter's teardown, as ``snapviz`` does) with the GC on and with it paused, and
  snapviz's own ``safe_load_pickle`` (its opcode safety scan, then the same unpickle) beside them;
* phases in one process, as ``load_snapshot`` runs them: import, the safety scan, the pickle
  machine's tape (big files), the rest of the load (reading the file and the model from the
  tape, or unpickling where the tape does not apply), replay, stages (the rest of
  ``analyze_run``), JSON document, HTML render;
* the CLI: ``analyze FILE --json``, ``analyze FILE -o report.html --json`` and ``--help``.

``--trace-mb N`` also builds an N MB Chrome trace from the bundled profiler trace(s) and
measures ``load_chrome_trace`` (MB/s of raw JSON, peak RSS) beside ``gzip -d`` of the same
trace and an in-memory ``orjson.loads``/``json.loads`` parse (only when it fits in free RAM).

Every measured process is also appended as one JSON line to ``--results`` (default
``benchmarks/results/bench_speed.jsonl``) with the commit, the date and the machine, so runs
of different commits can be compared: ``python benchmarks/compare_results.py COMMIT_A COMMIT_B``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import fmt_bytes, load_base, repeat_snapshot  # noqa: E402

GC_ON_MAX_EVENTS = 3_000_000
DEFAULT_SOURCES = ("pixart-staged-int8-nf4", "sdxl-fp16")
LAUNCHER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "wall_s": wall, "rss": ru.ru_maxrss * 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "stdout": p.stdout[-20000:], "stderr": p.stderr[-3000:]}))
"""
FLOOR_CHILD = r"""
import gc, json, os, pickle, sys, time
t0 = time.process_time()
mode = sys.argv[2]
if mode == "safe":  # snapviz's own load: the opcode safety scan, then the same restricted unpickle
    from snapviz.load.snapshot.safe_pickle import safe_load_pickle
else:  # the floor: any tool that reads the pickle without running its code pays this
    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"global {module}.{name} refused")
t1 = time.process_time()
if mode != "on":
    gc.disable()
if mode == "safe":
    data = safe_load_pickle(sys.argv[1])
else:
    with open(sys.argv[1], "rb") as f:
        data = Restricted(f).load()
t2 = time.process_time()
print(json.dumps({"import_s": t1 - t0, "unpickle_s": t2 - t1}), flush=True)
# The interpreter's normal exit (freeing every object), as `snapviz` itself ends.
"""
TRACE_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from snapviz.load.trace import decode as trace_decode
from snapviz.load.trace.chrome_trace import load_chrome_trace
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "dicts":  # the reference: every batch as dicts, as without msgspec
    trace_decode._DECODER = None
t1 = time.perf_counter()
tr = load_chrome_trace(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "events": tr.event_count, "memory": len(tr.memory),
                  "ops": len(tr.ops), "python_functions": len(tr.python_functions)}), flush=True)
"""
JSON_FLOOR_CHILD = r"""
import json, sys, time
try:
    import orjson
    loads, name = orjson.loads, "orjson"
except ImportError:
    loads, name = json.loads, "json"
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    raw = f.read()
t1 = time.perf_counter()
doc = loads(raw)
t2 = time.perf_counter()
print(json.dumps({"read_s": t1 - t0, "parse_s": t2 - t1, "parser": name, "events": len(doc["traceEvents"])}))
"""


def _timed(fn: Any, spent: list[float]) -> Any:
    """``fn``, adding the CPU seconds of every call to ``spent[0]`` (a phase inside another)."""

    def timed(*a: Any, **k: Any) -> Any:
        t_ = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            spent[0] += time.process_time() - t_

    return timed


def _child_phases(path: str, html: bool) -> None:
    """One process, the CLI's steps in order, each timed in CPU seconds (the scan and the tape
    timed inside the load, the replay inside analyze_run). ``read+model``: the rest of the load
    (reading the file, the model from the tape, or unpickling where the tape does not apply)."""
    t0 = time.process_time()
    from snapviz.analyses import summary  # noqa: PLC0415 - importing is what is measured
    from snapviz.load import Run, load_snapshot  # noqa: PLC0415
    from snapviz.load.snapshot import columnar, safe_pickle  # noqa: PLC0415
    from snapviz.render.json_summary import render_json  # noqa: PLC0415
    from snapviz.safe_text import bounded_doc  # noqa: PLC0415

    ph: dict[str, float] = {"import": time.process_time() - t0}
    scan_spent: list[float] = [0.0]
    tape_spent: list[float] = [0.0]
    safe_pickle.scan_pickle = _timed(safe_pickle.scan_pickle, scan_spent)  # type: ignore[assignment]
    columnar.run_tape = _timed(columnar.run_tape, tape_spent)  # type: ignore[assignment]
    t = time.process_time()
    snap = load_snapshot(path)
    ph["scan"] = scan_spent[0]
    ph["tape"] = tape_spent[0]
    ph["read+model"] = time.process_time() - t - scan_spent[0] - tape_spent[0]
    spent: list[float] = [0.0]
    summary.replay_allocator = _timed(summary.replay_allocator, spent)  # type: ignore[assignment]
    t = time.process_time()
    an = summary.analyze_run(Run(source=path, label=os.path.basename(path), snapshot=snap, trace=None, run_json=None))
    ph["replay"] = spent[0]
    ph["stages"] = time.process_time() - t - spent[0]
    t = time.process_time()
    doc = an.summary()
    render_json(bounded_doc(doc))
    ph["json"] = time.process_time() - t
    if html:
        from snapviz.analyses.document import from_json  # noqa: PLC0415

        document = from_json(doc)  # the typed document the renderers take (built once by the CLI)
        t = time.process_time()
        from snapviz.render.html import render_html  # noqa: PLC0415 - Bokeh is imported only for HTML

        render_html(an, document)
        ph["html"] = time.process_time() - t
    print(json.dumps(ph))


def _launch(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True, env=env, cwd=str(ROOT))
    res = json.loads(out.stdout)
    if res["rc"] != 0:
        raise SystemExit(f"failed (rc {res['rc']}): {' '.join(cmd)}\n{res['stderr']}")
    return res


def _best(cmd: list[str], env: dict[str, str], repeat: int) -> dict[str, Any]:
    return min((_launch(cmd, env) for _ in range(max(1, repeat))), key=lambda r: r["wall_s"])


RESULTS: list[dict[str, Any]] = []  # every measured process of this run (see --results)


def _record(bench: str, case: str, r: dict[str, Any], floor: dict[str, Any] | None = None, **extra: Any) -> None:
    row = {
        "bench": bench,
        "case": case,
        "wall_s": round(r["wall_s"], 4),
        "cpu_s": round(r["cpu_s"], 4),
        "rss": r["rss"],
    }
    if floor is not None:
        row.update(
            cpu_x=round(r["cpu_s"] / floor["cpu_s"], 4),
            wall_x=round(r["wall_s"] / floor["wall_s"], 4),
            rss_x=round(r["rss"] / floor["rss"], 4),
        )
    RESULTS.append({**row, **extra})


def _row(name: str, r: dict[str, Any], floor: dict[str, Any]) -> str:
    return (
        f"| {name} | {r['wall_s']:.2f} s | {r['wall_s'] / floor['wall_s']:.2f}x | {r['cpu_s']:.2f} s | "
        f"{r['cpu_s'] / floor['cpu_s']:.2f}x | {fmt_bytes(r['rss'])} | {r['rss'] / floor['rss']:.2f}x |"
    )


def bench_snapshot(source: str, args: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
    sample = ROOT / "sample_snapshots" / source / "snapshot.pickle.xz"
    stem = f"speed_{Path(source).name.split('.')[0]}_{args.events}"
    path, info = work / f"{stem}.pickle", work / f"{stem}.json"
    if args.keep and path.exists() and info.exists():  # built by an earlier run with --keep
        n_events, reps, base_name = json.loads(info.read_text())
    else:
        base, base_name, _ = load_base(str(sample if sample.exists() else source), 0, 0)
        big, reps = repeat_snapshot(base, args.events)
        n_events = sum(len(t) for t in big["device_traces"])
        with open(path, "wb") as f:
            pickle.dump(big, f, protocol=4)
        del big, base
        info.write_text(json.dumps([n_events, reps, base_name]))
    py, me = sys.executable, str(Path(__file__).resolve())
    # With the GC on, unpickling 10M events spends minutes in collections that find nothing
    # (each full pass walks every object so far): measured up to GC_ON_MAX_EVENTS only.
    on = _best([py, "-c", FLOOR_CHILD, str(path), "on"], env, args.repeat) if n_events <= GC_ON_MAX_EVENTS else None
    paused = _best([py, "-c", FLOOR_CHILD, str(path), "paused"], env, args.repeat)
    safe = _best([py, "-c", FLOOR_CHILD, str(path), "safe"], env, args.repeat)
    phases = _best([py, me, "--child-phases", str(path)] + (["--no-html"] if args.no_html else []), env, args.repeat)
    js = work / "speed.json"
    ana_json = _best([py, "-m", "snapviz", "analyze", str(path), "--json", str(js), "-q"], env, args.repeat)
    rows = [("analyze --json", ana_json)]
    if not args.no_html:
        rows.append(
            (
                "analyze -o html --json",
                _best(
                    [
                        py,
                        "-m",
                        "snapviz",
                        "analyze",
                        str(path),
                        "-o",
                        str(work / "speed.html"),
                        "--json",
                        str(js),
                        "-q",
                    ],
                    env,
                    args.repeat,
                ),
            )
        )
    p_on = json.loads(on["stdout"]) if on else {"unpickle_s": float("nan")}
    p_paused = json.loads(paused["stdout"])
    ph = json.loads(phases["stdout"].strip().splitlines()[-1])
    print(f"\n### {n_events:,} events ({fmt_bytes(path.stat().st_size)} pickle; base {base_name}, x{reps})\n")
    print("| process | wall | vs floor | CPU | vs floor | peak RSS | vs floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    bench = f"snapshot {base_name} {n_events}"
    measured = [("floor: restricted unpickle, GC paused", paused)] + (
        [("floor: restricted unpickle, GC on", on)] if on else []
    )
    measured += [
        ("snapviz safe load (opcode scan + unpickle, GC paused)", safe),
        *rows,
        ("phases (one process, below)", phases),
    ]
    for name, r in measured:
        print(_row(name, r, paused))
        _record(bench, name, r, paused)
    print(
        "\nfloor: the GC-paused restricted unpickle process. CPU (user + sys) is the figure to trust on a busy machine."
    )
    p_safe = json.loads(safe["stdout"])
    print(
        "in process (CPU s): unpickle "
        + f"{p_paused['unpickle_s']:.2f} s paused / {p_on['unpickle_s']:.2f} s GC on / "
        + f"{p_safe['unpickle_s']:.2f} s safe load; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items())
        + f"; sum {sum(ph.values()):.2f} s"
    )
    for p in (path, info, js, work / "speed.html"):
        if not args.keep:
            p.unlink(missing_ok=True)


def build_trace(mb: int, sources: list[str], path: Path) -> int:
    """Repeat the sources' events with shifted ``ts`` until the file holds ``mb`` MB of JSON."""
    events: list[dict[str, Any]] = []
    head: dict[str, Any] = {}
    for s in sources:
        with gzip.open(s) if s.endswith(".gz") else open(s, "rb") as f:
            doc = json.load(f)
        events += doc["traceEvents"]
        head = head or {k: v for k, v in doc.items() if k != "traceEvents"}
    lines = [json.dumps(e) for e in events]
    span = max((e.get("ts", 0) for e in events if isinstance(e.get("ts"), (int, float))), default=0) + 1000
    base_ts = [e.get("ts") for e in events]
    target, written, reps = mb * 1_000_000, 0, 0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1,\n"traceEvents": [\n')
        while written < target:
            shift = reps * span
            for line, e, ts in zip(lines, events, base_ts, strict=True):
                if isinstance(ts, (int, float)) and reps:
                    e["ts"] = ts + shift
                    line = json.dumps(e)
                f.write(("" if written == 0 else ",\n") + line)
                written += len(line) + 2
            reps += 1
        tail = json.dumps({k: v for k, v in head.items() if k != "schemaVersion"})[1:]
        f.write("\n],\n" + tail + "\n")
    return reps


def bench_trace(args: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
    sources = args.trace_source or [str(p) for p in sorted(ROOT.glob("sample_snapshots/*/trace.json.gz"))]
    plain = work / "speed_trace.json"
    gz = work / "speed_trace.json.gz"
    info = work / f"speed_trace.{args.trace_mb}mb.json"
    if args.keep and plain.exists() and gz.exists() and info.exists():  # built by an earlier run with --keep
        reps = json.loads(info.read_text())
    else:
        reps = build_trace(args.trace_mb, sources, plain)
        with open(plain, "rb") as fi, gzip.open(gz, "wb", compresslevel=1) as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
        info.write_text(json.dumps(reps))
    size = plain.stat().st_size
    py = sys.executable
    res = [
        (
            "load_chrome_trace, plain (msgspec typed decode)",
            _best([py, "-c", TRACE_CHILD, str(plain)], env, args.repeat),
        ),
        ("load_chrome_trace, gzip", _best([py, "-c", TRACE_CHILD, str(gz)], env, args.repeat)),
        (
            "load_chrome_trace, plain, dicts (no msgspec)",
            _best([py, "-c", TRACE_CHILD, str(plain), "dicts"], env, args.repeat),
        ),
        ("floor: gzip -d > /dev/null", _best(["sh", "-c", f"gzip -dc '{gz}' > /dev/null"], env, args.repeat)),
        ("floor: cat > /dev/null", _best(["sh", "-c", f"cat '{plain}' > /dev/null"], env, args.repeat)),
    ]
    try:
        import psutil  # noqa: PLC0415 - optional: decides whether an in-memory parse fits

        fits = psutil.virtual_memory().available > 12 * size
    except ImportError:
        fits = False
    if fits:
        res.append(
            ("floor: read + orjson/json.loads in memory", _best([py, "-c", JSON_FLOOR_CHILD, str(plain)], env, 1))
        )
    print(
        f"\n### Chrome trace: {fmt_bytes(size)} JSON ({reps} repetitions of {len(sources)} trace(s)), "
        f"gzip {fmt_bytes(gz.stat().st_size)}\n"
    )
    print("| process | wall | CPU | MB/s of CPU (raw JSON) | peak RSS | in process |")
    print("|---|---:|---:|---:|---:|---|")
    for name, r in res:
        _record(f"trace {args.trace_mb} MB", name, r, mb_per_cpu_s=round(size / 1e6 / r["cpu_s"], 2))
        inner = r["stdout"].strip().splitlines()[-1] if r["stdout"].strip() else ""
        print(
            f"| {name} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | {size / 1e6 / r['cpu_s']:,.0f} | "
            f"{fmt_bytes(r['rss'])} | {inner} |"
        )
    for p in (plain, gz, info):
        if not args.keep:
            p.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="trace entries per built snapshot (about)")
    ap.add_argument("--source", action="append", help="sample name or snapshot path to repeat (repeatable)")
    ap.add_argument("--trace-mb", type=int, default=0, help="also build and parse a trace of this many MB")
    ap.add_argument("--trace-source", action="append", help="Chrome trace(s) to repeat (default: bundled samples)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each process; the fastest counts")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML report")
    ap.add_argument("--keep", help="directory to build files in and keep them (a file built there before is reused)")
    ap.add_argument(
        "--results",
        default=str(ROOT / "benchmarks" / "results" / "bench_speed.jsonl"),
        help="append every measured process here as a JSON line ('' : do not)",
    )
    ap.add_argument("--commit", help="the commit to record (default: this checkout's HEAD)")
    ap.add_argument("--child-phases", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_phases:
        _child_phases(args.child_phases, html=not args.no_html)
        return 0
    work = Path(args.keep or tempfile.mkdtemp(prefix="snapviz-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # As on a user's machine, imported modules are compiled once and their bytecode reused
    # (a development shell may turn that off; then every run would compile snapviz's own
    # ~60-90 modules again, 0.2-0.35 s of CPU). The start-up runs below write the caches.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    py = sys.executable
    warm = [py, "-m", "snapviz", "analyze", str(ROOT / "sample_snapshots" / "sd15-fp16-classic")]
    _launch(warm + ["-o", str(work / "warm.html"), "--json", "-"], env)  # bytecode of every module used
    helps = {
        name: min((_launch(cmd, env) for _ in range(max(3, args.repeat))), key=lambda r: r["cpu_s"])
        for name, cmd in (
            ("python -c pass", [py, "-c", "pass"]),
            ("snapviz --help", [py, "-m", "snapviz", "--help"]),
            ("import snapviz.analyses.summary", [py, "-c", "import snapviz.analyses.summary"]),
        )
    }
    print("| startup | wall | CPU | peak RSS |\n|---|---:|---:|---:|")
    for name, r in helps.items():
        print(f"| {name} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | {fmt_bytes(r['rss'])} |")
    if args.events > 0:
        for src in args.source or DEFAULT_SOURCES:
            bench_snapshot(src, args, work, env)
    if args.trace_mb > 0:
        bench_trace(args, work, env)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if args.results:
        write_results(Path(args.results), [f"--events {args.events}", f"--trace-mb {args.trace_mb}"], args.commit)
    return 0


def write_results(path: Path, how: list[str], commit: str | None = None) -> None:
    """Append this run's rows, each with the commit (``+dirty`` with uncommitted changes), date,
    machine and the installed compiled packages, to ``path`` (JSON lines)."""
    import platform  # noqa: PLC0415
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    if not commit:
        commit = git("rev-parse", "--short=12", "HEAD") + (
            "+dirty" if git("status", "--porcelain", "--", "snapviz") else ""
        )
    packages = {}
    for name in ("numba", "msgspec", "orjson", "bokeh", "pandas", "numpy"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    common = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": " ".join(how),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "packages": packages,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in RESULTS:
            f.write(json.dumps({**common, **row}) + "\n")
    print(f"\n{len(RESULTS)} results appended to {path} (commit {commit})")


if __name__ == "__main__":
    sys.exit(main())
