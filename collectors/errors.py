"""The collectors' one error type for bad options: exit 2 with one line on stderr."""

from __future__ import annotations

import click

from snapviz.safe_text import printable


class OptionError(click.UsageError):
    """A bad option or technique: exit 2 with one line on stderr (no usage block; names
    from files escaped, as every snapviz error line)."""

    def show(self, file: object = None) -> None:
        click.echo(f"Error: {printable(self.format_message(), 1000)}", err=True)
