"""The recorder: stage labels, the allocator's per-stage peaks, and the run directory.

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
import os
import shutil
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .distributed import rank_out_dir
from .oom import attach_oom_observer, detach_oom_observer, is_oom
from .rss import RssSampler
from .run_info import run_info, write_run_json

DEFAULT_MAX_ENTRIES = 1_000_000


def recording_args(o: Any) -> list[str]:
    """The recording options of a collect command line (``o``: inference or training options),
    shared by both so a run.json's ``command`` reproduces the recording either way."""
    args: list[str] = []
    if o.profile:
        args.append("--profile")
        if o.profile_scope != "all":
            args += ["--profile-scope", o.profile_scope]
    if o.memory_limit_gb:
        args += ["--memory-limit-gb", f"{o.memory_limit_gb:g}"]
    if getattr(o, "alloc_conf", None) is not None:
        args += ["--alloc-conf", o.alloc_conf]
    if o.sync_stages:
        args.append("--sync-stages")
    if o.history:
        args += ["--stacks", o.stacks, "--context", o.context]
        if o.max_entries != DEFAULT_MAX_ENTRIES:
            args += ["--max-entries", str(o.max_entries)]
    else:
        args.append("--no-history")
    args += ["--seed", str(o.seed)]
    if o.out:
        args += ["--out", o.out]
    return args


STAGE_OTHER = "other"


def _now_us() -> int:
    return time.time_ns() // 1000


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
        self.out_dir = rank_out_dir(out_dir)  # OUT/rank<R>/ for each rank under torch.distributed
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.devices = devices if devices is not None else ([self.device.index] if self.cuda else [])
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
        self._rss = RssSampler(interval_s=0.1 if self.cuda else 0.005)
        self._prof: Any = None
        self._t0 = 0.0
        self._start_us = 0
        self._snapshot_dumped = False
        self._finished = False
        self.status = "ok"

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and is_oom(exc):
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
                enabled="all", context=self.context, stacks=self.stacks, max_entries=self.max_entries
            )
        if self.cuda:
            attach_oom_observer(self)
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
        if self.status == "ok" and self.meta.get("oom"):
            # every OOM was caught and the run went on: the last one is kept as caught_oom
            self.meta["caught_oom"] = self.meta.pop("oom")
        if self.history:
            # the OOM observer's dump (at the first OOM, caught or not) only guards against a
            # crash: this one holds the history up to the end, or up to the OOM that escaped
            torch.cuda.memory._dump_snapshot(str(self.out_dir / "snapshot.pickle"))
            self._snapshot_dumped = True
            # disabling clears the ring buffer: only after the dump
            torch.cuda.memory._record_memory_history(enabled=None)
        detach_oom_observer(self)
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
        self._prof = profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)
        self._prof.__enter__()
        self.meta["profile_start_us"] = _now_us()

    # --- stages -------------------------------------------------------------------------------

    def mark(self, label: str | None) -> None:
        """Close the current stage and open ``label`` (None: close only)."""
        start_prof = (
            self.profile
            and self._prof is None
            and label is not None
            and self._current is not None
            and self._current["name"] == "load"
        )
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
            "name": label,
            "start_us": now_us,
            "_pc": now_pc,
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

    def _close(
        self, cur: dict[str, Any], stats: dict[str, Any], rss: int, rss_peak: int, now_us: int, now_pc: float
    ) -> None:
        stage = {
            "name": cur["name"],
            "start_us": cur["start_us"],
            "end_us": now_us,
            "wall_s": round(now_pc - cur["_pc"], 6),
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "allocated_at_start": cur["allocated_at_start"],
            "allocated_at_end": None,
            "reserved_at_start": cur["reserved_at_start"],
            "reserved_at_end": None,
            "per_device": [],
            "rss_at_start": cur["rss_at_start"],
            "rss_at_end": rss,
            "rss_peak_bytes": rss_peak,
        }
        if self.cuda:
            prim = stats["primary"]
            stage.update(
                peak_allocated_bytes=prim["max_allocated"],
                peak_reserved_bytes=prim["max_reserved"],
                allocated_at_end=prim["allocated"],
                reserved_at_end=prim["reserved"],
            )
            stage["per_device"] = [
                {
                    "device": d,
                    "peak_allocated_bytes": s["max_allocated"],
                    "peak_reserved_bytes": s["max_reserved"],
                    "allocated_at_end": s["allocated"],
                    "reserved_at_end": s["reserved"],
                }
                for d, s in stats["devices"].items()
            ]
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
        sub = type(
            cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
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
        return run_info(self, status)

    def write_run_json(self, info: dict[str, Any] | None = None) -> Path:
        return write_run_json(self.out_dir, info if info is not None else self.run_info())
