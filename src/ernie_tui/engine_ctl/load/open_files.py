"""Room under the process's open-file limit (`ulimit -n`) for a load's sockets.

Every request in flight holds one socket, and a socket is an open file. A
shell's soft limit is often 1,024 (its hard limit far higher): a burst or a
search level at concurrency 1,024 then runs out of files part-way, and its
requests fail as "cannot connect ... Too many open files", read as the
server's errors. A search would fail the level and answer a capacity the
server never showed. So before a load starts, the soft limit is raised
(to GENEROUS_LIMIT or the hard limit, which allows it without privileges,
as vLLM's own bench client does), and what still does not fit is said
before anything is sent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

try:
    import resource
except ImportError:  # not on this platform (Windows): no limit to read or raise
    resource = None  # type: ignore[assignment]

# Files kept free beside the load's sockets: /metrics scrapes, a log being
# tailed, the event loop's own, a launched server's pipes.
SPARE_FILES = 32
# Open files assumed in use where /proc/self/fd cannot be read.
ASSUMED_IN_USE = 64
# Once raised, the soft limit goes this far (within the hard limit), not
# just to one load's need: loads run side by side in one process (a sweep's
# parallel trials) each count the room before the other opens its sockets.
GENEROUS_LIMIT = 1 << 16


@dataclass(frozen=True)
class FileRoom:
    """How many more connections fit after make_room, and the limits behind it."""

    connections: int  # sockets this process can still open for the load
    soft: int  # the soft limit now (after raising it)
    hard: int | None  # None: unlimited
    in_use: int  # files open before the load

    def too_few(self, wanted: int) -> str:
        """Plain words for a load of `wanted` connections that does not fit."""
        hard = "unlimited" if self.hard is None else f"{self.hard:,}"
        need = wanted + self.in_use + SPARE_FILES
        return (f"{wanted:,} connections do not fit under this process's open-file limit "
                f"(ulimit -n {self.soft:,}, hard limit {hard}, {self.in_use} files already open): "
                f"at most {self.connections:,} fit; raise the limit (`ulimit -n {need}` in the shell "
                f"that starts ernie-tui, or the hard limit in /etc/security/limits.conf) or ask for less")

    def capped(self, connections: int) -> str:
        """Plain words for an open loop held to `connections` in flight."""
        return (f"at most {connections:,} requests could be in flight (the open-file limit, ulimit -n "
                f"{self.soft:,}): a send beyond that waited for a connection, and its wait is in its TTFT")


def _in_use() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return ASSUMED_IN_USE


def make_room(connections: int) -> FileRoom | None:
    """Raise the soft open-file limit so `connections` more sockets fit
    (to GENEROUS_LIMIT or the hard limit, whichever is lower; never
    lowered); the room there is now.
    None where the platform has no such limit."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = _in_use()
    need = connections + in_use + SPARE_FILES
    unlimited_hard = hard == resource.RLIM_INFINITY
    if soft != resource.RLIM_INFINITY and soft < need:
        target = max(need, GENEROUS_LIMIT) if unlimited_hard else min(max(need, GENEROUS_LIMIT), hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass  # not allowed here: the room says what fits
    if soft == resource.RLIM_INFINITY:
        return FileRoom(connections=connections, soft=soft, hard=None, in_use=in_use)
    return FileRoom(connections=max(0, soft - in_use - SPARE_FILES), soft=soft,
                    hard=None if unlimited_hard else hard, in_use=in_use)
