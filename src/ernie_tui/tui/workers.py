"""Background work for the dashboard. None of it touches a widget: each loop
reads or computes, then posts a Message (see messages.py) to the app.

- ServerBridge: the engine's listener callback (runs on its monitor thread)
  turns StatusChanged / LogLines events into StatusUpdate / LogBatch.
- report_loop: at most 4 Hz, a copy of the live report when it changed.
- Sampler.run: 1 Hz (configurable), memory (NVML or engine RSS) and /metrics
  into a bounded series; posts a snapshot for the charts.
- replay_log: reads a captured llm.log once; posts the log, the report and
  the chart points from its stats lines.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

from ernie_tui.tui.messages import LogBatch, ReplayDone, ReportUpdate, SeriesUpdate, StatusUpdate
from ernie_tui.tui.series import GIB, MAX_WINDOW, ChartPoint, points_from_stats

Post = Callable[[object], object]
Cancelled = Callable[[], bool]


_RESET = object()  # in the bridge's line queue: a new run (the server restarted)


class _Peek(str):
    """In the bridge's line queue: the line being drawn (a live progress bar)."""

# The report copies sent to the UI keep this many stats samples: the live
# charts come from /metrics, the report panel shows only the latest.
REPORT_STATS_KEPT = 100


class ServerBridge:
    """Forwards one server's events to the UI as messages.

    It also keeps its own LogParser, fed the same lines the server's parser
    gets (and reset at the same moment, a new run), so the dashboard never
    has to ask the server for its report: `server.report` deep-copies the
    whole report under the server's lock, stats list included, which grows
    by a line every 10 s of serving (a day: 8,640 samples, ~0.1 s a copy)."""

    def __init__(self, post: Post, server):
        from collections import deque

        self.post = post
        self.server = server
        self._lock = threading.Lock()
        self.run: object = None
        self._line_no = 0
        self.report_dirty = threading.Event()
        self.pending: deque = deque()  # lines (lists) and _RESET markers, for report_loop
        server.add_listener(self._on_event)

    def _on_event(self, event) -> None:
        from ernie_tui.engine_ctl.server import LogLines, StatusChanged

        if isinstance(event, StatusChanged):
            st = event.status
            with self._lock:
                if st.started_at is not None and st.started_at != self.run:
                    self.run = st.started_at
                    self._line_no = 0
                    self.pending.append(_RESET)
            self.report_dirty.set()
            self.post(StatusUpdate(st))
        elif isinstance(event, LogLines):
            lines = list(event.lines)
            with self._lock:
                first = self._line_no + 1
                self._line_no += len(lines)
                run = self.run
                if lines:
                    self.pending.append(lines)
                if event.partial:
                    self.pending.append(_Peek(event.partial))
            if lines:
                self.post(LogBatch(lines, run=run, first_line_no=first))
            self.report_dirty.set()

    def close(self) -> None:
        try:
            self.server.remove_listener(self._on_event)
        except Exception:
            pass


def report_snapshot(report):
    """A copy of a live report that the UI may keep: shallow, with its
    mutable parts copied and the stats trimmed to the latest samples."""
    import dataclasses

    return dataclasses.replace(report, stats=list(report.stats[-REPORT_STATS_KEPT:]), phases=dict(report.phases),
                               non_default_args=dict(report.non_default_args), pids=dict(report.pids))


def _looks(report) -> tuple:
    """What of a report the screen shows (its line count and older stats aside)."""
    import dataclasses

    return dataclasses.astuple(dataclasses.replace(report, lines=0, stats=report.stats[-1:]))


def report_loop(post: Post, bridge: ServerBridge, cancelled: Cancelled, interval: float = 0.25) -> None:
    """Parse the server's lines with our own LogParser and post a snapshot of
    the report when what it shows changed, at most 1/interval times a second."""
    from ernie_tui.engine_ctl.logparse import LogParser

    parser = LogParser()
    last = None
    while not cancelled():
        if not bridge.report_dirty.wait(1.0):  # idle: one wakeup a second to notice cancellation
            continue
        bridge.report_dirty.clear()
        while bridge.pending:
            item = bridge.pending.popleft()
            if item is _RESET:
                parser = LogParser()
            elif isinstance(item, _Peek):
                parser.peek(item)
            else:
                parser.feed_many(item)
        report = parser.report
        if len(report.stats) > 10 * REPORT_STATS_KEPT:
            del report.stats[:-REPORT_STATS_KEPT]  # ours alone: keep memory flat over days of serving
        looks = _looks(report)
        if looks == last:
            continue
        last = looks
        post(ReportUpdate(report_snapshot(report), run=bridge.run))
        time.sleep(interval)


class Sampler:
    """Memory and /metrics at a fixed rate into a bounded series."""

    def __init__(self, post: Post, get_server: Callable[[], object | None], clock: Callable[[], float],
                 interval: float = 1.0, resource_factory=None, metrics_factory=None,
                 api_key: str | None = None):
        self.post = post
        self.get_server = get_server
        self.clock = clock
        self.interval = interval
        self.resource_factory = resource_factory
        self.metrics_factory = metrics_factory
        self.api_key = api_key
        self.points: deque[ChartPoint] = deque(maxlen=int(MAX_WINDOW / max(interval, 0.05)) + 10)

    def run(self, cancelled: Cancelled) -> None:
        from ernie_tui.engine_ctl import metrics as m
        from ernie_tui.engine_ctl.resources import ResourceSampler

        cache: dict = {"key": None, "pids": [], "at": 0.0}

        def pids() -> list[int]:
            """The engine's process tree, re-read every 5 s (psutil walks /proc
            for it) or when the server's pid changes."""
            server = self.get_server()
            if server is None:
                return []
            key = (id(server), server.status.pid)
            now = time.monotonic()
            if key != cache["key"] or now - cache["at"] > 5.0:
                try:
                    cache["pids"] = list(server.engine_pids())
                except Exception:
                    cache["pids"] = []
                cache["key"], cache["at"] = key, now
            return cache["pids"]

        resources = (self.resource_factory or ResourceSampler)(pids=pids)
        client = None
        client_url = None
        prev = None
        kv_tokens: int | None = None
        problem: tuple[str, float] | None = None  # (what is wrong with /metrics, since when)
        try:
            next_at = time.monotonic()
            while not cancelled():
                server = self.get_server()
                status = server.status if server is not None else None
                running = bool(status and status.running)
                mem: tuple[float, ...] = ()
                totals: tuple[float, ...] = ()
                if running or resources.nvml:
                    try:
                        ms = resources.sample()
                    except Exception:
                        ms = None
                    if ms is not None:
                        if ms.source == "nvml":
                            mem = tuple(g.used_bytes / GIB for g in ms.gpus)
                            totals = tuple(g.total_bytes / GIB for g in ms.gpus)
                        elif ms.engine_bytes:
                            mem = (ms.engine_bytes / GIB,)
                sample = None
                if status is not None and status.state.value == "ready" and status.url:
                    if client is None or client_url != status.url:
                        if client is not None:
                            client.close()
                        client = (self.metrics_factory or m.MetricsClient)(status.url, api_key=self.api_key)
                        client_url, prev = status.url, None
                    try:
                        snap = _fetch_needed(client, m)
                    except m.MetricsError as exc:
                        # Say it, rather than look like a server that has not answered yet.
                        if problem is None or problem[0] != exc.reason:
                            problem = (exc.reason, self.clock())
                    else:
                        problem = None
                        sample = m.derive_sample(prev, snap)
                        prev = snap
                        cc = snap.cache_config()
                        if cc is not None and cc.kv_cache_size_tokens is not None:
                            kv_tokens = cc.kv_cache_size_tokens
                else:
                    prev = None  # a restart resets the counters: no rate across it
                    problem = None  # not asked while the server is not ready
                    if not running:
                        kv_tokens = None
                now = self.clock()
                self.points.append(ChartPoint(
                    t=now, mem_gib=mem,
                    prompt_tps=sample.prompt_tps if sample else None,
                    gen_tps=sample.generation_tps if sample else None,
                    kv_pct=sample.kv_cache_usage_pct if sample else None,
                    running=int(sample.running) if sample and sample.running is not None else None,
                    waiting=int(sample.waiting) if sample and sample.waiting is not None else None,
                ))
                self.post(SeriesUpdate(tuple(self.points), memory_label=resources.label,
                                       memory_source="nvml" if resources.nvml else "rss",
                                       gpu_totals=totals, kv_tokens_metrics=kv_tokens, now=now,
                                       metrics_error=problem[0] if problem else None,
                                       metrics_error_since=problem[1] if problem else None))
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay < 0:
                    next_at = time.monotonic()
                    delay = 0
                _sleep(delay, cancelled)
        finally:
            if client is not None:
                client.close()
            try:
                resources.close()
            except Exception:
                pass


# The few metric families the charts and the report read. A real vLLM
# /metrics is ~50 KB, mostly histogram buckets; parsing all of it every
# second was the biggest cost of an idle dashboard, so the rest is dropped
# before parsing (MetricsSnapshot.parse(only=...), engine_ctl's one prefilter).
_NEEDED_PREFIXES = tuple(name.split("_total")[0] for name in (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info"))


def _fetch_needed(client, m):
    """One scrape, reduced to what the dashboard shows, then parsed by
    engine_ctl.metrics (so names, renames and the snapshot stay its own).

    Raises MetricsError when the server does not answer, answers with an
    error, or answers with something that holds none of vLLM's metrics (the
    parser skips lines it cannot read, so garbage parses to nothing)."""
    before = time.monotonic()
    text = client.fetch_text()
    mono = (before + time.monotonic()) / 2
    snap = m.MetricsSnapshot.parse(text, timestamp=time.time(), mono=mono,
                                   model_name=getattr(client, "model_name", None), only=_NEEDED_PREFIXES)
    if not snap.names():
        size = len(text.encode("utf-8", "replace"))
        raise m.MetricsError(f"{getattr(client, 'url', '/metrics')} answered {size:,} bytes without a vLLM metric",
                             f"parse error: no vLLM metrics in {size:,} bytes")
    return snap


def _sleep(seconds: float, cancelled: Cancelled) -> None:
    end = time.monotonic() + seconds
    while not cancelled():
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))  # few wakeups: a cancelled worker still ends within 0.5 s


def replay_log(post: Post, path: Path, cancelled: Cancelled, batch_lines: int = 5000) -> None:
    """Read a captured llm.log once and post what the dashboard shows."""
    from ernie_tui.engine_ctl.logparse import LogParser
    from ernie_tui.engine_ctl.logtail import LogTailer

    parser = LogParser()
    tailer = LogTailer(path, from_start=True)
    run = str(path)
    line_no = 0
    try:
        while not cancelled():
            lines = tailer.read_new()
            if not lines:
                break
            for i in range(0, len(lines), batch_lines):
                chunk = lines[i:i + batch_lines]
                for line in chunk:
                    parser.feed(line)
                post(LogBatch(chunk, run=run, first_line_no=line_no + 1))
                line_no += len(chunk)
        last = tailer.partial  # a last line without a newline
        if last and not cancelled():
            parser.feed(last)
            post(LogBatch([last], run=run, first_line_no=line_no + 1))
            line_no += 1
    finally:
        tailer.close()
    report = parser.report
    post(ReportUpdate(report, run=run))
    points = points_from_stats(report.stats)
    post(SeriesUpdate(tuple(points), memory_label="no memory figures in a log", memory_source="",
                      now=points[-1].t if points else 0.0))
    post(ReplayDone(str(path), line_no))
