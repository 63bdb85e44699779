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


class _Signals:
    """The ending signals caught so far, in order. The handler only records:
    an exception raised from a signal handler lands wherever the main thread
    happens to be, and inside threading's own lock code (Event.wait) it left
    a Condition's lock released twice: "RuntimeError: release unlocked lock"
    instead of a wind-down, and the search's levels were lost (seen on an
    H200 when a deadline's SIGTERM cut a capacity search)."""

    def __init__(self) -> None:
        self.caught: list[int] = []

    def __call__(self, signum: int, _frame: Any) -> None:
        self.caught.append(signum)  # list.append takes no lock a handler could meet half-held


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

    signals = _Signals()
    ending = list(ENDING_SIGNALS)
    # Ctrl-C too, unless SIGINT is ignored (a job started in the background):
    # Python's own SIGINT handler raises KeyboardInterrupt, with the hazard above.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        ending.append(signal.SIGINT)
    previous = _install({sig: signals for sig in ending})
    try:
        # Started once the handlers are in: a signal from its first instant on winds it down.
        threading.Thread(target=run, name=name, daemon=True).start()
        while not done.wait(0.2):
            if signals.caught:
                break
        if signals.caught and not done.is_set():
            first = signals.caught[0]
            how = "interrupted" if first == signal.SIGINT else f"ended by {signal.Signals(first).name}"
            # A second signal now kills (Ctrl-C: KeyboardInterrupt), as it
            # would have without us: a stuck wind-down can still be ended.
            _install({sig: (signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
                      for sig in ending})
            if len(signals.caught) > 1:  # a second one came before the defaults were back
                signal.raise_signal(signals.caught[1])
            _say(f"ernie-tui: {how}: {on_interrupt}")
            cancel.set()
            while not done.wait(0.2):
                pass
    finally:
        _install(previous)
    if "error" in box:
        raise box["error"]
    return box["result"]
