"""snapviz: GPU memory snapshot analysis and visualization for diffusion pipelines.

The analyzer never imports torch. Typical use::

    import snapviz
    run = snapviz.load("snapshot.pickle")    # or a Chrome trace, or a run directory
    run.snapshot.events                      # trace entries as a DataFrame
    an = snapviz.analyze(run)                # Analysis (an.kind: "snapshot" or "trace")
    an.events                                # replayed allocated / reserved / requested, and stage
    an.stages, an.top_allocations            # per stage interval; live at the peak
    an.summary()                             # the snapviz.summary/1 document (CLI --json)
    snapviz.compare("before/", "after/").verdict
    snapviz.check("run/", max_peak="12GiB").passed

The functions live in :mod:`snapviz.api`, their examples run as tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from snapviz.errors import CheckFailed, InputError
from snapviz.load import Run, load

if TYPE_CHECKING:
    from snapviz.analyses.analysis import Analysis
    from snapviz.analyses.compare import Comparison
    from snapviz.analyses.gate import CheckResult, GateResult
    from snapviz.api import analyze, check, compare
    from snapviz.notebook import show

__version__ = "0.1.0"
__all__ = [
    "load",
    "analyze",
    "compare",
    "check",
    "show",
    "Run",
    "Analysis",
    "Comparison",
    "CheckResult",
    "GateResult",
    "InputError",
    "CheckFailed",
    "__version__",
]

# Loaded on first use (PEP 562), so `import snapviz`, and with it `snapviz --help`, does not
# import every analysis (nor the notebook's renderers).
_LAZY = {
    "analyze": "snapviz.api",
    "compare": "snapviz.api",
    "check": "snapviz.api",
    "Analysis": "snapviz.analyses.analysis",
    "Comparison": "snapviz.analyses.compare",
    "CheckResult": "snapviz.analyses.gate",
    "GateResult": "snapviz.analyses.gate",
    "show": "snapviz.notebook",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext snapviz``: analyses and comparisons display as reports."""
    from snapviz.notebook import register_formatters

    register_formatters(ip)


def _register_in_running_notebook() -> None:
    # Importing snapviz in a notebook is enough: no %load_ext needed.
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "display_formatter"):
        load_ipython_extension(shell)


_register_in_running_notebook()
