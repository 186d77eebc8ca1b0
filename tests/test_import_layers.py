"""The package's import layers, read from the source with ``ast``.

:func:`import_graph` lists, for every module of ``ctxkeep``, the ``ctxkeep`` modules it imports:
at module level and inside functions alike (an import in a function still ties the two modules
together; it only defers the circle to run time), but not under ``if TYPE_CHECKING:``. An
import names the module it names: ``from ctxkeep.server import routes`` is an edge to
``ctxkeep.server.routes``, ``from ctxkeep.server.app import create_app`` to
``ctxkeep.server.app``; the parent packages Python also initialises are not edges.

:func:`cycles` finds the import circles among a set of modules. A rule is a test over these two:
add one per layer below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import ctxkeep

PACKAGE_DIR = Path(ctxkeep.__file__).parent
PACKAGE = "ctxkeep"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, but those under TYPE_CHECKING."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports_in(child)
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]
) -> Iterator[str]:
    """The ctxkeep modules one import statement names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                yield alias.name
        return
    if node.level:  # relative: from the module's package, up level - 1
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    if source != PACKAGE and not source.startswith(PACKAGE + "."):
        return
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        yield sub if sub in known else source


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Every ``ctxkeep`` module and the ``ctxkeep`` modules it imports (itself excluded)."""
    paths = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    known = set(paths)
    graph: dict[str, frozenset[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = {
            target
            for node in _imports(tree)
            for target in _targets(node, module, is_package, known)
            if target in known and target != module
        }
        graph[module] = frozenset(edges)
    return graph


def modules_under(prefix: str) -> set[str]:
    """The modules of ``prefix`` (a package's dotted name) and below it."""
    return {m for m in import_graph() if m == prefix or m.startswith(prefix + ".")}


def cycles(graph: dict[str, frozenset[str]], modules: Iterable[str]) -> list[list[str]]:
    """The import circles among ``modules``: each strongly connected component of the graph
    restricted to them with more than one module, sorted (Tarjan's algorithm).
    """
    nodes = set(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ()) & nodes):
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
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found)


# -- the helpers themselves ----------------------------------------------------------------------


def test_the_graph_sees_module_level_function_level_and_relative_imports() -> None:
    graph = import_graph()
    assert "ctxkeep.messages" in graph["ctxkeep.sessions.records"]  # module level
    assert "ctxkeep.server.app" in graph["ctxkeep.server"]  # in a function (lazy)
    assert "ctxkeep.server.routes" in graph["ctxkeep.server.app"]


def test_the_graph_leaves_out_type_checking_imports() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ctxkeep.tokens\n"
    assert [n for n in _imports(ast.parse(source)) if isinstance(n, ast.Import)] == []


def test_cycles_finds_a_circle_and_only_among_the_modules_given() -> None:
    graph = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a"}),
        "d": frozenset({"a"}),
    }
    assert cycles(graph, "abcd") == [["a", "b", "c"]]
    assert cycles(graph, "abd") == []


# -- the rules -------------------------------------------------------------------------------------


def test_no_import_circle_among_the_server_modules() -> None:
    found = cycles(import_graph(), modules_under("ctxkeep.server"))
    assert found == [], f"import circles among ctxkeep.server modules: {found}"


def test_the_server_routes_never_import_the_app() -> None:
    graph = import_graph()
    routes = {m for m in modules_under("ctxkeep.server") if m.split(".")[-1].startswith("routes")}
    routes.add("ctxkeep.server.inspector")
    assert {m for m in routes if "ctxkeep.server.app" in graph[m]} == set()


def test_sessions_import_nothing_of_the_pruner() -> None:
    """Storage and session policy under ``ctxkeep.sessions``; how a prompt reads a session is
    the pruner's (``ctxkeep.prune.read`` over ``MemoryManager.reads``), never the other way.
    """
    graph = import_graph()
    above = modules_under("ctxkeep.prune") | {"ctxkeep.cache", "ctxkeep.foldstate"}
    found = {m: sorted(graph[m] & above) for m in modules_under("ctxkeep.sessions")}
    assert {m: t for m, t in found.items() if t} == {}


def test_no_import_circle_among_the_pruner_its_fold_and_the_sessions() -> None:
    modules = (
        modules_under("ctxkeep.prune")
        | modules_under("ctxkeep.sessions")
        | modules_under("ctxkeep.builder")
        | {"ctxkeep.cache", "ctxkeep.foldstate", "ctxkeep.anthropic_cache"}
    )
    found = cycles(import_graph(), modules)
    assert found == [], f"import circles: {found}"
