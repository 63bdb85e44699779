"""`ernie-tui tune --tui`: the tune screen on a real tune of the paced stand-in."""

from __future__ import annotations

import time

from textual.widgets import DataTable, Static

from ernie_tui.cli import build_parser
from ernie_tui.cli.cmd_tune import _setup
from ernie_tui.tui.tune_app import TuneApp
from test_tune import FAST, _standin
from worker_ports import own_port


async def _until(pilot, done, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        await pilot.pause(0.2)
    assert done()


def _app(tmp_path, tiny_model, port: int, trials: str, preset: str | None = None) -> TuneApp:
    presets, space = _standin(tmp_path, tiny_model, port, "max_num_seqs = [1, 2, 3]\n")
    args = build_parser().parse_args(["tune", "shaped", "--presets", str(presets), "--space", str(space),
                                      "--trials", trials, "--no-preset", *FAST])
    return TuneApp(_setup(args), preset=preset)


async def test_the_screen_lists_trials_as_they_finish_and_quits_with_the_answer(tmp_path, tiny_model):
    app = _app(tmp_path, tiny_model, own_port(18481), "1", preset="shaped-tuned")
    async with app.run_test(size=(140, 30)) as pilot:
        screen = app.tune_screen
        await pilot.press("q")  # refused while the tune runs: no trial's server left unwatched
        assert app.is_running and screen.running
        await _until(pilot, lambda: not screen.running)
        table = screen.query_one("#tn-trials", DataTable)
        outcomes = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
        assert "measured" in outcomes
        assert str(screen.query_one("#tn-best", Static).content).startswith("best so far: trial ")
        assert "1/1 trials measured; finished (q quits)" in str(screen.query_one("#tn-budget", Static).content)
        # --confirm 0 (FAST): one measurement each, so the screen says the best will not be written, and why.
        assert ("Preset shaped-tuned: not written: the best trial was measured once, as BASE was: no noise "
                "estimate" in str(screen.query_one("#tn-now", Static).content))
        await pilot.press("q")
    result = app.return_value
    assert result is not None and result.measured_trials == 1 and not app.stopped_by_operator


async def test_x_stops_the_tune_keeping_what_was_measured(tmp_path, tiny_model):
    app = _app(tmp_path, tiny_model, own_port(18483), "3")
    async with app.run_test(size=(140, 30)) as pilot:
        screen = app.tune_screen
        await _until(pilot, lambda: screen.measured >= 1)  # a trial measured, the next one started
        await pilot.press("x")
        assert "stopping" in str(screen.query_one("#tn-budget", Static).content) or not screen.running
        await _until(pilot, lambda: not screen.running, 120)
        await pilot.press("q")
    result = app.return_value
    assert app.stopped_by_operator and result is not None
    assert result.stopped == "stopped by the operator" and result.measured_trials >= 1
