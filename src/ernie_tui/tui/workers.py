"""Background work for the dashboard. None of it touches a widget: each loop
reads or computes, then posts a Message (see messages.py) to the app.

- ServerBridge: the watcher's listener callback (runs on its monitor thread)
  turns StatusChanged / LogLines events into StatusUpdate / LogBatch, and a
  LogRead (a replay reached its end) into the final report and charts.
- report_loop: at most 4 Hz, the watcher's latest report snapshot when its
  version changed. The watcher's monitor owns the one parser; nothing here
  parses the log.
- Sampler.run: 1 Hz (configurable), memory (NVML or engine RSS) and /metrics
  into a bounded series; posts a snapshot for the charts. Every few seconds
  the same scrape keeps the families a traffic capture reads too, for the
  traffic window (TrafficWatch), whose state it posts for the traffic view.
- read_earlier: lines before the pane's first, when it scrolls up to them.
- ray_loop: every few seconds, the Ray cluster's nodes and trials (--ray).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import psutil

from ernie_tui.engine_ctl.control import LogLines, LogRead, ReportPublished, ResourceSampler, StatusChanged
from ernie_tui.engine_ctl.load import (
    TRAFFIC_METRICS,
    LatestScrape,
    MetricsClient,
    MetricsError,
    MetricsSnapshot,
    derive_sample,
)
from ernie_tui.tui.failures import Failure
from ernie_tui.tui.messages import (
    LogBatch,
    LogEarlier,
    RayStatus,
    ReplayDone,
    ReportUpdate,
    SeriesUpdate,
    StatusUpdate,
    TrafficUpdate,
)
from ernie_tui.tui.series import GIB, MAX_WINDOW, ChartPoint, points_from_stats
from ernie_tui.tui.traffic_watch import TrafficWatch

Post = Callable[[object], object]
Cancelled = Callable[[], bool]


class ServerBridge:
    """Forwards one watcher's events (EngineServer, AttachedServer,
    LogReplay) to the UI as messages."""

    def __init__(self, post: Post, server):
        self.post = post
        self.server = server
        self.report_dirty = threading.Event()
        server.add_listener(self._on_event)

    def _on_event(self, event) -> None:
        if isinstance(event, ReportPublished):
            self.report_dirty.set()
        elif isinstance(event, LogLines):
            if event.lines:
                self.post(LogBatch(list(event.lines), run=event.run, first_line_no=event.first_line_no))
        elif isinstance(event, StatusChanged):
            self.report_dirty.set()
            self.post(StatusUpdate(event.status))
        elif isinstance(event, LogRead):
            self._replayed(event)

    def _replayed(self, event) -> None:
        """The replayed log's final report, its charts from its stats lines, then ReplayDone."""
        snap = self.server.snapshot
        self.post(ReportUpdate(snap.report, run=snap.run, version=snap.version))
        points = points_from_stats(snap.report.stats)
        self.post(SeriesUpdate(tuple(points), memory_label="no memory figures in a log", memory_source="",
                               now=points[-1].t if points else 0.0))
        self.post(ReplayDone(str(event.path), event.lines))

    def close(self) -> None:
        self.server.remove_listener(self._on_event)


def report_loop(post: Post, bridge: ServerBridge, cancelled: Cancelled, interval: float = 0.25) -> None:
    """Post the watcher's report snapshot when its version changed, at most
    1/interval times a second. A snapshot is immutable and made once per
    change by the watcher: posting it costs nothing."""
    last = None
    while not cancelled():
        if not bridge.report_dirty.wait(1.0):  # idle: one wakeup a second to notice cancellation
            continue
        bridge.report_dirty.clear()
        snap = bridge.server.snapshot
        if snap.version == last:
            continue
        last = snap.version
        post(ReportUpdate(snap.report, run=snap.run, version=snap.version))
        time.sleep(interval)


def ray_loop(post: Callable[[RayStatus], object], source: Any, cancelled: Cancelled, interval: float = 2.0) -> None:
    """`source.snapshot()` (RayTrials: never raises) posted as RayStatus
    every `interval` seconds until cancelled. Ray's calls block (a node
    that does not answer is waited for up to 2 s), hence a thread of its own."""
    while not cancelled():
        post(RayStatus(source.snapshot()))
        _sleep(interval, cancelled)


def read_earlier(post: Post, server, run: object, line_no: int, max_lines: int = 2000) -> None:
    """The lines before line `line_no` of the watcher's log, for the pane."""
    lines, first = server.read_earlier(run, line_no, max_lines)
    post(LogEarlier(lines, run=run, first_line_no=first))


class Sampler:
    """Memory and /metrics at a fixed rate into a bounded series."""

    def __init__(self, post: Post, get_server: Callable[[], object | None], clock: Callable[[], float],
                 interval: float = 1.0, resource_factory=None, metrics_factory=None,
                 api_key: str | None = None, latest: LatestScrape | None = None,
                 traffic: TrafficWatch | None = None, traffic_interval: float = 5.0):
        self.post = post
        self.traffic = traffic  # the traffic window, fed every traffic_interval seconds
        self.traffic_interval = traffic_interval
        self._traffic_next = 0.0  # time.monotonic() of the next scrape that keeps the traffic families
        self.latest = latest  # each scrape, shared with a burst or search on the same server
        self.get_server = get_server
        self.clock = clock
        self.interval = interval
        self.resource_factory = resource_factory
        self.metrics_factory = metrics_factory
        self.api_key = api_key
        self.points: deque[ChartPoint] = deque(maxlen=int(MAX_WINDOW / max(interval, 0.05)) + 10)

    def run(self, cancelled: Cancelled) -> None:
        """One chart point an interval, until cancelled: memory, then /metrics
        while the server is ready, then the whole series posted."""
        resources = (self.resource_factory or ResourceSampler)(pids=_EnginePids(self.get_server))
        metrics = _MetricsReader(self._connect, self.latest, self.clock)
        try:
            next_at = time.monotonic()
            while not cancelled():
                self._sample_once(resources, metrics)
                next_at = _wait_for_next(next_at, self.interval, cancelled)
        finally:
            metrics.close()
            resources.close()

    def _connect(self, url: str):
        """A /metrics client for the server at `url`."""
        return (self.metrics_factory or MetricsClient)(url, api_key=self.api_key)

    def _sample_once(self, resources, metrics: _MetricsReader) -> None:
        """Memory and /metrics as one chart point, then the series to the charts."""
        server = self.get_server()
        status = server.status if server is not None else None
        running = bool(status and status.running)
        mem, totals = _memory(resources, running)
        traffic_due = self.traffic is not None and time.monotonic() >= self._traffic_next
        sample = metrics.read(status, running, _TRAFFIC_PREFIXES if traffic_due else ())
        if traffic_due and metrics.last is not None and self.traffic is not None:
            # Only a scrape of a ready server: the window keeps its state meanwhile.
            self._traffic_next = time.monotonic() + self.traffic_interval
            self._feed_traffic(self.traffic, metrics.client_url or "", metrics.last)
        now = self.clock()
        self.points.append(_chart_point(now, mem, sample))
        problem = metrics.problem
        self.post(SeriesUpdate(tuple(self.points), memory_label=resources.label,
                               memory_source="nvml" if resources.nvml else "rss",
                               gpu_totals=totals, kv_tokens_metrics=metrics.kv_tokens, now=now,
                               metrics_error=problem[0] if problem else None,
                               metrics_error_since=problem[1] if problem else None))


    def _feed_traffic(self, traffic: TrafficWatch, url: str, snap: MetricsSnapshot) -> None:
        try:
            traffic.add(url, snap)
            state = traffic.state()
        except Exception as exc:  # noqa: BLE001  the traffic view is extra: its bug is shown once, the charts go on
            self.traffic = None
            self.post(Failure("the traffic view", exc, after="the charts go on without it"))
            return
        self.post(TrafficUpdate(state))


class _EnginePids:
    """The engine's process tree, re-read every 5 s (psutil walks /proc for
    it) or when the server's pid changes. Called by the ResourceSampler."""

    def __init__(self, get_server: Callable[[], object | None]):
        self.get_server = get_server
        self.key: tuple[int, object] | None = None
        self.pids: list[int] = []
        self.at = 0.0

    def __call__(self) -> list[int]:
        server = self.get_server()
        if server is None:
            return []
        key = (id(server), server.status.pid)
        now = time.monotonic()
        if key != self.key or now - self.at > 5.0:
            try:
                self.pids = list(server.engine_pids())
            except (OSError, psutil.Error):  # the processes went away between two looks
                self.pids = []
            self.key, self.at = key, now
        return self.pids


def _memory(resources, running: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(GiB used, GiB in all): per GPU from NVML, else the engine's RSS alone
    (no total); nothing while no engine runs and NVML is not there."""
    if not (running or resources.nvml):
        return (), ()
    try:
        ms = resources.sample()
    except (OSError, psutil.Error):  # the processes went away between two looks
        return (), ()
    if ms is None:
        return (), ()
    if ms.source == "nvml":
        return tuple(g.used_bytes / GIB for g in ms.gpus), tuple(g.total_bytes / GIB for g in ms.gpus)
    if ms.engine_bytes:
        return (ms.engine_bytes / GIB,), ()
    return (), ()


class _MetricsReader:
    """The ready server's /metrics: one client per URL, the previous scrape
    (for rates), the KV cache size it reports, and what is wrong with
    /metrics since when."""

    def __init__(self, connect: Callable[[str], Any], latest: LatestScrape | None, clock: Callable[[], float]):
        self.connect = connect
        self.latest = latest
        self.clock = clock
        self.client: Any = None  # a MetricsClient, or what the metrics_factory made
        self.client_url: str | None = None
        self.prev: MetricsSnapshot | None = None
        self.last: MetricsSnapshot | None = None  # this read's scrape (None: none taken)
        self.kv_tokens: int | None = None
        self.problem: tuple[str, float] | None = None  # (what is wrong with /metrics, since when)

    def read(self, status, running: bool, extra: tuple[str, ...] = ()):
        """The rates since the last scrape, or None: the server is not ready,
        or /metrics failed (then `problem` says why). `extra`: more metric
        families (prefixes) to keep in this scrape (`last`)."""
        self.last = None
        if status is None or status.state.value != "ready" or not status.url:
            self.prev = None  # a restart resets the counters: no rate across it
            self.problem = None  # not asked while the server is not ready
            if not running:
                self.kv_tokens = None
            return None
        self._client_for(status.url)
        try:
            snap = _fetch_needed(self.client, extra)
        except MetricsError as exc:
            # Say it, rather than look like a server that has not answered yet.
            if self.problem is None or self.problem[0] != exc.reason:
                self.problem = (exc.reason, self.clock())
            return None
        self.problem = None
        self.last = snap
        if self.latest is not None:
            self.latest.put(status.url, snap)
        sample = derive_sample(self.prev, snap)
        self.prev = snap
        cc = snap.cache_config()
        if cc is not None and cc.kv_cache_size_tokens is not None:
            self.kv_tokens = cc.kv_cache_size_tokens
        return sample

    def _client_for(self, url: str) -> None:
        """A new client when the URL changed; its counters start afresh."""
        if self.client is None or self.client_url != url:
            if self.client is not None:
                self.client.close()
            self.client = self.connect(url)
            self.client_url, self.prev = url, None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _chart_point(now: float, mem: tuple[float, ...], sample) -> ChartPoint:
    """One point of the charts; the /metrics figures None without a sample."""
    return ChartPoint(
        t=now, mem_gib=mem,
        prompt_tps=sample.prompt_tps if sample else None,
        gen_tps=sample.generation_tps if sample else None,
        kv_pct=sample.kv_cache_usage_pct if sample else None,
        running=int(sample.running) if sample and sample.running is not None else None,
        waiting=int(sample.waiting) if sample and sample.waiting is not None else None,
    )


def _wait_for_next(next_at: float, interval: float, cancelled: Cancelled) -> float:
    """Sleep to the next tick, `interval` after `next_at`; a late tick starts
    the schedule afresh from now rather than catching up."""
    next_at += interval
    delay = next_at - time.monotonic()
    if delay < 0:
        next_at = time.monotonic()
        delay = 0
    _sleep(delay, cancelled)
    return next_at


# The few metric families the charts and the report read. A real vLLM
# /metrics is ~50 KB, mostly histogram buckets; parsing all of it every
# second was the biggest cost of an idle dashboard, so the rest is dropped
# before parsing (MetricsSnapshot.parse(only=...), engine_ctl's one prefilter).
_NEEDED_PREFIXES = tuple(name.split("_total")[0] for name in (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info"))
# ... and, every few seconds, what a traffic capture reads (its histograms are
# most of a scrape's lines: not parsed every second). Counters by their family
# name, as above, so that their TYPE lines are kept.
_TRAFFIC_PREFIXES = tuple(name.split("_total")[0] for name in TRAFFIC_METRICS)


def _fetch_needed(client, extra: tuple[str, ...] = ()):
    """One scrape, reduced to what the dashboard shows, then parsed by
    engine_ctl.metrics (so names, renames and the snapshot stay its own).

    Raises MetricsError when the server does not answer, answers with an
    error, or answers with something that holds none of vLLM's metrics (the
    parser skips lines it cannot read, so garbage parses to nothing)."""
    before = time.monotonic()
    text = client.fetch_text()
    mono = (before + time.monotonic()) / 2
    snap = MetricsSnapshot.parse(text, timestamp=time.time(), mono=mono,
                                   model_name=getattr(client, "model_name", None), only=_NEEDED_PREFIXES + extra)
    if not snap.names():
        size = len(text.encode("utf-8", "replace"))
        raise MetricsError(f"{getattr(client, 'url', '/metrics')} answered {size:,} bytes without a vLLM metric",
                             f"parse error: no vLLM metrics in {size:,} bytes")
    return snap


def _sleep(seconds: float, cancelled: Cancelled) -> None:
    end = time.monotonic() + seconds
    while not cancelled():
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))  # few wakeups: a cancelled worker still ends within 0.5 s
