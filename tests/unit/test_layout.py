"""The layering docs/design.md promises, checked on the source: load/ and analyses/ never
import render/ or the CLI, and the package imports no torch (the analyzer runs on a laptop)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from paths import ROOT

PKG = ROOT / "snapviz"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, function-local imports included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("layer", ["load", "analyses"])
def test_lower_layers_do_not_import_render_or_cli(layer: str) -> None:
    bad = {
        str(p.relative_to(PKG)): sorted(m for m in _imports(p) if m.startswith(("snapviz.render", "snapviz.cli")))
        for p in (PKG / layer).rglob("*.py")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_analyzer_never_imports_torch() -> None:
    bad = {
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if any(m == "torch" or m.startswith("torch.") for m in _imports(p))
    }
    assert not bad


def test_the_checker_sees_imports() -> None:
    """Control: the walk finds a function-local import (so the tests above can fail)."""
    src = PKG / "cli" / "analyze.py"
    assert any(m.startswith("snapviz.render") for m in _imports(src))
