"""No module of snapviz/ reads another library's private attributes or modules, nor writes into
``sys.modules``: an upgrade of Bokeh, numba, pandas... may change those without notice.

Read from the source's syntax tree: an attribute ``_name`` (not a dunder) taken of a name bound
by importing another package, ``import pkg._private`` / ``from pkg import _private`` /
``from pkg._private import ...``, a known-private attribute name on any object, and an assignment
into ``sys.modules``. The few exceptions are listed below with the reason each is needed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SNAPVIZ = Path(__file__).resolve().parents[2] / "snapviz"

# (module as imported, private name): why it is allowed.
ALLOWED = {
    # torch documents its memory-snapshot API under these names ("Understanding CUDA Memory
    # Usage" in torch's docs): they are the only way to record the history snapviz reads.
    ("torch", "_record_memory_history"): "torch's documented snapshot API",
    ("torch", "_snapshot"): "torch's documented snapshot API",
    ("torch", "_dump_snapshot"): "torch's documented snapshot API",
    ("torch", "_set_memory_metadata"): "torch's documented snapshot API",
    # The rules' regex safety check walks the parsed pattern; the standard library has no public
    # regex parser (sre_parse, its old name, is deprecated since 3.11 and warns on import).
    ("re", "_parser"): "no public regex parser in the standard library",
    ("re", "_constants"): "no public regex parser in the standard library",
}
# Private names of libraries snapviz once read (Bokeh's property tables, numba's cache).
KNOWN_PRIVATE = {
    "_property_values",
    "_unstable_default_values",
    "_load_overload",
    "_guard_against_spurious_io_errors",
    "_cache",
    "_blas_placeholder",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def findings(source: str, where: str) -> list[str]:
    """Each private access of another package in ``source`` (one line each)."""
    tree = ast.parse(source)
    foreign: dict[str, str] = {}  # local name -> the other package's module it is bound to
    out: list[str] = []

    def flag(node: ast.AST, module: str, name: str) -> None:
        top = module.split(".")[0]
        if top != "snapviz" and (top, name) not in ALLOWED:
            out.append(f"{where}:{getattr(node, 'lineno', 0)}: {module}.{name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for i, part in enumerate(parts[1:], 1):
                    if _private(part):
                        flag(node, ".".join(parts[:i]), part)
                if parts[0] != "snapviz":
                    foreign[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "snapviz":
                continue
            for i, part in enumerate(parts[1:], 1):
                if _private(part):
                    flag(node, ".".join(parts[:i]), part)
            for alias in node.names:
                if _private(alias.name):
                    flag(node, node.module, alias.name)
                foreign[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in foreign:
                flag(node, foreign[base.id], node.attr)
            elif node.attr in KNOWN_PRIVATE and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                out.append(f"{where}:{node.lineno}: .{node.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Attribute)
                and t.value.attr == "modules"
                and isinstance(t.value.value, ast.Name)
                and t.value.value.id == "sys"
            ):
                out.append(f"{where}:{t.lineno}: a write into sys.modules")
    return out


def test_no_module_reads_another_librarys_private_names() -> None:
    found = [
        f
        for path in sorted(SNAPVIZ.rglob("*.py"))
        for f in findings(path.read_text(), str(path.relative_to(SNAPVIZ.parent)))
    ]
    assert not found, "private names of other libraries:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import bokeh.model\nx = bokeh.model.Model()._property_values",
        "from bokeh.model import Model\nModel.properties()\nm = Model()\nm._unstable_default_values",
        "import numba\nnumba.core._internal",
        "from numba.core import registry as r\nr._helper",
        "import numba._helperlib",
        "from pandas._libs import lib",
        "from numpy import _core",
        "import sys, types\nsys.modules['scipy.linalg.cython_blas'] = types.ModuleType('x')",
        "def f(kernel):\n    return kernel._cache",
    ],
)
def test_the_check_catches_private_access(source: str) -> None:
    assert findings(source, "x.py"), source


@pytest.mark.parametrize(
    "source",
    [
        "import numpy as np\nnp.asarray([1]).__array__()",
        "class A:\n    def f(self):\n        return self._own",
        "from snapviz.load import columns\ncolumns._entry_columns",
        "import torch\ntorch.cuda.memory._record_memory_history()",
    ],
)
def test_the_check_lets_public_and_own_names_pass(source: str) -> None:
    assert findings(source, "x.py") == [], source
