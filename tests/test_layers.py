"""One house without circles (issue 19): imports run one way, down the layers declared in
pyproject.toml ([tool.importlinter]); no module imports itself back through others; nothing
inside the package imports the package root (the public facade). Imports sit at the top of
their module; one inside a function says why (``# lazy: <reason>``), and the CLI's module stays
free of torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from typing import Iterator

import grimp
import networkx as nx
import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    imports = grimp.build_graph("kernel_lens", exclude_type_checking_imports=False)
    g = nx.DiGraph()
    for module in imports.modules:
        g.add_node(module)
        for imported in imports.find_modules_directly_imported_by(module):
            g.add_edge(module, imported)
    return g


def test_layer_contracts_are_kept():
    # In a process of its own: import-linter configures logging (it disables the loggers that
    # exist), which would silence kernel_lens's log records for every later test here.
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, "
            "no_cache=True, no_logo=True))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_no_import_circle(graph):
    circles = list(nx.simple_cycles(graph))
    assert circles == [], f"import circles: {circles[:5]}"


def test_nothing_inside_imports_the_package_root(graph):
    assert sorted(graph.predecessors("kernel_lens")) == []


def test_every_folder_is_a_package(graph):
    """A folder without __init__.py is a namespace package: grimp (and the contracts) skip it."""
    src = ROOT / "src" / "kernel_lens"
    folders = [p for p in src.rglob("*") if p.is_dir() and any(p.glob("*.py"))]
    assert [str(p.relative_to(src)) for p in folders if not (p / "__init__.py").exists()] == []


_LAZY = re.compile(r"#\s*lazy:\s*\S")
_IMPORTS = (ast.Import, ast.ImportFrom)


def _function_imports(node: ast.AST, inside: bool = False) -> Iterator[tuple[ast.stmt, ast.stmt]]:
    """(import, first import of its block) for every import statement in a function or method
    body, at any depth; a block is a run of import statements one after another."""
    inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    for _, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        for i, child in enumerate(children):
            if not isinstance(child, ast.AST):
                continue
            if inside and isinstance(child, _IMPORTS):
                first = i
                while first > 0 and isinstance(children[first - 1], _IMPORTS):
                    first -= 1
                yield child, children[first]
            yield from _function_imports(child, inside)


def test_every_function_level_import_says_why():
    """A lazy import carries ``# lazy: <reason>`` on its own line(s) or on the comment line
    directly above the first import of its block; any other import goes to the module top."""
    src = ROOT / "src" / "kernel_lens"
    unexplained, checked = [], 0
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for stmt, first in _function_imports(ast.parse(text, str(path))):
            checked += 1
            own = lines[stmt.lineno - 1:stmt.end_lineno]
            above = lines[first.lineno - 2].strip() if first.lineno > 1 else ""
            if not any(_LAZY.search(line) for line in own) and not _LAZY.match(above):
                unexplained.append(f"{path.relative_to(ROOT)}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}")
    assert checked > 0  # the walk finds function-level imports at all
    assert unexplained == [], "function-level imports without a '# lazy: <reason>' comment:\n" + \
        "\n".join(unexplained)


def test_importing_the_cli_imports_no_torch():
    """``kernel_lens --version`` / ``--help`` import kernel_lens.cli: torch (seconds) stays out."""
    code = ("import sys\n"
            "import kernel_lens.cli\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
