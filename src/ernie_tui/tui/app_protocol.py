"""What the screens use of their App, as Protocols.

app.py and fleet_app.py import the screens they push; a screen that imported
its App back, even for a type only, closed a circle and depended on the
whole App. A screen depends on one of these instead: the few methods it
calls. ErnieApp (app.py) is a DashboardApp; FleetApp (fleet_app.py) is both.
tests/test_tui_app_protocol.py checks that the Apps still have every method
named here.
"""

from __future__ import annotations

from typing import Protocol


class DashboardApp(Protocol):
    """What MainScreen calls on the dashboard's App."""

    def main_mounted(self) -> None: ...

    def request_start(self) -> None: ...

    def request_stop(self) -> None: ...

    def request_restart(self) -> None: ...

    def request_switch(self, name: str, confirm: bool = True) -> None: ...

    def request_edit(self, name: str | None) -> None: ...

    def show_command_line(self, name: str | None) -> None: ...

    def request_fix(self) -> None: ...

    def open_probe(self, capacity: bool = False) -> None: ...

    def open_sweep(self) -> None: ...

    def open_help(self) -> None: ...

    def request_quit(self) -> None: ...


class FleetAppView(Protocol):
    """What the fleet's screens (FleetScreen, ServerDashboard) call on the fleet's App."""

    def open_server(self, name: str) -> None: ...

    def leave_server(self) -> None: ...

    def request_quit(self) -> None: ...
