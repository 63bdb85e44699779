"""Long measurements (a capacity search, a sweep) run in a worker thread so
that Ctrl-C on the main thread can end them cleanly: it sets the cancel
event, says what happens now, and waits while the running step winds down
and keeps what was measured."""

from __future__ import annotations

import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run_interruptible(work: Callable[[], T], cancel: threading.Event, *, name: str, on_interrupt: str) -> T:
    """`work()`'s result; its exception is raised here, on the main thread."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001  re-raised on the main thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        print(f"ernie-tui: interrupted: {on_interrupt}", file=sys.stderr)
        cancel.set()
        worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
