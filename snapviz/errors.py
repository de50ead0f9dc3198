"""Errors that map to exit codes (docs/design.md: 2 = bad input or options)."""

from __future__ import annotations

from snapviz.safe_text import printable

# An error line quotes paths and names from the input; this much of it is shown.
MAX_ERROR_CHARS = 1000


class InputError(Exception):
    """The input file or an option is unusable; the CLI prints one line and exits 2."""


class ReaderGone(Exception):
    """Standard output is a pipe whose reader went away (``snapviz ... | head``): as Unix tools
    do, the CLI stops quietly with exit 0 (the reader asked for no more)."""


class CheckFailed(Exception):
    """A gate (``check``, ``compare --fail-...``) failed; the CLI exits 1."""


def error_line(message: str) -> str:
    """``snapviz: error: <message>`` as exactly one terminal line: newlines and control
    characters from file-derived names escaped, the message clipped."""
    return "snapviz: error: " + printable(message, MAX_ERROR_CHARS)
