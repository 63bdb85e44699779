"""The screens call their App through the Protocols of tui/app_protocol.py
(so no screen imports an App module): each App must still have every method
a Protocol names, with the same parameters."""

import inspect

import pytest

from ernie_tui.tui.app import ErnieApp
from ernie_tui.tui.app_protocol import DashboardApp, FleetAppView
from ernie_tui.tui.fleet_app import FleetApp


def _methods(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]


@pytest.mark.parametrize(("app", "protocol"), [(ErnieApp, DashboardApp), (FleetApp, DashboardApp),
                                               (FleetApp, FleetAppView)])
def test_each_app_has_what_its_screens_call(app, protocol):
    names = _methods(protocol)
    assert names, protocol
    for name in names:
        wanted = list(inspect.signature(getattr(protocol, name)).parameters)
        assert list(inspect.signature(getattr(app, name)).parameters) == wanted, (app.__name__, name)


def test_no_screen_imports_an_app_module():
    import pathlib

    import ernie_tui.tui.screens as screens

    for path in pathlib.Path(screens.__path__[0]).glob("*.py"):
        text = path.read_text()
        assert "ernie_tui.tui.app import" not in text and "ernie_tui.tui.fleet_app import" not in text, path.name
