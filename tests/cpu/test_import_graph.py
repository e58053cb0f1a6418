"""The house by stage: no import cycle among moebench's modules, lazy imports included, none
between its packages, and every stage importing only the stages below it (docs/architecture.md).
The graph of imports (top level and inside functions alike) is read from each file's syntax
tree; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "moebench"


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


def explicit_graph() -> dict[str, set[str]]:
    """Each module's imports as written: `from moebench import x` is an import of the package
    `moebench` itself (its __init__), which the module graph leaves out as a parent."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    out = {}
    for name, path in files.items():
        names = imports_of(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")
        out[name] = {n for n in names if n in files and n != name}
    return out


# Bottom to top. A module imports only modules of its own stage or of the stages before it.
STAGES = (
    ("base", ("moebench.errors", "moebench.choices", "moebench.failures")),
    ("record", ("moebench.record",)),
    ("fixtures", ("moebench.fixtures",)),
    ("kernel api", ("moebench.kernels.api",)),
    ("kernels", ("moebench.kernels.stock", "moebench.kernels.cuda", "moebench.kernels.peer")),
    ("registry", ("moebench.kernels",)),
    ("timing", ("moebench.timing",)),
    ("analysis", ("moebench.analysis",)),
    ("determinism", ("moebench.determinism",)),
    ("run", ("moebench.run",)),
    ("views", ("moebench.views",)),
    ("tasks", ("moebench.tasks",)),
    ("cli", ("moebench.cli", "moebench.__main__")),
    ("package", ("moebench",)),  # moebench/__init__: the library entry point (moebench.bench)
)


def stage_of(module: str) -> int:
    """The stage of `module`: the longest package prefix named in STAGES."""
    best, level = -1, None
    for i, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level is not None, f"{module} belongs to no stage"
    return level


def package_of(module: str, packages: set[str]) -> str:
    """A module's package; a loose module of moebench (errors, choices, ...) stands for itself."""
    parent = module.rpartition(".")[0]
    return module if module in packages or parent == "moebench" else parent


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


def test_every_stage_imports_only_the_stages_below_it():
    wrong = []
    for name, edges in explicit_graph().items():
        for imported in edges:
            if imported != "moebench" and stage_of(imported) > stage_of(name):
                wrong.append(f"{name} ({STAGES[stage_of(name)][0]}) imports {imported} ({STAGES[stage_of(imported)][0]})")
            if imported == "moebench" and name != "moebench.__main__":  # the package's __init__ runs the library
                wrong.append(f"{name} imports the package moebench itself")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_cycle_between_packages():
    packages = {module_name(p) for p in ROOT.rglob("__init__.py")}
    graph: dict[str, set[str]] = {}
    for name, edges in explicit_graph().items():
        mine = package_of(name, packages)
        graph.setdefault(mine, set()).update(package_of(e, packages) for e in edges)
    for k in graph:
        graph[k].discard(k)
    cycle = find_cycle(graph)
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_the_record_imports_nothing_of_moebench_but_errors():
    for name, edges in explicit_graph().items():
        if name.startswith("moebench.record"):
            outside = {e for e in edges if not e.startswith("moebench.record")} - {"moebench.errors"}
            assert not outside, f"{name} imports {sorted(outside)}"


def test_few_modules_loose_and_none_too_long():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= 8, loose
    long = [f"{p.relative_to(ROOT.parent)}: {n}" for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420]
    assert not long, long


@pytest.mark.parametrize("module, stage", [
    ("moebench.record.schema", "record"), ("moebench.kernels.registry", "registry"),
    ("moebench.kernels.cuda.nvrtc", "kernels"), ("moebench.kernels.api.arm", "kernel api"), ("moebench", "package"),
])
def test_stage_of(module, stage):
    assert STAGES[stage_of(module)][0] == stage
