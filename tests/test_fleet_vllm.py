"""The fleet view against two real vLLM (CPU build) servers with the tiny
model: the session's shared server and a second one started here (which
this test may stop). Slow: a start is ~50 s on 2 cores."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from textual.widgets import DataTable

from ernie_tui.engine_ctl.control.fleet import FleetServer
from ernie_tui.tui.fleet_app import make_fleet_app
from ernie_tui.tui.screens.fleet import FleetScreen, ServerDashboard
from vllm_support import start_server

pytestmark = pytest.mark.vllm


async def wait_for(pilot, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def completions(url: str, model: str, n: int) -> None:
    for i in range(n):
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": f"one two three {i}",
                                                      "max_tokens": 16, "ignore_eos": True}, timeout=120)
        r.raise_for_status()


async def test_fleet_of_two_real_vllm_servers(cpu_server, tmp_path):
    second = start_server("cpu-demo", tmp_path)
    try:
        servers = [FleetServer("shared", cpu_server.status.url, log=str(cpu_server.status.log_path),
                               preset="cpu-demo"),
                   FleetServer("second", second.status.url, log=str(second.status.log_path), preset="cpu-demo")]
        app = make_fleet_app(servers, interval=0.5, include_user_presets=False)
        async with app.run_test(size=(150, 40)) as pilot:
            rows = lambda name: app.fleet.rows[name]  # noqa: E731
            await wait_for(pilot, lambda: all(rows(n)[0].state == "up" for n in ("shared", "second")), 30,
                           "both servers up")
            model = rows("second")[0].model
            assert model and model.endswith("tiny-ernie")  # the model_name label of real vLLM
            for name in ("shared", "second"):
                row = rows(name)[0]
                assert row.engines == 1 and row.kv_pct is not None and row.running is not None
                assert row.memory_source == "rss" and row.memory_bytes > 50 << 20  # the local engine's RSS

            # load on the second: its tokens/s and vLLM's TTFT / ITL histograms show it
            import asyncio

            await asyncio.to_thread(completions, second.status.url, model, 4)
            await wait_for(pilot, lambda: rows("second")[0].ttft_p99_s is not None
                           and rows("second")[0].itl_p99_s is not None, 15, "TTFT and ITL p99 of the second")
            row = rows("second")[0]
            assert 0 < row.ttft_p99_s < 60 and 0 < row.itl_p99_s < 60
            table = app.fleet.query_one(DataTable)
            assert table.get_cell("second", "ttft").plain.endswith(("ms", " s"))

            # Enter: the full dashboard of the shared server, then back
            await pilot.press("enter")
            assert isinstance(app.screen, ServerDashboard)
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready"
                           and app.report is not None and app.report.kv_cache_tokens, 30,
                           "the shared server's dashboard with its startup report")
            assert app.status.url == cpu_server.status.url
            await pilot.press("b")
            await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), 5, "back on the fleet")

            # the second stops: since when, its last figures kept; the shared one goes on
            kv_before = table.get_cell("second", "kv").plain
            second.stop()
            await wait_for(pilot, lambda: rows("second")[0].state == "down", 15, "the second marked down")
            assert re.fullmatch(r"not answering since \d\d:\d\d:\d\d: .+", table.get_cell("second", "state").plain)
            assert table.get_cell("second", "kv").plain == kv_before
            assert table.get_cell("second", "ttft").plain != "–"
            assert rows("shared")[0].state == "up"
    finally:
        second.stop()
