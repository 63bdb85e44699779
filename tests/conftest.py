"""Shared test set-up.

Every test runs with ERNIE_TUI_HOME in a temp dir so nothing touches the real
user config. Fixture logs are the real vLLM captures copied into
tests/fixtures/vllm-logs (see its README), so a clean clone tests on its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_support import cpu_server, tiny_model  # noqa: E402,F401  (shared real-vLLM fixtures)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vllm-logs"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads xdist_group into each test's id
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 4 --dist loadgroup`, as scripts/test.sh runs
    it when xdist is installed), every test that starts a real vLLM server
    (and every tmux test that does) goes to one worker: at most one vLLM
    server runs at a time, and the session's shared server (cpu_server) is
    started once, by that worker. A tmux test that drives a stand-in says
    `no_server` and runs on the others, most of whose tests wait on
    stand-ins' pacing. Tests that import vLLM without a server (its bench
    client, its sampler) stay in the group: beside it, their CPU (~20 s of
    imports each) slowed its servers, and a CI run's default-search test read
    ITL p99 50-54 ms on the client's own lag (2026-12-06)."""
    for item in items:
        if item.get_closest_marker("no_server"):
            continue
        if item.get_closest_marker("vllm") or item.get_closest_marker("tmux"):
            item.add_marker(pytest.mark.xdist_group("real-vllm"))
    # Longest first: xdist hands the group to one worker, then the other tests
    # out in this order, a few at a time, as workers free up. In collection
    # (file) order the slowest stand-in modules (test_tune, test_tui_*) came
    # last, and one worker ran them on alone while the others sat idle.
    items.sort(key=lambda item: _SLOW_FIRST.get(item.path.stem, len(_SLOW_FIRST)))


# The modules whose stand-in tests took longest in a CI run (`--durations`),
# slowest first; the order only spreads the work, so a stale list costs minutes,
# never a result. sort() is stable: a module's tests stay in their own order.
_SLOW_FIRST = {name: rank for rank, name in enumerate((
    "test_sweep", "test_tune", "test_ray_trials", "test_paired_sweep", "test_tui_probe", "test_parallel_sweep",
    "test_guide_blocks", "test_capacity_steady", "test_capacity", "test_tui_tune", "test_report_figures",
    "test_tui_capacity_form", "test_tui_capacity_screen"))}


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("ernie-home")
    monkeypatch.setenv("ERNIE_TUI_HOME", str(home))
    yield home


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"real vLLM fixture logs not found at {FIXTURES}")
    return FIXTURES


@pytest.fixture
def stand_in():
    """Start paced stand-ins (tests/paced_server.py ARGS) on free ports: returns
    start(*args) -> its base URL; every one started is stopped after the test."""
    procs = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        return line.split()[-1]

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)
