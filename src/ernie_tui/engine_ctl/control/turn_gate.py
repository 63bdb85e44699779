"""Turns for several capacity searches: their levels alternate, one at a time.

A paired sweep (paired_sweep.py) runs one capacity search per preset, each in
its own thread, against servers that are all up at once. The gate wraps each
search's level runner (capacity.search takes it as an argument) so that only
one level runs at a time and the presets take turns, A B A B ...: the host's
drift then meets every preset alike, and no level shares the machine with
another preset's load.

- The first level waits until every search has arrived at its first level
  (or ended): a search's set-up (tokenizer, prompts) is CPU work that, beside
  another's level in the same process, slows that level's client (on the
  drifting stand-in a first level read ITL p99 73 ms where the server's own
  histogram read 49, and the search ended at "first level failed").
- Strict rotation among the searches still running: after A's level, B's;
  A waits for B even while B's thread is between levels.
- A search that ends leaves the rotation (leave()), so the others go on
  without waiting for it.
- Cancelling (the sweep's cancel event) lets every waiting level through at
  once: the level runners see the event and return a cancelled level quickly.
- `order` records who ran, in order, for tests and the run's record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

LevelRunner = Callable[..., Any]


class TurnGate:
    def __init__(self, names: Sequence[str], cancel: threading.Event | None = None) -> None:
        self.names = list(names)
        self.active = set(self.names)
        self.cancel = cancel
        self.cond = threading.Condition()
        self.next_index = 0  # whose turn it is, as an index into names
        self.running: str | None = None
        self.arrived: set[str] = set()  # searches that have asked for a level at least once
        self.order: list[str] = []

    def _whose_turn(self) -> str | None:
        """The next active name from next_index on, in rotation."""
        n = len(self.names)
        for k in range(n):
            name = self.names[(self.next_index + k) % n]
            if name in self.active:
                return name
        return None

    def acquire(self, name: str) -> None:
        with self.cond:
            self.arrived.add(name)
            self.cond.notify_all()
            while not (self.cancel is not None and self.cancel.is_set()):
                all_here = self.active <= self.arrived
                if all_here and self.running is None and self._whose_turn() == name:
                    break
                self.cond.wait(0.2)  # the cancel event does not notify: look again now and then
            self.running = name
            self.order.append(name)

    def release(self, name: str) -> None:
        with self.cond:
            if self.running == name:
                self.running = None
            self.next_index = (self.names.index(name) + 1) % len(self.names)
            self.cond.notify_all()

    def leave(self, name: str) -> None:
        """This search has ended: the others stop waiting for it."""
        with self.cond:
            self.active.discard(name)
            self.cond.notify_all()

    def wrap(self, name: str, run_level: LevelRunner) -> LevelRunner:
        """run_level, taking its turn: the search calls run_level(load) or
        run_level(load, min_requests=N) (a confirmation)."""

        def gated(load: Any, min_requests: int | None = None) -> Any:
            self.acquire(name)
            try:
                return run_level(load) if min_requests is None else run_level(load, min_requests=min_requests)
            finally:
                self.release(name)

        return gated
