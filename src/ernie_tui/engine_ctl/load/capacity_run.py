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

The path of one level, top to bottom, is level_path.py's LevelPath; the
server's side of it (the /metrics sampler, vLLM's figures), level_server.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.burst import BurstConfig
from ernie_tui.engine_ctl.load.http_client import ServedModel, base_url, fast_loop_factory, resolve_model
from ernie_tui.engine_ctl.load.http_errors import ProbeFailure
from ernie_tui.engine_ctl.load.level_path import LevelPath, Progress, RequestSettings
from ernie_tui.engine_ctl.load.level_procs import LevelProcs
from ernie_tui.engine_ctl.load.level_server import MetricsSampler as _MetricsSampler  # noqa: F401 - its old name here
from ernie_tui.engine_ctl.load.open_files import make_room
from ernie_tui.engine_ctl.load.prompts import find_tokenizer
from ernie_tui.engine_ctl.load.server_cpu import cpu_bound_note, server_pid
from ernie_tui.engine_ctl.load.traffic import TrafficProfile
from ernie_tui.engine_ctl.load.traffic_replay import RateCurve, curve_of
from ernie_tui.engine_ctl.load.workload import Workload, burst_workload

# -- the level runner ------------------------------------------------------------

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


class HttpLevelRunner:
    """A LevelRunner (concurrency -> LevelResult) against a live server:
    closed loop. HttpRateRunner is its open-loop twin (rate -> LevelResult)."""

    open_loop = False

    def __init__(self, url: str, model: str, workload: Workload, slo: list[S.Objective],
                 rules: C.LevelRules | None = None, settings: RequestSettings | None = None, *,
                 api_key: str | None = None, use_metrics: bool = True,
                 cancel: threading.Event | None = None, progress: Progress | None = None,
                 arrivals: str = C.DEFAULT_ARRIVALS, seed: int = 0,
                 metrics_feed: M.MetricsFeed | None = None, server_pid: int | None = None,
                 burstiness: float = 1.0, curve: RateCurve | None = None) -> None:
        self.url = url
        self.burstiness = burstiness  # an open loop's gamma shape (a traffic profile's; 1: Poisson)
        # A traffic profile's rate curve: an open loop's level at rate R sends
        # along it, scaled to a mean of R, from its start (traffic_replay).
        self.curve = curve
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

    def _expected_requests(self, load: float, rules: C.LevelRules) -> int:
        """Prompts to build before the level: the most it usually sends.

        Past this less two turnovers, the level builds more in a worker
        thread, and that costs the streams: on an H200 every one of 12
        levels that crossed that mark (sending 12.2-13.4 x its concurrency,
        against 6 x uncounted allowed here then) had its loop stand still for
        135-318 ms, and none of the 24 that did not for more than 90 ms
        (docs/lab/capacity-h200/2026-12-02-run04.md, fourth run). So the margin covers the most
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
        """One level (min_requests: the search's confirmation, at least this
        many counted): its path, top to bottom, is level_path.LevelPath's."""
        return await LevelPath(self, load, min_requests).run()


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
    config = _config_dict(search_config, rules, settings)
    if no_room:
        return _not_started(f"the search did not start: {no_room}", slo, t0, config, url, model)
    try:
        served: ServedModel = resolve_model(url, model, api_key)
        if workload is None:
            # The first level's prompts; each level builds what it needs next.
            tok = tokenizer or find_tokenizer(None, None, url, served.id, api_key)
            workload = burst_workload(burst_config or BurstConfig(), tok,
                                      size=max(rules.max_requests + 2 * search_config.start, 64))
    except ProbeFailure as exc:
        return _not_started(f"the search did not start: {exc.error.message}", slo, t0, config, url, model)
    longest = max((i.prompt_tokens or 0) + i.max_tokens for i in workload.items)
    if served.max_model_len and longest > served.max_model_len:
        warnings.append(f"the longest prompt plus max_tokens exceeds the model's max_model_len "
                        f"({served.max_model_len}): such requests fail and count as misses")
    kind = HttpRateRunner if search_config.rate else HttpLevelRunner
    runner = kind(url, served.id, workload, slo, rules, settings, api_key=api_key, use_metrics=use_metrics,
                  cancel=cancel, progress=progress, arrivals=search_config.arrivals, metrics_feed=metrics_feed,
                  server_pid=server_pid(url),
                  burstiness=burst_config.burstiness if burst_config is not None and burst_config.traffic else 1.0,
                  curve=_curve(burst_config))
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
    result.warnings = warnings + _search_warnings(result, workload, runner.metrics_missing) + result.warnings
    return result


def _curve(burst_config: BurstConfig | None) -> RateCurve | None:
    """A replayed profile's rate curve, where its arrivals are replayed so."""
    if burst_config is None or not burst_config.traffic:
        return None
    return curve_of(TrafficProfile.from_dict(burst_config.traffic), burst_config.traffic_arrivals)


def _not_started(message: str, slo: list[S.Objective], t0: float, config: dict[str, Any], url: str,
                 model: str | None) -> C.CapacityResult:
    """The result of a search that could not start (no server, no tokenizer, no room)."""
    return C.CapacityResult(slo=S.describe(slo), capacity=None, levels=[], stop_reason="server_down",
                            stop_message=message, seconds=time.monotonic() - t0,
                            config={**config}, url=base_url(url), model=model, warnings=[message])


def _search_warnings(result: C.CapacityResult, workload: Workload, metrics_missing: bool) -> list[str]:
    """What the whole search's figures should be read with: prompts repeated,
    prefix-cache hits, no /metrics, a server bound by its CPU."""
    warnings: list[str] = []
    if workload.wraps:
        warnings.append(f"the workload's {workload.built} prompts were used {workload.wraps + 1} times over; "
                        "repeated prompts can hit vLLM's prefix cache and look faster")
    hits = sum((lv.vllm or {}).get("prefix_cache_hit_tokens") or 0 for lv in result.levels)
    if hits:
        warnings.append(f"vLLM's prefix cache served {hits:,.0f} prompt tokens during the levels: prompts that "
                        "share a prefix (or repeat) make TTFT and capacity look better than fresh traffic")
    if metrics_missing:
        warnings.append("/metrics could not be read: no KV-cache, queue or vLLM figures, no saturation check")
    cpu_bound = cpu_bound_note(result.levels)
    if cpu_bound:
        warnings.append(cpu_bound)
    return warnings


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
