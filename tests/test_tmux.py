"""The real terminal app in tmux against real vLLM CPU (slow: three vLLM starts in all).

tmux runs `.venv/bin/ernie-tui --preset cpu-demo --start` with ERNIE_TUI_HOME
in a temp dir and the tiny model from `ernie-tui demo-model`. The test reads
the screen as a person would (`tmux capture-pane`): it waits for the KV-cache
tokens that /metrics' cache_config_info reports, presses the presets-panel
number of cpu-demo-b64, confirms, sees the restart and the new preset's
report, stops it with x, quits, and checks that no engine process is left.
The new user's path (demo, leave, come back, stop from the CLI) is one more start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ernie_tui.engine_ctl.launch.ports import free_port
from vllm_support import EAGER

pytestmark = [pytest.mark.tmux, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent
ERNIE_TUI = ROOT / ".venv" / "bin" / "ernie-tui"
START_TIMEOUT = 420.0  # a cold torch.compile on a busy 2-core box


class Tmux:
    """One session on a private tmux server (-L), so nothing else's is touched."""

    def __init__(self, name: str):
        self.name = name
        self.socket = name

    def _run(self, *args: str, **kw):
        return subprocess.run(["tmux", "-L", self.socket, *args], **kw)

    def start(self, command: str, cols: int = 120, rows: int = 40) -> None:
        # Pin the size: without a client, tmux may fall back to its 80x24 default-size.
        self._run("new-session", "-d", "-s", self.name, "-x", str(cols), "-y", str(rows), command,
                  ";", "set-option", "-g", "default-size", f"{cols}x{rows}",
                  ";", "set-option", "-g", "-w", "window-size", "manual", check=True)

    def alive(self) -> bool:
        return self._run("has-session", "-t", self.name, capture_output=True).returncode == 0

    def screen(self) -> str:
        out = self._run("capture-pane", "-p", "-t", self.name, capture_output=True, text=True)
        return out.stdout

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.name, *keys, check=True)

    def pane_pid(self) -> int:
        out = self._run("display-message", "-p", "-t", self.name, "#{pane_pid}", capture_output=True, text=True,
                        check=True)
        return int(out.stdout.strip())

    def kill(self) -> None:
        """End our private tmux server and remove its socket file."""
        socket_dir = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
        self._run("kill-server", capture_output=True)
        (socket_dir / self.socket).unlink(missing_ok=True)

    def wait_for(self, predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen() if self.alive() else ""
            if predicate(screen):
                return screen
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; the screen:\n{screen}")


def metrics_kv_tokens(url: str) -> int | None:
    from ernie_tui.engine_ctl.load.metrics import MetricsClient

    with MetricsClient(url) as client:
        snap = client.try_fetch()
    cc = snap.cache_config() if snap is not None else None
    return cc.kv_cache_size_tokens if cc is not None else None


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def header(screen: str) -> str:
    return screen.splitlines()[0] if screen else ""


def test_dashboard_in_tmux_against_real_vllm(tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed")
    if not ERNIE_TUI.exists():
        pytest.fail(f"{ERNIE_TUI} missing: run scripts/setup.sh")
    home = tmp_path / "home"
    env = {**os.environ, "ERNIE_TUI_HOME": str(home)}
    model = home / "data" / "models" / "tiny-ernie"
    subprocess.run([str(ERNIE_TUI), "demo-model", str(model)], env=env, check=True, capture_output=True)

    # The built-in cpu-demo on a free port (other servers may hold 8011);
    # cpu-demo-b64 extends it and so inherits the port.
    from ernie_tui.presets import load_presets

    demo = load_presets(include_user=False).get("cpu-demo")
    port = free_port()
    (home / "config").mkdir(parents=True)
    import tomli_w

    table = {"description": f"cpu-demo on port {port} for the tmux test", "model": demo.model, "port": port,
             **demo.engine_args, **EAGER}
    (home / "config" / "presets.toml").write_text(tomli_w.dumps({"presets": {"cpu-demo": table}}))
    url = f"http://127.0.0.1:{port}"

    tmux = Tmux(f"ernie-tui-test-{os.getpid()}")
    seen: list[psutil.Process] = []
    try:
        # env -u: a COLUMNS/LINES inherited from the test runner would override the pane's real size.
        tmux.start(f"cd {ROOT} && exec env -u COLUMNS -u LINES ERNIE_TUI_HOME={home} "
                   f"{ERNIE_TUI} --preset cpu-demo --start")
        pane = tmux.pane_pid()

        screen = tmux.wait_for(lambda s: "READY" in header(s) and "cpu-demo" in header(s), START_TIMEOUT,
                               "cpu-demo to be ready")
        seen += descendants(pane)
        tokens = metrics_kv_tokens(url)
        assert tokens, "/metrics has no cache_config_info kv_cache_size_tokens"
        # The report row, not the log line: '0.06 GiB = 131,072 tokens  ✔ /metrics agrees'.
        screen = tmux.wait_for(lambda s: re.search(rf"GiB = {tokens:,} tokens\s+✔ /metrics agrees", s), 30,
                               f"{tokens:,} KV tokens in the report, agreeing with /metrics")

        m = re.search(r"│(\d) .{1,2}\s?cpu-demo-b64\b", screen)
        assert m, f"cpu-demo-b64 not numbered in the presets panel:\n{screen}"
        tmux.keys(m.group(1))
        tmux.wait_for(lambda s: "Switch to cpu-demo-b64?" in s, 10, "the confirm dialog")
        tmux.keys("y")
        tmux.wait_for(lambda s: "STARTING" in header(s) and "cpu-demo-b64" in header(s), 60,
                      "the restart with cpu-demo-b64")
        seen += descendants(pane)
        tmux.wait_for(lambda s: "READY" in header(s) and "cpu-demo-b64" in header(s), START_TIMEOUT,
                      "cpu-demo-b64 to be ready")
        seen += descendants(pane)
        new_tokens = metrics_kv_tokens(url)
        assert new_tokens and new_tokens != tokens, "the new preset has its own KV size"
        screen = tmux.wait_for(lambda s: re.search(rf"GiB = {new_tokens:,} tokens\s+✔ /metrics agrees", s)
                               and "block · len 64" in s, 30, "the new preset's report")
        assert f"GiB = {tokens:,} tokens" not in screen, "the old report is gone"

        tmux.keys("x")  # stop; the new-user test stops from the CLI, the Pilot tests by quit -> stop
        tmux.wait_for(lambda s: "STOPPED" in header(s), 90, "x to stop it")
        tmux.keys("q")  # nothing running: no dialog
        _exits(tmux, "with nothing running")
        engines = [p for p in seen if p.pid != pane]
        assert engines, "no engine process was ever seen"
        time.sleep(0.5)
        left = alive(engines)
        assert not left, f"engine processes left: {[(p.pid, p.name()) for p in left]}"
        assert metrics_kv_tokens_or_none(url) is None, "the server still answers"
    finally:
        tmux.kill()
        for p in alive(seen):  # only processes this test started
            try:
                p.kill()
            except psutil.Error:
                pass


def metrics_kv_tokens_or_none(url: str) -> int | None:
    try:
        return metrics_kv_tokens(url)
    except Exception:  # noqa: BLE001  polled until it answers: any failure means "not yet"
        return None


def _demo_home(tmp_path: Path) -> tuple[Path, dict, str]:
    """ERNIE_TUI_HOME with the tiny model written and cpu-demo moved to a free port."""
    home = tmp_path / "home"
    env = {**os.environ, "ERNIE_TUI_HOME": str(home)}
    model = home / "data" / "models" / "tiny-ernie"
    subprocess.run([str(ERNIE_TUI), "demo-model", str(model)], env=env, check=True, capture_output=True)
    import tomli_w

    from ernie_tui.presets import load_presets

    demo = load_presets(include_user=False).get("cpu-demo")
    port = free_port()
    (home / "config").mkdir(parents=True)
    table = {"description": f"cpu-demo on port {port}", "model": demo.model, "port": port, **demo.engine_args, **EAGER}
    (home / "config" / "presets.toml").write_text(tomli_w.dumps({"presets": {"cpu-demo": table}}))
    return home, env, f"http://127.0.0.1:{port}"


def _capacity_search_at_80x24(tmux: Tmux, env: dict) -> None:
    """`k`, a short search (a lenient SLO, max C 2, 20 s a level at most),
    ctrl+r: the capacity figure on the screen as the search ends, the one the
    run record holds; escape back to the dashboard."""
    import json

    tmux.keys("k")
    tmux.wait_for(lambda s: "Search capacity (ctrl+r)" in s, 15, "the pane on its capacity search")
    # The SLO has the focus; Tab goes on to the search's mode, start C, max C, ...
    for value, tabs, field in (("ttft_p99=5s", 0, r"ttft_p99=5s"), ("2", 3, r"\n2\s+0\.1\s"),
                               ("20", 5, r"\n20\s*\n")):  # SLO, max C, level s
        if tabs:
            tmux.keys(*["Tab"] * tabs)
            # Apart too: keys read in one go are all handed to the field focused as they
            # arrive, so a ctrl+u right behind the Tabs cleared the SLO, not max C (the
            # typed 2 then replaced max C's selected text), on a busy box (ciR, 2026-12-06).
            time.sleep(0.5)
        tmux.keys("C-u")
        # Apart, and typed literally: a ctrl+u followed at once by text reached the field as
        # one sequence and the text was lost (tmux 3, 2026-12-05).
        time.sleep(0.5)
        tmux.keys("-l", value)
        tmux.wait_for(lambda s, f=field: re.search(f, s), 10, f"{value} typed in its field")
    tmux.keys("C-r")
    screen = tmux.wait_for(lambda s: re.search(r"capacity: concurrency (≥ )?\d+", s) or "Cannot search" in s,
                           240, "the capacity figure on the 80x24 screen")
    m = re.search(r"capacity: concurrency (?:≥ )?(\d+)", screen)
    assert m, f"the search did not answer:\n{screen}"
    assert "levels by load" in screen, screen  # the level table in view under the answer
    ids = subprocess.run([str(ERNIE_TUI), "runs", "list", "--kind", "capacity"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()[1].split()[0]
    shown_rec = subprocess.run([str(ERNIE_TUI), "runs", "show", ids, "--json"], env=env, capture_output=True,
                               text=True, timeout=60, check=True).stdout
    assert json.loads(shown_rec)["results"]["capacity"]["concurrency"] == int(m.group(1))
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "READY" in s, 15, "back on the dashboard")


def _health(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _leave(tmux: Tmux, url: str) -> None:
    """q, then l (leave it running): ernie-tui exits and the server still answers."""
    tmux.keys("q")
    tmux.wait_for(lambda s: "Quit ernie-tui" in s, 15, "the quit dialog")
    tmux.keys("l")
    _exits(tmux, "after leave")
    assert _health(url), "the server left running answers"


def _take_back(tmux: Tmux, run: str, cols: int, rows: int) -> str:
    """Plain `ernie-tui`: the server left running is taken back, shown as ours with its log."""
    tmux.start(run, cols, rows)
    screen = tmux.wait_for(lambda s: "READY" in s and "cpu-demo" in s, 60, "the left-running server taken back")
    assert "STOPPED" not in screen
    return tmux.wait_for(lambda s: "took back" in s or "Uvicorn" in s or "startup complete" in s.lower(), 30,
                         "its log (or the note that it was taken back)")


def _exits(tmux: Tmux, what: str) -> None:
    deadline = time.monotonic() + 30
    while tmux.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not tmux.alive(), f"ernie-tui did not exit {what}"


def test_new_user_path_leave_come_back_stop(tmp_path):
    """The README's path for a new user (issue #18), on one vLLM start:
    `ernie-tui demo` at 80x24, READY and its report, a probe, a capacity
    search, quit -> leave; plain `ernie-tui` at 160x48 takes the server back
    (ours, with its log and the whole footer); leave again; back at 80x24,
    `ernie-tui stop` from another shell stops it and the dashboard sees that.
    (x is the other test's; quit -> stop is the Pilot tests'.) Content, not
    positions: the layout at 80x24 is allowed to change."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed")
    home, env, url = _demo_home(tmp_path)
    record = home / "state" / "server.json"
    tmux = Tmux(f"ernie-tui-path-{os.getpid()}")
    run = f"cd {ROOT} && exec env -u COLUMNS -u LINES ERNIE_TUI_HOME={home} {ERNIE_TUI}"
    server_pid = None
    try:
        tmux.start(f"{run} demo", 80, 24)
        tmux.wait_for(lambda s: "READY" in s and "cpu-demo" in s, START_TIMEOUT, "the demo to be ready")
        tmux.wait_for(lambda s: re.search(r"[\d,]+ tokens", s), 30, "the report's KV tokens")
        tmux.keys("p")
        tmux.wait_for(lambda s: "Send" in s or "Probe" in s, 15, "the probe pane")
        tmux.keys("C-r")
        tmux.wait_for(lambda s: re.search(r"TTFT\s+[\d.,]+\s*ms", s), 120, "the probe's TTFT")
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "READY" in s, 15, "back on the dashboard")
        _capacity_search_at_80x24(tmux, env)  # issue 44: the capacity figure was below an 80x24 screen
        _leave(tmux, url)
        import json

        server_pid = json.loads(record.read_text())["pid"]

        # 160x48 shows the whole footer (80x24's is operator-ui's, issue #18, 7: it ended at "/ Sea" on main).
        screen = _take_back(tmux, run, 160, 48)
        assert "q Quit" in screen and "x Stop" in screen, screen
        _leave(tmux, url)

        _take_back(tmux, run, 80, 24)
        out = subprocess.run([str(ERNIE_TUI), "stop"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "stopped cpu-demo" in out.stdout, out
        tmux.wait_for(lambda s: "STOPPED" in s, 60, "the dashboard to see it stopped")
        assert not _health(url), "the server still answers"
        assert not psutil.pid_exists(server_pid) or not alive([psutil.Process(server_pid)])
        assert not record.exists(), "server.json went with the server"
        tmux.keys("q")
        _exits(tmux, "with nothing running")
    finally:
        tmux.kill()
        if server_pid is not None and psutil.pid_exists(server_pid):
            subprocess.run([str(ERNIE_TUI), "stop"], env=env, capture_output=True, timeout=120)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
