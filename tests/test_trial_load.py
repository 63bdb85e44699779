"""A trial's load in a child process (engine_ctl/control/trial_load.py), supervised
from the trial's thread: a load that raises, a child that cannot even start
(its target's module is gone), and one that ignores the cancel and SIGTERM
all come back as an outcome that says what happened, within seconds.

The parallel sweeps of stand-in servers in test_parallel_sweep.py prove the
rest: distinct children per trial, progress and results crossing over,
cancel, and a child killed mid-burst."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

from ernie_tui.engine_ctl.control.trial_load import LoadJob, LoadProcess, run_in_child
from ernie_tui.engine_ctl.load.burst import BurstConfig
from ernie_tui.engine_ctl.load.capacity import CapacityResult, LevelResult


def job(kind: str = "burst", **kw) -> LoadJob:
    return LoadJob(kind, "http://127.0.0.1:9", None, None, None, BurstConfig(n=1), **kw)


def stubborn(conn, cancel) -> None:
    """A child target that ignores both the cancel and SIGTERM."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.recv()
    conn.send(("progress", (0, 1)))
    while True:
        time.sleep(0.05)


def test_a_load_that_raises_in_the_child_comes_back_as_its_error(tmp_path):
    out = run_in_child(job("no-such-kind", log_path=tmp_path / "load.log"), None, threading.Event())
    assert out.result is None and out.pid not in (None, os.getpid())
    assert out.error == "the load process raised ValueError: unknown load kind 'no-such-kind'"
    assert "Traceback" in out.detail
    assert "unknown load kind" in (tmp_path / "load.log").read_text()  # the child's stderr went to its log


def test_a_child_that_cannot_import_its_target_is_reported_not_waited_for(tmp_path, monkeypatch):
    # The target's module exists when the job is handed over, and is gone
    # when the spawned child tries to import it.
    (tmp_path / "vanishing_target.py").write_text("def target(conn, cancel):\n    conn.send(('result', conn.recv()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_target

    (tmp_path / "vanishing_target.py").unlink()  # still in sys.modules here, so the job pickles
    out = run_in_child(job(), None, threading.Event(), target=vanishing_target.target)
    assert out.result is None
    assert out.error == "the load process exited with code 1 before sending its result", out.error


def test_a_child_that_ignores_cancel_and_sigterm_is_killed(tmp_path):
    cancel = threading.Event()
    seen: list[tuple] = []

    def progress(*args) -> None:
        seen.append(args)
        cancel.set()  # the child is up and loading: cancel it now

    out = run_in_child(job(), progress, cancel, target=stubborn, cancel_grace_s=0.5, kill_after_s=0.5)
    assert seen == [(0, 1)]
    assert out.error == "the load process was killed after it did not stop within 0.5 s of the cancel " \
                        "(exit code -9)", out.error


def test_the_results_cross_the_process_boundary_whole():
    level = LevelResult(concurrency=4, requests=10, ok=9, failed=1, passed=True, objectives=[{"a": 1}])
    result = CapacityResult(slo=["ttft_p99=1s"], capacity={"concurrency": 4}, levels=[level],
                            stop_reason="bracketed", stop_message="m", seconds=1.5)
    back = pickle.loads(pickle.dumps(result))
    assert back == result and back.level(4) == level



def test_an_idle_load_process_is_ready_and_exits_cleanly_when_closed():
    # What a trial whose server never became ready leaves: a child with no
    # job. close() tells it so; it exits by itself (0), not by SIGTERM (-15).
    child = LoadProcess("idle").start()
    assert child.wait_ready(30)
    assert child.close() == 0
