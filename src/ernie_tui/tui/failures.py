"""The one place where a failure inside the dashboard reaches the user.

Every worker runs with ``exit_on_error=False`` (one broken chart sampler must
not close the dashboard over a live server), so Textual keeps a worker's
exception to itself. Nodes that start workers mix in `ShowsWorkerFailures`:
its handler sends each failed worker's exception to `show_failure`, which
puts the exception's last traceback line in an error notification and the
whole traceback in the log. A worker thread that catches an error it can
carry on from (preflight is advice) posts `Failure` instead, which ends up in
the same place.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass

from textual.app import App
from textual.message import Message
from textual.worker import Worker, WorkerState

log = logging.getLogger("ernie_tui.tui")


def last_line(exc: BaseException) -> str:
    """The traceback's last line: `ValueError: bad block size`."""
    return traceback.format_exception_only(exc)[-1].strip()


def show_failure(app: App, what: str, exc: BaseException, *, after: str = "") -> None:
    """Show `what` failed with `exc` (its last line, then `after`), and log the traceback."""
    log.error("%s failed", what, exc_info=exc)
    text = last_line(exc) + (f"\n{after}" if after else "")
    app.notify(text, title=f"{what} failed", severity="error", timeout=12)


@dataclass
class Failure(Message):
    """A worker thread caught `error` and carried on; the app shows it."""

    what: str
    error: BaseException
    after: str = ""  # what happened instead, e.g. "launching without preflight"


def _worker_label(worker: Worker) -> str:
    return worker.name or worker.group or "a background task"


class ShowsWorkerFailures:
    """Mixed into the apps, screens and widgets that start workers."""

    # Plain handler names (no @on): Textual finds them along the MRO.
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state is WorkerState.ERROR and worker.error is not None:
            show_failure(worker.node.app, _worker_label(worker), worker.error)

    def on_failure(self, message: Failure) -> None:
        app = getattr(self, "app", None)
        if isinstance(app, App):
            show_failure(app, message.what, message.error, after=message.after)
