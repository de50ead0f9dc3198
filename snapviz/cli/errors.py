"""The one mapping from errors to exit codes and stderr lines (docs/design.md: 0 ok, 1 a check
failed, 2 bad input or options), for every verb and every entry point: ``snapviz``,
``python -m snapviz``, ``python -m collectors`` and click's test runner alike.

A command built with ``cls=Command`` (or the ``Group``) runs its ``main`` through
:func:`exit_codes`, so the verb code only raises :class:`InputError`/:class:`CheckFailed` (or
click's own errors) and never prints an error or calls ``sys.exit`` itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from snapviz.errors import CheckFailed, InputError, ReaderGone, error_line
from snapviz.render.output import tolerant_stdio
from snapviz.safe_text import printable


def _own_lines(text: str) -> list[str]:
    """Text snapviz or click wrote (help, usage), its lines kept: each line shown as
    :func:`printable` shows one (control characters escaped), without a length cut."""
    return [printable(line, None) for line in text.expandtabs(4).splitlines()]


def usage_error_line(exc: click.ClickException) -> str:
    """A click error as one ``snapviz: error:`` line: the lines click breaks a message into
    (``Choose from:`` and a tab-indented line per choice) joined by spaces."""
    return error_line(" ".join(part.strip() for part in exc.format_message().splitlines() if part.strip()))


def _exit(code: int, *lines: str) -> NoReturn:
    try:
        for line in lines:
            click.echo(line, err=True)
    except (OSError, ValueError):  # stderr itself is full or gone: the exit code still tells
        pass
    sys.exit(code)


def _show_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """Python's warning display, one clean line each: a library's warning (matplotlib's "Glyph
    missing" quotes the label it could not draw) may carry text from the input."""
    out = file if file is not None else sys.stderr
    if out is None:
        return
    try:
        out.write(printable(f"{os.path.basename(filename)}:{lineno}: {category.__name__}: {message}", 1000) + "\n")
    except (OSError, ValueError):
        pass


def clean_warnings() -> None:
    """Route every warning shown by this process through :func:`_show_warning`."""
    import warnings

    warnings.showwarning = _show_warning


def _reader_gone() -> NoReturn:
    """stdout's reader went away: nothing more can be said there; exit 0 quietly, with stdout
    pointed at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.exit(0)


@contextmanager
def exit_codes(unexpected_is_input_error: bool = True) -> Iterator[None]:
    """Turn what the body raises into an exit code and one clean stderr line (no traceback).

    ``unexpected_is_input_error``: an exception of no known kind is reported as one line and exit
    2 (the analyzer: a crash on a strange input is the input's fault or a bug to report). The
    collectors pass False: a crash inside torch/diffusers keeps its traceback and exits 1, and
    ``matrix`` records that variant as failed, not as unsupported (exit 2).
    """
    try:
        yield
    except click.exceptions.Exit:
        raise
    except ReaderGone:
        _reader_gone()
    except click.exceptions.Abort:
        _exit(130, "snapviz: aborted")
    except click.exceptions.NoArgsIsHelpError as exc:
        # ``snapviz`` (or a group) with nothing to do: click's help text, as click shows it.
        _exit(2, *_own_lines(exc.format_message()))
    except click.ClickException as exc:
        code = 2 if exc.exit_code not in (0, 1) else exc.exit_code
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            # The option parser's errors and a verb's own refusals alike: one line (click's
            # several message lines joined), with where the help is.
            _exit(code, f"{usage_error_line(exc)} (see '{exc.ctx.command_path} --help')")
        _exit(code, usage_error_line(exc))
    except InputError as exc:
        _exit(2, error_line(str(exc)))
    except CheckFailed as exc:
        # Gate messages quote stage names from the input: one terminal line each.
        _exit(1, *(printable(line, None) for line in str(exc).splitlines()))
    except KeyboardInterrupt:
        _exit(130, "snapviz: interrupted")
    except MemoryError:
        _exit(2, "snapviz: error: out of memory while reading the input")
    except BrokenPipeError:  # a write to stdout outside write_stdout (a library's print)
        _reader_gone()
    except OSError as exc:
        if exc.filename is None or not unexpected_is_input_error:
            raise  # no path to name: the generic report below (or the collector's traceback)
        _exit(2, error_line(f"{exc.filename}: {exc.strerror or exc}"))
    except Exception as exc:
        # One line for users; SNAPVIZ_DEBUG=1 shows the traceback.
        if not unexpected_is_input_error or os.environ.get("SNAPVIZ_DEBUG"):
            raise
        _exit(
            2,
            error_line(
                f"could not process the input ({type(exc).__name__}: {exc}); if the input is valid "
                "this is a snapviz bug: rerun with SNAPVIZ_DEBUG=1 and report it"
            ),
        )


def _run_main(
    command: click.Command,
    base_main: Callable[..., Any],
    args: Any,
    prog_name: str | None,
    complete_var: str | None,
    standalone_mode: bool,
    extra: dict[str, Any],
) -> Any:
    """click's ``main`` in non-standalone mode, its errors and return value mapped here."""
    if not standalone_mode:
        return base_main(args, prog_name, complete_var, standalone_mode=False, **extra)
    tolerant_stdio()  # a report to an ASCII or latin-1 stdout is written, not refused
    clean_warnings()
    with exit_codes(getattr(command, "unexpected_is_input_error", True)):
        rv = base_main(args, prog_name, complete_var, standalone_mode=False, **extra)
    sys.exit(rv if isinstance(rv, int) and rv else 0)


class Command(click.Command):
    """A verb whose errors map to exit codes as every snapviz verb's do, however it is run."""

    unexpected_is_input_error = True

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        return _run_main(self, super().main, args, prog_name, complete_var, standalone_mode, extra)


class CollectorCommand(Command):
    """A collectors' verb run on its own (``python -m collectors``): a crash inside the
    pipeline keeps its traceback (exit 1); through ``snapviz`` the group's mapping applies."""

    unexpected_is_input_error = False


class Group(click.Group):
    """The ``snapviz`` group: every subcommand's errors go through its mapping."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        return _run_main(self, super().main, args, prog_name, complete_var, standalone_mode, extra)
