"""A load burst: N streaming requests of exact prompt lengths at concurrency C.

This is the source articles' "100 questions" test done so that the figures
can be trusted and compared between presets:
- prompt lengths are drawn uniformly from [min_tokens, max_tokens_in] with a
  fixed seed (as vLLM's random dataset draws them for the same --seed), and
  each prompt is built with the served model's own tokenizer so it is
  exactly that many tokens (checked against the server's usage);
  the same seed gives the same workload on every preset;
- ignore_eos makes every request generate exactly max_tokens tokens, so two
  runs do the same work;
- with chat=True the lengths are those of the user message; the server adds
  the chat template's tokens, which the result reports as length mismatches;
- while it runs, /metrics is sampled (KV-cache usage peak, running/waiting)
  and so is an optional memory sampler (GPU memory or engine RSS);
- afterwards vLLM's own view of the same window (its TTFT histogram and its
  generation-token counter) is put beside ours, with the differences.

Two dispatch shapes (docs/lab/load-generator.md compares them with vLLM's bench
client, `vllm bench serve`):
- closed loop (the default): C requests in flight, all C sent at once at the
  start, each refilled as soon as one ends, as `--max-concurrency C` does;
- open loop (`rate`): request i goes out at its scheduled time
  (load/arrivals.py: Poisson or constant, seeded) whether or not earlier
  ones have finished, as `--request-rate R` does; concurrency, if set, caps
  the requests in flight and a send that waits for it is late. Late sends
  are counted and their lag reported (send_lag).
With `min_output_tokens`, each request's max_tokens is drawn uniformly from
[min_output_tokens, max_tokens] (the same seed's draw), as the bench client's
`--random-range-ratio` draws them: with equal output lengths the slots of a
closed loop finish together and refill together, in synchronised waves
whose prefills never compete with decodes, a different load from the
bench client's at the same concurrency. Sampling settings default to none
(the server's defaults), as the bench client sends: a top_p below 1 costs
the server a sort of the vocabulary at every step.

Requests run on one asyncio loop with C workers pulling from a queue, over
aiohttp on uvloop (when installed): the load generator must never be the
bottleneck, and bench/client_cpu.py measured that pair at about a third of
httpx's client CPU per streamed token and below vLLM's own bench client
(docs/lab/benchmarks/client-cpu.md). A
killed server ends the burst with errors, not a hang: refused connections
fail at once, dropped streams fail at once, a wedged server trips the read
timeout, and after `max_consecutive_failures` transport failures in a row the
remaining requests are not sent at all.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psutil

from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import runstore, stats, traffic_replay
from ernie_tui.engine_ctl.load.arrivals import (
    ARRIVALS,
    DEFAULT_ARRIVALS,
    SendLag,
    arrival_offsets,
    drawn_lengths,
    send_lag,
)
from ernie_tui.engine_ctl.load.http_client import (
    ServedModel,
    base_url,
    fast_loop_factory,
    new_async_client,
    resolve_model,
)
from ernie_tui.engine_ctl.load.http_errors import TRANSPORT_KINDS, ProbeError, ProbeErrorKind, ProbeFailure
from ernie_tui.engine_ctl.load.open_files import make_room
from ernie_tui.engine_ctl.load.probe import stream_request
from ernie_tui.engine_ctl.load.prompts import BuiltPrompt, PromptBuilder, find_tokenizer
from ernie_tui.engine_ctl.load.stream_timing import ProbeRequest, ProbeResult
from ernie_tui.engine_ctl.load.traffic import TrafficProfile
from ernie_tui.engine_ctl.units import gib_str

log = logging.getLogger(__name__)

MemorySampler = Callable[[], "float | None"]
Progress = Callable[[int, int], None]

# What the warm-up requests send (built prompts are random word tokens, so
# they never share a prefix with it).
WARMUP_PROMPT = "Say hello."
# An open loop opens its connections as its sends need them; the warm-up
# pays the server's first-use costs with a few only.
WARMUP_OPEN_LOOP = 16


@dataclass
class BurstConfig:
    n: int = 100
    min_tokens: int = 30
    max_tokens_in: int = 300
    # Closed loop: requests in flight. Open loop (rate set): a cap on the
    # requests in flight, 0 for none.
    concurrency: int = 4
    max_tokens: int = 128
    # None: every request asks for max_tokens. Set: each request's max_tokens
    # is drawn uniformly from [min_output_tokens, max_tokens] (seeded by
    # `seed`), as vLLM's bench client draws its output lengths.
    min_output_tokens: int | None = None
    ignore_eos: bool = True
    # None: not sent, the server's defaults apply (what vLLM's bench client
    # sends). A probe's 0.7 / 0.9 here would make vLLM sort the vocabulary
    # (top_p) at every step: a different load.
    temperature: float | None = None
    top_p: float | None = None
    # The prompt and output lengths: the same shape run after run, and the
    # lengths vLLM's bench client draws with `--seed` of the same value.
    seed: int = 0
    # The prompts' words. None: new ones every run (new_word_seed), so a burst
    # run again on the same server is not served from vLLM's prefix cache;
    # set it to send the very same prompts again (to measure that cache).
    word_seed: int | None = None
    chat: bool = False
    read_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    sample_interval_s: float = M.LOAD_SAMPLE_INTERVAL_S  # 1 s; why not shorter: see there
    max_consecutive_failures: int | None = None  # default: 2 * concurrency
    settle_timeout_s: float = 3.0
    # The scrapes that open and close the burst's /metrics window: vLLM CPU
    # busy decoding on a loaded box took up to 11 s to answer, and a window
    # lost to a timeout loses the burst's whole vLLM view. The samples taken
    # while it runs keep the short default: a lost sample is only a sample.
    metrics_timeout_s: float = 15.0
    # Before measuring, open the C connections with one tiny request each, so
    # connection set-up and first-use costs (ours and the server's) are not
    # billed to the first requests' TTFT. Not counted anywhere.
    warmup: bool = True
    # Ask vLLM for usage in every chunk (see ProbeRequest.continuous_usage:
    # exact per-read token counts, at a throughput cost to the server).
    continuous_usage: bool = False
    # Open loop: requests per second (None: closed loop at `concurrency`),
    # the arrival process ("poisson" or "constant"), its seed and
    # burstiness (1: Poisson), see load/arrivals.py.
    rate: float | None = None
    arrivals: str = DEFAULT_ARRIVALS
    arrival_seed: int = 0
    burstiness: float = 1.0
    # A send more than this after its scheduled time counts as late.
    late_threshold_s: float = 0.010
    # Collect, then freeze what exists before the burst (prompts, tokenizer,
    # imports) out of the garbage collector's reach while it runs, so a full
    # collection does not walk it and stall the loop that timestamps tokens.
    gc_freeze: bool = True
    # A traffic profile to replay (traffic.TrafficProfile.to_dict(), kept
    # whole so the run record names what it was measured on): lengths and
    # shared prefixes drawn from it instead of the ranges above, see
    # traffic_replay.py; traffic_outputs: how its outputs end there.
    traffic: dict[str, Any] | None = None
    traffic_outputs: str = "lengths"
    # How its arrivals are replayed (traffic_replay.ARRIVAL_MODES): "curve",
    # its rate window by window, scaled to `rate`; "mean", gaps at `rate`.
    traffic_arrivals: str = "curve"

    def validate(self) -> None:
        if self.n < 1:
            raise ValueError("a burst needs at least one request")
        if not self.sample_interval_s > 0:
            raise ValueError("the /metrics sampling interval must be above 0 s")
        if self.rate is not None:
            if not self.rate > 0:
                raise ValueError("the rate must be above 0 requests/s")
            if self.concurrency < 0:
                raise ValueError("with a rate, concurrency caps the requests in flight (0: no cap)")
            if self.arrivals not in ARRIVALS:
                raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}")
            if not self.burstiness > 0:
                raise ValueError("burstiness must be above 0")
        elif self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.min_output_tokens is not None and not 1 <= self.min_output_tokens <= self.max_tokens:
            raise ValueError(f"output lengths need 1 <= min_output_tokens ({self.min_output_tokens}) "
                             f"<= max_tokens ({self.max_tokens})")
        if self.seed < 0:
            raise ValueError(f"the lengths' seed must be >= 0, got {self.seed}")
        if not 1 <= self.min_tokens <= self.max_tokens_in:
            raise ValueError(f"prompt lengths need 1 <= min ({self.min_tokens}) <= max ({self.max_tokens_in})")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.traffic is not None and self.traffic_outputs not in traffic_replay.OUTPUTS:
            raise ValueError(f"traffic_outputs must be one of {', '.join(traffic_replay.OUTPUTS)}")
        if self.traffic is not None and self.traffic_arrivals not in traffic_replay.ARRIVAL_MODES:
            raise ValueError(f"traffic_arrivals must be one of {', '.join(traffic_replay.ARRIVAL_MODES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RequestRecord:
    """One request of the burst, in the order they were planned."""

    index: int
    prompt_tokens_target: int
    max_tokens: int | None = None  # what this request asked for
    ok: bool = False
    sent: bool = False
    prompt_tokens: int | None = None  # the server's usage
    completion_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_mean_s: float | None = None
    finish_reason: str | None = None
    start_offset_s: float | None = None  # since the burst started
    end_offset_s: float | None = None
    scheduled_offset_s: float | None = None  # open loop: when it was due
    error: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VllmView:
    """What vLLM's own /metrics says about the burst window."""

    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_count: float | None = None
    itl_mean_s: float | None = None
    e2e_mean_s: float | None = None
    queue_mean_s: float | None = None
    inference_mean_s: float | None = None  # prefill + decode, in the engine's batch
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    requests_finished: float | None = None
    preemptions: float | None = None
    # generation_tokens over our burst duration: checks our token counting
    # (same clock, so any difference is tokens, not time).
    output_tps: float | None = None
    # generation_tokens over the time between the two /metrics scrapes that
    # bracket the burst: an independent clock, a little longer than the burst.
    output_tps_scrape_window: float | None = None
    metrics_window_s: float | None = None
    # Prompt tokens vLLM's prefix cache served in the window: built prompts
    # share no prefix, so more than the warm-up's means repeats flattered TTFT.
    prefix_cache_hit_tokens: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BurstResult:
    config: dict[str, Any]
    url: str
    model: str | None
    started_at: float  # wall clock
    duration_s: float
    total: int
    completed: int  # succeeded
    failed: int
    not_sent: int  # cancelled or skipped after the server went away
    cancelled: bool
    output_tokens: int
    prompt_tokens: int
    output_tps: float | None
    total_tps: float | None
    requests_per_s: float | None
    ttft: dict[str, float | None]  # seconds: count, mean, p50, p90, p99
    itl: dict[str, float | None]  # seconds: count, mean, p50, p90, p99
    latency: dict[str, float | None]  # seconds: count, mean, p50, p90, p99
    errors: dict[str, Any]  # {"count", "by_kind", "first": [messages]}
    prompt_lengths_exact: bool  # every server-counted prompt length matched its target
    prompt_length_mismatches: int
    peak_memory_bytes: float | None
    memory_source: str | None
    kv_cache_usage_peak_pct: float | None
    running_peak: float | None
    waiting_peak: float | None
    vllm: VllmView | None
    comparison: dict[str, float | None]
    warnings: list[str] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    # Open loop: how late the sends went out (arrivals.SendLag as a dict).
    send_lag: dict[str, Any] | None = None
    in_flight_peak: int = 0
    # The load generator's own health while it ran: garbage-collector
    # pauses, event-loop lag (a timer's overshoot), whether gc was frozen.
    client: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, with_requests: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if not with_requests:
            d.pop("requests", None)
        return d

    def save(self, preset: Any = None, engine_report: Any = None, notes: str | None = None) -> runstore.RunRecord:
        """Store as a 'burst' run record (runstore), tagged with the preset
        (a Preset, a dict or a name) and the engine's startup report."""
        return runstore.save_run("burst", self.to_dict(), preset=preset, engine_report=engine_report,
                                 url=self.url, model=self.model, notes=notes)


def plan_lengths(config: BurstConfig) -> list[int]:
    """The burst's prompt lengths, uniform in [min_tokens, max_tokens_in]
    from config.seed (drawn_lengths: vLLM's random dataset's draw)."""
    return _drawn(config)[0]


def plan_output_lengths(config: BurstConfig) -> list[int]:
    """Each request's max_tokens: all max_tokens, or uniform in
    [min_output_tokens, max_tokens], drawn with the prompt lengths."""
    return _drawn(config)[1]


def _drawn(config: BurstConfig) -> tuple[list[int], list[int]]:
    if config.traffic is not None:
        return traffic_replay.draw_lengths(_profile(config), config.n, config.seed, config.traffic_outputs)
    low = config.min_output_tokens if config.min_output_tokens is not None else config.max_tokens
    return drawn_lengths(config.n, (config.min_tokens, config.max_tokens_in), (low, config.max_tokens),
                         seed=config.seed)


def new_word_seed() -> int:
    """A word seed no earlier run is likely to have used."""
    return random.SystemRandom().randrange(1 << 31)


def build_prompts(config: BurstConfig, tokenizer: Any) -> list[BuiltPrompt]:
    """Prompts of the planned lengths; words from config.word_seed (callers
    that record the run set it first, see run_burst), else new ones."""
    words = config.word_seed if config.word_seed is not None else new_word_seed()
    if config.traffic is not None:
        return traffic_replay.build_prompts(_profile(config), plan_lengths(config), config.seed, words, tokenizer)
    builder = PromptBuilder(tokenizer, seed=words)
    return [builder.build(n) for n in plan_lengths(config)]


def _profile(config: BurstConfig) -> TrafficProfile:
    assert config.traffic is not None
    return TrafficProfile.from_dict(config.traffic)


class _Sampler(threading.Thread):
    """Polls /metrics and the memory sampler while the burst runs. A thread,
    not a coroutine: both are blocking calls that must not stall the loop
    that timestamps the token stream."""

    def __init__(self, client: M.MetricsClient | None, memory_sampler: MemorySampler | None,
                 interval: float, feed: M.MetricsFeed | None = None) -> None:
        super().__init__(name="burst-sampler", daemon=True)
        self.scrapes = M.LoadScrapes(client, feed) if client is not None else None
        self.memory_sampler = memory_sampler
        self.interval = interval
        self.stop_event = threading.Event()
        self.kv_peak: float | None = None
        self.running_peak: float | None = None
        self.waiting_peak: float | None = None
        self.mem_peak: float | None = None

    @property
    def samples(self) -> int:
        """Scrapes of our own while the burst ran."""
        return self.scrapes.own if self.scrapes is not None else 0

    @property
    def shared_samples(self) -> int:
        """The feed's snapshots (someone else's scrapes) it read instead."""
        return self.scrapes.shared if self.scrapes is not None else 0

    @staticmethod
    def _max(a: float | None, b: float | None) -> float | None:
        if b is None:
            return a
        return b if a is None else max(a, b)

    def sample_once(self) -> None:
        if self.scrapes is not None:
            snap = self.scrapes.next()
            if snap is not None:
                self.kv_peak = self._max(self.kv_peak, snap.kv_cache_usage_pct)
                self.running_peak = self._max(self.running_peak, snap.running)
                self.waiting_peak = self._max(self.waiting_peak, snap.waiting)
        if self.memory_sampler is not None:
            try:
                v = self.memory_sampler()
            except (OSError, psutil.Error):  # the engine exited between two looks
                v = None
            self.mem_peak = self._max(self.mem_peak, None if v is None else float(v))

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.sample_once()
                self.stop_event.wait(self.interval)
        finally:
            # Its own client, closed here: a scrape under way when the burst
            # ends may outlast stop()'s wait.
            if self.scrapes is not None:
                self.scrapes.client.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


async def watch_loop_lag(lags: list[float], tick_s: float = 0.010) -> None:
    """Until cancelled, append to `lags` how late a `tick_s` timer fires on
    this loop: the loop's own stalls, which a stream's next token waits out."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(tick_s)
        lags.append(max(0.0, time.perf_counter() - t - tick_s))


class ClientHealth:
    """The load generator's own stalls while a burst runs: garbage-collector
    pauses (gc.callbacks, any thread) and event-loop lag (how late a 10 ms
    timer fires). Also freezes the heap that exists before the burst (see
    BurstConfig.gc_freeze) and unfreezes it after."""

    TICK_S = 0.010

    def __init__(self) -> None:
        self.frozen_objects = 0
        self._froze = False
        self._paused = False  # the collector disabled by start(), to enable again
        self._t_gc: float | None = None
        self.gc_count = [0, 0, 0]
        self.gc_pause_s = [0.0, 0.0, 0.0]
        self.gc_pause_max_s = 0.0
        self.lags: list[float] = []
        # Token events and the reads that carried them: above 1 event a read,
        # the client (or the network) handed several at once, 0 apart.
        self.token_events = 0
        self.reads = 0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t_gc = time.perf_counter()
        elif self._t_gc is not None:
            d = time.perf_counter() - self._t_gc
            self._t_gc = None
            g = min(int(info.get("generation", 0)), 2)
            self.gc_count[g] += 1
            self.gc_pause_s[g] += d
            self.gc_pause_max_s = max(self.gc_pause_max_s, d)

    def start(self, freeze: bool, pause_collector: bool = False) -> None:
        """pause_collector: no automatic collection at all until stop(), for
        a run of bounded length (a capacity level: its request count and time
        are capped). Every collection, young ones too, holds up every stream's
        next token: at 448 streams on a 20 ms-step stand-in a level saw 3-13
        full collections of up to 79 ms, and young ones alone of up to 34 ms;
        with none, its peak memory was 109-110 MiB against 107-108 (the
        garbage streaming makes has few cycles to wait for)
        (bench/level_client_cost.py)."""
        if freeze:
            gc.collect()
            gc.freeze()
            self._froze = True
            self.frozen_objects = gc.get_freeze_count()
        gc.callbacks.append(self._on_gc)
        if pause_collector and gc.isenabled():
            gc.disable()
            self._paused = True

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._paused:  # after the callback is gone: the first collection after the run is not the run's
            gc.enable()
            self._paused = False
        if self._froze:
            gc.unfreeze()
            self._froze = False

    async def watch_loop(self) -> None:
        await watch_loop_lag(self.lags, self.TICK_S)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gc_frozen_objects": self.frozen_objects,
            "gc_collections": {str(g): self.gc_count[g] for g in range(3)},
            "gc_pause_total_s": sum(self.gc_pause_s),
            "gc_pause_gen2_s": self.gc_pause_s[2],
            "gc_pause_max_s": self.gc_pause_max_s,
            "loop_lag_p50_s": stats.percentile(self.lags, 50),
            "loop_lag_p99_s": stats.percentile(self.lags, 99),
            "loop_lag_max_s": max(self.lags) if self.lags else None,
            "events_per_read": self.token_events / self.reads if self.reads else None,
        }


def _vllm_view(before: M.MetricsSnapshot | None, after: M.MetricsSnapshot | None,
               duration: float) -> VllmView | None:
    if before is None or after is None:
        return None
    ttft = M.histogram_delta(before, after, M.TTFT)
    itl = M.histogram_delta(before, after, M.ITL)
    e2e = M.histogram_delta(before, after, M.E2E)
    queue = M.histogram_delta(before, after, M.QUEUE)
    inference = M.histogram_delta(before, after, M.INFERENCE)
    gen = M.counter_delta(before, after, M.GENERATION_TOKENS)
    return VllmView(
        ttft_mean_s=ttft.mean if ttft else None,
        ttft_p50_s=ttft.quantile(0.5) if ttft else None,
        ttft_p90_s=ttft.quantile(0.9) if ttft else None,
        ttft_p99_s=ttft.quantile(0.99) if ttft else None,
        ttft_count=ttft.count if ttft else None,
        itl_mean_s=itl.mean if itl else None,
        e2e_mean_s=e2e.mean if e2e else None,
        queue_mean_s=queue.mean if queue else None,
        inference_mean_s=inference.mean if inference else None,
        generation_tokens=gen,
        prompt_tokens=M.counter_delta(before, after, M.PROMPT_TOKENS),
        requests_finished=M.counter_delta(before, after, M.REQUEST_SUCCESS),
        preemptions=M.counter_delta(before, after, M.PREEMPTIONS),
        output_tps=stats.rate(gen, duration),
        output_tps_scrape_window=stats.rate(gen, M.elapsed(before, after)),
        metrics_window_s=M.elapsed(before, after),
        prefix_cache_hit_tokens=M.counter_delta(before, after, M.PREFIX_HITS),
    )


async def run_burst_async(url: str, config: BurstConfig | None = None, *,
                          prompts: list[BuiltPrompt] | None = None,
                          sends: list[tuple[float, int]] | None = None,
                          model: str | None = None, api_key: str | None = None,
                          tokenizer: Any = None, model_dir: str | None = None,
                          progress: Progress | None = None,
                          on_request: Callable[[RequestRecord], None] | None = None,
                          cancel: threading.Event | None = None,
                          memory_sampler: MemorySampler | None = None,
                          use_metrics: bool = True,
                          metrics_feed: M.MetricsFeed | None = None,
                          transport: str = "aiohttp") -> BurstResult:
    """Run a burst from inside an event loop. See run_burst.

    The steps: the served model and the prompts; the plan (each request's
    lengths, an open loop's schedule, the connections within the open-file
    room); then _BurstRun: the warm-up, the opening scrape, the sends, the
    closing scrape and the summary.

    metrics_feed: snapshots someone else already takes of this server (the
    dashboard's, LatestScrape.feed), read instead of scraping while the load
    runs; the burst scrapes for itself whenever the feed has none fresh.
    transport: new_async_client's ("aiohttp", or "httpx" as before).
    sends: with `prompts`, each request's send offset (s) and max_tokens,
    as a trace has them (an open loop: config.rate must be set, and is
    only recorded): a recorded load sent by this same client."""
    config = config or BurstConfig()
    config.validate()
    if sends is not None and (prompts is None or len(sends) != len(prompts) or config.rate is None):
        raise ValueError("sends needs prompts of the same count and an open loop (a rate)")
    warnings: list[str] = []
    served: ServedModel
    try:
        served = await asyncio.to_thread(resolve_model, url, model, api_key)
    except ProbeFailure as exc:
        return _failed_before_start(url, model, config, exc.error)
    if prompts is None:
        if config.word_seed is None:  # new words, and the record says which
            config = replace(config, word_seed=new_word_seed())
        try:
            prompts = await _build_burst_prompts(url, config, served, api_key, tokenizer, model_dir)
        except ProbeFailure as exc:
            return _failed_before_start(url, served.id, config, exc.error)
    _warn_prompts(prompts, served, config, warnings)
    metrics_client = M.MetricsClient(url, api_key, model_name=None, timeout=config.metrics_timeout_s) \
        if use_metrics else None
    plan = _BurstPlan.make(config, prompts, sends)
    no_room = plan.fit_connections(config, warnings)
    if no_room is not None:
        return _failed_before_start(url, served.id, config, no_room)
    run = _BurstRun(url, served.id, config, prompts, plan, progress=progress, on_request=on_request, cancel=cancel)
    sampler, before = await run.send(api_key, transport, metrics_client, memory_sampler, metrics_feed, warnings)
    return await run.conclude(metrics_client, before, sampler, memory_sampler, warnings)


async def _build_burst_prompts(url: str, config: BurstConfig, served: ServedModel, api_key: str | None,
                               tokenizer: Any, model_dir: str | None) -> list[BuiltPrompt]:
    """The burst's prompts, built with the served model's tokenizer (found
    as the probe finds it). ProbeFailure where no tokenizer is found."""
    if tokenizer is None:
        tokenizer = await asyncio.to_thread(find_tokenizer, model_dir, None, url, served.id, api_key)
    return await asyncio.to_thread(build_prompts, config, tokenizer)


def _warn_prompts(prompts: list[BuiltPrompt], served: ServedModel, config: BurstConfig, warnings: list[str]) -> None:
    inexact = sum(1 for p in prompts if not p.exact)
    if inexact:
        warnings.append(f"{inexact} prompt(s) could not be built to their exact length")
    if served.max_model_len and max(p.tokens for p in prompts) + config.max_tokens > served.max_model_len:
        warnings.append(f"the longest prompt plus max_tokens exceeds the model's max_model_len "
                        f"({served.max_model_len}): such requests are rejected or cut short")


@dataclass
class _BurstPlan:
    """What a burst will send: each request's record (its lengths; an open
    loop's scheduled offset), the schedule, and how many may be in flight."""

    records: list[RequestRecord]
    out_lengths: list[int]
    schedule: list[float]  # an open loop's send offsets (s); empty for a closed loop
    open_loop: bool
    cap: int  # in flight at most: the closed loop's concurrency, the open loop's cap (all when none)
    slots: int
    connections: int

    @classmethod
    def make(cls, config: BurstConfig, prompts: list[BuiltPrompt],
             sends: list[tuple[float, int]] | None = None) -> _BurstPlan:
        total = len(prompts)
        out_lengths = [m for _, m in sends] if sends is not None else plan_output_lengths(replace(config, n=total))
        records = [RequestRecord(index=i, prompt_tokens_target=p.tokens, max_tokens=out_lengths[i])
                   for i, p in enumerate(prompts)]
        open_loop = config.rate is not None
        schedule: list[float] = []
        if open_loop:
            assert config.rate is not None
            schedule = [t for t, _ in sends] if sends is not None else _schedule(config, total)
            for rec, off in zip(records, schedule, strict=True):
                rec.scheduled_offset_s = off
        # Requests in flight at most: the closed loop's concurrency, the open
        # loop's cap (0: none, every request may be in flight at once).
        cap = config.concurrency if config.concurrency > 0 else total
        slots = min(cap, total)
        # The connector's limit is the cap: an open loop without one must not
        # queue its sends behind a connection limit (a hidden late send).
        return cls(records, out_lengths, schedule, open_loop, cap, slots, connections=slots + 2)

    def fit_connections(self, config: BurstConfig, warnings: list[str]) -> ProbeError | None:
        """The connections within the open-file room; an error where a burst that must hold them all cannot."""
        room = make_room(self.connections)
        if room is not None and room.connections < self.connections:
            if config.concurrency > 0 or not self.open_loop:
                # A closed loop (or a capped open loop) would run out of files
                # part-way, its requests failing as the server's errors.
                return ProbeError(ProbeErrorKind.OPEN_FILES, room.too_few(self.connections))
            # An uncapped open loop rarely has all its requests in flight: it
            # keeps to the room, and a send beyond it waits for a connection.
            self.connections = max(1, room.connections)
            warnings.append(room.capped(self.connections))
        return None


def _schedule(config: BurstConfig, total: int) -> list[float]:
    """An open loop's send offsets: a traffic profile's rate curve where it
    is replayed (traffic_replay.curve_of), else gaps at the mean rate."""
    assert config.rate is not None
    curve = traffic_replay.curve_of(_profile(config), config.traffic_arrivals) if config.traffic else None
    if curve is not None:
        return traffic_replay.curve_offsets(curve, total, config.rate, seed=config.arrival_seed)
    return arrival_offsets(total, config.rate, config.arrivals, seed=config.arrival_seed,
                           burstiness=config.burstiness)


class _BurstRun:
    """One burst's sends and what they measured, once its plan is made."""

    def __init__(self, url: str, model: str, config: BurstConfig, prompts: list[BuiltPrompt], plan: _BurstPlan, *,
                 progress: Progress | None, on_request: Callable[[RequestRecord], None] | None,
                 cancel: threading.Event | None) -> None:
        self.url, self.model, self.config, self.prompts, self.plan = url, model, config, prompts, plan
        self.progress, self.on_request, self.cancel = progress, on_request, cancel
        self.total = len(prompts)
        self.done = 0
        self.in_flight = 0
        self.in_flight_peak = 0
        self.consecutive_failures = 0
        self.limit = config.max_consecutive_failures or 2 * max(1, plan.slots)
        self.abort_reason: str | None = None
        self.t0 = self.started_at = self.t_end_last = 0.0
        self.next_index = 0
        self.rec_itls: list[list[float]] = [[] for _ in range(self.total)]
        self.health = ClientHealth()
        self.results: list[Any] = []

    async def send(self, api_key: str | None, transport: str, metrics_client: M.MetricsClient | None,
                   memory_sampler: MemorySampler | None, metrics_feed: M.MetricsFeed | None,
                   warnings: list[str]) -> tuple[_Sampler, M.MetricsSnapshot | None]:
        """The warm-up, the opening scrape and its sampler, then every send
        until all are done, the burst aborts or it is cancelled."""
        config, health = self.config, self.health
        async with new_async_client(api_key, config.read_timeout_s, max_connections=self.plan.connections,
                                    transport=transport) as client:
            if config.warmup:
                await self._warm_up(client)
            before = metrics_client.try_fetch() if metrics_client else None
            if metrics_client is not None and before is None:
                warnings.append("/metrics could not be read: no KV-cache peak and no vLLM view")
            sampler = _Sampler(M.MetricsClient(self.url, api_key, model_name=None) if before is not None else None,
                               memory_sampler, config.sample_interval_s, feed=metrics_feed)
            sampler.start()  # its first sample is taken at once, in its own thread
            health.start(config.gc_freeze)
            lag_task = asyncio.ensure_future(health.watch_loop())
            self.t0 = time.perf_counter()
            self.started_at = time.time()
            self.t_end_last = self.t0
            self.report_progress()
            if self.plan.open_loop:
                tasks = [asyncio.ensure_future(self.scheduler(client))]
            else:
                tasks = [asyncio.ensure_future(self.worker(client)) for _ in range(self.plan.slots)]
            try:
                await self._wait_for(tasks)
            finally:
                for t in tasks:
                    t.cancel()
                lag_task.cancel()
                health.stop()
        return sampler, before

    async def _warm_up(self, client: Any) -> None:
        # Not one of the measured prompts: vLLM's prefix cache would
        # then serve that one's first blocks for free.
        config = self.config
        warm = ProbeRequest(prompt=WARMUP_PROMPT, max_tokens=1, temperature=config.temperature,
                            top_p=config.top_p, chat=config.chat)
        n_warm = self.plan.slots if not self.plan.open_loop else min(self.plan.slots, WARMUP_OPEN_LOOP)
        await asyncio.gather(*(stream_request(client, self.url, warm, self.model, read_timeout=config.read_timeout_s,
                                              total_timeout=config.request_timeout_s)
                               for _ in range(n_warm)))

    async def _wait_for(self, tasks: list[asyncio.Task[None]]) -> None:
        cancel = self.cancel
        while not all(t.done() for t in tasks):
            if cancel is not None and cancel.is_set():
                for t in tasks:
                    t.cancel()
                break
            await asyncio.wait(tasks, timeout=0.1)
        self.results = await asyncio.gather(*tasks, return_exceptions=True)

    def report_progress(self) -> None:
        if self.progress is not None:
            try:
                self.progress(self.done, self.total)
            except Exception:  # noqa: BLE001  a display callback must not end the burst; logged, not lost
                log.exception("burst progress callback failed")

    def stopping(self) -> bool:
        return self.abort_reason is not None or (self.cancel is not None and self.cancel.is_set())

    async def worker(self, client: Any) -> None:
        # Closed loop: take the next planned request as soon as one ends.
        while not self.stopping() and self.next_index < self.total:
            i = self.next_index
            self.next_index += 1
            await self.send_one(client, i)

    async def scheduler(self, client: Any) -> None:
        # Open loop: each request at its time, whatever is still running.
        sem = asyncio.Semaphore(self.plan.cap) if self.config.concurrency > 0 else None
        running: list[asyncio.Task[None]] = []

        async def capped(i: int) -> None:
            if sem is None:
                await self.send_one(client, i)
                return
            async with sem:
                if not self.stopping():
                    await self.send_one(client, i)

        try:
            for i, due in enumerate(self.plan.schedule):
                if self.stopping():
                    break
                delay = self.t0 + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                    if self.stopping():
                        break
                running.append(asyncio.ensure_future(capped(i)))
            if running:
                await asyncio.gather(*running)
        finally:
            for t in running:
                t.cancel()

    async def send_one(self, client: Any, i: int) -> None:
        config = self.config
        req = ProbeRequest(prompt=self.prompts[i].text, max_tokens=self.plan.out_lengths[i],
                           temperature=config.temperature, top_p=config.top_p, chat=config.chat,
                           ignore_eos=config.ignore_eos, continuous_usage=config.continuous_usage)
        rec = self.plan.records[i]
        rec.sent = True
        rec.start_offset_s = time.perf_counter() - self.t0
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)
        try:
            res: ProbeResult = await stream_request(client, self.url, req, self.model,
                                                    read_timeout=config.read_timeout_s,
                                                    total_timeout=config.request_timeout_s)
        finally:
            self.in_flight -= 1
        self._record(rec, res)
        self._count_failure(res)
        self.done += 1
        self.report_progress()
        if self.on_request is not None:
            try:
                self.on_request(rec)
            except Exception:  # noqa: BLE001  a display callback must not end the burst; logged, not lost
                log.exception("burst on_request callback failed")

    def _record(self, rec: RequestRecord, res: ProbeResult) -> None:
        t_now = time.perf_counter()
        self.t_end_last = max(self.t_end_last, t_now)
        rec.end_offset_s = t_now - self.t0
        rec.ok = res.ok
        rec.prompt_tokens = res.prompt_tokens
        rec.completion_tokens = res.completion_tokens
        rec.ttft_s = res.ttft_s
        rec.latency_s = res.latency_s
        rec.itl_mean_s = res.itl_mean_s
        rec.finish_reason = res.finish_reason
        rec.error = res.error.to_dict() if res.error else None
        self.rec_itls[rec.index] = res.itls
        self.health.token_events += res.token_events
        self.health.reads += res.reads

    def _count_failure(self, res: ProbeResult) -> None:
        """Transport failures in a row: past the limit, the rest is not sent."""
        if res.error is not None and res.error.kind in TRANSPORT_KINDS:
            self.consecutive_failures += 1
            if self.consecutive_failures >= self.limit and self.abort_reason is None:
                self.abort_reason = (f"stopped after {self.consecutive_failures} failed connections in a row "
                                     f"(last: {res.error.message})")
        else:
            self.consecutive_failures = 0

    async def conclude(self, metrics_client: M.MetricsClient | None, before: M.MetricsSnapshot | None,
                       sampler: _Sampler, memory_sampler: MemorySampler | None, warnings: list[str]) -> BurstResult:
        """The closing scrape, the send lag, vLLM's view, and the summary."""
        config, records = self.config, self.plan.records
        duration = max(self.t_end_last - self.t0, 1e-9)
        # Stop sampling but take the closing scrape before waiting for the sampler
        # thread: the scrape window should end as close to the burst as it can.
        sampler.stop_event.set()
        cancelled = self.cancel is not None and self.cancel.is_set()
        self._note_unfinished(warnings)
        after = None
        if metrics_client is not None and before is not None:
            ok_count = sum(1 for r in records if r.ok)
            after = await asyncio.to_thread(M.settled_snapshot, metrics_client, before, ok_count,
                                            config.settle_timeout_s)
        sampler.stop()
        if metrics_client is not None:
            metrics_client.close()
        lag = self._send_lag(warnings)
        view = _vllm_view(before, after, duration)
        if view is not None and view.prefix_cache_hit_tokens:
            warnings.append(f"vLLM's prefix cache served {view.prefix_cache_hit_tokens:,.0f} prompt tokens during "
                            "the burst: prompts that share a prefix (or repeat) make TTFT look better than fresh "
                            "traffic")
        result = _summarize(self.url, self.model, config, records, self.rec_itls, self.started_at, duration,
                            cancelled, self.abort_reason, sampler, memory_sampler, view, warnings)
        result.send_lag = lag.to_dict() if lag is not None else None
        result.in_flight_peak = self.in_flight_peak
        result.client = self.health.to_dict()
        # How often the burst scraped /metrics: each scrape is rendered by vLLM's
        # API server, the process streaming the tokens being timed.
        result.client["metrics_samples"] = sampler.samples
        result.client["metrics_samples_shared"] = sampler.shared_samples
        return result

    def _note_unfinished(self, warnings: list[str]) -> None:
        """Requests cut off by a cancel get that error; a worker's own exception a warning."""
        for rec in self.plan.records:
            if rec.sent and not rec.ok and rec.error is None:
                rec.error = ProbeError(ProbeErrorKind.CANCELLED, "cancelled while running").to_dict()
        for r in self.results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                warnings.append(f"internal error in a burst worker: {type(r).__name__}: {r}")

    def _send_lag(self, warnings: list[str]) -> SendLag | None:
        """An open loop's sends against its schedule; None for a closed loop."""
        config = self.config
        if not self.plan.open_loop:
            return None
        lag = send_lag(self.plan.schedule, [r.start_offset_s for r in self.plan.records], config.late_threshold_s)
        if lag.late:
            warnings.append(f"{lag.late} of {lag.count} requests went out more than "
                            f"{config.late_threshold_s * 1000:g} ms after their scheduled time (max "
                            f"{(lag.max_s or 0) * 1000:.0f} ms late)"
                            + (": the concurrency cap held them" if config.concurrency > 0 else ""))
        return lag


def _failed_before_start(url: str, model: str | None, config: BurstConfig, error: ProbeError) -> BurstResult:
    empty = stats.summarize([])
    return BurstResult(
        config=config.to_dict(), url=base_url(url), model=model, started_at=time.time(), duration_s=0.0,
        total=config.n, completed=0, failed=0, not_sent=config.n, cancelled=False, output_tokens=0,
        prompt_tokens=0, output_tps=None, total_tps=None, requests_per_s=None, ttft=empty, itl=empty,
        latency=empty,
        errors={"count": 1, "by_kind": {error.kind: 1}, "first": [error.message]},
        prompt_lengths_exact=False, prompt_length_mismatches=0, peak_memory_bytes=None, memory_source=None,
        kv_cache_usage_peak_pct=None, running_peak=None, waiting_peak=None, vllm=None, comparison={},
        warnings=[f"the burst did not start: {error.message}"],
    )


def _summarize(url: str, model: str, config: BurstConfig, records: list[RequestRecord],
               itls: list[list[float]], started_at: float, duration: float, cancelled: bool,
               abort_reason: str | None, sampler: _Sampler, memory_sampler: MemorySampler | None,
               vllm: VllmView | None, warnings: list[str]) -> BurstResult:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if r.sent and not r.ok]
    not_sent = [r for r in records if not r.sent]
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    all_itls = [x for r in ok for x in itls[r.index]]
    errors = _error_summary(failed, not_sent, abort_reason if not cancelled else None)
    mismatches = sum(1 for r in ok if r.prompt_tokens is not None and r.prompt_tokens != r.prompt_tokens_target)
    if mismatches:
        warnings.append(f"{mismatches} prompt(s) were counted differently by the server than by the tokenizer")
    ttft = stats.summarize(r.ttft_s for r in ok)
    itl = stats.summarize(all_itls)
    latency = stats.summarize(r.latency_s for r in ok)
    output_tps = stats.rate(out_tokens, duration) if ok else None
    comparison = _vllm_comparison(vllm, ttft["mean"], out_tokens, output_tps, len(ok), warnings)
    mem_source = getattr(memory_sampler, "source", None) or getattr(memory_sampler, "label", None)
    return BurstResult(
        config=config.to_dict(),
        url=base_url(url),
        model=model,
        started_at=started_at,
        duration_s=duration,
        total=len(records),
        completed=len(ok),
        failed=len(failed),
        not_sent=len(not_sent),
        cancelled=cancelled,
        output_tokens=out_tokens,
        prompt_tokens=prompt_tokens,
        output_tps=output_tps,
        total_tps=stats.rate(out_tokens + prompt_tokens, duration) if ok else None,
        requests_per_s=stats.rate(len(ok), duration) if ok else None,
        ttft=ttft,
        itl=itl,
        latency=latency,
        errors=errors,
        prompt_lengths_exact=bool(ok) and mismatches == 0,
        prompt_length_mismatches=mismatches,
        peak_memory_bytes=sampler.mem_peak,
        memory_source=str(mem_source) if mem_source else None,
        kv_cache_usage_peak_pct=sampler.kv_peak,
        running_peak=sampler.running_peak,
        waiting_peak=sampler.waiting_peak,
        vllm=vllm,
        comparison=comparison,
        warnings=warnings,
        requests=records,
    )


def _error_summary(failed: list[RequestRecord], not_sent: list[RequestRecord],
                   abort_reason: str | None) -> dict[str, Any]:
    """The errors by kind and the first five messages; an abort (not a
    cancel) counts the requests it left unsent as errors."""
    by_kind: dict[str, int] = {}
    first: list[str] = []
    for r in failed:
        kind = (r.error or {}).get("kind", "unknown")
        by_kind[kind] = by_kind.get(kind, 0) + 1
        msg = (r.error or {}).get("message", "")
        if msg and msg not in first and len(first) < 5:
            first.append(msg)
    if abort_reason:
        by_kind["not_sent"] = len(not_sent)
        first.append(abort_reason)
    error_count = len(failed) + (len(not_sent) if abort_reason else 0)
    return {"count": error_count, "by_kind": by_kind, "first": first}


def _vllm_comparison(vllm: VllmView | None, ttft_mean: float | None, out_tokens: int, output_tps: float | None,
                     ok_count: int, warnings: list[str]) -> dict[str, float | None]:
    """Ours beside vLLM's own view of the same window (TTFT, tokens, tok/s)."""
    if vllm is None:
        return {}
    comparison: dict[str, float | None] = {
        "ttft_mean_ours_s": ttft_mean,
        "ttft_mean_vllm_s": vllm.ttft_mean_s,
        "ttft_mean_diff_pct": _pct(stats.relative_diff(ttft_mean, vllm.ttft_mean_s)),
        "ttft_mean_diff_ms": (None if ttft_mean is None or vllm.ttft_mean_s is None
                              else (ttft_mean - vllm.ttft_mean_s) * 1000.0),
        "output_tokens_ours": float(out_tokens),
        "output_tokens_vllm": vllm.generation_tokens,
        "output_tokens_diff_pct": _pct(stats.relative_diff(float(out_tokens), vllm.generation_tokens)),
        "output_tps_ours": output_tps,
        "output_tps_vllm": vllm.output_tps,
        "output_tps_diff_pct": _pct(stats.relative_diff(output_tps, vllm.output_tps)),
        "output_tps_vllm_scrape_window": vllm.output_tps_scrape_window,
        "output_tps_scrape_window_diff_pct": _pct(stats.relative_diff(output_tps, vllm.output_tps_scrape_window)),
    }
    if vllm.requests_finished is not None and vllm.requests_finished != ok_count:
        warnings.append(f"vLLM counted {vllm.requests_finished:g} finished requests in the window, we "
                        f"counted {ok_count} (other traffic, or aborted streams)")
    return comparison


def _pct(x: float | None) -> float | None:
    return None if x is None else x * 100.0


def run_burst(url: str, config: BurstConfig | None = None, **kwargs: Any) -> BurstResult:
    """Blocking burst, for the CLI, benchmarks and worker threads.

    kwargs: prompts, sends, model, api_key, tokenizer, model_dir, progress(done,
    total), on_request(RequestRecord), cancel (threading.Event),
    memory_sampler (() -> bytes or None; an attribute `source` on it, if
    any, is reported as memory_source), use_metrics, metrics_feed
    (LatestScrape.feed: someone else's scrapes of this server, read instead
    of our own while they are fresh), transport.
    Call from a thread without a running event loop; inside one, await
    run_burst_async instead. The loop is uvloop's when it is installed.
    """
    with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
        return runner.run(run_burst_async(url, config, **kwargs))



def format_burst(r: BurstResult) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f}"

    def num(v: float | None, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v, fmt)

    cfg = r.config
    if cfg.get("rate"):
        cap = cfg.get("concurrency") or 0
        shape = (f"at {cfg['rate']:g} req/s ({cfg.get('arrivals', 'poisson')} arrivals"
                 + (f", at most {cap} in flight" if cap > 0 else "") + ")")
    else:
        shape = f"at concurrency {cfg.get('concurrency')}"
    traffic = cfg.get("traffic")
    if traffic:
        shape += f", traffic {TrafficProfile.from_dict(traffic).label()}"
    lines = [
        f"burst of {r.total} on {r.model or '-'} {shape}: "
        f"{r.completed} ok, {r.failed} failed, {r.not_sent} not sent"
        + (" (cancelled)" if r.cancelled else "") + f", {r.duration_s:.2f} s",
        (f"max_tokens {cfg.get('min_output_tokens')}..{cfg.get('max_tokens')} (drawn)   "
         if cfg.get("min_output_tokens") else "")
        + f"output {num(r.output_tps)} tok/s   total {num(r.total_tps)} tok/s   "
        f"{num(r.requests_per_s, '.2f')} req/s   ({r.output_tokens} output, {r.prompt_tokens} prompt tokens)",
        f"TTFT ms     p50 {ms(r.ttft['p50'])}  p90 {ms(r.ttft['p90'])}  p99 {ms(r.ttft['p99'])}  "
        f"mean {ms(r.ttft['mean'])}",
        f"ITL ms      p50 {ms(r.itl['p50'])}  p90 {ms(r.itl['p90'])}  mean {ms(r.itl['mean'])}",
        f"latency ms  p50 {ms(r.latency['p50'])}  p90 {ms(r.latency['p90'])}  mean {ms(r.latency['mean'])}",
        f"KV-cache usage peak {num(r.kv_cache_usage_peak_pct)} %   running peak {num(r.running_peak, 'g')}   "
        f"waiting peak {num(r.waiting_peak, 'g')}",
    ]
    if r.send_lag is not None:
        sl = r.send_lag
        lines.append(f"sends: {sl['late']} of {sl['count']} late (> {sl['threshold_s'] * 1000:g} ms), lag p50 "
                     f"{ms(sl['p50_s'])}  p99 {ms(sl['p99_s'])}  max {ms(sl['max_s'])} ms; "
                     f"peak {r.in_flight_peak} in flight")
    if r.peak_memory_bytes is not None:
        src = f" ({r.memory_source})" if r.memory_source else ""
        lines.append(f"peak memory {gib_str(r.peak_memory_bytes)}{src}")
    if r.vllm is not None:
        c = r.comparison
        lines.append(f"vLLM's view: TTFT mean {ms(r.vllm.ttft_mean_s)} ms (ours {ms(c.get('ttft_mean_ours_s'))}, "
                     f"{num(c.get('ttft_mean_diff_pct'), '+.1f')} %), output tokens "
                     f"{num(r.vllm.generation_tokens, 'g')} (ours {r.output_tokens}), output "
                     f"{num(r.vllm.output_tps)} tok/s ({num(c.get('output_tps_diff_pct'), '+.2f')} %)")
    if r.errors["count"]:
        lines.append(f"errors: {r.errors['count']} " + ", ".join(f"{k} {v}" for k, v in r.errors["by_kind"].items()))
        lines.extend(f"  {m}" for m in r.errors["first"])
    lines.extend(f"warning: {w}" for w in r.warnings)
    return "\n".join(lines)
