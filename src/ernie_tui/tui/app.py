"""The ernie-tui App and `make_app()`, the one factory the CLI and the tests use.

Modes:
- control: start / stop / restart a server from presets (keys s x r, 1-9);
- attach:  watch a server this tool did not start (never stops it);
- replay:  open a captured llm.log offline.

Threads: the watcher's monitor thread (a server we started, one we attach
to, or a replayed log: the same monitor, the one log parser) calls our
listener (ServerBridge); worker threads sample memory and /metrics, post the
watcher's report snapshots, read earlier log lines for the pane, and carry
out start/stop/restart (stop blocks until every engine process is gone).
All of them only post Messages; the handlers below run on the UI thread and
hand the data to the main screen's widgets.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from textual import on, work
from textual.app import App, SuspendNotSupported, SystemCommand
from textual.screen import Screen
from textual.worker import get_current_worker

from ernie_tui import paths
from ernie_tui.engine_ctl.control import (
    AttachedServer,
    EngineServer,
    LogReplay,
    ServerError,
    ServerState,
    ServerStatus,
    find_detached,
)
from ernie_tui.engine_ctl.launch import apply_fix, diagnose_failure, run_preflight
from ernie_tui.engine_ctl.load import LatestScrape
from ernie_tui.engine_ctl.logs import ErrorKind, Severity
from ernie_tui.presets import Preset, PresetBook, PresetError, load_presets
from ernie_tui.presets.store import ensure_preset, save_preset
from ernie_tui.tui.failures import Failure, ShowsWorkerFailures, last_line, log, show_failure
from ernie_tui.tui.lifecycle import tearing_down
from ernie_tui.tui.messages import (
    ControlResult,
    LogBatch,
    LogEarlier,
    PreflightDone,
    PresetsLoaded,
    ReplayDone,
    ReportUpdate,
    SeriesUpdate,
    StatusUpdate,
    TrafficUpdate,
)
from ernie_tui.tui.presets_watch import INTERVAL_S as PRESETS_WATCH_S
from ernie_tui.tui.presets_watch import PresetFilesWatch
from ernie_tui.tui.probe_memory import ProbeMemory
from ernie_tui.tui.screens.dialogs import (
    BusyScreen,
    CommandLineScreen,
    ConfirmScreen,
    PreflightScreen,
    QuitScreen,
)
from ernie_tui.tui.screens.help import HelpScreen
from ernie_tui.tui.screens.main import MainScreen
from ernie_tui.tui.strip_cycles import stop_strip_self_cycles
from ernie_tui.tui.traffic_watch import TrafficState, TrafficWatch
from ernie_tui.tui.workers import Sampler, ServerBridge, read_earlier, report_loop

ServerFactory = Callable[..., object]


@dataclass
class DashboardConfig:
    mode: str = "control"  # "control" | "attach" | "replay"
    preset: str | None = None
    preset_files: list[str] = field(default_factory=list)
    include_user_presets: bool = True
    book: PresetBook | None = None
    model: str | None = None
    attach_url: str | None = None
    log_path: str | None = None
    replay_path: str | None = None
    start: bool = False
    on_exit: str = "ask"  # "ask" | "stop" | "leave"
    server_factory: ServerFactory | None = None
    clock: Callable[[], float] = time.time
    sample_interval: float = 1.0
    report_interval: float = 0.25
    live: bool = True  # run the sampler / report workers (snapshot tests feed data instead)
    resource_factory: Callable | None = None
    metrics_factory: Callable | None = None
    api_key: str | None = None
    server_log_path: str | None = None  # where a started server writes llm.log
    adopt: bool = True  # control mode: take back a server a previous dashboard left running
    traffic_interval: float = 5.0  # seconds between the scrapes that feed the traffic view


def default_server_factory(spec, *, preset_name: str, log_path: str | None = None):
    return EngineServer(spec, preset_name=preset_name, log_path=log_path)


class ErnieApp(ShowsWorkerFailures, App[int]):
    CSS_PATH = "ernie_tui.tcss"
    TITLE = "ernie-tui"

    def __init__(self, config: DashboardConfig):
        super().__init__()
        self.config = config
        self.mode = config.mode
        self.clock = config.clock
        self.book: PresetBook = config.book if config.book is not None else load_presets(
            config.preset_files, include_user=config.include_user_presets)
        names = self.book.names()
        if config.preset and config.preset not in self.book:
            self.book.get(config.preset)  # raises PresetError with the known names
        self.active_preset: str | None = config.preset or (names[0] if names else None)
        self.server = None
        self.bridge = None
        self.status = None
        self.report = None
        # The chart sampler's newest /metrics scrape: a burst or search from the
        # probe pane on this server reads it instead of scraping a second time.
        self.latest_scrape = LatestScrape()
        # The traffic window of the server watched (the sampler feeds it) and its
        # latest state, for the traffic view (`T`).
        self.traffic = TrafficWatch()
        self.last_traffic: TrafficState | None = None
        self.probe_memory = ProbeMemory()  # the probe pane's fields and results, kept for the session
        self.exit_action: str = "none"  # "stop" | "leave" | "none": what run_dashboard must still do
        self.detach_record = None  # where a detached server was recorded (quit: leave)
        # run_dashboard's epilogue (stop or detach); set by the CLI so that a
        # hangup can finish even when Textual cannot. None in tests.
        self.finisher = None
        self.hangup = False
        self._busy: str | None = None
        self._log_run: object = object()
        self._report_seen: tuple[object, int] | None = None  # (run, version) of the report shown
        self._last_series: SeriesUpdate | None = None
        self._diagnosis = None
        self._main_ready = False
        self._early: list = []
        self._ticking = False
        self.log_name = "llm.log"
        self.main = MainScreen(self.mode)
        # The presets files, watched so that a preset `tune` writes from another
        # process shows up here without a restart; none for a book given ready-made.
        self._presets_watch = None if config.book is not None else PresetFilesWatch(
            [*([paths.user_presets_file()] if config.include_user_presets else []), *config.preset_files])

    # -- start-up -------------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        return self.main

    def main_mounted(self) -> None:
        """Called by the main screen once its widgets exist."""
        self._main_ready = True
        self.main.set_presets(self.book, self.active_preset)
        early, self._early = self._early, []
        for message in early:  # what workers (or a test) posted before the widgets existed
            self._dispatch_early(message)
        self.calm_collector()
        if not self._ticking:  # once per app: the fleet mounts one dashboard after another
            self._ticking = True
            self.set_interval(1.0, self._tick)
            if self._presets_watch is not None:
                self.set_interval(PRESETS_WATCH_S, self._check_presets_files)
            self._install_signal_handlers()
        if self.mode == "replay":
            path = Path(self.config.replay_path or "")
            self.log_name = path.name
            self.main.query_one("#status-bar").set_replay(str(path))
            self.sub_title = f"replay {path}"
            self._replay(path)
        elif self.mode == "attach":
            self.server = AttachedServer(self.config.attach_url or "", log_path=self.config.log_path,
                                         api_key=self.config.api_key)
            if self.config.log_path:
                self.log_name = Path(self.config.log_path).name
            else:  # nothing to tail: say so and how to give one, not "it fills in as vLLM starts"
                self.log_name = "none given (--log PATH)"
                self.main.show_no_log(self.config.attach_url or "URL")
            self._connect(self.server)
            self.server.start()
        elif self.mode == "control" and self._adopt_left_running():
            pass  # ours again: --start would launch a second server beside it
        elif self.config.start and self.active_preset:
            self.request_switch(self.active_preset, confirm=False)
        if self.config.live and self.mode != "replay":
            self._sample()
        self.main._update_log_title()

    @staticmethod
    def calm_collector() -> None:
        """Called once the first screen's widgets exist (the dashboard's or the
        fleet's): keep the cyclic collector's full passes rare and short."""
        import gc

        # Everything built so far (Textual, widgets, modules) lives as long as
        # the app: move it out of the collector's sight, so a full collection
        # under a log flood walks only what came later (80 ms -> a few ms).
        gc.freeze()
        # Textual's rendering leaves reference cycles behind (a Strip caches
        # itself), ~4,000 objects a second under a log flood. With the default
        # thresholds a full collection (40-110 ms, on the UI thread) then ran
        # every 2-3 s and a key press met one in ~2 % of cases: key p99 ~100 ms.
        # Ten times fewer full collections (every ~25 s in a flood) took the
        # p99 to ~55 ms for +9 MB RSS (bench/tui_overhead.py, docs/lab/benchmarks/tui-overhead.md).
        gen0, gen1, _ = gc.get_threshold()
        gc.set_threshold(gen0, gen1, 100)
        # Most of that garbage was strips caching themselves: no longer (strip_cycles).
        stop_strip_self_cycles()

    def _install_signal_handlers(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
            loop.add_signal_handler(signal.SIGTERM, self._on_hangup)
        except (RuntimeError, NotImplementedError, ValueError):
            pass  # not the main thread (tests) or no signals here

    def _on_hangup(self) -> None:
        """The terminal went away (SSH dropped) or we were told to terminate:
        follow --on-exit without asking (ask means stop)."""
        self.hangup = True
        if self.mode == "control" and self.server is not None and self.server.status.running:
            self.exit_action = "leave" if self.config.on_exit == "leave" else "stop"
        if self.finisher is not None:
            # With the terminal gone, Textual's shutdown can block for ever
            # writing to it (seen: WriterThread.stop waiting on a full queue).
            # Finish our business (stop or detach the server) in a thread,
            # then leave, whatever the UI is doing.
            import threading

            threading.Thread(target=self._finish_and_leave, name="hangup", daemon=True).start()
        self.exit(0)

    def _finish_and_leave(self) -> None:
        import os
        import time

        time.sleep(1.0)  # a normal exit gets its chance first
        try:
            self.finisher(self)
        finally:
            os._exit(0)

    def _adopt_left_running(self) -> bool:
        """A server `q` -> leave left running (server.json) is taken back:
        shown as ours with its log, and x, r and the preset keys stop or
        restart it (issue #18, 2). A stale record is cleared on the way."""
        if not self.config.adopt:
            return False
        info = find_detached()
        if info is None:
            return False
        try:
            server = EngineServer.adopt(info)
        except (ValueError, TypeError, KeyError, OSError) as exc:
            self.notify(f"cannot take back the server left running: {exc}", severity="error", timeout=8)
            return False
        name = info.get("preset")
        self.server = server
        self._connect(server)
        server.watch()
        if name and name in self.book:
            self.active_preset = name
            self.main.set_presets(self.book, name)
        self.notify(f"took back {name or 'the server'} you left running at {server.status.url} "
                    f"(pid {server.status.pid}): x stops it, r restarts it", timeout=8)
        return True

    # -- wiring a server ----------------------------------------------------------------
    def _connect(self, server) -> None:
        self.bridge = ServerBridge(self.post_message, server)
        if self.config.live or self.mode == "replay":
            self._report_pump(self.bridge)

    @work(thread=True, group="report", exit_on_error=False)
    def _report_pump(self, bridge) -> None:
        worker = get_current_worker()
        report_loop(self.post_message, bridge, lambda: worker.is_cancelled, self.config.report_interval)

    @work(thread=True, group="sampler", exit_on_error=False)
    def _sample(self) -> None:
        worker = get_current_worker()
        sampler = Sampler(self.post_message, lambda: self.server, self.clock, self.config.sample_interval,
                          self.config.resource_factory, self.config.metrics_factory, self.config.api_key,
                          latest=self.latest_scrape, traffic=self.traffic,
                          traffic_interval=self.config.traffic_interval)
        sampler.run(lambda: worker.is_cancelled)

    def _replay(self, path: Path) -> None:
        """A replayed log is read by the same monitor as a live one, without a process."""
        self.server = LogReplay(path)
        self._connect(self.server)
        try:
            self.server.start()
        except OSError as exc:
            self.post_message(ControlResult("replay", False, f"cannot read {path}: {exc.strerror or exc}"))

    def load_earlier(self, line_no: int) -> None:
        """The log pane scrolled up to its first line: read the lines before it."""
        server, run = self.server, self._log_run
        if server is None or not hasattr(server, "read_earlier") or getattr(self, "_earlier_busy", False):
            return
        self._earlier_busy = True
        self._read_earlier(server, run, line_no)

    @work(thread=True, group="earlier", exit_on_error=False)
    def _read_earlier(self, server, run, line_no: int) -> None:
        try:
            read_earlier(self.post_message, server, run, line_no)
        except OSError:
            self.post_message(LogEarlier([], run=run, first_line_no=line_no))

    @on(LogEarlier)
    def _log_earlier(self, message: LogEarlier) -> None:
        self._earlier_busy = False
        if self._shutting_down or not self._main_ready or message.run != self._log_run:
            return
        self.main.log_view.prepend(message.lines, message.first_line_no)

    # -- messages from workers ------------------------------------------------------------
    @property
    def _shutting_down(self) -> bool:
        return tearing_down(self.main)

    def _too_early(self, message) -> bool:
        """Keep messages that arrive before the main screen is composed; drop
        those that arrive once shutdown has begun (Textual prunes the screen's
        widgets while the app still dispatches queued worker messages)."""
        if self._shutting_down:
            return True
        if self._main_ready:
            return False
        self._early.append(message)
        return True

    def _dispatch_early(self, message) -> None:
        handler = {StatusUpdate: self._status, LogBatch: self._log, ReportUpdate: self._report,
                   SeriesUpdate: self._series}.get(type(message))
        if handler is not None:
            handler(message)

    @on(StatusUpdate)
    def _status(self, message: StatusUpdate) -> None:
        if self._too_early(message):
            return
        self.status = message.status
        self.main.show_status(message.status, self.clock())
        if message.status.state.value == "crashed":
            self._diagnose(message.status.error)
        elif message.status.state.value == "starting":
            self.main.set_fix_text(None)
            self._diagnosis = None

    @on(LogBatch)
    def _log(self, message: LogBatch) -> None:
        if self._too_early(message):
            return
        changed = message.run != self._log_run
        self._log_run = message.run
        self.main.show_log(message, changed)

    @on(ReportUpdate)
    def _report(self, message: ReportUpdate) -> None:
        if self._too_early(message):
            return
        if message.version is not None:
            seen = self._report_seen
            if seen is not None and seen[0] == message.run and seen[1] > message.version:
                return  # a late copy of an older snapshot
            self._report_seen = (message.run, message.version)
        old_platform = self.report.platform if self.report is not None else None
        self.report = message.report
        self.main.show_report(message.report)
        st = self.status
        if (st is not None and st.state.value == "crashed" and st.error is not None
                and message.report.platform != old_platform):
            self._diagnose(st.error)  # the platform decides the fix (block 16 on CUDA, 32 on CPU)

    @on(SeriesUpdate)
    def _series(self, message: SeriesUpdate) -> None:
        if self._too_early(message):
            return
        self._last_series = message
        self.main.show_series(message)

    @on(TrafficUpdate)
    def _traffic(self, message: TrafficUpdate) -> None:
        if self._shutting_down:
            return
        self.last_traffic = message.state
        show = getattr(self.screen, "show_traffic", None)  # the traffic view, when it is on top
        if show is not None:
            show(message.state)

    @on(ReplayDone)
    def _replay_done(self, message: ReplayDone) -> None:
        if self._shutting_down:
            return
        report = self.report
        if report is not None and report.error is not None:
            self.main.show_replay_error(report.error)
            self._diagnose(report.error)

        word = report.state if report is not None else "starting"
        state = {"failed": ServerState.CRASHED, "ready": ServerState.READY}.get(word, ServerState.STOPPED)
        # A log whose last lines are a shutdown reads stopped, not ready (#18, 4).
        phase = "shutdown" if word == "stopped" else report.phase if report is not None else None
        status = ServerStatus(state=state, phase=phase, preset_name=None,
                              url=(report.server_url if report is not None else None) or "",
                              pid=report.pids.get("APIServer") if report is not None else None,
                              error=report.error if report is not None else None)
        self.status = status
        self.main.query_one("#status-bar").set_status(status)
        self.main.query_one("#report").set_state(state.value)
        self.notify(f"replayed {message.lines:,} lines of {Path(message.path).name}", timeout=3)

    @on(ControlResult)
    def _control_done(self, message: ControlResult) -> None:
        if message.action in ("quit-stop",):
            self.exit(0)
            return
        if self._shutting_down:
            return
        self._busy = None
        self.main.refresh_bindings()
        if not message.ok:
            self.notify(message.detail, title=f"{message.action} failed", severity="error", timeout=8)

    @on(PresetsLoaded)
    def _presets_loaded(self, message: PresetsLoaded) -> None:
        if self._shutting_down:
            return
        if message.error:
            self.notify(message.error, title="presets not reloaded", severity="error", timeout=10)
            return
        known = set(self.book.names())
        self.book = message.book
        self.main.set_presets(self.book)
        keys = self.main.preset_names
        new = [f"{n} (key {keys.index(n) + 1})" if keys.index(n) < 9 else f"{n} (presets panel: arrows, Enter)"
               for n in keys if n not in known]
        self.notify(f"presets reloaded: {len(self.book)} presets" + (f"; new: {', '.join(new)}" if new else ""),
                    timeout=6 if new else 3)

    def _check_presets_files(self) -> None:
        """The timer's look at the presets files (presets_watch.py): reload on a change."""
        if self._shutting_down or self._presets_watch is None or not self._presets_watch.changed():
            return
        self.reload_presets()

    def _tick(self) -> None:
        if self._shutting_down:
            return
        self.main.tick(self.clock())

    # -- control ------------------------------------------------------------------------
    def can_control(self, action: str) -> bool:
        if self.mode != "control" or self._busy:
            return False
        st = self.status or (self.server.status if self.server is not None else None)
        running = bool(st and st.running)
        if action == "start":
            return not running
        if action == "stop":
            return running
        return True

    @property
    def serving(self) -> bool:
        st = self.server.status if self.server is not None else None
        return bool(st and st.state.value in ("starting", "ready"))

    def _model_for(self, preset) -> str | None:
        """The model dir to give `preset`: its own when it names one, else the
        dashboard's --model (the demo's tiny model in `ernie-tui demo`); None
        leaves it to ERNIE_TUI_MODEL, or to a 'names no model' error."""
        return None if preset.model else self.config.model

    def _spec_for(self, name: str):
        preset = self.book.get(name)
        return preset.launch_spec(self._model_for(preset))

    def _run_control(self, action: str, fn: Callable[[], object]) -> None:
        if self._busy:
            self.notify(f"busy: {self._busy} is in progress", severity="warning", timeout=3)
            return
        self._busy = action
        self.main.refresh_bindings()
        self.run_worker(partial(self._control_thread, action, fn), thread=True, group="control",
                        exit_on_error=False, name=action)

    def _control_thread(self, action: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (ServerError, PresetError, OSError) as exc:  # all for the user to read
            self.post_message(ControlResult(action, False, str(exc) or exc.__class__.__name__))
            return
        except Exception as exc:  # noqa: BLE001  a bug: shown (type and message) and the controls freed
            log.error("%s failed", action, exc_info=exc)
            self.post_message(ControlResult(action, False, last_line(exc)))
            return
        self.post_message(ControlResult(action, True))

    def _launch(self, name: str, force: bool = False, estimate=None) -> None:
        """Launch `name`: preflight it (in the worker, well under a second),
        then restart our server with its argv. Preflight errors stop the
        launch and ask (fix / anyway / cancel); `force` skips preflight
        (`estimate`: what an earlier preflight of it found, for the report)."""
        try:
            spec = self._spec_for(name)
            preset = self.book.get(name)
        except PresetError as exc:
            self.notify(str(exc), title="cannot launch", severity="error", timeout=8)
            return
        if estimate is not None:
            self.main.set_estimate(estimate, name)
        self.active_preset = name
        if self.server is None:
            factory = self.config.server_factory or default_server_factory
            self.server = factory(spec, preset_name=name, log_path=self.config.server_log_path)
            self._connect(self.server)
        server = self.server
        current = server.status.preset_name
        label = f"start {name}" if not server.status.running else (
            f"restart {name}" if name == current else f"switch to {name}")

        def run() -> None:
            if not force:
                result = self._preflight(preset, server)
                blocked = bool(result is not None and result.errors)
                self.post_message(PreflightDone(name, result, blocked))
                if blocked:
                    return
            # restart = stop (a no-op when nothing runs) + start with this argv
            server.restart(spec, preset_name=name)

        self._run_control(label, run)

    def _preflight(self, preset, server=None):
        """Preflight `preset` (on a worker thread). None when preflight itself
        failed: that failure is shown, and the launch goes on without it."""
        try:
            # allow_dump=False: never spend a minute asking vLLM for its argument
            # list here; the cached or shipped list is used instead.
            result = run_preflight(preset, model_dir=self._model_for(preset), check_args=True, allow_dump=False)
        except Exception as exc:  # noqa: BLE001  preflight is advice: its own bug is shown, never blocks a launch
            self.post_message(Failure(f"preflight of {preset.name}", exc, after="going on without preflight"))
            return None
        st = server.status if server is not None else None
        spec = getattr(server, "spec", None)
        if st is not None and st.running and spec is not None and spec.port == preset.port:
            # The port is ours: the restart stops our server before starting this one.
            kept = [p for p in result.problems if p.kind != ErrorKind.PORT_IN_USE]
            result = replace(result, problems=kept, ok=not any(p.severity is Severity.ERROR for p in kept))
        return result

    @on(PreflightDone)
    def _preflight_done(self, message: PreflightDone) -> None:
        if self._shutting_down:
            return
        result = message.result
        if result is None:
            if message.ask:
                self._ask_to_switch(message.name)  # preflight itself failed: it is advice, ask anyway
            return
        if not message.ask:  # launching now; a switch shows it once confirmed
            self.main.set_estimate(getattr(result, "estimate", None), message.name)
        warnings = [p for p in result.problems if p.severity is Severity.WARNING]
        if warnings and not message.blocked:
            self.notify("\n".join(f"{p.kind.value}: {p.message}" for p in warnings[:3]),
                        title=f"preflight: {message.name}", severity="warning", timeout=8)
        if not message.blocked:
            if message.ask:
                self._ask_to_switch(message.name, getattr(result, "estimate", None))
            return
        preset = self.book.get(message.name) if message.name in self.book else None
        diagnosis = None
        first = result.first_error()
        if preset is not None and first is not None and first.fix:
            try:
                platform = getattr(getattr(result, "machine", None), "platform", None)
                diagnosis = diagnose_failure(first, preset, platform)
            except Exception as exc:  # noqa: BLE001  the fix is advice: its bug is shown, the dialog still opens
                show_failure(self, "diagnosis", exc)
                diagnosis = None
        fix_text = diagnosis.fix_summary if diagnosis is not None and diagnosis.fixable else None

        def chosen(choice: str | None) -> None:
            if choice == "anyway":
                self._launch(message.name, force=True, estimate=getattr(result, "estimate", None))
            elif choice == "fix" and diagnosis is not None and preset is not None:
                self._apply_fix_and_launch(preset, diagnosis)

        st = self.server.status if self.server is not None else None
        stops = f"{st.preset_name} (serving at {st.url})" if self.serving and st is not None else None
        self.push_screen(PreflightScreen(message.name, result.problems, fix_text, stops=stops), chosen)

    def request_start(self) -> None:
        if self.mode != "control":
            return
        if self.server is not None and self.server.status.running:
            self.notify("already running; r restarts it", timeout=3)
            return
        name = self.active_preset or self.main.highlighted_preset
        if name:
            self._launch(name)

    def request_stop(self) -> None:
        if self.mode != "control" or self.server is None or not self.server.status.running:
            return
        self._run_control("stop", self.server.stop)

    def request_restart(self) -> None:
        if self.mode != "control":
            return
        name = (self.server.status.preset_name if self.server is not None else None) or self.active_preset
        if name:
            self._launch(name)

    def request_switch(self, name: str, confirm: bool = True) -> None:
        """Switch to `name`. While serving, judge it first (model, preflight)
        and ask only if it can launch: a preset vLLM would refuse says why at
        once, and the running server is left alone (issue #10, 9)."""
        if self.mode != "control":
            self.notify("switching presets needs control mode", timeout=3)
            return
        if not (confirm and self.serving):
            self._launch(name)
            return
        try:
            self._spec_for(name)  # the model resolves, or we say so now
            preset = self.book.get(name)
        except PresetError as exc:
            self.notify(str(exc), title="cannot launch", severity="error", timeout=8)
            return
        server = self.server

        def check() -> None:
            result = self._preflight(preset, server)
            blocked = bool(result is not None and result.errors)
            self.post_message(PreflightDone(name, result, blocked, ask=True))

        self._run_control(f"check {name}", check)

    def _ask_to_switch(self, name: str, estimate=None) -> None:
        """Preflight passed `name`: ask before stopping what is serving."""
        st = self.server.status if self.server is not None else None
        if st is None or not self.serving:
            self._launch(name, force=True, estimate=estimate)  # it stopped meanwhile: nothing to ask
            return
        current = st.preset_name
        if name == current:
            body = f"Restart {name}? It is serving at {st.url}."
        else:
            body = f"Switch to {name}? This stops {current} (serving at {st.url}) and starts {name}."
        self.push_screen(ConfirmScreen("Restart the server?", body, yes="Switch" if name != current else "Restart"),
                         lambda ok: self._launch(name, force=True, estimate=estimate) if ok else None)

    # -- presets: edit, command line ---------------------------------------------------------
    def show_command_line(self, name: str | None) -> None:
        name = name or self.active_preset
        if not name:
            return
        try:
            spec = self._spec_for(name)
        except PresetError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.push_screen(CommandLineScreen(name, list(spec.argv), spec.display_env()))

    def _file_to_edit(self, name: str | None) -> Path:
        preset = self.book.get(name) if name else None
        if preset is not None and preset.source not in ("built-in", "") and Path(preset.source).is_file():
            return Path(preset.source)
        target = paths.user_presets_file()
        if preset is not None:
            _ensure_preset_copy(target, preset)
        return target

    def request_edit(self, name: str | None) -> None:
        if self.mode != "control":
            return
        try:
            path = self._file_to_edit(name or self.active_preset)
        except (OSError, PresetError) as exc:
            self.notify(f"cannot prepare the presets file: {exc}", severity="error", timeout=8)
            return
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        argv = [*shlex.split(editor), str(path)]
        try:
            try:
                with self.suspend():
                    code = subprocess.run(argv, check=False).returncode
            except SuspendNotSupported:
                code = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL).returncode
        except OSError as exc:
            self.notify(f"cannot run {argv[0]}: {exc.strerror or exc}", severity="error", timeout=8)
            return
        if code != 0:
            self.notify(f"{argv[0]} exited with {code}; reloading anyway", severity="warning", timeout=4)
        self.reload_presets()

    def reload_presets(self) -> None:
        if self._presets_watch is not None:
            self._presets_watch.sync()  # before reading: a write after it is seen next time
        try:
            book = load_presets(self.config.preset_files, include_user=self.config.include_user_presets)
        except PresetError as exc:
            self.post_message(PresetsLoaded(self.book, error=str(exc)))
            return
        self.post_message(PresetsLoaded(book))

    # -- diagnosis and fix (issue 5) -------------------------------------------------------------
    def _diagnose(self, error) -> None:
        """Diagnose a crash (or a replayed failure) and offer the fix (issue 5)."""
        self._diagnosis = None
        if error is None or self.mode == "attach":
            return
        preset = None
        name = self.status.preset_name if self.status is not None else None
        if self.mode == "control" and name and name in self.book:
            preset = self.book.get(name)
        elif self.mode == "replay" and self.report is not None:
            preset = _preset_from_report(self.report)
        platform = self.report.platform if self.report is not None else None
        try:
            diagnosis = diagnose_failure(error, preset, platform)
        except Exception as exc:  # noqa: BLE001  the fix is advice: its bug is shown, the dashboard runs on
            show_failure(self, "diagnosis", exc)
            return
        self._diagnosis = (diagnosis, preset)
        fixable = bool(getattr(diagnosis, "fixable", False)) and preset is not None
        self.main.set_fix_text(diagnosis.fix_summary or None, fixable=fixable,
                               title=getattr(diagnosis, "title", None))

    def request_fix(self) -> None:
        if self.mode != "control":
            return
        pair = getattr(self, "_diagnosis", None)
        if not pair or pair[1] is None or not getattr(pair[0], "fixable", False):
            self.notify("no automatic fix for this error: see the crash panel", timeout=4)
            return
        diagnosis, preset = pair
        self._apply_fix_and_launch(preset, diagnosis)

    def _apply_fix_and_launch(self, preset, diagnosis) -> None:
        """Save the fix as NAME-fixed in the user's presets file (atomically,
        presets/store.py) and launch it."""
        try:
            fixed = apply_fix(preset, diagnosis)
            save_preset(fixed)
        except (PresetError, ValueError, OSError) as exc:
            self.notify(f"cannot apply the fix: {exc}", severity="error", timeout=8)
            return
        self.reload_presets_now()
        self.notify(f"saved {fixed.name} ({diagnosis.fix_summary}); launching it", timeout=4)
        self._launch(fixed.name)

    def reload_presets_now(self) -> None:
        if self._presets_watch is not None:
            self._presets_watch.sync()
        try:
            self.book = load_presets(self.config.preset_files, include_user=self.config.include_user_presets)
        except PresetError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.main.set_presets(self.book)

    # -- other screens ------------------------------------------------------------------------------
    def open_help(self) -> None:
        if not self.is_screen_installed("help"):
            self.install_screen(HelpScreen(), "help")
        self.push_screen("help")

    def open_probe(self, capacity: bool = False) -> None:
        """The probe pane; `capacity`: on its capacity search (`k`)."""
        url = self.status.url if self.status is not None else None
        if self.mode == "replay" or not url:
            self.notify("the probe needs a running server", timeout=3)
            return
        from ernie_tui.tui.screens.probe import ProbeScreen  # lazy: it and httpx cost ~50 ms of start-up

        preset = None
        name = self.status.preset_name if self.status is not None else None
        if self.mode == "control" and name and name in self.book:
            preset = self.book.get(name)
        server = self.server
        self.push_screen(ProbeScreen(url, api_key=self.config.api_key,
                                     engine_pids=(lambda: list(server.engine_pids())) if server is not None else None,
                                     preset=preset, engine_report=self.report, memory=self.probe_memory,
                                     capacity=capacity))

    def open_traffic(self) -> None:
        """The traffic view (`T`) of the server watched."""
        if self.mode == "replay":
            self.notify("a replayed log has no /metrics: `ernie-tui traffic capture --log` reads its request "
                        "lines", timeout=5)
            return
        from ernie_tui.tui.screens.traffic import TrafficScreen  # lazy: as the probe screen

        url = self.status.url if self.status is not None else self.config.attach_url
        self.push_screen(TrafficScreen(self.last_traffic or TrafficState(url=url or None), url=url or None,
                                       watch=self.traffic))

    def open_sweep(self) -> None:
        if self.mode != "control":
            self.notify("the sweep starts its own servers: control mode only", timeout=3)
            return
        from ernie_tui.tui.screens.sweep import SweepScreen  # lazy: as the probe screen, ~30 ms of start-up

        self.push_screen(SweepScreen(self.book, model=self.config.model, api_key=self.config.api_key,
                                     is_serving=lambda: self.serving))

    # -- quitting -----------------------------------------------------------------------------------
    def action_quit(self) -> None:  # ctrl+q and the command palette's Quit
        self.request_quit()

    def request_quit(self) -> None:
        running = self.mode == "control" and self.server is not None and self.server.status.running
        if not running:
            self.exit(0)
            return
        choice = self.config.on_exit
        if choice == "stop":
            self._quit_stop()
        elif choice == "leave":
            self._quit_leave()
        else:
            st = self.server.status
            self.push_screen(QuitScreen(st.preset_name, st.url, st.pid), self._quit_choice)

    def _quit_choice(self, choice: str | None) -> None:
        if choice == "stop":
            self._quit_stop()
        elif choice == "leave":
            self._quit_leave()

    def _quit_stop(self) -> None:
        server = self.server
        name = server.status.preset_name or "the server"
        self.push_screen(BusyScreen(f"Stopping {name}…"))
        self._busy = None
        self.exit_action = "stop"  # if the stop fails, run_dashboard tries again

        def stop() -> None:
            server.stop()

        self._run_control("quit-stop", stop)

    def _quit_leave(self) -> None:
        try:
            self.detach_record = self.server.detach()
        except OSError as exc:
            self.notify(f"cannot detach: {exc}", severity="error", timeout=8)
            return
        self.exit_action = "leave"
        self.exit(0)

    # -- command palette --------------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self.mode != "control":
            return
        yield SystemCommand("Start server", "Start the active preset (s)", self.request_start)
        yield SystemCommand("Stop server", "Stop the server and every engine process (x)", self.request_stop)
        yield SystemCommand("Restart server", "Stop, then start the active preset (r)", self.request_restart)
        # The presets panel's order (--presets files, built-ins, your file:
        # PresetBook.key_order) is what the 1-9 keys follow; the book's own
        # order would name wrong keys.
        for i, name in enumerate(self.main.preset_names or self.book.names()):
            key = f" ({i + 1})" if i < 9 else ""
            yield SystemCommand(f"Switch preset: {name}", f"Restart the server with {name}{key}",
                                partial(self.request_switch, name))
        yield SystemCommand("Probe", "Send one prompt, a load burst or a capacity search to the server (p)",
                            self.open_probe)
        yield SystemCommand("Capacity search", "The highest load whose requests meet an SLO (k)",
                            lambda: self.open_probe(capacity=True))
        yield SystemCommand("Sweep", "Measure several presets: a burst each in turn, or capacity searches, paired (w)",
                            self.open_sweep)
        yield SystemCommand("Traffic", "The server's lengths, arrivals and prefix hits from /metrics, and the "
                            "profile so far beside the default load (T)", self.open_traffic)
        yield SystemCommand("Help", "Keys and what each figure means (?)", self.open_help)


_NOT_ENGINE_ARGS = {"host", "port", "model", "served_model_name", "api_key"}


def _preset_from_report(report):
    """The preset a replayed log was started with, as far as its args tell."""
    args = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v)
            for k, v in (report.non_default_args or {}).items() if k not in _NOT_ENGINE_ARGS}
    port = report.non_default_args.get("port") if report.non_default_args else None
    return Preset(name="replayed", engine_args=args, model=report.model,
                  port=port if isinstance(port, int) else 8000, source="log")


def _ensure_preset_copy(target: Path, preset) -> None:
    """Make sure the user file has a table for `preset`, so that editing it
    overrides the built-in (presets/store.py: the one write path)."""
    try:
        ensure_preset(preset, target, note=f"copied from the {preset.source} preset {preset.name!r}; edit and save")
    except PresetError:
        pass  # a file that does not parse: the editor is where the user fixes it


def make_app(
    *,
    mode: str = "control",
    preset: str | None = None,
    preset_files: Iterable[str] = (),
    book: PresetBook | None = None,
    model: str | None = None,
    attach_url: str | None = None,
    log_path: str | None = None,
    replay_path: str | None = None,
    start: bool = False,
    on_exit: str = "ask",
    server_factory: ServerFactory | None = None,
    clock: Callable[[], float] = time.time,
    sample_interval: float = 1.0,
    live: bool = True,
    include_user_presets: bool = True,
    resource_factory: Callable | None = None,
    metrics_factory: Callable | None = None,
    api_key: str | None = None,
    server_log_path: str | None = None,
    adopt: bool = True,
    traffic_interval: float = 5.0,
) -> ErnieApp:
    """Build the dashboard. The CLI passes its arguments; tests inject a
    server factory, a frozen clock, or `live=False` to feed data themselves."""
    if mode not in ("control", "attach", "replay"):
        raise ValueError(f"unknown mode {mode!r}")
    config = DashboardConfig(
        mode=mode, preset=preset, preset_files=list(preset_files), include_user_presets=include_user_presets,
        book=book, model=model, attach_url=attach_url, log_path=log_path, replay_path=replay_path,
        start=start, on_exit=on_exit, server_factory=server_factory, clock=clock,
        sample_interval=sample_interval, live=live, resource_factory=resource_factory,
        metrics_factory=metrics_factory, api_key=api_key, server_log_path=server_log_path,
        adopt=adopt, traffic_interval=traffic_interval,
    )
    return ErnieApp(config)
