"""Process control for one vLLM server: start, watch, stop, restart, attach.

The server runs in its own session (so a lost SSH terminal's SIGHUP never
reaches it, and we can signal the whole process group). Its stdout+stderr go
to llm.log; the previous log is kept as llm.log.1. A monitor thread tails
the log into the LogParser, polls /health at 4 Hz while starting, and turns
all of that into a state machine:

    stopped -> starting(phase) -> ready -> stopping -> stopped
                     \\-> crashed (exit code + root-cause line)

Listeners get StatusChanged / LogLines events on the monitor thread; the TUI
forwards them as messages, scripts can just call wait_ready().
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Callable

import httpx
import psutil

from ernie_tui import paths
from ernie_tui.engine_ctl.logparse import LogParser
from ernie_tui.engine_ctl.logtail import LogTailer
from ernie_tui.engine_ctl.ports import port_is_free
from ernie_tui.engine_ctl.errors import ErrorKind
from ernie_tui.engine_ctl.report import EngineError, EngineReport
from ernie_tui.presets.model import LaunchSpec


class ServerState(str, Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    CRASHED = "crashed"


class ServerError(Exception):
    """A control request that cannot be carried out (message for humans)."""


@dataclass(frozen=True)
class ServerStatus:
    state: ServerState
    phase: str | None = None
    preset_name: str | None = None
    url: str = ""
    pid: int | None = None
    started_at: float | None = None
    ready_at: float | None = None
    exit_code: int | None = None
    error: EngineError | None = None
    log_path: Path | None = None
    attached: bool = False
    # After a crash: engine processes the dead launcher left running that we ended.
    leftovers_ended: int = 0

    @property
    def running(self) -> bool:
        return self.state in (ServerState.STARTING, ServerState.READY, ServerState.STOPPING)

    def uptime(self, now: float | None = None) -> float | None:
        if self.started_at is None or not self.running:
            return None
        return (now or time.time()) - self.started_at


@dataclass(frozen=True)
class StatusChanged:
    status: ServerStatus


@dataclass(frozen=True)
class LogLines:
    lines: list[str]
    # The line being drawn right now (a live progress bar), when it changed;
    # it comes again, complete, in `lines` once its newline is written.
    partial: str | None = None


Listener = Callable[[object], None]

# Stop escalation: vLLM shuts down cleanly on SIGINT within a few seconds; a
# wedged engine gets SIGTERM, then SIGKILL for whatever is left.
SIGINT_GRACE = 15.0
SIGTERM_GRACE = 5.0
ORPHAN_GRACE = 3.0  # a crashed server's leftovers get this long after SIGTERM

DETACHED_FILE = "server.json"

# uvicorn's line once the app is serving. The earlier "Starting vLLM server on
# http://..." line comes before the socket accepts connections, so it does
# not count as ready.
STARTUP_COMPLETE = "Application startup complete"


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and every descendant (APIServer, EngineCore, Worker_*)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes in process group `pgid`. The server runs in its own
    session (start_new_session), so its group holds every engine process,
    including a child the launcher forked just before it died: such an
    orphan is re-parented to init and no longer shows in process_tree()."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(psutil.Process(pid))
        except (OSError, psutil.Error):
            pass
    return _alive(members)  # a killed orphan stays a zombie until init reaps it


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


class _Watcher:
    """Shared machinery: listeners, status, the parser fed from a tailer."""

    def __init__(self, url: str, log_path: Path | None, preset_name: str | None, attached: bool):
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._parser = LogParser()
        self._tailer: LogTailer | None = None
        self._status = ServerStatus(state=ServerState.STOPPED, preset_name=preset_name, url=url,
                                    log_path=log_path, attached=attached)
        self._thread: threading.Thread | None = None
        self._stop_monitor = threading.Event()
        self._http = httpx.Client(timeout=httpx.Timeout(1.0, connect=0.5))
        self._partial = ""
        self.api_key: str | None = None
        self._startup_complete: float | None = None

    # -- public read side -----------------------------------------------------
    def add_listener(self, callback: Listener) -> None:
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    @property
    def status(self) -> ServerStatus:
        with self._lock:
            return self._status

    @property
    def report(self) -> EngineReport:
        """A copy of the live report, safe to read from any thread. The lists
        and dicts are copied, the stats samples and the error are shared: a
        deep copy of a day's stats under the lock would stall the monitor."""
        with self._lock:
            rep = self._parser.report
            out = copy.copy(rep)
            out.stats = list(rep.stats)
            out.phases = dict(rep.phases)
            out.pids = dict(rep.pids)
            out.non_default_args = dict(rep.non_default_args)
            return out

    @property
    def url(self) -> str:
        return self._status.url

    def wait_ready(self, timeout: float) -> ServerStatus:
        """Block until ready, crashed or stopped, or until timeout passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status
            if st.state in (ServerState.READY, ServerState.CRASHED):
                return st
            if st.state == ServerState.STOPPED and not (self._thread and self._thread.is_alive()):
                return st
            time.sleep(0.05)
        return self.status

    # -- internals ------------------------------------------------------------
    def _emit(self, event: object) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            try:
                cb(event)
            except Exception:  # a broken listener must not kill the monitor
                pass

    def _set_status(self, **changes) -> None:
        with self._lock:
            new = replace(self._status, **changes)
            if new == self._status:
                return
            self._status = new
        self._emit(StatusChanged(new))

    def _pump_log(self) -> None:
        if self._tailer is None:
            return
        lines = self._tailer.read_new()
        partial = self._tailer.partial
        changed = partial != self._partial
        if not lines and not changed:
            return
        self._partial = partial
        with self._lock:
            for line in lines:
                self._parser.feed(line)
                if STARTUP_COMPLETE in line and not self._startup_complete:
                    self._startup_complete = time.monotonic()
            if changed and partial:
                self._parser.peek(partial)
        self._emit(LogLines(lines, partial if changed and partial else None))

    def _health_ok(self) -> bool:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            return self._http.get(f"{self._status.url}/health", headers=headers).status_code == 200
        except httpx.HTTPError:
            return False

    def _set_tailer(self, tailer: LogTailer | None) -> None:
        """Install `tailer` (or none), closing the one it replaces. Every
        replacement and every end goes through here: a tailer left open keeps
        its llm.log open, and after the next two rotations that file is a
        deleted llm.log.1 whose disk space comes back only when it is closed.
        Call only while no monitor thread runs (it reads self._tailer)."""
        old, self._tailer = self._tailer, tailer
        if old is not None and old is not tailer:
            old.close()

    def close(self) -> None:
        self._stop_monitor.set()
        if self._thread and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._set_tailer(None)
        self._http.close()


class EngineServer(_Watcher):
    """A vLLM server that this tool starts and owns."""

    def __init__(self, spec: LaunchSpec, *, preset_name: str | None = None, log_path: str | Path | None = None,
                 health_interval: float = 0.25):
        log = Path(log_path) if log_path else paths.state_dir() / "llm.log"
        super().__init__(spec.url, log, preset_name, attached=False)
        self.spec = spec
        self.health_interval = health_interval
        self._proc: subprocess.Popen | None = None
        self._procs_seen: dict[int, psutil.Process] = {}
        self._health_trusted = True
        self._stopping = False

    # -- control ------------------------------------------------------------
    def start(self) -> None:
        if self.status.running:
            raise ServerError(f"server already {self.status.state.value} (pid {self.status.pid})")
        self.close_monitor()
        log = self.status.log_path
        assert log is not None
        paths.private_dir(log.parent)
        if log.exists():
            rotated = log.with_name(log.name + ".1")
            os.replace(log, rotated)
            try:
                os.chmod(rotated, paths.PRIVATE_FILE_MODE)  # one an older version wrote 0644
            except OSError:
                pass
        # If something already answers on our port, /health would report *it*
        # as ready; then only our own log's ready line counts.
        self._health_trusted = port_is_free(self.spec.host, self.spec.port)[0]
        env = {**os.environ, **self.spec.env}
        with self._lock:
            self._parser = LogParser()
            self._startup_complete = None
        # The log echoes prompts and the preset's env: readable by its owner only.
        with open(log, "ab", buffering=0, opener=paths.private_opener) as out:
            try:
                self._proc = subprocess.Popen(
                    self.spec.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                raise ServerError(f"cannot run {self.spec.argv[0]}: {exc.strerror or exc}") from None
        self._procs_seen = {}
        self._remember_tree()
        self._set_tailer(LogTailer(log, from_start=True))
        self._stopping = False
        self._stop_monitor = threading.Event()
        self._set_status(state=ServerState.STARTING, phase="launching", pid=self._proc.pid,
                         started_at=time.time(), ready_at=None, exit_code=None, error=None, leftovers_ended=0)
        self._thread = threading.Thread(target=self._monitor, name="engine-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = SIGINT_GRACE + SIGTERM_GRACE + 10) -> None:
        """Stop the whole process group; return once no engine process is left."""
        proc = self._proc
        if proc is None or self.status.state in (ServerState.STOPPED,):
            return
        self._stopping = True
        if self.status.state != ServerState.CRASHED:
            self._set_status(state=ServerState.STOPPING, phase=None)
        self._remember_tree()
        procs = list(self._procs_seen.values())
        deadline = time.monotonic() + timeout
        sigint_until = min(deadline, time.monotonic() + SIGINT_GRACE)
        for sig, until in ((signal.SIGINT, sigint_until),
                           (signal.SIGTERM, min(deadline, sigint_until + SIGTERM_GRACE)),
                           (signal.SIGKILL, deadline)):
            self._signal_group(proc.pid, sig)
            if sig == signal.SIGKILL:
                for p in _alive(procs):  # stragglers that left the group
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
            while time.monotonic() < until:
                self._remember_tree()
                procs = list(self._procs_seen.values())
                if proc.poll() is not None and not _alive(procs):
                    break
                time.sleep(0.1)
            if proc.poll() is not None and not _alive(procs):
                break
        proc.poll()
        left = _alive(list(self._procs_seen.values()))
        if left:
            raise ServerError("engine processes still alive after SIGKILL: "
                              + ", ".join(str(p.pid) for p in left))
        self._stop_monitor.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._pump_log()
        self._set_tailer(None)  # the server is gone: nothing more will be written
        final = ServerState.CRASHED if self.status.state == ServerState.CRASHED else ServerState.STOPPED
        self._set_status(state=final, phase=None, exit_code=proc.returncode)

    def restart(self, spec: LaunchSpec | None = None, preset_name: str | None = None) -> None:
        self.stop()
        if spec is not None:
            self.spec = spec
            self._set_status(url=spec.url)
        if preset_name is not None:
            self._set_status(preset_name=preset_name)
        self.start()

    def detach(self) -> Path | None:
        """Leave the server running and record where it is for --attach."""
        st = self.status
        self._stop_monitor.set()
        if not st.running or st.pid is None:
            return None
        return paths.write_private_text(paths.state_dir() / DETACHED_FILE, json.dumps(
            {"pid": st.pid, "url": st.url, "preset": st.preset_name, "log_path": str(st.log_path),
             "started_at": st.started_at}))

    def engine_pids(self) -> list[int]:
        if self._proc is None or self._proc.poll() is not None:
            return [p.pid for p in _alive(list(self._procs_seen.values()))]
        return [p.pid for p in process_tree(self._proc.pid)]

    def close_monitor(self) -> None:
        """End the monitor thread and, with it, the tailer it read from."""
        self._stop_monitor.set()
        if self._thread and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if not (self._thread and self._thread.is_alive()):
            self._set_tailer(None)

    # -- monitor thread ---------------------------------------------------------
    def _remember_tree(self) -> None:
        if self._proc is None:
            return
        for p in process_tree(self._proc.pid):
            self._procs_seen.setdefault(p.pid, p)
        if self._proc.poll() is not None:
            # The launcher is gone: its children were re-parented away from
            # the tree, but they are still in its process group.
            for p in group_members(self._proc.pid):
                self._procs_seen.setdefault(p.pid, p)

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # start_new_session made pid the group id
        except (ProcessLookupError, PermissionError):
            pass

    def _monitor(self) -> None:
        proc = self._proc
        assert proc is not None
        last_health = 0.0
        last_tree = 0.0
        while not self._stop_monitor.is_set():
            self._pump_log()
            now = time.monotonic()
            # The tree grows while vLLM starts (EngineCore, workers) and then
            # holds still; psutil walks all of /proc to find it, so look
            # every second while starting and every 5 s once serving.
            if now - last_tree > (5.0 if self._status.state == ServerState.READY else 1.0):
                self._remember_tree()
                last_tree = now
            code = proc.poll()
            if code is not None:
                time.sleep(0.2)  # let the last lines reach the file
                self._pump_log()
                if self._stopping:
                    return  # stop() finishes the bookkeeping
                self._crashed(code)
                return
            state = self.status.state
            report = self._parser.report
            if state == ServerState.STARTING:
                if report.phase and report.phase != self.status.phase:
                    self._set_status(phase=report.phase)
                healthy = False
                if self._health_trusted and (now - last_health >= self.health_interval
                                             or (self._startup_complete and now - last_health >= 0.05)):
                    last_health = now
                    healthy = self._health_ok()
                # uvicorn prints the line a moment before it serves; when
                # /health can be trusted, give it that moment to confirm.
                complete = self._startup_complete is not None and (
                    not self._health_trusted or now - self._startup_complete > 2.0)
                if healthy or complete:
                    self._set_status(state=ServerState.READY, phase="ready", ready_at=time.time())
            time.sleep(0.1)

    def _reap_orphans(self) -> None:
        """After the launcher died on its own, end what it left behind in its
        process group (an EngineCore that outlives its APIServer keeps its
        memory and serves nobody): SIGTERM, then SIGKILL after ORPHAN_GRACE."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        left = group_members(pgid)
        if not left:
            return
        for p in left:
            self._procs_seen.setdefault(p.pid, p)
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + ORPHAN_GRACE
        while _alive(left) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(left):
            self._signal_group(pgid, signal.SIGKILL)
            for p in _alive(left):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        self._set_status(leftovers_ended=len(left))

    def _crashed(self, code: int) -> None:
        error = self._parser.report.error
        if error is None:
            last = ""
            log = self.status.log_path
            if log and log.exists():
                tail = log.read_bytes()[-4096:].decode("utf-8", "replace").strip().splitlines()
                last = tail[-1] if tail else ""
            error = EngineError(kind=ErrorKind.ENGINE_DEAD,
                                message=f"server exited with code {code}" + (f": {last}" if last else ""))
        self._set_status(state=ServerState.CRASHED, phase=None, exit_code=code, error=error)
        # Report the crash first, then clean up (the grace can take seconds).
        self._reap_orphans()


class AttachedServer(_Watcher):
    """A server this tool did not start: watched, never stopped."""

    def __init__(self, url: str, log_path: str | Path | None = None, api_key: str | None = None,
                 poll_interval: float = 1.0):
        super().__init__(url.rstrip("/"), Path(log_path) if log_path else None, None, attached=True)
        self.api_key = api_key
        self.poll_interval = poll_interval
        self.spec = None

    def start(self) -> None:
        """Begin watching (not launching)."""
        if self._thread and self._thread.is_alive():
            return
        if self.status.log_path is not None:
            self._set_tailer(LogTailer(self.status.log_path, from_start=True))
        self._stop_monitor = threading.Event()
        self._set_status(state=ServerState.STARTING, phase="connecting")
        self._thread = threading.Thread(target=self._monitor, name="attach-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0) -> None:
        raise ServerError("attached to a server this tool did not start; it is never stopped from here")

    def detach(self) -> None:
        self.close()

    def engine_pids(self) -> list[int]:
        pid = self._parser.report.pids.get("APIServer")
        return [p.pid for p in process_tree(pid)] if pid else []

    def _monitor(self) -> None:
        last = 0.0
        while not self._stop_monitor.is_set():
            self._pump_log()
            now = time.monotonic()
            if now - last >= self.poll_interval:
                last = now
                pid = self._parser.report.pids.get("APIServer")
                if self._health_ok():
                    if self.status.state != ServerState.READY:
                        self._set_status(state=ServerState.READY, phase="ready", ready_at=time.time(), pid=pid)
                elif self._parser.report.error is not None:
                    self._set_status(state=ServerState.CRASHED, phase=None, error=self._parser.report.error)
                else:
                    self._set_status(state=ServerState.STOPPED, phase="unreachable")
            time.sleep(0.1)


def find_detached() -> dict | None:
    """The record a detached server left, if that server still runs."""
    record = paths.state_dir() / DETACHED_FILE
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not psutil.pid_exists(int(info.get("pid", -1))):
        return None
    return info
