"""Source lines for allocations: the innermost frame that is not PyTorch's own plumbing."""
from __future__ import annotations

import re

import numpy as np

from snapviz.model import Snapshot

# Frames that never explain *why* memory was allocated: torch's module call wrappers,
# autograd/contextlib decorators, the C++ frames of stacks="all" (file '??' or '').
_PLUMBING = re.compile(
    r"(^$|^\?\?$|/torch/nn/modules/module\.py$|/torch/utils/_contextlib\.py$|/torch/autograd/|"
    r"/torch/_tensor\.py$|/torch/cuda/memory\.py$|/torch/_ops\.py$|/torch/overrides\.py$|"
    r"/torch/utils/_device\.py$|/torch/nn/modules/|/torch/nn/functional\.py$|/torch/functional\.py$|"
    r"/torch/_compile\.py$|/torch/_dynamo/|/torch/utils/hooks\.py$|/accelerate/hooks\.py$|"
    r"^<frozen|/threading\.py$|/contextlib\.py$)"
)


def _is_plumbing(filename: str, line: int) -> bool:
    return line == 0 or bool(_PLUMBING.search(filename))


class SiteNamer:
    """Caches one display site per stack id: ``file.py:123 function``."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        fr = snap.frames
        self._names = fr["name"].to_numpy()
        self._files = fr["filename"].to_numpy()
        self._lines = fr["line"].to_numpy()
        self._plumb = np.array([_is_plumbing(f, int(l)) for f, l in zip(self._files, self._lines)], dtype=bool)
        self._cache: dict[int, str] = {}

    def frame_str(self, fid: int, short: bool = True) -> str:
        f = str(self._files[fid])
        if short:
            f = shorten_path(f)
        return f"{f}:{int(self._lines[fid])} {self._names[fid]}"

    def site(self, stack_id: int) -> str:
        s = self._cache.get(stack_id)
        if s is not None:
            return s
        if stack_id < 0:
            s = "(no frames recorded)"
        else:
            st = self.snap.stacks[stack_id]
            fid = next((f for f in st if not self._plumb[f]), st[0] if st else -1)
            s = self.frame_str(fid) if fid >= 0 else "(no frames recorded)"
        self._cache[stack_id] = s
        return s

    def stack_text(self, stack_id: int, limit: int = 12) -> str:
        if stack_id < 0:
            return "(no frames recorded)"
        st = [f for f in self.snap.stacks[stack_id] if not (self._lines[f] == 0)]
        lines = [self.frame_str(f) for f in st[:limit]]
        if len(st) > limit:
            lines.append(f"... {len(st) - limit} more")
        return "\n".join(lines)


_KNOWN_PACKAGES = ("/diffusers/", "/transformers/", "/torch/", "/accelerate/", "/torchao/", "/bitsandbytes/",
                   "/optimum/", "/peft/", "/collectors/", "/snapviz/")


def shorten_path(path: str) -> str:
    """``/usr/lib/python3/site-packages/diffusers/models/x.py`` -> ``diffusers/models/x.py``."""
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    # Packages installed with --target or from a source checkout: cut at the package root.
    if path.startswith(tuple(pkg[1:] for pkg in _KNOWN_PACKAGES)):  # already relative (profiler)
        return path
    for pkg in _KNOWN_PACKAGES:
        i = path.rfind(pkg)
        if i >= 0:
            return path[i + 1:]
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path
