"""The dialogs focus their first button, and survive being dismissed before
their own Mount is handled.

In a full CI run test_preflight_fix_before_launch once failed with NoMatches
'#fix' from PreflightScreen.on_mount: the test's 'f' (a binding the app
handles) dismissed the dialog before the dialog's Mount was handled, and
on_mount's query_one found the buttons already gone. Dismissing right after
the push makes that order certain here.
"""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import Button

from ernie_tui.engine_ctl.launch.preflight_check import Problem
from ernie_tui.engine_ctl.logs import ErrorKind, Severity
from ernie_tui.tui.screens.dialogs import ConfirmScreen, PreflightScreen, QuitScreen


def _problem() -> Problem:
    return Problem(ErrorKind.BLOCK_SIZE_UNSUPPORTED, Severity.ERROR, "block_size 16: CPU needs a multiple of 32")


DIALOGS = {
    "preflight with a fix": (lambda: PreflightScreen("p", [_problem()], "block_size = 32"), "fix"),
    "preflight without a fix": (lambda: PreflightScreen("p", [_problem()], None), "cancel"),
    "confirm": (lambda: ConfirmScreen("Switch?", "body"), "yes"),
    "quit": (lambda: QuitScreen("p", "http://127.0.0.1:8000", 42), "stop"),
}


@pytest.mark.parametrize("name", list(DIALOGS))
async def test_dialog_focuses_its_first_button(name):
    make, focused = DIALOGS[name]
    app: App[None] = App()
    async with app.run_test() as pilot:
        app.push_screen(make())
        await pilot.pause()
        assert isinstance(app.focused, Button) and app.focused.id == focused


@pytest.mark.parametrize("name", list(DIALOGS))
async def test_dialog_dismissed_before_its_mount(name):
    make, _ = DIALOGS[name]
    app: App[None] = App()
    results = []
    async with app.run_test() as pilot:
        screen = make()
        app.push_screen(screen, results.append)
        screen.dismiss(None)  # before the dialog's own Compose and Mount are handled
        await pilot.pause()
        await pilot.pause()
        assert results == [None]
        assert app.screen is app.screen_stack[0]
    assert app.return_code in (0, None)
