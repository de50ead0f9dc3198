"""snapviz.cli's shared pieces on their own: the one error mapping, the lazy verbs, the output rules."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from snapviz.cli import LAZY_VERBS, cli
from snapviz.cli.errors import CollectorCommand, Command
from snapviz.cli.lazy import LazyGroup, LazyVerb
from snapviz.cli.outputs import route_by_extension
from snapviz.errors import CheckFailed, InputError


def _verb(exc: BaseException, cls: type[click.Command] = Command) -> click.Command:
    @click.command(cls=cls)
    def verb() -> None:
        raise exc

    return verb


@pytest.mark.parametrize(
    "exc,code,line",
    [
        (InputError("x.pickle: no such file"), 2, "snapviz: error: x.pickle: no such file"),
        (CheckFailed("FAIL peak\nFAIL stage"), 1, "FAIL peak\nFAIL stage"),
        (
            FileNotFoundError(2, "No such file or directory", "/no/dir"),
            2,
            "snapviz: error: /no/dir: No such file or directory",
        ),
        (
            RuntimeError("boom\nsecond line"),
            2,
            "snapviz: error: could not process the input (RuntimeError: boom\\nsecond "
            "line); if the input is valid this is a snapviz bug: rerun with "
            "SNAPVIZ_DEBUG=1 and report it",
        ),
        (click.UsageError("bad option"), 2, "snapviz: error: bad option (see 'verb --help')"),
        (MemoryError(), 2, "snapviz: error: out of memory while reading the input"),
    ],
)
def test_one_mapping_from_errors_to_exit_codes(exc: BaseException, code: int, line: str) -> None:
    res = CliRunner().invoke(_verb(exc), [], prog_name="verb")
    assert (res.exit_code, res.stderr.rstrip("\n"), res.stdout) == (code, line, "")


def test_a_collector_crash_keeps_its_traceback_but_bad_options_are_mapped() -> None:
    res = CliRunner().invoke(_verb(RuntimeError("CUDA kernel failed"), CollectorCommand), [])
    assert res.exit_code == 1 and isinstance(res.exception, RuntimeError)  # matrix: "failed", not "unsupported"
    res = CliRunner().invoke(_verb(InputError("--out x: exists"), CollectorCommand), [])
    assert (res.exit_code, res.stderr) == (2, "snapviz: error: --out x: exists\n")


def test_subcommands_go_through_the_groups_mapping() -> None:
    res = CliRunner().invoke(cli, ["check", "nope.pickle"])
    assert (
        res.exit_code == 2 and res.stderr.startswith("snapviz: error: nothing to check") and res.stderr.count("\n") == 1
    )
    res = CliRunner().invoke(cli, ["analyze"], prog_name="snapviz")  # click's own usage error: one line
    assert (
        res.exit_code == 2
        and res.stderr == "snapviz: error: Missing argument 'INPUT'. (see 'snapviz analyze --help')\n"
    )


def test_no_arguments_show_the_help_with_its_lines() -> None:
    """Issue 21: ``snapviz`` alone printed its help as one line of literal \\n, cut at 1,136 chars."""
    res = CliRunner().invoke(cli, [], prog_name="snapviz")
    assert res.exit_code == 2 and "\\n" not in res.stderr and "chars)" not in res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == "Usage: snapviz [OPTIONS] COMMAND [ARGS]..."
    names = cli.list_commands(click.Context(cli))
    assert [ln.split()[0] for ln in lines if ln.startswith("  ") and ln.split()[0] in names] == names
    assert lines[-1].startswith("  Docs:")


@pytest.mark.parametrize("verb", ["collect", "matrix"])
def test_a_missing_required_option_is_one_error_line(verb: str) -> None:
    """Issue 21: ``collect``/``matrix`` without --pipeline printed one garbled line with literal \\n
    and \\t; it is one readable line: click's message lines joined, the choices listed, the help pointer."""
    res = CliRunner().invoke(cli, [verb], prog_name="snapviz")
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and "\\n" not in res.stderr and "\\t" not in res.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "snapviz: error: Missing option '--pipeline'. Choose from: sd15, sdxl"
    )
    assert lines[0].endswith(f"(see 'snapviz {verb} --help')")


def test_a_usage_error_still_escapes_control_characters() -> None:
    res = CliRunner().invoke(cli, ["analyze", "x", "--device", "1\x1b[31m\nfake"], prog_name="snapviz")
    assert res.exit_code == 2 and "\x1b" not in res.stderr and "\\x1b" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("snapviz: error: Invalid value for '--device'")


def test_lazy_verbs_are_listed_without_import_and_fail_clearly() -> None:
    group = LazyGroup(
        "g",
        lazy={
            "gone": LazyVerb(
                "snapviz_no_such_module:verb", "A verb whose module is missing.", "pip install snapviz-gone"
            )
        },
    )
    res = CliRunner().invoke(group, ["--help"])
    assert res.exit_code == 0 and "gone  A verb whose module is missing." in res.stdout
    res = CliRunner().invoke(group, ["gone", "--help"], prog_name="snapviz")
    assert res.exit_code == 2
    assert res.stderr == (
        "snapviz: error: 'snapviz gone' cannot start: snapviz_no_such_module does not import "
        "(No module named 'snapviz_no_such_module'); pip install snapviz-gone\n"
    )


def test_lazy_help_lines_match_the_verbs() -> None:
    """The map's one-line help is the verb's own first docstring line (they cannot drift)."""
    import collectors.cli

    for name, verb in LAZY_VERBS.items():
        command = getattr(collectors.cli, verb.target.partition(":")[2])
        assert command.name == name and (command.help or "").splitlines()[0] == verb.short_help


def test_dash_o_routes_by_extension() -> None:
    kw: dict[str, str | None] = {"html_out": "r.md", "md_out": None}
    extra: dict[str, str | None] = {"png_out": None}
    route_by_extension(kw, extra)
    assert kw == {"html_out": None, "md_out": "r.md"}
    kw, extra = {"html_out": "r.png"}, {"png_out": None}
    route_by_extension(kw, extra)
    assert (kw, extra) == ({"html_out": None}, {"png_out": "r.png"})
    with pytest.raises(InputError, match="give one"):
        route_by_extension({"html_out": "a.json", "json_out": "b.json"}, {})


def test_every_verb_refuses_the_same_output_paths(tmp_path: Path) -> None:
    """One checker: an output that is an input is refused the same way by every verb."""
    src = tmp_path / "in.pickle"
    src.write_bytes(b"")
    for args in (
        ["analyze", str(src), "--json", str(src)],
        ["compare", str(src), str(src), "--json", str(src)],
        ["check", str(src), "--max-peak", "1GiB", "--junit-xml", str(src)],
        ["trim", str(src), "--top", "1", "-o", str(src)],
    ):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, (args, res.stderr)
        assert "is an input of this command (or the same file); writing it would destroy the input" in res.stderr, args
    res = CliRunner().invoke(cli, ["analyze", str(src), "--json", "-", "--markdown", "-"])
    assert res.exit_code == 2 and "only one output can go to stdout" in res.stderr


@pytest.mark.parametrize(
    "verb",
    [
        ["analyze", "in.pickle"],
        ["compare", "a.pickle", "b.pickle"],
        ["matrix", "--pipeline", "sd15", "--device", "cpu"],
    ],
)
def test_an_unknown_output_extension_is_refused_before_any_work(tmp_path: Path, verb: list[str]) -> None:
    """Issue 21: ``-o x.pdf`` wrote HTML into x.pdf. Refused (one line, the known extensions named)
    before the input is even opened: the input files here do not exist."""
    out = tmp_path / "x.pdf"
    res = CliRunner().invoke(cli, [*verb, "-o", str(out)], prog_name="snapviz")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert f"-o {out}: " in res.stderr and ".html" in res.stderr
    if verb[0] != "matrix":
        assert res.stderr.rstrip().endswith("the extension picks it: .html, .md, .markdown, .json, .png, .svg")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_html_names_and_names_without_extension_stay_html() -> None:
    from snapviz.cli.outputs import refuse_unknown_format

    for name in ("r.html", "r.HTM", "report"):
        kw: dict[str, str | None] = {"html_out": name, "md_out": None, "json_out": None}
        route_by_extension(kw, {"png_out": None, "svg_out": None})
        refuse_unknown_format(kw, {"png_out": None, "svg_out": None})
        assert kw["html_out"] == name
    with pytest.raises(InputError, match=r"-o r.pdf: unknown output format '.pdf'; the extension picks it: .html, .md"):
        refuse_unknown_format({"html_out": "r.pdf", "md_out": None}, {})
