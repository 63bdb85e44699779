"""The sweep screen (`w`) after issue 59: the repeat field is a paired
sweep's duel rounds and agrees with its record; the progress counts what the
paired sweep does and reads 100 % at Done; at 80x24 and 160x48 a finished
sweep shows its Done line, its ranking (wrapped, whole) and its verdicts on
screen, a preset preflight skipped reads "not measured (why)", and the chart
is never squeezed into an axis that does not read.

The finished sweep of the layout tests is tests/finished_sweep.py, handed to
the screen as its worker hands it (SweepFinished); the last test runs a real
paired sweep of two paced stand-ins (tests/paced_server.py).
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Label, ProgressBar, Static

from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.load import BurstConfig
from ernie_tui.presets import load_presets
from ernie_tui.tui.messages import SweepFinished
from ernie_tui.tui.screens.sweep import (
    CAPACITY_TABLE_COLUMNS,
    CHART_MIN_HEIGHT,
    PAIRED_ROUNDS,
    SweepScreen,
)
from ernie_tui.tui.sweep_progress import SweepSteps
from ernie_tui.tui.sweep_results import record_meta
from finished_sweep import MEASURED, ROUNDS, SKIPPED, finished_sweep
from test_tui_operator import screen_text
from test_tui_probe import Host, shown, wait_for

SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
RECORD = "20261207T013000-sweep-abc123"


def flat(text: str) -> str:
    """The words of `text`, one space between: a line wrapped on screen reads as it was written."""
    return re.sub(r"\s+", " ", text).strip()


def on_screen(app, text: str) -> bool:
    rows = [row.strip() for row in screen_text(app).splitlines()]
    return flat(text) in flat(" ".join(rows))


def assert_within_screen(app, selector: str) -> None:
    widget = app.screen.query_one(selector)
    region, screen = widget.region, app.screen.region
    assert widget.display and region.height > 0, f"{selector} is not shown"
    assert screen.contains_region(region), f"{selector} at {region} runs past the screen {screen}"


# -- the steps (pure) ---------------------------------------------------------------------------

class _Run:
    def __init__(self, capacity):
        self.capacity_concurrency, self.capacity_rate = capacity, None


def _paired_events(names: list[str], rounds: int, found: dict[str, bool]):
    """Events shaped as run_paired_sweep emits them (search_round, then duel_round)."""
    n = len(names)
    total = n + rounds * (n + 1)  # its own count, which leaves out the servers' start
    for i, name in enumerate(names):
        yield {"preset": name, "repeat": 0, "index": i, "total": total, "phase": "capacity"}, None
    for i, name in enumerate(names):
        yield {"preset": name, "repeat": 0, "index": i, "total": total, "phase": "capacity",
               "capacity_event": {"event": "level_start", "concurrency": 4}}, None
    for i, name in enumerate(names):
        yield {"preset": name, "repeat": 0, "index": i, "total": total, "phase": "done", "status": "ok",
               "run": _Run(8 if found[name] else 0)}, found[name]
    dueling = [x for x in names if found[x]]
    if len(dueling) < 2:
        return
    for r in range(1, rounds + 1):
        k = (r - 1) % len(dueling)
        order = dueling[k:] + dueling[:k]
        for j, name in enumerate([*order, order[0]]):
            yield {"preset": name, "repeat": r, "index": n + (r - 1) * (n + 1) + j, "total": total,
                   "phase": f"duel round {r}: concurrency 8, 1,234 tok/s"}, None


def test_the_paired_sweeps_steps_are_what_it_does_and_end_full():
    names = ["cpu-demo", "cpu-demo-b64"]
    steps = SweepSteps(names, repeat=ROUNDS, rounds=ROUNDS)
    # Before any event the servers are starting: no preset's "preflight" (the paired sweep has none).
    assert steps.line().startswith("starting 2 servers side by side") and "preflight" not in steps.line()[:20]
    assert (steps.done, steps.total) == (0, 1 + 2 + ROUNDS * 3)
    seen = []
    for ev, found in _paired_events(names, ROUNDS, {n: True for n in names}):
        steps.feed(ev, found=found)
        seen.append(steps.done)
        assert not steps.line().startswith("[")  # never the sequential sweep's "[1/11] cpu-demo: preflight"
    assert seen == sorted(seen)  # forward only, though the searches' events interleave
    assert steps.done == steps.total == 12  # every step counted, the last duel level included
    assert steps.line().startswith(f"duel round {ROUNDS}/{ROUNDS}, level 3 done: cpu-demo")
    # A duel level under way runs through its preset's search runner: its events read as the search's.
    steps = SweepSteps(names, repeat=ROUNDS, rounds=ROUNDS)
    for ev, found in list(_paired_events(names, ROUNDS, {n: True for n in names}))[:7]:
        steps.feed(ev, found=found)
    steps.feed({"preset": "cpu-demo-b64", "repeat": 0, "index": 1, "total": 11, "phase": "capacity",
                "capacity_event": {"event": "level_start", "concurrency": 8}})
    assert steps.line() == "duel round 1/3, level 2 of 3: cpu-demo-b64: concurrency 8 …", steps.line()
    steps.finish(cancelled=False)
    assert steps.done == steps.total


def test_a_search_that_found_nothing_takes_its_duels_out_of_the_count():
    names = ["a", "b", "c"]
    steps = SweepSteps(names, repeat=2, rounds=2)
    for ev, found in _paired_events(names, 2, {"a": True, "b": False, "c": True}):
        steps.feed(ev, found=found)
    assert steps.total == 1 + 3 + 2 * 3 and steps.done == steps.total


def test_a_cancelled_sweep_keeps_the_steps_it_did():
    steps = SweepSteps(["a", "b"], repeat=3, rounds=3)
    for ev, found in list(_paired_events(["a", "b"], 3, {"a": True, "b": True}))[:7]:
        steps.feed(ev, found=found)
    done = steps.done
    steps.finish(cancelled=True)
    assert steps.done == done < steps.total


def test_a_refused_paired_sweep_counts_the_sequential_runs_that_follow():
    steps = SweepSteps(["a", "b"], repeat=3, rounds=3)
    steps.feed({"preset": "a", "repeat": 0, "index": 0, "total": 6, "phase": "preflight"})
    assert not steps.paired and steps.total == 6 and steps.line() == "[1/6] a (round 1/3): preflight"
    steps.feed({"preset": "a", "repeat": 0, "index": 0, "total": 6, "phase": "done", "status": "ok"})
    assert steps.done == 1


def test_the_record_says_the_duel_rounds_run():
    runs, paired = finished_sweep(rounds=2)
    meta = record_meta(list(MEASURED), 2, BurstConfig(), runs, None, paired)
    assert meta["repeat"] == 2 and meta["mode"].startswith("paired: 2 rounds")
    cut_short = record_meta(list(MEASURED), 3, BurstConfig(), runs, None, paired)  # cancelled after 2 of 3
    assert cut_short["repeat"] == 2 and "2 of 3 duel rounds" in cut_short["mode"]


# -- the screen --------------------------------------------------------------------------------

def _screen() -> tuple[Host, SweepScreen]:
    book = load_presets([], include_user=False)
    screen = SweepScreen(book, model="/models/tiny", is_serving=lambda: False)
    return Host(screen), screen


async def test_the_repeat_field_is_a_paired_sweeps_duel_rounds():
    app, screen = _screen()
    async with app.run_test(size=SIZES["80x24"]) as pilot:
        field = screen.query_one("#sw-repeat", Input)
        label = screen.query_one("#sw-repeat-label", Label)
        assert field.value == "1" and str(label.content) == "repeat R"
        for name in MEASURED:
            screen.query_one("#sw-presets").select(name)
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        # Two presets under an SLO are compared paired: the field is its duel rounds, `sweep --capacity`'s 3.
        assert field.value == str(PAIRED_ROUNDS) == "3" and str(label.content) == "duel rounds"
        assert screen.query_one("#sw-repeat").region.height > 0  # reachable at 80 columns (the row wraps)
        field.value = "1"
        await pilot.press("ctrl+r")
        assert not screen.running and "duel rounds must be at least 2" in shown(screen, "#sw-phase")
        field.value = "2"
        config, repeat = screen._read_config()
        assert repeat == 2
        # Back to one preset after another: the field's own default again, where it held the paired one.
        field.value = "3"
        screen.query_one("#sw-capacity").value = False
        await pilot.pause()
        assert field.value == "1" and str(label.content) == "repeat R"
        # A value typed in is kept across the switch.
        field.value = "3"
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        screen.query_one("#sw-capacity").value = False
        await pilot.pause()
        assert field.value == "3"


async def _finish(pilot, screen: SweepScreen):
    """The screen begun as start() begins it, then handed the finished sweep as its worker hands it."""
    for name in (*MEASURED, SKIPPED):
        screen.query_one("#sw-presets").select(name)
    screen.query_one("#sw-capacity").value = True
    await pilot.pause()
    config, repeat = screen._read_config()
    screen.begin([*MEASURED, SKIPPED], repeat, config, screen._read_capacity())
    assert screen.rounds == repeat == ROUNDS
    runs, paired = finished_sweep()
    screen.post_message(SweepFinished(runs, False, None, RECORD, "/tmp/sweep-logs/20261207-012250", paired))
    await wait_for(pilot, lambda: not screen.running and screen.rows, 10, "the finished sweep")
    await settle(pilot)
    return paired


async def settle(pilot) -> None:
    """A few layouts: the screen shares its rows from the last one's sizes, and looks again after each change."""
    for _ in range(8):
        await pilot.pause(0.05)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
async def test_a_finished_paired_sweep_reads_without_scrolling_at(size):
    app, screen = _screen()
    async with app.run_test(size=size) as pilot:
        paired = await _finish(pilot, screen)
        # The Done line, the ranking (first, whole, wrapped where it must be) and the pair's verdict: all on
        # screen, their widgets inside it.
        for selector in ("#sw-phase", "#sw-notes-box", "#sw-table"):
            assert_within_screen(app, selector)
        done = shown(screen, "#sw-phase")
        assert done.startswith("Done: 3 run(s), 2 measured, in ") and done.endswith(f"Run record {RECORD}.")
        assert on_screen(app, done)
        ranking = next(line for line in paired.lines() if line.startswith("Ranking"))
        assert ranking.endswith("cpu-demo-b64 > cpu-demo") and on_screen(app, ranking)
        assert on_screen(app, paired.pairs[0].text()), screen_text(app)
        # The table: every preset's row, and its answer columns whole at 80 columns.
        table = screen.query_one("#sw-table", DataTable)
        assert table.region.height >= table.row_count + 3 and table.row_count == 3
        keys = [k for k, _ in CAPACITY_TABLE_COLUMNS]
        vs_best = str(table.get_row("cpu-demo")[keys.index("vs_best")])
        assert vs_best.startswith("-23 %") and on_screen(app, vs_best)
        # The skipped preset was compared with nothing.
        skipped = str(table.get_row(SKIPPED)[keys.index("vs_best")])
        assert skipped == "not measured (insufficient_free_memory)" and on_screen(app, skipped)
        assert "within noise" not in screen_text(app)
        # The chart: where it is shown it has the rows for an axis that reads; at 80x24 it is not.
        chart = screen.query_one("#sw-chart")
        if size == SIZES["80x24"]:
            assert not chart.display or chart.region.height == 0
        else:
            assert chart.display and chart.region.height >= CHART_MIN_HEIGHT
            assert_within_screen(app, "#sw-chart")
        # The form comes back on ctrl+f, and goes again.
        # Each a class, styled once the app idles: waited for, as a stalled box idles late.
        await pilot.press("ctrl+f")
        top = screen.query_one("#sw-top")
        await wait_for(pilot, lambda: top.region.height > 0 and on_screen(app, "Done: 3 run(s)"), 30,
                       "the form back, the Done line still in view")
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: top.region.height == 0, 30, "the form gone again")


async def test_a_measured_preset_in_no_duel_is_not_called_within_noise(tmp_path):
    from ernie_tui.engine_ctl.control import SweepRun, export_sweep
    from ernie_tui.engine_ctl.control.paired_sweep import PresetRound

    app, screen = _screen()
    async with app.run_test(size=SIZES["160x48"]) as pilot:
        for name in (*MEASURED, "seed-C"):
            screen.query_one("#sw-presets").select(name)
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        config, repeat = screen._read_config()
        screen.begin([*MEASURED, "seed-C"], repeat, config, screen._read_capacity())
        runs, paired = finished_sweep()
        # seed-C served and searched, but no level met the SLO: no load to duel at, so in no pair's rounds.
        runs = runs[:2] + [SweepRun("seed-C", 0, "ok", mode="capacity", capacity_concurrency=0, levels=3)]
        paired.presets.append("seed-C")
        paired.searches.append(PresetRound("seed-C", 0, capacity=0, levels=3))  # no duel_load
        paired.analyse()
        screen.post_message(SweepFinished(runs, False, None, RECORD, None, paired))
        await wait_for(pilot, lambda: not screen.running and screen.rows, 10, "the finished sweep")
        keys = [k for k, _ in CAPACITY_TABLE_COLUMNS]
        row = screen.query_one("#sw-table", DataTable).get_row("seed-C")
        assert str(row[keys.index("vs_best")]) == "not compared (no capacity to duel at)", row
        # The exported table (what `sweep --capacity` prints) words it as the screen does.
        md = tmp_path / "sweep.md"
        export_sweep(screen.rows, md, screen._meta(), paired=screen.paired)
        assert "| not compared (no capacity to duel at) |" in md.read_text()


def test_help_names_every_key_of_the_sweep_screen():
    from ernie_tui.tui.screens.help import KEYS

    sweep = dict(KEYS)["  in the sweep"]
    for binding in SweepScreen.BINDINGS:
        for key in binding.key.split(","):
            assert re.search(rf"(?<![\w+]){re.escape(key)}(?![\w+])", sweep), (key, sweep)


async def test_the_chart_takes_the_tables_place_only_where_it_has_the_rows():
    app, screen = _screen()
    async with app.run_test(size=(100, 40)) as pilot:  # too narrow for both side by side, tall enough for one
        await _finish(pilot, screen)
        chart, table = screen.query_one("#sw-chart"), screen.query_one("#sw-table")
        assert not chart.display and table.region.width > 90
        await pilot.press("ctrl+t")
        # The swap is a class, styled once the app idles: waited for, as a stalled box idles late.
        await wait_for(pilot, lambda: chart.display and not table.display, 30, "the chart in the table's place")
        await pilot.pause()
        assert chart.display and not table.display and chart.region.height >= CHART_MIN_HEIGHT
        assert_within_screen(app, "#sw-chart")
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: not chart.display and table.display, 30, "the table back")
        # Squeezed below its rows it goes, and ctrl+t does not bring it back.
        await pilot.press("ctrl+t")
        await pilot.resize_terminal(100, 24)
        await settle(pilot)
        await wait_for(pilot, lambda: not chart.display and table.display, 30, "the squeezed chart gone")
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not chart.display


# -- a real paired sweep ------------------------------------------------------------------------

@pytest.fixture
def paced_book(tmp_path):
    from vllm_support import tiny_model_dir

    model = tiny_model_dir()
    paced = Path(__file__).resolve().parent / "paced_server.py"
    body = ""
    for name, slots in (("slots2", 2), ("slots4", 4)):
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{model}"
            port = {free_port()}
            launcher = ["{sys.executable}", "{paced}"]
            env = {{ PACED_SLOTS = "{slots}", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
        """)
    (tmp_path / "presets.toml").write_text(body)
    return load_presets([tmp_path / "presets.toml"], include_user=False), model


async def test_a_paired_sweep_on_screen_counts_true_and_records_its_rounds(paced_book):
    from ernie_tui.engine_ctl.load.runstore import load_run
    from ernie_tui.engine_ctl.report.catalog import describe

    book, model = paced_book
    app = Host(SweepScreen(book, model=str(model), is_serving=lambda: False))
    async with app.run_test(size=SIZES["80x24"]) as pilot:
        screen = app.screen
        for name in ("slots2", "slots4"):
            screen.query_one("#sw-presets").select(name)
        screen.query_one("#sw-capacity").value = True
        await pilot.pause()
        # Short levels, few requests: this is about the screen, not the figures (about a minute on the 2-core box).
        for wid, value in (("#sw-cap-slo", "ttft_p90=100ms"), ("#sw-max", "16"), ("#sw-lmin", "10"),
                           ("#sw-lmax", "40"), ("#sw-cap-start", "2"), ("#sw-cap-maxc", "8"), ("#sw-cap-tol", "0.5"),
                           ("#sw-cap-time", "4"), ("#sw-cap-maxr", "24"), ("#sw-repeat", "2")):
            screen.query_one(wid, Input).value = value
        # Every line the phase widget is given, not a sample of it every 0.2 s: a stalled CI box once slept
        # through the whole "starting 2 servers" phase between two samples.
        lines: set[str] = set()
        phase = screen.query_one("#sw-phase", Static)
        shown_on = phase.update

        def record(content="", **kwargs):
            lines.add(str(content))
            return shown_on(content, **kwargs)

        phase.update = record  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        assert screen.running and screen.rounds == 2, screen.last_error
        while screen.running:
            await pilot.pause(0.2)
            assert len(lines) < 5000
        bar = screen.query_one("#sw-overall", ProgressBar)
        assert [r.status for r in screen.runs] == ["ok", "ok"], shown(screen, "#sw-notes")
        assert bar.percentage == 1.0 and bar.total == 1 + 2 + 2 * 3, (bar.progress, bar.total)
        # Never the step count of a sweep one preset after another ("[1/11] cpu-demo: preflight"), which
        # is not what the paired sweep does; its phases instead, each in its turn.
        assert not any(re.match(r"\[\d+/\d+\]", line) for line in lines), sorted(lines)[:3]
        for phase in ("starting 2 servers side by side", "searches (0/2 done", "duel round 1/2, level 1 of 3",
                      "duel round 2/2, level 3 done"):
            assert any(line.startswith(phase) for line in lines), (phase, sorted(lines)[:3])
        # The field, the run and the record agree on the rounds.
        assert screen.query_one("#sw-repeat", Input).value == "2"
        assert max(d.round for d in screen.paired.duels) == 2
        record = load_run(screen.record)
        assert record.results["meta"]["repeat"] == 2 and "repeat 1" not in describe(record)
        await settle(pilot)
        for size in SIZES.values():
            await pilot.resize_terminal(*size)
            await settle(pilot)
            for selector in ("#sw-phase", "#sw-notes-box", "#sw-table", "#sw-overall"):
                assert_within_screen(app, selector)
            assert on_screen(app, "Done: 2 run(s), 2 measured")
            ranking = next(line for line in screen.paired.lines() if line.startswith("Ranking"))
            assert on_screen(app, ranking) and on_screen(app, screen.paired.pairs[0].text())
