"""The import graph of ``broker`` and ``worker``: imports go down the layers, and never in a circle.

Layers, low to high: ``broker.core`` < ``broker.topics`` < ``broker.clients`` <
``broker.network`` < ``broker.operations`` < the application layer (``broker`` itself, the
re-exports of the public API; ``broker.cli``, ``broker.demo``, ``broker.pipeline``,
``broker.testing``, ``broker.__main__`` and ``worker``). Every import counts, at module level
or inside a function (a lazy import is still an arrow), and each package's ``__init__``
docstring says the same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: package prefix -> layer, low to high; the longest prefix that names a module wins.
LAYERS = {
    "broker.core": 0,
    "broker.topics": 1,
    "broker.clients": 2,
    "broker.network": 3,
    "broker.operations": 4,
    "broker.jobs": 4,
    "broker": 5,
    "worker": 5,
}
LAYER_NAMES = ["core", "topics", "clients", "network", "operations", "application"]


def _modules() -> dict[str, Path]:
    """Every module of ``broker`` and ``worker``: dotted name -> file."""
    found: dict[str, Path] = {}
    for top in ("broker", "worker"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    """The layer of a dotted module name (the longest prefix in ``LAYERS``)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def _known(name: str, modules: dict[str, Path]) -> str:
    """The module ``name`` loads: itself, else its nearest enclosing package."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The broker and worker modules ``module`` imports, anywhere in the file, with their line."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _known(alias.name, modules), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield (full if full in modules else _known(source, modules)), node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module -> first line}, for imports of ``broker`` and ``worker`` only."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(module, path, modules):
            if target in modules and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def upward_arrows(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import from a lower layer to a higher one, as ``module:line -> target (layer -> layer)``."""
    found = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            low, high = layer_of(module), layer_of(target)
            if high > low:
                found.append(f"{module}:{line} -> {target} ({LAYER_NAMES[low]} -> {LAYER_NAMES[high]})")
    return found


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative Tarjan: (node, iterator over its edges) frames, no recursion limit.
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        frames = [(start, iter(sorted(graph[start])))]
        while frames:
            node, edges = frames[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    frames.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                frames.pop()
                if frames:
                    parent = frames[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer_of(module)  # raises AssertionError naming the module


def test_no_import_goes_up_a_layer():
    assert upward_arrows(import_graph()) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_checks_can_fail():
    """The checks themselves find an upward arrow and a circle in a made-up graph."""
    graph = {
        "broker.core.keys": {"broker.operations.status": 3},
        "broker.operations.status": {"broker.topics.routing": 1},
        "broker.topics.routing": {"broker.operations.status": 9},
    }
    assert upward_arrows(graph) == [
        "broker.core.keys:3 -> broker.operations.status (core -> operations)",
        "broker.topics.routing:9 -> broker.operations.status (topics -> operations)",
    ]
    assert circles(graph) == [["broker.operations.status", "broker.topics.routing"]]


def test_lazy_imports_count(tmp_path):
    """An import inside a function is an arrow too."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from broker.operations import status\n")
    modules = {"broker.core.mod": path, "broker.operations.status": path}
    assert list(imports_of("broker.core.mod", path, modules)) == [("broker.operations.status", 2)]
