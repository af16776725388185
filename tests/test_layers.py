"""One house without circles (issue 19): imports run one way, down the layers declared in
pyproject.toml ([tool.importlinter]); no module imports itself back through others; nothing
inside the package imports the package root (the public facade)."""

from __future__ import annotations

import grimp
import networkx as nx
import pytest
from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

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


def test_layer_contracts_are_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True) == EXIT_STATUS_SUCCESS


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
