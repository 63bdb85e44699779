"""Process control against real vLLM (CPU build) with the tiny stand-in model."""

from __future__ import annotations

import threading
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ernie_tui.engine_ctl.control.server import ServerState
from ernie_tui.engine_ctl.load import burst as B
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.presets import load_presets
from vllm_support import EAGER, READY_TIMEOUT, free_port, start_server, tiny_model_dir

pytestmark = pytest.mark.vllm


def kv_tokens_from_metrics(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            return int(family.samples[0].labels["kv_cache_size_tokens"])
    raise AssertionError("no vllm:cache_config_info in /metrics")


def remember(seen: dict[tuple[int, float], psutil.Process], pids: list[int]) -> None:
    """Keep each engine process as psutil knows it (pid and start time), so
    that a pid the busy box hands to a new process later (pid_max is 32768
    here) is not taken for an engine process left running."""
    for pid in pids:
        try:
            p = psutil.Process(pid)
            seen.setdefault((pid, p.create_time()), p)
        except psutil.NoSuchProcess:
            pass


def no_engine_left(procs: list[psutil.Process]) -> bool:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running: same pid *and* start time
                alive.append((p.pid, p.name()))
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"engine processes left: {alive}"
    return True


def _named(p: psutil.Process, part: str) -> str:
    try:
        name = p.name()
    except psutil.Error:
        return ""
    return name if part in name else ""


def test_lifecycle_start_restart_crash_stop(tmp_path):
    server = start_server("cpu-demo", tmp_path)
    seen: dict[tuple[int, float], psutil.Process] = {}
    try:
        st = server.status
        assert st.state == ServerState.READY, (st, server.report.error)
        remember(seen, server.engine_pids())
        assert len(seen) >= 2  # APIServer + EngineCore (+ worker)
        report = server.report
        assert report.platform == "cpu" and report.block_size == 32
        assert report.kv_cache_tokens == kv_tokens_from_metrics(st.url) == 131072

        book = load_presets(include_user=False)
        b64 = book.get("cpu-demo-b64").with_changes(**EAGER)
        server.restart(b64.launch_spec(str(tiny_model_dir()), port_override=free_port()), preset_name=b64.name)
        st = server.wait_ready(READY_TIMEOUT)
        assert st.state == ServerState.READY and st.preset_name == "cpu-demo-b64", (st, server.report.error)
        remember(seen, server.engine_pids())
        report = server.report
        assert report.block_size == 64
        assert report.kv_cache_tokens == kv_tokens_from_metrics(st.url) == 262144
        assert (tmp_path / "llm.log.1").is_file()  # the previous run's log is kept
        # That run was stopped by the switch (SIGINT): its log reads stopped, not
        # ready (#18, 4), and holds none of our /health and /metrics polls (#18, 1).
        from ernie_tui.engine_ctl.logs import parse_file

        previous = parse_file(tmp_path / "llm.log.1")
        assert previous.ready and previous.state == "stopped" and previous.shutdown_line is not None
        text = (tmp_path / "llm.log.1").read_text(errors="replace")
        assert '"GET /metrics' not in text and '"GET /health' not in text

        # A crash while serving: the engine core killed mid-burst, as the OOM killer
        # would. The burst ends at once with the dead server's errors (none waits out
        # its read timeout). vLLM 0.32 then cleans up and its API server exits 0, like
        # a stop; it read STOPPED until the parser took that cleanup's "engine core
        # exited unexpectedly" for the crash it is. (A failing start is
        # test_preflight_vllm.py's.)
        core = [p for p in seen.values() if p.is_running() and _named(p, "EngineCore")]
        assert core, [(p.pid, _named(p, "")) for p in seen.values()]
        killed = threading.Event()

        def kill_at_the_third_answer(done: int, total: int) -> None:
            if done >= 3 and not killed.is_set():
                killed.set()
                core[-1].kill()

        burst = B.run_burst(st.url, B.BurstConfig(n=60, concurrency=4, max_tokens=128, read_timeout_s=30),
                            progress=kill_at_the_third_answer)
        assert killed.is_set() and 3 <= burst.completed < 60, B.format_burst(burst)
        assert burst.errors["count"] == 60 - burst.completed and burst.errors["first"], burst.errors
        assert "timeout" not in burst.errors["by_kind"], burst.errors
        deadline = time.monotonic() + 120
        while server.status.state == ServerState.READY and time.monotonic() < deadline:
            time.sleep(0.2)
        st = server.status
        assert st.state == ServerState.CRASHED, (st, server.report.error)
        assert st.error is not None and st.error.kind == ErrorKind.ENGINE_DEAD, st.error
    finally:
        remember(seen, server.engine_pids())
        server.stop()
    assert server.status.state in (ServerState.STOPPED, ServerState.CRASHED)
    assert no_engine_left(list(seen.values()))
