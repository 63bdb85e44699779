"""What the dashboard redoes while a log floods and keys are pressed.

A layout pass reflows and repaints the whole screen (10-20 ms on the dev
box). Under a flood, the report changes up to 4 times a second (the log
keeps bringing startup lines) and each change that added or removed a row
cost two of them; every `?` open and close rebuilt the footer's key widgets
and cost more (docs/lab/benchmarks/tui-overhead.md, "Dashboard overhead"). These tests count
the layout passes and the footer's widgets on the real app.
"""

from __future__ import annotations

from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey

from ernie_tui.engine_ctl.control.server import ServerState, ServerStatus
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.tui.app import make_app
from ernie_tui.tui.messages import ReportUpdate, StatusUpdate
from ernie_tui.tui.widgets.log_view import LogView
from test_logparse_ranks import H200, dp2_log
from test_tui_snapshots import NOW, PRESETS, URL

SIZE = (120, 40)


def app_for(tmp_path):
    from ernie_tui.presets import load_presets

    path = tmp_path / "presets.toml"
    path.write_text(PRESETS)
    return make_app(book=load_presets([path], include_user=False), preset="cpu-demo", live=False,
                    clock=lambda: NOW, include_user_presets=False)


def ready() -> StatusUpdate:
    return StatusUpdate(ServerStatus(state=ServerState.READY, phase="ready", preset_name="cpu-demo", url=URL,
                                     pid=13903, started_at=NOW - 60, ready_at=NOW - 30))


async def settle(pilot) -> None:
    for _ in range(4):
        await pilot.pause(0.05)


def count_layouts(screen) -> list[int]:
    """Count the screen's layout passes from now on."""
    passes = [0]
    original = screen._refresh_layout

    def counted(*args, **kwargs):
        passes[0] += 1
        return original(*args, **kwargs)

    screen._refresh_layout = counted
    return passes


async def test_report_changes_need_no_layout_pass(tmp_path, fixtures_dir):
    one_gpu = parse_file(fixtures_dir / H200)
    parser = LogParser()
    parser.feed_many(dp2_log(fixtures_dir))
    two_ranks = parser.report  # two more rows than one_gpu: "ranks" and the second rank
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(ready())
        app.post_message(ReportUpdate(one_gpu, run=1))
        await settle(pilot)
        body = app.main.query_one("#report-body", Static)
        height = body.size.height
        passes = count_layouts(app.main)
        for i in range(6):
            report = two_ranks if i % 2 == 0 else one_gpu
            app.post_message(ReportUpdate(report, run=1))
            await settle(pilot)
            # The panel shows each report as it comes...
            assert ("EngineCore_DP1 pid 2041" in str(body.content)) == (report is two_ranks)
        # ... without reflowing the screen, and the body keeps its height.
        assert passes[0] == 0, f"{passes[0]} layout passes for 6 report changes"
        assert body.size.height == height
        phases = app.main.query_one("#phase-line", Static)
        assert phases.region.bottom <= app.main.query_one("#report").content_region.bottom, "phases stay in view"


def footer_keys(app) -> list[FooterKey]:
    return list(app.main.query_one(Footer).query(FooterKey))


async def test_help_open_close_keeps_the_footer(tmp_path):
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(ready())
        await settle(pilot)
        # Once, Textual lays the dashboard out again on its first return.
        for _ in range(2):
            await pilot.press("question_mark")
            await settle(pilot)
        keys = footer_keys(app)
        assert any(k.description == "Help" for k in keys)
        passes = count_layouts(app.main)
        for _ in range(3):
            await pilot.press("question_mark")
            await settle(pilot)
            assert "keys and figures" in str(app.screen.query_one(".dialog-title", Static).content)
            await pilot.press("question_mark")
            await settle(pilot)
            assert app.screen is app.main
        # The same key widgets, not rebuilt ones, and no reflow of the dashboard.
        assert footer_keys(app) == keys
        assert passes[0] == 0, f"{passes[0]} layout passes for 3 help opens and closes"


async def test_footer_follows_a_change_of_keys(tmp_path):
    """The footer still rebuilds when what it shows changes: `p` (probe) is
    disabled until the server is ready."""
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)

        def probe_key() -> FooterKey:
            return next(k for k in footer_keys(app) if k.action == "probe")

        assert probe_key().has_class("-disabled")
        app.post_message(ready())
        await settle(pilot)
        assert not probe_key().has_class("-disabled")
        log = app.main.query_one(LogView)
        assert log.has_focus  # the bindings the footer shows are the log pane's screen's



async def test_focus_moving_keeps_the_footer(tmp_path):
    """Tab moves the focus between the presets list and the log pane: their
    own bindings (scroll keys, enter) are hidden, the keys the footer draws
    stay the same, and so do its widgets."""
    app = app_for(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(ready())
        await settle(pilot)
        keys = footer_keys(app)
        log = app.main.query_one(LogView)
        assert log.has_focus
        await pilot.press("tab")
        await settle(pilot)
        assert app.focused is not None and app.focused.id == "preset-list"
        await pilot.press("shift+tab")
        await settle(pilot)
        assert log.has_focus
        assert footer_keys(app) == keys
