"""The project's imports point one way (model and kernels <- forward <- engine <- store and train <- server, bench,
calibrate <- app <- CLI <- tools, the developer scripts): a walk of every module's imports (ast; TYPE_CHECKING
blocks left out) finds no cycle and no upward import other than the ones docs/deviations.md lists, and no library
module but the CLI has a script entry of its own."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specscope", "tools")
ENTRY_POINT = ROOT / "specscope" / "backend" / "cli" / "__main__.py"
# The server and the modules behind the CLI's bench, compare and calibrate commands (verify_rows and answer_fit are
# the bench's figures; compare rates its answers with answer_fit too).
COMMANDS = ("specscope.backend.server",)
# Upward imports docs/deviations.md explains (importer prefix, imported prefix).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layer(module: str) -> int:
    """0 model, kernels and tracing; 1 forward; 2 engine; 3 store, and training (the tiny model, the self-speculation
    adapter and its head, and their data); 4 server and the CLI's bench and calibrate; 5 the UI; 6 the CLI, which
    composes the server and the UI; 7 the developer scripts (tools/), which may import anything and which nothing
    imports."""
    if module.partition(".")[0] == "tools":
        return 8
    if module.startswith("specscope.lab"):
        return 7
    if module.startswith("specscope.backend.cli"):
        return 6
    if module.startswith("specscope.app"):
        return 5
    if module.startswith(COMMANDS):
        return 4
    if module.startswith(("specscope.backend.store", "specscope.backend.train")):
        return 3
    if module.startswith("specscope.backend.engine"):
        return 2
    if module.startswith("specscope.backend.forward"):
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
            while target and target not in known:  # `from specscope.backend.store import X`: the package itself
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
                    or a.startswith("specscope.kernels.") and b.startswith("specscope.backend."))
    unexplained = [(a, b) for a, b in upward if not any(a.startswith(x) and b.startswith(y) for x, y in KNOWN_UPWARD)]
    assert unexplained == []
    stale = [(x, y) for x, y in KNOWN_UPWARD if not any(a.startswith(x) and b.startswith(y) for a, b in upward)]
    assert stale == [], "an exception has gone: drop it here and from docs/deviations.md"


def test_the_walk_sees_a_cycle_and_an_upward_import() -> None:
    """The checks themselves: a made-up graph with both faults is caught."""
    a, b, ui = "specscope.backend.engine.a", "specscope.backend.engine.b", "specscope.app.ui"
    edges = {a: {b}, b: {a, ui}, ui: set()}
    assert cycles(edges) == [[a, b]]
    assert layer(ui) > layer(b)
    assert layer("tools.compile_check") > layer("specscope.backend.cli") > layer(ui)


def script_entry(path: Path) -> bool:
    """Whether the file has an `if __name__ == "__main__":` block."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and getattr(node.test.left, "id", None) == "__name__"
               and any(getattr(c, "value", None) == "__main__" for c in node.test.comparators)
               for node in ast.walk(ast.parse(path.read_text())))


def test_no_script_entry_inside_the_package() -> None:
    """The one way into the package from a shell is the `specscope` command (and `python -m specscope.backend.cli`,
    the same main): no module has a `__main__` block, and the CLI's is the only `__main__.py`."""
    files = sorted((ROOT / "specscope").rglob("*.py"))
    assert [str(path.relative_to(ROOT)) for path in files if script_entry(path)] == []
    assert [path for path in files if path.name == "__main__.py"] == [ENTRY_POINT]
    assert script_entry(ROOT / "tools" / "compile_check.py")   # the check itself sees an entry where one is
