"""No import circle under ha/ (the HA controller issue): a module never imports, even for type checking only, a
module that imports it back through any chain. Owners see their parts; parts see owners through protocols
(ha.ports.NodeSide, ha.replicating.PrimarySide, ha.replica.BackupSide, ha.coordinated.NodeSide). Under broker/ none
at load time (the message path issue)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str], package: str = "ha", runtime_only: bool = False) -> set[str]:
    """Every module of `package` that `path` imports (`from ha import x` counts as ha.x): at run time or under
    TYPE_CHECKING, or (`runtime_only`) only what is imported when the module loads (not under TYPE_CHECKING, not in
    a function)."""
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if runtime_only and (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                    isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))):
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == package)
            visit([c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)])

    visit(ast.parse(path.read_text()).body)
    return out & known


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycles_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def graph(package: str, runtime_only: bool) -> dict[str, set[str]]:
    files = list((ROOT / package).rglob("*.py"))
    known = {module_name(p) for p in files}
    return {module_name(p): imports(p, known, package, runtime_only) - {module_name(p)} for p in files}


def test_no_import_circle_under_ha() -> None:
    assert cycles(graph("ha", runtime_only=False)) == []


def test_no_import_circle_under_broker_when_it_loads() -> None:
    """The broker's modules name each other's types for the type checker (Server <-> links), but none needs another
    that needs it back to load: the error tree (broker.errors) and the extension protocol cut the circles."""
    assert cycles(graph("broker", runtime_only=True)) == []
