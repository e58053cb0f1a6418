"""No import cycle among moebench's modules: the graph of their imports (top level and inside
functions alike), read from each file's syntax tree (nothing is imported), has no circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "moebench"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """Every name the module imports, at its top level or inside a function (a lazy import
    is a dependency all the same)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        names = imports_of(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")
        edges = set()
        for imported in names:
            # `from a.b import c`: c is a module when a file says so; importing a.b.c runs a and a.b first
            parts = imported.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in files)
        edges.discard(name)
        # a module's own packages are imported before it and are not its imports
        edges -= {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_moebench_has_no_import_cycle():
    graph = import_graph()
    assert "moebench.kernels.cuda.arms" in graph["moebench.kernels.registry"]  # the graph sees imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_cycle_finder(graph, cycle):
    assert find_cycle(graph) == cycle


def test_every_import_counts():
    tree = ast.parse("import x\nclass C:\n    import y\ndef f():\n    from .. import z\nif True:\n    from . import w\n")
    assert imports_of(tree, "pkg.sub.mod", False) == {"x", "y", "pkg", "pkg.z", "pkg.sub", "pkg.sub.w"}
