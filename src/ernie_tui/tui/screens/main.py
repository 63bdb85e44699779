"""The dashboard screen: status bar, crash panel, presets, startup report,
charts, log pane, footer. It owns the key bindings (so a modal dialog on top
never sees them) and draws what the app hands it; control requests go back
to the app, which runs them in workers."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Input

from ernie_tui.tui.format import since
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import SeriesUpdate
from ernie_tui.tui.series import WINDOWS
from ernie_tui.tui.widgets.charts import KVChart, MemoryChart, ThroughputChart
from ernie_tui.tui.widgets.error_panel import ErrorPanel
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.log_view import LogView
from ernie_tui.tui.widgets.presets_panel import PresetsPanel
from ernie_tui.tui.widgets.report_panel import ReportPanel
from ernie_tui.tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:  # type-only: what this screen calls on its App (app.py imports this screen)
    from ernie_tui.tui.app_protocol import DashboardApp

COMPACT_HEIGHT = 32  # below this many rows the charts swap with the log

NARROW_WIDTH = 120  # below this many columns the footer is compact and leaves out NARROW_OPTIONAL
# In the help screen; `? Help` and `q Quit` must stay on screen. `p` too: `k`
# opens the same pane (on its capacity search), ctrl+b there reaches the rest.
NARROW_OPTIONAL = ("command", "window", "probe", "sweep", "traffic")
# `w` from this many columns (at 160 it was in no footer at all): below it,
# with `f Fix` after a crash, the footer ran past `q Quit`.
SWEEP_KEY_WIDTH = 132
# `T` beside the control keys from this many columns (with `f Fix` and `w`,
# narrower cut `q Quit`); without them (attach) it fits from NARROW_WIDTH.
TRAFFIC_KEY_WIDTH = 140

CONTROL_ACTIONS = {"start", "stop", "restart", "switch", "edit", "fix", "command", "sweep"}


class MainScreen(Screen):
    AUTO_FOCUS = "#log"

    BINDINGS = [
        Binding("s", "start", "Start"),
        Binding("x", "stop", "Stop"),
        Binding("r", "restart", "Restart"),
        *[Binding(str(i), f"switch({i})", f"Preset {i}", show=False) for i in range(1, 10)],
        Binding("e", "edit", "Edit"),
        Binding("c", "command", "Cmd"),
        Binding("f", "fix", "Fix"),
        Binding("p", "probe", "Probe"),
        Binding("k", "capacity", "Capacity"),
        Binding("w", "sweep", "Sweep"),
        Binding("T", "traffic", "Traffic"),
        Binding("t", "window", "Window"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match(1)", "Next", show=False),
        Binding("N", "next_match(-1)", "Prev", show=False),
        Binding("l,end", "follow", "Follow", show=False),
        Binding("j", "jump", "Root cause", show=False),
        Binding("g", "toggle_charts", "Charts/log", show=False),
        Binding("v", "toggle_prefix", "Full prefixes", show=False),
        Binding("a", "toggle_polling", "Polling lines", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    @property
    def ernie_app(self) -> DashboardApp:
        """self.app, typed: this screen runs in the dashboard's App (ErnieApp
        or the fleet's subclass of it), whose methods it calls."""
        return cast("DashboardApp", self.app)

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.window_index = 1  # 5 min
        self._series = None
        self._fix_text: str | None = None
        self._fixable = False
        self._state = "stopped"
        self._url = ""
        self._unreachable: dict | None = None  # an attached server that stopped answering

    # -- layout -------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(self.mode, id="status-bar")
        yield ErrorPanel(id="error-panel")
        with Horizontal(id="top"):
            yield PresetsPanel(id="presets")
            yield ReportPanel(id="report")
        with Horizontal(id="charts"):
            yield MemoryChart(id="chart-mem")
            yield ThroughputChart(id="chart-tps")
            yield KVChart(id="chart-kv")
        with Vertical(id="log-pane"):
            yield LogView(id="log")
            yield Input(placeholder="search the log · enter keeps it · escape closes", id="log-search")
        yield KeyFooter(optional=NARROW_OPTIONAL)

    def on_mount(self) -> None:
        self.query_one("#presets").border_title = "Presets · 1-9 switch"
        self.query_one("#report").border_title = "Startup report"
        self.query_one("#error-panel").border_title = "Server crashed"
        self.set_class(self.mode != "control", "-readonly")
        self._update_log_title()
        self.show_series(SeriesUpdate(()))  # empty charts that say why they are empty
        if self._unreachable is not None:
            self._show_unreachable()
        self.ernie_app.main_mounted()

    def on_resize(self, event: Resize) -> None:
        self.set_class(event.size.height < COMPACT_HEIGHT, "-compact")
        self._layout_footer()

    def _layout_footer(self) -> None:
        """Narrow: the footer keeps the essentials. Compact (charts swap
        with the log): `g` is in the footer, named for what it shows next."""
        compact = self.has_class("-compact") and self._state != "crashed"  # crashed: no charts to swap in
        self.query_one(KeyFooter).set_layout(
            narrow=self.size.width < NARROW_WIDTH,
            extra=frozenset({"toggle_charts"}) if compact else frozenset(),
            labels={"toggle_charts": "Log" if self.has_class("-show-charts") else "Charts"},
            left_out=frozenset({*(["sweep"] if self.size.width < SWEEP_KEY_WIDTH else []),
                                *(["traffic"] if self.mode == "control" and self.size.width < TRAFFIC_KEY_WIDTH
                                  else [])}))

    # -- what the app hands us ----------------------------------------------------
    @property
    def log_view(self) -> LogView:
        return self.query_one("#log", LogView)

    def show_status(self, status, now: float) -> None:
        self._url = status.url or self._url
        if self.mode == "attach":
            down = status.state.value == "stopped" and status.phase == "unreachable"
            if down and self._unreachable is None:
                self.show_unreachable(now)
            elif status.state.value == "ready" and self._unreachable is not None:
                self.show_unreachable(None)
        self.query_one(StatusBar).set_status(status)
        self.query_one(StatusBar).tick(now)
        state = status.state.value
        if state != self._state:
            self._state = state
            self._replot()
            self._layout_footer()
        self.query_one(ReportPanel).set_state(state)
        self.query_one(PresetsPanel).set_active(status.preset_name, state)
        panel = self.query_one(ErrorPanel)
        self.set_class(state == "crashed", "-crashed")
        if state == "crashed" and status.error is not None:
            panel.show_error(status.error, status.exit_code, self._fix_text, mode=self.mode,
                             leftovers=status.leftovers_ended)
            self._show_root_cause(status.error.line_no)
            panel.border_title = "Server crashed" if self.mode != "replay" else "The logged server failed"
        elif state in ("starting", "ready", "stopped", "stopping"):
            panel.show_error(None)
            if state == "starting":
                self.log_view.mark_root_cause(None)
        self.refresh_bindings()

    def show_replay_error(self, error) -> None:
        panel = self.query_one(ErrorPanel)
        panel.border_title = "The logged server failed"
        panel.show_error(error, None, self._fix_text, mode="replay")
        self.set_class(error is not None, "-crashed")
        self._show_root_cause(error.line_no if error else None)

    def _show_root_cause(self, line_no: int | None) -> None:
        """Mark the root-cause line and bring it into view (after the pane has
        the lines: a crash's status can overtake its last log batch)."""
        self.log_view.mark_root_cause(line_no, reveal=True)

    def show_unreachable(self, since: float | None, reason: str | None = None, *, url: str | None = None,
                         preset: str | None = None, log: str | None = None, back: str | None = None) -> None:
        """An attached server that does not answer: the report and the charts
        say since when, why, and what to do, instead of "no startup report
        yet" and "server not ready" as if it were starting. None clears it."""
        if since is None:
            self._unreachable = None
        else:
            import time

            began = time.strftime("%H:%M:%S", time.localtime(since))
            start = f"ernie-tui --preset {preset}" if preset else "ernie-tui with its preset"
            where = url or self._url or "its URL"
            todo = (f"What to do: start it again ({start}) on the machine that runs it, or check the URL and "
                    "port" + (f"; its log: {log}" if log else "") + "." + (f" {back}." if back else ""))
            self._unreachable = {"began": began, "reason": reason, "lines": [
                ("Not answering since " + began + (f": {reason}" if reason else ""), "bold $error"),
                (f"Nothing is starting: no server answers at {where}; vLLM there stopped, crashed or never "
                 "started.", ""),
                (todo, "$text-muted")]}
        if self.is_mounted:
            self._show_unreachable()

    def show_no_log(self, url: str) -> None:
        """Attached without a log: the report and the log pane read the
        server's log, so say that none was given and how to give one."""
        self.query_one(ReportPanel).set_no_log(
            "The startup report (args, attention backend, weights, KV cache) and the log pane read the "
            f"server's log. Give it: ernie-tui --attach {url} --log PATH (the file vLLM's output goes to; "
            "in a --fleet file, log = PATH). The status and the charts come from /health and /metrics meanwhile.")

    def _show_unreachable(self) -> None:
        down = self._unreachable
        self.query_one(ReportPanel).set_unreachable(down["lines"] if down else None)
        self._replot()

    def set_fix_text(self, text: str | None, fixable: bool = False, title: str | None = None) -> None:
        self._fix_text = text
        self._fixable = fixable
        panel = self.query_one(ErrorPanel)
        panel.fixable, panel.title = fixable, title
        if panel.error is not None:
            panel.show_error(panel.error, panel.exit_code, text, mode=panel.mode)
        self.refresh_bindings()

    def set_estimate(self, estimate, name: str) -> None:
        self.query_one(ReportPanel).set_estimate(estimate, name)

    def show_report(self, report) -> None:
        self.query_one(ReportPanel).set_report(report)
        self.query_one(StatusBar).set_report(report)

    def show_series(self, update) -> None:
        self._series = update
        self._replot()
        self.query_one(ReportPanel).set_metrics_kv_tokens(update.kv_tokens_metrics)

    def _replot(self) -> None:
        u = self._series
        if u is None:
            return
        window = WINDOWS[self.window_index][0]
        now = u.now if u.now is not None else (u.points[-1].t if u.points else 0.0)
        extra = {"memory_label": u.memory_label, "memory_source": u.memory_source, "gpu_totals": u.gpu_totals}
        problem: dict = {}
        alert: str | None = None
        if self.mode == "replay":
            extra.update(empty_memory="a log holds no memory figures", empty="no stats lines in this log")
        else:
            ready = self._state == "ready"
            extra.update(empty_memory="waiting for samples" if u.memory_source == "nvml"
                         or self._state in ("starting", "ready", "stopping") else "no engine running",
                         empty="waiting for /metrics" if ready else "server not ready: no metrics")
            down = self._unreachable
            if down is not None and not ready:
                why = f"not answering since {down['began']}" + (f"\n{down['reason']}" if down["reason"] else "")
                extra.update(empty_memory=why, empty=why)
            if ready and u.metrics_error and u.metrics_error_since is not None:
                # /metrics fails: say what and since when, not "waiting" (issue #10, 6).
                what, began, lasted = since(u.metrics_error, u.metrics_error_since, now)
                problem = {"empty": f"{what}\nsince {began} ({lasted})", "problem": f"{what} ({lasted})"}
                alert = f"{what} since {began} ({lasted})"
        self.query_one(StatusBar).set_alert(alert)
        with self.app.batch_update():
            self.query_one(MemoryChart).show(u.points, window, now, **extra)
            for chart in (self.query_one(ThroughputChart), self.query_one(KVChart)):
                chart.show(u.points, window, now, **{**extra, **problem})


    def show_log(self, batch, run_changed: bool) -> None:
        log = self.log_view
        if run_changed:
            log.clear()
            panel = self.query_one(ErrorPanel)
            if panel.error is not None:  # the crash's status overtook its first lines
                log.mark_root_cause(panel.error.line_no, reveal=True)
        log.append(batch.lines, dropped=batch.dropped, first_line_no=batch.first_line_no)

    @on(LogView.NeedEarlier)
    def _need_earlier(self, event: LogView.NeedEarlier) -> None:
        load = getattr(self.app, "load_earlier", None)
        if load is not None:
            load(event.line_no)

    def tick(self, now: float) -> None:
        self.query_one(StatusBar).tick(now)

    def set_presets(self, book, highlight: str | None = None) -> None:
        self.query_one(PresetsPanel).set_book(book, highlight)

    @property
    def preset_names(self) -> list[str]:
        return self.query_one(PresetsPanel).names

    @property
    def highlighted_preset(self) -> str | None:
        return self.query_one(PresetsPanel).highlighted_name

    # -- log pane title, search -----------------------------------------------------
    @on(LogView.StateChanged)
    @drop_when_torn_down
    def _update_log_title(self) -> None:
        log = self.log_view
        pane = self.query_one("#log-pane")
        name = getattr(self.app, "log_name", "llm.log")
        pane.border_title = f"Log · {name}"
        bits = []
        if log.follow:
            bits.append("following")
        else:
            bits.append("PAUSED" + (f" · {log.pending:,} new" if log.pending else "") + " · l follows")
        info = log.search_info()
        if info is not None:
            cur, total = info
            bits.append(f"/{log.search_term} {cur if total else 0} of {total}")
        folded = log.polling_folded
        if folded:
            bits.append(f"{folded:,} /metrics·/health lines " + ("folded · a shows" if log.fold_polling
                                                                 else "shown · a folds"))
        if log.dropped:
            bits.append(f"{log.dropped:,} lines skipped in a flood")
        elif log.line_count and log._first_no > 1:
            bits.append(f"from line {log._first_no:,} (scroll up for earlier)")
        pane.border_subtitle = " · ".join(bits)
        pane.set_class(not log.follow, "-paused")

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.add_class("-visible")
        box.value = self.log_view.search_term or ""
        box.focus()

    @on(Input.Changed, "#log-search")
    def _search_changed(self, event: Input.Changed) -> None:
        self.log_view.search(event.value)

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        self.log_view.search(event.value)
        self.query_one("#log-search", Input).remove_class("-visible")
        self.log_view.focus()

    def key_escape(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.has_class("-visible"):
            box.remove_class("-visible")
            box.value = ""
            self.log_view.search("")
            self.log_view.focus()

    def action_next_match(self, step: int) -> None:
        self.log_view.next_match(step)

    def action_follow(self) -> None:
        self.log_view.follow = True

    def action_jump(self) -> None:
        line = self.log_view.root_cause_no
        if line is None or not self.log_view.jump_to_line(line):
            self.notify("no root-cause line to jump to", timeout=3)

    def action_window(self) -> None:
        self.window_index = (self.window_index + 1) % len(WINDOWS)
        self._replot()
        self.notify(f"chart window: {WINDOWS[self.window_index][1]}", timeout=2)

    def action_toggle_prefix(self) -> None:
        self.log_view.compact = not self.log_view.compact

    def action_toggle_polling(self) -> None:
        """Show / fold the /metrics and /health access lines of a server that logs them."""
        log = self.log_view
        log.set_fold_polling(not log.fold_polling)

    def action_toggle_charts(self) -> None:
        self.toggle_class("-show-charts")
        self._layout_footer()

    # -- control: handed to the app -------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS and self.mode != "control":
            return False
        if action == "fix" and not self._fixable:
            return False  # shown in the footer only when there is a fix to apply
        if action == "traffic" and self.mode == "replay":
            return False  # a log has no /metrics
        if action in ("probe", "capacity"):
            return False if self.mode == "replay" else (True if self._state == "ready" else None)
        app = self.app
        can = getattr(app, "can_control", None)
        if can is not None and action in ("start", "stop", "restart"):
            return True if can(action) else None
        return True

    def action_start(self) -> None:
        self.ernie_app.request_start()

    def action_stop(self) -> None:
        self.ernie_app.request_stop()

    def action_restart(self) -> None:
        self.ernie_app.request_restart()

    def action_switch(self, number: int) -> None:
        names = self.preset_names
        if not 1 <= number <= len(names):
            self.notify(f"no preset {number}: there are {len(names)}", severity="warning", timeout=3)
            return
        self.query_one(PresetsPanel).highlight(names[number - 1])
        self.ernie_app.request_switch(names[number - 1])

    @on(PresetsPanel.Chosen)
    def _chosen(self, event: PresetsPanel.Chosen) -> None:
        if self.mode == "control":
            self.ernie_app.request_switch(event.name)

    def action_edit(self) -> None:
        self.ernie_app.request_edit(self.highlighted_preset)

    def action_command(self) -> None:
        self.ernie_app.show_command_line(self.highlighted_preset)

    def action_fix(self) -> None:
        self.ernie_app.request_fix()

    def action_probe(self) -> None:
        self.ernie_app.open_probe()

    def action_capacity(self) -> None:
        self.ernie_app.open_probe(capacity=True)

    def action_sweep(self) -> None:
        self.ernie_app.open_sweep()

    def action_traffic(self) -> None:
        self.ernie_app.open_traffic()

    def action_help(self) -> None:
        self.ernie_app.open_help()

    def action_quit(self) -> None:
        self.ernie_app.request_quit()
