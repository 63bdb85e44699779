"""A function-local import of the project's own modules says why it is lazy.

Imports of ernie_tui belong at module level, where the import graph (and
import-linter) sees them and a circle shows at once. One inside a function
is kept only for a reason written next to it as a `# lazy: why` comment
(start-up of `ernie-tui --help`, a spawned child that needs little, an
optional dependency, a real cycle): on the import itself or on the line
above a run of such imports.
"""

import ast
from pathlib import Path

import grimp  # import-linter's graph builder

SRC = Path(__file__).resolve().parent.parent / "src" / "ernie_tui"


def _own(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.ImportFrom):
        return stmt.level > 0 or (stmt.module or "").split(".")[0] == "ernie_tui"
    if isinstance(stmt, ast.Import):
        return any(a.name.split(".")[0] == "ernie_tui" for a in stmt.names)
    return False


def _runs(body: list[ast.stmt]):
    """Consecutive runs of own imports in one statement list."""
    run: list[ast.stmt] = []
    for stmt in body:
        if _own(stmt):
            run.append(stmt)
            continue
        if run:
            yield run
            run = []
    if run:
        yield run


def unexplained_lazy_imports(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    body = getattr(node, field, None)
                    if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                        continue
                    for run in _runs(body):
                        first, last = run[0].lineno, run[-1].end_lineno or run[-1].lineno
                        if not any("# lazy:" in line for line in lines[first - 2:last]):
                            found.append(f"{path.relative_to(root.parent)}:{first}: {lines[first - 1].strip()}")
    return sorted(set(found))


def test_every_function_local_import_says_why():
    found = unexplained_lazy_imports()
    assert not found, ("function-local imports of ernie_tui without a `# lazy: why` comment "
                       "(move them to module level or say why):\n" + "\n".join(found))


def test_the_check_sees_an_unexplained_one(tmp_path):
    pkg = tmp_path / "ernie_tui"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "def f():\n"
        "    from ernie_tui.b import x\n"
        "    return x\n"
        "def g():\n"
        "    # lazy: a spawned child needs only this\n"
        "    from ernie_tui.b import y\n"
        "    from ernie_tui.c import z\n"
        "    return y, z\n"
        "def h():\n"
        "    import json\n"
        "    return json\n"
    )
    assert unexplained_lazy_imports(pkg) == ["ernie_tui/a.py:2: from ernie_tui.b import x"]


def _circles(graph, modules) -> list[str]:
    circles = []
    for module in sorted(modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(imported=module, importer=imported):
                circles.append(f"{module} -> {imported} -> ... -> {module}")
    return circles


def test_no_import_circle_among_the_projects_modules():
    """No module imports (at any depth) a module that imports it back at run
    time, by import-linter's own graph. (Type-only imports are left out here;
    tests/test_import_circles.py counts them too, over the whole tree.)"""
    graph = grimp.build_graph("ernie_tui", exclude_type_checking_imports=True)
    circles = _circles(graph, graph.modules)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_circle_through_engine_ctl_or_presets_even_for_type_checking():
    """engine_ctl and presets have no circle at all, counting type-only imports."""
    graph = grimp.build_graph("ernie_tui")
    below = [m for m in graph.modules if m.startswith(("ernie_tui.engine_ctl", "ernie_tui.presets"))]
    circles = _circles(graph, below)
    assert not circles, "import circles:\n" + "\n".join(circles)
