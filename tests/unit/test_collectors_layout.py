"""The collectors' import graph: no cycles (function-local imports count too), and only the
command module (collectors/cli.py) uses snapviz's command-line pieces; the rest uses its library."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import ROOT

REPO = ROOT
PKG = REPO / "collectors"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports at run time, at any depth of the file (function-local
    too; relative names resolved). ``if TYPE_CHECKING:`` blocks only name types: left out."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from . import matrix`
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        if mod.endswith("__main__"):  # entry points: nothing imports them
            continue
        graph[mod] = {m for m in _imports(path) if m in files and m != mod and not m.endswith("__main__")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_collectors_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert "collectors.matrix.runner" in graph and "collectors.recorder" in graph  # the walk saw them
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# The collectors' verbs are snapviz verbs: their command modules share snapviz.cli's error mapping,
# output checks and options. Everything else in collectors/ is library and stays free of the CLI.
COMMAND_MODULES = {"collectors.cli", "collectors.fit.cli"}


def test_collectors_library_does_not_use_the_cli() -> None:
    users = set()
    for path in PKG.rglob("*.py"):
        if any(m.startswith(("snapviz.cli", "snapviz.__main__")) for m in _imports(path)):
            users.add(_module_name(path))
    assert users == COMMAND_MODULES  # == : the walk sees the command module's imports (the test can fail)


def test_sample_recording_scripts_are_not_in_the_package() -> None:
    assert not (PKG / "samples.py").exists() and not (PKG / "train_samples.py").exists()
    assert (REPO / "sample_snapshots" / "record_samples.py").is_file()
