"""Long measurements (a capacity search, a sweep) run in a worker thread so
that Ctrl-C on the main thread can end them cleanly: it sets the cancel
event, says what happens now, and waits while the running step winds down
and keeps what was measured.

SIGTERM and SIGHUP end them the same way. They are how a measurement is
usually ended when nobody is at the keyboard: `timeout`, a job runner, a
closed SSH session. Their default action kills the process at once, which
loses every level a search measured and leaves a sweep's vLLM server running
in its own session. A second signal during the wind-down gets the default
action back: a stuck wind-down can still be killed."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# Signals that end a long measurement as Ctrl-C does.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Ended(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised on the main thread like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _raise_ended(signum: int, _frame: Any) -> None:
    raise _Ended(signum)


def _install(handlers: dict[int, Any]) -> dict[int, Any]:
    """Set each signal's handler; the ones replaced. Off the main thread
    (a test calling in from a worker) signals cannot be handled: none set."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, h) for sig, h in handlers.items()}


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # after SIGHUP the terminal may be gone; the work still winds down
        pass


def run_interruptible(work: Callable[[], T], cancel: threading.Event, *, name: str, on_interrupt: str) -> T:
    """`work()`'s result; its exception is raised here, on the main thread."""
    box: dict = {}
    # Waited on instead of Thread.join: a join cut short by a signal's
    # exception can leave the thread reading as ended while it still runs.
    done = threading.Event()

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001  re-raised on the main thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    previous = _install({sig: _raise_ended for sig in ENDING_SIGNALS})
    try:
        try:
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt as exc:
            how = f"ended by {exc.args[0]}" if isinstance(exc, _Ended) else "interrupted"
            # A second SIGTERM/SIGHUP now kills, as it would have without us.
            _install({sig: signal.SIG_DFL for sig in ENDING_SIGNALS})
            _say(f"ernie-tui: {how}: {on_interrupt}")
            cancel.set()
            while not done.wait(0.2):
                pass
    finally:
        _install(previous)
    if "error" in box:
        raise box["error"]
    return box["result"]
