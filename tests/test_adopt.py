"""A server left running (quit -> leave) is taken back (issue #18, 2).

Real processes: the stand-in vLLM (tests/tui_fake_vllm.py) is started by the
real EngineServer, recorded by detach() as `q` -> leave does, and then found
again: by the next dashboard (which shows it as ours, with its log, and stops
it with x), by `ernie-tui stop`, and by preflight, which must never offer a
second server on another port as the "fix" for a port our own server holds.
A stubborn stand-in (ignores SIGINT, forks a child) checks the escalation.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import pytest

from ernie_tui import paths
from ernie_tui.cli import main as cli_main
from ernie_tui.engine_ctl.control.server import EngineServer, ServerState, find_detached, group_members
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.presets import load_presets
from ernie_tui.tui.app import make_app
from ernie_tui.tui.widgets.log_view import LogView
from test_server_processes import spec_for
from test_tui_pilot import fake_presets, screen_text, wait_for  # noqa: F401  (fake_presets: a fixture)

RECORD = "server.json"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leave_running(book, name: str, log_dir) -> tuple[EngineServer, int]:
    """Start `name`, wait until it serves, and leave it as `q` -> leave does:
    the record written, the monitor ended, the process left running."""
    server = EngineServer(book.get(name).launch_spec(), preset_name=name, log_path=log_dir / "llm.log")
    server.start()
    st = server.wait_ready(30)
    assert st.state == ServerState.READY, st
    pid = st.pid
    assert server.detach() is not None
    server.close()
    return server, pid


def reap(server: EngineServer) -> None:
    """The test process is the launcher's parent: collect its exit status."""
    if server._proc is not None:
        server._proc.poll()


@pytest.fixture
def book(fake_presets):  # noqa: F811
    return load_presets([str(fake_presets)], include_user=False)


def test_left_running_server_is_adopted_and_stopped(book, tmp_path):
    first, pid = leave_running(book, "fake-a", tmp_path)
    try:
        info = find_detached()
        assert info is not None and info["pid"] == pid and info["preset"] == "fake-a"
        adopted = EngineServer.adopt(info)
        adopted.watch()
        st = adopted.wait_ready(15)
        assert st.state == ServerState.READY and st.pid == pid and st.preset_name == "fake-a"
        assert adopted.report.ready and adopted.report.pids.get("APIServer") == pid, "its log was read"
        assert pid in adopted.engine_pids()
        adopted.stop()
        assert adopted.status.state == ServerState.STOPPED
        assert not alive(pid) and not group_members(pid)
        assert not (paths.state_dir() / RECORD).exists(), "the record goes with the server"
        adopted.close()
    finally:
        reap(first)
        first.stop()


def test_ready_in_after_taking_back_is_the_starts_not_its_age(book, tmp_path):
    """"ready in 6:21" after taking a server back was its age; it had started
    in 42.8 s (issue #44, 6). The record keeps when the start became ready."""
    first, pid = leave_running(book, "fake-a", tmp_path)
    try:
        record = paths.state_dir() / RECORD
        info = json.loads(record.read_text())
        took = info["ready_at"] - info["started_at"]
        assert 0 < took < 30
        # As if it had been left running five minutes ago: the age is 300 s
        # more, the start took what it took.
        info["started_at"] -= 300.0
        info["ready_at"] -= 300.0
        record.write_text(json.dumps(info))
        adopted = EngineServer.adopt(find_detached())
        adopted.watch()
        st = adopted.wait_ready(15)
        assert st.state == ServerState.READY
        assert st.ready_at == info["ready_at"] and st.ready_at - st.started_at == pytest.approx(took)
        assert st.uptime() > 300  # the age, which "up" shows
        adopted.close()

        # A record from before ready_at was kept: no "ready in" rather than the age.
        del info["ready_at"]
        record.write_text(json.dumps(info))
        older = EngineServer.adopt(find_detached())
        older.watch()
        st = older.wait_ready(15)
        assert st.state == ServerState.READY and st.ready_at is None
        older.close()
    finally:
        reap(first)
        first.stop()


def test_stale_record_is_cleared(tmp_path):
    proc = psutil.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    record = paths.state_dir() / RECORD
    paths.private_dir(record.parent)
    record.write_text(json.dumps({"pid": proc.pid, "url": "http://127.0.0.1:9", "preset": "x"}))
    assert find_detached() is None
    assert not record.exists()
    # A pid that lives but is another process (its start time differs): stale too.
    record.write_text(json.dumps({"pid": os.getpid(), "create_time": 1.0, "url": "http://127.0.0.1:9"}))
    assert find_detached() is None and not record.exists()
    record.write_text("{not json")
    assert find_detached() is None and not record.exists()
    assert cli_main(["stop"]) == 0  # nothing left running: says so, exit 0


def test_cli_stop_escalates_over_the_group(tmp_path, monkeypatch, capsys):
    """`ernie-tui stop` ends a server that ignores SIGINT, and the child it
    forked, as the dashboard's x does (SIGINT, SIGTERM, SIGKILL over the group)."""
    import ernie_tui.engine_ctl.control.server as server_mod

    monkeypatch.setattr(server_mod, "SIGINT_GRACE", 0.5)
    monkeypatch.setattr(server_mod, "SIGTERM_GRACE", 0.5)
    server = EngineServer(spec_for(tmp_path, "hang"), preset_name="stubborn", log_path=tmp_path / "llm.log")
    server.start()
    deadline = time.monotonic() + 60
    while len(server.engine_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = server.engine_pids()
    assert len(pids) == 2
    server.detach()
    server.close()
    try:
        assert cli_main(["stop", "--preset", "other"]) == 1
        assert "the server left running is stubborn" in capsys.readouterr().err
        assert all(alive(p) for p in pids), "a stop for another preset touched nothing"
        assert cli_main(["stop", "--preset", "stubborn"]) == 0
        out = capsys.readouterr()
        assert "stopped stubborn" in out.out
        reap(server)
        assert not any(alive(p) for p in pids)
        assert not (paths.state_dir() / RECORD).exists()
    finally:
        reap(server)
        server.stop()


def test_preflight_never_fixes_our_own_port_with_a_second_server(book, tmp_path):
    from ernie_tui.engine_ctl.launch import diagnose_failure, run_preflight

    first, pid = leave_running(book, "fake-a", tmp_path)
    try:
        result = run_preflight(book.get("fake-b"), check_args=False, allow_dump=False)
        port = [p for p in result.problems if p.kind == ErrorKind.PORT_IN_USE]
        assert port, result.problems
        assert "your left-running server" in port[0].message and "ernie-tui stop" in port[0].message
        assert port[0].fix is None, "a second server on the next port is no fix"
        diagnosis = diagnose_failure(port[0], book.get("fake-b"), "cpu")
        assert not diagnosis.fixable
    finally:
        reap(first)
        first.stop()
        assert cli_main(["stop"]) == 0
        reap(first)
        assert not alive(pid)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_dashboard_takes_back_the_left_running_server(book, fake_presets, tmp_path, size):  # noqa: F811
    """Plain `ernie-tui` after quit -> leave: shown as ours (not STOPPED with an
    empty log), its log in the pane, x stops it and clears the record."""
    first, pid = leave_running(book, "fake-a", tmp_path)
    app = make_app(preset_files=[str(fake_presets)], live=False, include_user_presets=False)
    try:
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready",
                           what="the left-running server shown as ready")
            assert app.server.status.pid == pid and app.status.preset_name == "fake-a"
            assert app.active_preset == "fake-a"
            log = app.main.query_one(LogView)
            await wait_for(pilot, lambda: log.line_count > 50, what="its log in the pane")
            assert any("Starting vLLM server" in line for line in log.lines())
            assert any("took back fake-a" in n.message for n in app._notifications)
            assert "READY" in screen_text(app)
            await pilot.press("x")
            await wait_for(pilot, lambda: app.status.state.value == "stopped", what="x to stop it")
            reap(first)
            assert not alive(pid) and not group_members(pid)
            assert not (paths.state_dir() / RECORD).exists()
            await pilot.press("q")
    finally:
        reap(first)
        if app.server is not None:
            app.server.stop()
            app.server.close()
        first.stop()


async def test_preset_key_restarts_the_adopted_server_on_its_port(book, fake_presets, tmp_path):  # noqa: F811
    """A preset key while the adopted server serves: asks to switch (no
    port_in_use, no 'fix on another port'), stops it and starts the new one."""
    from ernie_tui.tui.screens.dialogs import ConfirmScreen, PreflightScreen

    first, pid = leave_running(book, "fake-a", tmp_path)
    app = make_app(preset_files=[str(fake_presets)], live=False, include_user_presets=False)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready",
                           what="adopted")
            await pilot.press(str(app.main.preset_names.index("fake-b") + 1))
            await wait_for(pilot, lambda: isinstance(app.screen, (ConfirmScreen, PreflightScreen)),
                           what="the switch question")
            assert isinstance(app.screen, ConfirmScreen), "preflight objected to our own server's port"
            await pilot.press("y")
            await wait_for(pilot, lambda: app.status.state.value == "ready" and app.status.preset_name == "fake-b",
                           what="fake-b serving")
            reap(first)
            assert not alive(pid), "the adopted server was stopped, not left beside a second one"
            assert app.server.status.pid != pid
            await pilot.press("x")
            await wait_for(pilot, lambda: app.status.state.value == "stopped", what="stopped")
    finally:
        reap(first)
        if app.server is not None:
            app.server.stop()
            app.server.close()
        first.stop()
