"""Sites of allocations: the first frame of user or library Python code.

Stacks recorded with ``stacks="all"`` start with C++ frames (the unwinder, the caching
allocator, the dispatcher); a site skips them and torch's own Python plumbing (module call
wrappers, autograd and contextlib decorators) to the first Python line that says *why*
memory was allocated. Where a stack has no Python frame at all (the autograd engine
thread), the site is the most telling C++ frame, marked ``[C++]``: the autograd node
(``BmmBackward0``), else the ATen op, else the first frame past the unwinder and the
allocator; on the autograd thread, with the Python line that called ``backward()`` when
the snapshot has exactly one. The full stack stays available (:meth:`SiteNamer.stack_text`).
"""

from __future__ import annotations

import re

import numpy as np

from snapviz.analyses.stack_tables import StackTables
from snapviz.model import Snapshot

# Python frames that never explain *why* memory was allocated.
_PLUMBING = re.compile(
    r"(/torch/nn/modules/module\.py$|/torch/utils/_contextlib\.py$|/torch/autograd/|"
    r"/torch/_tensor\.py$|/torch/cuda/memory\.py$|/torch/_ops\.py$|/torch/overrides\.py$|"
    r"/torch/utils/_device\.py$|/torch/nn/modules/|/torch/nn/functional\.py$|/torch/functional\.py$|"
    r"/torch/_compile\.py$|/torch/_dynamo/|/torch/utils/hooks\.py$|/accelerate/hooks\.py$|"
    r"^<frozen|/threading\.py$|/contextlib\.py$)"
)


def plumbing_frames(files: np.ndarray) -> np.ndarray:
    """Bool per frame (of ``files``, the frames' file names): torch's own plumbing (Module
    calls, ``nn.functional``, autograd, hooks), which never says why memory was allocated."""
    if not len(files):
        return np.zeros(0, bool)
    uniq, inv = np.unique(np.asarray(files, dtype=str), return_inverse=True)
    hit = np.fromiter((_PLUMBING.search(str(u)) is not None for u in uniq), bool, len(uniq))
    return np.asarray(hit[np.asarray(inv).reshape(-1)], bool)


# Python frames of Tensor.backward / torch.autograd.backward: their caller runs the backward.
_BACKWARD_API = re.compile(r"/torch/(_tensor\.py|autograd/__init__\.py)$")
_AUTOGRAD_THREAD = re.compile(r"^torch::autograd::(Engine::|python::PythonEngine::)")
# C++ frames, best first, for stacks without Python: the autograd node, then the ATen op.
_CPP_NODE = re.compile(r"^torch::autograd::generated::(\w+)::apply")
_CPP_OP = re.compile(r"^at::_ops::(\w+)::call\b")
# C++ frames that say nothing: the unwinder, the allocator, tensor construction, dispatch.
_CPP_NOISE = re.compile(
    r"(^torch::unwind::|^torch::CapturedTraceback|gather_with_cpp|^c10::cuda::CUDACachingAllocator|"
    r"^c10::(StorageImpl|TensorImpl|intrusive_ptr|impl::|Dispatcher|BoxedKernel|KernelFunction)|"
    r"^at::(detail::|TensorBase|empty|native::empty|\(anonymous namespace\)::(create_out|wrapper_)|meta::)|"
    r"^void at::meta::|^at::_ops::\w+::redispatch|wrap_kernel_functor|^torch::autograd::VariableType::|"
    r"^std::|^_Py|^Py|^\?\?$|^$)"
)


def _short_symbol(name: str) -> str:
    """A C++ symbol without its parameter list."""
    i = name.find("(")
    return name[:i] if i > 0 else name


class SiteNamer:
    """Caches one display site per stack id: ``file.py:123 function``, or ``[C++] symbol``."""

    def __init__(self, snap: Snapshot, tables: StackTables | None = None) -> None:
        self.snap = snap
        tables = tables if tables is not None else StackTables(snap)
        self._names = tables.names
        self._files = tables.files
        self._lines = tables.lines
        self._python = tables.is_python
        self._plumb = np.array([bool(_PLUMBING.search(str(f))) for f in self._files], dtype=bool)
        self._cache: dict[int, str] = {}
        self._backward_line = self._backward_caller()

    def _backward_caller(self) -> int:
        """The frame of the one user line that calls ``backward()`` in this snapshot (-1:
        none, or several): the autograd thread's allocations run on its behalf."""
        callers = set()
        for st in self.snap.stacks:
            py = [f for f in st if self._python[f]]
            hits = [
                i
                for i, f in enumerate(py)
                if self._names[f] == "backward" and _BACKWARD_API.search(str(self._files[f]))
            ]
            if hits:
                caller = next((f for f in py[max(hits) + 1 :] if not self._plumb[f]), None)
                if caller is not None:
                    callers.add(caller)
        return callers.pop() if len(callers) == 1 else -1

    def frame_str(self, fid: int, short: bool = True) -> str:
        if not self._python[fid]:
            return f"[C++] {_short_symbol(str(self._names[fid]))}"
        f = str(self._files[fid])
        if short:
            f = shorten_path(f)
        return f"{f}:{int(self._lines[fid])} {self._names[fid]}"

    def site_frame(self, stack_id: int) -> int:
        """Frame id of the site of a stack (-1: no frames)."""
        st = self.snap.stacks[stack_id] if 0 <= stack_id < len(self.snap.stacks) else ()
        py = [f for f in st if self._python[f]]
        if py:
            return next((f for f in py if not self._plumb[f]), py[0])
        names = [str(self._names[f]) for f in st]
        for rx in (_CPP_NODE, _CPP_OP):
            hit = next((f for f, n in zip(st, names, strict=True) if rx.search(n)), None)
            if hit is not None:
                return hit
        return next((f for f, n in zip(st, names, strict=True) if not _CPP_NOISE.search(n)), st[0] if st else -1)

    def site(self, stack_id: int) -> str:
        s = self._cache.get(stack_id)
        if s is None:
            fid = self.site_frame(stack_id)
            s = self.frame_str(fid) if fid >= 0 else "(no frames recorded)"
            if (
                fid >= 0
                and not self._python[fid]
                and self._backward_line >= 0
                and any(_AUTOGRAD_THREAD.search(str(self._names[f])) for f in self.snap.stacks[stack_id])
            ):
                s += f" (autograd thread, backward() called at {self.frame_str(self._backward_line)})"
            self._cache[stack_id] = s
        return s

    def shown_frames(self, stack_id: int) -> list[int]:
        """Frame ids worth showing, innermost first: the stack's Python frames, or its C++
        frames past the unwinder and the allocator when it has no Python frame."""
        if stack_id < 0 or stack_id >= len(self.snap.stacks):
            return []
        st = list(self.snap.stacks[stack_id])
        return [f for f in st if self._python[f]] or [f for f in st if not _CPP_NOISE.search(str(self._names[f]))] or st

    def stack_text(self, stack_id: int, limit: int = 12) -> str:
        st = self.shown_frames(stack_id)
        if not st:
            return "(no frames recorded)"
        lines = [self.frame_str(f) for f in st[:limit]]
        if len(st) > limit:
            lines.append(f"... {len(st) - limit} more")
        return "\n".join(lines)


_KNOWN_PACKAGES = (
    "/diffusers/",
    "/transformers/",
    "/torch/",
    "/accelerate/",
    "/torchao/",
    "/bitsandbytes/",
    "/optimum/",
    "/peft/",
    "/collectors/",
    "/snapviz/",
)


def shorten_path(path: str) -> str:
    """``/usr/lib/python3/site-packages/diffusers/models/x.py`` -> ``diffusers/models/x.py``."""
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker) :]
    # Packages installed with --target or from a source checkout: cut at the package root.
    if path.startswith(tuple(pkg[1:] for pkg in _KNOWN_PACKAGES)):  # already relative (profiler)
        return path
    for pkg in _KNOWN_PACKAGES:
        i = path.rfind(pkg)
        if i >= 0:
            return path[i + 1 :]
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path
