"""A simulated paired capacity sweep: the real search (capacity.search), the
real turn-taking (TurnGate), the real ladder rounds and verdict
(paired_sweep.duel_rounds, PairedResult.analyse), over simulated servers and
a simulated clock: a second a run, where the paced stand-in takes minutes.

Each simulated preset is the paced stand-in's --itl-scale-knee model: at
concurrency C every token gap is itl x f(t) x max(1, C / K), so under an
ITL p99 limit L its capacity is K x L / (itl x f(t) x spread) and its
throughput at the knee K / (itl x f(t)): two presets' K set both ratios at
every moment. f(t) = 1 + drift x sin(2 pi t / period + phase), the host's
drift, the same for every preset. A level's readings carry noise:
- its p99 is the model's times a lognormal of `p99_noise`;
- jitter: with probability `jitter`, a level's p99 spikes by 30-90 % (the
  box's scheduling in the tail, as in issue #56: 23.6 ms read against a 20
  ms limit where the gap was 10-13 ms): near the knee the level fails, far
  under it not always;
- its tok/s is the model's times a lognormal of `tps_noise`.
Search levels take `search_level_s` of simulated time, duel levels `duel_s`.

Used by tests/test_knee_ladder.py (fixed seeds) and bench/verdict_calibration.py.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from ernie_tui.engine_ctl.control import paired_sweep as ps
from ernie_tui.engine_ctl.control.turn_gate import TurnGate
from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import slo as S


@dataclass
class SimPreset:
    name: str
    knee: float  # K: the batch beyond which the gap grows
    itl_ms: float = 8.0
    spread: float = 1.2  # p99 over the model's gap


@dataclass
class SimHost:
    limit_ms: float = 20.0
    drift: float = 0.0
    period_s: float = 120.0
    phase: float = 0.0
    p99_noise: float = 0.03
    tps_noise: float = 0.03
    jitter: float = 0.0
    search_level_s: float = 10.0
    duel_s: float = 8.0
    seed: int = 0
    now: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def factor(self, t: float) -> float:
        return 1.0 + self.drift * math.sin(2.0 * math.pi * t / self.period_s + self.phase)

    def clock(self) -> float:
        return self.now


def level(host: SimHost, p: SimPreset, load: float, seconds: float, rng: random.Random,
          noise_scale: float = 1.0) -> C.LevelResult:
    """One simulated level of `seconds` at concurrency `load`, now; the clock
    moves on. `noise_scale` multiplies the readings' noise (a shorter level
    counts fewer samples)."""
    with host.lock:
        mid = host.now + seconds / 2
        host.now += seconds
    f = host.factor(mid)
    gap = p.itl_ms * f * max(1.0, load / p.knee)
    p99 = gap * p.spread * math.exp(rng.gauss(0.0, host.p99_noise * noise_scale))
    if rng.random() < host.jitter:
        p99 *= rng.uniform(1.3, 1.9)
    tps = min(load, p.knee) / (p.itl_ms * f / 1000.0) * math.exp(rng.gauss(0.0, host.tps_noise * noise_scale))
    ok = p99 <= host.limit_ms
    verdict = S.PASS if ok else S.FAIL
    gaps = int(tps * seconds)
    obj = {"objective": f"itl_p99={host.limit_ms:g}ms", "metric": "itl", "percentile": 99,
           "limit_ms": host.limit_ms, "value_ms": p99, "low_ms": None, "high_ms": None, "samples": gaps,
           "verdict": verdict, "how": "bounds"}
    requests = max(1, gaps // 16)
    return C.LevelResult(concurrency=int(load), requests=requests, ok=requests, seconds=seconds,
                         output_tps=tps, stream_output_tps=tps, window_output_tps=tps,
                         goodput_output_tps=tps if ok else 0.0, itl_p99_ms=p99, passed=ok, decided=True,
                         verdict=verdict, stop="decided", objectives=[obj])


SLO_TEXT = "itl_p99={limit}ms"


def run(presets: list[SimPreset], host: SimHost, rounds: int = 3, tolerance: float = 0.10,
        knees: dict[str, float] | None = None, ladder: bool = True, rung_share: float | None = None
        ) -> ps.PairedResult:
    """One simulated paired sweep: round 0's searches (levels taking turns;
    skipped for presets given in `knees`, which start there), then the
    ladder rounds and the verdicts (ladder False: the duels at the loads
    round 0 found, as before 2026-12-07; rung_share: a rung's length over a
    duel level's; None: what paired_sweep.rung_seconds() gives a level it
    knows nothing of, 6 s of 8; 1.0: as long, as before 08:30 UTC that day)."""
    if rung_share is None:
        rung_share = ps.rung_seconds(None, None) / ps.DUEL_LEVEL_S
    rngs = {p.name: random.Random(f"{host.seed}-{p.name}") for p in presets}
    by_name = {p.name: p for p in presets}
    slo = S.parse_slo_text(SLO_TEXT.format(limit=f"{host.limit_ms:g}"))
    config = C.SearchConfig(confirm_waves=0, tolerance=tolerance, max_concurrency=512)
    result = ps.PairedResult(presets=[p.name for p in presets])
    given = knees or {}
    todo = [p for p in presets if p.name not in given]
    gate = TurnGate([p.name for p in todo])
    found: dict[str, C.CapacityResult] = {}

    def search(p: SimPreset) -> None:
        def one(load: Any, min_requests: int | None = None) -> C.LevelResult:
            return level(host, p, float(load), host.search_level_s, rngs[p.name])
        try:
            found[p.name] = C.search(gate.wrap(p.name, one), slo, config)
        finally:
            gate.leave(p.name)

    threads = [threading.Thread(target=search, args=(p,), daemon=True) for p in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start: dict[str, float] = {}
    for p in presets:
        res = found.get(p.name)
        load = given.get(p.name) if res is None else ps.kl.start_knee(ps.duel_load(res), res.levels, tolerance,
                                                                         False)
        if load is None:
            continue
        start[p.name] = float(load)
        result.searches.append(ps.PresetRound(preset=p.name, round=0, duel_load=load,
                                              doubts=[] if res is None else ps.kl.search_doubts(res.levels)))

    def measure(name: str, load: float, kind: str) -> C.LevelResult:
        # A rung runs to its cap, rung_share of a duel level (a real server's
        # fail that decides early is not simulated: an upper bound of its
        # time), its readings noisier by the square root of its shorter span.
        if kind == "rung" and rung_share < 1.0:
            return level(host, by_name[name], load, host.duel_s * rung_share, rngs[name],
                         noise_scale=math.sqrt(1.0 / rung_share))
        return level(host, by_name[name], load, host.duel_s * (2 if kind == "longer" else 1), rngs[name])

    result.step = tolerance
    if len(start) < 2:  # a search found no capacity to duel at: not compared (as paired_sweep._measure)
        result.analyse()
        return result
    if not ladder:
        runners = {n: (lambda load, n=n: measure(n, float(load), "figure")) for n in start}
        for r in range(1, rounds + 1):
            result.duels += ps.duel_round(r, list(start), start, runners, False, lambda **_: None,
                                          threading.Event(), 0, 0, clock=host.clock)
        result.analyse()
        return result
    ps.duel_rounds(result, list(start), start, measure, rounds, False, lambda **_: None, threading.Event(),
                   clock=host.clock, order_seed=host.seed * 7 + 1)
    result.analyse()
    return result
