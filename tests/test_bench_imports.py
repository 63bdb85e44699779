"""bench/ uses engine_ctl as tui and cli do: through the districts' front
doors (`from ernie_tui.engine_ctl.load import run_burst`), never their files.

Two exceptions, on purpose: bench/client_cpu.py imports load/probe.py as a
module to swap its stream reader for the measurement, and
bench/level_client_cost.py imports load/capacity_run.py to run one capacity
level directly, and once as levels ran before (asyncio's loop, the collector on).
"""

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
DISTRICTS = {"logs", "launch", "load", "control", "report", "units"}
ALLOWED = {("client_cpu.py", "ernie_tui.engine_ctl.load.probe"),
           ("level_client_cost.py", "ernie_tui.engine_ctl.load.capacity_run")}


def file_imports(root: Path = BENCH) -> list[str]:
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[:2] != ["ernie_tui", "engine_ctl"]:
                    continue
                door = len(parts) == 3 and parts[2] in DISTRICTS
                if not door and (path.name, module) not in ALLOWED:
                    found.append(f"{path.name}:{node.lineno}: {module}")
    return found


def test_bench_imports_engine_ctl_districts_only():
    found = file_imports()
    assert not found, "bench imports engine_ctl files (use the district's front door):\n" + "\n".join(found)


def test_the_check_sees_a_file_import(tmp_path):
    (tmp_path / "x.py").write_text(
        "from ernie_tui.engine_ctl.load import run_burst\n"
        "from ernie_tui.engine_ctl.load.burst import BurstConfig\n"
        "import ernie_tui.engine_ctl.logs.logparse\n"
        "from ernie_tui.engine_ctl import load\n"
    )
    assert file_imports(tmp_path) == ["x.py:2: ernie_tui.engine_ctl.load.burst",
                                      "x.py:3: ernie_tui.engine_ctl.logs.logparse",
                                      "x.py:4: ernie_tui.engine_ctl"]
