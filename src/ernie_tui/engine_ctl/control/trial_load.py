"""A sweep trial's load (its burst or its capacity search), in this process
or in a child process of its own.

Parallel sweep trials are threads of one process. Their load generators,
run in those threads, shared one interpreter and so one GIL: on two H200s
the ITL p99 of a burst beside a neighbour's burst in the same process rose
to 34-36 ms against 28-32 ms alone (docs/lab/benchmarks/parallel-sweep.md). So in a parallel
sweep each trial's load runs in a child process (LoadProcess), started
with the spawn context (the parent may be a threaded Textual app: a forked
child would inherit its locks in whatever state they were) as the trial's
server starts, so its start-up is off the load's clock. It then waits for
its LoadJob. The trial's thread hands it over and supervises it:

- start-up: the child sends ("ready",) once it has imported what a load
  needs (LoadProcess.wait_ready);
- progress: the child sends ("progress", args) for every call its load
  makes to the progress callback; the thread calls `on_progress(*args)`,
  so the sweep's events are the ones an in-process load gives;
- cancel: the thread sets the child's own Event when the sweep's is set;
  a child that has not finished `cancel_grace_s` later is terminated, then
  killed;
- the result: the child sends ("result", BurstResult | CapacityResult)
  (plain dataclasses: they pickle) or ("error", text, traceback) when its
  load raised; a child that exits without either (killed, crashed, could
  not import) gives a LoadOutcome whose `error` says how it ended.

Nothing about the tokenizer crosses: the child finds its own from the job's
model dir, as the load would in this process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

# The load district is imported with this module: in the spawned child that
# is while the trial's server starts, not on the load's clock.
from ernie_tui.engine_ctl.load import ProbeFailure, Workload, find_tokenizer, run_burst, run_capacity

log = logging.getLogger(__name__)

# After the sweep is cancelled, how long the child may take to wind its load
# down and send what it measured before it is terminated (then killed).
CANCEL_GRACE_S = 5.0
KILL_AFTER_S = 2.0


@dataclass
class LoadJob:
    """Everything a trial's load needs, picklable: no tokenizer, no server
    object, no callbacks."""

    kind: str  # "burst" | "capacity"
    url: str
    model: str | None  # the served model name
    model_dir: str | None  # where the tokenizer is found
    api_key: str | None
    burst_config: Any  # burst.BurstConfig (capacity: the built prompts' shape)
    # Capacity mode (see sweep.CapacitySweep).
    slo: list = field(default_factory=list)
    search: Any = None
    rules: Any = None
    settings: Any = None
    workload_items: list | None = None
    label: str = "load"  # the child process's name
    log_path: Path | None = None  # the child's stdout and stderr (None: inherited)


@dataclass
class LoadOutcome:
    """What came back from a load: its result, or why there is none."""

    result: Any = None  # BurstResult | CapacityResult
    pid: int | None = None  # the process that generated the load
    error: str | None = None  # set when there is no result
    detail: str | None = None  # the child's traceback, for the log


def run_load(job: LoadJob, progress: Callable[..., None] | None, cancel: threading.Event | Any,
             memory_sampler: Callable[[], float | None] | None = None) -> Any:
    """The load itself, in the calling process: a BurstResult or a
    CapacityResult. `progress` gets what the load's own callback gets:
    (done, total) for a burst, the search's event dict for a capacity search."""
    if job.kind == "burst":
        return run_burst(job.url, job.burst_config, model=job.model, model_dir=job.model_dir, api_key=job.api_key,
                         cancel=cancel, memory_sampler=memory_sampler, progress=progress)
    if job.kind == "capacity":
        # Every trial replays the same requests from the first: a fresh cursor.
        workload = Workload(list(job.workload_items), "file") if job.workload_items else None
        tokenizer = None
        if workload is None:
            try:
                tokenizer = find_tokenizer(model_dir=job.model_dir)
            except ProbeFailure:
                tokenizer = None  # the search asks the server's /tokenize instead
        return run_capacity(job.url, job.slo, search_config=job.search, rules=job.rules, settings=job.settings,
                            workload=workload, burst_config=job.burst_config, tokenizer=tokenizer,
                            model=job.model, api_key=job.api_key, progress=progress, cancel=cancel)
    raise ValueError(f"unknown load kind {job.kind!r}")


# -- the child's side ---------------------------------------------------------------

def child_main(conn: Any, cancel: Any) -> None:
    """The child process's target: wait for one LoadJob (None: no load after
    all), run it, send its events and its result (or the exception) through
    `conn`."""
    # Ctrl-C in a terminal reaches the whole process group; the parent turns
    # it into the sweep's cancel and passes that on, so the load winds down
    # and still sends what it measured instead of dying mid-burst.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _cancel_when_orphaned(cancel)
    try:
        conn.send(("ready",))
        job = conn.recv()
    except (EOFError, OSError):
        return  # the parent went away, or closed us before any load
    if job is None:
        return
    if job.log_path is not None:
        # The parent may be a Textual screen: the child's writes (a logged
        # warning, a traceback) go to the trial's load log, not over it.
        fd = os.open(job.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def progress(*args: Any) -> None:
        conn.send(("progress", args))

    try:
        result = run_load(job, progress, cancel)
        conn.send(("result", result))
    except BaseException as exc:  # noqa: BLE001  the parent gets what went wrong instead of a bare exit code
        text = f"{type(exc).__name__}: {exc}"
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        try:
            conn.send(("error", text, traceback.format_exc()))
        except OSError:
            pass  # the parent is gone
    finally:
        conn.close()


def _cancel_when_orphaned(cancel: Any) -> None:
    """A child whose parent died (killed, no chance to cancel it) stops its
    load instead of loading a server nobody measures."""
    parent = os.getppid()

    def watch() -> None:
        while not cancel.is_set():
            if os.getppid() != parent:
                cancel.set()
                return
            time.sleep(1.0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


# -- the parent's side ---------------------------------------------------------------

class LoadProcess:
    """One spawned child for one trial's load. start() it early (the sweep
    does so as the trial's server starts, so the child's start-up and
    imports cost the load nothing), run() the job once, close() it always."""

    def __init__(self, label: str = "load", target: Callable[..., None] = child_main) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._child_conn: Any = child_conn
        self._cancel = ctx.Event()
        self.proc = ctx.Process(target=target, args=(child_conn, self._cancel), name=label, daemon=True)
        self._closed = False
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def start(self) -> LoadProcess:
        self.proc.start()
        self._child_conn.close()  # the child holds the only other end now: its exit reads as EOF here
        self._child_conn = None
        return self

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Wait until the child has started and imported what a load needs
        (it says so once); False when it did not within `timeout` or died."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0 or not self._conn.poll(left):
                return False
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                return False
            self._ready = message[0] == "ready"
        return True

    def run(self, job: LoadJob, on_progress: Callable[..., None] | None, cancel: threading.Event, *,
            tick: Callable[[], None] | None = None, on_start: Callable[[int], None] | None = None,
            cancel_grace_s: float | None = None, kill_after_s: float | None = None) -> LoadOutcome:
        """Hand the child `job` and supervise it from this thread until it
        ends: forward its progress to on_progress, pass `cancel` on, call
        `tick` on every turn (at least every 0.1 s: the trial's memory
        sampling), tell `on_start` the child's pid, and return what it sent.
        Never raises for the child's trouble and never waits on a child for
        ever: the outcome's `error` says what happened."""
        from multiprocessing.connection import wait

        grace = CANCEL_GRACE_S if cancel_grace_s is None else cancel_grace_s
        kill_after = KILL_AFTER_S if kill_after_s is None else kill_after_s
        proc, conn = self.proc, self._conn
        outcome = LoadOutcome(pid=proc.pid)
        cancelled_at: float | None = None
        stopping = ""  # "terminated" or "killed" once we had to
        try:
            if on_start is not None and proc.pid is not None:
                on_start(proc.pid)
            open_pipe = True
            try:
                conn.send(job)
            except OSError:
                open_pipe = False  # it died while waiting: its exit code says how
            while True:
                if tick is not None:
                    tick()  # rate-limits itself; called on every turn so a stream of events cannot starve it
                if cancel.is_set() and cancelled_at is None:
                    cancelled_at = time.monotonic()
                    self._cancel.set()
                if cancelled_at is not None and proc.is_alive():
                    waited = time.monotonic() - cancelled_at
                    if waited > grace + kill_after:
                        stopping = "killed"
                        proc.kill()
                    elif waited > grace and not stopping:
                        stopping = "terminated"
                        proc.terminate()
                ready = wait([conn, proc.sentinel] if open_pipe else [proc.sentinel], timeout=0.1)
                if open_pipe and conn in ready:
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        open_pipe = False  # the child closed its end (done, or died)
                        continue
                    if _handle(message, outcome, on_progress):
                        break
                    continue
                if proc.sentinel in ready and not (open_pipe and conn.poll(0)):
                    break
        finally:
            exitcode = self.close()
        if outcome.result is None and outcome.error is None:
            outcome.error = _death(exitcode, stopping, grace)
        return outcome

    def close(self) -> int | None:
        """Make sure the child is gone (telling an idle one there is no load,
        then waiting a little, then terminate, then kill); its exit code."""
        proc = self.proc
        if self._closed:
            return proc.exitcode
        self._closed = True
        if proc.pid is not None:
            try:
                self._conn.send(None)  # an idle child exits at once; a busy one never reads it
            except OSError:
                pass
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self._conn.close()
        if self._child_conn is not None:
            self._child_conn.close()
        if proc.is_alive():  # still there after SIGKILL: leave it to the OS rather than hang the sweep
            log.warning("load process %s did not exit after SIGKILL", proc.pid)
        return proc.exitcode


def run_in_child(job: LoadJob, on_progress: Callable[..., None] | None, cancel: threading.Event, *,
                 target: Callable[..., None] = child_main, **run_options: Any) -> LoadOutcome:
    """Start a LoadProcess for `job`, run it, close it (see LoadProcess.run)."""
    child = LoadProcess(job.label, target)
    try:
        child.start()
    except BaseException:
        child.close()
        raise
    return child.run(job, on_progress, cancel, **run_options)


def _handle(message: tuple, outcome: LoadOutcome, on_progress: Callable[..., None] | None) -> bool:
    """One message from the child; True once it has sent its last."""
    kind = message[0]
    if kind == "ready":  # the child's start-up is done (LoadProcess.wait_ready had not read it)
        return False
    if kind == "progress":
        if on_progress is not None:
            try:
                on_progress(*message[1])
            except Exception:  # noqa: BLE001  a display callback must not end the trial; logged, not lost
                log.exception("load progress callback failed")
        return False
    if kind == "result":
        outcome.result = message[1]
    elif kind == "error":
        outcome.error = f"the load process raised {message[1]}"
        outcome.detail = message[2]
        log.warning("load process %s failed:\n%s", outcome.pid, message[2])
    return True


def _death(exitcode: int | None, stopping: str, grace: float) -> str:
    """How a child that sent no result ended, in words."""
    if stopping:
        how = f"{stopping} after it did not stop within {grace:g} s of the cancel"
        return f"the load process was {how} (exit code {exitcode})"
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the load process died of {name} (exit code {exitcode}) before sending its result"
    return f"the load process exited with code {exitcode} before sending its result"


class PeakMemory:
    """The peak of a memory sampler, polled by the supervising thread (the
    child has no handle on the engine's processes and GPUs; this process does)."""

    def __init__(self, sampler: Callable[[], float | None], interval_s: float) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.peak: float | None = None
        self._last = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        try:
            value = self.sampler()
        except (OSError, psutil.Error):  # the engine exited between two looks
            return
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)
