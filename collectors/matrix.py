"""``snapviz matrix``: one pipeline across technique combinations, ranked against a baseline.

Every variant runs as its own ``python -m collectors`` process, so its peaks start from an
empty caching allocator and no earlier variant's cached blocks or cuDNN workspaces leak into
them. ``--jobs N`` runs N variants at once, one GPU each (``CUDA_VISIBLE_DEVICES``).

The table is built from each variant's ``run.json`` alone: the allocator's own per-stage peaks
on CUDA, process RSS on CPU (no allocator there; the output says which). The stage-aligned
comparison reuses :mod:`snapviz.analyses.compare`: a variant with a snapshot is digested from
the snapshot (timeline, sites, attention), one without from its ``run.json`` stage peaks.

This module imports no torch; :func:`screen_variants` and :func:`technique_names` import
``collectors.techniques`` (and so torch) when called.

    python -m collectors.matrix --pipeline sdxl --size full --device cuda --jobs 2
"""

from __future__ import annotations

import json
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from snapviz.safe_text import bounded_doc, md_code, md_text, printable

SCHEMA = "snapviz.matrix/1"
STAGE_GROUPS = ("load", "text_encode", "denoise", "vae_decode")

# The standard toolbox per pipeline (DESIGN.md "what to do"). On CPU, fp16 becomes fp32 (CPU
# has no usable fp16 kernels here) and CUDA-only variants are skipped with the reason.
DEFAULT_VARIANTS: dict[str, tuple[str, ...]] = {
    "sdxl": ("fp32", "fp16", "fp16,classic", "fp16,vae-slicing", "fp16,vae-tiling",
             "fp16,tiny-vae", "fp16,model-offload", "fp16,sequential-offload", "bf16"),
    "sd15": ("fp32", "fp16", "fp16,classic", "fp16,sliced", "fp16,vae-slicing",
             "fp16,vae-tiling", "fp16,tiny-vae", "fp16,model-offload",
             "fp16,sequential-offload", "bf16"),
    "pixart-sigma": ("fp16", "bf16", "fp16,vae-tiling", "fp16,model-offload",
                     "fp16,staged,int8,nf4-text-encoder"),
}
DEFAULT_BASELINE = "fp16"

# Dispatch heaviest first so that with --jobs N the slow variants do not form the tail
# (longest-processing-time-first); results are reported in ranking order anyway.
_SLOW = ("sequential-offload", "group-offload", "staged", "model-offload", "fp32", "nf4-text-encoder")

RANKING_RULE = (
    "Ranking, against the baseline: (1) variants that lower peak memory and make the pipe() call "
    "no slower come first, most memory saved first; (2) then variants that lower peak memory at a "
    "time cost, by memory saved per extra second of the pipe() call, highest first; (3) then "
    "variants that save no memory, least memory added first, then fastest. Failed and skipped "
    "variants are listed last, unranked.")


class MatrixError(ValueError):
    """A bad matrix option (unknown technique, unknown baseline...): one line, exit 2."""


# ----------------------------------------------------------------------------- variants

@dataclass(frozen=True)
class Variant:
    label: str                    # "fp16+vae-tiling": techniques joined by "+"
    techniques: tuple[str, ...]


def parse_variant(text: str, known: Iterable[str] | None = None,
                  aliases: dict[str, str] | None = None) -> Variant:
    """``"fp16,vae-tiling"`` (or ``"fp16+vae-tiling"``) -> Variant; names checked when ``known``."""
    aliases = aliases or {}
    known_set = set(known) if known is not None else None
    names: list[str] = []
    for part in re.split(r"[,+]", str(text)):
        part = part.strip().lower()
        if not part:
            continue
        name = aliases.get(part, part)
        if known_set is not None and name not in known_set:
            raise MatrixError(f"--variant {text!r}: unknown technique {part!r}; choose from: "
                              f"{', '.join(sorted(known_set))}")
        if name not in names:
            names.append(name)
    if not names:
        raise MatrixError(f"--variant {text!r}: names no technique")
    return Variant("+".join(names), tuple(names))


def technique_names() -> tuple[tuple[str, ...], dict[str, str]]:
    """Known technique names and aliases (imports collectors.techniques, hence torch)."""
    from .techniques import ALIASES, ALL

    return tuple(ALL), dict(ALIASES)


def default_variants(pipeline: str, device: str) -> tuple[list[Variant], list[str]]:
    """The default set for ``pipeline`` on ``device`` and the notes that explain changes."""
    raw = list(DEFAULT_VARIANTS[pipeline])
    notes: list[str] = []
    if device == "cpu":
        swapped = [",".join("fp32" if t == "fp16" else t for t in v.split(",")) for v in raw]
        if swapped != raw:
            notes.append("fp16 is CUDA-only here, so on CPU the default fp16 variants run in fp32")
        raw = swapped
    out: list[Variant] = []
    for text in raw:
        v = parse_variant(text)
        if v.label not in [x.label for x in out]:
            out.append(v)
    return out, notes


def screen_variants(variants: Sequence[Variant], *, device: str,
                    pipeline: str) -> tuple[list[Variant], list[dict[str, str]]]:
    """Split ``variants`` into runnable ones and skipped ones (with the collector's own reason).

    Used for the default set only: a variant the user asked for always runs, and a refusal
    is recorded as that variant's result.
    """
    from .techniques import TechniqueError, plan

    keep: list[Variant] = []
    skipped: list[dict[str, str]] = []
    for v in variants:
        try:
            plan(list(v.techniques), device=device, pipeline=pipeline, num_gpus=1)
        except TechniqueError as err:
            skipped.append({"label": v.label, "reason": str(err)})
        else:
            keep.append(v)
    return keep, skipped


def dispatch_order(variants: Sequence[Variant]) -> list[Variant]:
    def weight(v: Variant) -> int:
        return min((i for i, s in enumerate(_SLOW) if s in v.techniques), default=len(_SLOW))

    return sorted(variants, key=weight)


def run_dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9+._-]", "_", label)


# ----------------------------------------------------------------------------- running

@dataclass
class MatrixOptions:
    pipeline: str
    size: str = "tiny"
    device: str = "cpu"            # resolved: "cuda" or "cpu"
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
        args = ["--pipeline", self.pipeline, "--size", self.size, "--device", self.device,
                "--steps", str(self.steps), "--batch", str(self.batch), "--seed", str(self.seed)]
        if self.height:
            args += ["--height", str(self.height)]
        if self.width:
            args += ["--width", str(self.width)]
        for t in v.techniques:
            args += ["--technique", t]
        if not self.history:
            args.append("--no-history")
        args.append("--sync-stages")  # the table reports per-step wall times
        if self.profile:
            args += ["--profile", "--profile-scope", "after-load"]
        if self.memory_limit_gb:
            args += ["--memory-limit-gb", f"{self.memory_limit_gb:g}"]
        return args + ["--out", str(run_dir)]


@dataclass
class VariantResult:
    variant: Variant
    status: str                    # ok | oom | unsupported | failed | timeout
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
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if "OMP_NUM_THREADS" not in os.environ:
        # concurrent variants share the host: split its cores instead of oversubscribing them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, opts.jobs)))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _last_error_line(log: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        if ln.startswith("Error: "):
            return ln[len("Error: "):]
    for ln in reversed(lines):
        if not ln.startswith(("denoise", "[transformers]", "There are modules")):
            return ln[:300]
    return None


def classify(rc: int | None, timed_out: bool, run_dir: Path, log: Path,
             timeout_s: float | None = None) -> tuple[str, str | None, dict[str, Any] | None]:
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
        return "failed", str(info["error"]).splitlines()[0][:300], info
    if rc == 0:
        return "failed", "the collector exited 0 without a complete run.json", info
    return "failed", _last_error_line(log) or f"exit status {rc}", info


class _Runner:
    """Run variants on ``len(slots)`` workers; each worker owns one GPU (or none on CPU)."""

    def __init__(self, opts: MatrixOptions, slots: list[str | None],
                 on_done: Callable[[int, int, VariantResult], None]) -> None:
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
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=_env(self.opts, gpu))
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
        res = VariantResult(v, status, reason, run_dir, log, rc, round(time.perf_counter() - t0, 2),
                            gpu, run=info)
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


def run_variants(opts: MatrixOptions, variants: Sequence[Variant], slots: list[str | None],
                 on_done: Callable[[int, int, VariantResult], None] | None = None) -> list[VariantResult]:
    """Run every variant in its own collector process; results in ``variants`` order."""
    return _Runner(opts, slots, on_done or (lambda i, n, r: None)).run(variants)


# ----------------------------------------------------------------------------- numbers

def _group(name: str) -> str:
    return name.split("/", 1)[0]


def measure(info: dict[str, Any]) -> dict[str, Any]:
    """Peaks and times of one run.json: allocator numbers when present, RSS otherwise."""
    stages = [s for s in info.get("stages") or [] if s.get("end_us") is not None and not s.get("open")]
    alloc = info.get("allocator")
    metric = "allocator" if alloc else "rss"

    def a(s: dict[str, Any]) -> int | None:
        return s.get("peak_allocated_bytes") if metric == "allocator" else s.get("rss_peak_bytes")

    def r(s: dict[str, Any]) -> int | None:
        return s.get("peak_reserved_bytes") if metric == "allocator" else None

    per_stage: dict[str, dict[str, int | None]] = {}
    for g in STAGE_GROUPS:
        rows = [s for s in stages if _group(s["name"]) == g]
        av = [a(s) for s in rows if a(s) is not None]
        rv = [r(s) for s in rows if r(s) is not None]
        per_stage[g] = {"peak_allocated_bytes": max(av) if av else None,
                        "peak_reserved_bytes": max(rv) if rv else None}
    if alloc:
        peak, reserved = int(alloc["max_memory_allocated"]), int(alloc["max_memory_reserved"])
    else:
        peak = max((int(a(s)) for s in stages if a(s) is not None), default=0)
        reserved = None
    peak_stage = None
    for s in stages:
        if a(s) is not None and a(s) == peak:
            peak_stage = s["name"]
            break
    # the pipe() call: everything after the first load stage (the staged walkthrough's own
    # component moves included, since they are the technique's cost)
    first = next((i for i, s in enumerate(stages) if _group(s["name"]) != "load"), len(stages))
    call_s = sum(float(s.get("wall_s") or 0.0) for s in stages[first:]) if first < len(stages) else None
    load_s = sum(float(s.get("wall_s") or 0.0) for s in stages[:first])
    steps = {int(s["name"].split("/", 1)[1]): float(s["wall_s"]) for s in stages
             if _group(s["name"]) == "denoise" and "/" in s["name"]
             and s["name"].split("/", 1)[1].isdigit() and s.get("wall_s") is not None}
    # step 0 carries CUDA/cuDNN warm-up (and offload's first transfer): leave it out when we can
    later = [t for k, t in steps.items() if k > 0] or list(steps.values())
    return {
        "memory_metric": metric,
        "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved, "peak_stage": peak_stage,
        "stages": per_stage,
        "call_s": round(call_s, 6) if call_s is not None else None,
        "step_median_s": round(statistics.median(later), 6) if later else None,
        "steps_timed": len(later), "load_s": round(load_s, 6),
        "build_s": info.get("build_s"),
    }


def _rel(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base


def rank_results(rows: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Add deltas vs ``baseline``, tier, score and rank to the ``ok`` rows (in place); ranked order.

    ``rows`` are :func:`variant_row` dicts. See :data:`RANKING_RULE`.
    """
    base = next(r for r in rows if r["label"] == baseline)
    bm = base["measure"]
    for r in rows:
        m = r.get("measure")
        if r["status"] != "ok" or m is None:
            continue
        saved = bm["peak_allocated_bytes"] - m["peak_allocated_bytes"]
        extra = (m["call_s"] - bm["call_s"]) if (m["call_s"] is not None and bm["call_s"] is not None) else None
        rel = {
            "peak_allocated": _rel(m["peak_allocated_bytes"], bm["peak_allocated_bytes"]),
            "peak_reserved": _rel(m["peak_reserved_bytes"], bm["peak_reserved_bytes"]),
            "call_s": _rel(m["call_s"], bm["call_s"]),
            "step_median_s": _rel(m["step_median_s"], bm["step_median_s"]),
        }
        for g in STAGE_GROUPS:
            rel[g] = _rel(m["stages"][g]["peak_allocated_bytes"], bm["stages"][g]["peak_allocated_bytes"])
        r["vs_baseline"] = {"saved_bytes": saved, "extra_call_s": round(extra, 6) if extra is not None else None,
                            "relative": rel}
        if r["label"] == baseline:
            r.update(tier=None, score=None, rank=None, verdict="baseline")
            continue
        if saved > 0 and extra is not None and extra <= 0:
            r.update(tier=1, score=None, verdict="saves memory and time")
        elif saved > 0 and extra is not None:
            r.update(tier=2, score=saved / extra, verdict="saves memory, costs time")
        elif saved > 0:
            r.update(tier=2, score=None, verdict="saves memory (no time measured)")
        else:
            r.update(tier=3, score=None, verdict="saves no memory" if saved == 0 else "uses more memory")

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        vs = r["vs_baseline"]
        extra = vs["extra_call_s"] if vs["extra_call_s"] is not None else float("inf")
        if r["tier"] == 1:
            return (1, -vs["saved_bytes"], extra)
        if r["tier"] == 2:
            return (2, -(r["score"] if r["score"] is not None else -1.0), extra)
        return (3, -vs["saved_bytes"], extra)

    ranked = sorted((r for r in rows if r.get("tier") is not None), key=key)
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    ordered = [base] + ranked
    ordered += [r for r in rows if r not in ordered]
    return ordered


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
        res = VariantResult(variant=variant, status=status, reason=reason, run_dir=rd, log=log, returncode=0,
                            elapsed_s=float(info.get("wall_s") or 0.0), gpu=None, run=info,
                            measure=measure(info) if status == "ok" else None)
        results.append(res)
        first = first or info
    if not results or first is None:
        raise MatrixError(f"{out_dir}: no variant run directories (with run.json) in it")
    labels = [r.variant.label for r in results]
    base = baseline if baseline in labels else (DEFAULT_BASELINE if DEFAULT_BASELINE in labels else labels[0])
    opts = MatrixOptions(pipeline=str(first.get("pipeline")), size=str(first.get("size")),
                         device="cuda" if first.get("device", "").startswith("cuda") else "cpu",
                         steps=int(first.get("steps") or 0), height=first.get("height"), width=first.get("width"),
                         batch=int(first.get("batch") or 1), history=bool((first.get("history") or {}).get("enabled", True)),
                         jobs=0, out=out_dir)  # jobs=0: concurrency not known from the files
    return opts, results, base


def variant_row(res: VariantResult) -> dict[str, Any]:
    return {"label": res.variant.label, "techniques": list(res.variant.techniques),
            "status": res.status, "reason": res.reason, "run_dir": str(res.run_dir), "log": str(res.log),
            "returncode": res.returncode, "elapsed_s": res.elapsed_s, "gpu": res.gpu,
            "command": (res.run or {}).get("command"),
            "recorded_techniques": (res.run or {}).get("techniques"),
            "measure": res.measure, "vs_baseline": None, "tier": None, "score": None, "rank": None,
            "verdict": None}


# ----------------------------------------------------------------------------- comparison

def run_json_summary(info: dict[str, Any], label: str, source: str, warn: bool = True) -> dict[str, Any]:
    """A ``snapviz.summary/1``-shaped dict from run.json stage peaks, for ``digest_summary``."""
    m = measure(info)
    rss = m["memory_metric"] == "rss"
    stages = []
    for s in info.get("stages") or []:
        if s.get("end_us") is None or s.get("open"):
            continue
        a = s.get("rss_peak_bytes") if rss else s.get("peak_allocated_bytes")
        stages.append({"name": s["name"], "peak_allocated_bytes": int(a or 0),
                       "peak_reserved_bytes": 0 if rss else int(s.get("peak_reserved_bytes") or 0)})
    warnings = []
    if rss and warn:
        warnings.append("CPU run: peaks are process RSS (sampled every 5 ms, Python and torch included), "
                        "not CUDA allocator numbers; reserved is not measured")
    return {"schema": "snapviz.summary/1", "source": source, "label": label,
            "peak": {"allocated_bytes": m["peak_allocated_bytes"], "reserved_bytes": m["peak_reserved_bytes"] or 0,
                     "stage": m["peak_stage"]},
            "stages": stages, "stage_source": "run.json",
            "history": {"events": 0, "truncated": False}, "warnings": warnings}


def build_comparison(rows: list[dict[str, Any]], use_snapshots: bool = True) -> tuple[Any, dict[str, Any]] | None:
    """The stage-aligned comparison (base first, then ranked variants) via snapviz compare."""
    from snapviz.analyses.compare import compare_dict, compare_runs, digest_summary

    ok = [r for r in rows if r["status"] == "ok" and r.get("measure")]
    if len(ok) < 2:
        return None
    digests = []
    for r in ok:
        run_dir = Path(r["run_dir"])
        digest = None
        if use_snapshots and any((run_dir / n).is_file() for n in ("snapshot.pickle", "snapshot.pickle.xz")):
            try:
                from snapviz.cli_compare import digest_input

                digest = digest_input(str(run_dir), r["label"])
            except Exception as err:  # noqa: BLE001 - the run.json numbers still make a comparison
                r.setdefault("notes", []).append(f"snapshot not analysed ({type(err).__name__}: {err}); "
                                                 "compared from run.json")
        if digest is None:
            info = json.loads((run_dir / "run.json").read_text())
            # the RSS caveat once, on the base, not on every run
            digest = digest_summary(run_json_summary(info, r["label"], str(run_dir), warn=not digests),
                                    r["label"])
        digests.append(digest)
    cmp = compare_runs(digests)
    return cmp, compare_dict(cmp)


# ----------------------------------------------------------------------------- document

def matrix_dict(opts: MatrixOptions, rows: list[dict[str, Any]], baseline: str | None,
                skipped: list[dict[str, str]], notes: list[str],
                compare_doc: dict[str, Any] | None) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok" and r.get("measure")]
    metric = ok[0]["measure"]["memory_metric"] if ok else ("allocator" if opts.device == "cuda" else "rss")
    first = next((json.loads((Path(r["run_dir"]) / "run.json").read_text()) for r in ok), {})
    return {
        "schema": SCHEMA,
        "pipeline": opts.pipeline, "size": opts.size, "device": opts.device,
        "device_name": first.get("device_name"), "torch_version": first.get("torch_version"),
        "diffusers_version": first.get("diffusers_version"),
        "steps": opts.steps, "height": first.get("height", opts.height), "width": first.get("width", opts.width),
        "batch": opts.batch, "history": opts.history, "jobs": opts.jobs, "out": str(opts.out),
        "baseline": baseline,
        "memory_metric": metric,
        "memory_metric_text": ("CUDA caching allocator: torch.cuda.max_memory_allocated / max_memory_reserved, "
                               "reset at every stage boundary" if metric == "allocator" else
                               "process RSS (CPU run, no CUDA allocator): peak resident set size per stage, "
                               "Python, torch and the weights included"),
        "time_text": ("call s: wall time of the pipe() call (every stage after the initial load); step s: median "
                      "wall time of denoise steps 1..N-1 (step 0 carries warm-up)"),
        "ranking_rule": RANKING_RULE,
        "variants": rows,
        "skipped": skipped,
        "notes": notes,
        "compare": compare_doc,
    }


# ----------------------------------------------------------------------------- rendering

def _gib(n: int | None) -> str:
    from snapviz.render.fmt import fmt_bytes

    return fmt_bytes(n) if n is not None else "n/a"


def _pct(r: float | None) -> str:
    if r is None:
        return ""
    if abs(r) < 0.0005:
        return " (=)"
    return f" ({'−' if r < 0 else '+'}{abs(r) * 100:.1f}%)"


def _secs(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def table_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The matrix table as header + rows of Markdown cells (labels and reasons from run
    directories escaped); the HTML shows them without the code-span backticks."""
    rss = doc["memory_metric"] == "rss"
    head = ["#", "variant", "peak RSS" if rss else "peak allocated", *([] if rss else ["peak reserved"]),
            *(f"{g}" for g in STAGE_GROUPS), "call s", "step s", "memory saved per extra s"]
    rows: list[list[str]] = []
    for r in doc["variants"]:
        m = r.get("measure")
        if r["status"] != "ok" or m is None or r.get("vs_baseline") is None:
            what = {"oom": "OOM", "unsupported": "unsupported", "timeout": "timeout"}.get(r["status"], "failed")
            rows.append(["✗", md_code(r["label"]), md_text(f"{what}: {r['reason'] or ''}".strip())] + [""] * (len(head) - 3))
            continue
        rel = r["vs_baseline"]["relative"]
        is_base = r["label"] == doc["baseline"]

        def cell(text: str, ratio: float | None) -> str:
            return text if is_base else text + _pct(ratio)

        if is_base:
            ranking = "baseline"
        elif r["tier"] == 1:
            ranking = "saves memory and time"
        elif r["tier"] == 2 and r["score"] is not None:
            ranking = f"{_gib(int(r['score']))}/s"
        else:
            ranking = md_text(r["verdict"] or "")
        rows.append([
            "base" if is_base else str(r["rank"]),
            md_code(r["label"]),
            cell(_gib(m["peak_allocated_bytes"]), rel["peak_allocated"]),
            *([] if rss else ["n/a" if m["peak_reserved_bytes"] is None
                              else cell(_gib(m["peak_reserved_bytes"]), rel["peak_reserved"])]),
            *(("—" if m["stages"][g]["peak_allocated_bytes"] is None else
               cell(_gib(m["stages"][g]["peak_allocated_bytes"]), rel[g])) for g in STAGE_GROUPS),
            cell(_secs(m["call_s"], 2), rel["call_s"]),
            cell(_secs(m["step_median_s"], 3), rel["step_median_s"]),
            ranking,
        ])
    return head, rows


def _notes(doc: dict[str, Any], code: Callable[[Any], str], text: Callable[[Any], str]) -> list[str]:
    """The notes under the table: ``code`` renders a label, ``text`` any other text that may
    come from the files (md_code/md_text for Markdown; str for HTML, which escapes it all)."""
    notes = [text(n) for n in doc.get("notes") or []]
    notes += [f"skipped {code(s['label'])}: {text(s['reason'])}" for s in doc.get("skipped") or []]
    for r in doc["variants"]:
        notes += [f"{code(r['label'])}: {text(n)}" for n in r.get("notes") or []]
    if doc["memory_metric"] == "rss":
        notes.append("RSS differs by tens of MiB between identical processes (allocator arenas, threads): "
                     "on CPU only differences well above that mean anything")
    if doc["jobs"] > 1:
        where = "one GPU each, sharing the host CPUs" if doc["device"] == "cuda" else "sharing the CPU"
        notes.append(f"{doc['jobs']} variants ran at once ({where}): peaks are per process and unaffected, "
                     "but times can move; treat small time differences as noise")
    return notes


def render_matrix_markdown(doc: dict[str, Any]) -> str:
    """Title, setup, the ranked table, the rule and the notes (no comparison). Names read
    from run directories (--from-dir) are escaped like every snapviz Markdown."""
    doc = bounded_doc(doc)
    res = f"{md_text(doc.get('width'))}×{md_text(doc.get('height'))}" if doc.get("width") else "default resolution"
    on = md_text(doc.get("device_name") or doc["device"])
    out = [f"## Technique matrix: {md_text(doc['pipeline'])} ({md_text(doc['size'])}, {res}, batch {md_text(doc['batch'])}, "
           f"{md_text(doc['steps'])} steps) on {on}", ""]
    setup = [f"torch {md_text(doc['torch_version'])}" if doc.get("torch_version") else None,
             f"diffusers {md_text(doc['diffusers_version'])}" if doc.get("diffusers_version") else None,
             "memory history on (times include its overhead)" if doc["history"] and doc["device"] == "cuda"
             else ("no memory history" if doc["device"] == "cuda" else None),
             None if doc["jobs"] == 0 else f"{doc['jobs']} variants at a time" if doc["jobs"] > 1 else "one variant at a time",
             "each variant in a fresh process"]
    out.append("Setup: " + ", ".join(s for s in setup if s) + ".")
    against = (f"Percentages are against the baseline {md_code(doc['baseline'])}." if doc.get("baseline")
               else "No variant ran, so nothing is ranked.")
    out.append(f"Memory: {doc['memory_metric_text']}. Times: {doc['time_text']}. {against}")
    out.append("")
    head, rows = table_rows(doc)
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
    for row in rows:
        out.append("| " + " | ".join(row) + " |")
    out += ["", f"**{doc['ranking_rule']}**"]
    notes = _notes(doc, md_code, md_text)
    if notes:
        out.append("")
        out += [f"- {n}" for n in notes]
    return "\n".join(printable(line, None) for line in out) + "\n"


def render_full_markdown(doc: dict[str, Any]) -> str:
    """The matrix section followed by snapviz compare's Markdown (when two variants succeeded)."""
    text = render_matrix_markdown(doc)
    if doc.get("compare"):
        from snapviz.render.compare_md import render_compare_markdown

        text += "\n" + render_compare_markdown(doc["compare"])
    return text


_MATRIX_CSS = """<style>
table.sv-matrix { border-collapse: collapse; width: 100%; font-size: 13px; }
table.sv-matrix th { text-align: left; font-weight: 600; border-bottom: 1px solid #ccc; padding: 4px 8px; }
table.sv-matrix td { border-top: 1px solid #e3e3e3; padding: 4px 8px; font-variant-numeric: tabular-nums; white-space: nowrap; }
.sv-matrix-wrap { overflow-x: auto; }
</style>"""


def matrix_card_html(doc: dict[str, Any]) -> str:
    from snapviz.render.html import esc

    head, rows = table_rows(doc)
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c.replace('`', ''))}</td>" for c in row) + "</tr>" for row in rows)
    items = "".join(f"<li>{esc(n)}</li>" for n in _notes(bounded_doc(doc), str, str))
    return (f'{_MATRIX_CSS}<section class="sv-card" id="sv-matrix"><h2>Technique matrix</h2>'
            f'<p class="sv-hint">{esc(doc["memory_metric_text"])}. {esc(doc["time_text"])}.</p>'
            f'<div class="sv-matrix-wrap"><table class="sv-matrix" id="sv-matrix-table"><thead><tr>{th}</tr></thead>'
            f'<tbody>{body}</tbody></table></div><p class="sv-hint">{esc(doc["ranking_rule"])}</p>'
            f'{"<ul>" + items + "</ul>" if items else ""}</section>')


def render_matrix_html(doc: dict[str, Any], cmp: Any | None) -> str:
    """snapviz compare's page with the matrix table as its first card (or the table alone)."""
    card = matrix_card_html(doc)
    if cmp is not None and doc.get("compare"):
        from snapviz.render.html import render_compare_html

        page = render_compare_html(cmp, doc["compare"])
        cut = page.find("</header>")
        if cut >= 0:
            cut += len("</header>")
            return page[:cut] + card + page[cut:]
        cut = page.find("<footer")
        if cut >= 0:
            return page[:cut] + card + page[cut:]
    from snapviz.render.html import build_page

    return build_page(f"snapviz matrix: {doc['pipeline']}", [card])


if __name__ == "__main__":
    from collectors.cli import matrix

    matrix(prog_name="python -m collectors.matrix")
