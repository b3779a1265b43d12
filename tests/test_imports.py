"""The project's imports point one way, package by package: model, kernels and the modules loose in backend/ <-
forward <- engine <- store and train <- server <- app <- CLI <- lab (the measurement lab) <- tools (the developer
scripts). A module's layer is its package's, read off the layout: the folder it lies in under specscope/ or
specscope/backend/ (and tools/). Every package on disk has a row in LAYERS, so a new one is placed before anything
imports it. A walk of every module's imports (ast, `if TYPE_CHECKING:` blocks too: a type-only import ties two modules
as much as any) finds no cycle and no import of a module in a higher row or in another package of the same row.
So nothing in the product imports the lab: the CLI names the lab's commands by module (cli.COMMANDS) and imports one
only when it runs. No library module but the CLI has a script entry of its own."""
from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specscope", "tools")
ENTRY_POINT = ROOT / "specscope" / "backend" / "cli" / "__main__.py"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specscope", "specscope.backend", "specscope.backend.model", "specscope.kernels"),
    ("specscope.backend.forward",),
    ("specscope.backend.engine",),
    ("specscope.backend.store", "specscope.backend.train"),
    ("specscope.backend.server",),
    ("specscope.app",),
    ("specscope.backend.cli",),
    ("specscope.lab",),
    ("tools",),
)
"""The packages, lowest first. "specscope" and "specscope.backend" stand for the modules loose in those folders
(tracing.py, bench_cells.py: values and schemas that import nothing of the project's)."""
PRODUCT = tuple(p for row in LAYERS[:LAYERS.index(("specscope.lab",))] for p in row)


def packages_on_disk() -> set[str]:
    """specscope and tools, every package folder directly under specscope/ and specscope/backend/, and
    specscope.backend itself (its loose modules)."""
    found = {"specscope", "tools", "specscope.backend"}
    for parent in (ROOT / "specscope", ROOT / "specscope" / "backend"):
        for init in parent.glob("*/__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def package(module: str) -> str:
    """The package a module belongs to: the longest package of LAYERS its name starts with."""
    names = [p for row in LAYERS for p in row if module == p or module.startswith(p + ".")]
    return max(names, key=len)


def layer(module: str) -> int:
    """The row of LAYERS that holds the module's package."""
    found = package(module)
    return next(i for i, row in enumerate(LAYERS) if found in row)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path) -> Iterator[str]:
    """Absolute imports of the file, wherever they are (function bodies and `if TYPE_CHECKING:` blocks too); for
    `from X import Y`, X.Y as well, which names a module where Y is one."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for target in imported(path):
            while target and target not in known:  # `from specscope.backend.store import X`, X a name
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


def test_every_package_has_a_layer() -> None:
    assert packages_on_disk() == {p for row in LAYERS for p in row}
    assert all(package(name) for name in modules())


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_imports_point_down() -> None:
    """A module imports its own package and the packages of lower rows only."""
    wrong = sorted((a, b) for a, targets in graph().items() for b in targets
                   if package(a) != package(b) and layer(b) >= layer(a))
    assert wrong == []


def test_the_product_never_imports_the_lab() -> None:
    """What the import rule above implies, stated: the lab's commands are named, not imported, by the CLI."""
    from specscope.backend.cli import COMMANDS
    assert not [(a, b) for a, targets in graph().items() for b in targets
                if package(a) in PRODUCT and package(b) == "specscope.lab"]
    lab = {name for name, (module, _) in COMMANDS.items() if module.startswith("specscope.lab.")}
    assert {"bench", "sweep", "gpu-check", "calibrate", "throughput", "loadtest", "bench-kernels"} <= lab
    assert all(module in modules() for module, _ in COMMANDS.values())


def test_the_values_the_ui_shares_need_no_torch() -> None:
    """The speedup's arithmetic, the cost curve, the lossless verdict, the trace schema and the bench table's cells
    load without torch, so the app can show them beside a remote backend."""
    shared = ("specscope.backend.engine.speedup", "specscope.backend.engine.cost_curve",
              "specscope.backend.engine.lossless", "specscope.backend.tracing", "specscope.backend.bench_cells")
    code = f"import sys\nfor m in {shared!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_the_walk_sees_a_cycle_and_an_upward_import() -> None:
    """The checks themselves: a made-up graph with both faults is caught, a type-only import counts, and the
    layers follow the layout."""
    a, b, ui = "specscope.backend.engine.a", "specscope.backend.engine.b", "specscope.app.ui"
    edges = {a: {b}, b: {a, ui}, ui: set()}
    assert cycles(edges) == [[a, b]]
    assert layer(ui) > layer(b)
    assert layer("tools.compile_check") > layer("specscope.lab.bench") > layer("specscope.backend.cli") > layer(ui)
    assert layer("specscope.backend.tracing") == layer("specscope.kernels.gate") < layer(a)
    assert package("specscope.backend.engine.modes.ar") == "specscope.backend.engine"
    typing_only = ROOT / "specscope" / "backend" / "engine" / "modes" / "base.py"
    assert "specscope.backend.engine.runtime" in set(imported(typing_only))


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
