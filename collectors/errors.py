"""The collectors' one error type for bad options: exit 2 with one line on stderr."""

from __future__ import annotations

import click


class OptionError(click.UsageError):
    """A bad option or technique: exit 2 with one line on stderr, through snapviz's error
    mapping (:mod:`snapviz.cli.errors`): no usage block, names from files escaped, and a hint
    to the verb's ``--help``."""
