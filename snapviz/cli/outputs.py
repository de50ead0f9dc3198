"""The one output-path rule set of every verb (analyze, compare, check, trim, matrix).

* ``-o FILE`` picks the format by its extension, as profilers do (.html/.htm or no extension: HTML);
  any other extension (``-o x.pdf``) is refused before any work, naming the ones there are;
* every output path is checked before any work (:func:`snapviz.render.output.check_outputs`:
  ``-`` once at most, never an input or a file of an input run directory, only regular files,
  a writable directory), so a bad path costs no analysis and leaves nothing behind;
* all outputs of a command are written together, atomically (:func:`write_outputs`);
* when an output goes to stdout the terminal summary is left out (stdout is that file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from snapviz.errors import InputError
from snapviz.render.output import STDOUT, check_outputs, say, write_outputs, write_stdout
from snapviz.safe_text import printable

# The verbs' parameter names of the usual outputs and the flags that name them in errors.
FLAGS = {
    "html_out": "-o",
    "md_out": "--markdown",
    "json_out": "--json",
    "png_out": "--png",
    "svg_out": "--svg",
    "perfetto_out": "--perfetto",
    "junit_out": "--junit-xml",
    "out": "-o",
}

# ``-o FILE`` by extension; .html/.htm (or none) is HTML; any other extension is refused.
_BY_EXTENSION = {".md": "md_out", ".markdown": "md_out", ".json": "json_out", ".png": "png_out", ".svg": "svg_out"}
_HTML_EXTENSIONS = ("", ".html", ".htm")


def _extension(path: str) -> str:
    return "" if path == STDOUT else os.path.splitext(path)[1].lower()


def require_html_name(flag: str, path: str | None) -> None:
    """Refuse (exit 2, before any work) an HTML-only output whose name says another format."""
    if path and _extension(path) not in _HTML_EXTENSIONS:
        raise InputError(f"{flag} {path}: writes an HTML report; name it .html (other formats have their own options)")


def route_by_extension(kw: dict[str, Any], extra: dict[str, Any]) -> None:
    """Move ``-o`` (``html_out``) to the output its extension names, in place: into ``kw`` for
    the verb's own outputs, into ``extra`` for the picture options a decorator added."""
    out = kw.get("html_out")
    if not out:
        return
    ext = _extension(out)
    key = _BY_EXTENSION.get(ext)
    if key is None:
        return  # HTML, or a format there is none of: refuse_unknown_format, after the path checks
    target = extra if key in extra else kw
    if target.get(key):
        raise InputError(f"-o {out} and {FLAGS[key]} {target[key]} both ask for the {ext[1:]} output; give one")
    target[key] = out
    kw["html_out"] = None


def refuse_unknown_format(kw: dict[str, Any], extra: dict[str, Any]) -> None:
    """Refuse ``-o`` naming a format snapviz does not write (``-o x.pdf``): exit 2, one line naming
    the extensions there are, before any work (after :func:`check`, so that ``-o INPUT`` is
    refused for what it would destroy)."""
    out = kw.get("html_out")
    ext = _extension(out) if out else ""
    if ext not in _HTML_EXTENSIONS:
        known = ", ".join([".html", *(e for e, k in _BY_EXTENSION.items() if k in kw or k in extra)])
        raise InputError(f"-o {out}: unknown output format '{ext}'; the extension picks it: {known}")


def check(outputs: dict[str, str | None], inputs: Sequence[str | None]) -> None:
    """Refuse bad output paths (exit 2, one line) before any work. ``outputs``: parameter name
    (or flag) -> path; ``inputs``: the command's input paths, which no output may replace."""
    check_outputs([(FLAGS.get(k, k), v) for k, v in outputs.items()], inputs=[i for i in inputs if i])


def to_stdout(*paths: str | None) -> bool:
    return STDOUT in paths


def emit(outputs: Sequence[tuple[str, str | bytes]], terminal: Callable[[], str] | None, quiet: bool) -> list[str]:
    """Write ``outputs`` together; then, unless quiet or stdout is taken by one of them, print
    the terminal summary and a ``wrote PATH`` line per file. Returns the files written."""
    # The terminal text is made before anything is written: no step that can fail comes after
    # the first output file is in place.
    show = not quiet and not to_stdout(*(p for p, _ in outputs))
    text = terminal() if show and terminal is not None else None
    written = write_outputs(outputs)
    if show:
        if text is not None:
            write_stdout(text)
        for path in written:
            say(f"  wrote {printable(path, None)}")
    return written
