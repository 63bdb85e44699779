"""Guarding worker messages against a screen that is being torn down.

A worker thread can post a message just before its screen is popped or the
app exits. Textual removes the screen's widgets first and keeps dispatching
the screen's (and the app's) queued messages meanwhile, so a handler that
queries a widget raises NoMatches. Handlers of worker messages check
`tearing_down` first and drop such late messages: there is nothing left to
show them on, and whatever the worker produced is already saved by the worker.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def tearing_down(node) -> bool:
    """True once `node` (a Screen or the App's main screen) is being pruned,
    closed, or the app has begun shutting down."""
    # `_pruning`, `_closing` and `_closed` are Textual's own lifecycle flags
    # (set synchronously when removal starts); there is no public equivalent.
    try:
        app = node.app
    except RuntimeError:  # NoActiveAppError (a RuntimeError): no app runs this node any more
        return True
    if not app.is_running:
        return True
    return bool(getattr(node, "_pruning", False) or getattr(node, "_closing", False)
                or getattr(node, "_closed", False))


def drop_when_torn_down(handler: F) -> F:
    """Decorate a screen's handler of a worker message: skip it when the
    screen is going away."""

    @functools.wraps(handler)
    def wrapper(self, *args, **kwargs):
        if tearing_down(self):
            return None
        return handler(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
