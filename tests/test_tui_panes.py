"""Issue 59, items 6, 8, 9 and 11, as the terminal shows them at 80x24 and 160x48.

6: `w` in the footer at 160 columns; help describes `w` as it is (paired
   capacity sweeps too) and names `tune`; `sweep`'s one-line help says the same.
8: the capacity answer's record line in view at 160x48 whatever its
   warnings; the chart's point labels never run into each other.
9: at 80x24 the level table's hidden columns are reachable (→ and ←), the
   note under it is whole, and a "none" answer's cause stands beside it.
11: `--attach URL` without `--log` says that no log was given and how to give one.

What is checked is what the terminal shows (the screen's rendered lines),
beside the pure placing of the chart's labels.
"""

from __future__ import annotations

import random
import re

import pytest
from textual.widgets import Checkbox, DataTable, Static

from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.load import CapacityResult, parse_slo
from ernie_tui.engine_ctl.load.capacity import speed_moved_warning, unconfirmed_warning
from ernie_tui.tui.messages import CapacityDone
from ernie_tui.tui.screens.probe import ProbeScreen
from ernie_tui.tui.widgets.capacity_view import CapacityView
from ernie_tui.tui.widgets.charts import CapacityChart, CapacityCurve, place_labels
from finished_search import SLO, _level, finished_search
from test_tui_probe import Host, wait_for

SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
RECORD = "20261207T020000-capacity-59abcd"


def screen_lines(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def show_finished(pilot, app, result: CapacityResult) -> tuple[ProbeScreen, CapacityView]:
    """The probe pane's capacity search, handed a finished search as its worker hands it."""
    screen = app.screen
    await pilot.press("ctrl+b")
    tab = screen.burst_tab
    tab.query_one("#pf-b-capacity", Checkbox).value = True
    await pilot.pause()
    tab.post_message(CapacityDone(tab._run, result, RECORD, f"/runs/{RECORD}.json"))
    view = screen.query_one(CapacityView)
    # An upper bound for a loaded box, not a speed claim.
    await wait_for(pilot, lambda: tab.last_capacity is not None and view.levels, 60, "the result on screen")
    await pilot.pause(0.3)
    return screen, view


def starved() -> CapacityResult:
    """The issue's "none" under a starved client: ours 535 ms at the lowest
    load where vLLM's own histogram says 39 ms."""
    low = _level(1, 535.0, 9.1, verdict="fail", passed=False)
    low.vllm = {"ttft_p99_ms": 39.3, "itl_p99_ms": 9.0}
    two = _level(2, 700.0, 9.4, verdict="fail", passed=False)
    two.vllm = {"ttft_p99_ms": 45.0, "itl_p99_ms": 9.2}
    four = _level(4, 910.0, 9.8, verdict="fail", passed=False)
    four.vllm = {"ttft_p99_ms": 52.0, "itl_p99_ms": 9.5}
    return CapacityResult(slo=SLO, capacity=None, levels=[low, two, four], stop_reason="first_level_failed",
                          stop_message="the lowest load missed the SLO", seconds=40.0, url="http://127.0.0.1:8011",
                          model="tiny-ernie")


# -- 9: the cause beside the answer, the note whole, the hidden columns reachable -------------------

@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_a_none_answer_carries_its_cause_in_view(size):
    app = Host(ProbeScreen(f"http://127.0.0.1:{free_port()}"))
    async with app.run_test(size=size) as pilot:
        await show_finished(pilot, app, starved())
        lines = screen_lines(app)
        answer = next(i for i, line in enumerate(lines) if "capacity: none" in line)
        table = next(i for i, line in enumerate(lines) if "levels by load" in line)
        cause = next((i for i, line in enumerate(lines) if "ours 535 ms, vLLM's 39 ms (13.6×)" in line), None)
        # beside the answer, above the level table (it was only in the note at the pane's foot)
        assert cause is not None and answer < cause < table, "\n".join(lines)


def test_a_capacitys_cause_is_the_gap_of_the_level_it_reports():
    from ernie_tui.engine_ctl.load.capacity import capacity_summary
    from ernie_tui.tui.widgets.capacity_view import describe_capacity, gap_cause

    one, two = _level(1, 200.0, 9.0), _level(2, 300.0, 9.0)
    one.vllm = {"ttft_p99_ms": 50.0, "itl_p99_ms": 9.0}
    two.vllm = {"ttft_p99_ms": 100.0, "itl_p99_ms": 9.0}
    result = CapacityResult(slo=SLO, capacity=capacity_summary(two), levels=[one, two], stop_reason="bracketed",
                            stop_message="2 passed", seconds=60.0, url="http://127.0.0.1:8011", model="tiny-ernie")
    cause = str(gap_cause(result))
    assert "at conc. 2 TTFT p99 ours 300 ms, vLLM's 100 ms (3.0×) (and 1 more level(s))" in cause, cause
    lines = str(describe_capacity(result)).splitlines()
    assert lines[0].startswith("capacity: concurrency 2") and lines[1].startswith("ours and vLLM's differ")
    # levels that agree: no such line
    two.vllm = {"ttft_p99_ms": 290.0, "itl_p99_ms": 9.0}
    one.vllm = {"ttft_p99_ms": 190.0, "itl_p99_ms": 9.0}
    assert gap_cause(result) is None


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_the_note_under_the_table_is_whole_while_a_search_runs(size):
    app = Host(ProbeScreen(f"http://127.0.0.1:{free_port()}"))
    async with app.run_test(size=size) as pilot:
        await pilot.press("ctrl+b")
        screen = app.screen
        screen.burst_tab.query_one("#pf-b-capacity", Checkbox).value = True
        await pilot.pause()
        screen.burst_tab.fold(True)  # as a running search folds its fields away
        view = screen.query_one(CapacityView)
        view.reset(parse_slo(SLO), "searching under ttft_p99=500ms itl_p99=50ms: doubling the concurrency …")
        view.show_levels(starved().levels)  # levels in, no answer yet: the note under the table says why they differ
        await pilot.pause(0.3)
        note = str(view.query_one("#pf-cap-gap", Static).content)
        assert "ours 535 ms, vLLM's 39 ms" in note
        text = " ".join(line.strip(" │") for line in screen_lines(app))
        last = note.split()[-4:]  # its last words on screen: the 80x24 note ended at "what users"
        assert " ".join(last) in " ".join(text.split()), "\n".join(screen_lines(app))


async def test_the_hidden_columns_are_a_key_away_at_80x24():
    app = Host(ProbeScreen(f"http://127.0.0.1:{free_port()}"))
    async with app.run_test(size=(80, 24)) as pilot:
        screen, view = await show_finished(pilot, app, finished_search())
        table = screen.query_one("#pf-cap-levels", DataTable)
        assert table.has_focus

        def header() -> str:
            return next(line for line in screen_lines(app) if "conc." in line and "verdict" in line)

        first = header()
        assert "attain" not in first and "req/s" not in first  # too narrow for them at once
        await pilot.press("up", "up")
        row = table.cursor_row  # a row the reader went to stays under the cursor as the columns turn
        assert "→" in str(table.border_subtitle)
        seen = set(first.split())
        for _ in range(len(view.pages) - 1):
            await pilot.press("right")
            await pilot.pause(0.1)
            seen |= set(header().split())
            # every page keeps the load and the verdict; its columns whole, none past the edge
            assert header().strip(" │").split()[:2] == ["conc.", "verdict"]
            assert sum(table.columns[k].get_render_width(table) for k in table.columns) <= table.size.width
        for word in ("attain", "req/s", "tok/s", "reqs", "stop", "p50", "good"):
            assert word in seen, (word, seen)
        assert table.cursor_row == row
        await pilot.press("right")  # past the last page: nothing moves
        assert view.page == len(view.pages) - 1
        for _ in range(len(view.pages)):
            await pilot.press("left")
        await pilot.pause(0.1)
        assert view.page == 0 and header() == first


# -- 8: the record line in view at 160x48; the chart's labels apart -----------------------------

async def test_the_record_line_is_in_view_at_160x48_with_warnings():
    result = finished_search()
    result.warnings = [unconfirmed_warning(result.levels[-1], [128.0]),
                       speed_moved_warning({"load": 160, "figure": "output_tps", "first": 1802.0, "later": 1400.0,
                                            "change": -0.22}, False)]
    app = Host(ProbeScreen(f"http://127.0.0.1:{free_port()}"))
    async with app.run_test(size=(160, 48)) as pilot:
        await show_finished(pilot, app, result)
        text = "\n".join(screen_lines(app))
        assert f"saved as run record {RECORD}" in text, text
        assert "before ranking presets on it" in text  # the last warning whole too


def test_labels_are_placed_apart_and_off_the_markers():
    # c30..c36 land in neighbouring cells of one row: drawn each, they read "c32cc34"
    spots = [("c30", 10, 5), ("c32", 11, 5), ("c34", 12, 5), ("c36", 13, 5), ("c8", 2, 1), ("c16", 2, 2)]
    placed = place_labels(spots, 40)
    assert 0 in placed and placed[4] == 3 and placed[5] == 3  # rows apart: both kept
    _assert_apart(spots, placed)
    assert len([i for i in placed if spots[i][2] == 5]) < 4  # some of the crowded row left out
    # the order given goes first: two labels wanting the same cells, the first in order kept
    pair = [("c30", 0, 5), ("c32", 5, 5)]  # c32 meets the right edge, so it would stand left, on c30's
    assert place_labels(pair, 8) == {0: 1}
    assert place_labels(pair, 8, order=[1, 0]) == {1: 2}
    # at the right edge a label stands left of its marker; where neither side fits, none
    assert place_labels([("c256", 38, 0)], 40) == {0: 34}
    assert place_labels([("c256", 2, 0)], 5) == {}


def test_labels_never_overlap_whatever_the_points():
    rng = random.Random(59)
    for _ in range(300):
        width = rng.randint(8, 60)
        spots = [(f"c{rng.randint(1, 512)}", rng.randrange(width), rng.randrange(6)) for _ in range(rng.randint(1, 20))]
        _assert_apart(spots, place_labels(spots, width))


def _assert_apart(spots, placed) -> None:
    spans = [(spots[i][2], start, start + len(spots[i][0]) - 1) for i, start in placed.items()]
    for row, first, last in spans:
        assert all(not (first <= col <= last) for _, col, r in spots if r == row), (spots, placed)
        for row2, first2, last2 in spans:
            if (row2, first2) != (row, first) and row2 == row:
                assert last + 1 < first2 or last2 + 1 < first, (spots, placed)  # a free cell between


async def test_the_chart_draws_each_label_whole_and_apart():
    """The labels placed are the ones on screen, each whole, none glued to
    another: levels close together (the issue's "c32cc34", "c302c36")."""
    from textual.app import App, ComposeResult

    levels = [_level(c, 300.0 + c, 9.0) for c in (2, 4, 30, 32, 34, 36)] + [_level(64, 2000.0, 20.0)]
    for lv in levels:
        lv.output_tps = 1000.0  # one row: the crowded case

    class ChartOnly(App):
        def compose(self) -> ComposeResult:
            yield CapacityChart()

    app = ChartOnly()
    async with app.run_test(size=(60, 20)) as pilot:
        chart = app.query_one(CapacityChart)
        chart.show([CapacityCurve("this server", levels, 32)], 500.0)
        await pilot.pause(0.2)
        text = "\n".join(screen_lines(app))
        labels = re.findall(r"c\d+", text)
        assert labels and "c32" in labels, text  # the answer's label first
        assert not re.search(r"c\d+c", text) and not re.search(r"\dc\d", text), text  # none run into another
        for label in labels:
            assert label in {f"c{lv.concurrency}" for lv in levels}, (label, text)  # whole: no cut-off "c3"
        assert_labels_where_placed(app, chart)


def assert_labels_where_placed(app, chart: CapacityChart) -> None:
    """Each label where place_labels put it: the placing knows plotext's canvas to the cell."""
    lines = screen_lines(app)
    left, bottom = chart.canvas_origin
    assert chart.labels_placed
    for label, col, row in chart.labels_placed:
        y, x = chart.content_region.y + bottom - row, chart.content_region.x + left + col
        assert lines[y][x:x + len(label)] == label, (label, col, row, "\n".join(lines))


async def test_the_panes_chart_labels_stand_where_placed_at_160x48():
    app = Host(ProbeScreen(f"http://127.0.0.1:{free_port()}"))
    async with app.run_test(size=(160, 48)) as pilot:
        screen, _ = await show_finished(pilot, app, finished_search())
        chart = screen.query_one("#pf-cap-chart", CapacityChart)
        assert_labels_where_placed(app, chart)
        assert len(chart.labels_placed) >= 5  # c1 … c64 stand apart; the crowded row keeps what fits


# -- 6: footer, help, sweep's help ---------------------------------------------------------------

async def test_the_160_column_footer_has_w():
    from ernie_tui.tui.app import make_app

    for size, shown in (((160, 48), True), ((80, 24), False)):
        app = make_app(include_user_presets=False, live=False)
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.2)
            footer = screen_lines(app)[-1]
            assert ("w Sweep" in footer) == shown, footer
            assert "? Help" in footer and "q Quit" in footer, footer


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_help_names_tune_and_says_what_w_does(size):
    from ernie_tui.tui.app import make_app

    app = make_app(include_user_presets=False, live=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        scroll = app.screen.query_one("#help-scroll")
        seen: list[str] = []
        while True:  # every line of help, as the terminal shows it, scrolled through
            seen += screen_lines(app)
            if scroll.scroll_y >= scroll.max_scroll_y:
                break
            scroll.scroll_to(y=scroll.scroll_y + scroll.size.height - 1, animate=False)
            await pilot.pause(0.05)
        # The scrollbar's thumb (block glyphs at the right edge) is not help's text.
        text = " ".join(" ".join(line.strip(" │").rstrip(" ▁▂▃▄▅▆▇█") for line in seen).split())
        assert "tune BASE" in text and "BASE-tuned" in text, text
        assert "the same burst against several presets in turn" not in text
        assert "paired" in text and "all served at once" in text and "duel rounds" in text, text


def test_sweeps_one_line_help_names_the_paired_mode():
    import argparse

    from ernie_tui.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    line = next(c.help for c in sub._choices_actions if c.dest == "sweep")
    assert "one after another" not in line and "paired" in line, line


# -- 11: attached without a log ----------------------------------------------------------------

@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_attach_without_a_log_says_how_to_give_one(size):
    from ernie_tui.tui.app import make_app
    from test_loadgen import PacedServer

    srv = PacedServer("--slots", "2", "--ttft-ms", "10", "--itl-ms", "5")
    try:
        app = make_app(mode="attach", attach_url=srv.url, include_user_presets=False, sample_interval=2.0)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready", 60,
                           "the attached server to be ready")
            await pilot.pause(0.3)
            text = "\n".join(screen_lines(app))
            flat = " ".join(" ".join(line.strip(" │") for line in screen_lines(app)).split())
            assert "fills in from the server's log" not in text
            assert "no log was given" in flat, text
            assert f"--attach {srv.url} --log PATH" in flat, text
    finally:
        srv.close()
