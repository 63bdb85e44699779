"""The capacity search against a live server: the HTTP level runners and run_capacity.

One level is either
- a closed loop at concurrency C (HttpLevelRunner): C workers, each sends
  its next request as soon as its previous one ends; or
- an open loop at a rate R req/s (HttpRateRunner): requests sent on a
  schedule (arrivals.arrival_stream: Poisson or evenly spaced), whether or not earlier
  ones have finished; a send more than 10 ms behind its time is counted late,
  as production traffic does not wait for the server,
each request through the probe's streaming client (probe.stream_request:
per-token timing). A LevelMonitor (capacity.py) discards the warm-up, cuts
the rest into windows and says when the level has seen enough; the requests
still in flight then belong to a window that is not counted, and are
cancelled (vLLM aborts them) rather than drained at a lighter load. vLLM's
/metrics is read for the level: histogram deltas (TTFT, ITL, e2e) as the
burst's VllmView does, and, sampled while the level ran, the KV-cache peak,
running/waiting peaks and the mean waiting queue.

Prompts come from a Workload (workload.py): built exact-length prompts that
never repeat, or a JSONL file of real prompts.

Not exposed by probe/burst and so written here: the /metrics sampler with a
waiting-queue mean, and the settled closing scrape (burst keeps both private).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load import stats
from ernie_tui.engine_ctl.load.arrivals import arrival_stream
from ernie_tui.engine_ctl.load.burst import BurstConfig, ClientHealth
from ernie_tui.engine_ctl.load.http_client import (
    ServedModel,
    base_url,
    fast_loop_factory,
    new_async_client,
    resolve_model,
)
from ernie_tui.engine_ctl.load.http_errors import TRANSPORT_KINDS, ProbeFailure
from ernie_tui.engine_ctl.load.level_procs import ChildTotals, LevelProcs, closed_specs, open_specs, request_outcome
from ernie_tui.engine_ctl.load.open_files import make_room
from ernie_tui.engine_ctl.load.probe import stream_request
from ernie_tui.engine_ctl.load.prompts import find_tokenizer
from ernie_tui.engine_ctl.load.server_cpu import ServerCpuWatch, cpu_bound_note, server_pid
from ernie_tui.engine_ctl.load.stream_timing import ProbeRequest
from ernie_tui.engine_ctl.load.workload import WorkItem, Workload, burst_workload

# -- the server's side of a level -------------------------------------------------

class _MetricsSampler(threading.Thread):
    """Polls running/waiting/KV usage while a level runs (a thread: the scrape
    is a blocking call that must not stall the loop timing the streams). It
    owns its client and closes it when it ends: a scrape under way when the
    level ends may outlast stop()'s wait."""

    def __init__(self, client: M.MetricsClient, interval: float, feed: M.MetricsFeed | None = None) -> None:
        super().__init__(name="capacity-sampler", daemon=True)
        self.scrapes = M.LoadScrapes(client, feed)  # the dashboard's scrapes, read instead of ours while fresh
        self.interval = interval
        self.halt = threading.Event()
        self.kv_peak: float | None = None
        self.running_peak: float | None = None
        self.waiting_peak: float | None = None
        self.waiting_sum = 0.0
        self.waiting_n = 0

    def run(self) -> None:
        try:
            self._poll()
        finally:
            self.scrapes.client.close()

    def _poll(self) -> None:
        while not self.halt.is_set():
            snap = self.scrapes.next()  # None: nothing new (a snapshot is counted once)
            if snap is not None:
                for attr, value in (("kv_peak", snap.kv_cache_usage_pct), ("running_peak", snap.running),
                                    ("waiting_peak", snap.waiting)):
                    if value is not None:
                        old = getattr(self, attr)
                        setattr(self, attr, value if old is None else max(old, value))
                if snap.waiting is not None:
                    self.waiting_sum += snap.waiting
                    self.waiting_n += 1
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)

    @property
    def waiting_mean(self) -> float | None:
        return self.waiting_sum / self.waiting_n if self.waiting_n else None


def vllm_window(before: M.MetricsSnapshot | None, after: M.MetricsSnapshot | None) -> dict[str, float | None] | None:
    """vLLM's own figures for the window between two scrapes, in ms."""
    if before is None or after is None:
        return None

    def q(h: M.Histogram | None, p: float) -> float | None:
        v = h.quantile(p) if h is not None else None
        return None if v is None else v * 1000.0

    ttft = M.histogram_delta(before, after, M.TTFT)
    itl = M.histogram_delta(before, after, M.ITL)
    e2e = M.histogram_delta(before, after, M.E2E)
    # Time in vLLM's waiting queue (a mean: its buckets are coarse at the
    # low end): whether the TTFT a client read was the server queueing. On
    # an H200 our 512-stream levels and the bench client's runs at 512 read
    # TTFT p99 0.2 and 1.4-2.1 s (eighteenth run), and nothing said which load queued.
    queue = M.histogram_delta(before, after, M.QUEUE)
    return {
        "ttft_p50_ms": q(ttft, 0.5), "ttft_p99_ms": q(ttft, 0.99),
        "ttft_mean_ms": None if ttft is None or ttft.mean is None else ttft.mean * 1000.0,
        "itl_p50_ms": q(itl, 0.5), "itl_p99_ms": q(itl, 0.99),
        "itl_mean_ms": None if itl is None or itl.mean is None else itl.mean * 1000.0,
        "e2e_p50_ms": q(e2e, 0.5), "e2e_p99_ms": q(e2e, 0.99),
        "queue_mean_ms": None if queue is None or queue.mean is None else queue.mean * 1000.0,
        "requests_finished": M.counter_delta(before, after, M.REQUEST_SUCCESS),
        "generation_tokens": M.counter_delta(before, after, M.GENERATION_TOKENS),
        "preemptions": M.counter_delta(before, after, M.PREEMPTIONS),
        # Prompt tokens served from vLLM's prefix cache: more than none with
        # built prompts would mean repeats made the level look faster.
        "prefix_cache_hit_tokens": M.counter_delta(before, after, M.PREFIX_HITS),
        "window_s": M.elapsed(before, after),
    }


# -- the level runner ------------------------------------------------------------

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


def request_setup(*, min_tokens: int = 30, max_tokens_in: int = 300, max_tokens: int = 128,
                  min_output_tokens: int | None = None,
                  ignore_eos: bool = True, chat: bool = False, temperature: float | None = None,
                  top_p: float | None = None, seed: int = 0, word_seed: int | None = None,
                  read_timeout_s: float = 120.0,
                  ) -> tuple[Any, RequestSettings]:
    """The shape of the built prompts (a BurstConfig) and the request
    settings of a search, from the one set of options both come from (the
    command line's, the dashboard's fields). ValueError in plain words.

    Like a burst, a search sends no temperature/top_p unless given (the
    server's defaults, as vLLM's bench client: a top_p below 1 makes vLLM sort
    the vocabulary at every step, a heavier load than the bench client's), and
    with min_output_tokens draws each request's max_tokens from
    [min_output_tokens, max_tokens], as the bench client's range ratio does."""
    cfg = BurstConfig(n=1, min_tokens=min_tokens, max_tokens_in=max_tokens_in, max_tokens=max_tokens,
                      min_output_tokens=min_output_tokens,
                      ignore_eos=ignore_eos, temperature=temperature, top_p=top_p, seed=seed,
                      word_seed=word_seed, chat=chat)
    cfg.validate()
    settings = RequestSettings(chat=chat, temperature=temperature, top_p=top_p, ignore_eos=ignore_eos,
                               read_timeout_s=read_timeout_s)
    return cfg, settings


Progress = Callable[[dict[str, Any]], None]


class HttpLevelRunner:
    """A LevelRunner (concurrency -> LevelResult) against a live server:
    closed loop. HttpRateRunner is its open-loop twin (rate -> LevelResult)."""

    open_loop = False

    def __init__(self, url: str, model: str, workload: Workload, slo: list[S.Objective],
                 rules: C.LevelRules | None = None, settings: RequestSettings | None = None, *,
                 api_key: str | None = None, use_metrics: bool = True,
                 cancel: threading.Event | None = None, progress: Progress | None = None,
                 arrivals: str = C.DEFAULT_ARRIVALS, seed: int = 0,
                 metrics_feed: M.MetricsFeed | None = None, server_pid: int | None = None) -> None:
        self.url = url
        self.server_pid = server_pid  # a server on this machine: its CPU is read per level
        self.model = model
        self.workload = workload
        self.slo = slo
        self.rules = rules or C.LevelRules()
        self.settings = settings or RequestSettings()
        self.api_key = api_key
        self.use_metrics = use_metrics
        self.cancel = cancel
        self.progress = progress
        self.arrivals = arrivals
        self.seed = seed
        self.metrics_feed = metrics_feed  # the dashboard's scrapes, read while fresh (LatestScrape.feed)
        self.metrics_missing = False
        self.server_warmed = False
        self._levels = 0
        self._procs: LevelProcs | None = None
        if self.settings.client_procs > 1:
            self._procs = LevelProcs(self.settings.client_procs, url, model, api_key, self.settings.read_timeout_s,
                                     self.settings.request_timeout_s)

    def close(self) -> None:
        """End the level's stream processes, if it has any (idempotent)."""
        if self._procs is not None:
            self._procs.close()

    def __call__(self, load: Any, min_requests: int | None = None) -> C.LevelResult:
        # uvloop's loop when installed, as a burst's. With the collector
        # paused too (ClientHealth.start), a level of 448 streams against a
        # stand-in whose every gap is 20 ms read ITL p99 26-27 ms on 33-36 us
        # of CPU a token; on asyncio's loop with the collector running, 47-62
        # ms on 47-48 us (vLLM's bench client: 42-44 ms; bench/
        # level_client_cost.py). On an H200 at 288-512 streams such levels
        # read 51-94 ms where vLLM's own histogram read under 50.
        with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
            return runner.run(self.run_async(load, min_requests))

    def _request(self, item: WorkItem, max_tokens: int | None = None) -> ProbeRequest:
        s = self.settings
        return ProbeRequest(prompt=item.prompt, max_tokens=max_tokens or item.max_tokens,
                            temperature=s.temperature, top_p=s.top_p, chat=s.chat, ignore_eos=s.ignore_eos,
                            continuous_usage=s.continuous_usage)

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    async def _unless_cancelled(self, step: Any) -> None:
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

    def _expected_requests(self, load: float, rules: C.LevelRules) -> int:
        """Prompts to build before the level: the most it usually sends.

        Past this less two turnovers, the level builds more in a worker
        thread, and that costs the streams: on an H200 every one of 12
        levels that crossed that mark (sending 12.2-13.4 x its concurrency,
        against 6 x uncounted allowed here then) had its loop stand still for
        135-318 ms, and none of the 24 that did not for more than 90 ms
        (docs/capacity-h200.md, fourth run). So the margin covers the most
        seen, with a turnover to spare."""
        if self.open_loop:
            # A passing level lasts its warm-up, its hold (min_pass_s) and a
            # window or two more; a confirmation, its requests and as much
            # again. One the server falls behind in runs on, its windows
            # closing late: on an H200 (fifth run) a level at 152 req/s sent
            # for 17.8 s and a confirmation at 144 for 21 s, past the 18 s
            # built for, and stood still 242-366 ms while more were built. So
            # twice that, within the level's cap (unsent ones serve the next level).
            span = min(rules.time_cap_s, 2.0 * max(15.0, (rules.min_pass_s or 0.0) + 8.0))
            return int(max(load * span, rules.min_requests + load * 6.0)) + 16
        # Counted requests (8 turnovers, or the cap) plus those sent and not
        # counted: the warm-up's (~2 turnovers on an H200), the last window's
        # and the ones in flight at the end (up to 4.2 turnovers seen; the
        # counted overshot 8 turnovers by up to 1.6: 13.4 sent in all).
        return max(rules.max_requests, 8 * int(load)) + 9 * int(load)

    async def run_async(self, load: Any, min_requests: int | None = None) -> C.LevelResult:
        s = self.settings
        rate = self.open_loop
        width = max(1, int(math.ceil(load)))  # warm-up batch and connections
        rules = self.rules
        if min_requests is not None:  # the search's confirmation: at least this many counted
            rules = rules.confirming(min_requests)
        monitor = C.LevelMonitor(load, self.slo, rules, rate=rate)
        mclient = M.MetricsClient(self.url, self.api_key, timeout=s.metrics_timeout_s) if self.use_metrics else None
        stop = asyncio.Event()
        reason: list[str] = []
        in_row = 0  # transport failures in a row
        t0 = 0.0
        late_n = 0  # sends behind schedule
        late_max = 0.0  # the worst lag (s)
        tasks: set[asyncio.Future] = set()
        key = "rate" if rate else "concurrency"

        def decide(r: str) -> None:
            if not reason:
                reason.append(r)
            stop.set()

        # The monitor is judged in a worker thread (judge_in_thread): while a
        # judgement runs, the requests' starts and ends wait here and are fed
        # to the monitor after it, so the monitor only ever has one thread in it.
        held: list[Callable[[], None]] = []
        judging = False
        judge_max = 0.0  # the slowest judgement (s)

        def feed(step: Callable[[], None]) -> None:
            if judging:
                held.append(step)
            else:
                step()

        async def judge_in_thread(fn: Callable[[float], Any], now: float) -> Any:
            # A level's verdict takes its 100,000+ token gaps: tens of ms of
            # work that, on this loop, would hold up every stream's next
            # token gap (on an H200 our ITL p99 read 44-115 ms where vLLM's
            # and the bench client's read 23-49 at the same concurrency, with
            # the level judged on the loop at every answer). In a thread the
            # loop gets its turn every few ms (the interpreter's switch
            # interval; numpy's sort lets go of the GIL).
            nonlocal judging, judge_max
            judging = True
            t = time.perf_counter()
            try:
                return await asyncio.to_thread(fn, now)
            finally:
                judge_max = max(judge_max, time.perf_counter() - t)
                judging = False
                steps = held[:]
                held.clear()
                for step in steps:
                    step()

        # Prompts are built ahead, in a worker thread, when fewer than two
        # levels' widths are left: a level can send more than ensure() asked
        # for (warm-up, windows not counted, the confirmation), and one built
        # on this loop holds up every stream in flight (on an H200 a run of
        # them stalled the loop for 9-20 s and read as TTFTs of 10-20 s).
        wl = self.workload
        refill: list[asyncio.Future] = []
        refill_low, refill_batch = 2 * width + 16, 4 * width + 64
        built_n, built_s = 0, 0.0  # prompts built during the level in a worker thread, and the seconds it took

        async def build_more() -> None:
            nonlocal built_n, built_s
            t = time.perf_counter()
            try:
                items = await asyncio.to_thread(wl.build, refill_batch)
                wl.extend(items)
                built_n += len(items)
            except Exception:  # noqa: BLE001 - take() builds on the loop and raises it there
                pass
            finally:
                built_s += time.perf_counter() - t
                refill.clear()

        def keep_ahead() -> None:
            if wl.more is not None and not refill and wl.left < refill_low:
                refill.append(asyncio.ensure_future(build_more()))

        dry_before = wl.built_when_dry

        def on_started(t_s: float) -> None:
            feed(partial(monitor.started, t_s))

        def on_outcome(o: S.RequestOutcome) -> None:  # a request's end, timed here or in a stream process
            nonlocal in_row
            feed(partial(monitor.add, o))
            in_row = in_row + 1 if o.error_kind in TRANSPORT_KINDS else 0
            if in_row >= max(4, 2 * width):
                decide("server_down")
            # (the verdict: at the level loop's 0.1 s tick, in a thread; see judge_in_thread)

        async def one(client: Any) -> None:
            item = wl.take()
            keep_ahead()
            t_s = time.perf_counter() - t0
            on_started(t_s)
            res = await stream_request(client, self.url, self._request(item), self.model,
                                       read_timeout=s.read_timeout_s, total_timeout=s.request_timeout_s)
            on_outcome(request_outcome(res, t_s, time.perf_counter() - t0))

        def take(n: int) -> list[ProbeRequest]:  # prompts for a stream process
            out = [self._request(wl.take()) for _ in range(n)]
            keep_ahead()
            return out

        async def worker(client: Any) -> None:  # closed loop: one slot
            while not stop.is_set():
                await one(client)

        async def sender(client: Any) -> None:  # open loop: on schedule
            nonlocal late_n, late_max
            for due in arrival_stream(float(load), self.arrivals, seed=self.seed * 1009 + self._levels):
                if stop.is_set():
                    return
                delay = due - (time.perf_counter() - t0)
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        return
                    except asyncio.TimeoutError:
                        pass
                lag = (time.perf_counter() - t0) - due
                if lag > C.LATE_SEND_S:
                    late_n += 1
                    late_max = max(late_max, lag)
                t = asyncio.ensure_future(one(client))
                tasks.add(t)
                t.add_done_callback(tasks.discard)

        before = None
        sampler = None
        procs = self._procs
        totals: list[ChildTotals] = []
        self._levels += 1
        # New prompts for the most this level can send, built now, before anything is timed.
        self.workload.ensure(self._expected_requests(float(load), rules))
        conns = width + 2 if not rate else max(64, int(float(load) * 30) + 16)
        # A closed loop's room was made once for the search's ceiling (_fit_ceiling);
        # an open loop's in-flight set is rarely its connection cap (30 s of
        # arrivals), so it keeps to the room left, and a send past it waits.
        room = make_room(conns) if rate else None
        if room is not None and room.connections < conns:
            conns = max(1, room.connections)
        else:
            room = None  # not held to the room: nothing to say
        async with new_async_client(self.api_key, s.read_timeout_s, max_connections=conns) as client:
            if s.warmup:
                if not self.server_warmed:
                    self.server_warmed = True
                    batch = [self._request(self.workload.take()) for _ in range(width)]
                elif procs is None:
                    batch = [self._request(self.workload.warm_item, max_tokens=1)] * min(width, 64)
                else:
                    batch = []  # each stream process opens its own connections (level_procs)
                await self._unless_cancelled(asyncio.gather(*(
                    stream_request(client, self.url, req, self.model, read_timeout=s.read_timeout_s,
                                   total_timeout=s.request_timeout_s) for req in batch)))

            async def open_window() -> None:  # the level's opening /metrics scrape and its sampler
                nonlocal before, sampler
                if mclient is None:
                    return
                before = await asyncio.to_thread(mclient.try_fetch)
                if before is None:
                    self.metrics_missing = True
                else:
                    # Its own client, with the poller's short timeout: a
                    # sample lost to a slow answer is only a sample.
                    sampler = _MetricsSampler(M.MetricsClient(self.url, self.api_key), s.sample_interval_s,
                                              feed=self.metrics_feed)
                    sampler.start()

            t0_procs = 0.0
            if procs is None:
                await open_window()
            else:
                # The stream processes open their connections, then start
                # together; the window opens between the two, so their
                # warm-up requests (1-token, one prompt repeated: up to 64 a
                # process) are not in the level's vLLM figures. Opened first,
                # they were: the twentieth H200 run's records read 585,728
                # prompt tokens from vLLM's prefix cache "during the levels".
                warm = self._request(self.workload.warm_item, max_tokens=1) if s.warmup else None
                if rate:
                    specs = open_specs(float(load), procs.procs, connections=conns, arrivals=self.arrivals,
                                       seed=self.seed * 1009 + self._levels, late_s=C.LATE_SEND_S)
                else:
                    specs = closed_specs(int(load), procs.procs)
                try:
                    t0_procs = await procs.begin(specs, take(sum(sp["refill"] for sp in specs)), warm, take,
                                                 on_started, on_outcome, stop, when_ready=open_window)
                except BaseException:
                    if sampler is not None:
                        sampler.halt.set()
                        sampler.stop()
                    raise
            # The heap from before the level (prompts, tokenizer, imports,
            # earlier levels) out of the collector's reach while it runs, as
            # a burst does; the collection that precedes the freeze is untimed.
            # And no collection while the level runs (its length is capped):
            # see ClientHealth.start.
            health = ClientHealth()
            health.start(freeze=True, pause_collector=True)
            cpu_watch = ServerCpuWatch(self.server_pid) if self.server_pid is not None else None
            if cpu_watch is not None:
                cpu_watch.start()
            t0 = time.perf_counter()
            if procs is not None:
                feeder = None  # the stream processes began above; their t0 is the level's
                t0 = t0_procs
            elif rate:
                feeder = asyncio.ensure_future(sender(client))
            else:
                feeder = None
                for _ in range(int(load)):
                    t = asyncio.ensure_future(worker(client))
                    tasks.add(t)
            last_progress = 0.0
            lag_task = asyncio.ensure_future(health.watch_loop())
            try:
                while not stop.is_set():
                    if self._cancelled():
                        decide("cancelled")
                        break
                    now = time.perf_counter() - t0
                    r = await judge_in_thread(monitor.stop_reason, now)
                    if r is not None:
                        decide(r)
                        break
                    if self.progress is not None and now - last_progress >= 0.5:
                        last_progress = now
                        C.emit(self.progress, event="level_progress", **{key: load},
                               **await judge_in_thread(monitor.progress, now))
                    try:
                        await asyncio.wait_for(stop.wait(), 0.1)
                    except asyncio.TimeoutError:
                        pass
            finally:
                # What is still in flight belongs to a window that is not
                # counted: cancel it (vLLM aborts it) instead of draining it
                # at a lighter load.
                stop.set()
                lag_task.cancel()
                if procs is not None:
                    try:
                        totals = await procs.finish()
                    except BaseException:
                        health.stop()
                        if sampler is not None:
                            sampler.halt.set()
                            sampler.stop()
                        if cpu_watch is not None:
                            cpu_watch.stop()
                        raise
                pending: list[asyncio.Future] = list(tasks) + ([feeder] if feeder is not None else [])
                for fut in pending:
                    fut.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                # A refill still building finishes before the next level's ensure().
                await asyncio.gather(*refill, return_exceptions=True)
                health.stop()
        elapsed = max(time.perf_counter() - t0, 1e-9)
        server_cpu = cpu_watch.stop() if cpu_watch is not None else None
        if sampler is not None:
            sampler.halt.set()
        server: dict[str, Any] = {}
        if mclient is not None and before is not None:
            ok = sum(1 for o in monitor.outcomes if o.ok)
            after = await asyncio.to_thread(M.settled_snapshot, mclient, before, ok, s.settle_timeout_s)
            view = vllm_window(before, after)
            server = {"vllm": view, "preemptions": view.get("preemptions") if view else None}
        if sampler is not None:
            sampler.stop()
            server.update(kv_cache_peak_pct=sampler.kv_peak, running_peak=sampler.running_peak,
                          waiting_peak=sampler.waiting_peak, waiting_mean=sampler.waiting_mean)
        if mclient is not None:
            mclient.close()
        stop_reason = reason[0] if reason else "cancelled"
        if stop_reason != "cancelled" and monitor.outcomes and not any(o.ok for o in monitor.outcomes) and all(
                o.error_kind in TRANSPORT_KINDS for o in monitor.outcomes):
            stop_reason = "server_down"
        res = monitor.result(elapsed, stop_reason, server)
        res.server_cpu = server_cpu
        if procs is not None:
            # The loops that timed the streams were the stream processes': theirs, pooled.
            lags = [x for t in totals for x in t.lags]
            res.client_gc_pause_max_ms = round(max((t.gc_pause_max_s for t in totals), default=0.0) * 1000.0, 3)
            res.client_gc_full = sum(t.gc_full for t in totals)
            res.client_loop = totals[0].loop if totals else None
            res.client_procs = len(totals)
            res.client_procs_cpu_s = [round(t.cpu_s, 3) for t in totals]
            late_n = sum(t.late_sends for t in totals)
            late_max = max((t.late_send_max_s for t in totals), default=0.0)
        else:
            lags = health.lags
            res.client_gc_pause_max_ms = round(health.gc_pause_max_s * 1000.0, 3)
            res.client_gc_full = health.gc_count[2]
            res.client_loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
                else "asyncio"
            res.client_procs = 1
        res.client_lag_p99_ms = S.ms(stats.percentile(lags, 99))
        res.client_lag_max_ms = S.ms(max(lags)) if lags else None
        res.client_judge_max_ms = round(judge_max * 1000.0, 3)
        res.client_built_during, res.client_build_s = built_n, round(built_s, 3)
        if res.client_lag_max_ms is not None and res.client_lag_max_ms > 50.0:
            beside = f"; beside it: GC pauses up to {res.client_gc_pause_max_ms:.0f} ms, the slowest judgement " \
                     f"{res.client_judge_max_ms:.0f} ms" + (f", {built_n} prompts built in {built_s:.2f} s"
                                                            if built_n else "")
            res.warnings.append(f"the load generator's own loop stalled up to {res.client_lag_max_ms:.0f} ms "
                                f"(p99 {res.client_lag_p99_ms or 0:.1f} ms): its token gaps may read long{beside}")
        if wl.built_when_dry > dry_before:
            res.warnings.append(f"{wl.built_when_dry - dry_before} prompts were built during the level, on the loop "
                                f"that times the streams: the prompts built ahead ran out")
        if room is not None and (res.running_peak is None or res.running_peak >= conns):
            res.warnings.append(room.capped(conns))
        if rate:
            res.late_sends, res.late_send_max_ms = late_n, round(late_max * 1000.0, 3)
            if late_n:
                res.warnings.append(f"{late_n} requests were sent more than {C.LATE_SEND_S * 1000:.0f} ms after "
                                    f"their time (up to {late_max * 1000:.0f} ms): the client could not keep up")
        return res


class HttpRateRunner(HttpLevelRunner):
    """A LevelRunner (rate in req/s -> LevelResult): open loop, requests sent
    on the arrival schedule whether or not earlier ones have finished."""

    open_loop = True


# -- the whole search -------------------------------------------------------------

def run_capacity(url: str, slo: list[S.Objective], *, search_config: C.SearchConfig | None = None,
                 rules: C.LevelRules | None = None, settings: RequestSettings | None = None,
                 workload: Workload | None = None, burst_config: Any = None, tokenizer: Any = None,
                 model: str | None = None, api_key: str | None = None, use_metrics: bool = True,
                 progress: Progress | None = None, cancel: threading.Event | None = None,
                 metrics_feed: M.MetricsFeed | None = None,
                 level_gate: Callable[[C.LevelRunner], C.LevelRunner] | None = None) -> C.CapacityResult:
    """Search a live server's capacity under `slo`. Without a workload,
    prompts are built as a burst would (burst_config; the tokenizer is found
    as the burst finds it). metrics_feed: the dashboard's scrapes of this
    server (LatestScrape.feed), read by each level while fresh instead of
    scraping again. Blocking; call from a thread without a running event
    loop. Never raises for server trouble: the result says. level_gate
    wraps the level runner the search calls (a paired sweep's turns: its
    presets' levels alternate)."""
    search_config = search_config or C.SearchConfig()
    rules = rules or C.LevelRules()
    if search_config.rate and rules.min_pass_s is None:
        rules = replace(rules, min_pass_s=C.open_loop_hold_s(slo, search_config.tolerance, rules.time_cap_s))
    settings = settings or RequestSettings()
    search_config.validate()
    rules.validate()
    t0 = time.monotonic()
    warnings: list[str] = []
    search_config, no_room = _fit_ceiling(search_config, warnings)

    def failed(message: str) -> C.CapacityResult:
        return C.CapacityResult(slo=S.describe(slo), capacity=None, levels=[], stop_reason="server_down",
                                stop_message=message, seconds=time.monotonic() - t0,
                                config={**_config_dict(search_config, rules, settings)}, url=base_url(url),
                                model=model, warnings=[message])

    if no_room:
        return failed(f"the search did not start: {no_room}")
    try:
        served: ServedModel = resolve_model(url, model, api_key)
    except ProbeFailure as exc:
        return failed(f"the search did not start: {exc.error.message}")
    if workload is None:
        cfg = burst_config or BurstConfig()
        try:
            tok = tokenizer or find_tokenizer(None, None, url, served.id, api_key)
            # The first level's prompts; each level builds what it needs next.
            workload = burst_workload(cfg, tok, size=max(rules.max_requests + 2 * search_config.start, 64))
        except ProbeFailure as exc:
            return failed(f"the search did not start: {exc.error.message}")
    longest = max((i.prompt_tokens or 0) + i.max_tokens for i in workload.items)
    if served.max_model_len and longest > served.max_model_len:
        warnings.append(f"the longest prompt plus max_tokens exceeds the model's max_model_len "
                        f"({served.max_model_len}): such requests fail and count as misses")
    kind = HttpRateRunner if search_config.rate else HttpLevelRunner
    runner = kind(url, served.id, workload, slo, rules, settings, api_key=api_key, use_metrics=use_metrics,
                  cancel=cancel, progress=progress, arrivals=search_config.arrivals, metrics_feed=metrics_feed,
                  server_pid=server_pid(url))
    try:
        gated = level_gate(runner) if level_gate is not None else runner
        result = C.search(gated, slo, search_config, progress=progress, cancel=cancel)
    finally:
        runner.close()
    result.seconds = time.monotonic() - t0
    result.config = _config_dict(search_config, rules, settings)
    result.url = base_url(url)
    result.model = served.id
    result.workload = workload.describe()
    if workload.wraps:
        warnings.append(f"the workload's {workload.built} prompts were used {workload.wraps + 1} times over; "
                        "repeated prompts can hit vLLM's prefix cache and look faster")
    hits = sum((lv.vllm or {}).get("prefix_cache_hit_tokens") or 0 for lv in result.levels)
    if hits:
        warnings.append(f"vLLM's prefix cache served {hits:,.0f} prompt tokens during the levels: prompts that "
                        "share a prefix (or repeat) make TTFT and capacity look better than fresh traffic")
    if runner.metrics_missing:
        warnings.append("/metrics could not be read: no KV-cache, queue or vLLM figures, no saturation check")
    cpu_bound = cpu_bound_note(result.levels)
    if cpu_bound:
        warnings.append(cpu_bound)
    result.warnings = warnings + result.warnings
    return result


def _fit_ceiling(config: C.SearchConfig, warnings: list[str]) -> tuple[C.SearchConfig, str | None]:
    """The search's concurrency ceiling lowered to what the open-file limit
    holds (each stream is a socket: a level past the limit fails on "Too
    many open files", read as the server's errors), with a warning saying
    so; or why not even the start fits. An open loop's connections are
    fitted per level (HttpLevelRunner.run_async)."""
    if config.rate:
        return config, None
    room = make_room(config.max_concurrency + 2)
    if room is None or room.connections >= config.max_concurrency + 2:
        return config, None
    fits = room.connections - 2
    if fits < config.start:
        return config, room.too_few(config.start + 2)
    warnings.append(f"the highest concurrency was lowered from {config.max_concurrency:,} to {fits:,}: "
                    f"{room.too_few(config.max_concurrency + 2)}")
    return replace(config, max_concurrency=fits), None


def _config_dict(search_config: C.SearchConfig, rules: C.LevelRules, settings: RequestSettings) -> dict[str, Any]:
    from dataclasses import asdict

    return {"search": asdict(search_config), "level": asdict(rules), "requests": asdict(settings)}
