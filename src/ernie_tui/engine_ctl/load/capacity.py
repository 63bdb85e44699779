"""Capacity under an SLO: the highest concurrency (or, open loop, request
rate) whose requests still meet every objective, found by doubling then
bisection.

The search is pure: it calls a level runner, a function load -> LevelResult
(load: a concurrency, or a rate in req/s), and never touches the network
itself. The HTTP runners live in capacity_run.py; tests drive the search with
a simulated server.

- Doubling from `start` until a level fails (or the cap, or saturation),
  then bisection between the highest pass and the lowest fail until
  (fail - pass) / pass <= tolerance (or, for concurrency, they are neighbours).
- When the bracket closes, its lowest fail is measured once more, unless it
  was measured twice already (as the bench client's bracket asks every round
  at a level to miss): the later measurement decides, and a pass moves the
  bracket up (two such rechecks at most).
- Then the confirmation: the capacity found is measured once more, for
  `confirm_waves` turnovers of its in-flight set (closed loop 8 x C: the bench
  client's 8 waves) and at least a level's max_requests; its figures are the
  ones reported. A short level decides pass or fail soundly but its goodput
  is a few seconds' worth (it varied by half between H200 searches). A
  confirmation that fails becomes the lowest fail and the bisection goes on.
- Each level is measured in its steady state (LevelMonitor): a warm-up,
  discarded, until every request sent before the first answer came back has
  ended (the in-flight set has turned over); then back-to-back windows of
  time, each request counted in the window it was sent in and only once it
  and all of its window have ended (nothing cut off, nothing measured while
  the load drains); a verdict only after `min_windows` windows whose mean
  latencies agree within `stability` (as perf_analyzer's
  --stability-percentage), with confidence from batch means over the
  windows (slo.evaluate_blocks: requests of one window share its batches).
  A level still undecided at a cap is marked `decided: false` and goes by
  its point estimates, over all its windows and over its last min_windows
  (a level that drifted is judged where it ended). A failing level that ended undecided, or in which
  the load generator's own loop stood still for CLIENT_STALL_MS or more,
  is measured once more before it may bound the search.
- Open loop, a level passes only after limit / tolerance seconds of windows
  (open_loop_hold_s: the smallest TTFT or E2E limit): above the capacity a
  queue grows slowly, and a few seconds cannot see a tolerance step over it.
- A level passes only when its objectives pass and its attainment (share of
  good requests, vLLM's --goodput) is at least `attainment_target`: no
  capacity is reported whose attainment is below it.
- The search stops early when a passing level shows the server past
  saturation: requests queue in vLLM, output throughput no longer grows and
  TTFT climbs. More concurrency past that point only adds waiting.

Progress: `progress(event)` gets dicts as levels start, run (the runner's
"level_progress") and finish (the finished LevelResult rides along), so a UI
can draw the curve as it grows; `cancel` (a threading.Event) ends the search
after the running level.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ernie_tui.engine_ctl.load import runstore, stats
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.arrivals import ARRIVALS, DEFAULT_ARRIVALS

log = logging.getLogger(__name__)

# -- the defaults: their one home (the CLI flags, the dashboard's forms and the
#    run record read them from here) ------------------------------------------------
DEFAULT_SLO = "ttft_p99=500ms itl_p99=50ms"
DEFAULT_START = 1
# vLLM's own default max_num_seqs on a GPU of 70 GiB or more (H100, H200:
# an H200 ran 512 at once with none waiting; 256 on smaller ones). On an
# H200 with the 0.3B model seed-A answered 288 and long-doc passed 256,
# which a ceiling of 256 could only report as "≥ 256". Doubling stops at
# the first fail, so a higher ceiling costs a server under 256 nothing.
DEFAULT_MAX_CONCURRENCY = 1024
DEFAULT_START_RATE = 1.0
DEFAULT_MAX_RATE = 256.0
DEFAULT_TOLERANCE = 0.10
DEFAULT_MIN_REQUESTS = 10
DEFAULT_MAX_REQUESTS = 400
DEFAULT_LEVEL_TIME_S = 60.0
DEFAULT_CONFIDENCE = 0.95
DEFAULT_ATTAINMENT = 0.90
DEFAULT_MIN_WINDOWS = 3
DEFAULT_WINDOW_S = 1.0
DEFAULT_STABILITY = 0.15
# How close to a limit a level's percentile is worth resolving (a share of
# the limit; slo.judge_blocks): a level reading within 5 % of it is decided
# on its side of the limit once the bound backs that within the band. On an
# H200 one concurrency read ITL p99 42 and 51 ms a minute apart (50 ms
# limit), and the bench client's repeats differed as much: a band of 5 %
# is finer than what the server itself holds still to.
DEFAULT_RESOLUTION = 0.05
# The capacity level is measured once more at the end, for this many
# turnovers of its in-flight set (a closed loop's 8 x C requests: the bench
# client's 8 waves), and its figures come from that run: a level decided in a
# few seconds passes or fails soundly, but its goodput is a few seconds' worth
# and varied by half across searches on an H200. 0: no confirmation.
DEFAULT_CONFIRM_WAVES = 8
MODES = ("concurrency", "rate")
# Stops where every level up to the highest load allowed passed: the capacity
# then is that ceiling, a lower bound, not a capacity the search found.
CEILING_STOPS = ("max_concurrency", "max_rate")

STOP_REASONS = {
    "bracketed": "the highest pass and the lowest fail are within the tolerance",
    "first_level_failed": "even the lowest load misses the SLO",
    "first_level_too_few": ("the lowest load answered too few requests within a level's time to be judged: neither a "
                            "pass nor a fail (give each level more time, --level-time)"),
    "max_concurrency": "the highest concurrency allowed still meets the SLO",
    "max_rate": "the highest request rate allowed still meets the SLO",
    "saturated": "the server is past saturation: requests queue, throughput is flat and TTFT climbs",
    "server_down": "no request got through (is the server running?)",
    "cancelled": "cancelled",
}


@dataclass
class LevelRules:
    """When one level has seen enough."""

    min_requests: int = DEFAULT_MIN_REQUESTS  # measured (counted) requests before a verdict
    # The floor under any verdict: a level that runs out of time (time_cap)
    # having measured fewer requests than this is not judged at all (verdict
    # S.TOO_FEW: neither pass nor fail, no figure of the server's speed). None:
    # min_requests. A confirmation raises min_requests to its own count, and
    # keeps its level's floor (confirming()). Why: on a box saturated by another
    # job a level at 144 counted 2 requests in its minute (0.36 req/s, TTFT p99
    # 8.2 s), was judged failed, and read as the server's speed falling 98 %.
    min_judged: int | None = None
    # Counted requests at most; a closed loop gets at least 8 per slot (the
    # bench client's 8 waves).
    max_requests: int = DEFAULT_MAX_REQUESTS
    time_cap_s: float = DEFAULT_LEVEL_TIME_S
    confidence: float = DEFAULT_CONFIDENCE
    # Kept for older records and slo.evaluate's order-statistic judge.
    precision: float = 0.05
    # A level whose requests fail more often than this is failed at once.
    max_error_share: float = 0.5
    # The share of good requests (vLLM's --goodput) a passing level needs.
    attainment_target: float = DEFAULT_ATTAINMENT
    # Steady state: windows before a verdict, the shortest window (a window
    # is as long as the warm-up, one request's life under this load, within
    # [window_s, time_cap_s / 8]), and how far the windows' median latencies
    # may stray from their average for the level to count as stable.
    min_windows: int = DEFAULT_MIN_WINDOWS
    window_s: float = DEFAULT_WINDOW_S
    stability: float = DEFAULT_STABILITY
    # Open loop: seconds of measured windows before a level may pass (or stop
    # on max_requests); a fail needs no wait. None: run_capacity derives it
    # from the SLO and the search's tolerance (open_loop_hold_s); 0: none.
    min_pass_s: float | None = None
    # See DEFAULT_RESOLUTION; 0: decide on the exact limit only.
    resolution: float = DEFAULT_RESOLUTION

    def confirming(self, requests: int) -> LevelRules:
        """The rules of a confirmation (search's closing run): at least
        `requests` counted, and never fewer than a level may count at most
        (at low load 8 turnovers are a few dozen requests, too few for a p99)."""
        n = max(requests, self.max_requests)
        return replace(self, min_requests=max(self.min_requests, n), max_requests=n, min_judged=self.judged_floor)

    @property
    def judged_floor(self) -> int:
        """Measured requests below which a level that ran out of time is not judged (min_judged)."""
        return self.min_judged if self.min_judged is not None else self.min_requests

    def validate(self) -> None:
        if self.min_requests < 1 or self.max_requests < self.min_requests:
            raise ValueError("need 1 <= min requests <= max requests")
        if self.min_judged is not None and self.min_judged < 1:
            raise ValueError("a verdict needs at least 1 measured request")
        if self.time_cap_s <= 0:
            raise ValueError("the level time cap must be more than zero")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError("confidence must be within [0.5, 1)")
        if self.precision < 0:
            raise ValueError("precision must not be negative")
        if not 0.0 <= self.attainment_target <= 1.0:
            raise ValueError("the attainment target is a share between 0 and 1, e.g. 0.9")
        if self.min_windows < 2:
            raise ValueError("a verdict needs at least 2 windows")
        if self.min_pass_s is not None and self.min_pass_s < 0:
            raise ValueError("the open loop's hold before a pass must not be negative")
        if self.window_s <= 0:
            raise ValueError("the window must be more than zero seconds")
        if not 0 < self.stability < 1:
            raise ValueError("the stability is a share between 0 and 1, e.g. 0.15")
        if not 0 <= self.resolution < 0.5:
            raise ValueError("the resolution is a share of each limit, from 0 to under 0.5, e.g. 0.05")


@dataclass
class SearchConfig:
    start: int = DEFAULT_START
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    tolerance: float = DEFAULT_TOLERANCE
    # Saturation (see saturated()): queue share of concurrency, throughput
    # gain below which it counts as flat, TTFT growth that counts as climbing.
    saturation_waiting_share: float = 0.25
    saturation_tps_gain: float = 0.10
    saturation_ttft_ratio: float = 1.5
    # Open loop: search the request rate (req/s) instead of the concurrency.
    mode: str = "concurrency"
    start_rate: float = DEFAULT_START_RATE
    max_rate: float = DEFAULT_MAX_RATE
    arrivals: str = DEFAULT_ARRIVALS  # poisson | constant
    confirm_waves: int = DEFAULT_CONFIRM_WAVES  # see DEFAULT_CONFIRM_WAVES; 0: off
    # Each step up while levels pass multiplies the load by this. 2 from a
    # low start; a search that starts at a knee found earlier steps by
    # 1 + tolerance (control.paired_sweep.search_around), so a knee that
    # holds costs two levels and one that moved up is followed, not capped.
    growth: float = 2.0

    def validate(self) -> None:
        if self.confirm_waves < 0:
            raise ValueError("the confirmation's waves must not be negative (0: no confirmation)")
        if self.mode not in MODES:
            raise ValueError(f"the search mode is one of {', '.join(MODES)}")
        if self.start < 1:
            raise ValueError("the start concurrency must be at least 1")
        if self.max_concurrency < self.start:
            raise ValueError("the highest concurrency must be at least the start")
        if not 0 < self.tolerance < 1:
            raise ValueError("the tolerance is a share between 0 and 1, e.g. 0.1")
        if self.start_rate <= 0:
            raise ValueError("the start rate must be more than zero")
        if self.max_rate < self.start_rate:
            raise ValueError("the highest rate must be at least the start rate")
        if not self.growth > 1:
            raise ValueError(f"the search's growth must be above 1 (got {self.growth:g})")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals are one of {', '.join(ARRIVALS)}")

    @property
    def rate(self) -> bool:
        return self.mode == "rate"


def open_loop_hold_s(slo: Sequence[S.Objective], tolerance: float, time_cap_s: float) -> float:
    """How long an open-loop level must be measured before it may pass.

    At a rate one tolerance step over what the server keeps up with, its
    queue grows by that share of a second of work every second: a request
    arriving t seconds in waits tolerance x t longer than the first. A level
    passed sooner than limit / tolerance (the smallest TTFT or E2E limit: a
    queue's wait adds to both) cannot tell the capacity from a step over it.
    On an H200 (ttft_p99=1000ms, tolerance 0.1) 3-4 s rate levels at 128 and
    144 req/s passed where vLLM's bench client misses at 120 (TTFT p99 3.8-5.1 s
    over 10 s); each cost the search a confirmation to undo. At most half the
    level's time cap, so a level can still decide; 0 when no objective is a
    TTFT or E2E one (a queue's wait does not reach the token gaps)."""
    limits = [o.limit_s for o in slo if o.metric in ("ttft", "e2e")]
    if not limits or tolerance <= 0:
        return 0.0
    return min(min(limits) / tolerance, time_cap_s / 2.0)


def make_search(slo: Sequence[str] | str, *, start: int = DEFAULT_START,
                max_concurrency: int = DEFAULT_MAX_CONCURRENCY, tolerance: float = DEFAULT_TOLERANCE,
                min_requests: int = DEFAULT_MIN_REQUESTS, max_requests: int = DEFAULT_MAX_REQUESTS,
                level_time_s: float = DEFAULT_LEVEL_TIME_S, confidence: float = DEFAULT_CONFIDENCE,
                attainment: float = DEFAULT_ATTAINMENT, rate: bool = False,
                start_rate: float = DEFAULT_START_RATE, max_rate: float = DEFAULT_MAX_RATE,
                arrivals: str = DEFAULT_ARRIVALS, stability: float = DEFAULT_STABILITY,
                min_windows: int = DEFAULT_MIN_WINDOWS, confirm_waves: int = DEFAULT_CONFIRM_WAVES,
                resolution: float = DEFAULT_RESOLUTION,
                ) -> tuple[list[S.Objective], SearchConfig, LevelRules]:
    """The objectives, the search and the level rules from what a person
    typed (the command line's options, the dashboard's fields), checked:
    ValueError with a plain message. `slo` is a list of objectives or one
    line of them ('ttft_p99=500ms itl_p99=50ms')."""
    objectives = S.parse_slo_text(slo) if isinstance(slo, str) else S.parse_slo(slo)
    search = SearchConfig(start=start, max_concurrency=max_concurrency, tolerance=tolerance,
                          mode="rate" if rate else "concurrency", start_rate=start_rate, max_rate=max_rate,
                          arrivals=arrivals, confirm_waves=confirm_waves)
    search.validate()
    rules = LevelRules(min_requests=min_requests, max_requests=max_requests, time_cap_s=level_time_s,
                       confidence=confidence, attainment_target=attainment, stability=stability,
                       min_windows=min_windows, resolution=resolution)
    rules.validate()
    return objectives, search, rules


@dataclass
class LevelResult:
    """One level (a concurrency, or open loop a rate): our figures, the verdict, and the server's.

    The figures are over the level's measured windows (its steady state):
    `requests` counted there, `warmup_requests` sent before and discarded,
    `dropped` sent in a window not finished when the level stopped (not
    counted). ttft_p99_ms etc. are as vLLM's bench client shows them (over
    answered requests); the judged percentiles are the objectives'
    `value_ms` (a failed request counts as infinitely slow)."""

    concurrency: int | None
    requests: int  # counted (ok or failed)
    ok: int = 0
    failed: int = 0
    seconds: float = 0.0  # the measured windows' span
    requests_per_s: float | None = None
    output_tps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    attainment: float | None = None
    attainment_low: float | None = None
    attainment_high: float | None = None
    attainment_target: float | None = None
    goodput_rps: float | None = None
    goodput_output_tps: float | None = None
    # Closed loop: concurrency x tokens / latency over the answered requests
    # (Little's law), the output rate the level's streams held. The requests
    # sent inside the measured windows (window_output_tps) read the same only
    # where the sends are spread out: against a server whose requests end in
    # waves (alike lengths, all C started at once) a window holds 4 waves or
    # 5, and a short level's figure jumps by a wave (216 then 172.8 tok/s,
    # 25 %, on the paced stand-in; on an H100, 2 waves where 3 fitted: 12,136
    # tok/s against vLLM's own counter's 17,228 and the streams' 16,548). So a
    # closed-loop level's rates (requests_per_s, output_tps, goodput_*) are
    # the windows' scaled to the streams' (see _wave_free); open loop keeps
    # the windows', its sends paced by the client.
    stream_output_tps: float | None = None
    window_output_tps: float | None = None  # output tokens of the windows' requests over their span
    passed: bool = False
    decided: bool = False
    # pass | fail | undecided (at a cap; `passed` then follows the estimate) |
    # too few requests (S.TOO_FEW: not judged, not passed)
    verdict: str = S.UNDECIDED
    stop: str = ""  # decided | max_requests | time_cap | errors | server_down | cancelled
    objectives: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    kv_cache_peak_pct: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    waiting_mean: float | None = None
    preemptions: float | None = None
    vllm: dict[str, float | None] | None = None  # the server's histograms over the level's window
    warnings: list[str] = field(default_factory=list)
    # Steady state (absent from records made before it: None).
    rate: float | None = None  # open loop: the offered request rate, req/s
    elapsed_s: float | None = None  # the whole level, warm-up and the unfinished window included
    warmup_s: float | None = None
    warmup_requests: int | None = None
    dropped: int | None = None
    window_s: float | None = None
    windows: int | None = None
    stable: bool | None = None
    window_e2e_ms: list[float] | None = None  # each window's median E2E (the stability check's figures)
    # A level that stopped at a cap undecided is judged where it ended too:
    # what its last min_windows windows missed (None: nothing, or decided);
    # a level whose end misses the SLO is not a pass (LevelMonitor.end_missed).
    end_missed: str | None = None
    late_sends: int | None = None  # open loop: requests sent more than 10 ms after their time
    late_send_max_ms: float | None = None
    confirmation: bool = False  # the search's closing, longer run at its capacity
    # A second look at a load the search measured just before: "remeasure"
    # (the first said little: undecided, or our client stood still) or
    # "recheck" (the bracket's lowest fail, once more before it bounds the
    # capacity). None: a first look. Lets a run record tell the two apart.
    measured_again: str | None = None
    # The load generator's own event-loop stalls during the level (a 10 ms
    # timer's overshoot): a stalled client reads every stream's gaps long.
    client_lag_p99_ms: float | None = None
    client_lag_max_ms: float | None = None
    # What ran in the client beside the streams, for a stall to be traced:
    # the garbage collector's longest pause and its full collections (the
    # heap from before the level is frozen out of its reach, as a burst's),
    # the slowest judgement of the level (in a worker thread), and the
    # prompts built in a worker thread during the level (count, seconds).
    client_gc_pause_max_ms: float | None = None
    client_gc_full: int | None = None
    client_judge_max_ms: float | None = None
    client_built_during: int | None = None
    client_build_s: float | None = None
    # The event loop that timed the streams ("uvloop" or "asyncio"): on
    # plain asyncio the same client spent a third more CPU a token and, at
    # 448 streams of 20 ms gaps, read ITL p99 47-62 ms where uvloop's (with
    # the collector paused) read 26-27 (bench/level_client_cost.py).
    client_loop: str | None = None
    # The processes whose loops timed the streams (level_procs.py; 1: the
    # search's own) and, with more than one, each one's CPU seconds.
    client_procs: int | None = None
    client_procs_cpu_s: list[float] | None = None
    # A server on this machine: its busiest processes' CPU over the level
    # ({what, pid, cpu_pct} with cpu_pct in % of one core; server_cpu.py).
    # None: the server is elsewhere, or could not be read.
    server_cpu: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def load(self) -> float:
        """The level's load: its rate (open loop) or its concurrency."""
        return float(self.rate if self.rate is not None else (self.concurrency or 0))


LATE_SEND_S = 0.010


class LevelMonitor:
    """One level's requests, its warm-up, its windows, and when to stop.

    Pure apart from the clock it is handed: the runner calls started(t) as
    it sends a request and add(outcome) as one ends (outcome.start_s and
    end_s in seconds from the level's start), then stop_reason(now). A
    simulated runner does the same in a loop.
    """

    def __init__(self, load: float, slo: Sequence[S.Objective], rules: LevelRules, *, rate: bool = False) -> None:
        self.load = load
        self.rate = rate
        self.concurrency = None if rate else int(load)
        self.slo = list(slo)
        self.rules = rules
        self.outcomes: list[S.RequestOutcome] = []
        self.evaluation: S.Evaluation | None = None
        self.min_requests = rules.min_requests
        self.max_requests = rules.max_requests if rate else max(rules.max_requests, 8 * int(load))
        self._inflight: list[float] = []  # start times of requests in flight, sorted
        self.sent = 0
        self.first_end: float | None = None
        self.warmup_end: float | None = None
        self.window_s: float | None = None
        self.windows = 0  # complete windows
        self.stable = False
        self._gross_checked = 0
        self.gross = False  # decided failed on everything answered after the warm-up
        self._failed = 0
        self._p99s: tuple[int, float | None, float | None] | None = None  # progress(): counted, TTFT, ITL p99

    # -- feeding
    def started(self, t: float) -> None:
        bisect.insort(self._inflight, t)
        self.sent += 1

    def add(self, outcome: S.RequestOutcome) -> None:
        if outcome.start_s is not None:
            i = bisect.bisect_left(self._inflight, outcome.start_s)
            if i < len(self._inflight) and self._inflight[i] == outcome.start_s:
                self._inflight.pop(i)
            if outcome.end_s is not None and self.first_end is None:
                self.first_end = outcome.end_s
        self.outcomes.append(outcome)
        if not outcome.ok:
            self._failed += 1

    @property
    def count(self) -> int:
        return len(self.outcomes)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- the windows
    def _advance(self, now: float) -> bool:
        """Close the warm-up and every window that is over; True when a new window closed."""
        if self.warmup_end is None:
            if self.first_end is None:
                return False
            if self._inflight and self._inflight[0] < self.first_end:
                return False  # a request sent before the first answer is still out
            self.warmup_end = max((o.end_s or 0.0) for o in self.outcomes
                                  if o.start_s is not None and o.start_s < self.first_end)
            self.window_s = min(max(self.rules.window_s, self.warmup_end), max(self.rules.window_s,
                                                                              self.rules.time_cap_s / 8))
        closed = False
        assert self.window_s is not None
        while True:
            end = self.warmup_end + (self.windows + 1) * self.window_s
            if now < end or (self._inflight and self._inflight[0] < end):
                return closed
            self.windows += 1
            closed = True

    def blocks(self) -> list[list[S.RequestOutcome]]:
        """The complete windows' requests, by the window each was sent in."""
        if self.warmup_end is None or not self.windows or self.window_s is None:
            return []
        out: list[list[S.RequestOutcome]] = [[] for _ in range(self.windows)]
        for o in self.outcomes:
            if o.start_s is None or o.start_s < self.warmup_end:
                continue
            k = int((o.start_s - self.warmup_end) // self.window_s)
            if k < self.windows:
                out[k].append(o)
        return out

    def counted(self) -> list[S.RequestOutcome]:
        return [o for blk in self.blocks() for o in blk]

    def window_means(self, blocks: list[list[S.RequestOutcome]] | None = None) -> list[float | None]:
        """Each window's median E2E (a median: one request held up by a busy
        client must not make a steady level look unstable)."""
        blocks = self.blocks() if blocks is None else blocks
        out: list[float | None] = []
        for blk in blocks:
            lat = [o.latency_s for o in blk if o.ok and o.latency_s is not None]
            out.append(stats.percentile(lat, 50) if lat else None)
        return out

    def _stable(self, blocks: list[list[S.RequestOutcome]]) -> bool:
        """The last min_windows windows' median E2E each within `stability` of their average."""
        k = self.rules.min_windows
        means = self.window_means(blocks[-k:])
        if len(means) < k or any(m is None for m in means):
            return False
        vals = [m for m in means if m is not None]
        avg = sum(vals) / len(vals)
        return all(abs(v - avg) <= self.rules.stability * avg for v in vals)

    def stop_reason(self, now: float) -> str | None:
        """None while the level should go on, else why it stops."""
        n = self.count
        if n >= self.min_requests and self._failed > self.rules.max_error_share * n:
            return "errors"
        # Grossly over (even the independent-sample lower bound is past twice a
        # limit, over every request sent after the warm-up and answered so
        # far): no need to wait for the windows. Not over the warm-up's: a
        # level's opening (a client held up on a busy box, a cold server) is
        # no verdict on its steady state.
        closed = self._advance(now)
        if self.warmup_end is not None:
            after = [o for o in self.outcomes if o.start_s is not None and o.start_s >= self.warmup_end]
            m = len(after)
            if m >= max(self.min_requests, 10) and m - self._gross_checked >= max(1, m // 10):
                self._gross_checked = m
                quick = S.evaluate(after, self.slo, self.rules.confidence, 0.0)
                if any(o.verdict == S.FAIL and o.low_ms is not None and o.low_ms > 2 * o.limit_ms
                       for o in quick.objectives):
                    self.evaluation = quick
                    self.gross = True
                    return "decided"
        if closed:
            blocks = self.blocks()
            counted = sum(len(b) for b in blocks)
            if self.windows >= self.rules.min_windows and counted >= self.min_requests:
                self.stable = self._stable(blocks)
                ev = S.evaluate_blocks(blocks, self.slo, self.rules.confidence, self.rules.attainment_target,
                                       self.rules.resolution)
                self.evaluation = ev
                if ev.verdict == S.FAIL or (ev.verdict == S.PASS and self.stable and self.held()):
                    return "decided"
            if counted >= self.max_requests and self.windows >= self.rules.min_windows and self.held():
                return "max_requests"  # (never before min_windows: a level no shorter than its windows)
        if now >= self.rules.time_cap_s:
            return "time_cap"
        return None

    def end_missed(self, blocks: list[list[S.RequestOutcome]], pooled: S.Evaluation | None = None) -> str | None:
        """Where an undecided level ended up: its last min_windows windows
        judged on their own point estimates. What they missed, or None
        (nothing, or no more windows than those). Given the level's pooled
        evaluation, an end counts as missing only where it also moved away
        from it by more than `stability` (the share the windows must agree
        within): the level drifted, not just sampled its own spread.

        Why: a level that drifts (on an H200, a confirmation at 144 req/s
        whose windows' median E2E went 0.8 s, 0.9 s, ... 2.5 s, 3.6 s as the
        server fell behind) pools a calm start with a failing end, and the
        pooled p99 can still read under the limit. Its steady state, if it
        has one, is the end, as perf_analyzer reports its last windows.
        Why it must have moved: a p99 over a few windows is noisy, and a
        level whose p99 sits at the limit reads over it in about half its
        ends (on an H200, concurrency 144 and 160 read a pooled ITL p99 of 45
        and 47 ms and ends of 51 and 50 ms: both failed, and the search
        answered 136 under the bench client's [192, 224)); the ends that
        drifted read 72 and 87 ms against 30 and 29 ms pooled."""
        k = self.rules.min_windows
        if len(blocks) <= k:
            return None
        end = S.evaluate_blocks(blocks[-k:], self.slo, self.rules.confidence, self.rules.attainment_target,
                                self.rules.resolution)
        whole = {o.objective: o.value_ms for o in pooled.objectives} if pooled is not None else {}
        drift = 1.0 + self.rules.stability

        def moved(o: S.ObjectiveResult) -> bool:
            was = whole.get(o.objective)
            return o.value_ms is None or was is None or o.value_ms > was * drift
        missed = [f"{o.objective} read {'no value' if o.value_ms is None else f'{o.value_ms:.0f} ms'}"
                  for o in end.objectives
                  if o.how != "no gaps" and (o.value_ms is None or o.value_ms > o.limit_ms) and moved(o)]
        target = self.rules.attainment_target
        was_att = pooled.attainment if pooled is not None else None
        if target and end.attainment is not None and end.attainment < target \
                and (was_att is None or end.attainment < was_att * (1.0 - self.rules.stability)):
            missed.append(f"attainment {end.attainment:.2f} < {target:g}")
        return ", ".join(missed) or None

    def held(self) -> bool:
        """Measured long enough to pass (open loop: LevelRules.min_pass_s)."""
        need = self.rules.min_pass_s if self.rate else None
        return not need or (self.window_s is not None and self.windows * self.window_s >= need - 1e-9)

    def progress(self, now: float) -> dict[str, Any]:
        """A provisional view of the level for a progress display. Its p99s
        are taken again only once the counted requests grew by a tenth: a
        busy level's token gaps are 100,000+ values, and this runs while
        the level does (in a thread beside the loop that times its streams)."""
        blocks = self.blocks()
        counted = [o for b in blocks for o in b]
        ev = self.evaluation
        if self._p99s is None or len(counted) >= max(self._p99s[0] + 1, 1.1 * self._p99s[0]):
            ok = [o for o in counted if o.ok]
            self._p99s = (len(counted), S.ms(stats.percentile([o.ttft_s for o in ok if o.ttft_s is not None], 99)),
                          S.ms(S.percentile_fast(S.itl_gaps(ok), 99)))
        return {
            "phase": "warm-up" if self.warmup_end is None else "measuring",
            "requests": self.count, "counted": len(counted), "in_flight": self.inflight, "sent": self.sent,
            "elapsed_s": now, "windows": self.windows, "window_s": self.window_s,
            "ttft_p99_ms": self._p99s[1], "itl_p99_ms": self._p99s[2],
            "attainment": ev.attainment if ev is not None else None,
            "verdict": ev.verdict if ev is not None else None,
        }

    def result(self, seconds: float, stop: str, server: dict[str, Any] | None = None) -> LevelResult:
        """The level's figures over its measured windows; where none closed (a
        level failed in its warm-up, or cut short), over every answered
        request, marked not stable."""
        blocks = self.blocks()
        counted = [o for b in blocks for o in b]
        if counted and self.window_s is not None:
            span = self.windows * self.window_s
            ev = S.evaluate_blocks(blocks, self.slo, self.rules.confidence, self.rules.attainment_target,
                                   self.rules.resolution)
            if self.gross and stop == "decided":
                ev.verdict = S.FAIL  # decided on everything answered after the warm-up (grossly over)
            outcomes = counted
            self.stable = self._stable(blocks)
        else:
            span = seconds
            ev = S.evaluate(self.outcomes, self.slo, self.rules.confidence, self.rules.precision)
            if self.gross and stop == "decided":
                ev.verdict = S.FAIL
            if self.rules.attainment_target and ev.attainment is not None \
                    and ev.attainment < self.rules.attainment_target and ev.verdict == S.PASS:
                ev.verdict = S.UNDECIDED
            outcomes = self.outcomes
        if stop in ("max_requests", "time_cap") and ev.verdict == S.PASS and not (self.stable and self.held()):
            ev.verdict = S.UNDECIDED  # the bounds passed but the windows never agreed (or too soon to tell)
        too_few = stop == "time_cap" and len(outcomes) < self.rules.judged_floor
        if too_few:
            ev.verdict = S.TOO_FEW  # no verdict on so few (LevelRules.min_judged)
        end_missed = self.end_missed(blocks, ev) \
            if counted and stop in ("max_requests", "time_cap") and ev.verdict == S.UNDECIDED else None
        res = level_result(self.concurrency, outcomes, self.slo, ev, span, stop, server,
                           attainment_target=self.rules.attainment_target, end_missed=end_missed)
        res.rate = self.load if self.rate else None
        res.elapsed_s = seconds
        res.warmup_s = self.warmup_end
        res.warmup_requests = sum(1 for o in self.outcomes if o.start_s is not None and self.warmup_end is not None
                                  and o.start_s < self.warmup_end)
        res.dropped = max(0, self.sent - len(counted) - (res.warmup_requests or 0)) if counted else None
        res.window_s = self.window_s
        res.windows = self.windows
        res.stable = self.stable
        res.window_e2e_ms = [round(m * 1000.0, 3) if m is not None else math.nan for m in self.window_means(blocks)]
        if too_few:
            res.warnings.append(f"too few requests to judge: {len(outcomes)} measured in {seconds:.0f} s, under the "
                                f"{self.rules.judged_floor} a verdict needs; neither a pass nor a fail, and no "
                                f"reading of the server's speed")
        return res


def _stream_rate(concurrency: int | None, ok: Sequence[S.RequestOutcome]) -> float | None:
    """LevelResult.stream_output_tps: C streams, each at its answered
    requests' tokens over their time (None open loop, or with nothing timed)."""
    timed = [o for o in ok if o.latency_s and o.completion_tokens]
    spent = math.fsum(o.latency_s or 0.0 for o in timed)
    if not concurrency or not timed or spent <= 0:
        return None
    return concurrency * sum(o.completion_tokens or 0 for o in timed) / spent


def _wave_free(stream_tps: float | None, window_tps: float | None, failed: int) -> float:
    """The factor that brings a closed-loop level's windows' rates to its
    streams' (see LevelResult.stream_output_tps); 1.0 where either is
    missing, or where a request failed (a failed request held its stream for
    a time the streams' rate does not see)."""
    if not stream_tps or not window_tps or failed:
        return 1.0
    return stream_tps / window_tps


def level_result(concurrency: int | None, outcomes: Sequence[S.RequestOutcome], slo: Sequence[S.Objective],
                 ev: S.Evaluation, seconds: float, stop: str,
                 server: dict[str, Any] | None = None, *, attainment_target: float = 0.0,
                 end_missed: str | None = None) -> LevelResult:
    ok = [o for o in outcomes if o.ok]
    errors: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            kind = o.error_kind or "unknown"
            errors[kind] = errors.get(kind, 0) + 1
    good = [o for o in outcomes if S.request_meets(o, slo)]
    out_tokens = sum(o.completion_tokens or 0 for o in ok)
    good_tokens = sum(o.completion_tokens or 0 for o in good)
    gaps = S.itl_gaps(ok)
    tpots = [t for t in (o.tpot_s for o in ok) if t is not None]
    if stop in ("errors", "server_down", "cancelled") and ev.verdict != S.FAIL:
        verdict = S.FAIL if stop != "cancelled" else S.UNDECIDED
    else:
        verdict = ev.verdict
    decided = verdict not in (S.UNDECIDED, S.TOO_FEW)
    attained = ev.attainment is None or not attainment_target or ev.attainment >= attainment_target
    passed = verdict == S.PASS or (verdict == S.UNDECIDED and stop != "cancelled" and ev.point_pass and attained
                                   and not end_missed)
    stream_tps = _stream_rate(concurrency, ok)
    window_tps = stats.rate(out_tokens, seconds) if ok else None
    failed = len(outcomes) - len(ok)
    k = _wave_free(stream_tps, window_tps, failed)
    res = LevelResult(
        concurrency=concurrency, requests=len(outcomes), ok=len(ok), failed=failed,
        seconds=seconds,
        requests_per_s=stats.rate(len(ok) * k, seconds) if ok else None,
        output_tps=stats.rate(out_tokens * k, seconds) if ok else None,
        ttft_p50_ms=S.ms(stats.percentile([o.ttft_s for o in ok if o.ttft_s is not None], 50)),
        ttft_p99_ms=S.ms(stats.percentile([o.ttft_s for o in ok if o.ttft_s is not None], 99)),
        itl_p50_ms=S.ms(stats.percentile(gaps, 50)),
        itl_p99_ms=S.ms(stats.percentile(gaps, 99)),
        e2e_p50_ms=S.ms(stats.percentile([o.latency_s for o in ok if o.latency_s is not None], 50)),
        e2e_p99_ms=S.ms(stats.percentile([o.latency_s for o in ok if o.latency_s is not None], 99)),
        tpot_p50_ms=S.ms(stats.percentile(tpots, 50)),
        tpot_p99_ms=S.ms(stats.percentile(tpots, 99)),
        attainment=ev.attainment, attainment_low=ev.attainment_low, attainment_high=ev.attainment_high,
        attainment_target=attainment_target or None,
        goodput_rps=stats.rate(len(good) * k, seconds) if outcomes else None,
        goodput_output_tps=stats.rate(good_tokens * k, seconds) if outcomes else None,
        stream_output_tps=stream_tps, window_output_tps=window_tps,
        passed=passed, decided=decided, verdict=verdict, stop=stop,
        objectives=[asdict(o) for o in ev.objectives], errors=errors, end_missed=end_missed,
    )
    if end_missed:  # (only an undecided level's end is judged: LevelMonitor.result)
        res.warnings.append(f"undecided, and its last windows miss the SLO ({end_missed}): where the level ended up "
                            f"is no pass, whatever its earlier windows read")
    for key, value in (server or {}).items():
        setattr(res, key, value)
    return res


def saturated(prev: LevelResult, cur: LevelResult, config: SearchConfig) -> bool:
    """The server is past saturation between two levels: at the higher one
    vLLM keeps requests waiting (a queue of at least a quarter of the
    concurrency, on average), output throughput grew by less than 10 % and
    TTFT grew by half or more. vLLM's own TTFT is preferred (it is what the
    queue does to requests), ours where /metrics had none. Closed loop only:
    an open loop past its capacity fails its TTFT objective by itself."""
    if cur.concurrency is None or cur.rate is not None:
        return False
    if cur.waiting_mean is None or prev.output_tps is None or cur.output_tps is None:
        return False
    queued = cur.waiting_mean >= max(1.0, config.saturation_waiting_share * cur.concurrency)
    flat = cur.output_tps <= prev.output_tps * (1.0 + config.saturation_tps_gain)

    def ttft(level: LevelResult) -> float | None:
        v = (level.vllm or {}).get("ttft_p50_ms")
        return v if v is not None else level.ttft_p50_ms

    t0, t1 = ttft(prev), ttft(cur)
    climbing = t0 is not None and t1 is not None and t1 >= t0 * config.saturation_ttft_ratio
    return queued and flat and climbing


@dataclass
class CapacityResult:
    slo: list[str]
    capacity: dict[str, Any] | None
    levels: list[LevelResult]
    stop_reason: str
    stop_message: str
    seconds: float
    config: dict[str, Any] = field(default_factory=dict)
    url: str | None = None
    model: str | None = None
    workload: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    mode: str = "concurrency"  # concurrency | rate (records made before rate: concurrency)
    # The largest move of the server's speed between two measurements of one
    # load in this search (speed_moved()), when past SPEED_MOVED_SHARE; None
    # otherwise (and in records made before it).
    speed_moved: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def level(self, load: float) -> LevelResult | None:
        """The level at that concurrency (or rate)."""
        return next((lv for lv in self.levels if lv.load == float(load)), None)

    @property
    def capacity_level(self) -> LevelResult | None:
        """The level whose figures `capacity` reports: at the capacity's
        load, the last one that passed. That is its confirmation when it had
        one; the first, short level at the same load read other figures (on
        an H200, 15.4 k goodput tok/s where the confirmation read 12.5 k)."""
        load = self.capacity_load
        return next((lv for lv in reversed(self.levels)
                     if lv.load == load and lv.passed and lv.stop != "cancelled"), None)

    @property
    def at_ceiling(self) -> bool:
        """The search stopped at its highest load allowed with that load
        passing: the capacity is at least that, shown as "≥" (on an H200 the
        long-doc preset passed every level up to 256, the default then)."""
        return bool(self.capacity) and self.stop_reason in CEILING_STOPS

    @property
    def capacity_load(self) -> float | None:
        """The capacity as a number: its rate (open loop) or its concurrency."""
        if not self.capacity:
            return None
        v = self.capacity.get("rate") if self.mode == "rate" else self.capacity.get("concurrency")
        return None if v is None else float(v)

    def save(self, preset: Any = None, engine_report: Any = None, notes: str | None = None) -> runstore.RunRecord:
        """Store as a 'capacity' run record."""
        return runstore.save_run("capacity", self.to_dict(), preset=preset, engine_report=engine_report,
                                 url=self.url, model=self.model, notes=notes)


def capacity_from_dict(d: dict[str, Any]) -> CapacityResult:
    """A CapacityResult from its JSON (a run record's results), older records too."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(LevelResult)}
    levels = [LevelResult(**{k: v for k, v in lv.items() if k in names}) for lv in d.get("levels") or []]
    top = {f.name for f in dataclasses.fields(CapacityResult)} - {"levels"}
    return CapacityResult(levels=levels, **{k: v for k, v in d.items() if k in top})


def confirm_requests(level: LevelResult, config: SearchConfig) -> int:
    """Counted requests for the confirmation of `level`: confirm_waves
    turnovers of its in-flight set (closed loop: the concurrency; open loop,
    by Little's law: rate x the median time a request spends in the server).
    The runner counts at least its max_requests too (LevelRules.confirming)."""
    if level.rate is None:
        return max(1, config.confirm_waves * int(level.concurrency or 1))
    e2e_s = (level.e2e_p50_ms or 1000.0) / 1000.0
    return max(1, math.ceil(config.confirm_waves * level.rate * e2e_s))


def capacity_summary(level: LevelResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "concurrency": level.concurrency,
        "goodput_rps": level.goodput_rps,
        "goodput_output_tps": level.goodput_output_tps,
        "ttft_p99_ms": level.ttft_p99_ms,
        "itl_p99_ms": level.itl_p99_ms,
        "attainment": level.attainment,
        "attainment_target": level.attainment_target,
        "decided": level.decided,
        "confirmed": level.confirmation,
        "requests": level.requests,
        "seconds": level.seconds,
    }
    if level.rate is not None:
        out["rate"] = level.rate
    return out


Progress = Callable[[dict[str, Any]], None]
# run_level(load) measures one level; the confirmation calls
# run_level(load, min_requests=N): the level counts at least N requests.
LevelRunner = Callable[..., LevelResult]


def emit(progress: Progress | None, **event: Any) -> None:
    if progress is not None:
        try:
            progress(event)
        except Exception:  # noqa: BLE001  a display callback must not end the search; logged, not lost
            log.exception("capacity progress callback failed")


def _round_rate(x: float) -> float:
    """A rate to 3 significant digits (levels read 1.5, 12.3, 187)."""
    if x <= 0:
        return x
    digits = 2 - int(math.floor(math.log10(x)))
    return round(x, max(0, digits))


# A level in which the load generator's own event loop stood still this long
# measured the client, not the server: every stream in flight waited with it
# (on an H200, stalls of 9-20 s read as TTFT p99s of 10-20 s where vLLM's own
# histogram read 0.5 s). Such a level, if it fails, is measured once more.
CLIENT_STALL_MS = 500.0


def client_stalled(lv: LevelResult) -> bool:
    return lv.client_lag_max_ms is not None and lv.client_lag_max_ms >= CLIENT_STALL_MS


def search(run_level: LevelRunner, slo: Sequence[S.Objective], config: SearchConfig | None = None, *,
           progress: Progress | None = None, cancel: threading.Event | None = None,
           clock: Callable[[], float] = time.monotonic) -> CapacityResult:
    """Find the capacity. run_level(load) measures one level (it is called
    once per load, twice when the first measurement ends undecided and
    failing; load is an int concurrency, or in rate mode a float req/s);
    progress gets
    {"event": "level_start", "concurrency" (or "rate"), "index"} and
    {"event": "level_done", "level": LevelResult, "index", "low_pass", "high_fail"}
    (the runner adds "level_progress" events while a level runs; a
    confirmation's events carry "confirm": True). The capacity found is
    confirmed by run_level(load, min_requests=confirm_requests(...)) unless
    config.confirm_waves is 0."""
    config = config or SearchConfig()
    config.validate()
    t0 = clock()
    state = _Search(run_level, config, progress, cancel)
    state.double_until_fail()
    state.settle()  # bisect, recheck the lowest fail, confirm the capacity
    return state.result(slo, clock, t0)


class _Search:
    """The state of one capacity search (the levels measured, the bracket,
    the loads measured twice, the stop reason) and its steps."""

    def __init__(self, run_level: LevelRunner, config: SearchConfig,
                 progress: Progress | None, cancel: threading.Event | None) -> None:
        self.run_level = run_level
        self.config = config
        self.progress = progress
        self.cancel = cancel
        self.rate = config.rate
        self.key = "rate" if config.rate else "concurrency"
        self.top: float = config.max_rate if config.rate else config.max_concurrency
        self.levels: list[LevelResult] = []
        self.seen: dict[float, LevelResult] = {}
        self.best: LevelResult | None = None  # highest passing level
        self.fail_at: float | None = None  # lowest failing load
        self.twice: set[float] = set()  # loads measured twice (a remeasure, a confirmation, a recheck)
        self.reason: str | None = None
        self.top_reason: str | None = None  # the doubling ended on a pass: at the top, or saturated
        self.confirmations = 0  # three at most: a search must end
        self.rechecks = 0  # of the bracket's lowest fail (recheck); two at most: a search must end

    # -- the pipeline ------------------------------------------------------

    def double_until_fail(self) -> None:
        """Doubling from the start until a level fails (or the top, or saturation)."""
        x: float = self.config.start_rate if self.rate else self.config.start
        prev: LevelResult | None = None
        while True:
            if self.cancelled():
                self.reason = "cancelled"
                return
            lv = self.measure(x)
            self.record(lv)
            self.reason = self.interrupted(lv)
            if self.reason is not None or not lv.passed:
                return
            if prev is not None and saturated(prev, lv, self.config):
                self.reason = "saturated"
                return
            if x >= self.top:
                self.reason = self.ceiling()
                return
            prev = lv
            x = self.step_up(x)

    def settle(self) -> None:
        """Bisection between the highest pass (0 when none: the start itself
        may be above the capacity) and the lowest fail; then the
        confirmation (DEFAULT_CONFIRM_WAVES): the capacity once more, longer.
        Passing, it is the capacity and its figures are the ones reported;
        failing, it is the lowest fail and the bisection goes on below it.
        The doubling may end on a pass (the top, or saturation): nothing to
        bisect, but its capacity is confirmed all the same."""
        if self.reason in (*CEILING_STOPS, "saturated"):
            self.top_reason, self.reason = self.reason, None
        while self.reason is None:
            self.reason = self.next_step()

    def next_step(self) -> str | None:
        """One step after the doubling: a level measured (returning None,
        or why it interrupted the search), or the reason the search ends."""
        if self.fail_at is None and self.top_reason is None and self.best is not None:
            # A recheck passed the doubling's only fail: the doubling goes on from it.
            if self.best.load < self.top:
                lv = self.measure(self.step_up(self.best.load))
                self.record(lv)
                return self.interrupted(lv)
            self.top_reason = self.ceiling()
        done, mid = self.bracket_closed()
        if done and (end := self.end_reason()) is not None:
            return end
        if self.cancelled():
            return "cancelled"
        if not done or self.best is None:
            lv = self.measure(mid)
            self.record(lv)
        elif self.fail_at is not None and self.fail_at not in self.twice and self.rechecks < 2:
            self.rechecks += 1  # the bracket is closed: its fail once more, then
            lv = self.recheck(self.fail_at)
        else:  # ... confirm its pass
            self.confirmations += 1
            lv = self.confirm(self.best)
        return self.interrupted(lv)

    def step_up(self, x: float) -> float:
        """The next load up while levels pass: x times the growth, at the top at most."""
        up = x * self.config.growth
        if not self.rate:  # a whole concurrency, at least one above
            up = float(max(int(x) + 1, math.ceil(up)))
        return min(up, self.top)

    def bracket_closed(self) -> tuple[bool, float]:
        """Whether the bracket is within the tolerance, and its middle."""
        lo = self.best.load if self.best else 0.0
        hi = self.fail_at if self.fail_at is not None else lo + 1
        if self.top_reason is not None and self.fail_at is None:
            done = True
        elif self.rate:
            floor = self.config.start_rate / 8.0
            done = (lo > 0 and (hi - lo) / lo <= self.config.tolerance) or (lo == 0 and hi <= floor)
        else:
            done = hi - lo <= 1 or (lo > 0 and (hi - lo) / lo <= self.config.tolerance)
        mid = _round_rate((lo + hi) / 2.0) if self.rate else float((int(lo) + int(hi)) // 2)
        if not done and (mid in self.seen or mid <= lo or mid >= hi):
            done = True  # rounding met a measured level: as close as it gets
        return done, mid

    def end_reason(self) -> str | None:
        """Why the search ends with the bracket closed, or None while its
        lowest fail or its capacity is still to be measured once more."""
        if self.best is None:
            # Not a miss when the lowest load's last look was not judged at all:
            # a CI box with both cores busy counted 8 answers in a 20 s level
            # at concurrency 1 and was told the server misses its SLO there.
            looks = [lv for lv in self.levels if lv.stop != "cancelled"]
            low = min((lv.load for lv in looks), default=None)
            last = [lv for lv in looks if lv.load == low][-1:]
            return "first_level_too_few" if last and last[0].verdict == S.TOO_FEW else "first_level_failed"
        if not self.config.confirm_waves or self.best.confirmation or self.confirmations >= 3:
            return self.top_reason if self.top_reason is not None and self.fail_at is None else "bracketed"
        return None

    def result(self, slo: Sequence[S.Objective], clock: Callable[[], float], t0: float) -> CapacityResult:
        """The capacity found, its warnings and every level measured."""
        best, levels, config, reason = self.best, self.levels, self.config, self.reason
        assert reason is not None  # settle() runs until the search has one
        capacity = capacity_summary(best) if best else None
        warnings = []
        if best is not None and capacity is not None and (failed := failed_confirmations(best, levels, config)):
            capacity["confirmations_failed"] = failed
            warnings.append(unconfirmed_warning(best, failed))
        moved = speed_moved(levels)
        if moved is not None:
            warnings.append(speed_moved_warning(moved, bool(self.rate)))
        client_itl = client_itl_note(levels)
        if client_itl is not None:
            warnings.append(client_itl)
        return CapacityResult(slo=S.describe(slo), capacity=capacity, levels=levels, stop_reason=reason,
                              stop_message=STOP_REASONS.get(reason, reason), seconds=clock() - t0,
                              config=asdict(config), mode=config.mode, warnings=warnings, speed_moved=moved)

    # -- the steps ---------------------------------------------------------

    def bounds(self) -> dict[str, Any]:
        """The bracket so far, as level_done events carry it."""
        best, fail_at = self.best, self.fail_at
        return {"low_pass": (best.load if self.rate else best.concurrency) if best else None,
                "high_fail": fail_at if self.rate or fail_at is None else int(fail_at)}

    def run_at(self, load: Any, min_requests: int | None = None, *, again: bool = False) -> LevelResult:
        """One level (a confirmation with min_requests), measured once more
        when it fails in a way that says little of the server. A level that
        ran out of requests or time undecided fails on its point estimates
        alone, and one stall (of the server, or of the client) in a few
        seconds can carry a p99: on an H200 a 2 s TTFT stall at concurrency
        32 ended one search at 30 where the bench client's bracket was
        [128, 160). A level or confirmation in which our own client stood
        still (client_stalled) measured the client. The second measurement
        decides. `again`: this is itself the second look (recheck), taken once."""
        tag: dict[str, Any] = {"confirm": True} if min_requests is not None else {}
        if again:
            tag.update(remeasure=True, recheck=True)
        lv = self.run_once(load, min_requests, tag)
        doubtful = client_stalled(lv) or (min_requests is None and not lv.decided)
        if not again and not lv.passed and doubtful and self.interrupted(lv) is None:
            emit(self.progress, event="level_done", level=lv, index=len(self.levels) - 1, remeasure=True,
                 **tag, **self.bounds())
            tag["remeasure"] = True
            lv = self.run_once(load, min_requests, tag)
            self.twice.add(float(load))
        return lv

    def run_once(self, load: Any, min_requests: int | None, tag: dict[str, Any]) -> LevelResult:
        """One measurement of a level, announced and kept."""
        emit(self.progress, event="level_start", index=len(self.levels), **tag, **{self.key: load})
        lv = self.run_level(load) if min_requests is None else self.run_level(load, min_requests=min_requests)
        lv.confirmation = min_requests is not None
        if tag.get("remeasure"):
            lv.measured_again = "recheck" if tag.get("recheck") else "remeasure"
        self.levels.append(lv)
        return lv

    def measure(self, x: float) -> LevelResult:
        load: Any = _round_rate(x) if self.rate else int(x)
        lv = self.run_at(load)
        self.seen[float(load)] = lv
        return lv

    def record(self, lv: LevelResult) -> None:
        """A bisection or doubling level into the bracket."""
        if lv.passed and lv.stop != "cancelled":
            if self.best is None or lv.load > self.best.load:
                self.best = lv
        elif lv.stop != "cancelled":
            self.fail_at = lv.load if self.fail_at is None else min(self.fail_at, lv.load)
        emit(self.progress, event="level_done", level=lv, index=len(self.levels) - 1, **self.bounds())

    def confirm(self, level: LevelResult) -> LevelResult:
        """The capacity once more, longer: failing, the next lower pass is the best."""
        lv = self.run_at(level.load if self.rate else int(level.load),
                         min_requests=confirm_requests(level, self.config))
        if lv.stop != "cancelled":
            if lv.passed:
                self.best = lv
            else:
                self.twice.add(lv.load)  # the level passed, its confirmation did not: the later decides
                self.fail_at = lv.load if self.fail_at is None else min(self.fail_at, lv.load)
                lower = [x for x in self.levels if x.passed and x.load < lv.load and x.stop != "cancelled"]
                self.best = max(lower, key=lambda x: x.load) if lower else None
        emit(self.progress, event="level_done", level=lv, index=len(self.levels) - 1, confirm=True,
             **self.bounds())
        return lv

    def recheck(self, load: float) -> LevelResult:
        """The bracket's lowest fail, measured once more before the bracket
        closes: the bench client's bracket asks every round at a level to
        miss before it bounds the capacity, and one bad stretch of a busy
        server can fail a level its next minute passes (on an H200, rate 128
        failed in 5 s with vLLM's own TTFT p99 at 4.7 s, where the bench
        client passed 140 twice). The later measurement decides; passing,
        the level is the highest pass and the bisection goes on above it."""
        lv = self.run_at(load if self.rate else int(load), again=True)
        self.twice.add(float(load))
        self.seen[float(load)] = lv
        if lv.passed and lv.stop != "cancelled":
            if self.best is None or lv.load > self.best.load:
                self.best = lv
            above = [x.load for x in self.levels if not x.passed and x.stop != "cancelled" and x.load > lv.load]
            self.fail_at = min(above) if above else None
        emit(self.progress, event="level_done", level=lv, index=len(self.levels) - 1, remeasure=True,
             recheck=True, **self.bounds())
        return lv

    def interrupted(self, lv: LevelResult) -> str | None:
        if lv.stop == "cancelled" or self.cancelled():
            return "cancelled"
        if lv.stop == "server_down":
            return "server_down"
        return None

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def ceiling(self) -> str:
        return "max_rate" if self.rate else "max_concurrency"


def failed_confirmations(best: LevelResult, levels: Sequence[LevelResult], config: SearchConfig) -> list[float]:
    """The loads whose confirmations failed, when the capacity reported is
    left unconfirmed: its search ran out of them, or was ended before the
    next one (none otherwise).
    Each failed at a load whose short level had passed: the server carried
    less by the end than when the levels below it were run. On an H200 the
    same 128 req/s passed twice in one search and then failed its
    confirmation; the answer was a level measured minutes before, when the
    server was faster. An operator must not read it as a settled figure."""
    if not config.confirm_waves or best.confirmation:
        return []
    return [lv.load for lv in levels if lv.confirmation and not lv.passed]


def unconfirmed_warning(best: LevelResult, failed: Sequence[float]) -> str:
    unit = " req/s" if best.rate is not None else ""
    loads = ", ".join(f"{x:g}" for x in failed)
    return (f"the capacity is not confirmed: the confirmations at {loads}{unit} failed after their levels had "
            f"passed (the server carried less by then, or the short levels passed by luck); {best.load:g}{unit} "
            f"passed in a short level ({best.requests} requests in {best.seconds:.0f} s) and was not measured longer. "
            f"Rerun the search, or hold that load for minutes before planning with it")


# A load measured twice in one search whose readings differ by more than
# this share says the server's speed moved between them: the share a level's
# own windows must agree within (DEFAULT_STABILITY), so a move past it is more
# than a level's own sampling.
SPEED_MOVED_SHARE = DEFAULT_STABILITY


def speed_moved(levels: Sequence[LevelResult]) -> dict[str, Any] | None:
    """The largest change of the server's speed between two measurements of
    one load in a search (a level and its confirmation, a remeasure, a
    recheck), when it passes SPEED_MOVED_SHARE, else None. Closed loop: the
    output tok/s at that concurrency; open loop, where the offered rate sets
    the tok/s, the median E2E at that rate (a slower server holds each
    request longer).
    Why: on an H200 one server's output tok/s at a fixed concurrency moved
    13-25 % within five minutes under vLLM's own bench client (no warm-up:
    up on one server, down on the next two), and back-to-back runs differed
    by a median 17-28 %. A search answers for its own minutes; the operator
    should know when those minutes held a server that did not hold still."""
    by_load: dict[float, list[tuple[int, LevelResult]]] = {}
    for i, lv in enumerate(levels):
        # A level our own client stood still in measured the client (it is
        # measured again for that reason), not the server's speed.
        if lv.stop in ("cancelled", "server_down") or not lv.requests or client_stalled(lv):
            continue
        if lv.verdict == S.TOO_FEW:  # too few requests to read any speed from (LevelRules.min_judged)
            continue
        by_load.setdefault(lv.load, []).append((i, lv))
    best: dict[str, Any] | None = None
    for load, seen in by_load.items():
        if len(seen) < 2:
            continue
        rate = seen[0][1].rate is not None
        figure = "e2e_p50_ms" if rate else "output_tps"
        vals = [(i, getattr(lv, figure)) for i, lv in seen if getattr(lv, figure)]
        for (i0, v0), (i1, v1) in itertools.combinations(vals, 2):
            change = v1 / v0 - 1.0
            if abs(change) > SPEED_MOVED_SHARE and (best is None or abs(change) > abs(best["change"])):
                best = {"load": load, "figure": figure, "first": v0, "later": v1, "change": change,
                        "levels": [i0, i1]}
    return best


# A loop lag that can account for an ITL reading over the limit: at least
# this share of the limit, and this many ms. Below it, a level a hair over the
# limit where vLLM's histogram sits a hair under is at the limit, not bent by
# our client: the twentieth H200 run (four stream processes, lag p99 2 ms)
# read 51.3 ms at 320 against vLLM's 49.9, the top of its (25, 50] ms bucket,
# and the warning said those gaps were ours.
CLIENT_LAG_MATERIAL_SHARE = 0.1
CLIENT_LAG_MATERIAL_MS = 5.0


def client_bound_itl(lv: LevelResult) -> dict[str, Any] | None:
    """The level's ITL objective, where it did not pass although vLLM's own
    histogram met it and our client's loop lag covers the difference: our
    reading over the limit by no more than the loop's lag p99, a lag that
    matters at that limit (CLIENT_LAG_MATERIAL_*). None otherwise (passed,
    no vLLM view, no ITL objective vLLM reports: its histogram gives p50 and
    p99)."""
    view = lv.vllm or {}
    lag = lv.client_lag_p99_ms
    if lv.passed or lag is None:
        return None
    for o in lv.objectives or []:
        if o.get("metric") != "itl" or o.get("verdict") == S.PASS or o.get("percentile") not in (50, 99):
            continue
        ours, limit = o.get("value_ms"), o.get("limit_ms")
        theirs = view.get(f"itl_p{o['percentile']}_ms")
        if ours is None or limit is None or theirs is None:
            continue
        material = max(CLIENT_LAG_MATERIAL_MS, CLIENT_LAG_MATERIAL_SHARE * limit)
        if ours > limit >= theirs and ours - limit <= lag and lag >= material:
            return {"objective": o.get("objective"), "ours_ms": ours, "vllm_ms": theirs, "lag_p99_ms": lag}
    return None


def client_itl_note(levels: Sequence[LevelResult]) -> str | None:
    """A warning for a search whose levels missed the ITL objective by no
    more than our own client's loop lag while vLLM's histogram met it.
    Why: on an H200 behind four API servers (seventeenth run), 20 of the 29
    levels at 288-512 of three searches read ITL p99 51-94 ms against 50 ms,
    while vLLM's histogram put every one under 50 and its bench client passed
    512; our loop lagged p99 34-80 ms with the search's process at 83-92 % of
    a core. The capacity the searches answered (304-320) was our client's,
    not the server's, and nothing in the result said so (read again, each of
    the three records gets this warning)."""
    hits = [(lv, h) for lv in levels if (h := client_bound_itl(lv)) is not None]
    if not hits:
        return None
    rate = hits[0][0].rate is not None
    low = min(lv.load for lv, _ in hits)
    where = f"{low:g} req/s" if rate else f"concurrency {low:g}"
    ours = [h["ours_ms"] for _, h in hits]
    theirs = max(h["vllm_ms"] for _, h in hits)
    lag = max(h["lag_p99_ms"] for _, h in hits)
    procs = max((lv.client_procs or 1) for lv, _ in hits)
    # One process (the eighteenth H200 run: lag p99 14-54 ms at 320-512
    # streams with uvloop and the collector paused) can spread its streams
    # over more; several already did: the machine's cores are the limit.
    spread = ("spread its streams over processes (--client-procs 4, each on a core of its own)" if procs == 1 else
              f"run it from a machine with more idle cores (its streams were already spread over {procs} processes)")
    return (f"{len(hits)} level(s) from {where} missed {hits[0][1]['objective']} reading {min(ours):.0f}-"
            f"{max(ours):.0f} ms where vLLM's own histogram read at most {theirs:.0f} ms, while this client's "
            f"event loop lagged up to p99 {lag:.0f} ms: those token gaps were ours, not the server's. The capacity "
            f"is a floor set by this client; check it against vLLM's bench client (bench/capacity_truth.py), or "
            f"{spread}")


def speed_moved_warning(moved: dict[str, Any], rate: bool) -> str:
    load = f"{moved['load']:g} req/s" if rate else f"concurrency {moved['load']:g}"
    if moved["figure"] == "output_tps":
        read = f"{moved['first']:,.0f} output tok/s in one level and {moved['later']:,.0f} in a later one"
    else:
        read = f"a median E2E of {moved['first']:,.0f} ms in one level and {moved['later']:,.0f} ms in a later one"
    return (f"the server's speed moved during the search: at {load} it read {read} ({moved['change'] * 100:+.0f} %, "
            f"more than the {SPEED_MOVED_SHARE * 100:.0f} % a level's own windows agree within). The capacity is "
            f"this server's in these minutes; a search run later may answer a step or more away. Run it more than "
            f"once (sweep --repeat) before ranking presets on it")


def no_capacity_words(stop_reason: str) -> str:
    """The headline of a search that found no capacity: none, or not judged."""
    if stop_reason == "first_level_too_few":
        return "not judged (the lowest load answered too few requests to judge)"
    return "none (no level met the SLO)"


def format_capacity(r: CapacityResult) -> str:
    """The curve and the verdict, for a terminal."""
    def f(v: float | None, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v, fmt)

    rate = r.mode == "rate"
    col = "req/s in" if rate else "conc"
    head = (f"{col:>8} {'reqs':>5} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} {'p99':>8} "
            f"{'ITL p50':>8} {'p99':>7} {'attain':>7} {'KV pk%':>6} {'wait pk':>7} {'preempt':>7}  verdict")
    lines = [f"capacity search ({'open loop, request rate' if rate else 'closed loop, concurrency'}), "
             f"SLO {' '.join(r.slo)}", head]
    for lv in sorted(r.levels, key=lambda x: x.load):
        verdict = (S.TOO_FEW if lv.verdict == S.TOO_FEW else ("pass" if lv.passed else "fail")
                   + ("" if lv.decided else " (undecided)")) + (" [confirmation]" if lv.confirmation else "")
        att = "-" if lv.attainment is None else f"{lv.attainment * 100:.1f}%"
        load = f"{lv.rate:g}" if lv.rate is not None else str(lv.concurrency)
        extra = ""
        if lv.windows is not None:
            extra = f", {lv.windows} windows" + ("" if lv.stable else " (not stable)")
        if lv.late_sends:
            extra += f", {lv.late_sends} sent late (up to {f(lv.late_send_max_ms)} ms)"
        lines.append(f"{load:>8} {lv.requests:>5} {f(lv.requests_per_s, '.2f'):>7} "
                     f"{f(lv.output_tps):>9} {f(lv.ttft_p50_ms):>9} {f(lv.ttft_p99_ms):>8} "
                     f"{f(lv.itl_p50_ms):>8} {f(lv.itl_p99_ms):>7} {att:>7} {f(lv.kv_cache_peak_pct):>6} "
                     f"{f(lv.waiting_peak, 'g'):>7} {f(lv.preemptions, 'g'):>7}  {verdict}, {lv.stop}{extra}")
        v = lv.vllm
        if v:
            lines.append(f"{'':>8} vLLM's histograms: TTFT p50 {f(v.get('ttft_p50_ms'))} p99 "
                         f"{f(v.get('ttft_p99_ms'))} ms, ITL p50 {f(v.get('itl_p50_ms'))} p99 "
                         f"{f(v.get('itl_p99_ms'))} ms, {f(v.get('requests_finished'), 'g')} requests")
        if lv.server_cpu:
            lines.append(f"{'':>8} server CPU (% of a core): "
                         + ", ".join(f"{p['what']} {p['cpu_pct']:.0f}" for p in lv.server_cpu))
    if r.capacity:
        c = r.capacity
        at_least = "≥ " if r.at_ceiling else ""
        what = f"rate {at_least}{c.get('rate'):g} req/s" if rate and c.get("rate") is not None else \
            f"concurrency {at_least}{c['concurrency']}"
        target = c.get("attainment_target")
        lines.append(f"capacity: {what}"
                     + (" (a lower bound: every level up to the highest allowed met the SLO)" if at_least else "")
                     + ("" if c.get("decided", True) else " (its level was undecided at a cap)")
                     + (f", confirmed over {c['requests']} requests in {f(c.get('seconds'))} s"
                        if c.get("confirmed") else (", not confirmed (see the warning)"
                                                    if c.get("confirmations_failed") else ""))
                     + f", goodput {f(c['goodput_rps'], '.2f')} req/s, {f(c['goodput_output_tps'])} output tok/s, "
                     f"TTFT p99 {f(c['ttft_p99_ms'])} ms, ITL p99 {f(c['itl_p99_ms'])} ms"
                     + (f", attainment {c['attainment'] * 100:.1f}% (target {target * 100:.0f}%)"
                        if c.get("attainment") is not None and target else ""))
    else:
        lines.append(f"capacity: {no_capacity_words(r.stop_reason)}")
    lines.append(f"stopped: {r.stop_reason} ({r.stop_message}), {r.seconds:.1f} s")
    lines.extend(f"warning: {w}" for w in r.warnings)
    return "\n".join(lines)
