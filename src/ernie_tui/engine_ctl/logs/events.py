"""What LogParser.feed() returns: one typed event per thing a log line said.

Events (all carry line_no): VersionEvent, ArgsEvent, FieldEvent (a report
field got a value), PhaseEvent (phase started / finished with seconds),
ProgressEvent (tqdm bars: weights, CUDA graphs), StatsEvent, ReadyEvent,
ErrorEvent (set or replaced by a better root cause), PidEvent,
ShutdownEvent, NewRunEvent (a second server start in one log resets the
report).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ernie_tui.engine_ctl.logs.report import EngineError, StatsSample


class Event:
    """Base class of everything feed() returns. Every event has `line_no` (1-based)."""

    line_no: int | None



@dataclass(frozen=True)
class VersionEvent(Event):
    version: str
    line_no: int | None = None


@dataclass(frozen=True)
class ArgsEvent(Event):
    """The `non-default args: {...}` dict, parsed."""

    args: dict[str, Any]
    line_no: int | None = None


@dataclass(frozen=True)
class FieldEvent(Event):
    """A scalar report field got a value: `name` is the EngineReport attribute."""

    name: str
    value: Any
    line_no: int | None = None


@dataclass(frozen=True)
class PhaseEvent(Event):
    """Startup progress. done=False: `phase` is now the current phase (report.phase).
    done=True: `phase` finished; `seconds` is how long the log says it took (or None)."""

    phase: str
    seconds: float | None = None
    done: bool = False
    line_no: int | None = None


@dataclass(frozen=True)
class ProgressEvent(Event):
    """A tqdm bar line, e.g. label='Capturing CUDA graphs (FULL)', done=18, total=51."""

    label: str
    done: int
    total: int
    phase: str | None = None
    line_no: int | None = None


@dataclass(frozen=True)
class StatsEvent(Event):
    sample: StatsSample
    line_no: int | None = None


@dataclass(frozen=True)
class ReadyEvent(Event):
    url: str | None
    line_no: int | None = None


@dataclass(frozen=True)
class ErrorEvent(Event):
    """report.error was set, or replaced by a more specific root cause."""

    error: EngineError
    line_no: int | None = None


@dataclass(frozen=True)
class PidEvent(Event):
    role: str
    pid: int
    line_no: int | None = None


@dataclass(frozen=True)
class ShutdownEvent(Event):
    """The server began shutting down (SIGINT/SIGTERM or after a crash)."""

    line_no: int | None = None


@dataclass(frozen=True)
class NewRunEvent(Event):
    """A second server start in the same log: the report was reset for it."""

    line_no: int | None = None
