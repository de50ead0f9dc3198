"""snapviz: GPU memory snapshot analysis and visualization for diffusion pipelines.

The analyzer never imports torch. Typical use::

    import snapviz
    run = snapviz.load("snapshot.pickle")
    run.events            # trace entries as a DataFrame
    result = snapviz.analyze(run)
    result.timeline       # replayed allocated / reserved / requested series
"""
from __future__ import annotations

from snapviz.errors import CheckFailed, InputError
from snapviz.load import Run, load

__version__ = "0.1.0"
__all__ = ["load", "analyze", "Run", "InputError", "CheckFailed", "__version__"]


def analyze(run: "Run | str", device: int | None = None, rules: "str | None" = None):  # type: ignore[no-untyped-def]
    """Run every analysis on a loaded run (or a path); ``rules``: a rules file replacing or
    extending the built-in rules. See :mod:`snapviz.analyses.summary`."""
    from snapviz.analyses.frame_rules import load_rules
    from snapviz.analyses.summary import analyze_run

    if isinstance(run, str):
        run = load(run)
    return analyze_run(run, device=device, rules=load_rules(rules))
