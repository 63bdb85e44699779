"""The fleet screen: one row per server (and per engine of a data-parallel
server), polled by engine_ctl.fleet on its own threads.

The poller's threads only post FleetUpdate messages; the handler here, on the
UI thread, rewrites the cells that changed (a whole-table rebuild only when
the set of rows changes, e.g. a server reports a second engine). Enter opens
the app's full dashboard for the highlighted server; escape or b comes back.

With --ray the Ray panel under the table shows the cluster's nodes and the
trials running there (any tune's or sweep's), asked every 2 s on a thread
worker of its own (RayTrials.snapshot, posted as RayStatus).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.messages import Update
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from ernie_tui.engine_ctl.control import FleetPoller, connecting_rows
from ernie_tui.engine_ctl.units import gib_str
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import FleetUpdate, RayStatus
from ernie_tui.tui.screens.help import HelpScreen
from ernie_tui.tui.screens.main import MainScreen
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.ray_panel import RayPanel
from ernie_tui.tui.workers import ray_loop

if TYPE_CHECKING:  # type-only: what these screens call on the fleet's App (fleet_app.py imports them)
    from ernie_tui.tui.app_protocol import FleetAppView

# (column key, header). Keys stay fixed; headers say the unit and the window.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("server", "server"),
    ("model", "model"),
    ("preset", "preset"),
    ("state", "state"),
    ("kv", "KV %"),
    ("reqs", "run / wait"),
    ("tps", "out tok/s"),
    ("ttft", "TTFT p99"),
    ("itl", "ITL p99"),
    ("mem", "memory"),
)

FLEET_KEYS: tuple[tuple[str, str], ...] = (
    ("↑ ↓", "choose a server (or one engine of a data-parallel server)"),
    ("enter", "open the full dashboard of that server (watch only, never stops it)"),
    ("escape / b", "in that dashboard: back to the fleet"),
    ("?", "this help"),
    ("q", "quit (no server is ever stopped from the fleet)"),
)

FLEET_FIGURES: tuple[tuple[str, str], ...] = (
    ("state", "ready, connecting, or 'not answering since HH:MM:SS: why' (connection refused, HTTP 500, "
              "no answer) with the last good figures dimmed"),
    ("KV %", "KV-cache use from /metrics; a whole server shows its fullest engine"),
    ("run / wait", "requests running / waiting, summed over engines"),
    ("out tok/s", "generation tokens per second between the last two polls"),
    ("TTFT p99", "99th percentile time to first token over the last minute (vLLM's histogram)"),
    ("ITL p99", "99th percentile inter-token latency over the last minute (vLLM's histogram)"),
    ("memory", "local servers only: GPU memory of its processes (NVML), else their RSS"),
    ("engine N", "a data-parallel server's engines, from the engine label on /metrics"),
    ("Ray panel", "with --ray: the cluster's nodes (alive, or LOST) and their resources; under each, the trials "
                  "of tune/sweep --ray running there, with their server's URL and what they do; 'again: lost "
                  "NODE' on a trial that runs again after its node was lost"),
)


def clock_time(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts is not None else "–"


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _latency(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _memory(row) -> str:
    if row.memory_bytes is None:
        return "–"
    what = "GPU" if row.memory_source == "gpu" else "RSS"
    return f"{gib_str(row.memory_bytes)} {what}"


def state_text(row) -> str:
    if row.state == "down":
        why = f": {row.reason}" if row.reason else ""
        return f"not answering since {clock_time(row.down_since)}{why}"
    if row.state == "connecting":
        return "connecting…"
    return "ready"


def cells(row) -> dict[str, Text]:
    """The table cells of one row. A server that stopped answering keeps its
    last good figures, dimmed; its state cell says since when."""
    stale = row.state == "down"
    figure_style = "dim" if stale else ""
    name = row.server if row.engine is None else f"  └ engine {row.engine}"
    state_style = {"down": "bold red", "connecting": "yellow"}.get(row.state, "green")
    running = "–" if row.running is None else f"{row.running:.0f}"
    waiting = "–" if row.waiting is None else f"{row.waiting:.0f}"
    text = {
        "server": (name, "bold" if row.engine is None else ""),
        "model": (row.model or "–", figure_style),
        "preset": (row.preset or "–", ""),
        "state": (state_text(row), state_style),
        "kv": (_num(row.kv_pct, ".1f"), figure_style),
        "reqs": (f"{running} / {waiting}", figure_style),
        "tps": (_num(row.gen_tps, ",.1f"), figure_style),
        "ttft": (_latency(row.ttft_p99_s), figure_style),
        "itl": (_latency(row.itl_p99_s), figure_style),
        "mem": (_memory(row), figure_style),
    }
    return {key: Text(value, style=style) for key, (value, style) in text.items()}


class FleetHelpScreen(HelpScreen):
    """`?` on the fleet: its own keys and columns."""

    def compose(self) -> ComposeResult:
        from textual.containers import Vertical, VerticalScroll
        from textual.widgets import Label

        with Vertical(id="help", classes="dialog -wide"):
            yield Label("ernie-tui fleet — keys and figures", classes="dialog-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(self._table("Keys", FLEET_KEYS), classes="help-section")
                yield Static(self._table("What the columns mean", FLEET_FIGURES), classes="help-section")
            yield Label("? or escape closes", classes="dialog-hint")


class FleetScreen(ShowsWorkerFailures, Screen):
    AUTO_FOCUS = "#fleet-table"

    BINDINGS = [
        Binding("enter", "open", "Dashboard", show=True),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    @property
    def fleet_app(self) -> FleetAppView:
        """self.app, typed: the fleet's App, whose methods this screen calls."""
        return cast("FleetAppView", self.app)

    def __init__(self, servers, *, interval: float = 1.0, live: bool = True, poller_factory=None, ray=None):
        super().__init__()
        self.ray = ray  # --ray: a connected RayTrials, whose snapshots the Ray panel shows
        self.servers = list(servers)
        self.interval = interval
        self.live = live
        self._poller_factory = poller_factory
        self.rows: dict[str, list] = {}  # server name -> its latest rows
        self._order: list[str] = []  # row keys as the table holds them
        self._shown: dict[str, dict[str, str]] = {}  # row key -> column key -> text shown
        self._detail = ""

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        yield DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        if self.ray is not None:
            yield RayPanel(self.ray.address or "", id="fleet-ray")
        yield Static(id="fleet-detail")
        yield KeyFooter()

    def on_mount(self) -> None:
        n = len(self.servers)
        self.query_one("#fleet-title", Static).update(
            f"Fleet · {n} server{'s' if n != 1 else ''} · /metrics every {self.interval:g} s · "
            "enter opens a server's dashboard")
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        for row in connecting_rows(self.servers):
            self.rows[row.server] = [row]
        self._rebuild()
        settle = getattr(self.app, "_settle_fleet", None)
        if settle is not None:
            settle()
        if self.live:
            self._poll()
            if self.ray is not None:
                self._ray_poll()

    @work(thread=True, group="fleet-poll", exit_on_error=False)
    def _poll(self) -> None:
        worker = get_current_worker()
        poller = (self._poller_factory or FleetPoller)(self.servers, interval=self.interval)
        shown: dict[str, list] = {}

        def post(name: str, rows: list) -> None:
            # Rows that show the same as last time (an idle server) cost the
            # UI thread nothing: only what a cell would change is posted.
            looks = [replace(r, polled_at=None, last_ok=None) for r in rows]
            if shown.get(name) != looks:
                shown[name] = looks
                self.post_message(FleetUpdate(name, rows))

        poller.run(post, lambda: worker.is_cancelled)

    @work(thread=True, group="fleet-ray", exit_on_error=False)
    def _ray_poll(self) -> None:
        worker = get_current_worker()
        ray_loop(self.post_message, self.ray, lambda: worker.is_cancelled)

    @on(RayStatus)
    @drop_when_torn_down
    def _ray_status(self, message: RayStatus) -> None:
        if self.ray is not None:
            self.query_one("#fleet-ray", RayPanel).show(message.snapshot)

    # -- rows from the poller -------------------------------------------------------
    @on(FleetUpdate)
    @drop_when_torn_down
    def _fleet_update(self, message: FleetUpdate) -> None:
        if message.server not in self.rows:
            return
        self.rows[message.server] = list(message.rows)
        wanted = [r.key for s in self.servers for r in self.rows[s.name]]
        if wanted != self._order:
            self._rebuild()
        else:
            table = self.query_one(DataTable)
            for row in message.rows:
                self._update_row(table, row)
        self._show_detail()
        tell = getattr(self.app, "fleet_row_changed", None)
        if tell is not None and message.rows:
            tell(message.rows[0])

    def _update_row(self, table: DataTable, row) -> None:
        shown = self._shown.setdefault(row.key, {})
        for key, text in cells(row).items():
            plain = f"{text.plain}\0{text.style}"
            if shown.get(key) != plain:  # rewrite only what changed: a repaint per cell
                shown[key] = plain
                table.update_cell(row.key, key, text, update_width=True)

    def _rebuild(self) -> None:
        table = self.query_one(DataTable)
        selected = self.selected_key
        table.clear()
        self._shown.clear()
        self._order = []
        for server in self.servers:
            for row in self.rows[server.name]:
                c = cells(row)
                table.add_row(*(c[key] for key, _ in COLUMNS), key=row.key)
                self._shown[row.key] = {k: f"{t.plain}\0{t.style}" for k, t in c.items()}
                self._order.append(row.key)
        if selected in self._order:
            table.move_cursor(row=self._order.index(selected), animate=False)
        self._show_detail()

    # -- the highlighted row ---------------------------------------------------------
    @property
    def selected_key(self) -> str | None:
        table = self.query_one(DataTable)
        if not self._order or table.cursor_row is None or not 0 <= table.cursor_row < len(self._order):
            return None
        return self._order[table.cursor_row]

    def selected_row(self):
        key = self.selected_key
        for rows in self.rows.values():
            for row in rows:
                if row.key == key:
                    return row
        return None

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        row = self.selected_row()
        detail = self.query_one("#fleet-detail", Static)
        if row is None:
            self._detail = ""
            detail.update("")
            return
        server = next((s for s in self.servers if s.name == row.server), None)
        bits = [f"{row.key}  {row.url}"]
        if server is not None and server.log:
            bits.append(f"log {server.log}")
        if row.engines > 1:
            bits.append(f"{row.engines} engines (data parallel)")
        if row.state == "down":
            bits.append(f"not answering since {clock_time(row.down_since)}")
            bits.append(f"last good figures from {clock_time(row.last_ok)}" if row.last_ok
                        else "no figures yet")
            if row.error:
                bits.append(row.error)
        text = " · ".join(bits)
        if text != self._detail:  # an unchanged line costs no repaint
            self._detail = text
            self._repaint_detail(detail, text)

    def _repaint_detail(self, detail: Static, text: str) -> None:
        """Show `text` in the detail line in the same frame as the table's
        cursor. Textual hears of a widget's repaint only once that widget's
        own queue goes idle, by which time the screen has drawn the frame with
        the moved cursor: the line came one frame later (the update timer,
        ~17-20 ms), and a re-layout another. Measured in tmux with 8 servers:
        down/up p50 33 ms before, 9 ms after (docs/lab/benchmarks/fleet-overhead.md)."""
        width, lines = detail.content_size.width, detail.content_size.height
        detail.update(text, layout=False)
        if not width or detail.get_content_height(detail.content_size, detail.content_size, width) != lines:
            detail.refresh(layout=True)  # wraps to more or fewer lines: the table gives or takes rows
        # Queued on this screen, whose handler we are in: it lands before
        # the screen goes idle and draws.
        self.post_message(Update(detail))

    # -- keys -----------------------------------------------------------------------
    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        row = self.selected_row()
        if row is not None:
            self.fleet_app.open_server(row.server)

    def action_help(self) -> None:
        # Installed once, like the dashboard's: composing it afresh on every
        # `?` cost each press its widgets (and their garbage).
        if not self.app.is_screen_installed("fleet-help"):
            self.app.install_screen(FleetHelpScreen(), "fleet-help")
        self.app.push_screen("fleet-help")

    def action_quit(self) -> None:
        self.fleet_app.request_quit()


class ServerDashboard(MainScreen):
    """The full attach dashboard of one fleet server; escape or b goes back."""

    BINDINGS = [Binding("b", "back", "Fleet")]

    @property
    def fleet_app(self) -> FleetAppView:
        """self.app, typed: the fleet's App, whose methods this screen calls."""
        return cast("FleetAppView", self.app)

    def __init__(self) -> None:
        super().__init__("attach")

    def key_escape(self) -> None:
        if self.query_one("#log-search", Input).has_class("-visible"):
            super().key_escape()  # escape first closes the log search
        else:
            self.action_back()

    def action_back(self) -> None:
        self.fleet_app.leave_server()
