"""The ``snapviz`` command: thin verbs over load -> analyses -> renderers (docs/design.md).

* :mod:`.errors` — the one mapping from errors to exit codes (0/1/2) and stderr lines;
* :mod:`.options` — option decorators the verbs share; :mod:`.outputs` — the one output-path rule set;
* :mod:`.share` — ``--perfetto``/``--png``/``--svg``; :mod:`.inputs` — labels and per-input analysis;
* one module per verb: :mod:`.analyze`, :mod:`.compare`, :mod:`.check`, :mod:`.trim`, :mod:`.whatif` (and
  :mod:`.fleet`: ``ranks`` and ``history``, many runs on :mod:`snapviz.engine`); the collectors'
  verbs (``collect``, ``matrix``, ``fit``: torch, diffusers) are registered by name and imported on use (:mod:`.lazy`).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import click

from snapviz import __version__
from snapviz.cli.analyze import analyze
from snapviz.cli.check import check
from snapviz.cli.compare import compare
from snapviz.cli.fleet import history, ranks
from snapviz.cli.lazy import LazyGroup, LazyVerb
from snapviz.cli.options import CONTEXT_SETTINGS, epilog
from snapviz.cli.trim import trim
from snapviz.cli.whatif import whatif

_COLLECT_INSTALL = "install the collectors' dependencies: pip install 'snapviz[collect]'"
LAZY_VERBS = {
    "collect": LazyVerb(
        "collectors.cli:collect", "Run a diffusion pipeline with stage labels and record its memory.", _COLLECT_INSTALL
    ),
    "fit": LazyVerb(
        "collectors.cli:fit",
        "Find the technique combinations that fit each card, their peaks and times, and the fastest.",
        _COLLECT_INSTALL,
    ),
    "matrix": LazyVerb(
        "collectors.cli:matrix",
        "Run one pipeline across technique combinations and rank them against a baseline.",
        _COLLECT_INSTALL,
    ),
}


@click.group(cls=LazyGroup, lazy=LAZY_VERBS, context_settings=CONTEXT_SETTINGS, epilog=epilog("README.md and docs/"))
@click.version_option(__version__, prog_name="snapviz")
def cli() -> None:
    """Analyse GPU memory snapshots and traces of diffusion pipelines.

    \b
    snapviz analyze snapshot.pickle -o report.html   # why did it OOM?
    snapviz compare before/ after/ -o compare.html   # did my change help?
    snapviz check run/ --max-peak 12GiB              # gate CI on peak memory
    snapviz whatif oom.pickle                        # would other settings or cards fit?
    snapviz ranks memory_snapshot/ -o ranks.html     # which rank peaked, which OOMed first?
    snapviz collect --pipeline sdxl --technique fp16 # record a labelled run
    """


for _verb in (analyze, compare, check, trim, whatif, ranks, history):
    cli.add_command(_verb)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (``snapviz``, ``python -m snapviz``): exits with the verb's code,
    errors mapped by :mod:`snapviz.cli.errors` (one line on stderr, control characters escaped)."""
    cli.main(args=argv, prog_name="snapviz")


def run() -> NoReturn:
    """The process entry point (the ``snapviz`` script, ``python -m snapviz``): :func:`main`, then
    a normal interpreter exit with the verb's code. A reader that closed the pipe early
    (``snapviz ... | head``) gets no "Exception ignored" line from the interpreter's last flush:
    the closed stream is pointed at /dev/null first (the recipe of Python's signal docs)."""
    try:
        main()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int | str) or exc.code is None else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the descriptor was closed when Python started (>&-)
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say on it
            _to_devnull(stream)
    sys.exit(code)


def _to_devnull(stream: object) -> None:
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
