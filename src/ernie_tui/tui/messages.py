"""Messages from workers (and the engine's monitor thread) to the UI.

Workers never touch widgets: they post one of these dataclass Messages to the
app, and handlers on the UI thread update the widgets. Messages that can
arrive fast (log batches, chart snapshots, report snapshots, status) say so
with ``can_replace``: when the UI is behind and the next queued message is of
the same kind, Textual drops the older one. For snapshots that is exactly
right (the newest snapshot is the truth); a log batch instead hands its lines
forward to the batch that replaces it, so a flood of 5,000 lines/s collapses
into a few large batches without losing lines (up to MAX_BATCH_LINES, the
most the log pane keeps anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:
    from ernie_tui.engine_ctl.control import RaySnapshot, ServerStatus, SweepRun
    from ernie_tui.engine_ctl.load import BurstResult, CapacityResult, LevelResult, ProbeResult, ServedModel
    from ernie_tui.engine_ctl.logs import EngineReport
    from ernie_tui.presets import PresetBook
    from ernie_tui.tui.series import ChartPoint
    from ernie_tui.tui.traffic_watch import TrafficState

# The log pane keeps this many lines; a merged batch never needs more.
MAX_BATCH_LINES = 20_000


@dataclass
class StatusUpdate(Message):
    """The server's state changed (latest wins)."""

    status: "ServerStatus"

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatusUpdate)


@dataclass
class LogBatch(Message):
    """New log lines. `run` identifies the log they belong to (a restart
    starts a new llm.log, and the pane clears when `run` changes)."""

    lines: list[str]
    run: object = None
    first_line_no: int | None = None  # 1-based number of lines[0] in its log, when known
    dropped: int = 0  # lines skipped because a merged batch exceeded MAX_BATCH_LINES

    def can_replace(self, message: Message) -> bool:
        if not isinstance(message, LogBatch):
            return False
        if message.run == self.run:
            # Hand our lines forward: the newer batch now carries both.
            merged = self.lines + message.lines
            extra = len(merged) - MAX_BATCH_LINES
            message.dropped += self.dropped
            if extra > 0:
                merged = merged[extra:]
                message.dropped += extra
            message.first_line_no = self.first_line_no
            message.lines = merged
        return True


@dataclass
class ReportUpdate(Message):
    """A snapshot of the parsed startup report (latest wins)."""

    report: "EngineReport"
    run: object = None
    version: int | None = None  # the watcher's snapshot version (newer wins over a late older one)

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ReportUpdate)


@dataclass
class LogEarlier(Message):
    """Lines before the log pane's first line, read on demand (it scrolled
    up to its top); `first_line_no` is the file's number of lines[0]."""

    lines: list[str]
    run: object = None
    first_line_no: int = 1


@dataclass
class SeriesUpdate(Message):
    """A snapshot of the chart series (latest wins). The points live in the
    sampler; widgets only draw the snapshot they are given."""

    points: tuple["ChartPoint", ...]
    memory_label: str = ""
    memory_source: str = ""  # "nvml" | "rss" | "" (none)
    gpu_totals: tuple[float, ...] = ()  # GiB per GPU (NVML only)
    kv_tokens_metrics: int | None = None  # cache_config_info, when /metrics gives it
    now: float | None = None  # the sampler's clock at the snapshot (replay: end of log)
    # Why /metrics gives nothing ('HTTP 500', 'no answer within 2 s', ...) and
    # since when (the sampler's clock); None while it answers or is not asked.
    metrics_error: str | None = None
    metrics_error_since: float | None = None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SeriesUpdate)


@dataclass
class TrafficUpdate(Message):
    """The traffic window so far (latest wins): what the sampler's scrapes
    say of the server's traffic (tui/traffic_watch.py)."""

    state: "TrafficState"

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TrafficUpdate)


@dataclass
class ControlResult(Message):
    """A start/stop/restart/switch finished (or failed) in a worker."""

    action: str
    ok: bool
    detail: str = ""


@dataclass
class PreflightDone(Message):
    """Preflight judged a preset before launch (`blocked`: errors, not started)."""

    name: str
    result: object  # engine_ctl.preflight.PreflightResult, or None when preflight itself failed
    blocked: bool = False
    ask: bool = False  # a switch while serving: nothing launched yet; ask before stopping the server


@dataclass
class PresetsLoaded(Message):
    """Presets were (re)loaded, e.g. after `e` edited the file."""

    book: "PresetBook"
    error: str | None = None


@dataclass
class ReplayDone(Message):
    """The replay worker read the whole log."""

    path: str
    lines: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class FleetUpdate(Message):
    """One server's rows after a poll (engine_ctl.fleet.FleetRow: the server,
    then one per engine when it has several). Latest wins, per server."""

    server: str
    rows: list

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetUpdate) and message.server == self.server


@dataclass
class RayStatus(Message):
    """The Ray cluster's nodes and running trials (engine_ctl's RaySnapshot),
    for the tune screen's and the fleet view's Ray panel. Latest wins."""

    snapshot: RaySnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RayStatus)


# -- the probe pane (`p`): probe, burst and capacity workers -----------------------------------
# Each run has an id (`run`) so that late messages of an earlier run are ignored.

@dataclass
class ModelInfo(Message):
    """What /v1/models says (or why it could not be read)."""

    model: "ServedModel | None"
    error: str | None = None


@dataclass
class LongPromptReady(Message):
    text: str | None
    tokens: int | None = None
    target: int | None = None
    error: str | None = None


@dataclass
class ProbeText(Message):
    """Text streamed since the previous ProbeText of the same run. When the
    UI is behind, an older one hands its text forward to the next."""

    run: int
    text: str

    def can_replace(self, message: Message) -> bool:
        if isinstance(message, ProbeText) and message.run == self.run:
            message.text = self.text + message.text
            return True
        return False


@dataclass
class ProbeDone(Message):
    run: int
    result: "ProbeResult"


@dataclass
class BurstProgress(Message):
    """Requests finished so far (latest wins)."""

    run: int
    done: int
    total: int
    ok: int = 0
    failed: int = 0

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BurstProgress) and message.run == self.run


@dataclass
class BurstDone(Message):
    run: int
    result: "BurstResult | None"
    record: str | None = None  # the run record's id
    record_path: str | None = None
    error: str | None = None


@dataclass
class CapacityLevelStart(Message):
    """The search began measuring a level (never dropped: the level table
    shows every one). `concurrency` is the level's load: a concurrency, or
    with `rate` (open loop) a request rate in req/s."""

    run: int
    concurrency: float
    index: int
    rate: bool = False


@dataclass
class CapacityLevelProgress(Message):
    """The running level so far (latest wins: the search emits one every
    half second, and only the newest is worth drawing). `event` is the
    search's level_progress event: phase (warm-up | measuring), counted,
    sent, in_flight, elapsed_s, windows, and the provisional ttft_p99_ms,
    itl_p99_ms, attainment and verdict."""

    run: int
    concurrency: float
    requests: int
    elapsed_s: float
    rate: bool = False
    event: dict[str, Any] = field(default_factory=dict)

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CapacityLevelProgress) and message.run == self.run


@dataclass
class CapacityLevelDone(Message):
    """A level finished: its point joins the curve (never dropped)."""

    run: int
    level: "LevelResult"
    low_pass: float | None = None  # the highest passing load so far (a concurrency, or a rate)
    high_fail: float | None = None  # the lowest failing one


@dataclass
class CapacityDone(Message):
    run: int
    result: "CapacityResult | None"
    record: str | None = None
    record_path: str | None = None
    error: str | None = None


# -- the sweep screen (`w`) ----------------------------------------------------------------------

@dataclass
class SweepProgress(Message):
    """A phase change or burst progress (latest wins)."""

    event: dict[str, Any]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SweepProgress)


@dataclass
class SweepLevelDone(Message):
    """A capacity level of one preset finished (never dropped: every level
    is a point of that preset's curve)."""

    preset: str
    repeat: int
    level: "LevelResult"


@dataclass
class SweepRunDone(Message):
    """One preset measured once (never dropped)."""

    run: "SweepRun"
    event: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepFinished(Message):
    runs: list["SweepRun"]
    cancelled: bool = False
    error: str | None = None
    record: str | None = None  # the sweep's run record id
    log_dir: str | None = None
    paired: Any = None  # a paired capacity sweep's PairedResult (its verdicts), None for a sequential one
