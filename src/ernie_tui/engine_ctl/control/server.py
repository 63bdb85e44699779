"""Process control for one vLLM server: start, watch, stop, restart, attach.

The server runs in a process group of its own, in our session (a lost SSH
terminal's SIGHUP goes to the session leader and the foreground group, never
to it, and we can signal the whole group; see EngineServer.own_session for
why not a session of its own). Its stdout+stderr go
to llm.log; the previous log is kept as llm.log.1. A monitor thread tails
the log into the server's one LogParser, polls /health at 4 Hz while
starting, and turns all of that into a state machine:

    stopped -> starting(phase) -> ready -> stopping -> stopped
                     \\-> crashed (exit code + root-cause line)

Ready is the parser's word (uvicorn serves), confirmed by /health when
/health can be trusted. After each batch that changed the report the
monitor publishes an immutable ReportSnapshot (`snapshot`, with a version);
nobody else parses the log. A server we did not start (AttachedServer) and a
captured log (LogReplay) are the same monitor without a process. A log that
already holds a lot is opened by engine_ctl.logopen: its last start from
the head, the charts' window and the pane's lines from the tail, the rest
counted, not parsed, and read again only when the pane scrolls up to it.

Listeners get StatusChanged / LogLines / ReportPublished events on the
monitor thread; the TUI forwards them as messages, scripts can just call
wait_ready().
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Generator

import httpx
import psutil

from ernie_tui import paths
from ernie_tui.engine_ctl.launch import DETACHED_FILE, clear_detached, detached_port, port_is_free, read_detached
from ernie_tui.engine_ctl.logs import (
    EngineError,
    EngineReport,
    ErrorKind,
    LineIndex,
    LogParser,
    LogTailer,
    ReportSnapshot,
    Section,
    read_existing,
)
from ernie_tui.engine_ctl.tls import tls_context
from ernie_tui.presets.model import LaunchSpec

log = logging.getLogger(__name__)


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
    first_line_no: int | None = None  # the file's number of lines[0] (1-based)
    run: object = None  # which log they come from (each start writes a new one)


@dataclass(frozen=True)
class ReportPublished:
    """The monitor published a new report snapshot (read `watcher.snapshot`)."""

    snapshot: ReportSnapshot


@dataclass(frozen=True)
class LogRead:
    """A LogReplay has read its whole log."""

    path: Path
    lines: int


Listener = Callable[[object], None]

# Stop escalation: vLLM shuts down cleanly on SIGINT within a few seconds; a
# wedged engine gets SIGTERM, then SIGKILL for whatever is left.
SIGINT_GRACE = 15.0
SIGTERM_GRACE = 5.0
ORPHAN_GRACE = 3.0  # a crashed server's leftovers get this long after SIGTERM
# After vLLM says it gave its start up: how long the root cause's traceback
# gets to reach the log before the teardown is cut short (a known cause; an
# unknown one waits longer for a better line).
GAVE_UP_SETTLE_S = 1.0
GAVE_UP_WAIT_S = 10.0

# After the parser says the server serves, /health gets this long to confirm
# it (when /health can be trusted) before the parser's word alone counts.
READY_CONFIRM_S = 2.0
# The monitor reads an existing log's sections for at most this long before it
# looks at its process and /health again.
OPEN_SLICE_S = 0.25


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and every descendant (APIServer, EngineCore, Worker_*)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes in process group `pgid`. The server runs in a process
    group of its own (its pid is the group id), which holds every engine process,
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


class _Adopted:
    """A left-running server's launcher as EngineServer's Popen: not our
    child, so its liveness comes from its pid (and start time), and its exit
    code is not ours to read (0 once it is gone; the log says how it ended)."""

    def __init__(self, pid: int, create_time: float | None):
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
            if create_time is not None and abs(self._proc.create_time() - create_time) > 1.0:
                self._proc = None
        except psutil.Error:
            self._proc = None

    def poll(self) -> int | None:
        if self.returncode is None and not _alive([self._proc] if self._proc is not None else []):
            self.returncode = 0
        return self.returncode


class _Watcher:
    """Shared machinery: listeners, status, the one parser fed from the log."""

    def __init__(self, url: str, log_path: Path | None, preset_name: str | None, attached: bool):
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._parser = LogParser()
        self._tailer: LogTailer | None = None
        self._status = ServerStatus(state=ServerState.STOPPED, preset_name=preset_name, url=url,
                                    log_path=log_path, attached=attached)
        self._thread: threading.Thread | None = None
        self._stop_monitor = threading.Event()
        self._http = httpx.Client(timeout=httpx.Timeout(1.0, connect=0.5), verify=tls_context())
        self._partial = ""
        self.api_key: str | None = None
        self._run = 0  # bumps with each log read from its start (a restart writes a new llm.log)
        self._version = 0
        self._snapshot = ReportSnapshot.of(self._parser.report, 0, 0)
        self._ready_seen: float | None = None  # monotonic time the parser first said "serving"
        # sections of an existing log still to read (logopen.read_existing)
        self._opening: Generator[Section, None, None] | None = None
        self._line_no = 0  # the file's number of the last line read
        self._index = LineIndex()  # where lines begin, for the pane's earlier lines
        self._index_lock = threading.Lock()
        self._read_path: Path | None = None
        self._read_ident: tuple[int, int] | None = None

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
    def snapshot(self) -> ReportSnapshot:
        """The latest published report: immutable, made once per change."""
        return self._snapshot

    @property
    def report(self) -> EngineReport:
        """The report as of the last line read (do not change it). A snapshot
        is published when the report changes; one that only counted more
        lines is brought up to date here."""
        with self._lock:
            if self._snapshot.report.lines != self._parser.report.lines:
                self._publish()
            return self._snapshot.report

    @property
    def run(self) -> object:
        return self._run

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

    def read_earlier(self, run: object, line_no: int, max_lines: int = 2000) -> tuple[list[str], int]:
        """Up to `max_lines` lines of the log just before line `line_no`, and
        the number of the first; ([], line_no) when there are none (another
        run, the file rotated away, the top of the file). Any thread."""
        with self._lock:
            path, ident = self._read_path, self._read_ident
            if run != self._run or path is None:
                return [], line_no
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return [], line_no
        try:
            st = os.fstat(fd)
            if ident is not None and (st.st_dev, st.st_ino) != ident:
                return [], line_no
            with self._index_lock:
                return self._index.read_before(fd, line_no, max_lines)
        finally:
            os.close(fd)

    # -- internals ------------------------------------------------------------
    def _emit(self, event: object) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            try:
                cb(event)
            except Exception:  # noqa: BLE001  a broken listener must not kill the monitor thread
                log.exception("server event listener failed")

    def _set_status(self, **changes: Any) -> None:
        with self._lock:
            new = replace(self._status, **changes)
            if new == self._status:
                return
            self._status = new
        self._emit(StatusChanged(new))

    def _publish(self) -> ReportSnapshot:
        """Call with the lock held."""
        self._version += 1
        self._snapshot = ReportSnapshot.of(self._parser.report, self._version, self._run)
        return self._snapshot

    def _begin_log(self, path: Path) -> None:
        """Read `path` from now on: a new run, a new parser. Its existing
        content is read in sections by the monitor, then it is followed.
        Call only while no monitor thread runs."""
        self._end_log()
        with self._lock:
            self._run += 1
            self._parser = LogParser()
            self._partial = ""
            self._ready_seen = None
            self._line_no = 0
            self._read_path, self._read_ident = path, None
            with self._index_lock:
                self._index = LineIndex()
            self._publish()
        self._opening = self._sections(path)

    def _sections(self, path: Path) -> Generator[Section, None, None]:
        """The existing log's sections (then the follower is set up)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # not written yet: all of it will be new
            self._set_tailer(LogTailer(path, from_start=True))
            return
        end = n = 0
        try:
            st = os.fstat(fd)
            with self._lock:
                self._read_ident = (st.st_dev, st.st_ino)
            reading = read_existing(fd, st.st_size, lambda: self._parser.report.ready)
            while True:
                try:
                    yield next(reading)
                except StopIteration as done:
                    end, n = done.value or (0, 0)
                    break
        finally:
            os.close(fd)
        self._line_no = n
        with self._index_lock:
            self._index.add(n + 1, end)
        self._set_tailer(LogTailer(path, offset=end))

    def _end_log(self) -> None:
        if self._opening is not None:
            self._opening.close()
            self._opening = None
        self._set_tailer(None)

    def _pump_log(self) -> bool:
        """Read what is new; True while an existing log's sections are still
        being read (the caller comes back at once instead of sleeping)."""
        if self._opening is not None:
            until = time.monotonic() + OPEN_SLICE_S
            while time.monotonic() < until:
                try:
                    section: Section = next(self._opening)
                except StopIteration:
                    self._opening = None
                    break
                self._take(section.lines, section.first_line_no, section.begin,
                           to_parser=section.to_parser, to_pane=section.to_pane)
            if self._opening is not None:
                return True
        if self._tailer is None:
            return False
        tailer = self._tailer
        begin: int | None = tailer.next_line_offset
        moved = tailer.rotations + tailer.truncations
        lines = tailer.read_new()
        if tailer.rotations + tailer.truncations != moved:
            with self._index_lock:  # another file now: earlier lines are no longer where we noted them
                self._index = LineIndex()
            with self._lock:
                self._read_ident = None
            begin = None
        partial = tailer.partial
        changed = partial != self._partial
        if not lines and not changed:
            return False
        self._partial = partial
        self._take(lines, self._line_no + 1, begin, partial=partial if changed and partial else None)
        return False

    def _take(self, lines: list[str], first: int, begin: int | None, *, to_parser: bool = True,
              to_pane: bool = True, partial: str | None = None) -> None:
        """Lines `first`.. of the log: to the parser and/or the listeners."""
        published = None
        with self._lock:
            changes = 0  # how many report changes the lines made
            if to_parser and lines:
                # The file's numbering: a skipped stretch was counted, not parsed.
                self._parser.report.lines = first - 1
                changes = self._parser.feed_many(lines)
            if partial:
                changes += self._parser.peek(partial)
            if lines:
                self._line_no = first - 1 + len(lines)
            if changes:
                published = self._publish()
            if self._ready_seen is None and self._parser.report.ready:
                self._ready_seen = time.monotonic()
        if to_pane and lines and begin is not None:
            with self._index_lock:
                self._index.add(first, begin)
        if (to_pane and lines) or partial:
            self._emit(LogLines(lines if to_pane else [], partial, first, self._run))
        if published is not None:
            self._emit(ReportPublished(published))

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
        Call from the monitor thread, or while none runs (it reads self._tailer)."""
        old, self._tailer = self._tailer, tailer
        if old is not None and old is not tailer:
            old.close()

    def close(self) -> None:
        self._stop_monitor.set()
        if self._thread and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._end_log()
        self._http.close()


class EngineServer(_Watcher):
    """A vLLM server that this tool starts and owns."""

    def __init__(self, spec: LaunchSpec, *, preset_name: str | None = None, log_path: str | Path | None = None,
                 health_interval: float = 0.25, own_session: bool = False):
        log = Path(log_path) if log_path else paths.state_dir() / "llm.log"
        super().__init__(spec.url, log, preset_name, attached=False)
        self.spec = spec
        self.health_interval = health_interval
        self._proc: subprocess.Popen | _Adopted | None = None
        self._procs_seen: dict[int, psutil.Process] = {}
        self._health_trusted = True
        self._stopping = False
        self._gave_up_at: float | None = None  # when the parser first said vLLM gave its start up
        self.adopted = False  # a server a previous dashboard left running, taken back
        # When a server taken back became ready: its record's ready_at (the
        # start's, not the moment we took it back, which would make "ready in"
        # its age); None with _ready_at_unknown for a record too old to say.
        self._adopted_ready_at: float | None = None
        self._ready_at_unknown = False
        # False (default): a process group of its own in our session; True:
        # setsid, a session of its own. Either way its pid is its group id and
        # the terminal's SIGHUP never reaches it (only the session leader and
        # the foreground group get one). A session of its own also puts it in
        # an autogroup of its own, and on a 2-core box the client's TTFT p99
        # then stood apart from vLLM's (583 ms against 59 ms; in our session
        # 93 against 96 ms: bench/autogroup.py, docs/lab/benchmarks/autogroup.md).
        self.own_session = own_session

    @classmethod
    def adopt(cls, record: dict, spec: LaunchSpec | None = None) -> EngineServer:
        """Take back the server a previous dashboard left running (its
        server.json `record`): ours again, so stop/restart work on its process
        group; its log is read as it stands (not rotated) and then followed.
        `spec` is what a restart without one relaunches (by default the
        recorded argv, without the preset's env). Call watch() to follow it
        (after adding listeners); `ernie-tui stop` only calls stop()."""
        pid = int(record["pid"])
        if spec is None:
            argv = [str(a) for a in record.get("argv") or []]
            spec = LaunchSpec(argv=argv, env={}, host=str(record.get("host") or "127.0.0.1"),
                              port=detached_port(record) or 0, model=str(record.get("model") or ""),
                              served_model_name=str(record.get("served_model_name") or ""))
        log_path = record.get("log_path") or None
        server = cls(spec, preset_name=record.get("preset"), log_path=log_path)
        create_time = record.get("create_time")
        server._proc = _Adopted(pid, float(create_time) if isinstance(create_time, (int, float)) else None)
        server.adopted = True
        ready_at = record.get("ready_at")
        if isinstance(ready_at, (int, float)):
            server._adopted_ready_at = float(ready_at)
        else:  # left before it was ready (null): it becomes ready while we watch; absent: not known
            server._ready_at_unknown = "ready_at" not in record
        server._remember_tree()
        server._set_status(url=str(record.get("url") or spec.url).rstrip("/"), state=ServerState.STARTING,
                           phase="connecting", pid=pid, started_at=record.get("started_at"))
        return server

    def watch(self) -> None:
        """Follow an adopted server: its log from the start, /health, its processes."""
        if not self.adopted or (self._thread and self._thread.is_alive()):
            return
        if self.status.log_path is not None and self.status.log_path.exists():
            self._begin_log(self.status.log_path)
        self._stop_monitor = threading.Event()
        self._thread = threading.Thread(target=self._monitor, name="engine-monitor", daemon=True)
        self._thread.start()

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
        # The log echoes prompts and the preset's env: readable by its owner only.
        with open(log, "ab", buffering=0, opener=paths.private_opener) as out:
            try:
                self._proc = subprocess.Popen(
                    self.spec.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env, close_fds=True,
                    **({"start_new_session": True} if self.own_session else {"process_group": 0}),
                )
            except OSError as exc:
                raise ServerError(f"cannot run {self.spec.argv[0]}: {exc.strerror or exc}") from None
        self._procs_seen = {}
        self.adopted = False
        self._adopted_ready_at, self._ready_at_unknown = None, False
        self._remember_tree()
        self._begin_log(log)
        self._stopping = False
        self._gave_up_at = None
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
        while self._pump_log():
            pass
        self._end_log()  # the server is gone: nothing more will be written
        clear_detached(proc.pid)  # a left-running server's record goes with it
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
        try:
            create_time: float | None = psutil.Process(st.pid).create_time()
        except psutil.Error:
            create_time = None
        spec = self.spec
        # The pid is also the process group (process_group=0 / setsid); its start
        # time tells a reused pid from ours. No env: it may hold the API key.
        return paths.write_private_text(paths.state_dir() / DETACHED_FILE, json.dumps(
            {"pid": st.pid, "pgid": st.pid, "create_time": create_time, "url": st.url, "preset": st.preset_name,
             "log_path": str(st.log_path), "started_at": st.started_at, "ready_at": st.ready_at,
             "host": spec.host, "port": spec.port,
             "model": spec.model, "served_model_name": spec.served_model_name, "argv": list(spec.argv)}))

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
            self._end_log()

    # -- monitor thread ---------------------------------------------------------
    def _remember_tree(self) -> None:
        if self._proc is None:
            return
        for p in process_tree(self._proc.pid):
            self._procs_seen.setdefault(p.pid, p)
        if self._proc.poll() is not None or self.adopted:
            # The launcher is gone: its children were re-parented away from
            # the tree, but they are still in its process group.
            for p in group_members(self._proc.pid):
                self._procs_seen.setdefault(p.pid, p)

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # process_group=0 (or setsid) made pid the group id
        except (ProcessLookupError, PermissionError):
            pass

    def _monitor(self) -> None:
        proc = self._proc
        assert proc is not None
        last_health = 0.0
        last_tree = 0.0
        while not self._stop_monitor.is_set():
            busy = self._pump_log()
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
                while self._pump_log():
                    pass
                self._pump_log()
                if self._stopping:
                    return  # stop() finishes the bookkeeping
                with self._lock:
                    report = self._parser.report
                    clean = report.shutdown_line is not None and report.error is None
                if clean and code == 0:
                    # Shut down by someone else (`ernie-tui stop`, a SIGINT): stopped, not crashed.
                    self._reap_orphans()
                    clear_detached(proc.pid)
                    self._end_log()
                    self._set_status(state=ServerState.STOPPED, phase="shutdown", exit_code=code)
                    return
                self._crashed(code)
                return
            state = self.status.state
            with self._lock:
                phase, serving, seen = self._parser.report.phase, self._parser.report.ready, self._ready_seen
            if state == ServerState.STARTING:
                self._hurry_a_failed_start(now)
                if phase and phase != self.status.phase:
                    self._set_status(phase=phase)
                healthy = False
                if self._health_trusted and (now - last_health >= self.health_interval
                                             or (serving and now - last_health >= 0.05)):
                    last_health = now
                    healthy = self._health_ok()
                # The parser says when it serves (engine_ctl.logparse: uvicorn's
                # startup complete); when /health can be trusted, it gets a
                # moment to confirm, since uvicorn prints that a moment early.
                confirmed = serving and seen is not None and (
                    not self._health_trusted or now - seen > READY_CONFIRM_S)
                if healthy or confirmed:
                    self._set_status(state=ServerState.READY, phase="ready", ready_at=self._ready_time())
            if not busy:
                time.sleep(0.1)

    def _hurry_a_failed_start(self, now: float) -> None:
        """vLLM said it gave its start up (the parser's start_failed_line).
        Once the root cause is in the log, end the teardown that follows
        (7 s here; on a busy box vLLM was once still up 240 s after its
        engine failed) so that the crash and its diagnosis come now: SIGTERM
        to the group, SIGKILL after ORPHAN_GRACE (_end_group). The exit path,
        at the monitor's next look, then reports it as any crash, with the
        parser's root cause."""
        if self._stopping or self._proc is None:
            return
        with self._lock:
            line, error = self._parser.start_failed_line, self._parser.report.error
        if line is None:
            return
        if self._gave_up_at is None:
            self._gave_up_at = now
            return
        known = error is not None and error.kind not in (ErrorKind.ENGINE_DEAD, ErrorKind.OTHER)
        if now - self._gave_up_at >= (GAVE_UP_SETTLE_S if known else GAVE_UP_WAIT_S):
            log.info("vLLM gave its start up at log line %d: ending its teardown", line)
            self._end_group(self._proc.pid, group_members(self._proc.pid))

    def _ready_time(self) -> float | None:
        """When the server became ready, for "ready in": now, for a start we
        watch; for one taken back, the time its record kept (None when an
        older record did not keep it: better no figure than its age)."""
        if self._adopted_ready_at is not None:
            return self._adopted_ready_at
        return None if self._ready_at_unknown else time.time()

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
        self._end_group(pgid, left)
        self._set_status(leftovers_ended=len(left))

    def _end_group(self, pgid: int, procs: list[psutil.Process]) -> None:
        """SIGTERM to the group, then SIGKILL (to the group and to each of
        `procs` still alive) after ORPHAN_GRACE."""
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + ORPHAN_GRACE
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(procs):
            self._signal_group(pgid, signal.SIGKILL)
            for p in _alive(procs):
                try:
                    p.kill()
                except psutil.Error:
                    pass

    def _crashed(self, code: int) -> None:
        with self._lock:
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
            self._begin_log(self.status.log_path)
        self._stop_monitor = threading.Event()
        self._set_status(state=ServerState.STARTING, phase="connecting")
        self._thread = threading.Thread(target=self._monitor, name="attach-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0) -> None:
        raise ServerError("attached to a server this tool did not start; it is never stopped from here")

    def detach(self) -> None:
        self.close()

    def engine_pids(self) -> list[int]:
        pid = self.snapshot.report.pids.get("APIServer")
        return [p.pid for p in process_tree(pid)] if pid else []

    def _monitor(self) -> None:
        last = 0.0
        while not self._stop_monitor.is_set():
            busy = self._pump_log()
            now = time.monotonic()
            if now - last >= self.poll_interval:
                last = now
                with self._lock:
                    pid = self._parser.report.pids.get("APIServer")
                    error = self._parser.report.error
                    shut = self._parser.report.shutdown_line is not None
                if self._health_ok():
                    if self.status.state != ServerState.READY:
                        self._set_status(state=ServerState.READY, phase="ready", ready_at=time.time(), pid=pid)
                elif error is not None:
                    self._set_status(state=ServerState.CRASHED, phase=None, error=error)
                else:
                    # The log's last lines say why it does not answer: shut down, or not known.
                    self._set_status(state=ServerState.STOPPED, phase="shutdown" if shut else "unreachable")
            if not busy:
                time.sleep(0.1)


class LogReplay(_Watcher):
    """A captured log, read once by the same monitor, without a process or a
    server to ask: the report, the pane's lines and a LogRead at the end."""

    def __init__(self, path: str | Path):
        super().__init__("", Path(path), None, attached=True)
        self.spec = None

    def start(self) -> None:
        if self._thread and self._thread.is_alive():
            return
        path = self.status.log_path
        assert path is not None
        with open(path, "rb"):  # OSError now, for the caller to say, rather than an empty replay
            pass
        self._begin_log(path)
        self._stop_monitor = threading.Event()
        self._thread = threading.Thread(target=self._monitor, name="replay-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0) -> None:
        raise ServerError("a replayed log has no server to stop")

    def detach(self) -> None:
        self.close()

    def engine_pids(self) -> list[int]:
        return []

    def _monitor(self) -> None:
        while not self._stop_monitor.is_set():
            if self._pump_log():
                continue
            if self._tailer is None or self._drain():
                break
        if self._stop_monitor.is_set():
            return
        with self._lock:
            final = self._publish()  # the whole log's report, its line count included
        self._emit(ReportPublished(final))
        path = self.status.log_path  # a replay always has one (set in __init__)
        assert path is not None
        self._emit(LogRead(path, self._line_no))

    def _drain(self) -> bool:
        """Read the rest after the sections; its unfinished last line is a
        line too. True once the end is reached."""
        tailer = self._tailer
        if tailer is None:  # nothing left to follow
            return True
        lines = tailer.read_new()
        if lines:
            self._take(lines, self._line_no + 1, None)
            return False
        if tailer.partial:
            self._take([tailer.partial], self._line_no + 1, None)
        self._set_tailer(None)
        return True


def find_detached(clear_stale: bool = True) -> dict | None:
    """The record a detached server left (server.json), if that server still
    runs; a stale record (its pid dead or reused) is removed."""
    return read_detached(clear_stale)


def stop_detached(preset: str | None = None, say: Callable[[str], None] | None = None) -> dict | None:
    """Stop the server a dashboard left running (`ernie-tui stop`): SIGINT to
    its process group, then SIGTERM, then SIGKILL, as the dashboard's x does;
    its record goes with it. None when no left-running server is recorded;
    ServerError when `preset` names another preset than the one running."""
    info = read_detached()
    if info is None:
        return None
    if preset is not None and info.get("preset") != preset:
        raise ServerError(f"the server left running is {info.get('preset') or 'unnamed'} "
                          f"(pid {info.get('pid')}), not {preset}")
    server = EngineServer.adopt(info)
    if say is not None:
        say(f"stopping {info.get('preset') or 'the server'} (pid {info.get('pid')}, {info.get('url')}) ...")
    try:
        server.stop()
    finally:
        server.close()
    clear_detached(int(info["pid"]))
    return info
