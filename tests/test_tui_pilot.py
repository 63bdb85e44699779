"""Pilot tests of the dashboard, driving the real app with real processes.

The server is the real EngineServer class driving a real (cheap) process:
tests/tui_fake_vllm.py speaks vLLM's command line, writes the log a real
vLLM CPU server wrote, and serves /health and /metrics. Replay tests open
every captured fixture log.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest
from textual.widgets import Static

from ernie_tui.engine_ctl.control.server import EngineServer
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.tui.app import make_app
from ernie_tui.tui.screens.dialogs import ConfirmScreen, PreflightScreen, QuitScreen
from ernie_tui.tui.widgets.error_panel import ErrorPanel
from ernie_tui.tui.widgets.log_view import LogView

FAKE = Path(__file__).with_name("tui_fake_vllm.py")


@pytest.fixture
def fake_presets(tmp_path, fixtures_dir, tiny_model) -> Path:
    # The stand-in server ignores the model, but preflight reads its
    # config.json before every launch: give it the real tiny model.
    model = tiny_model
    port = free_port()
    text = f"""
[presets.fake-a]
description = "stand-in vLLM: block 32, 64 MiB KV"
model = "{model}"
launcher = ["{sys.executable}", "{FAKE}"]
block_size = 32
max_model_len = 2048
kv_cache_memory_bytes = "64M"
port = {port}
env = {{ ERNIE_FAKE_FIXTURES = "{fixtures_dir / 'cpu-vllm0.32.0'}", ERNIE_FAKE_DELAY = "0.2" }}

[presets.fake-b]
extends = "fake-a"
description = "stand-in vLLM: block 64, 128 MiB KV"
block_size = 64
kv_cache_memory_bytes = "128M"

[presets.fake-bad]
extends = "fake-a"
description = "stand-in vLLM: block 16, fails like vLLM CPU"
block_size = 16
"""
    path = tmp_path / "presets.toml"
    path.write_text(text)
    return path


class Recorder:
    """A server factory that builds the real EngineServer and remembers it."""

    def __init__(self, log_dir: Path):
        self.servers: list[EngineServer] = []
        self.log_dir = log_dir

    def __call__(self, spec, *, preset_name, log_path=None):
        server = EngineServer(spec, preset_name=preset_name, log_path=self.log_dir / "llm.log")
        self.servers.append(server)
        return server

    def cleanup(self) -> None:
        for s in self.servers:
            try:
                s.stop()
            except Exception:  # noqa: BLE001  cleanup: the next server is still stopped and closed
                pass
            s.close()


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def screen_text(app) -> str:
    """Everything the main screen shows as text: statics, labels, titles, log lines."""
    parts: list[str] = []
    for w in app.main.query("*"):
        if isinstance(w, Static):
            parts.append(str(w.content))
        for t in (w.border_title, w.border_subtitle):
            if t:
                parts.append(str(t))
        if isinstance(w, LogView):
            parts.extend(w.lines())
    return "\n".join(parts)


def screen_text_of(screen) -> str:
    return "\n".join(str(w.content) for w in screen.query(Static))


def tailed_lines(path: Path) -> list[str]:
    from ernie_tui.engine_ctl.logs.logtail import LogTailer

    tailer, out = LogTailer(path), []
    while batch := tailer.read_new():
        out += batch
    return out + ([tailer.partial] if tailer.partial else [])


def engine_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_switch_preset_restarts_with_new_argv(fake_presets, tmp_path):
    rec = Recorder(tmp_path)
    app = make_app(preset="fake-a", preset_files=[str(fake_presets)], start=True, server_factory=rec,
                   sample_interval=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready",
                           what="fake-a ready")
            server = rec.servers[0]
            first_pid = server.status.pid
            argv = server.spec.argv
            assert argv[argv.index("--block-size") + 1] == "32"
            await wait_for(pilot, lambda: "65,536 tokens" in screen_text(app), what="fake-a's KV tokens on screen")

            number = app.main.preset_names.index("fake-b") + 1
            assert number <= 9
            await pilot.press(str(number))
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirm dialog")
            await pilot.press("y")
            await wait_for(pilot, lambda: server.status.preset_name == "fake-b"
                           and server.status.state.value == "ready", what="fake-b ready")
            assert len(rec.servers) == 1, "switching restarts the same server object"
            argv = server.spec.argv
            assert argv[argv.index("--block-size") + 1] == "64"
            assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(128 << 20)
            assert server.status.pid != first_pid
            assert not engine_alive(first_pid), "the old engine is gone after the restart"
            # The new run's report: 128 MiB at 1 KiB/token = 131,072 tokens, 64x at 2,048.
            body = app.main.query_one("#report-body", Static)
            await wait_for(pilot, lambda: "131,072 tokens" in str(body.content) and "64.00×" in str(body.content),
                           what="fake-b's report")
            text = screen_text(app)
            assert "64.00×" in text
            assert "fake-b" in text

            new_pid = server.status.pid
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit dialog")
            await pilot.press("s")
            await wait_for(pilot, lambda: not engine_alive(new_pid), timeout=40, what="the engine to stop")
    finally:
        rec.cleanup()
    assert app.exit_action == "stop"
    assert not any(engine_alive(s.status.pid) for s in rec.servers if s.status.pid)


async def test_crash_shows_error_panel_and_fix_relaunches(fake_presets, tmp_path):
    from ernie_tui import paths

    rec = Recorder(tmp_path)
    app = make_app(preset="fake-bad", preset_files=[str(fake_presets)], start=True, server_factory=rec,
                   sample_interval=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            # Preflight knows vLLM CPU refuses block 16 and offers the fix before
            # launching; launch anyway, to see the real crash.
            # The dialog is pushed before it is composed: wait for its words, not only the screen.
            await wait_for(pilot, lambda: isinstance(app.screen, PreflightScreen)
                           and "block_size_unsupported" in screen_text_of(app.screen), what="the preflight dialog")
            await pilot.press("y")
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "crashed",
                           what="the crash")
            panel = app.main.query_one(ErrorPanel)
            await wait_for(pilot, lambda: "block_size" in str(panel.content) and "32" in str(panel.content),
                           what="the diagnosis in the panel")
            assert panel.display and panel.has_class("-visible")
            text = str(panel.content)
            assert "block_size_unsupported" in text
            assert "No common block size for 16" in text
            assert "exit code 1" in text
            # The fake left a child running, as an EngineCore can: ended, and said so.
            await wait_for(pilot, lambda: "ended 1 engine process the server left running" in str(panel.content),
                           what="the leftover process ended")
            # The root-cause line is marked in the log pane.
            log = app.main.query_one(LogView)
            assert log.root_cause_no is not None
            assert "No common block size for 16" in log.lines()[log.root_cause_no - 1]

            await pilot.press("f")
            server = rec.servers[0]
            await wait_for(pilot, lambda: server.status.preset_name == "fake-bad-fixed"
                           and server.status.state.value == "ready", what="the fixed preset to serve")
            argv = server.spec.argv
            assert argv[argv.index("--block-size") + 1] == "32"
            assert not panel.has_class("-visible")
            saved = paths.user_presets_file().read_text()
            assert "[presets.fake-bad-fixed]" in saved
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit dialog")
            await pilot.press("s")
            await wait_for(pilot, lambda: not server.status.running, timeout=40, what="the engine to stop")
    finally:
        rec.cleanup()


async def test_stop_and_start_keys(fake_presets, tmp_path):
    rec = Recorder(tmp_path)
    app = make_app(preset="fake-a", preset_files=[str(fake_presets)], start=False, server_factory=rec,
                   live=False)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert rec.servers == []
            await pilot.press("s")
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready",
                           what="ready after s")
            pid = rec.servers[0].status.pid
            await pilot.press("x")
            await wait_for(pilot, lambda: app.status.state.value == "stopped", what="stopped after x")
            assert not engine_alive(pid)
            await pilot.press("q")  # nothing running: quits without asking
            await pilot.pause()
    finally:
        rec.cleanup()
    assert app.return_code == 0


# Key values the fixture README lists for each captured log.
REPLAY_EXPECT = {
    "gpu-h200-vllm0.26.0/ok_block16_len4096.log": ["7,421,344 tokens", "1811.85×", "FLASH_ATTN", "127.4 GiB",
                                                    "vLLM 0.26.0"],
    "gpu-h200-vllm0.26.0/ok_util0.16_block16_len4096.log": ["1,234,512 tokens", "301.39×", "21.19 GiB"],
    "gpu-h200-vllm0.26.0/fail_block8_len2048.log": ["block_size_unsupported"],
    "gpu-h200-vllm0.26.0/fail_len_over_derived.log": ["max_model_len_too_large"],
    "gpu-h200-vllm0.26.0/fail_no_cache_memory_util0.005.log": ["no_cache_memory"],
    "gpu-h200-vllm0.26.0/fail_unknown_arg_enable_paged_attn.log": ["unknown_argument", "--enable-paged-attn"],
    "gpu-2xh200-vllm0.26.0/ok_dp2.log": ["vLLM 0.26.0", "EngineCore_DP0", "EngineCore_DP1", "7,423,936"],
    "gpu-2xh200-vllm0.26.0/ok_tp2-ray.log": ["14,870,784 tokens", "Worker_TP0", "Worker_TP1"],
    "cpu-vllm0.32.0/ok_block32_len2048.log": ["65,536 tokens", "32.00×", "vLLM 0.32.0", "cpu"],
    "cpu-vllm0.32.0/fail_block16.log": ["block_size_unsupported", "No common block size for 16"],
    "cpu-vllm0.32.0/fail_kv_too_small.log": ["kv_cache_too_small", "992"],
    "cpu-vllm0.32.0/fail_insufficient_free_memory.log": ["insufficient_free_memory"],
    # Served, then its engine core was killed: a crash, though its API server exited 0.
    "cpu-vllm0.32.0/engine_core_killed.log": ["engine_dead", "exited unexpectedly"],
    # Served, then its worker died of SIGILL at the first request (AMX in a VM): the fix is a dtype.
    "cpu-vllm0.32.0/worker_sigill_amx_bf16.log": ["illegal_instruction", "exit code: -4", "dtype = 'float16'"],
}


def test_every_fixture_log_has_expectations(fixtures_dir):
    logs = {str(p.relative_to(fixtures_dir)) for p in fixtures_dir.glob("*/*.log")}
    assert logs == set(REPLAY_EXPECT)


@pytest.mark.parametrize("name", sorted(REPLAY_EXPECT))
async def test_replay_shows_key_values(fixtures_dir, name):
    path = fixtures_dir / name
    app = make_app(mode="replay", replay_path=str(path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.status is not None, what="the replay to finish")
        await pilot.pause()
        text = screen_text(app)
        for expected in REPLAY_EXPECT[name]:
            assert expected in text, f"{name}: {expected!r} not on screen"
        panel = app.main.query_one(ErrorPanel)
        failed = "/fail_" in name or name.endswith(("/engine_core_killed.log", "/worker_sigill_amx_bf16.log"))
        assert panel.has_class("-visible") == failed
        if failed:
            assert app.status.state.value == "crashed"
        else:
            # Every ok capture ends with its SIGINT shutdown: it was ready, and is
            # stopped now (#18, 4); never "reached ready" as if it still served.
            assert app.report.ready
            assert app.status.state.value == "stopped" and app.status.phase == "shutdown"
            assert "REPLAY: shut down" in text and "reached ready" not in text
            # Charts come from the log's own stats lines (the tp2-ray capture stopped
            # before its first 10-s stats line, so it has none).
            if "Avg prompt throughput" in path.read_text(errors="replace"):
                assert app._last_series is not None and len(app._last_series.points) > 0
        log = app.main.query_one(LogView)
        assert log.line_count == len(tailed_lines(path)), "every line of the log reached the pane"
        await pilot.press("q")
    assert app.return_code == 0


async def test_log_search_and_follow(fixtures_dir):
    path = fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log"
    app = make_app(mode="replay", replay_path=str(path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.status is not None, what="the replay")
        log = app.main.query_one(LogView)
        assert log.follow
        await pilot.press("slash")
        await pilot.press(*"KV cache size")
        await pilot.press("enter")
        assert log.search_info() == (1, 1)
        assert not log.follow, "jumping to a match pauses following"
        assert "KV cache size" in app.main.query_one("#log-pane").border_subtitle
        await pilot.press("l")
        assert log.follow
        await pilot.press("question_mark")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.press("q")


async def test_e_edits_the_preset_file_and_reloads(tmp_path, monkeypatch):
    """`e` on a built-in preset: its table is copied into the user's presets
    file, $EDITOR (an argv, no shell) edits that file, the presets reload."""
    from ernie_tui import paths

    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys\n"
        "path = sys.argv[-1]\n"
        "text = open(path).read()\n"
        "text = text.replace('max_model_len = 4096', 'max_model_len = 3072')\n"
        "text += '\\n[presets.my-new]\\ndescription = \"added in the editor\"\\nextends = \"seed-A\"\\n'\n"
        "open(path, 'w').write(text)\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")
    monkeypatch.delenv("VISUAL", raising=False)
    app = make_app(preset="seed-A", live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "my-new" not in app.main.preset_names
        app.main.query_one("#preset-list").focus()
        await pilot.press("e")
        await wait_for(pilot, lambda: "my-new" in app.main.preset_names, 10, "the reloaded presets")
        assert app.book.get("seed-A").max_model_len == 3072
        assert app.book.get("seed-A").source == str(paths.user_presets_file())
        text = paths.user_presets_file().read_text()
        assert "[presets.seed-A]" in text and "[presets.my-new]" in text


async def test_command_line_screen_shows_the_exact_argv(fake_presets):
    import shlex

    from ernie_tui.tui.screens.dialogs import CommandLineScreen

    app = make_app(preset="fake-a", preset_files=[str(fake_presets)], live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandLineScreen), 5, "the command line")
        spec = app.book.get("fake-a").launch_spec()
        assert app.screen.command.endswith(shlex.join(spec.argv))
        assert "ERNIE_FAKE_FIXTURES=" in app.screen.command
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandLineScreen), 5, "the dialog to close")


@pytest.mark.parametrize("on_exit, expect_running", [("ask", False), ("leave", True)])
async def test_hangup_follows_on_exit(fake_presets, tmp_path, on_exit, expect_running):
    """A lost SSH session (SIGHUP): --on-exit ask/stop stops the server,
    leave leaves it running with a record for a later --attach."""
    from ernie_tui import paths
    from ernie_tui.cli.dashboard import _finish

    rec = Recorder(tmp_path)
    app = make_app(preset="fake-a", preset_files=[str(fake_presets)], start=True, server_factory=rec,
                   live=False, on_exit=on_exit)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready",
                           what="ready")
            pid = rec.servers[0].status.pid
            app._on_hangup()  # what the SIGHUP handler calls
            await pilot.pause()
        assert app.hangup
        _finish(app)  # run_dashboard's epilogue, after the app has exited
        assert engine_alive(pid) == expect_running
        if expect_running:
            assert (paths.state_dir() / "server.json").is_file()
    finally:
        rec.cleanup()


async def test_preflight_fix_before_launch(fake_presets, tmp_path):
    """Preflight catches block 16 on CPU before vLLM spends a minute failing;
    f saves fake-bad-fixed (block 32) and launches that instead."""
    from ernie_tui import paths

    rec = Recorder(tmp_path)
    app = make_app(preset="fake-bad", preset_files=[str(fake_presets)], start=True, server_factory=rec,
                   sample_interval=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            # The dialog's words, not only its screen: on a loaded box the screen
            # can be up before it is composed (a fresh-clone CI run read '' here).
            await wait_for(pilot, lambda: isinstance(app.screen, PreflightScreen)
                           and "block_size = 32" in screen_text_of(app.screen), what="the preflight dialog's fix")
            assert rec.servers and rec.servers[0].status.pid is None, "nothing was started"
            await pilot.press("f")
            server = rec.servers[0]
            await wait_for(pilot, lambda: server.status.preset_name == "fake-bad-fixed"
                           and server.status.state.value == "ready", what="the fixed preset to serve")
            argv = server.spec.argv
            assert argv[argv.index("--block-size") + 1] == "32"
            assert "[presets.fake-bad-fixed]" in paths.user_presets_file().read_text()
            # The estimate sits beside what the log reported.
            body = app.main.query_one("#report-body", Static)
            await wait_for(pilot, lambda: "(preflight)" in str(body.content) and "vs the log" in str(body.content),
                           what="the estimate beside the report")
    finally:
        rec.cleanup()


async def test_worker_messages_after_shutdown_are_dropped(fixtures_dir):
    """A worker's message can still be queued while Textual prunes the main
    screen on exit (seen once in CI as NoMatches '#log'); once the app is shutting
    down the handlers drop such messages instead of querying widgets that are gone."""
    from ernie_tui.engine_ctl.control.server import ServerState, ServerStatus
    from ernie_tui.tui.messages import LogBatch, SeriesUpdate, StatusUpdate

    path = fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log"
    app = make_app(mode="replay", replay_path=str(path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.status is not None, what="the replay to finish")
    assert not app.is_running
    app._log(LogBatch(["late line"], run=object()))
    app._status(StatusUpdate(ServerStatus(state=ServerState.STOPPED)))
    app._series(SeriesUpdate(()))
    app._tick()


async def test_preflight_failure_is_shown(fake_presets, tmp_path, monkeypatch):
    """A bug inside preflight used to vanish (preflight silently skipped): now the
    user reads it in an error notification, and the launch goes on (preflight is advice)."""
    import ernie_tui.tui.app as app_module

    def broken_preflight(*args, **kwargs):
        raise RuntimeError("injected preflight bug")

    monkeypatch.setattr(app_module, "run_preflight", broken_preflight)
    rec = Recorder(tmp_path)
    app = make_app(preset="fake-a", preset_files=[str(fake_presets)], start=True, server_factory=rec,
                   sample_interval=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            def shown() -> list[str]:
                return [f"{n.title}: {n.message}" for n in app._notifications]

            await wait_for(pilot, lambda: any("RuntimeError: injected preflight bug" in t for t in shown()),
                           what="the preflight failure in a notification")
            note = next(t for t in shown() if "injected preflight bug" in t)
            assert note.startswith("preflight of fake-a failed") and "going on without preflight" in note
            await wait_for(pilot, lambda: rec.servers and rec.servers[0].status.pid is not None,
                           what="the launch to go on")
    finally:
        rec.cleanup()


async def test_worker_failure_is_shown_and_the_app_runs_on(fixtures_dir):
    """Workers run with exit_on_error=False; one that raises is shown (its last
    traceback line), not swallowed, and the dashboard keeps running."""
    path = fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log"
    app = make_app(mode="replay", replay_path=str(path), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        def broken() -> None:
            raise KeyError("no such figure")

        app.run_worker(broken, thread=True, exit_on_error=False, name="chart sampler")
        await wait_for(pilot, lambda: any(n.title == "chart sampler failed" and "KeyError: 'no such figure'"
                                          in n.message for n in app._notifications),
                       what="the worker's failure in a notification")
        assert app.is_running
