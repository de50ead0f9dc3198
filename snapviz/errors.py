"""Errors that map to exit codes (DESIGN.md: 2 = bad input or options)."""
from __future__ import annotations


class InputError(Exception):
    """The input file or an option is unusable; the CLI prints one line and exits 2."""


class CheckFailed(Exception):
    """A gate (``check``, ``compare --fail-...``) failed; the CLI exits 1."""
