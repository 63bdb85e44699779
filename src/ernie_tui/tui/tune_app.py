"""`ernie-tui tune ... --tui`: the tune's trials as they finish, the best so
far and the budget left; x (or ctrl+c) stops it, keeping what was measured.

The tune (engine_ctl's run_tune, blocking) runs in a thread worker that
only posts the messages below. The screen cannot be left while a tune runs,
so no trial's server is left unwatched: q is refused until it has ended; x
stops it first (the trial's server is stopped, the finished trials kept).
The app returns the TuneResult (None if the tune raised) for the command
line to save and print, as without --tui.

With --ray a second thread worker asks the cluster every 2 s for its nodes
and the trials running there (RayTrials.snapshot) and posts RayStatus; the
Ray panel above the trials shows them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from ernie_tui.engine_ctl.control import TuneResult, TuneSetup, preset_choice, run_tune
from ernie_tui.tui.messages import RayStatus
from ernie_tui.tui.widgets.ray_panel import RayPanel
from ernie_tui.tui.workers import ray_loop

COLUMNS = ("trial", "setting", "outcome", "goodput tok/s", "capacity", "TTFT p99 ms", "ITL p99 ms")


class TuneEvent(Message):
    """One of run_tune's progress events."""

    def __init__(self, event: dict[str, Any]) -> None:
        super().__init__()
        self.event = event


class TuneFinished(Message):
    def __init__(self, result: TuneResult | None, error: str | None) -> None:
        super().__init__()
        self.result, self.error = result, error


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _setting(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


class TuneScreen(Screen):
    # The trials take the room the lines above them leave (the Ray panel's too).
    DEFAULT_CSS = """
    TuneScreen #tn-trials { height: 1fr; }
    """
    BINDINGS = [Binding("x", "stop", "Stop"), Binding("ctrl+c", "stop", "Stop", priority=True),
                Binding("q", "leave", "Quit")]

    def __init__(self, setup: TuneSetup, preset: str | None = None, write_anyway: bool = False, *,
                 live: bool = True) -> None:
        super().__init__()
        self.setup = setup
        self.live = live  # False: nothing runs (tests feed the screen its messages)
        self.ray = setup.options.ray  # --ray: the cluster whose nodes and trials the Ray panel shows
        # The preset the command line writes once the screen closes (None:
        # --no-preset), and whether it writes it even if not confirmed better.
        self.preset, self.write_anyway = preset, write_anyway
        self.cancel = threading.Event()
        self.started = time.monotonic()
        self.running = True
        self.measured = 0
        self.result: TuneResult | None = None
        self.error: str | None = None
        self.stopped_by_operator = False  # x or ctrl+c while it ran (leaving the app cancels it too)
        self.now = "starting …"

    def compose(self) -> ComposeResult:
        s = self.setup
        yield Static(f"tune of {s.base.name} under {' '.join(str(o) for o in s.capacity.slo)}: "
                     + ", ".join(p.describe() for p in s.space.params), id="tn-title")
        yield Static("no best yet", id="tn-best")
        yield Static("", id="tn-budget")
        yield Static("", id="tn-now")
        if self.ray is not None:
            yield RayPanel(self.ray.address or "", id="tn-ray")
        yield DataTable(id="tn-trials", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#tn-trials", DataTable).add_columns(*COLUMNS)
        self.set_interval(1.0, self._show_budget)
        self._show_budget()
        if self.live:
            self._worker()
            if self.ray is not None:
                self._ray_worker()

    def on_unmount(self) -> None:
        self.cancel.set()  # the app quits anyway: the worker stops the trial's server

    @work(thread=True, group="tune", exit_on_error=False)
    def _worker(self) -> None:
        result, error = None, None

        def progress(ev: dict[str, Any]) -> None:
            self.post_message(TuneEvent(dict(ev)))

        try:
            result = run_tune(self.setup, progress, self.cancel)
        except Exception as exc:  # noqa: BLE001  shown on the screen and handed to the command line
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(TuneFinished(result, error))

    @work(thread=True, group="tune-ray", exit_on_error=False)
    def _ray_worker(self) -> None:
        worker = get_current_worker()
        ray_loop(self.post_message, self.ray, lambda: worker.is_cancelled)

    @on(RayStatus)
    def _ray_status(self, message: RayStatus) -> None:
        if self.ray is not None:
            self.query_one("#tn-ray", RayPanel).show(message.snapshot)

    def on_tune_event(self, message: TuneEvent) -> None:
        ev = message.event
        kind = ev["event"]
        if kind == "base_start":
            self.now = f"measuring BASE {ev['preset']} …"
        elif kind == "base_done":
            self.now = f"BASE {ev['preset']}: {_fmt(ev['goodput'])} tok/s"
        elif kind == "trial_start":
            self.now = f"trial {ev['number']} {_setting(ev['params'])}: preflight, then its capacity search …"
        elif kind == "confirm":
            self.now = f"confirming, round {ev['round']}: {ev['preset']} …"
        elif kind == "waiting":
            self.now = "waiting: other drivers of the study are measuring its last trials …"
        elif kind == "sweep":
            ce = ev["sweep"].get("capacity_event")
            if ce and ce.get("event") == "level_done":
                lv = ce["level"]
                verdict = "pass" if lv.passed else "fail"
                self.now = f"{ev['sweep'].get('preset')}: concurrency {lv.concurrency} {verdict}"
        elif kind == "trial_done" and ev["row"] is not None:
            self._add_row(ev["row"])
            self.measured = ev["measured"]
            best = ev["best"]
            if best is not None:
                self.query_one("#tn-best", Static).update(
                    f"best so far: trial {best.number} {_setting(best.params)}: {_fmt(best.goodput)} tok/s")
        self._show_budget()

    def _add_row(self, r: Any) -> None:
        outcome = r.outcome if r.outcome == "measured" else f"{r.outcome}: {r.reason}"
        self.query_one("#tn-trials", DataTable).add_row(
            str(r.number), _setting(r.params), outcome[:80], _fmt(r.goodput),
            "–" if r.capacity is None else f"{r.capacity:g}", _fmt(r.ttft_p99_ms), _fmt(r.itl_p99_ms))

    def _show_budget(self) -> None:
        s = self.setup
        parts = [f"{self.measured}/{s.max_trials} trials measured" if s.max_trials else f"{self.measured} measured"]
        if s.budget_s:
            parts.append(f"{max(0.0, s.budget_s - (time.monotonic() - self.started)) / 60:.1f} min left")
        state = "stopping: the trial's server is being stopped …" if self.running and self.cancel.is_set() else (
            "running (x stops, keeping what was measured)" if self.running else "finished (q quits)")
        self.query_one("#tn-budget", Static).update(f"{', '.join(parts)}; {state}")
        self.query_one("#tn-now", Static).update(self.now)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self.running = False
        self.result, self.error = message.result, message.error
        if message.error:
            self.now = f"the tune failed: {message.error}"
        elif message.result is not None:
            r = message.result
            self.now = f"{r.stopped}. vs BASE: {r.verdict.text}" + self._preset_words(r)
            table = self.query_one("#tn-trials", DataTable)
            if table.row_count < len(r.trials):  # trials of an earlier run of the study
                table.clear()
                for row in r.trials:
                    self._add_row(row)
        self._show_budget()

    def _preset_words(self, r: TuneResult) -> str:
        """What happens to the best once the screen closes (cli/cmd_tune.py writes it)."""
        if self.preset is None or self.stopped_by_operator:
            return ""
        choice = preset_choice(r, self.write_anyway)
        if choice.write and choice.confirmed:
            return f"\nPreset {self.preset}: written when you quit (the best beat BASE beyond noise)."
        if choice.write:
            return (f"\nPreset {self.preset}: written when you quit, although {choice.why} "
                    "(--write-even-if-not-better).")
        return f"\nPreset {self.preset}: not written: {choice.why}."

    def action_stop(self) -> None:
        if self.running:
            self.stopped_by_operator = True
            self.cancel.set()
            self._show_budget()
        else:
            self.app.exit(self.result)

    def action_leave(self) -> None:
        if self.running:
            self.notify("a tune is running: x stops it (keeping what was measured), then q quits", timeout=3)
            return
        self.app.exit(self.result)


class TuneApp(App[TuneResult | None]):
    """The tune screen on its own, for `ernie-tui tune --tui`."""

    TITLE = "ernie-tui tune"

    def __init__(self, setup: TuneSetup, preset: str | None = None, write_anyway: bool = False, *,
                 live: bool = True) -> None:
        super().__init__()
        self.tune_screen = TuneScreen(setup, preset, write_anyway, live=live)

    def get_default_screen(self) -> Screen:
        return self.tune_screen

    @property
    def stopped_by_operator(self) -> bool:
        return self.tune_screen.stopped_by_operator
