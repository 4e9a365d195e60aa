"""The direction of dependencies (docs/architecture.md), checked on the source.

Every import counts, including those inside functions: an import moved into a function to dodge
a circle is still a circle for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("adapters", "flows", "tasks", "deployments")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` imports (resolved to the longest known module name)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _within_one_package(component: list[str]) -> bool:
    """Whether every module of a circle lies in one package below the top level (its
    subpackages included): e.g. the simulated desktop and its apps."""
    packages = [m.split(".")[:-1] for m in component]
    common: list[str] = []
    for parts in zip(*packages):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return len(common) >= 2


def test_no_import_circles_outside_a_single_package() -> None:
    spanning = [c for c in _cycles(_graph()) if not _within_one_package(c)]
    assert spanning == []


def test_no_import_circles_between_flow_modules() -> None:
    assert [c for c in _cycles(_graph()) if any(m.startswith("flows.") for m in c)] == []


@pytest.mark.parametrize("forbidden", ["flows", "tasks", "deployments", "prefect"])
def test_adapters_know_nothing_of_prefect_or_orchestration(forbidden: str) -> None:
    offenders = []
    for name, path in _modules().items():
        if not name.startswith("adapters"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{name} imports {n}" for n in names if n == forbidden or n.startswith(forbidden + ".")]
    assert offenders == []


def test_the_scheduling_core_and_what_it_imports_know_nothing_of_prefect() -> None:
    """flows/scheduling.py runs without Prefect (bench/pool_efficiency.py runs the product's
    scheduler on threads): neither it nor any project module it reaches imports Prefect."""
    modules, graph = _modules(), _graph()
    reached, todo = set(), ["flows.scheduling"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    offenders = [f"{name} imports {n}" for name in sorted(reached) for n in _absolute_imports(modules[name])
                 if n == "prefect" or n.startswith("prefect.")]
    assert offenders == [] and "adapters.vms.pool" in reached


def _absolute_imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
    return names


def test_the_graph_sees_real_imports() -> None:
    """The checks above would pass on an empty graph: make sure it is not one."""
    graph = _graph()
    assert "flows.pool_engine" in graph["flows.evaluate_suite"]
    assert "adapters.outcomes" in graph["adapters.waa.live"]
    assert len(graph) > 100
