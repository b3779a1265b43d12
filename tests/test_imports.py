"""The project's imports point one way (model and kernels <- forward <- engine <- store <- server/cli/tools <- app):
a walk of every module's imports (ast; TYPE_CHECKING blocks left out) finds no cycle and no upward import other
than the ones docs/deviations.md lists."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("backend", "kernels", "app", "selfspec")
TOOLS = ("backend.server", "backend.bench", "backend.verify_rows", "backend.loadtest",
         "backend.calibrate", "backend.delta_sweep", "backend.gpu_check", "backend.evaluate")
# Upward imports docs/deviations.md explains (importer prefix, imported prefix).
KNOWN_UPWARD = {("kernels.bench", "backend.")}


def layer(module: str) -> int:
    """0 model, kernels and tracing; 1 forward; 2 engine; 3 store; 4 server and tools; 5 the self-speculation
    adapter's pipeline; 6 the UI; 7 the CLI, which composes the server and the UI."""
    if module == "backend.cli":
        return 7
    if module.startswith("app"):
        return 6
    if module.startswith("selfspec"):
        return 5
    if module.startswith(TOOLS):
        return 4
    if module.startswith("backend.store"):
        return 3
    if module.startswith("backend.engine"):
        return 2
    if module.startswith("backend.forward"):
        return 1
    return 0


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path) -> Iterator[str]:
    """Absolute imports of the file, outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for target in imported(path):
            while target and target not in known:  # `from backend.store import X`: the package itself
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_no_upward_import_beyond_the_documented_ones() -> None:
    upward = sorted((a, b) for a, targets in graph().items() for b in targets if layer(b) > layer(a)
                    or a.startswith("kernels.") and b.startswith("backend."))
    unexplained = [(a, b) for a, b in upward if not any(a.startswith(x) and b.startswith(y) for x, y in KNOWN_UPWARD)]
    assert unexplained == []
    stale = [(x, y) for x, y in KNOWN_UPWARD if not any(a.startswith(x) and b.startswith(y) for a, b in upward)]
    assert stale == [], "an exception has gone: drop it here and from docs/deviations.md"


def test_the_walk_sees_a_cycle_and_an_upward_import() -> None:
    """The checks themselves: a made-up graph with both faults is caught."""
    edges = {"backend.engine.a": {"backend.engine.b"}, "backend.engine.b": {"backend.engine.a", "app.ui"},
             "app.ui": set()}
    assert cycles(edges) == [["backend.engine.a", "backend.engine.b"]]
    assert layer("app.ui") > layer("backend.engine.b")
