"""Capacity under an SLO: the highest concurrency whose requests still meet
every objective, found by doubling then bisection.

The search is pure: it calls a level runner, a function concurrency ->
LevelResult, and never touches the network itself. The HTTP runner lives in
capacity_run.py; tests drive the search with a simulated server.

- Doubling from `start` until a level fails (or the cap, or saturation),
  then bisection between the highest pass and the lowest fail until
  (fail - pass) / pass <= tolerance or they are neighbours.
- Each level stops as soon as its verdict is known (LevelMonitor, with
  slo.evaluate's order-statistic bounds), between a minimum and a maximum
  request count and a time cap. A level still undecided at a cap is marked
  `decided: false` and goes by its sample percentiles.
- The search stops early when a passing level shows the server past
  saturation: requests queue in vLLM, output throughput no longer grows and
  TTFT climbs. More concurrency past that point only adds waiting.

Progress: `progress(event)` gets dicts as levels start and finish (the
finished LevelResult rides along), so a UI can draw the curve as it grows;
`cancel` (a threading.Event) ends the search after the running level.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ernie_tui.engine_ctl.load import runstore, stats
from ernie_tui.engine_ctl.load import slo as S

log = logging.getLogger(__name__)

STOP_REASONS = {
    "bracketed": "the highest pass and the lowest fail are within the tolerance",
    "first_level_failed": "even the lowest concurrency misses the SLO",
    "max_concurrency": "the highest concurrency allowed still meets the SLO",
    "saturated": "the server is past saturation: requests queue, throughput is flat and TTFT climbs",
    "server_down": "no request got through (is the server running?)",
    "cancelled": "cancelled",
}


@dataclass
class LevelRules:
    """When one level has seen enough."""

    min_requests: int = 20
    max_requests: int = 400
    time_cap_s: float = 60.0
    confidence: float = 0.95
    # An interval narrower than this share of the limit decides by the sample
    # percentile: the true value is that close to the limit either way.
    precision: float = 0.05
    # A level whose requests fail more often than this is failed at once.
    max_error_share: float = 0.5

    def validate(self) -> None:
        if self.min_requests < 1 or self.max_requests < self.min_requests:
            raise ValueError("need 1 <= min requests <= max requests")
        if self.time_cap_s <= 0:
            raise ValueError("the level time cap must be more than zero")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError("confidence must be within [0.5, 1)")
        if self.precision < 0:
            raise ValueError("precision must not be negative")


@dataclass
class SearchConfig:
    start: int = 1
    max_concurrency: int = 256
    tolerance: float = 0.10
    # Saturation (see saturated()): queue share of concurrency, throughput
    # gain below which it counts as flat, TTFT growth that counts as climbing.
    saturation_waiting_share: float = 0.25
    saturation_tps_gain: float = 0.10
    saturation_ttft_ratio: float = 1.5

    def validate(self) -> None:
        if self.start < 1:
            raise ValueError("the start concurrency must be at least 1")
        if self.max_concurrency < self.start:
            raise ValueError("the highest concurrency must be at least the start")
        if not 0 < self.tolerance < 1:
            raise ValueError("the tolerance is a share between 0 and 1, e.g. 0.1")


def make_search(slo: Sequence[str] | str, *, start: int = 1, max_concurrency: int = 256,
                tolerance: float = 0.10, min_requests: int = 20, max_requests: int = 400,
                level_time_s: float = 60.0, confidence: float = 0.95,
                ) -> tuple[list[S.Objective], SearchConfig, LevelRules]:
    """The objectives, the search and the level rules from what a person
    typed (the command line's options, the dashboard's fields), checked:
    ValueError with a plain message. `slo` is a list of objectives or one
    line of them ('ttft_p99=500ms itl_p99=50ms')."""
    objectives = S.parse_slo_text(slo) if isinstance(slo, str) else S.parse_slo(slo)
    search = SearchConfig(start=start, max_concurrency=max_concurrency, tolerance=tolerance)
    search.validate()
    rules = LevelRules(min_requests=min_requests, max_requests=max_requests, time_cap_s=level_time_s,
                       confidence=confidence)
    rules.validate()
    return objectives, search, rules


@dataclass
class LevelResult:
    """One concurrency level: our figures, the verdict, and the server's."""

    concurrency: int
    requests: int  # finished (ok or failed)
    ok: int = 0
    failed: int = 0
    seconds: float = 0.0
    requests_per_s: float | None = None
    output_tps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    attainment: float | None = None
    attainment_low: float | None = None
    attainment_high: float | None = None
    goodput_rps: float | None = None
    goodput_output_tps: float | None = None
    passed: bool = False
    decided: bool = False
    verdict: str = S.UNDECIDED  # pass | fail | undecided (at a cap; `passed` then follows the estimate)
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


class LevelMonitor:
    """Collects one level's request outcomes and says when to stop.

    Pure apart from the clock it is handed: the HTTP runner feeds it as
    responses finish, a simulated runner feeds it in a loop.
    """

    def __init__(self, concurrency: int, slo: Sequence[S.Objective], rules: LevelRules) -> None:
        self.concurrency = concurrency
        self.slo = list(slo)
        self.rules = rules
        self.outcomes: list[S.RequestOutcome] = []
        self.evaluation: S.Evaluation | None = None
        # The first requests of a level all start together; before every
        # worker has been through at least two requests the mix is not yet
        # the level's steady state (and the first to finish are the fastest).
        self.min_requests = max(rules.min_requests, 2 * concurrency)
        self.max_requests = max(rules.max_requests, self.min_requests)
        self._check_every = max(1, concurrency // 4)
        self._since_check = 0

    def add(self, outcome: S.RequestOutcome) -> None:
        self.outcomes.append(outcome)
        self._since_check += 1

    @property
    def count(self) -> int:
        return len(self.outcomes)

    def stop_reason(self, elapsed_s: float) -> str | None:
        """None while the level should go on, else why it stops."""
        n = self.count
        failed = sum(1 for o in self.outcomes if not o.ok)
        if n >= self.min_requests and failed > self.rules.max_error_share * n:
            return "errors"
        if n >= self.min_requests and (self._since_check >= self._check_every or n >= self.max_requests):
            self._since_check = 0
            self.evaluation = S.evaluate(self.outcomes, self.slo, self.rules.confidence, self.rules.precision)
            if self.evaluation.verdict != S.UNDECIDED:
                return "decided"
        if n >= self.max_requests:
            return "max_requests"
        if elapsed_s >= self.rules.time_cap_s:
            return "time_cap"
        return None

    def result(self, seconds: float, stop: str, server: dict[str, Any] | None = None) -> LevelResult:
        """The level's figures over every finished request (also those that
        finished after the stop decision: dropping them would favour the
        fast ones)."""
        ev = S.evaluate(self.outcomes, self.slo, self.rules.confidence, self.rules.precision)
        return level_result(self.concurrency, self.outcomes, self.slo, ev, seconds, stop, server)


def level_result(concurrency: int, outcomes: Sequence[S.RequestOutcome], slo: Sequence[S.Objective],
                 ev: S.Evaluation, seconds: float, stop: str,
                 server: dict[str, Any] | None = None) -> LevelResult:
    ok = [o for o in outcomes if o.ok]
    errors: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            kind = o.error_kind or "unknown"
            errors[kind] = errors.get(kind, 0) + 1
    good = [o for o in outcomes if S.request_meets(o, slo)]
    out_tokens = sum(o.completion_tokens or 0 for o in ok)
    good_tokens = sum(o.completion_tokens or 0 for o in good)
    gaps = [g for o in ok for g in o.itls]
    if stop in ("errors", "server_down", "cancelled") and ev.verdict != S.FAIL:
        verdict = S.FAIL if stop != "cancelled" else S.UNDECIDED
    else:
        verdict = ev.verdict
    decided = verdict != S.UNDECIDED
    passed = verdict == S.PASS or (verdict == S.UNDECIDED and stop != "cancelled" and ev.point_pass)
    res = LevelResult(
        concurrency=concurrency, requests=len(outcomes), ok=len(ok), failed=len(outcomes) - len(ok),
        seconds=seconds,
        requests_per_s=stats.rate(len(ok), seconds) if ok else None,
        output_tps=stats.rate(out_tokens, seconds) if ok else None,
        ttft_p50_ms=_ms(stats.percentile([o.ttft_s for o in ok], 50)),
        ttft_p99_ms=_ms(stats.percentile([o.ttft_s for o in ok], 99)),
        itl_p50_ms=_ms(stats.percentile(gaps, 50)),
        itl_p99_ms=_ms(stats.percentile(gaps, 99)),
        e2e_p50_ms=_ms(stats.percentile([o.latency_s for o in ok], 50)),
        e2e_p99_ms=_ms(stats.percentile([o.latency_s for o in ok], 99)),
        attainment=ev.attainment, attainment_low=ev.attainment_low, attainment_high=ev.attainment_high,
        goodput_rps=stats.rate(len(good), seconds) if outcomes else None,
        goodput_output_tps=stats.rate(good_tokens, seconds) if outcomes else None,
        passed=passed, decided=decided, verdict=verdict, stop=stop,
        objectives=[asdict(o) for o in ev.objectives], errors=errors,
    )
    for key, value in (server or {}).items():
        setattr(res, key, value)
    return res


def saturated(prev: LevelResult, cur: LevelResult, config: SearchConfig) -> bool:
    """The server is past saturation between two levels: at the higher one
    vLLM keeps requests waiting (a queue of at least a quarter of the
    concurrency, on average), output throughput grew by less than 10 % and
    TTFT grew by half or more. vLLM's own TTFT is preferred (it is what the
    queue does to requests), ours where /metrics had none."""
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def save(self, preset: Any = None, engine_report: Any = None, notes: str | None = None):
        """Store as a 'capacity' run record."""
        return runstore.save_run("capacity", self.to_dict(), preset=preset, engine_report=engine_report,
                                 url=self.url, model=self.model, notes=notes)


def capacity_summary(level: LevelResult) -> dict[str, Any]:
    return {
        "concurrency": level.concurrency,
        "goodput_rps": level.goodput_rps,
        "goodput_output_tps": level.goodput_output_tps,
        "ttft_p99_ms": level.ttft_p99_ms,
        "itl_p99_ms": level.itl_p99_ms,
        "attainment": level.attainment,
        "decided": level.decided,
    }


Progress = Callable[[dict[str, Any]], None]
LevelRunner = Callable[[int], LevelResult]


def emit(progress: Progress | None, **event: Any) -> None:
    if progress is not None:
        try:
            progress(event)
        except Exception:  # noqa: BLE001  a display callback must not end the search; logged, not lost
            log.exception("capacity progress callback failed")


def search(run_level: LevelRunner, slo: Sequence[S.Objective], config: SearchConfig | None = None, *,
           progress: Progress | None = None, cancel: threading.Event | None = None,
           clock: Callable[[], float] = time.monotonic) -> CapacityResult:
    """Find the capacity. run_level(concurrency) measures one level (it is
    called at most once per concurrency); progress gets
    {"event": "level_start", "concurrency", "index"} and
    {"event": "level_done", "level": LevelResult, "index", "low_pass", "high_fail"}."""
    config = config or SearchConfig()
    config.validate()
    t0 = clock()
    levels: list[LevelResult] = []
    seen: dict[int, LevelResult] = {}
    best: LevelResult | None = None  # highest passing level
    fail_at: int | None = None  # lowest failing concurrency
    reason: str | None = None

    def measure(c: int) -> LevelResult:
        emit(progress, event="level_start", concurrency=c, index=len(levels))
        lv = run_level(c)
        levels.append(lv)
        seen[c] = lv
        return lv

    def record(lv: LevelResult) -> None:
        nonlocal best, fail_at
        if lv.passed and lv.stop != "cancelled":
            if best is None or lv.concurrency > best.concurrency:
                best = lv
        elif lv.stop != "cancelled":
            fail_at = lv.concurrency if fail_at is None else min(fail_at, lv.concurrency)
        emit(progress, event="level_done", level=lv, index=len(levels) - 1,
              low_pass=best.concurrency if best else None, high_fail=fail_at)

    def interrupted(lv: LevelResult) -> str | None:
        if lv.stop == "cancelled" or (cancel is not None and cancel.is_set()):
            return "cancelled"
        if lv.stop == "server_down":
            return "server_down"
        return None

    # Doubling.
    c = config.start
    prev: LevelResult | None = None
    while reason is None:
        if cancel is not None and cancel.is_set():
            reason = "cancelled"
            break
        lv = measure(c)
        record(lv)
        reason = interrupted(lv)
        if reason is not None:
            break
        if not lv.passed:
            break
        if prev is not None and saturated(prev, lv, config):
            reason = "saturated"
            break
        if c >= config.max_concurrency:
            reason = "max_concurrency"
            break
        prev = lv
        c = min(2 * c, config.max_concurrency)

    # Bisection between the highest pass (0 when none: the start itself may
    # be above the capacity) and the lowest fail.
    while reason is None:
        lo = best.concurrency if best else 0
        hi = fail_at if fail_at is not None else lo + 1
        if hi - lo <= 1 or (lo > 0 and (hi - lo) / lo <= config.tolerance):
            reason = "bracketed" if best else "first_level_failed"
            break
        if cancel is not None and cancel.is_set():
            reason = "cancelled"
            break
        mid = (lo + hi) // 2
        if mid in seen:  # cannot happen with integer bisection; guards against a loop
            reason = "bracketed" if best else "first_level_failed"
            break
        lv = measure(mid)
        record(lv)
        reason = interrupted(lv)

    capacity = capacity_summary(best) if best else None
    return CapacityResult(slo=S.describe(slo), capacity=capacity, levels=levels, stop_reason=reason,
                          stop_message=STOP_REASONS.get(reason, reason), seconds=clock() - t0,
                          config=asdict(config))


def format_capacity(r: CapacityResult) -> str:
    """The curve and the verdict, for a terminal."""
    def f(v: float | None, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v, fmt)

    head = (f"{'conc':>5} {'reqs':>5} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} {'p99':>8} "
            f"{'ITL p50':>8} {'p99':>7} {'attain':>7} {'KV pk%':>6} {'wait pk':>7} {'preempt':>7}  verdict")
    lines = [f"capacity search, SLO {' '.join(r.slo)}", head]
    for lv in sorted(r.levels, key=lambda x: x.concurrency):
        verdict = ("pass" if lv.passed else "fail") + ("" if lv.decided else " (undecided)")
        att = "-" if lv.attainment is None else f"{lv.attainment * 100:.1f}%"
        lines.append(f"{lv.concurrency:>5} {lv.requests:>5} {f(lv.requests_per_s, '.2f'):>7} "
                     f"{f(lv.output_tps):>9} {f(lv.ttft_p50_ms):>9} {f(lv.ttft_p99_ms):>8} "
                     f"{f(lv.itl_p50_ms):>8} {f(lv.itl_p99_ms):>7} {att:>7} {f(lv.kv_cache_peak_pct):>6} "
                     f"{f(lv.waiting_peak, 'g'):>7} {f(lv.preemptions, 'g'):>7}  {verdict}, {lv.stop}")
        v = lv.vllm
        if v:
            lines.append(f"{'':>5} vLLM's histograms: TTFT p50 {f(v.get('ttft_p50_ms'))} p99 "
                         f"{f(v.get('ttft_p99_ms'))} ms, ITL p50 {f(v.get('itl_p50_ms'))} p99 "
                         f"{f(v.get('itl_p99_ms'))} ms, {f(v.get('requests_finished'), 'g')} requests")
    if r.capacity:
        c = r.capacity
        lines.append(f"capacity: concurrency {c['concurrency']}"
                     + ("" if c.get("decided", True) else " (its level was undecided at a cap)")
                     + f", goodput {f(c['goodput_rps'], '.2f')} req/s, {f(c['goodput_output_tps'])} output tok/s, "
                     f"TTFT p99 {f(c['ttft_p99_ms'])} ms, ITL p99 {f(c['itl_p99_ms'])} ms")
    else:
        lines.append("capacity: none (no level met the SLO)")
    lines.append(f"stopped: {r.stop_reason} ({r.stop_message}), {r.seconds:.1f} s")
    lines.extend(f"warning: {w}" for w in r.warnings)
    return "\n".join(lines)
