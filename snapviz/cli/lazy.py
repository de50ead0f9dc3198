"""Verbs that need optional dependencies (torch, diffusers), registered by name and imported
on first use: ``snapviz --help`` lists them without importing anything, and a verb whose
import fails is an exit-2 error naming what is missing, never a command that vanished."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click

from snapviz.cli.errors import Group
from snapviz.errors import InputError


@dataclass(frozen=True)
class LazyVerb:
    """Where a verb lives (``module:attr``), its one-line help for ``--help``, and how to install
    what it needs."""

    target: str
    short_help: str
    install: str


class LazyGroup(Group):
    """A :class:`~snapviz.cli.errors.Group` with some subcommands resolved on use."""

    def __init__(self, *args: object, lazy: dict[str, LazyVerb] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        verb = self.lazy[cmd_name]
        module, _, attr = verb.target.partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ImportError as err:
            missing = err.name or module
            raise InputError(
                f"'{ctx.command_path} {cmd_name}' cannot start: {missing} does not import ({err}); {verb.install}"
            ) from None
        if not isinstance(command, click.Command):
            raise TypeError(f"{verb.target} is not a click command")
        self.commands[cmd_name] = command  # resolved once per process
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with the lazy verbs' help taken from the map (nothing imported)."""
        names = [n for n in self.list_commands(ctx) if n not in self.commands or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        # a lazy verb's line is shortened as click shortens a loaded one's
        shown = {n: self.commands.get(n) or click.Command(n, help=self.lazy[n].short_help) for n in names}
        rows = [(n, cmd.get_short_help_str(limit)) for n, cmd in shown.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
