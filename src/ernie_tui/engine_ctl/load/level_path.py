"""The path of one capacity level against a live server, top to bottom.

HttpLevelRunner (capacity_run.py) hands each level to a LevelPath, whose run()
reads as the level's steps:

1. prepare: the prompts the level may send, built before anything is timed,
   and its connections, within the open-file room;
2. warm_up: the connections opened with 1-token requests (before the first
   level, one batch of the workload's own shape: a fresh vLLM compiles kernels
   on its first decoding batches);
3. start_load: the opening /metrics scrape and its sampler, then the streams
   (a closed loop's workers or an open loop's sender here, or the stream
   processes of level_procs.py);
4. hold: every 0.1 s the LevelMonitor (capacity.py) judges the windows in a
   worker thread (the warm-up discarded, the rest cut into windows, stability,
   the verdict) until it says the level has seen enough, the search is
   cancelled, or the server is down;
5. stop_load: what is still in flight belongs to a window that is not counted:
   cancelled (vLLM aborts it) rather than drained at a lighter load;
6. conclude: the closing scrape (vLLM's view of the level), the monitor's
   result, and the client's own health beside it (loop lag, GC, prompts built
   during the level, late sends).

Measuring a level again (a confirmation) is the search's step (capacity.py):
it runs the level once more with min_requests, a floor on the counted requests.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Protocol

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load import stats
from ernie_tui.engine_ctl.load.arrivals import arrival_stream
from ernie_tui.engine_ctl.load.burst import ClientHealth
from ernie_tui.engine_ctl.load.http_client import new_async_client, server_answers
from ernie_tui.engine_ctl.load.http_errors import TRANSPORT_KINDS
from ernie_tui.engine_ctl.load.level_procs import ChildTotals, LevelProcs, closed_specs, open_specs, request_outcome
from ernie_tui.engine_ctl.load.level_server import MetricsSampler, vllm_window
from ernie_tui.engine_ctl.load.open_files import FileRoom, make_room
from ernie_tui.engine_ctl.load.probe import stream_request
from ernie_tui.engine_ctl.load.server_cpu import ServerCpuWatch
from ernie_tui.engine_ctl.load.stream_timing import ProbeRequest
from ernie_tui.engine_ctl.load.traffic_replay import curve_stream
from ernie_tui.engine_ctl.load.workload import WorkItem, Workload

Progress = Callable[[dict[str, Any]], None]


@dataclass
class RequestSettings:
    chat: bool = False
    temperature: float | None = None  # None: the server's default (see request_setup)
    top_p: float | None = None
    ignore_eos: bool = True
    # Usage only at the end: asking it in every chunk slows vLLM itself
    # (see ProbeRequest.continuous_usage), and a capacity figure must be the
    # server's, not our request options'.
    continuous_usage: bool = False
    read_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    # Open the level's C connections with one 1-token request each first, so
    # connection set-up is not billed to the level's first TTFTs; before the
    # first level, also send one batch of the workload's own shape (a fresh
    # vLLM compiles kernels on its first decoding batches: on two H200s that
    # failed the first level of 6 of 10 fresh servers, and the search settled
    # on 15 where the same preset carried 208).
    warmup: bool = True
    sample_interval_s: float = M.LOAD_SAMPLE_INTERVAL_S  # 1 s, as a burst; why not shorter: see there
    # A level's opening and closing /metrics scrapes (its vLLM figures) may
    # take this long: vLLM CPU busy decoding on a loaded 2-core box took up
    # to 11 s to answer one, past the dashboard poller's 2 s; the level then
    # lost its vLLM view and its KV-cache and queue figures (the sampler
    # starts only after the opening scrape).
    metrics_timeout_s: float = 15.0
    settle_timeout_s: float = 5.0
    # A level's streams over this many child processes (level_procs.py;
    # an open loop's rate shared out), the search keeping the judging; 1: in the search's
    # own process. One process lagged p99 14-54 ms at 320-512 streams on an
    # H200 and read ITL above vLLM's own histogram (eighteenth run). The
    # command line and the dashboard ask level_procs.auto_procs().
    client_procs: int = 1


class LevelOwner(Protocol):
    """What a level reads from its runner (HttpLevelRunner), and the three
    things it notes there: the server warmed, /metrics missing, a level run."""

    open_loop: bool
    url: str
    model: str
    api_key: str | None
    slo: list[S.Objective]
    rules: C.LevelRules
    settings: RequestSettings
    workload: Workload
    use_metrics: bool
    cancel: threading.Event | None
    progress: Progress | None
    arrivals: str
    seed: int
    metrics_feed: M.MetricsFeed | None
    server_pid: int | None
    _procs: LevelProcs | None  # the search's stream processes, if it has any
    _levels: int  # levels run so far (seeds each open loop's schedule)
    server_warmed: bool
    metrics_missing: bool

    def _expected_requests(self, load: float, rules: C.LevelRules) -> int: ...


def level_request(settings: RequestSettings, item: WorkItem, max_tokens: int | None = None) -> ProbeRequest:
    """The request a work item becomes under the search's settings."""
    s = settings
    return ProbeRequest(prompt=item.prompt, max_tokens=max_tokens or item.max_tokens,
                        temperature=s.temperature, top_p=s.top_p, chat=s.chat, ignore_eos=s.ignore_eos,
                        continuous_usage=s.continuous_usage)


class LevelPath:
    """One level: run() once. Its state is the level's (the monitor, the
    stop, the transport failures in a row, the client's figures)."""

    def __init__(self, owner: LevelOwner, load: Any, min_requests: int | None = None) -> None:
        self.owner = owner
        self.load = load
        self.s = owner.settings
        self.rate = owner.open_loop
        self.width = max(1, int(math.ceil(load)))  # warm-up batch and connections
        self.key = "rate" if self.rate else "concurrency"
        rules = owner.rules
        if min_requests is not None:  # the search's confirmation: at least this many counted
            rules = rules.confirming(min_requests)
        self.rules = rules
        self.monitor = C.LevelMonitor(load, owner.slo, rules, rate=self.rate)
        self.mclient = M.MetricsClient(owner.url, owner.api_key, timeout=self.s.metrics_timeout_s) \
            if owner.use_metrics else None
        self.stop = asyncio.Event()
        self.reason: list[str] = []
        self.in_row = 0  # transport failures in a row
        self.judge = ThreadJudge()
        self.prompts = PromptsAhead(owner.workload, self.width)
        self.streams: LevelStreams | None = None
        self.before: M.MetricsSnapshot | None = None
        self.sampler: MetricsSampler | None = None
        self.procs = owner._procs
        self.totals: list[ChildTotals] = []
        self.health = ClientHealth()
        self.cpu_watch: ServerCpuWatch | None = None
        self.t0 = 0.0
        self.conns = 0
        self.room: FileRoom | None = None

    async def run(self) -> C.LevelResult:
        """The level's steps, in order (see the module's docstring)."""
        self.prepare()
        async with new_async_client(self.owner.api_key, self.s.read_timeout_s, max_connections=self.conns) as client:
            await self.warm_up(client)
            await self.start_load(client)
            try:
                await self.hold()
            finally:
                await self.stop_load()
        return await self.conclude()

    # -- 1. prepare ----------------------------------------------------------------

    def prepare(self) -> None:
        """Prompts for the most this level can send, built now, before
        anything is timed; its connections, within the open-file room."""
        owner = self.owner
        owner._levels += 1
        owner.workload.ensure(owner._expected_requests(float(self.load), self.rules))
        self.conns = self.width + 2 if not self.rate else max(64, int(float(self.load) * 30) + 16)
        # A closed loop's room was made once for the search's ceiling (_fit_ceiling);
        # an open loop's in-flight set is rarely its connection cap (30 s of
        # arrivals), so it keeps to the room left, and a send past it waits.
        room = make_room(self.conns) if self.rate else None
        if room is not None and room.connections < self.conns:
            self.conns = max(1, room.connections)
            self.room = room
        else:
            self.room = None  # not held to the room: nothing to say

    # -- 2. warm-up ----------------------------------------------------------------

    async def warm_up(self, client: Any) -> None:
        """The connections opened (connection set-up is not billed to the
        level's first TTFTs); before the first level, one batch of the
        workload's own shape."""
        owner, s = self.owner, self.s
        if not s.warmup:
            return
        if not owner.server_warmed:
            owner.server_warmed = True
            batch = [level_request(s, owner.workload.take()) for _ in range(self.width)]
        elif self.procs is None:
            batch = [level_request(s, owner.workload.warm_item, max_tokens=1)] * min(self.width, 64)
        else:
            batch = []  # each stream process opens its own connections (level_procs)
        await self._unless_cancelled(asyncio.gather(*(
            stream_request(client, owner.url, req, owner.model, read_timeout=s.read_timeout_s,
                           total_timeout=s.request_timeout_s) for req in batch)))

    def _cancelled(self) -> bool:
        return self.owner.cancel is not None and self.owner.cancel.is_set()

    async def _unless_cancelled(self, step: Awaitable[Any]) -> None:
        """Await `step` (the warm-up batch), but drop it as soon as the search
        is cancelled: its streams close, which vLLM takes as an abort. The
        first level's batch has the workload's own shape, so waiting it out
        could take as long as a request (about 8 s on vLLM CPU for 4 answers
        of 1,900 tokens); the level loop then sees the cancel at once."""
        task = asyncio.ensure_future(step)
        try:
            while not task.done():
                if self._cancelled():
                    break
                await asyncio.wait({task}, timeout=0.1)
        finally:
            dropped = not task.done()
            if dropped:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not dropped:
            task.result()  # a bug in the batch still shows

    # -- 3. the load starts --------------------------------------------------------

    async def start_load(self, client: Any) -> None:
        """The opening scrape, then the streams; t0 is when they start."""
        if self.procs is None:
            await self.open_window()
        else:
            t0_procs = await self._begin_procs(self.procs)
        # The heap from before the level (prompts, tokenizer, imports,
        # earlier levels) out of the collector's reach while it runs, as
        # a burst does; the collection that precedes the freeze is untimed.
        # And no collection while the level runs (its length is capped):
        # see ClientHealth.start.
        self.health.start(freeze=True, pause_collector=True)
        if self.owner.server_pid is not None:
            self.cpu_watch = ServerCpuWatch(self.owner.server_pid)
            self.cpu_watch.start()
        self.t0 = time.perf_counter()
        self.streams = LevelStreams(self, client)
        if self.procs is not None:
            self.t0 = t0_procs  # the stream processes began above; their t0 is the level's
        else:
            self.streams.start()

    async def open_window(self) -> None:
        """The level's opening /metrics scrape and its sampler."""
        if self.mclient is None:
            return
        self.before = await asyncio.to_thread(self.mclient.try_fetch)
        if self.before is None:
            self.owner.metrics_missing = True
        else:
            # Its own client, with the poller's short timeout: a
            # sample lost to a slow answer is only a sample.
            self.sampler = MetricsSampler(M.MetricsClient(self.owner.url, self.owner.api_key),
                                          self.s.sample_interval_s, feed=self.owner.metrics_feed)
            self.sampler.start()

    async def _begin_procs(self, procs: LevelProcs) -> float:
        """The stream processes open their connections, then start together;
        the window opens between the two, so their warm-up requests (1-token,
        one prompt repeated: up to 64 a process) are not in the level's vLLM
        figures. Opened first, they were: the twentieth H200 run's records
        read 585,728 prompt tokens from vLLM's prefix cache "during the levels"."""
        owner = self.owner
        warm = level_request(self.s, owner.workload.warm_item, max_tokens=1) if self.s.warmup else None
        if self.rate:
            specs = open_specs(float(self.load), procs.procs, connections=self.conns, arrivals=owner.arrivals,
                               seed=owner.seed * 1009 + owner._levels, late_s=C.LATE_SEND_S,
                               burstiness=getattr(owner, "burstiness", 1.0), curve=getattr(owner, "curve", None))
        else:
            specs = closed_specs(int(self.load), procs.procs)
        take = self.take_requests
        try:
            return await procs.begin(specs, take(sum(sp["refill"] for sp in specs)), warm, take,
                                     self.on_started, self.on_outcome, self.stop, when_ready=self.open_window)
        except BaseException:
            self._stop_sampler()
            raise

    def take_requests(self, n: int) -> list[ProbeRequest]:
        """Prompts for a stream process."""
        return [level_request(self.s, item) for item in self.prompts.take(n)]

    def on_started(self, t_s: float) -> None:
        self.judge.feed(partial(self.monitor.started, t_s))

    def on_outcome(self, o: S.RequestOutcome) -> None:
        """A request's end, timed here or in a stream process (the verdict:
        at the hold's 0.1 s tick, in a thread; see ThreadJudge)."""
        self.judge.feed(partial(self.monitor.add, o))
        self.in_row = self.in_row + 1 if o.error_kind in TRANSPORT_KINDS else 0
        if self.in_row >= max(4, 2 * self.width):
            self.decide("server_down")

    def decide(self, reason: str) -> None:
        """The level ends, for the first reason given."""
        if not self.reason:
            self.reason.append(reason)
        self.stop.set()

    # -- 4. hold until judged ------------------------------------------------------

    async def hold(self) -> None:
        """Judge the level every 0.1 s, in a worker thread, until the
        monitor gives a stop reason (or the search is cancelled); progress
        every 0.5 s."""
        last_progress = 0.0
        lag_task = asyncio.ensure_future(self.health.watch_loop())
        try:
            while not self.stop.is_set():
                if self._cancelled():
                    self.decide("cancelled")
                    break
                now = time.perf_counter() - self.t0
                r = await self.judge.run(self.monitor.stop_reason, now)
                if r is not None:
                    self.decide(r)
                    break
                if self.owner.progress is not None and now - last_progress >= 0.5:
                    last_progress = now
                    C.emit(self.owner.progress, event="level_progress", **{self.key: self.load},
                           **await self.judge.run(self.monitor.progress, now))
                try:
                    await asyncio.wait_for(self.stop.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.stop.set()
            lag_task.cancel()

    # -- 5. the load stops ---------------------------------------------------------

    async def stop_load(self) -> None:
        """What is still in flight belongs to a window that is not counted:
        cancel it (vLLM aborts it) instead of draining it at a lighter load."""
        self.stop.set()
        if self.procs is not None:
            try:
                self.totals = await self.procs.finish()
            except BaseException:
                self.health.stop()
                self._stop_sampler()
                if self.cpu_watch is not None:
                    self.cpu_watch.stop()
                raise
        if self.streams is not None:
            await self.streams.cancel()
        # A refill still building finishes before the next level's ensure().
        await self.prompts.settle()
        self.health.stop()

    def _stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.halt.set()
            self.sampler.stop()

    # -- 6. the verdict and what stands beside it ----------------------------------

    async def conclude(self) -> C.LevelResult:
        """The closing scrape and the monitor's result, with the client's health."""
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        server_cpu = self.cpu_watch.stop() if self.cpu_watch is not None else None
        server = await self.server_view()
        stop, alive = await self.checked_stop()
        res = self.monitor.result(elapsed, stop, server)
        res.server_cpu = server_cpu
        if alive:
            res.warnings.append(alive)
        late_n, late_max = self.note_client(res)
        self.warn_client(res, late_n, late_max)
        return res

    async def server_view(self) -> dict[str, Any]:
        """vLLM's figures for the level: the histograms between the opening
        and the settled closing scrape, and the sampler's peaks."""
        if self.sampler is not None:
            self.sampler.halt.set()
        server: dict[str, Any] = {}
        if self.mclient is not None and self.before is not None:
            ok = sum(1 for o in self.monitor.outcomes if o.ok)
            after = await asyncio.to_thread(M.settled_snapshot, self.mclient, self.before, ok,
                                            self.s.settle_timeout_s)
            view = vllm_window(self.before, after)
            server = {"vllm": view, "preemptions": view.get("preemptions") if view else None}
        if self.sampler is not None:
            self.sampler.stop()
            sampler = self.sampler
            server.update(kv_cache_peak_pct=sampler.kv_peak, running_peak=sampler.running_peak,
                          waiting_peak=sampler.waiting_peak, waiting_mean=sampler.waiting_mean)
        if self.mclient is not None:
            self.mclient.close()
        return server

    def stop_reason(self) -> str:
        """The first reason given; server_down where every request failed in transport."""
        outcomes = self.monitor.outcomes
        stop_reason = self.reason[0] if self.reason else "cancelled"
        if stop_reason != "cancelled" and outcomes and not any(o.ok for o in outcomes) and all(
                o.error_kind in TRANSPORT_KINDS for o in outcomes):
            stop_reason = "server_down"
        return stop_reason

    async def checked_stop(self) -> tuple[str, str | None]:
        """The stop reason, a server_down asked of the server first. Transport
        failures in a row come from a server that is gone, but also from one
        that drops connections while it stays up, or from our own client
        standing still past its 5 s connect timeout (a starved CI box ended a
        search "server down" against a live stand-in). A server that answers
        /v1/models now failed this level on errors (the search goes on);
        the note says so."""
        stop = self.stop_reason()
        if stop != "server_down" or not await asyncio.to_thread(server_answers, self.owner.url,
                                                                self.owner.api_key):
            return stop, None
        kinds = Counter(str(o.error_kind) for o in self.monitor.outcomes if o.error_kind in TRANSPORT_KINDS)
        said = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        return "errors", (f"requests failed in transport ({said}) but the server answered /v1/models after them: "
                          f"the level is failed on those errors, not read as a server that is down")

    def note_client(self, res: C.LevelResult) -> tuple[int, float]:
        """The client's own figures on the result: loop lag, GC, judging,
        prompts built; and the late sends (count, worst lag in s)."""
        if self.procs is not None:
            # The loops that timed the streams were the stream processes': theirs, pooled.
            totals = self.totals
            lags = [x for t in totals for x in t.lags]
            res.client_gc_pause_max_ms = round(max((t.gc_pause_max_s for t in totals), default=0.0) * 1000.0, 3)
            res.client_gc_full = sum(t.gc_full for t in totals)
            res.client_loop = totals[0].loop if totals else None
            res.client_procs = len(totals)
            res.client_procs_cpu_s = [round(t.cpu_s, 3) for t in totals]
            late_n = sum(t.late_sends for t in totals)
            late_max = max((t.late_send_max_s for t in totals), default=0.0)
        else:
            health = self.health
            lags = health.lags
            res.client_gc_pause_max_ms = round(health.gc_pause_max_s * 1000.0, 3)
            res.client_gc_full = health.gc_count[2]
            res.client_loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
                else "asyncio"
            res.client_procs = 1
            streams = self.streams
            late_n, late_max = (streams.late_n, streams.late_max) if streams is not None else (0, 0.0)
        res.client_lag_p99_ms = S.ms(stats.percentile(lags, 99))
        res.client_lag_max_ms = S.ms(max(lags)) if lags else None
        res.client_judge_max_ms = round(self.judge.slowest_s * 1000.0, 3)
        res.client_built_during, res.client_build_s = self.prompts.built_n, round(self.prompts.built_s, 3)
        return late_n, late_max

    def warn_client(self, res: C.LevelResult, late_n: int, late_max: float) -> None:
        """Warnings where the client, not the server, may have shaped the figures."""
        built_n, built_s = self.prompts.built_n, self.prompts.built_s
        if res.client_lag_max_ms is not None and res.client_lag_max_ms > 50.0:
            beside = f"; beside it: GC pauses up to {res.client_gc_pause_max_ms:.0f} ms, the slowest judgement " \
                     f"{res.client_judge_max_ms:.0f} ms" + (f", {built_n} prompts built in {built_s:.2f} s"
                                                            if built_n else "")
            res.warnings.append(f"the load generator's own loop stalled up to {res.client_lag_max_ms:.0f} ms "
                                f"(p99 {res.client_lag_p99_ms or 0:.1f} ms): its token gaps may read long{beside}")
        wl = self.owner.workload
        if wl.built_when_dry > self.prompts.dry_before:
            res.warnings.append(f"{wl.built_when_dry - self.prompts.dry_before} prompts were built during the level, "
                                f"on the loop that times the streams: the prompts built ahead ran out")
        if self.room is not None and (res.running_peak is None or res.running_peak >= self.conns):
            res.warnings.append(self.room.capped(self.conns))
        if self.rate:
            res.late_sends, res.late_send_max_ms = late_n, round(late_max * 1000.0, 3)
            if late_n:
                res.warnings.append(f"{late_n} requests were sent more than {C.LATE_SEND_S * 1000:.0f} ms after "
                                    f"their time (up to {late_max * 1000:.0f} ms): the client could not keep up")


class ThreadJudge:
    """The monitor judged in a worker thread: while a judgement runs, the
    requests' starts and ends wait here and are fed to the monitor after it,
    so the monitor only ever has one thread in it.

    Why a thread: a level's verdict takes its 100,000+ token gaps: tens of ms
    of work that, on the loop, would hold up every stream's next token gap (on
    an H200 our ITL p99 read 44-115 ms where vLLM's and the bench client's read
    23-49 at the same concurrency, with the level judged on the loop at every
    answer). In a thread the loop gets its turn every few ms (the
    interpreter's switch interval; numpy's sort lets go of the GIL)."""

    def __init__(self) -> None:
        self.held: list[Callable[[], None]] = []
        self.judging = False
        self.slowest_s = 0.0

    def feed(self, step: Callable[[], None]) -> None:
        if self.judging:
            self.held.append(step)
        else:
            step()

    async def run(self, fn: Callable[[float], Any], now: float) -> Any:
        self.judging = True
        t = time.perf_counter()
        try:
            return await asyncio.to_thread(fn, now)
        finally:
            self.slowest_s = max(self.slowest_s, time.perf_counter() - t)
            self.judging = False
            steps = self.held[:]
            self.held.clear()
            for step in steps:
                step()


class PromptsAhead:
    """The level's prompts, built ahead in a worker thread when fewer than
    two levels' widths are left: a level can send more than ensure() asked
    for (warm-up, windows not counted, the confirmation), and one built on
    the loop holds up every stream in flight (on an H200 a run of them
    stalled the loop for 9-20 s and read as TTFTs of 10-20 s)."""

    def __init__(self, workload: Workload, width: int) -> None:
        self.wl = workload
        self.refill: list[asyncio.Future[None]] = []
        self.low, self.batch = 2 * width + 16, 4 * width + 64
        self.built_n, self.built_s = 0, 0.0  # prompts built during the level in a worker thread, and the seconds
        self.dry_before = workload.built_when_dry  # prompts built on the loop, the ahead ones gone, before the level

    def take(self, n: int) -> list[WorkItem]:
        out = [self.wl.take() for _ in range(n)]
        self.keep_ahead()
        return out

    def keep_ahead(self) -> None:
        if self.wl.more is not None and not self.refill and self.wl.left < self.low:
            self.refill.append(asyncio.ensure_future(self._build_more()))

    async def _build_more(self) -> None:
        t = time.perf_counter()
        try:
            items = await asyncio.to_thread(self.wl.build, self.batch)
            self.wl.extend(items)
            self.built_n += len(items)
        except Exception:  # noqa: BLE001 - take() builds on the loop and raises it there
            pass
        finally:
            self.built_s += time.perf_counter() - t
            self.refill.clear()

    async def settle(self) -> None:
        """A refill still building finishes (before the next level's ensure())."""
        await asyncio.gather(*self.refill, return_exceptions=True)


class LevelStreams:
    """A level's streams in this process (without stream processes): a
    closed loop's workers, each sending its next request as soon as its
    previous one ends, or an open loop's sender, on the arrival schedule
    whether or not earlier ones have finished (a send more than
    C.LATE_SEND_S behind its time counted late)."""

    def __init__(self, path: LevelPath, client: Any) -> None:
        self.path = path
        self.client = client
        self.tasks: set[asyncio.Future[None]] = set()
        self.feeder: asyncio.Future[None] | None = None
        self.late_n = 0  # sends behind schedule
        self.late_max = 0.0  # the worst lag (s)

    def start(self) -> None:
        if self.path.rate:
            self.feeder = asyncio.ensure_future(self.sender())
        else:
            for _ in range(int(self.path.load)):
                self.tasks.add(asyncio.ensure_future(self.worker()))

    async def one(self) -> None:
        path, s = self.path, self.path.s
        item = path.prompts.take(1)[0]
        t_s = time.perf_counter() - path.t0
        path.on_started(t_s)
        res = await stream_request(self.client, path.owner.url, level_request(s, item), path.owner.model,
                                   read_timeout=s.read_timeout_s, total_timeout=s.request_timeout_s)
        path.on_outcome(request_outcome(res, t_s, time.perf_counter() - path.t0))

    async def worker(self) -> None:  # closed loop: one slot
        while not self.path.stop.is_set():
            await self.one()

    async def sender(self) -> None:  # open loop: on schedule
        path, stop = self.path, self.path.stop
        owner = path.owner
        seed = owner.seed * 1009 + owner._levels
        curve = getattr(owner, "curve", None)
        stream = curve_stream(curve, float(path.load), seed=seed) if curve is not None else \
            arrival_stream(float(path.load), owner.arrivals, seed=seed, burstiness=getattr(owner, "burstiness", 1.0))
        for due in stream:
            if stop.is_set():
                return
            delay = due - (time.perf_counter() - path.t0)
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except asyncio.TimeoutError:
                    pass
            lag = (time.perf_counter() - path.t0) - due
            if lag > C.LATE_SEND_S:
                self.late_n += 1
                self.late_max = max(self.late_max, lag)
            t = asyncio.ensure_future(self.one())
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def cancel(self) -> None:
        """Cancel what is in flight, and wait for it to end."""
        pending: list[asyncio.Future[None]] = list(self.tasks) + ([self.feeder] if self.feeder is not None else [])
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
