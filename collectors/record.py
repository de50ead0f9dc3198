"""Record a diffusion pipeline run with stage labels: the stage machinery and the run directory.

Stage contract (snapviz.run/1): ``load``, ``text_encode``, ``denoise/<i>`` (one per denoiser
call), ``vae_decode`` and ``other``. A pipeline ``__call__`` starts ``text_encode``; a forward
pre-hook on ``pipe.unet``/``pipe.transformer`` starts ``denoise/<i>``; ``pipe.vae.decode`` (and
SDXL's ``upcast_vae``, which exists only to feed the decode) starts ``vae_decode``, which lasts
until the pipeline returns; everything else is ``other``. Stages are contiguous from start to
finish, so the run's peak is the max over its stages.

Usage for a pipeline you built yourself::

    import collectors
    with collectors.record(pipe, "runs/mine") as rec:
        with rec.stage("load"):
            pipe.to("cuda")
        pipe("a photo of a cat", num_inference_steps=4)
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import shutil
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

RUN_SCHEMA = "snapviz.run/1"
DEFAULT_MAX_ENTRIES = 1_000_000
STAGE_OTHER = "other"


def _now_us() -> int:
    return time.time_ns() // 1000


class _RssSampler:
    """Process RSS, sampled at stage boundaries and by a light background thread."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import psutil

            proc = psutil.Process()
            self._read: Callable[[], int] = lambda: proc.memory_info().rss
        except ImportError:  # Linux fallback
            page = os.sysconf("SC_PAGE_SIZE")

            def read_statm() -> int:
                with open("/proc/self/statm") as fh:
                    return int(fh.read().split()[1]) * page

            self._read = read_statm

    def start(self) -> None:
        self._peak = self._read()
        self._thread = threading.Thread(target=self._loop, name="snapviz-rss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self._read()
            if rss > self._peak:
                self._peak = rss

    def read_and_reset(self) -> tuple[int, int]:
        """Return (current rss, peak since the last reset) and start a new peak window."""
        rss = self._read()
        peak = max(self._peak, rss)
        self._peak = rss
        return rss, peak

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class Recorder:
    """Labels stages, keeps the allocator's per-stage peaks, and writes the run directory."""

    def __init__(
        self,
        pipe: Any,
        out_dir: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        stacks: str = "python",
        context: str = "all",
        max_entries: int = DEFAULT_MAX_ENTRIES,
        history: bool = True,
        profile: bool = False,
        profile_scope: str = "all",
        devices: list[int] | None = None,
        initial_stage: str = STAGE_OTHER,
        meta: dict[str, Any] | None = None,
        on_step: Callable[[int], None] | None = None,
        sync_stages: bool = False,
    ) -> None:
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        if context not in ("all", "alloc", "state"):
            raise ValueError(f"context must be 'all', 'alloc' or 'state', not {context!r}")
        self.pipe = pipe
        self.out_dir = Path(out_dir)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.devices = devices if devices is not None else (
            [self.device.index] if self.cuda else [])
        self.stacks, self.context, self.max_entries = stacks, context, max_entries
        self.history = history and self.cuda
        self.profile = profile
        if profile_scope not in ("all", "after-load"):
            raise ValueError(f"profile_scope must be 'all' or 'after-load', not {profile_scope!r}")
        # "after-load": start the profiler when the first load stage ends (pipe.to() alone is
        # ~100k Python events; traces stay small enough to ship as samples)
        self.profile_scope = profile_scope
        self.initial_stage = initial_stage
        self.meta = dict(meta or {})
        self.on_step = on_step
        # The caching allocator's counters are updated on the host when a kernel is queued,
        # so stage peaks are exact without a device sync. Syncing at every boundary only
        # makes per-stage wall times exact, at the cost of CPU/GPU overlap (measured: ~5%
        # on a launch-bound SD 1.5 step), so it is opt-in.
        self.sync_stages = sync_stages
        # label given to a pipeline __call__ start; None leaves the current stage running
        self.call_start_label: str | None = "text_encode"

        self.stages: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self._record_fn: Any = None
        self._step = 0
        self._call_depth = 0
        # weak: the staged walkthrough deletes the denoiser and its memory must really go
        self._hooked_denoiser: weakref.ref[Any] | None = None
        self._hooks: list[Any] = []
        self._patched: list[tuple[Any, str]] = []
        self._orig_class: type | None = None
        # A thread waking every few ms takes the GIL from a launch-bound CUDA loop; on CUDA
        # the allocator's own counters are the truth, so RSS is only sampled coarsely there.
        self._rss = _RssSampler(interval_s=0.1 if self.cuda else 0.005)
        self._prof: Any = None
        self._t0 = 0.0
        self._start_us = 0
        self._snapshot_dumped = False
        self._finished = False
        self.status = "ok"

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and _is_oom(exc):
            self.status = "oom"
        elif exc is not None:
            self.status = "error"
            self.meta["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        self.finish()

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.cuda:
            torch.cuda.init()
            for d in self.devices:
                torch.cuda.synchronize(d)
        if self.history:
            # before the first stage, so the snapshot starts empty of this run's allocations
            torch.cuda.memory._record_memory_history(
                enabled="all", context=self.context, stacks=self.stacks,
                max_entries=self.max_entries)
        if self.cuda:
            _attach_oom_observer(self)
        self._rss.start()
        if self.profile and (self.profile_scope == "all" or self.initial_stage != "load"):
            self._start_profiler()
        self._install_hooks()
        self._t0 = time.perf_counter()
        self._start_us = _now_us()
        self.mark(self.initial_stage)

    def finish(self) -> dict[str, Any]:
        if self._finished:
            return self.run_info()
        self._finished = True
        self.mark(None)
        wall_s = time.perf_counter() - self._t0
        self._remove_hooks()
        self._rss.stop()
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            raw = self.out_dir / "trace.json"
            self._prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(self.out_dir / "trace.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
        final = self._allocator_now()
        if self.history:
            if not self._snapshot_dumped:
                torch.cuda.memory._dump_snapshot(str(self.out_dir / "snapshot.pickle"))
                self._snapshot_dumped = True
            # disabling clears the ring buffer: only after the dump
            torch.cuda.memory._record_memory_history(enabled=None)
        _detach_oom_observer(self)
        self.meta["wall_s"] = round(wall_s, 6)
        self._final = final
        info = self.run_info()
        self.write_run_json(info)
        return info

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, profile_memory=True,
                             record_shapes=True, with_stack=True)
        self._prof.__enter__()
        self.meta["profile_start_us"] = _now_us()

    # --- stages -------------------------------------------------------------------------------

    def mark(self, label: str | None) -> None:
        """Close the current stage and open ``label`` (None: close only)."""
        start_prof = (self.profile and self._prof is None and label is not None
                      and self._current is not None and self._current["name"] == "load")
        if self.cuda and (self.sync_stages or label is None or self._current is None):
            for d in self.devices:
                torch.cuda.synchronize(d)
        stats = self._allocator_now()
        rss, rss_peak = self._rss.read_and_reset()
        if self.history and hasattr(torch.cuda.memory, "_set_memory_metadata"):  # torch >= 2.10
            torch.cuda.memory._set_memory_metadata(label or "")
        if self.cuda:
            for d in self.devices:
                torch.cuda.reset_peak_memory_stats(d)
        now_us = _now_us()
        now_pc = time.perf_counter()
        if self._current is not None:
            self._close(self._current, stats, rss, rss_peak, now_us, now_pc)
        if self._record_fn is not None:
            self._record_fn.__exit__(None, None, None)
            self._record_fn = None
        if start_prof:
            self._start_profiler()
        if label is None:
            self._current = None
            return
        self._current = {
            "name": label, "start_us": now_us, "_pc": now_pc,
            "allocated_at_start": stats["primary"]["allocated"] if self.cuda else None,
            "reserved_at_start": stats["primary"]["reserved"] if self.cuda else None,
            "rss_at_start": rss,
        }
        self._record_fn = torch.profiler.record_function(label)
        self._record_fn.__enter__()

    @contextlib.contextmanager
    def stage(self, label: str, after: str = STAGE_OTHER) -> Iterator[None]:
        """Run a block as stage ``label``; ``after`` starts when the block ends."""
        self.mark(label)
        try:
            yield
        finally:
            self.mark(after)

    def _close(self, cur: dict[str, Any], stats: dict[str, Any], rss: int, rss_peak: int,
               now_us: int, now_pc: float) -> None:
        stage = {
            "name": cur["name"], "start_us": cur["start_us"], "end_us": now_us,
            "wall_s": round(now_pc - cur["_pc"], 6),
            "peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "allocated_at_start": cur["allocated_at_start"],
            "allocated_at_end": None,
            "reserved_at_start": cur["reserved_at_start"], "reserved_at_end": None,
            "per_device": [],
            "rss_at_start": cur["rss_at_start"], "rss_at_end": rss, "rss_peak_bytes": rss_peak,
        }
        if self.cuda:
            prim = stats["primary"]
            stage.update(peak_allocated_bytes=prim["max_allocated"],
                         peak_reserved_bytes=prim["max_reserved"],
                         allocated_at_end=prim["allocated"], reserved_at_end=prim["reserved"])
            stage["per_device"] = [
                {"device": d, "peak_allocated_bytes": s["max_allocated"],
                 "peak_reserved_bytes": s["max_reserved"],
                 "allocated_at_end": s["allocated"], "reserved_at_end": s["reserved"]}
                for d, s in stats["devices"].items()]
        self.stages.append(stage)

    def _allocator_now(self) -> dict[str, Any]:
        if not self.cuda:
            return {}
        devs = {}
        for d in self.devices:
            devs[d] = {
                "max_allocated": torch.cuda.max_memory_allocated(d),
                "max_reserved": torch.cuda.max_memory_reserved(d),
                "allocated": torch.cuda.memory_allocated(d),
                "reserved": torch.cuda.memory_reserved(d),
            }
        return {"devices": devs, "primary": devs[self.device.index]}

    # --- hooks ---------------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        pipe = self.pipe
        if pipe is None:
            return
        cls = type(pipe)
        rec = self

        def __call__(self_: Any, *args: Any, **kwargs: Any) -> Any:
            rec._on_call_start()
            try:
                return cls.__call__(self_, *args, **kwargs)
            finally:
                rec._on_call_end()

        # type(pipe).__call__ is what pipe(...) runs, so the hook needs a subclass; same name so
        # diffusers' config and save_pretrained see the original class.
        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        self._orig_class = cls
        pipe.__class__ = sub
        self._ensure_component_hooks()

    def _ensure_component_hooks(self) -> None:
        pipe = self.pipe
        den = getattr(pipe, "unet", None)
        if not isinstance(den, torch.nn.Module):
            den = getattr(pipe, "transformer", None)
        hooked = self._hooked_denoiser() if self._hooked_denoiser is not None else None
        if isinstance(den, torch.nn.Module) and den is not hooked:
            self._hooks.append(den.register_forward_pre_hook(self._on_denoise))
            self._hooked_denoiser = weakref.ref(den)
        vae = getattr(pipe, "vae", None)
        if vae is not None and "decode" not in vars(vae):
            orig = vae.decode

            def decode(*args: Any, **kwargs: Any) -> Any:
                self._enter_decode()
                return orig(*args, **kwargs)

            vae.decode = decode
            self._patched.append((vae, "decode"))
        if hasattr(type(pipe), "upcast_vae") and "upcast_vae" not in vars(pipe):
            orig_up = pipe.upcast_vae

            def upcast_vae(*args: Any, **kwargs: Any) -> Any:
                self._enter_decode()
                return orig_up(*args, **kwargs)

            object.__setattr__(pipe, "upcast_vae", upcast_vae)
            self._patched.append((pipe, "upcast_vae"))

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._hooked_denoiser = None
        for obj, attr in self._patched:
            with contextlib.suppress(AttributeError):
                object.__delattr__(obj, attr)
        self._patched.clear()
        if self._orig_class is not None and self.pipe is not None:
            self.pipe.__class__ = self._orig_class
            self._orig_class = None

    def _on_call_start(self) -> None:
        self._call_depth += 1
        if self._call_depth > 1:
            return
        self._step = 0
        self._ensure_component_hooks()
        if self.call_start_label is not None:
            self.mark(self.call_start_label)

    def _on_call_end(self) -> None:
        self._call_depth -= 1
        if self._call_depth == 0 and not self._finished:
            self.mark(STAGE_OTHER)

    def _on_denoise(self, module: Any, args: Any) -> None:
        step = self._step
        self._step += 1
        self.mark(f"denoise/{step}")
        if self.on_step is not None:
            self.on_step(step)

    def _enter_decode(self) -> None:
        if self._current is None or self._current["name"] != "vae_decode":
            self.mark("vae_decode")

    # --- output --------------------------------------------------------------------------------

    def run_info(self, status: str | None = None) -> dict[str, Any]:
        import importlib.metadata as md

        def version(name: str) -> str | None:
            try:
                return md.version(name)
            except md.PackageNotFoundError:
                return None

        info: dict[str, Any] = {"schema": RUN_SCHEMA}
        info.update(self.meta)
        info["status"] = status or self.status
        info["device"] = str(self.device)
        info["device_name"] = (torch.cuda.get_device_name(self.device) if self.cuda
                               else (platform.processor() or platform.machine() or "cpu"))
        info["num_devices"] = len(self.devices) if self.cuda else 1
        info["torch_version"] = torch.__version__
        info["diffusers_version"] = version("diffusers")
        info["transformers_version"] = version("transformers")
        info["python_version"] = platform.python_version()
        info["history"] = {
            "enabled": self.history, "context": self.context if self.history else None,
            "stacks": self.stacks if self.history else None,
            "max_entries": self.max_entries if self.history else None,
        }
        info["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        info["record_start_us"] = self._start_us
        stages = [s for s in self.stages]
        info["stages"] = stages
        if self.cuda:
            final = getattr(self, "_final", None) or self._allocator_now()
            per_dev = []
            for d in self.devices:
                rows = [next((p for p in s["per_device"] if p["device"] == d), None)
                        for s in stages]
                rows = [r for r in rows if r is not None]
                per_dev.append({
                    "device": d,
                    "max_memory_allocated": max((r["peak_allocated_bytes"] for r in rows),
                                                default=0),
                    "max_memory_reserved": max((r["peak_reserved_bytes"] for r in rows),
                                               default=0),
                    "final_allocated": final["devices"][d]["allocated"],
                    "final_reserved": final["devices"][d]["reserved"],
                })
            prim = next(p for p in per_dev if p["device"] == self.device.index)
            info["allocator"] = {
                "device": self.device.index,
                "max_memory_allocated": prim["max_memory_allocated"],
                "max_memory_reserved": prim["max_memory_reserved"],
                "final_allocated": prim["final_allocated"],
                "final_reserved": prim["final_reserved"],
                "devices": per_dev,
            }
        else:
            info["allocator"] = None
        info["rss_peak_bytes"] = max((s["rss_peak_bytes"] for s in stages), default=None)
        files = [n for n in ("snapshot.pickle", "trace.json.gz", "image.png")
                 if (self.out_dir / n).exists()]
        info["files"] = files
        return info

    def write_run_json(self, info: dict[str, Any] | None = None) -> Path:
        info = info if info is not None else self.run_info()
        path = self.out_dir / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
        tmp.replace(path)
        return path

    # --- OOM -------------------------------------------------------------------------------------

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """Called by the allocator before it raises OutOfMemoryError: save what we have."""
        try:
            self.status = "oom"
            self.meta["oom"] = {"device": device, "requested_bytes": alloc,
                                "device_allocated": device_alloc, "device_free": device_free,
                                "stage": self._current["name"] if self._current else None}
            if self.history and not self._snapshot_dumped:
                torch.cuda.memory._dump_snapshot(str(self.out_dir / "snapshot.pickle"))
                self._snapshot_dumped = True
            info = self.run_info(status="oom")
            if self._current is not None:  # the stage in flight, unclosed
                info["stages"] = info["stages"] + [{
                    "name": self._current["name"], "start_us": self._current["start_us"],
                    "end_us": None, "open": True}]
            self.write_run_json(info)
        except Exception as err:  # never mask the OOM itself
            print(f"snapviz: could not save the OOM snapshot: {err}", file=sys.stderr)


_ACTIVE: list[Recorder] = []
_OBSERVER_ATTACHED = False


def _attach_oom_observer(rec: Recorder) -> None:
    # there is no detach in torch; one process-wide observer dispatches to the active recorder
    global _OBSERVER_ATTACHED
    _ACTIVE.append(rec)
    if not _OBSERVER_ATTACHED and hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        def observer(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
            if _ACTIVE:
                _ACTIVE[-1]._on_oom(device, alloc, device_alloc, device_free)

        torch._C._cuda_attach_out_of_memory_observer(observer)
        _OBSERVER_ATTACHED = True


def _detach_oom_observer(rec: Recorder) -> None:
    if rec in _ACTIVE:
        _ACTIVE.remove(rec)


def _is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def record(pipe: Any, out_dir: str | os.PathLike[str], *, stacks: str = "python",
           context: str = "all", max_entries: int = DEFAULT_MAX_ENTRIES, profile: bool = False,
           profile_scope: str = "all", history: bool = True,
           device: str | torch.device | None = None,
           devices: list[int] | None = None, meta: dict[str, Any] | None = None,
           initial_stage: str = STAGE_OTHER,
           on_step: Callable[[int], None] | None = None, sync_stages: bool = False,
           train: bool = False) -> Recorder:
    """A :class:`Recorder` for ``pipe`` writing to ``out_dir``; use it as a context manager.

    ``train=True``: ``pipe`` is the model being trained, and the recorder is a
    :class:`collectors.train_record.TrainRecorder` (phases, step marker, backward labelled)."""
    if train:
        # train_record subclasses Recorder, so it can only be imported once this module is
        from .train_record import TrainRecorder

        return TrainRecorder(pipe, out_dir, stacks=stacks, context=context,
                             max_entries=max_entries, profile=profile,
                             profile_scope=profile_scope, history=history, device=device,
                             devices=devices, meta=meta, initial_stage=initial_stage,
                             sync_stages=sync_stages)
    return Recorder(pipe, out_dir, stacks=stacks, context=context, max_entries=max_entries,
                    profile=profile, profile_scope=profile_scope, history=history,
                    device=device, devices=devices, meta=meta, initial_stage=initial_stage,
                    on_step=on_step, sync_stages=sync_stages)


class _CallableModule(type(sys)):  # type: ignore[misc]
    """``collectors.record`` is both this module and the function: calling it records."""

    def __call__(self, *args: Any, **kwargs: Any) -> Recorder:
        return record(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
