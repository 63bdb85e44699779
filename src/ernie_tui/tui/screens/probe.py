"""`p`: the probe pane. One prompt, streamed and timed; a load burst; or a
capacity search under an SLO.

Two tabs, each its own widget: the Probe tab (widgets/probe_tab.py) and the
Burst tab (widgets/burst_tab.py, with its capacity-search mode). This screen
reads /v1/models once for both, keeps one of the two busy at a time (a probe
would skew a burst's figures), and routes the keys: ctrl+r runs what the tab
in view offers, ctrl+c cancels. Workers post Messages (tui/messages.py) to
the tab that started them; handlers update the widgets on the UI thread.
"""

from __future__ import annotations

from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, Checkbox, Static, TabbedContent, TabPane

from ernie_tui.engine_ctl.load import BurstResult, ProbeFailure, ProbeResult, ServedModel, resolve_model
from ernie_tui.presets import PresetError
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import (  # noqa: F401  (re-exported: tests and callers import them from here)
    BurstDone,
    BurstProgress,
    LongPromptReady,
    ModelInfo,
    ProbeDone,
    ProbeText,
)
from ernie_tui.tui.probe_memory import ProbeMemory
from ernie_tui.tui.widgets.burst_tab import BurstTab, describe_burst  # noqa: F401
from ernie_tui.tui.widgets.capacity_view import CapacityView
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.probe_tab import (  # noqa: F401
    ERROR_TITLES,
    PROMPT_CHOICES,
    TEXT_INTERVAL_S,
    ProbeTab,
    ProbeTarget,
    describe_error,
    describe_probe,
    ms,
    parse_int_list,
)


class ProbeScreen(ShowsWorkerFailures, Screen[None]):
    """The probe pane. `url` is the server; `engine_pids` (optional) returns
    the engine's process ids so a burst can report its peak memory;
    `preset` and `engine_report` (optional) tag the run records. Any of the
    three left out is looked up on the app when it offers it."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+r", "run", "Send / run"),
        Binding("ctrl+c", "cancel", "Cancel", priority=True),
        Binding("x", "cancel", "Cancel", show=False),
        Binding("ctrl+b", "switch_tab", "Probe/Burst"),
        Binding("ctrl+e", "fold", "Fields", priority=True),  # (also from inside a field, whose own ctrl+e is End)
        Binding("ctrl+t", "toggle_chart", "Chart"),
    ]

    def __init__(self, url: str, api_key: str | None = None, *,
                 engine_pids: Callable[[], list[int]] | None = None,
                 preset: Any = None, engine_report: Any = None, memory: ProbeMemory | None = None,
                 capacity: bool = False,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        # What the last pane had (the app's, kept for the session), and
        # whether to open on the capacity search (the dashboard's `k`).
        self.memory = memory if memory is not None else ProbeMemory()
        self._open_capacity = capacity
        self.url = url
        self.api_key = api_key
        self.target = ProbeTarget(url, api_key)
        self._engine_pids = engine_pids
        self._preset = preset
        self._engine_report = engine_report

    # -- what the tabs hold, for callers and tests -----------------------------------------
    @property
    def served(self) -> ServedModel | None:
        return self.target.served

    @property
    def probe_tab(self) -> ProbeTab:
        return self.query_one(ProbeTab)

    @property
    def burst_tab(self) -> BurstTab:
        return self.query_one(BurstTab)

    @property
    def probe_running(self) -> bool:
        return self.probe_tab.running

    @property
    def burst_running(self) -> bool:
        return self.burst_tab.running

    @property
    def last_probe(self) -> ProbeResult | None:
        return self.probe_tab.last_probe

    @property
    def last_burst(self) -> BurstResult | None:
        return self.burst_tab.last_burst

    @property
    def last_record(self) -> str | None:
        return self.burst_tab.last_record

    # -- layout ---------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(Content.assemble(("Probe ", "bold"), self.url, ("  · reading /v1/models …", "dim")),
                     id="pf-head")
        # The tab it opens on: the search's (k), or the one in view when the last pane closed.
        with TabbedContent(initial="pf-tab-burst" if self._open_capacity else self.memory.tab or "pf-tab-probe"):
            with TabPane("Probe", id="pf-tab-probe"):
                yield ProbeTab(self.target)
            with TabPane("Burst", id="pf-tab-burst"):
                yield BurstTab(self.target, pids=self._pids_source, tags=self._record_tags)
        yield KeyFooter()

    def on_mount(self) -> None:
        if self.query_one(TabbedContent).active == "pf-tab-probe":
            # (a focus in a tab brings that tab to the front: only where the pane opens on it)
            self.query_one("#pf-prompt").focus()
        self.call_after_refresh(self._restore)  # once the tabs are set up: they pick their first tab on mount
        self._fetch_model()

    def _restore(self) -> None:
        """The kept fields and results, then one focus: the SLO (k), the
        level table (a search shown), or the burst's N."""
        self.memory.restore(self)
        if self._open_capacity:
            self.open_capacity()
        elif self.on_burst_tab and not self.burst_tab.capacity_mode:
            self.query_one("#pf-b-n").focus()

    def open_capacity(self) -> None:
        """The Burst tab in its capacity-search mode, the fields shown, the SLO focused."""
        self.query_one(TabbedContent).active = "pf-tab-burst"
        box = self.query_one("#pf-b-capacity", Checkbox)
        if not box.value and not self.burst_running:
            with box.prevent(Checkbox.Changed):
                box.value = True
            self.burst_tab.set_mode(True)
        self.burst_tab.fold(False)

    # -- model info ------------------------------------------------------------------
    @work(thread=True, group="pf-model", exit_on_error=False)
    def _fetch_model(self) -> None:
        try:
            served = resolve_model(self.url, None, self.api_key)
        except ProbeFailure as exc:
            self.post_message(ModelInfo(None, exc.error.message))
            return
        except Exception as exc:  # noqa: BLE001  never let a lookup kill the pane; the pane shows it
            self.post_message(ModelInfo(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ModelInfo(served))

    @on(ModelInfo)
    @drop_when_torn_down
    def _model_info(self, message: ModelInfo) -> None:
        head = self.query_one("#pf-head", Static)
        if message.model is None:
            self.target.served = None
            head.update(Content.assemble(("Probe ", "bold"), self.url, "  · ",
                                         (f"cannot read /v1/models: {message.error}", "$error")))
            return
        self.target.served = message.model
        limit = f"{message.model.max_model_len:,}" if message.model.max_model_len else "?"
        head.update(Content.assemble(("Probe ", "bold"), self.url, ("  · model ", "dim"), (message.model.id, "bold"),
                                     ("  · max_model_len ", "dim"), (limit, "bold")))

    def set_prompt(self, text: str) -> None:
        self.probe_tab.set_prompt(text)

    # -- one run at a time -----------------------------------------------------------------------
    def send_probe(self) -> None:
        if self.burst_running:
            self.notify("a burst or capacity search is running: its figures would include this probe; wait or "
                        "cancel it", severity="warning", timeout=4)
            return
        self.probe_tab.send()

    def run_burst(self) -> None:
        """The Burst tab's run: a burst, or a capacity search in that mode."""
        if self.probe_running:
            self.notify("a probe is running: wait for it or cancel it first", severity="warning", timeout=4)
            return
        self.burst_tab.run()

    def _pids_source(self) -> Callable[[], list[int]] | None:
        if self._engine_pids is not None:
            return self._engine_pids
        server = getattr(self.app, "server", None)
        fn = getattr(server, "engine_pids", None)
        return fn if callable(fn) else None

    def _record_tags(self) -> tuple[Any, Any]:
        """The preset and engine report to tag the run record with: given to
        the screen, or the app's when it serves this URL."""
        preset, report = self._preset, self._engine_report
        app = self.app
        try:
            status = getattr(app, "status", None)
            if status is not None and getattr(status, "url", None) and \
                    status.url.rstrip("/") != self.url.rstrip("/"):
                return preset, report
            if preset is None and status is not None and status.preset_name:
                book = getattr(app, "book", None)
                preset = book.get(status.preset_name) if book is not None and status.preset_name in book \
                    else status.preset_name
            if report is None:
                report = getattr(app, "report", None)
        except PresetError:
            pass
        return preset, report

    # -- keys and buttons ------------------------------------------------------------------------
    @property
    def on_burst_tab(self) -> bool:
        return self.query_one(TabbedContent).active == "pf-tab-burst"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        try:
            if action == "cancel":
                return self.probe_running or self.burst_running
            if action == "fold":  # the capacity search's fields: folded away or shown
                return self.on_burst_tab and self.burst_tab.capacity_mode
            if action == "toggle_chart":  # narrow: the chart and the level table take turns
                return self.on_burst_tab and self.burst_tab.capacity_mode and self.query_one(CapacityView).narrow
        except NoMatches:  # before compose, or while tearing down
            return False
        return True

    def action_run(self) -> None:
        if self.on_burst_tab:
            self.run_burst()
        else:
            self.send_probe()

    def action_cancel(self) -> None:
        # The tab in view first; else whatever runs.
        tabs = [self.burst_tab, self.probe_tab] if self.on_burst_tab else [self.probe_tab, self.burst_tab]
        for tab in tabs:
            if tab.cancel():
                self.notify("cancelling …", timeout=2)
                return

    def action_fold(self) -> None:
        self.burst_tab.fold(not self.burst_tab.folded)

    def action_toggle_chart(self) -> None:
        self.query_one(CapacityView).toggle_chart()

    def action_switch_tab(self) -> None:
        tabs = self.query_one(TabbedContent)
        tabs.active = "pf-tab-probe" if tabs.active == "pf-tab-burst" else "pf-tab-burst"

    def action_close(self) -> None:
        for tab in (self.probe_tab, self.burst_tab):  # the threads end on their own
            tab.cancel()
        self.memory.keep(self)
        self.dismiss(None)

    @on(Button.Pressed, "#pf-send")
    def _send_pressed(self) -> None:
        self.send_probe()

    @on(Button.Pressed, "#pf-b-run")
    def _burst_pressed(self) -> None:
        self.run_burst()

    @on(Button.Pressed, "#pf-b-fields")
    def _fields_pressed(self) -> None:
        self.action_fold()

    @on(Button.Pressed, "#pf-cancel, #pf-b-cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
