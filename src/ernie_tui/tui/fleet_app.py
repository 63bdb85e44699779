"""The fleet: ErnieApp in attach mode whose first screen is the fleet table.

Enter on a row builds a fresh attach dashboard (the same MainScreen and the
same workers `ernie-tui --attach URL` uses) for that server and pushes it;
escape or b cancels its workers, lets go of the server and pops back to the
fleet, whose poller never stopped. One dashboard at a time: the app's
handlers for dashboard messages (status, log, report, series) drop what
arrives while none is open.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from textual.screen import Screen

from ernie_tui.tui.app import DashboardConfig, ErnieApp
from ernie_tui.tui.screens.fleet import FleetScreen, ServerDashboard
from ernie_tui.tui.traffic_watch import TrafficWatch


class FleetApp(ErnieApp):
    def __init__(self, config: DashboardConfig, servers, *, interval: float = 1.0, poller_factory=None, ray=None):
        super().__init__(config)
        self.servers = list(servers)
        self.fleet = FleetScreen(self.servers, interval=interval, live=config.live, poller_factory=poller_factory,
                                 ray=ray)
        self.open_name: str | None = None  # the server whose dashboard is open
        self.sub_title = f"fleet of {len(self.servers)}"

    def get_default_screen(self) -> Screen:
        return self.fleet

    def _settle_fleet(self) -> None:
        """The fleet mounted: the app's one-time set-up (the main screen's
        mount does it in a single-server dashboard)."""
        # Without this the fleet ran with the default thresholds until a
        # dashboard was opened: a full collection (50-130 ms, on the UI thread)
        # every ~4 s while keys were pressed, the fleet's key p99 ~130 ms.
        self.calm_collector()
        if not self._ticking:
            self._ticking = True
            self.set_interval(1.0, self._tick)
            self._install_signal_handlers()

    @property
    def _shutting_down(self) -> bool:
        # No dashboard open: nothing to show a dashboard message on.
        return self.open_name is None or super()._shutting_down

    # -- one server's dashboard ----------------------------------------------------------
    def open_server(self, name: str) -> None:
        if self.open_name is not None:
            return
        server = next((s for s in self.servers if s.name == name), None)
        if server is None:
            return
        import gc

        gc.collect()  # the last dashboard's widgets: gone before main_mounted freezes what lives
        self.config.attach_url = server.url
        self.config.log_path = server.log
        self.config.api_key = server.api_key
        self.server = self.bridge = self.status = self.report = None
        self._last_series = None
        self.traffic, self.last_traffic = TrafficWatch(), None  # a new server, a new traffic window
        self._diagnosis = None
        self._log_run = object()
        self._main_ready = False
        self._early = []
        self.log_name = "llm.log"
        self.open_name = name
        self.main = ServerDashboard()
        self.push_screen(self.main)
        self.sub_title = f"{name} · {server.url}"
        rows = self.fleet.rows.get(name)
        if rows:
            self.fleet_row_changed(rows[0])

    def fleet_row_changed(self, row) -> None:
        """The fleet's latest row of a server: the open dashboard of a server
        that stopped answering says so (since when, why, what to do) rather
        than waiting for a startup that is not happening."""
        if row.server != self.open_name or self.main is None:
            return
        server = next((s for s in self.servers if s.name == row.server), None)
        if row.state == "down":
            self.main.show_unreachable(row.down_since, row.reason, url=row.url, preset=row.preset,
                                       log=server.log if server else None, back="Press b for the fleet")
        else:
            self.main.show_unreachable(None)

    def leave_server(self) -> None:
        if self.open_name is None:
            return
        self.open_name = None
        self.workers.cancel_group(self, "report")
        self.workers.cancel_group(self, "sampler")
        if self.bridge is not None:
            self.bridge.close()
        if self.server is not None:
            self.server.close()
        self.server = self.bridge = None
        self.pop_screen()
        self.sub_title = f"fleet of {len(self.servers)}"


def make_fleet_app(
    servers: Iterable,
    *,
    interval: float = 1.0,
    preset_files: Iterable[str] = (),
    include_user_presets: bool = True,
    live: bool = True,
    clock: Callable[[], float] = time.time,
    sample_interval: float = 1.0,
    poller_factory=None,
    metrics_factory: Callable | None = None,
    ray=None,
) -> FleetApp:
    """The fleet view over `servers` (engine_ctl.fleet.FleetServer); with
    `ray` (a connected RayTrials) its Ray panel too."""
    config = DashboardConfig(mode="attach", preset_files=list(preset_files), include_user_presets=include_user_presets,
                             clock=clock, sample_interval=sample_interval, live=live,
                             metrics_factory=metrics_factory)
    return FleetApp(config, servers, interval=interval, poller_factory=poller_factory, ray=ray)
