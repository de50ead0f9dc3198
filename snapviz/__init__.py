"""snapviz: GPU memory snapshot analysis and visualization for diffusion pipelines.

The analyzer never imports torch. Typical use::

    import snapviz
    run = snapviz.load("snapshot.pickle")
    run.events            # trace entries as a DataFrame
    result = snapviz.analyze(run)
    result.timeline       # replayed allocated / reserved / requested series
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from snapviz.errors import CheckFailed, InputError
from snapviz.load import Run, load

if TYPE_CHECKING:  # the analyses load lazily: `import snapviz` stays light
    from snapviz.analyses.summary import Analysis

__version__ = "0.1.0"
__all__ = ["load", "analyze", "show", "compare", "Run", "InputError", "CheckFailed", "__version__"]


def analyze(run: Run | str, device: int | None = None, rules: str | None = None) -> Analysis:
    """Run every analysis on a loaded run (or a path); ``rules``: a rules file replacing or
    extending the built-in rules. See :mod:`snapviz.analyses.summary`."""
    from snapviz.analyses.frame_rules import load_rules
    from snapviz.analyses.summary import analyze_run

    if isinstance(run, str):
        run = load(run)
    return analyze_run(run, device=device, rules=load_rules(rules))


def show(obj: Any, max_points: int = 20000) -> Any:
    """Display a path, analysis, comparison or list of paths as an interactive report in a
    notebook (see :mod:`snapviz.notebook`)."""
    from snapviz.notebook import show as _show

    return _show(obj, max_points=max_points)


def compare(paths: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None) -> Any:
    """Compare runs (paths), the first as base; see :func:`snapviz.notebook.compare`."""
    from snapviz.notebook import compare as _compare

    return _compare(paths, labels)


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
