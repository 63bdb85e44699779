"""Pilot tests of the operator's screens of issue #18 (items 6, 7 and 8's
sweep part), each at 80x24 and at a wide terminal."""

from __future__ import annotations

import re
import socket
import time

import pytest
from textual.widgets import DataTable, Static

from ernie_tui.engine_ctl.control.fleet import FleetServer
from ernie_tui.tui.fleet_app import make_fleet_app
from ernie_tui.tui.screens.fleet import ServerDashboard

SIZES = [(80, 24), (160, 48)]


def refused_url() -> str:
    with socket.socket() as s:  # nothing listens there once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.parametrize("size", SIZES)
async def test_a_dead_fleet_member_says_why_and_what_to_do(size, tmp_path):
    server = FleetServer("gone", refused_url(), log=str(tmp_path / "gone.log"), preset="cpu-demo")
    app = make_fleet_app([server], interval=0.3, include_user_presets=False)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.fleet.query_one(DataTable).get_cell("gone", "state").plain
                       .startswith("not answering since"), what="marked down in the table")
        state = app.fleet.query_one(DataTable).get_cell("gone", "state").plain
        # the row says why, not only since when
        assert re.fullmatch(r"not answering since \d\d:\d\d:\d\d: connection refused", state)

        await pilot.press("enter")
        assert isinstance(app.screen, ServerDashboard)
        await wait_for(pilot, lambda: "Not answering since" in str(app.main.query_one("#report-body", Static).content),
                       what="the dashboard saying the server does not answer")
        await wait_for(pilot, lambda: "What to do" in screen_text(app) and "server not ready" not in screen_text(app),
                       what="the screen drawn with it")
        body = str(app.main.query_one("#report-body", Static).content)
        assert "connection refused" in body and "Nothing is starting" in body and "What to do" in body
        assert "ernie-tui --preset cpu-demo" in body
        text = screen_text(app)
        assert "No startup report yet" not in text and "fills in from the server's log" not in text
        assert "server not ready" not in text
        assert "Not answering since" in text and "What to do" in text  # on screen, wrapped, not cut


# -- the sweep screen: machine facts, and a table wider than the screen --------------------------

def sweep_app(book, machine):
    from textual.app import App

    from ernie_tui.tui.screens.sweep import SweepScreen

    class SweepOnly(App):
        def on_mount(self) -> None:
            self.push_screen(SweepScreen(book, machine=machine))

    return SweepOnly()


@pytest.mark.parametrize("size", SIZES)
async def test_the_sweep_says_which_presets_cannot_run_on_a_cpu_box(size):
    from ernie_tui.engine_ctl.launch.machine import Machine
    from ernie_tui.presets import load_presets

    book = load_presets([], include_user=False)  # the built-ins: tp2, tp4, dp2 ...
    app = sweep_app(book, Machine(platform="cpu", source="test"))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.screen.query("#sw-presets") and app.screen.query_one("#sw-presets")
                       .option_count > 0, what="the preset list")
        presets = app.screen.query_one("#sw-presets")
        prompts = {presets.get_option_at_index(i).value: str(presets.get_option_at_index(i).prompt)
                   for i in range(presets.option_count)}
        for name in ("tp2", "tp4", "dp2"):
            assert "cannot run" in prompts[name] or "needs" in prompts[name], prompts[name]
        assert "needs 2 GPUs: this machine has none (CPU)" in prompts["tp2"]
        assert "needs" not in prompts["seed-A"]
        # the description of a highlighted one says so in words
        presets.highlighted = list(prompts).index("tp4")
        await wait_for(pilot, lambda: "Cannot run here: needs 4 GPUs" in str(app.screen.query_one("#sw-desc").content),
                       what="tp4's description")
        # the results table names the columns beyond its right edge
        table = app.screen.query_one("#sw-table")
        await wait_for(pilot, lambda: table.border_subtitle.startswith("← → shows "), what="the table's subtitle")
        assert "max conc." in table.border_subtitle or "…" in table.border_subtitle


# -- capacity levels: ours beside vLLM's, and why they differ (item 3's dashboard part) --------------

def level(concurrency: int, ttft_p99: float, vllm_ttft_p99: float, itl_p99: float = 20.0, vllm_itl_p99: float = 19.0):
    from ernie_tui.engine_ctl.load.capacity import LevelResult

    # The demo's first level of the issue: client TTFT p99 716 ms, vLLM's 76 ms.
    return LevelResult(concurrency=concurrency, requests=20, ok=20, seconds=30.0, requests_per_s=0.7,
                       output_tps=80.0, ttft_p50_ms=300.0, ttft_p99_ms=ttft_p99, itl_p50_ms=15.0, itl_p99_ms=itl_p99,
                       attainment=0.4, passed=False, decided=True, verdict="fail", stop="decided",
                       vllm={"ttft_p99_ms": vllm_ttft_p99, "itl_p99_ms": vllm_itl_p99, "requests_finished": 20.0})


def view_app():
    from textual.app import App, ComposeResult

    from ernie_tui.tui.widgets.capacity_view import CapacityView

    class ViewOnly(App):
        CSS_PATH = "../src/ernie_tui/tui/ernie_tui.tcss"

        def compose(self) -> ComposeResult:
            yield CapacityView()

    return ViewOnly()


@pytest.mark.parametrize("size", SIZES)
async def test_the_level_table_shows_vllms_figures_and_says_why_they_differ(size):
    from ernie_tui.engine_ctl.load import parse_slo
    from ernie_tui.tui.widgets.capacity_view import CapacityView

    app = view_app()
    async with app.run_test(size=size) as pilot:
        view = app.query_one(CapacityView)
        view.reset(parse_slo(["ttft_p99=1s"]), "searching")
        view.show_levels([level(1, 716.0, 76.0), level(2, 531.0, 480.0)])
        # Drawn on screen, not beyond an edge (waited for: a busy box lays out late).
        await wait_for(pilot, lambda: "76.0 (9.4×)" in screen_text(app) and "API server process" in screen_text(app),
                       what="the flagged figure and the note on screen")
        table = view.query_one("#pf-cap-levels", DataTable)
        labels = [str(c.label) for c in table.columns.values()]
        # ours beside vLLM's; the verdict right after the load (issue 44: it was past the right edge)
        assert labels[:5] == ["conc.", "verdict", "TTFT p99", "(vLLM's)", "ITL p99"]
        if size == (160, 48):
            assert labels[5] == "(vLLM's)"
        assert table.get_cell("level-0", "vllm_ttft_p99_ms").plain == "76.0 (9.4×)"  # flagged
        assert table.get_cell("level-1", "vllm_ttft_p99_ms").plain == "480.0"  # within the factor
        gap = str(view.query_one("#pf-cap-gap", Static).content)
        assert "conc. 1: TTFT p99 ours 716 ms, vLLM's 76 ms (9.4×)" in gap
        assert "client's CPU" in gap and "network" in gap and "API server process" in gap
        assert "conc. 2" not in gap


async def test_levels_that_agree_draw_no_note():
    from ernie_tui.engine_ctl.load import parse_slo
    from ernie_tui.tui.widgets.capacity_view import CapacityView

    app = view_app()
    async with app.run_test(size=(160, 48)) as pilot:
        view = app.query_one(CapacityView)
        view.reset(parse_slo(["ttft_p99=1s"]), "searching")
        view.show_levels([level(1, 80.0, 76.0)])
        await pilot.pause(0.1)
        assert not view.query_one("#pf-cap-gap", Static).display


def test_the_bursts_ttft_gap_against_vllm_is_explained():
    from dataclasses import replace

    from ernie_tui.engine_ctl.load.burst import BurstConfig, _failed_before_start
    from ernie_tui.engine_ctl.load.http_errors import ProbeError
    from ernie_tui.tui.widgets.burst_tab import describe_burst

    base = _failed_before_start("http://127.0.0.1:1", "tiny", BurstConfig(n=4),
                                ProbeError(kind="connection_refused", message="refused"))
    # The burst: ours +118 % against vLLM's TTFT mean.
    burst = replace(base, completed=4, not_sent=0, errors={"count": 0, "by_kind": {}, "first": []}, warnings=[],
                    comparison={"ttft_mean_ours_s": 0.218, "ttft_mean_vllm_s": 0.100, "ttft_mean_diff_pct": 118.0})
    text = str(describe_burst(burst))
    assert "ours 2.2× vLLM's" in text and "client's CPU" in text and "API server process" in text
    agree = replace(burst, comparison={"ttft_mean_ours_s": 0.105, "ttft_mean_vllm_s": 0.100})
    assert "client's CPU" not in str(describe_burst(agree))
