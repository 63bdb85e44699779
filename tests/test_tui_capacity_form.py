"""The capacity form (tui/widgets/capacity_form.py), shared by the probe
pane's Burst tab and the sweep screen; the capacity view in rate mode; the
running level's progress.

The searches here run against the paced stand-in (tests/paced_server.py),
whose timing the test sets; the form's defaults are compared with the load
district's constants, the one place they are written.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from textual.screen import Screen
from textual.widgets import DataTable, Input, Select

import test_tui_probe
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.load import (
    DEFAULT_ARRIVALS,
    DEFAULT_ATTAINMENT,
    DEFAULT_LEVEL_TIME_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RATE,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_SLO,
    DEFAULT_START,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    make_search,
)
from ernie_tui.engine_ctl.load.capacity import LevelResult
from ernie_tui.tui.messages import CapacityLevelProgress
from ernie_tui.tui.screens.probe import ProbeScreen
from ernie_tui.tui.screens.sweep import RATE_TABLE_COLUMNS, SweepScreen
from ernie_tui.tui.sweep_progress import describe_event
from ernie_tui.tui.widgets.capacity_form import CapacityForm
from ernie_tui.tui.widgets.capacity_view import CapacityView, describe_progress
from ernie_tui.tui.widgets.charts import CapacityChart
from search_looks import assert_search_path
from test_tui_probe import Host, _capacity_form, shown, wait_for

# The stand-ins test_tui_probe starts (its fixtures, shared).
paced = test_tui_probe.paced
rejected_book = test_tui_probe.rejected_book

# Each field's id suffix and the constant it must show.
DEFAULTS = {"start": DEFAULT_START, "maxc": DEFAULT_MAX_CONCURRENCY, "start-rate": DEFAULT_START_RATE,
            "max-rate": DEFAULT_MAX_RATE, "tol": DEFAULT_TOLERANCE, "att": DEFAULT_ATTAINMENT,
            "minr": DEFAULT_MIN_REQUESTS, "maxr": DEFAULT_MAX_REQUESTS, "time": DEFAULT_LEVEL_TIME_S}


def _check_defaults(form: CapacityForm) -> None:
    p = form.prefix
    assert form.query_one(f"#{p}-slo", Input).value == DEFAULT_SLO
    for suffix, constant in DEFAULTS.items():
        assert float(form.query_one(f"#{p}-{suffix}", Input).value) == float(constant), suffix
    assert form.mode == "concurrency"
    assert form.query_one(f"#{p}-arrivals", Select).value == DEFAULT_ARRIVALS
    # Read back unchanged, the form asks for exactly make_search's defaults.
    slo, search, rules = form.search()
    d_slo, d_search, d_rules = make_search(DEFAULT_SLO)
    assert [str(o) for o in slo] == [str(o) for o in d_slo]
    assert search == d_search and rules == d_rules


async def test_both_screens_use_the_one_form_with_the_districts_defaults(rejected_book):
    book, model = rejected_book
    app = Host(ProbeScreen("http://127.0.0.1:9"))
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.press("ctrl+b")
        tab = app.screen.burst_tab
        tab.query_one("#pf-b-capacity").value = True
        await pilot.pause()
        (probe_form,) = app.screen.query(CapacityForm)
        assert probe_form.id == "pf-cap-form" and probe_form.display
        _check_defaults(probe_form)
    app = Host(SweepScreen(book, model=str(model), is_serving=lambda: False))
    async with app.run_test(size=(140, 44)) as pilot:
        screen = app.screen
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        (sweep_form,) = screen.query(CapacityForm)
        assert sweep_form.id == "sw-cap-form" and sweep_form.display
        _check_defaults(sweep_form)


async def test_rate_mode_shows_its_fields_and_asks_for_a_rate_search(rejected_book):
    book, model = rejected_book
    app = Host(SweepScreen(book, model=str(model), is_serving=lambda: False))
    async with app.run_test(size=(140, 44)) as pilot:
        screen = app.screen
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        form = screen.query_one(CapacityForm)
        assert not screen.query_one("#sw-cap-start-rate").parent.display
        assert not screen.query_one("#sw-cap-arrivals").parent.display
        # Through the Select, as a person would: focus it, open it, pick "rate".
        screen.query_one("#sw-cap-mode", Select).focus()
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        assert form.mode == "rate" and form.has_class("-rate")
        assert screen.query_one("#sw-cap-start-rate").parent.display
        assert screen.query_one("#sw-cap-arrivals").parent.display
        assert not screen.query_one("#sw-cap-start").parent.display  # concurrency fields hidden
        screen.query_one("#sw-cap-start-rate", Input).value = "2.5"
        screen.query_one("#sw-cap-max-rate", Input).value = "40"
        screen.query_one("#sw-cap-arrivals", Select).value = "constant"
        args = form.search_args()
        assert args["rate"] is True and args["start_rate"] == 2.5 and args["max_rate"] == 40.0
        assert args["arrivals"] == "constant" and "start" not in args and "max_concurrency" not in args
        _, search, _ = form.search()
        assert search.mode == "rate" and search.start_rate == 2.5 and search.arrivals == "constant"
        # The sweep takes it as a rate sweep, its table ranks by capacity in req/s.
        capacity = screen._read_capacity()
        assert capacity is not None and capacity.search.rate


@pytest.mark.parametrize(("field", "value", "why"), [
    ("maxr", "many", "max reqs must be a whole number, got 'many'"),
    ("tol", "1.5", "the tolerance is a share between 0 and 1"),
    ("att", "90", "attainment ≥ is a share between 0 and 1"),
    ("start-rate", "0", "the start rate must be more than zero"),
    ("slo", "ttft_p97=1s", "percentile p97"),
])
async def test_invalid_input_is_explained_and_nothing_starts(rejected_book, field, value, why):
    book, model = rejected_book
    app = Host(SweepScreen(book, model=str(model), is_serving=lambda: False))
    async with app.run_test(size=(140, 44)) as pilot:
        screen = app.screen
        screen.query_one("#sw-presets").select("cpu-bad")
        screen.query_one("#sw-capacity").value = True
        screen.query_one(CapacityForm).mode = "rate"
        await pilot.pause()
        screen.query_one(f"#sw-cap-{field}", Input).value = value
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not screen.running and not screen.runs
        said = shown(screen, "#sw-phase")
        assert said.startswith("Not started: ") and why in said, said


async def test_the_burst_tab_explains_a_bad_field(paced):
    srv = paced("--slots", "2")
    app = Host(ProbeScreen(srv.url))
    async with app.run_test(size=(140, 44)) as pilot:
        screen, tab = await _capacity_form(pilot, app, **{"pf-cap-att": "1.2"})
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not tab.running
        said = shown(screen, "#pf-cap-result")
        assert said.startswith("Cannot search: attainment ≥ is a share between 0 and 1"), said


async def test_a_rate_search_in_the_burst_tab_shows_req_s_and_its_progress(paced):
    # 4 slots, 20 ms to the first token, 16 tokens 10 ms apart: a request
    # lasts ~0.2 s, so the stand-in carries ~20 req/s; 4 and 8 req/s pass,
    # and the search stops at its cap of 8 (the SLO far above 20 ms, so a stalled box passes them too).
    srv = paced("--slots", "4", "--ttft-ms", "20", "--itl-ms", "10")
    app = Host(ProbeScreen(srv.url))
    async with app.run_test(size=(140, 44)) as pilot:
        screen, tab = await _capacity_form(pilot, app, **{
            "pf-cap-slo": "ttft_p90=3000ms", "pf-b-max": "16", "pf-b-lmin": "10", "pf-b-lmax": "40"})
        form = screen.query_one(CapacityForm)
        form.mode = "rate"
        for wid, value in (("start-rate", "4"), ("max-rate", "8"), ("minr", "10"), ("time", "20")):
            screen.query_one(f"#pf-cap-{wid}", Input).value = value
        await pilot.pause()
        view = screen.query_one(CapacityView)
        progress = view.query_one("#pf-cap-progress")
        seen: list[str] = []
        update = progress.update

        def record(*args, **kwargs) -> None:  # every line given while shown: a stalled box can skip a sampled one
            update(*args, **kwargs)
            if progress.has_class("-visible"):
                seen.append(shown(screen, "#pf-cap-progress"))

        progress.update = record  # type: ignore[method-assign]

        def progress_seen() -> bool:
            if progress.display:
                seen.append(shown(screen, "#pf-cap-progress"))
            return any("counted of" in s for s in seen)

        await pilot.press("ctrl+r")
        assert tab.running and view.rate
        await wait_for(pilot, progress_seen, 30, "the running level's progress")
        line = next(s for s in seen if "counted of" in s)
        assert line.startswith("level 1 · rate 4 req/s · "), line
        assert ("warm-up" in line or "measuring" in line) and " s · " in line
        await wait_for(pilot, lambda: not tab.running, 90, "the search to end")
        r = tab.last_capacity
        assert r is not None and r.mode == "rate", shown(screen, "#pf-cap-result")
        # (the last: the capacity measured once more, longer: the confirmation; a stalled box's search
        # measures a level again: search_looks.py)
        assert_search_path(r.levels, [(4.0, True), (8.0, True), (8.0, True)])
        assert r.stop_reason == "max_rate"
        n = len(r.levels)
        # No level runs: the line is gone (its style follows its class once the app idles: late on a stalled box).
        await wait_for(pilot, lambda: not progress.display, 30, "the progress line gone")
        # The table's load column is in req/s, a row per level (they lack a concurrency).
        table = screen.query_one("#pf-cap-levels", DataTable)
        assert table.row_count == n and str(table.columns[table.coordinate_to_cell_key((0, 0)).column_key].label) \
            == "req/s sent"
        # by load, the confirmation under its first look, marked as the answer's row
        rows = [str(table.get_row_at(i)[0]) for i in range(n)]
        assert rows[0] == " 4/s" and rows[-1] == "▸8/s conf." and all(x.startswith(" 8/s") for x in rows[1:-1]), rows
        # (a pass on its estimates where the box stood still in its windows: they never agreed)
        assert str(table.get_cell(f"level-{n - 1}", "verdict")) in ("pass", "undecided: pass")
        result = shown(screen, "#pf-cap-result")
        assert "capacity: ≥ 8 req/s (a lower bound" in result and "stopped: max_rate" in result
        chart = screen.query_one(CapacityChart)
        assert chart.points_drawn == n and "in req/s" in chart.border_subtitle


def _rate_level(rate: float, passed: bool) -> LevelResult:
    return LevelResult(concurrency=None, rate=rate, requests=40, ok=40, passed=passed, decided=True,
                       verdict="pass" if passed else "fail", stop="decided", ttft_p99_ms=80.0 * rate,
                       itl_p99_ms=12.0, output_tps=100.0 * rate, requests_per_s=rate, attainment=1.0)


class ViewScreen(Screen[None]):
    def compose(self):
        yield CapacityView(id="pf-cap-view")


async def test_the_capacity_view_draws_rate_levels_on_one_chart():
    app = Host(ViewScreen())
    async with app.run_test(size=(140, 44)) as pilot:
        view = app.screen.query_one(CapacityView)
        slo, _, _ = make_search("ttft_p99=500ms", rate=True)
        view.reset(slo, "", rate=True)
        # Bisection revisits no rate, but 3 levels without a concurrency must
        # still be 3 rows (they used to be keyed by their concurrency: None).
        view.show_levels([_rate_level(2.0, True), _rate_level(8.0, False), _rate_level(4.0, True)], 4.0)
        await pilot.pause()
        table = view.query_one("#pf-cap-levels", DataTable)
        assert table.row_count == 3
        chart = view.query_one(CapacityChart)
        assert chart.points_drawn == 3 and chart.curves[0].capacity == 4.0


def test_progress_line_and_its_collapsing():
    warm = {"event": "level_progress", "rate": 4.0, "phase": "warm-up", "requests": 2, "counted": 0, "sent": 5,
            "in_flight": 3, "elapsed_s": 0.6, "windows": 0, "ttft_p99_ms": None, "itl_p99_ms": None,
            "attainment": None, "verdict": None}
    text = describe_progress(warm, 1, "rate 4 req/s").plain
    assert text == "level 1 · rate 4 req/s · warm-up · 0 counted of 5 sent · 3 in flight · 0.6 s · 0 window(s)"
    measuring = {**warm, "phase": "measuring", "counted": 30, "sent": 40, "windows": 3, "elapsed_s": 9.25,
                 "ttft_p99_ms": 123.4, "itl_p99_ms": 11.0, "attainment": 0.95, "verdict": "pass"}
    text = describe_progress(measuring, 2, "rate 4 req/s").plain
    assert text.endswith("· TTFT p99 123 ms · ITL p99 11 ms · attain 95% · so far: pass"), text
    assert "30 counted of 40 sent" in text and "9.2 s" in text
    # The sweep's phase line says the same.
    line = describe_event({"phase": "capacity", "preset": "a", "index": 0, "total": 1,
                           "capacity_event": measuring}, 1)
    assert line.startswith("[1/1] a: capacity search: rate 4 req/s · measuring · 30 counted of 40 sent"), line
    # A flood collapses: a newer progress of the same run replaces a queued older one, never another run's.
    old, new = CapacityLevelProgress(1, 4.0, 2, 0.6), CapacityLevelProgress(1, 4.0, 9, 1.1)
    assert old.can_replace(new) and not CapacityLevelProgress(2, 4.0, 1, 0.1).can_replace(new)


async def test_sweep_rate_mode_runs_rate_searches(tmp_path, tiny_model_dir_fixture):
    from ernie_tui.presets import load_presets

    paced_py = Path(__file__).resolve().parent / "paced_server.py"
    (tmp_path / "presets.toml").write_text(textwrap.dedent(f"""
        [presets.slots4]
        extends = "cpu-demo"
        model = "{tiny_model_dir_fixture}"
        port = {free_port()}
        launcher = ["{sys.executable}", "{paced_py}"]
        env = {{ PACED_SLOTS = "4", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
    """))
    book = load_presets([tmp_path / "presets.toml"], include_user=False)
    app = Host(SweepScreen(book, model=str(tiny_model_dir_fixture), is_serving=lambda: False))
    async with app.run_test(size=(140, 44)) as pilot:
        screen = app.screen
        screen.query_one("#sw-presets").select("slots4")
        screen.query_one("#sw-capacity").value = True
        screen.query_one(CapacityForm).mode = "rate"
        await pilot.pause()
        # The SLO is far from the stand-in's 20 ms TTFT: this checks the rate mode's wiring (a CI run on a
        # stalled box once failed 8 req/s against 400 ms and answered 7.5).
        for wid, value in (("#sw-cap-slo", "ttft_p90=3000ms"), ("#sw-max", "16"), ("#sw-lmin", "10"),
                           ("#sw-lmax", "40"), ("#sw-cap-start-rate", "4"), ("#sw-cap-max-rate", "8"),
                           ("#sw-cap-minr", "10"), ("#sw-cap-time", "20")):
            screen.query_one(wid, Input).value = value
        await pilot.press("ctrl+r")
        assert screen.running, screen.last_error
        await wait_for(pilot, lambda: not screen.running, 150, "the sweep to finish")
        (run,) = screen.runs
        assert run.status == "ok" and run.capacity_rate == 8.0 and run.capacity_concurrency is None
        table = screen.query_one("#sw-table", DataTable)
        keys = [k for k, _ in RATE_TABLE_COLUMNS]
        # 8 req/s is the search's ceiling (--max-rate) and it passed: a lower bound, so "≥ 8"
        assert run.capacity_stop == "max_rate" and str(table.get_row("slots4")[keys.index("capacity_rate")]) == "≥ 8"
        assert {str(c.label) for c in table.columns.values()} >= {"capacity (req/s)"}
        chart = screen.query_one("#sw-chart", CapacityChart)
        levels = chart.curves[0].levels
        # 4, 8 and 8's confirmation (or, on a stalled box, the same verdicts: search_looks.py)
        assert_search_path(levels, [(4.0, True), (8.0, True), (8.0, True)])
        assert chart.points_drawn == len(levels) == run.levels and chart.curves[0].capacity == 8.0


@pytest.fixture
def tiny_model_dir_fixture():
    from vllm_support import tiny_model_dir

    return tiny_model_dir()


async def test_the_sweep_screen_marks_a_preset_whose_server_moved_during_its_searches():
    # The exported table said a search's server moved under it; the screen
    # itself showed nothing, so the operator ranking presets on it did not know.
    from ernie_tui.engine_ctl.control import SweepRun
    from ernie_tui.presets import load_presets
    from ernie_tui.tui.messages import SweepFinished

    def run(preset, repeat, moved):
        return SweepRun(preset, repeat, "ok", mode="capacity", capacity_concurrency=12,
                        goodput_output_tps=1000.0, speed_moved_pct=moved)

    book = load_presets([], include_user=False)
    names = list(book.names())[:2]
    screen = SweepScreen(book, model="m", is_serving=lambda: False)
    app = Host(screen)
    async with app.run_test(size=(160, 44)) as pilot:
        await pilot.pause()
        screen.names = names
        screen._columns(capacity=True)
        screen.post_message(SweepFinished([run(names[0], 0, None), run(names[0], 1, -24.0), run(names[1], 0, None)]))
        await wait_for(pilot, lambda: len(screen.rows) == 2, 10, "the sweep's rows")
        notes = shown(screen, "#sw-notes")
        assert f"{names[0]}: the server's speed moved during 1 of its 2 searches (up to -24 %" in notes
        assert f"{names[1]}:" not in notes
        table = screen.query_one("#sw-table", DataTable)
        assert str(table.get_row(names[0])[-1]) == "speed moved" and str(table.get_row(names[1])[-1]) == ""
