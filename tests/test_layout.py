"""The package's layout is its architecture (issue 31): no module imports another that imports it back,
however lazily, and the layers import only downwards, as each package's docstring says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "chaosproxy"
# what these packages must never import: what lies above them
BELOW = {
    "engine": {"adapters", "control", "drill", "report", "cli", "demo", "embedded", "client"},
    "faults": {"adapters", "control", "drill", "report", "cli", "demo", "embedded", "client"},
    "protocols": {"faults", "adapters", "control", "drill", "report", "cli", "demo", "embedded", "client"},
    "telemetry": {"adapters", "control", "drill", "report", "cli", "demo", "embedded", "client"},
    "adapters": {"control", "drill", "report", "cli", "demo", "embedded"},
    "control": {"drill", "report", "cli", "demo"},
    "cassette": {"drill", "report", "cli", "demo"},
    "report": {"engine", "adapters", "control", "drill", "cli", "demo"},
    "records": {"engine", "faults", "adapters", "control", "drill", "report", "cli", "demo"},
}
ENTRY_POINTS = {"chaosproxy.__main__", "chaosproxy.drill.fork_server"}  # the only importers of the command line


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules `name` imports when it runs: at the top and in functions, not for type checks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        parent = parent.rpartition(".")[0]
                    base = f"{parent}.{base}".rstrip(".")
                found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                             for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def strong(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in GRAPH[module]:
            if other not in index:
                strong(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                cycles.append(sorted([module, *component]))

    for module in sorted(GRAPH):
        if module not in index:
            strong(module)
    return cycles


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles() == []


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_layer_imports_nothing_above_it(package: str):
    above = BELOW[package]
    wrong = sorted(f"{name} imports {other}" for name, others in GRAPH.items()
                   if name.split(".")[1:2] == [package] for other in others if set(other.split(".")[1:2]) & above)
    assert wrong == []


def test_only_entry_points_import_the_command_line():
    assert sorted(name for name, others in GRAPH.items() if "chaosproxy.cli" in others) == sorted(ENTRY_POINTS)


def test_every_package_says_what_it_holds_and_what_it_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc or init.parent.name in {"demo", "data"}, init
