"""No import circle among the project's modules, type-only imports counted.

A small AST walk over src/ builds the graph from what each module imports
while it is imported: statements at module level, including those inside a
module-level `if`/`try`/`with` and class bodies, and including
`if TYPE_CHECKING:` blocks. Type-only imports count: a circle through them
still ties two modules so that neither can be read, moved or tested alone,
and the next "just this one name at run time" makes it real. (A typed `app`
on a screen goes through tui/app_protocol.py for this reason.) Imports
inside a function body run later and are left out; tests/test_lazy_imports.py
holds each of them to a `# lazy: why` comment.

An edge goes to the module named: `from pkg import name` goes to pkg.name
where that is a module, else to pkg (its __init__). Parent packages that
Python runs on the way are not edges (a package's __init__ importing its
own children would make every package a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "ernie_tui"


def _modules(src: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _import_time_statements(body: list[ast.stmt]):
    """Statements run when the module is imported (not function bodies)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _import_time_statements(inner)
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _import_time_statements(handler.body)


def _targets(stmt: ast.stmt, module: str, is_package: bool, known: set[str]) -> set[str]:
    if isinstance(stmt, ast.Import):
        return {a.name for a in stmt.names if a.name in known}
    if not isinstance(stmt, ast.ImportFrom):
        return set()
    if stmt.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (stmt.level - 1)]
        source = ".".join(base + ([stmt.module] if stmt.module else []))
    else:
        source = stmt.module or ""
    out = set()
    for alias in stmt.names:
        if f"{source}.{alias.name}" in known:
            out.add(f"{source}.{alias.name}")
        elif source in known:
            out.add(source)
    return out


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(src, package)
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for stmt in _import_time_statements(tree.body):
            edges |= _targets(stmt, name, path.name == "__init__.py", known)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        # (recursive: the tree's import depth is a few dozen at most)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_circle_in_the_tree():
    graph = import_graph()
    assert len(graph) > 100  # (the walk found the tree)
    found = circles(graph)
    assert not found, "import circles (type-only imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_walk_sees_a_type_only_circle_and_skips_function_bodies(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import c\n")  # a package importing its child: no circle
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n"
                              "    from pkg.b import B\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "sub" / "c.py").write_text("import pkg.d\n"
                                      "try:\n"
                                      "    from ..e import x\n"
                                      "except ImportError:\n"
                                      "    x = None\n")
    (pkg / "d.py").write_text("def f():\n"
                              "    from pkg.sub import c\n"
                              "    return c\n")
    (pkg / "e.py").write_text("class K:\n"
                              "    from pkg.sub.c import x\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.d"] == set()  # the function-local import is no edge
    assert graph["pkg.sub.c"] == {"pkg.d", "pkg.e"}
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.e", "pkg.sub.c"]]
