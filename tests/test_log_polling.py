"""Our own polling never floods the log (issue #18, 1).

A server we start leaves /metrics and /health out of its access log (the
preset's default flag, honoured by the stand-in as by vLLM); a server we only
attach to may log every poll, and the pane folds those lines: counted in the
pane's title, `a` shows them, every other line stays, and the pane's line
numbers (search, root cause, scrolling back) still match the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from ernie_tui.engine_ctl.control.server import EngineServer, ServerState
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.presets import load_presets
from ernie_tui.tui.app import make_app
from ernie_tui.tui.widgets.log_view import _CONTROL, LogView, is_polling_line
from test_tui_pilot import FAKE, fake_presets, tailed_lines, wait_for  # noqa: F401  (fake_presets: a fixture)

POLL = '(APIServer pid=7) INFO:     127.0.0.1:{} - "GET /metrics HTTP/1.1" 200 OK'
HEALTH = 'INFO:     127.0.0.1:{} - "GET /health HTTP/1.1" 200 OK'


def test_polling_line_pattern():
    assert is_polling_line(POLL.format(45254)) and is_polling_line(HEALTH.format(1))
    assert not is_polling_line('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK')
    assert not is_polling_line('INFO:     127.0.0.1:1 - "GET /v1/models HTTP/1.1" 200 OK')
    assert not is_polling_line('(APIServer pid=7) INFO 12-01 10:00:00 [api.py:1] saw "GET /metrics HTTP/1.1" 200')


def test_a_server_we_start_does_not_log_our_polling(fake_presets, tmp_path):  # noqa: F811
    preset = load_presets([str(fake_presets)], include_user=False).get("fake-a")
    server = EngineServer(preset.launch_spec(), preset_name="fake-a", log_path=tmp_path / "llm.log")
    server.start()
    try:
        assert server.wait_ready(30).state == ServerState.READY
        with httpx.Client(timeout=5) as client:
            for _ in range(5):
                assert client.get(f"{server.url}/metrics").status_code == 200
                assert client.get(f"{server.url}/health").status_code == 200
            assert client.get(f"{server.url}/v1/models").status_code == 200
        deadline = time.monotonic() + 60
        text = ""
        while '"GET /v1/models' not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = (tmp_path / "llm.log").read_text()
        assert '"GET /v1/models' in text, "a real client's request is still logged"
        assert '"GET /metrics' not in text and '"GET /health' not in text
    finally:
        server.stop()
        server.close()


def rows(log: LogView) -> list[int]:
    return [log._row_line_no(r) for r in range(log._row_count)]


async def test_pane_rows_keep_the_files_numbers(tmp_path):
    """Folding through appends, a prune past the cap and a prepend: each row
    shows the line whose number it claims, and no other line is lost."""
    log_file = tmp_path / "llm.log"
    log_file.write_text("")
    app = make_app(mode="attach", attach_url=f"http://127.0.0.1:{free_port()}", log_path=str(log_file),
                   live=False)
    lines = [POLL.format(i) if i % 3 else f"INFO:     engine line {i}" for i in range(1, 401)]
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.main.query_one(LogView)
        log.max_lines = 100
        log.append(lines[200:260], first_line_no=201)
        log.flush()
        for start in range(260, 400, 35):  # past the cap of 100: pruned in chunks
            log.append(lines[start:start + 35])
            log.flush()
        await pilot.pause()
        first = log._first_no
        held = lines[first - 1:400]
        assert log.lines() == held
        shown = [first + i for i, ln in enumerate(held) if not is_polling_line(ln)]
        assert rows(log) == shown
        assert log.polling_folded == len(held) - len(shown)
        for row in range(log._row_count):
            number = log._row_line_no(row)
            assert log._lines[number - first] == lines[number - 1]
        # Scrolling back reads earlier lines: they fold too, numbers kept.
        earlier = lines[first - 31:first - 1]
        log.max_lines = 200  # room for them
        assert log.prepend(earlier, first - 30) == 30
        held = lines[first - 31:400]
        assert rows(log) == [first - 30 + i for i, ln in enumerate(held) if not is_polling_line(ln)]
        assert "folded · a shows" in app.main.query_one("#log-pane").border_subtitle
        # a shows them: one row per line again; a folds them again.
        log.focus()
        await pilot.press("a")
        assert rows(log) == list(range(first - 30, 401)) and not log.fold_polling
        assert "shown · a folds" in app.main.query_one("#log-pane").border_subtitle
        await pilot.press("a")
        assert log.fold_polling and len(rows(log)) == len(held) - log.polling_folded
        # A jump to a folded line (a search match) shows the folded lines.
        target = next(n for n in range(first, 401) if is_polling_line(lines[n - 1]))
        assert log.jump_to_line(target)
        assert not log.fold_polling
        row = int(log.scroll_y) + (target - int(log.scroll_y) - (first - 30))
        assert log._row_line_no(row) == target


@pytest.fixture
def attached_fake(tmp_path, fixtures_dir, tiny_model):
    """A stand-in vLLM this test starts itself (as someone else would), with
    the access log on, writing its log to a file."""
    port = free_port()
    log_path = tmp_path / "other.log"
    env = {**os.environ, "ERNIE_FAKE_FIXTURES": str(fixtures_dir / "cpu-vllm0.32.0"), "ERNIE_FAKE_DELAY": "0.05"}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(FAKE), "--model", str(tiny_model), "--port", str(port),
                                 "--block-size", "32"], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    yield f"http://127.0.0.1:{port}", log_path
    proc.send_signal(2)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_attached_servers_polling_is_folded(attached_fake, size):
    url, log_path = attached_fake
    app = make_app(mode="attach", attach_url=url, log_path=str(log_path), sample_interval=0.2)
    async with app.run_test(size=size) as pilot:
        log = app.main.query_one(LogView)
        await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready", what="ready")
        await wait_for(pilot, lambda: log.polling_folded >= 8, what="our polling in the log")
        with httpx.Client(timeout=5) as client:
            assert client.get(f"{url}/v1/models").status_code == 200
        await wait_for(pilot, lambda: any('"GET /v1/models' in ln for ln in log.lines()), what="a client's line")
        # The engine's own 10 s line can land between reading the held lines
        # and the rows drawn from them (seen once in CI): let the rows catch up
        # first; a pane that folds the wrong lines never does, and fails here.
        await wait_for(pilot, lambda: [log._lines[n - log._first_no] for n in rows(log)]
                       == [ln for ln in log.lines() if not is_polling_line(ln)], what="the rows to match the lines")
        held = log.lines()
        file_lines = tailed_lines(log_path)
        as_shown = [_CONTROL.sub("", ln.expandtabs()) for ln in file_lines]  # the pane's cleaning
        assert held == as_shown[:len(held)], "every line of the file is held, in order"
        shown = [log._lines[n - log._first_no] for n in rows(log)]
        assert shown == [ln for ln in held if not is_polling_line(ln)], "only polling lines are folded"
        assert any('"GET /v1/models' in ln for ln in shown)
        assert not any('"GET /metrics' in ln or '"GET /health' in ln for ln in shown)
        subtitle = app.main.query_one("#log-pane").border_subtitle
        assert "/metrics·/health lines folded · a shows" in subtitle
        # The numbers match the file: search finds the engine's line under its own number.
        log.search("Starting vLLM server")
        info = log.search_info()
        assert info is not None and info[1] == 1
        number = log._search.matches[0]
        assert "Starting vLLM server" in file_lines[number - 1]
        log.focus()
        await pilot.press("a")
        assert not log.fold_polling and log._row_count == len(log._lines)
