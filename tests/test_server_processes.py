"""Process control on real (non-vLLM) processes: the stop escalation and the
state machine, fast enough for every run. The launcher is a small Python
program that behaves like a stubborn server: it writes log lines, forks a
child like EngineCore, and ignores SIGINT."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import psutil

from ernie_tui.engine_ctl.control.server import EngineServer, ServerState, group_members
from ernie_tui.engine_ctl.launch.ports import port_is_free
from ernie_tui.presets.model import Preset
from vllm_support import free_port

STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("(APIServer pid=%d) INFO 11-30 03:35:20 [api_utils.py:347] "
          "vLLM server version 0.0.test, serving model x" % os.getpid(), flush=True)
    if os.fork() == 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
        os._exit(0)
    mode = sys.argv[sys.argv.index("--mode") + 1]
    if mode == "crash":
        print("ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])", flush=True)
        sys.exit(3)
    if mode == "give-up":  # a real failing start's log, then a teardown that never ends (SIGTERM ends it)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with open(sys.argv[sys.argv.index("--log") + 1]) as f:
            sys.stdout.write("".join(f.readlines()[:200]))
        sys.stdout.flush()
    time.sleep(600)
""")


def spec_for(tmp_path, mode: str, **args: str):
    script = tmp_path / "fake_server.py"
    script.write_text(STUBBORN)
    preset = Preset(name=f"fake-{mode}", launcher=[sys.executable, str(script)], model=str(tmp_path),
                    engine_args={"mode": mode, **args}, port=free_port())
    return preset.launch_spec()


def test_stop_escalates_until_every_process_is_gone(tmp_path, monkeypatch):
    import ernie_tui.engine_ctl.control.server as server_mod

    monkeypatch.setattr(server_mod, "SIGINT_GRACE", 0.5)
    monkeypatch.setattr(server_mod, "SIGTERM_GRACE", 0.5)
    server = EngineServer(spec_for(tmp_path, "hang"), preset_name="fake", log_path=tmp_path / "llm.log")
    server.start()
    deadline = time.time() + 120
    while len(server.engine_pids()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    pids = server.engine_pids()
    assert len(pids) == 2
    assert server.status.state == ServerState.STARTING
    server.stop()
    assert server.status.state == ServerState.STOPPED
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert server.report.vllm_version == "0.0.test"


def test_crash_reports_exit_code_and_root_cause(tmp_path, monkeypatch):
    import ernie_tui.engine_ctl.control.server as server_mod

    monkeypatch.setattr(server_mod, "SIGINT_GRACE", 0.2)
    monkeypatch.setattr(server_mod, "SIGTERM_GRACE", 0.2)
    server = EngineServer(spec_for(tmp_path, "crash"), preset_name="fake", log_path=tmp_path / "llm.log")
    events = []
    server.add_listener(events.append)
    server.start()
    st = server.wait_ready(120)  # returns at the crash; the bound is for a box too busy to start Python
    assert st.state == ServerState.CRASHED
    assert st.exit_code == 3
    assert st.error is not None and st.error.kind.value == "block_size_unsupported"
    # The launcher forked a child that ignores SIGINT and SIGTERM, then died: the
    # orphan left its tree but not its process group, and the crash ends it.
    group = st.pid
    deadline = time.time() + server_mod.ORPHAN_GRACE + 60
    while group_members(group) and time.time() < deadline:
        time.sleep(0.1)
    assert not group_members(group), "a crashed server's child is still running"
    deadline = time.time() + 60
    while server.status.leftovers_ended != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert server.status.leftovers_ended == 1  # the forked child; the crash panel says so
    server.stop()
    assert server.status.state == ServerState.CRASHED
    assert not group_members(group)
    states = [e.status.state for e in events if hasattr(e, "status")]
    assert states[0] == ServerState.STARTING and ServerState.CRASHED in states


def test_port_probe(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not port_is_free("127.0.0.1", s.getsockname()[1])[0]
    assert port_is_free("127.0.0.1", free_port())[0]


DRAWING = textwrap.dedent("""
    import sys, time
    print("(APIServer pid=1) INFO 11-30 03:35:20 [api_utils.py:347] "
          "vLLM server version 0.0.test, serving model x", flush=True)
    sys.stdout.write("(EngineCore pid=2) \\rCapturing CUDA graphs (FULL):   0%|          | 0/51\\r"
                     "Capturing CUDA graphs (FULL):  10%|#         | 5/51")
    sys.stdout.flush()
    time.sleep(600)
""")


def test_live_progress_bar_moves_the_phase_before_its_line_ends(tmp_path):
    """A bar redrawn with \\r is one log line, complete only at its newline;
    the monitor peeks at it so the phase shows CUDA graphs while they are captured."""
    script = tmp_path / "drawing.py"
    script.write_text(DRAWING)
    preset = Preset(name="fake-draw", launcher=[sys.executable, str(script)], model=str(tmp_path),
                    port=free_port())
    server = EngineServer(preset.launch_spec(), preset_name="fake", log_path=tmp_path / "llm.log")
    seen = []
    server.add_listener(seen.append)
    server.start()
    try:
        deadline = time.time() + 60
        while server.status.phase != "cuda_graphs" and time.time() < deadline:
            time.sleep(0.05)
        assert server.status.phase == "cuda_graphs"
        assert server.report.lines == 1  # the bar's line has not ended
        partials = [e.partial for e in seen if getattr(e, "partial", None)]
        assert partials and partials[-1].startswith("Capturing CUDA graphs (FULL):  10%")
    finally:
        server.stop()


FAKE_VLLM = Path(__file__).with_name("tui_fake_vllm.py")


def _open_logs(folder: Path) -> list[str]:
    """What this process's descriptors hold open in `folder` (deleted files included)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, gone already
        if target.startswith(str(folder)):
            held.append(target)
    return held


def test_start_stop_cycles_leave_no_log_open(tmp_path, fixtures_dir):
    """Each start rotates llm.log; a tailer that was replaced without being
    closed kept one descriptor per start, on files later deleted, whose disk
    space came back only when the dashboard exited."""
    logs = tmp_path / "logs"
    preset = Preset(name="fake", launcher=[sys.executable, str(FAKE_VLLM)], model=str(tmp_path),
                    port=free_port(), engine_args={"block_size": 32},
                    env={"ERNIE_FAKE_FIXTURES": str(fixtures_dir / "cpu-vllm0.32.0"), "ERNIE_FAKE_DELAY": "0.05"})
    server = EngineServer(preset.launch_spec(), preset_name="fake", log_path=logs / "llm.log")
    try:
        for cycle in range(20):
            server.start()
            deadline = time.time() + 60
            while server.report.lines == 0 and time.time() < deadline:  # the tailer has the file open
                time.sleep(0.02)
            assert server.report.lines > 0, f"cycle {cycle}: nothing logged"
            held = _open_logs(logs)
            assert len(held) <= 1, f"cycle {cycle}: {held}"
            server.stop()
        assert _open_logs(logs) == []
    finally:
        server.stop()
        server.close()
    assert _open_logs(logs) == []


def test_a_start_vllm_gave_up_is_a_crash_without_waiting_out_its_teardown(tmp_path, fixtures_dir):
    """vLLM 0.32's block-16 failure: "WorkerProc hit an exception", the root
    cause, "EngineCore failed to start". Its teardown then took 7 s here and,
    on a busy box, minutes; this one never ends by itself. Once the root cause
    is in, the server ends the teardown and reports the crash with it."""
    log = fixtures_dir / "cpu-vllm0.32.0" / "fail_block16.log"
    server = EngineServer(spec_for(tmp_path, "give-up", log=str(log)), preset_name="fake",
                          log_path=tmp_path / "llm.log")
    server.start()
    try:
        st = server.wait_ready(120)  # the teardown alone would take 600 s
        assert st.state == ServerState.CRASHED, st
        assert st.error is not None and st.error.kind.value == "block_size_unsupported", st.error
        assert st.exit_code is not None  # it exited: SIGTERM ended it
        group = st.pid
        deadline = time.time() + 60
        while group_members(group) and time.time() < deadline:  # the forked child ignores SIGTERM
            time.sleep(0.1)
        assert not group_members(group), "the failed start left a process behind"
    finally:
        server.stop()

