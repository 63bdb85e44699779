"""Snapshot tests of the dashboard at 120x40 (pytest-textual-snapshot).

Deterministic: the app runs with live=False (no sampler, no server), a frozen
clock, a fixed presets file, and the data fed through the same messages the
workers post: a status, a report parsed by the real LogParser from a fixture
log, the log lines themselves, and a fixed chart series.
Update after an intended change with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ernie_tui.engine_ctl.control.server import ServerState, ServerStatus
from ernie_tui.engine_ctl.logs.logparse import LogParser
from ernie_tui.presets import PresetBook, load_presets
from ernie_tui.tui.app import make_app
from ernie_tui.tui.messages import LogBatch, ReportUpdate, SeriesUpdate, StatusUpdate
from ernie_tui.tui.series import ChartPoint

SIZE = (120, 40)
NOW = 1_764_480_000.0  # the frozen clock
URL = "http://127.0.0.1:8011"

PRESETS = """
[presets.cpu-demo]
description = "CPU demo with the tiny stand-in model: block 32, explicit 64 MiB KV cache."
model = "/models/tiny-ernie"
block_size = 32
max_model_len = 2048
kv_cache_memory_bytes = "64M"
port = 8011

[presets.cpu-demo-b64]
extends = "cpu-demo"
description = "CPU demo with block 64 and a 128 MiB KV cache."
block_size = 64
kv_cache_memory_bytes = "128M"

[presets.cpu-block16]
extends = "cpu-demo"
description = "Block 16 on CPU: vLLM refuses it (CPU attention needs a multiple of 32)."
block_size = 16

[presets.seed-A]
description = "The posts' default: block 16, max_model_len 4096."
block_size = 16
max_model_len = 4096
"""


@pytest.fixture
def book(tmp_path) -> PresetBook:
    path = tmp_path / "snap-presets.toml"
    path.write_text(PRESETS)
    full = load_presets([path], include_user=False)
    return PresetBook(presets={n: p for n, p in full.presets.items() if p.source == str(path)},
                      sources=[str(path)])


def fixture_lines(fixtures_dir: Path, name: str, until: str | None = None) -> list[str]:
    lines = (fixtures_dir / "cpu-vllm0.32.0" / name).read_text(errors="replace").splitlines()
    if until is not None:
        lines = lines[: next(i for i, ln in enumerate(lines) if until in ln) + 1]
    return lines


def parse(lines: list[str]):
    parser = LogParser()
    for line in lines:
        parser.feed(line)
    return parser.report


def series() -> SeriesUpdate:
    points = []
    for i in range(0, 300, 2):
        t = NOW - 300 + i
        load = 0.5 + 0.5 * math.sin(i / 25.0)
        points.append(ChartPoint(t=t, mem_gib=(1.20 + 0.05 * load,), prompt_tps=round(40 * load, 1),
                                 gen_tps=round(220 * load, 1), kv_pct=round(30 * load, 1),
                                 running=int(4 * load), waiting=int(load > 0.9)))
    return SeriesUpdate(tuple(points), memory_label="engine RSS (psutil; NVML unavailable)",
                        memory_source="rss", kv_tokens_metrics=65536, now=NOW)


def app_for(book, **kw):
    return make_app(book=book, preset="cpu-demo", live=False, clock=lambda: NOW, **kw)


def feed(app, status, report=None, lines=None, charts=None):
    app.post_message(StatusUpdate(status))
    if lines is not None:
        app.post_message(LogBatch(lines, run=1, first_line_no=1))
    if report is not None:
        app.post_message(ReportUpdate(report, run=1))
    if charts is not None:
        app.post_message(charts)


async def settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
    pilot.app.main.log_view.flush()  # the log pane repaints at most 5 times a second
    await pilot.wait_for_scheduled_animations()
    # A status change refreshes the footer's bindings, which recomposes the
    # footer when the app is next idle: let that finish before the screenshot.
    for _ in range(3):
        await pilot.pause(0.05)


def test_stopped(snap_compare, book):
    async def run_before(pilot):
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZE, run_before=run_before)


def test_starting_mid_phase(snap_compare, book, fixtures_dir):
    lines = fixture_lines(fixtures_dir, "ok_block32_len2048.log", until="Warming up model")
    report = parse(lines)
    status = ServerStatus(state=ServerState.STARTING, phase=report.phase, preset_name="cpu-demo", url=URL,
                          pid=13903, started_at=NOW - 17)

    async def run_before(pilot):
        feed(pilot.app, status, report, lines)
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZE, run_before=run_before)


def test_ready_with_charts(snap_compare, book, fixtures_dir):
    lines = fixture_lines(fixtures_dir, "ok_block32_len2048.log", until="Prefix cache hit rate")
    report = parse(lines)
    status = ServerStatus(state=ServerState.READY, phase="ready", preset_name="cpu-demo", url=URL, pid=13903,
                          started_at=NOW - 312, ready_at=NOW - 284)

    async def run_before(pilot):
        feed(pilot.app, status, report, lines, series())
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZE, run_before=run_before)


def test_crashed(snap_compare, book, fixtures_dir):
    lines = fixture_lines(fixtures_dir, "fail_block16.log")
    report = parse(lines)
    assert report.error is not None
    status = ServerStatus(state=ServerState.CRASHED, preset_name="cpu-block16", url=URL, pid=7817,
                          started_at=NOW - 60, exit_code=1, error=report.error)

    async def run_before(pilot):
        pilot.app.post_message(ReportUpdate(report, run=1))
        feed(pilot.app, status, None, lines)
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare, book):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZE, run_before=run_before)


# -- 80x24 and 160x48 (issue #18, 7): the footer keeps `? Help` and `q Quit`, `g` is in the footer
# while charts swap with the log, chart titles fit, preset arguments are whole, help wraps under itself.

SIZES = {"80x24": (80, 24), "160x48": (160, 48)}


def ready_feed(pilot, fixtures_dir, charts=True):
    lines = fixture_lines(fixtures_dir, "ok_block32_len2048.log", until="Prefix cache hit rate")
    status = ServerStatus(state=ServerState.READY, phase="ready", preset_name="cpu-demo", url=URL, pid=13903,
                          started_at=NOW - 312, ready_at=NOW - 284)
    feed(pilot.app, status, parse(lines), lines, series() if charts else None)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_ready_at(snap_compare, book, fixtures_dir, size):
    async def run_before(pilot):
        ready_feed(pilot, fixtures_dir)
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=size, run_before=run_before)


def test_charts_swapped_in_at_80x24(snap_compare, book, fixtures_dir):
    async def run_before(pilot):
        ready_feed(pilot, fixtures_dir)
        await settle(pilot)
        await pilot.press("g")
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZES["80x24"], run_before=run_before)


def test_replay_charts_at_80x24(snap_compare, book, fixtures_dir):
    """A replayed log has no memory figures: the chart says so in lines that
    fit it (it showed 'og holds no memory fig')."""
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("g")
        pilot.app.clear_notifications()  # "replayed N lines" would cover the charts
        await settle(pilot)

    log = fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log"
    app = make_app(book=book, mode="replay", replay_path=str(log), live=False, clock=lambda: NOW)
    assert snap_compare(app, terminal_size=SIZES["80x24"], run_before=run_before)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_help_at(snap_compare, book, size):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_crashed_at(snap_compare, book, fixtures_dir, size):
    lines = fixture_lines(fixtures_dir, "fail_block16.log")
    report = parse(lines)
    status = ServerStatus(state=ServerState.CRASHED, preset_name="cpu-block16", url=URL, pid=7817,
                          started_at=NOW - 60, exit_code=1, error=report.error)

    async def run_before(pilot):
        pilot.app.post_message(ReportUpdate(report, run=1))
        feed(pilot.app, status, None, lines)
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=size, run_before=run_before)


async def test_the_80x24_footer_keeps_help_and_quit(book, fixtures_dir):
    """The footer's text itself, besides the pictures: at 80x24 it ended at
    `/ Sea`, without `? Help` or `q Quit`, and never showed `g`."""
    for size in SIZES.values():
        app = app_for(book)
        async with app.run_test(size=size) as pilot:
            ready_feed(pilot, fixtures_dir)
            await settle(pilot)
            footer = app.screen._compositor.render_strips()[-1].text
            assert "? Help" in footer and "q Quit" in footer, footer
            assert ("g Charts" in footer) == (size == (80, 24)), footer
            if size == (80, 24):
                await pilot.press("g")
                await settle(pilot)
                assert "g Log" in app.screen._compositor.render_strips()[-1].text


# -- the capacity screen after a search (issue 44: items 1, 4, 5), the pictures in docs/img/ ---------------

@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_capacity_after_a_search_at(snap_compare, size):
    """The walkthrough's search (tests/finished_search.py), handed to the
    Burst tab as its worker hands it: the answer on top, the capacity first;
    the level table by load with the answer's row marked; at 80x24 the table
    alone (ctrl+t swaps in the chart), whole columns only."""
    from ernie_tui.tui.messages import CapacityDone
    from ernie_tui.tui.screens.probe import ProbeScreen
    from finished_search import finished_search
    from test_tui_probe import Host

    record = "20261205T131500-capacity-abc123"

    async def run_before(pilot):
        screen = pilot.app.screen
        # a fixed head: the lookup of a port nothing listens on has failed
        while "cannot read" not in str(screen.query_one("#pf-head").content):
            await pilot.pause(0.05)
        await pilot.press("ctrl+b")
        tab = screen.burst_tab
        tab.query_one("#pf-b-capacity").value = True
        await pilot.pause()
        path = f"~/.local/share/ernie-tui/runs/{record}.json"
        tab.post_message(CapacityDone(tab._run, finished_search(), record, path))
        while tab.last_capacity is None:
            await pilot.pause(0.05)
        await settle_screen(pilot)

    assert snap_compare(Host(ProbeScreen("http://127.0.0.1:9")), terminal_size=size, run_before=run_before)


async def settle_screen(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    for _ in range(3):
        await pilot.pause(0.05)


async def test_the_80x24_status_bar_keeps_ready_in_whole(book, fixtures_dir):
    """At 80 columns the status line ran off the edge in the middle of
    "ready in" and its value; it now leaves out the pid (then the address's
    scheme, vLLM's version, the platform) first."""
    for size in SIZES.values():
        app = app_for(book)
        async with app.run_test(size=size) as pilot:
            ready_feed(pilot, fixtures_dir)
            await settle(pilot)
            top = app.screen._compositor.render_strips()[0].text
            assert "ready in 28.0 s" in top and "CONTROL" in top, top
            assert ("pid 13903" in top) == (size == (160, 48)), top


# -- the traffic view (`T`): a real window of vLLM /metrics (tests/fixtures/traffic) -----------------

def traffic_state():
    from ernie_tui.engine_ctl.load import MetricsSnapshot
    from ernie_tui.tui.traffic_watch import TrafficWatch

    fix = Path(__file__).parent / "fixtures" / "traffic" / "cpu-vllm0.32.0"
    watch = TrafficWatch()
    for name, t in (("window_before.metrics", 0.0), ("window_before.metrics", 4.0), ("window_after.metrics", 8.0),
                    ("window_after.metrics", 12.0), ("window_after.metrics", 15.5)):
        watch.add(URL, MetricsSnapshot.parse((fix / name).read_text(), timestamp=NOW + t, mono=t))
    return watch.state()


def test_traffic_view_at_80x24(snap_compare, book, fixtures_dir):
    from ernie_tui.tui.messages import TrafficUpdate

    async def run_before(pilot) -> None:
        ready_feed(pilot, fixtures_dir)
        pilot.app.post_message(TrafficUpdate(traffic_state()))
        await settle(pilot)
        await pilot.press("T")
        await settle(pilot)

    assert snap_compare(app_for(book), terminal_size=SIZES["80x24"], run_before=run_before)
