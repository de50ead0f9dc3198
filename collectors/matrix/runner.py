"""Running the matrix: every variant in its own ``python -m collectors`` process.

Its peaks then start from an empty caching allocator and no earlier variant's cached blocks or
cuDNN workspaces leak into them. ``--jobs N`` runs N variants at once, one GPU each
(``CUDA_VISIBLE_DEVICES``). :func:`results_from_dir` reads a finished matrix back instead.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapviz.safe_text import clip

from .ranking import measure
from .variants import DEFAULT_BASELINE, MatrixError, Variant, dispatch_order, run_dir_name


@dataclass
class MatrixOptions:
    pipeline: str
    size: str = "tiny"
    device: str = "cpu"  # resolved: "cuda" or "cpu"
    steps: int = 4
    height: int | None = None
    width: int | None = None
    batch: int = 1
    history: bool = True
    profile: bool = False
    memory_limit_gb: float | None = None
    seed: int = 0
    jobs: int = 1
    timeout_s: float | None = None
    out: Path = Path("runs/matrix")

    def collect_args(self, v: Variant, run_dir: Path) -> list[str]:
        args = [
            "--pipeline",
            self.pipeline,
            "--size",
            self.size,
            "--device",
            self.device,
            "--steps",
            str(self.steps),
            "--batch",
            str(self.batch),
            "--seed",
            str(self.seed),
        ]
        if self.height:
            args += ["--height", str(self.height)]
        if self.width:
            args += ["--width", str(self.width)]
        for t in v.techniques:
            args += ["--technique", t]
        if not self.history:
            args.append("--no-history")
            if self.device != "cpu" and not self.profile:
                # run.json's allocator peaks are the measurement; a profiler would slow the steps
                # it times and write gigabytes of trace at full size
                args.append("--no-profile")
        args.append("--sync-stages")  # the table reports per-step wall times
        if self.profile:
            args += ["--profile", "--profile-scope", "after-load"]
        if self.memory_limit_gb:
            args += ["--memory-limit-gb", f"{self.memory_limit_gb:g}"]
        return args + ["--out", str(run_dir)]


@dataclass
class VariantResult:
    variant: Variant
    status: str  # ok | oom | unsupported | failed | timeout
    reason: str | None
    run_dir: Path
    log: Path
    returncode: int | None
    elapsed_s: float
    gpu: str | None
    run: dict[str, Any] | None = None
    measure: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.measure is not None


def _env(opts: MatrixOptions, gpu: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parents[2])  # the checkout holding collectors/
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if "OMP_NUM_THREADS" not in os.environ:
        # concurrent variants share the host: split its cores instead of oversubscribing them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, opts.jobs)))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


_ERROR_PREFIX = "snapviz: error: "
_HELP_HINT = re.compile(r" \(see '[^']*--help'\)$")


def _last_error_line(log: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        # the collector's one error line (snapviz.cli.errors), without the pointer to its --help
        if ln.startswith(_ERROR_PREFIX):
            return _HELP_HINT.sub("", ln[len(_ERROR_PREFIX) :])
    for ln in reversed(lines):
        if not ln.startswith(("denoise", "[transformers]", "There are modules")):
            return clip(ln, 300)
    return None


def classify(
    rc: int | None, timed_out: bool, run_dir: Path, log: Path, timeout_s: float | None = None
) -> tuple[str, str | None, dict[str, Any] | None]:
    """(status, reason, run.json) of one finished collector process."""
    info: dict[str, Any] | None = None
    rj = run_dir / "run.json"
    if rj.is_file():
        try:
            info = json.loads(rj.read_text())
        except ValueError:
            info = None
    if timed_out:
        return "timeout", f"killed after {timeout_s:g} s (--timeout)", info
    if info is not None and info.get("status") == "oom":
        stage = (info.get("oom") or {}).get("stage")
        return "oom", "CUDA out of memory" + (f" in {stage}" if stage else ""), info
    if rc == 0 and info is not None and info.get("status") == "ok":
        return "ok", None, info
    if rc == 2:
        return "unsupported", _last_error_line(log) or "the collector refused the options", info
    if rc is not None and rc < 0:
        return "failed", f"killed by signal {-rc} (host out of memory?)", info
    if info is not None and info.get("error"):
        return "failed", clip(str(info["error"]).splitlines()[0], 300), info
    if rc == 0:
        return "failed", "the collector exited 0 without a complete run.json", info
    return "failed", _last_error_line(log) or f"exit status {rc}", info


class _Runner:
    """Run variants on ``len(slots)`` workers; each worker owns one GPU (or none on CPU)."""

    def __init__(
        self, opts: MatrixOptions, slots: list[str | None], on_done: Callable[[int, int, VariantResult], None]
    ) -> None:
        self.opts, self.slots, self.on_done = opts, slots, on_done
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def run_one(self, v: Variant, gpu: str | None) -> VariantResult:
        run_dir = self.opts.out / run_dir_name(v.label)
        log = self.opts.out / f"{run_dir_name(v.label)}.log"
        cmd = [sys.executable, "-m", "collectors", *self.opts.collect_args(v, run_dir)]
        t0 = time.perf_counter()
        timed_out = False
        with open(log, "wb") as fh:
            fh.write(("$ " + " ".join(cmd) + "\n").encode())
            fh.flush()
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(self.opts, gpu)
            )
            with self._lock:
                self._procs.add(proc)
                if self._stop.is_set():  # interrupted while this one was starting
                    proc.kill()
            try:
                rc: int | None = proc.wait(timeout=self.opts.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                rc = proc.wait()
            finally:
                with self._lock:
                    self._procs.discard(proc)
        status, reason, info = classify(rc, timed_out, run_dir, log, self.opts.timeout_s)
        res = VariantResult(v, status, reason, run_dir, log, rc, round(time.perf_counter() - t0, 2), gpu, run=info)
        if status == "ok" and info is not None:
            res.measure = measure(info)
        return res

    def run(self, variants: Sequence[Variant]) -> list[VariantResult]:
        work: queue.Queue[Variant] = queue.Queue()
        for v in dispatch_order(variants):
            work.put(v)
        results: list[VariantResult] = []
        done = [0]

        def worker(gpu: str | None) -> None:
            while not self._stop.is_set():
                try:
                    v = work.get_nowait()
                except queue.Empty:
                    return
                res = self.run_one(v, gpu)
                with self._lock:
                    results.append(res)
                    done[0] += 1
                    n = done[0]
                self.on_done(n, len(variants), res)

        threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g in self.slots]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            self._stop.set()
            with self._lock:
                for p in list(self._procs):  # only the collectors this matrix started
                    p.kill()
            raise
        order = {v.label: i for i, v in enumerate(variants)}
        return sorted(results, key=lambda r: order[r.variant.label])


def run_one(opts: MatrixOptions, v: Variant, gpu: str | None = None) -> VariantResult:
    """One variant in its own collector process, now (``snapviz fit`` decides the next one from it)."""
    return _Runner(opts, [gpu], lambda i, n, r: None).run_one(v, gpu)


def run_variants(
    opts: MatrixOptions,
    variants: Sequence[Variant],
    slots: list[str | None],
    on_done: Callable[[int, int, VariantResult], None] | None = None,
) -> list[VariantResult]:
    """Run every variant in its own collector process; results in ``variants`` order."""
    return _Runner(opts, slots, on_done or (lambda i, n, r: None)).run(variants)


def results_from_dir(out_dir: Path, baseline: str | None = None) -> tuple[MatrixOptions, list[VariantResult], str]:
    """The variants a previous matrix left in ``out_dir`` (one run directory each)."""
    results: list[VariantResult] = []
    first: dict[str, Any] | None = None
    for rd in sorted(p for p in out_dir.iterdir() if p.is_dir() and (p / "run.json").is_file()):
        log = out_dir / f"{rd.name}.log"
        status, reason, info = classify(0, False, rd, log)
        if info is None:
            continue
        variant = Variant(label=rd.name, techniques=tuple(rd.name.split("+")))
        res = VariantResult(
            variant=variant,
            status=status,
            reason=reason,
            run_dir=rd,
            log=log,
            returncode=0,
            elapsed_s=float(info.get("wall_s") or 0.0),
            gpu=None,
            run=info,
            measure=measure(info) if status == "ok" else None,
        )
        results.append(res)
        first = first or info
    if not results or first is None:
        raise MatrixError(f"{out_dir}: no variant run directories (with run.json) in it")
    labels = [r.variant.label for r in results]
    base = baseline if baseline in labels else (DEFAULT_BASELINE if DEFAULT_BASELINE in labels else labels[0])
    opts = MatrixOptions(
        pipeline=str(first.get("pipeline")),
        size=str(first.get("size")),
        device="cuda" if first.get("device", "").startswith("cuda") else "cpu",
        steps=int(first.get("steps") or 0),
        height=first.get("height"),
        width=first.get("width"),
        batch=int(first.get("batch") or 1),
        history=bool((first.get("history") or {}).get("enabled", True)),
        jobs=0,
        out=out_dir,
    )  # jobs=0: concurrency not known from the files
    return opts, results, base


def variant_row(res: VariantResult) -> dict[str, Any]:
    return {
        "label": res.variant.label,
        "techniques": list(res.variant.techniques),
        "status": res.status,
        "reason": res.reason,
        "run_dir": str(res.run_dir),
        "log": str(res.log),
        "returncode": res.returncode,
        "elapsed_s": res.elapsed_s,
        "gpu": res.gpu,
        "command": (res.run or {}).get("command"),
        "recorded_techniques": (res.run or {}).get("techniques"),
        "measure": res.measure,
        "vs_baseline": None,
        "tier": None,
        "score": None,
        "rank": None,
        "verdict": None,
    }
