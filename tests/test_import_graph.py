"""The import graph keeps the design card's shape (docs/architecture.md): the library never imports
Dagster or the folders above it, each folder imports only those below it, and no module or stage
package imports one that imports it back, counting imports inside functions (which would hide a
circle rather than remove it). Read with `ast` from the source, so nothing is imported here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import ROOT

# Each folder may import itself and the folders after it in this list, nothing before it.
LAYERS = ("definitions", "sensors", "quality", "assets", "pipeline")
DEMO_AND_TESTS = ("testbed", "tests", "bench")
PROJECT = (*LAYERS, *DEMO_AND_TESTS)
FOLDERS = ("pipeline", "assets", "quality", "sensors", "testbed")


def _modules() -> dict[str, Path]:
    modules = {"definitions": ROOT / "definitions.py"}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _imported(tree: ast.AST) -> list[str]:
    """Every absolute module name an import statement anywhere in ``tree`` names (``from a.b import
    c`` names a.b and a.b.c: c may be a module)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (the longest existing prefix of each name)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imported(ast.parse(path.read_text(), str(path))):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def stage(module: str) -> str:
    """pipeline.<x> for the library (a stage package or a root module), the folder otherwise."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" else parts[0]


def test_the_cycle_finder_finds_a_circle_and_only_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # pipeline.splits.split imports pipeline.splits.card inside build_split (matplotlib costs ~0.5 s).
    assert "pipeline.splits.card" in graph["pipeline.splits.split"]


@pytest.mark.parametrize("folder", [*LAYERS, "testbed"])
def test_a_folder_imports_only_itself_and_the_folders_below_it(folder):
    allowed = set(LAYERS[LAYERS.index(folder) :]) if folder in LAYERS else {"testbed", "pipeline"}
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        if name.split(".")[0] != folder:
            continue
        for imported in _imported(ast.parse(path.read_text(), str(path))):
            root = imported.split(".")[0]
            if (root in PROJECT and root not in allowed) or (folder == "pipeline" and root == "dagster"):
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_no_stage_package_imports_one_that_imports_it_back():
    by_stage: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        by_stage.setdefault(stage(module), set()).update(stage(t) for t in targets if stage(t) != stage(module))
    assert cycles(by_stage) == []
