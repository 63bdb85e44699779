"""The paired capacity sweep: every preset served at once, their levels taking
turns, compared pair by pair against the same minutes (`sweep --capacity`'s
default).

A sequential sweep measures one preset, then the next: the host's drift
between them (one H200 went from 16 k to 26.5 k tok/s within ten minutes)
lands in the comparison. Here:

1. Every preset's server is started once and stays up for the whole sweep,
   each on its own port with its own log (no restart). On one GPU that needs
   them to fit side by side (co_residency()): each gets an equal share of GPU
   memory when preflight says the KV pool at that share still holds the
   search's highest concurrency; otherwise nothing starts and the result
   says why (the caller then runs the sequential sweep).
2. Round 0: one capacity search per preset, each in its own thread, through
   a TurnGate: one level at a time, the presets taking turns A B A B. It
   finds each preset's capacity (its knee) under the SLO.
3. Rounds 1..R, the duels: each preset climbs a short ladder around its
   current knee (knee_ladder.py; it starts at the highest load that passed
   in its search, duel_load(): under drift the search's final answer sinks
   to the host's slowest minutes): its knee, then one step above where that
   passed or below where it failed. The round reads each preset's knee as
   the highest load that passed and its tok/s there, and the next round
   starts from it, so a knee found too low in round 0 is corrected and its
   spread lands in the interval (issue #56: one noisy search had fixed the
   stronger preset's duels below its knee). The presets' ladders run one
   after another, the round's reference preset's knee measured first and
   again last (A B A, then B A B: the reference rotates). Each level's output
   tok/s is divided by the reference's at the same moment (its two looks
   interpolated in wall time), so drift that is linear over the round
   cancels. Why not whole searches per round, as first planned:
   on the drifting stand-in (+-30 % over 2 min) a search took 2-4 minutes on
   a loaded 2-core box, longer than the drift's half period, so two presets'
   capacity levels of one round met different host speeds and the paired
   differences kept most of the drift (see docs: rank presets).
4. Each duel round gives every pair one ratio of tok/s at their knees and
   one of their knees; ranking.paired_verdict() turns the rounds' ln ratios
   into a verdict per pair with its interval, held back ("within noise /
   undecided: knee uncertain") where a knee's evidence contradicts itself
   (knee_ladder.knee_doubts), then the ranking from the pairs beyond noise,
   and the drift the run saw.

Each preset's search is a SweepRun (repeat 0), so the sweep's table, exports
and records read as a sequential sweep's; PairedResult holds the duels and
the pair verdicts beside them (to_dict() for the exports, the report and
the TUI).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ernie_tui import paths
from ernie_tui.engine_ctl.control import knee_ladder as kl
from ernie_tui.engine_ctl.control import ranking as rk
from ernie_tui.engine_ctl.control.server import EngineServer, ServerState
from ernie_tui.engine_ctl.control.sweep import (
    CapacitySweep,
    SweepOptions,
    SweepRun,
    _trial_port,
    fill_capacity_columns,
)
from ernie_tui.engine_ctl.control.turn_gate import TurnGate
from ernie_tui.engine_ctl.launch import run_preflight
from ernie_tui.engine_ctl.load import (
    DEFAULT_MIN_WINDOWS,
    BurstConfig,
    CapacityResult,
    SearchConfig,
    save_run,
)
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets.model import LaunchSpec, Preset

log = logging.getLogger(__name__)
Progress = Callable[[dict[str, Any]], None]

DEFAULT_ROUNDS = 3
# A duel level's length: it measures throughput at a known load, for this
# long (or its --max-requests, whichever comes first), whatever its verdict.
# Short and alike, so the reference's two looks are close and symmetric
# around the others' (see adjust()): with levels of up to 20 s (a failing
# level ran to its cap) the reference moved 11-28 % within a round on the
# drifting stand-in, and a sine's curvature over that span is not linear.
DUEL_LEVEL_S = 8.0
# A ladder's rung (a step above or below a knee) runs at most this share of
# its preset's duel level. It needs a pass or a fail, not a tok/s figure: it
# runs under the search's own rules (a fail decides at once, a pass once its
# windows agree), and one that is still undecided at the cap moves no knee
# (knee_ladder.next_after). Capped at a whole duel level, a round of two
# presets ran twice the fixed design's three levels on the simulated host
# (bench/verdict_calibration.py: 48.6 s against 23.8 s); at half of one, a
# round of N presets costs at most N + 1 duel levels and N halves, plus the
# rare second look and step down.
RUNG_SHARE = 0.5
# On one GPU the servers share its memory: each gets this much of it in all.
GPU_SHARE_TOTAL = 0.9


@dataclass
class PresetRound:
    """One preset's capacity search (round 0, the levels alternating with
    the other presets')."""

    preset: str
    round: int
    capacity: float | None = None
    goodput_output_tps: float | None = None
    stop: str | None = None
    levels: int = 0
    started_at: float | None = None  # wall clock
    ended_at: float | None = None
    at_ceiling: bool = False
    duel_load: float | None = None  # where its duels started (duel_load())
    duel_seconds: float | None = None  # how long each of its duel levels may run (duel_seconds())
    rung_seconds: float | None = None  # ... and each rung of its ladder (rung_seconds())
    doubts: list[str] = field(default_factory=list)  # where its levels contradict (knee_ladder.search_doubts)
    final_knee: float | None = None  # where its ladder would start next (the last round's next_knee)


@dataclass
class DuelLevel:
    """One short level of a duel round, at the preset's capacity load.
    `adjusted`: its output tok/s over the reference's at the same moment
    (the reference's two looks of the round, interpolated in time), the
    figure the pairs are compared on."""

    preset: str
    round: int
    load: float
    at: float  # wall clock, the level's middle
    seconds: float
    output_tps: float | None = None
    goodput_output_tps: float | None = None
    passed: bool = False
    reference: bool = False  # the round's reference preset (measured first and last)
    adjusted: float | None = None
    # output_tps is the level's stream rate (LevelResult.stream_output_tps;
    # its windows' rate for a rate level); this is its windows' rate.
    window_output_tps: float | None = None
    # Its rung of the preset's ladder: at | above | below | again (the
    # reference's closing look); "... (first look)" for a level measured
    # once more (near its limit on few requests) whose second look counts.
    step: str = "at"
    verdict: str = ""
    counted: bool = False  # the level the preset's reading of this round comes from


@dataclass
class PairedResult:
    """What the paired sweep found: each preset's search, the duel rounds'
    levels, each pair's verdict, the ranking from the verdicts beyond
    noise, and the drift the run saw."""

    presets: list[str]
    searches: list[PresetRound] = field(default_factory=list)
    duels: list[DuelLevel] = field(default_factory=list)
    pairs: list[rk.PairVerdict] = field(default_factory=list)
    ranking: rk.Ranking | None = None
    drift: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    co_residency: str = ""
    turns: list[str] = field(default_factory=list)  # whose search level ran, in order
    refused: str | None = None  # why the servers could not be up side by side (nothing was measured)
    seconds: float = 0.0
    knee_rounds: list[kl.KneeRound] = field(default_factory=list)  # each preset's reading, per duel round
    step: float = 0.0  # the ladder's step (the search's tolerance)
    knees: dict[str, dict[str, Any]] = field(default_factory=dict)  # per preset: knee, uncertain, why (analyse)
    # The smallest difference a verdict names, a share (--min-difference; ranking.paired_verdict)
    min_difference: float = rk.DEFAULT_MIN_DIFFERENCE
    order_seed: int | None = None  # the seed each ladder round's order was drawn from (duel_rounds)

    def values(self, column: str) -> dict[str, list[float | None]]:
        """Each preset's duel figure per round (its first look in a round
        where it is the reference; None where not measured)."""
        n = max((d.round for d in self.duels), default=0)
        out: dict[str, list[float | None]] = {p: [None] * n for p in self.presets}
        for d in self.duels:
            if out[d.preset][d.round - 1] is None:
                out[d.preset][d.round - 1] = getattr(d, column)
        return out

    def readings(self, column: str) -> dict[str, list[Any]]:
        """Each preset's knee reading per round (a KneeRound's `column`; None where not measured)."""
        n = max((k.round for k in self.knee_rounds), default=0)
        out: dict[str, list[Any]] = {p: [None] * n for p in self.presets}
        for k in self.knee_rounds:
            if k.preset in out:
                out[k.preset][k.round - 1] = getattr(k, column)
        return out

    def knee_summary(self) -> dict[str, dict[str, Any]]:
        """Per preset: its knee per round, whether it is uncertain and why,
        the rounds that read only a lower bound."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.presets:
            mine = [k for k in self.knee_rounds if k.preset == name]
            round0 = next((r.doubts for r in self.searches if r.preset == name), [])
            why = kl.knee_doubts(round0, mine)
            out[name] = {"knees": [k.knee for k in mine], "uncertain": bool(why), "why": why,
                         "lower_bound_rounds": [k.round for k in mine if k.lower_bound],
                         "edge_rounds": [k.round for k in mine if k.edge],
                         "round0_doubts": list(round0)}
        return out

    def verdict(self, a: str, b: str, confidence: float = rk.DEFAULT_CONFIDENCE) -> rk.PairVerdict:
        """The verdict of B against A (ranking.paired_verdict over this run's
        rounds): the one function the sweep's pairs and tune's --confirm use."""
        if not self.knee_rounds:  # duels at a fixed load (a record from before the ladder)
            adjusted = self.values("adjusted")
            return rk.compare_pair(a, b, adjusted.get(a, []), adjusted.get(b, []),
                                   metric="output_tps_at_capacity", confidence=confidence,
                                   min_difference=self.min_difference)
        knees = self.knees or self.knee_summary()
        adjusted, at, lower = self.readings("adjusted"), self.readings("knee"), self.readings("lower_bound")
        # A round that read a preset far under its knee (a lower bound of its
        # goodput at capacity) stays in the pairs: the ladder moves that
        # knee up and the spread lands in the interval. Left out, fast drift
        # (+-30 % over a minute) left one round of three and no verdict; but
        # a verdict that calls that preset the weaker is held back
        # (ranking.paired_verdict: its figure may be too low, the other way
        # is safe).
        fig = {n: adjusted.get(n, []) for n in (a, b)}
        caps = {n: at.get(n, []) for n in (a, b)}
        knee_loads = [x for n in (a, b) for x in at.get(n, []) if x]
        step = self.step
        if knee_loads and all(float(x).is_integer() for x in knee_loads):
            step = max(step, 1.0 / min(knee_loads))  # concurrency rungs are whole: 8 to 9 is a 12.5 % step
        refs = [d for d in self.duels if d.reference and d.output_tps]
        moved = [abs(math.log((y.output_tps or 1.0) / (x.output_tps or 1.0)))
                 for x, y in zip(refs[::2], refs[1::2], strict=False) if x.round == y.round]
        floor = rk.DRIFT_RESIDUAL * statistics.fmean(moved) if moved else 0.0
        spans = [y.at - x.at for x, y in zip(refs[::2], refs[1::2], strict=False) if x.round == y.round]
        if spans:
            floor = floor + curvature_residual(self.duels, statistics.fmean(spans))
        return rk.paired_verdict(a, b, fig[a], fig[b], confidence=confidence, drift_floor=floor,
                                 min_difference=self.min_difference,
                                 a_knees=caps[a], b_knees=caps[b], step=step,
                                 a_doubts=knees.get(a, {}).get("why", []), b_doubts=knees.get(b, {}).get("why", []),
                                 a_lower=[bool(x) for x in lower.get(a, [])],
                                 b_lower=[bool(x) for x in lower.get(b, [])])

    def analyse(self, confidence: float = rk.DEFAULT_CONFIDENCE) -> None:
        self.knees = self.knee_summary() if self.knee_rounds else {}
        self.pairs = [self.verdict(a, b, confidence) for i, a in enumerate(self.presets) for b in self.presets[i + 1:]]
        self.ranking = rk.rank(self.presets, self.pairs)
        adjusted = self.readings("adjusted") if self.knee_rounds else self.values("adjusted")
        raw = rk.drift_seen(self.presets, self.values("output_tps"))
        refs = [d for d in self.duels if d.reference]
        within = [round((b.output_tps / a.output_tps - 1) * 100, 1) for a, b in zip(refs[::2], refs[1::2], strict=False)
                  if a.output_tps and b.output_tps]
        self.drift = {"own_range_pct": raw["own_range_pct"], "host_index": raw["host_index"],
                      "raw_pair_range_pct": raw["pair_range_pct"],
                      "adjusted_pair_range_pct": rk.drift_seen(self.presets, adjusted)["pair_range_pct"],
                      "reference_moved_within_round_pct": within}

    def lines(self) -> list[str]:
        return summary_lines(self)

    def pairs_csv(self) -> str:
        return pairs_csv(self)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"presets": self.presets, "searches": [asdict(r) for r in self.searches],
                "duels": [asdict(d) for d in self.duels], "pairs": [v.to_dict() for v in self.pairs],
                "ranking": self.ranking.to_dict() if self.ranking else None, "drift": self.drift,
                "notes": self.notes, "co_residency": self.co_residency, "refused": self.refused, "turns": self.turns,
                "seconds": round(self.seconds, 1), "knee_rounds": [asdict(k) for k in self.knee_rounds],
                "knees": self.knees, "step": self.step, "min_difference_pct": round(100 * self.min_difference, 3),
                "order_seed": self.order_seed}


def curvature_residual(duels: list[DuelLevel], span: float) -> float:
    """What the linear drift correction (adjust()) may leave in a round whose
    reference looks lie `span` seconds apart, from the drift's curvature as
    the presets' own figure levels show it: for each preset, three looks at
    one load in a row (t1 < t2 < t3, across rounds), the second's miss of the
    line through the other two, |r|, is about f'' (t3 - t1)^2 / 8 at the
    middle, so over a round's span the line misses by about
    |r| (span / (t3 - t1))^2. The mean over the triples (log ratio).

    Why: DRIFT_RESIDUAL scales what the reference moved within each round,
    and a reference whose two looks straddle a peak of the drift moved ~0
    while the look between them sat at the peak. On the simulated host
    drifting +-30 % over a minute, rounds about half a period apart put
    every round's figures at a peak or a trough, the rotation of the
    reference turned each round's miss the same way, and an A/A pair read
    +-10 % "beyond noise" (4-15 %) in 6 of 100 runs once the rungs were
    shortened (RUNG_SHARE). The presets' looks across rounds see the peaks
    and troughs that the reference's pair within a round hides."""
    by: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for d in duels:
        if d.step in ("at", "again") and d.output_tps and d.output_tps > 0:
            by.setdefault((d.preset, d.load), []).append((d.at, math.log(d.output_tps)))
    misses = []
    for looks in by.values():
        looks.sort()
        for (t1, x1), (t2, x2), (t3, x3) in zip(looks, looks[1:], looks[2:], strict=False):
            if t3 - t1 <= 0:
                continue
            line = x1 + (x3 - x1) * (t2 - t1) / (t3 - t1)
            misses.append(abs(x2 - line) * min(1.0, span / (t3 - t1)) ** 2)
    return statistics.fmean(misses) if misses else 0.0


PAIR_CSV_COLUMNS = ("a", "b", "metric", "rounds", "better", "gap_pct", "low_pct", "high_pct", "beyond_noise",
                    "verdict")


def pairs_csv(result: PairedResult) -> str:
    """One row per pair and metric: the verdict, its gap and interval in %."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(PAIR_CSV_COLUMNS)
    for v in result.pairs:
        gap = v.gap_pct()
        g = ["", "", ""] if gap is None else [round(x, 1) for x in gap]
        w.writerow([v.a, v.b, v.metric, v.rounds, v.better or "", *g, v.beyond_noise, v.text()])
    return buf.getvalue()


def summary_lines(result: PairedResult) -> list[str]:
    """The verdicts in words: for the terminal and the markdown export."""
    n = max((d.round for d in result.duels), default=0)
    conf = result.pairs[0].confidence if result.pairs else rk.DEFAULT_CONFIDENCE
    if result.knee_rounds:
        lines = [f"Pairs (output tok/s at each preset's knee, re-measured every round on a ladder around it, {n} "
                 f"duel round(s) paired against a reference measured before and after, {conf:.0%} interval; "
                 f"the knees compared beside):"]
    else:
        lines = [f"Pairs (output tok/s at each preset's capacity, {n} duel round(s) paired against a reference "
                 f"measured before and after, {conf:.0%} interval):"]
    lines[0] = lines[0][:-2] + f"; {rk.floor_words(result.min_difference)}):"
    for v in result.pairs:
        cap = v.capacity
        lines.append(f"- {v.text()}" + (f"; capacity {cap['gap_pct'][0]:+.0f} % ({cap['gap_pct'][1]:+.0f} to "
                                        f"{cap['gap_pct'][2]:+.0f} %, one ladder step widened)" if cap else ""))
    for name, k in result.knees.items():
        seen = ", ".join("-" if x is None else f"{x:g}" for x in k.get("knees") or [])
        low = k.get("lower_bound_rounds") or []
        edge = k.get("edge_rounds") or []
        lines.append(f"Knee of {name}: {seen or '-'} by round" + (
            f" (only a lower bound in round {', '.join(map(str, low))}: measured far under its knee while "
            "another preset was at its own)"
            if low else "") + (
            f" (read at an undecided level in round {', '.join(map(str, edge))}: no level passed decided, "
            "and that level's p99 sat within its own noise of the limit)"
            if edge else "") + (f"; UNCERTAIN: {'; '.join(k['why'])}" if k.get("uncertain") else ""))
    if result.ranking is not None:
        lines.append(f"Ranking (pairs beyond noise only): {result.ranking.text()}")
    d = result.drift
    own = {k: v for k, v in (d.get("own_range_pct") or {}).items() if v is not None}
    if own:
        moved = ", ".join(f"{k} {v:.0f} %" for k, v in own.items())
        raw = ", ".join(f"{k} {v:.0f} %" for k, v in (d.get("raw_pair_range_pct") or {}).items() if v is not None)
        adj = ", ".join(f"{k} {v:.0f} %" for k, v in (d.get("adjusted_pair_range_pct") or {}).items()
                        if v is not None)
        within = ", ".join(f"{v:+.0f} %" for v in d.get("reference_moved_within_round_pct") or [])
        lines.append(f"Drift seen: each preset's tok/s moved across rounds by {moved}; the reference within "
                     f"each round by {within or '-'}; pair ratios moved {raw or '-'} raw, {adj or '-'} adjusted")
    caps = ", ".join(f"{r.preset} {'≥ ' if r.at_ceiling else ''}{r.capacity:g}" for r in result.searches
                     if r.capacity is not None)
    if caps:
        lines.append(f"Capacities found in round 0 (one search each, levels alternating): {caps}")
    if result.co_residency:
        lines.append(f"Servers: {result.co_residency}")
    lines += [f"Note: {n}" for n in result.notes]
    return lines


# -- the servers, all up at once ---------------------------------------------------

@dataclass
class _Served:
    preset: Preset
    spec: LaunchSpec
    server: EngineServer
    ready: SweepRun  # what the start learned (ready_s, versions, KV): copied to each round's run


def co_residency(presets: list[Preset], preflights: list[Any], max_concurrency: int, model: str | None = None,
                 tokens_per_request: int | None = None) -> tuple[list[Preset] | None, str]:
    """Whether the presets can be served side by side, and how: on CPU (or
    stand-ins) each as it is; on one GPU each with an equal share of its
    memory (gpu_memory_utilization GPU_SHARE_TOTAL / n, or its own when
    lower) when preflight at that share still holds the search's highest
    concurrency in the KV pool: requests of `tokens_per_request` tokens (the
    load's longest prompt and output) when known, else of max_model_len each
    (preflight's worst case: 5 presets of a 0.3B model at a fifth of an H200
    hold ~280 requests of 4,096 tokens but thousands of the sweep's ~430).
    (None, why) when they cannot be."""
    on_gpu = [p for p, r in zip(presets, preflights, strict=True)
              if r.estimate is not None and r.estimate.platform == "cuda"]
    if not on_gpu:
        return presets, "every server up at once, each on its own port with its own log (no GPU shared)"
    share = round(GPU_SHARE_TOTAL / len(presets), 3)
    out, said = [], []
    for p in presets:
        own = p.get("gpu_memory_utilization")
        util = min(float(own), share) if own is not None else share
        q = p.with_changes(gpu_memory_utilization=util)
        res = run_preflight(q, q.resolve_model(model))
        est = res.estimate
        held = _requests_held(est, tokens_per_request)
        if not res.ok or est is None or held is None or held < max_concurrency:
            problem = res.first_error()
            why = (problem.message if problem else "preflight failed") if not res.ok else (
                f"its KV pool at gpu_memory_utilization {util} holds {held:.0f} requests{_of(tokens_per_request)} "
                f"where the search may go to {max_concurrency}" if held is not None else "no estimate")
            return None, f"{p.name} does not fit beside the others on one GPU: {why}"
        q, pinned = _pin_kv(q, est)
        out.append(q)
        said.append(f"{p.name} gpu_memory_utilization {util} (KV pool {held:.0f} requests{_of(tokens_per_request)}"
                    f"{pinned})")
    return out, "side by side on one GPU, each given a share of its memory: " + "; ".join(said)


def _pin_kv(preset: Preset, est: Any) -> tuple[Preset, str]:
    """The preset with its KV pool fixed at preflight's estimate for its
    share (kv_cache_memory_bytes, whole MiB), unless it sets one itself:
    vLLM then skips its memory profile, so the servers can start at once
    (a profile reads the memory free at that moment, which a neighbour
    starting beside it changes); one after another, five took 7.5 min on an
    H100. The share stays as gpu_memory_utilization: vLLM still checks at
    start that that much is free, which the others' shares leave."""
    kv = getattr(est, "kv_cache_bytes", None)
    if preset.kv_cache_memory_bytes is not None or not kv or kv <= 0:
        return preset, ""
    pinned = int(kv) // (1 << 20) << 20
    return preset.with_changes(kv_cache_memory_bytes=pinned), f", pinned at {pinned / GiB:.2f} GiB"


def _requests_held(est: Any, tokens_per_request: int | None) -> float | None:
    """How many requests the estimated KV pool holds at once."""
    if est is None:
        return None
    if tokens_per_request and getattr(est, "kv_cache_tokens", None):
        return est.kv_cache_tokens / tokens_per_request
    return float(est.max_concurrency)


def _of(tokens_per_request: int | None) -> str:
    return f" of {tokens_per_request:,} tokens" if tokens_per_request else ""


def _emit(progress: Progress | None, lock: threading.Lock, **event: Any) -> None:
    if progress is None:
        return
    with lock:  # searches report from their own threads: listeners see one event at a time
        try:
            progress(event)
        except Exception:  # noqa: BLE001  a display callback must not end the sweep; logged, not lost
            log.exception("sweep progress callback failed")


def _start_one(preset: Preset, port: int, options: SweepOptions, log_dir: Path) -> tuple[_Served, SweepRun]:
    """Launch one preset's server (not waiting for it): (served, its run)."""
    run = SweepRun(preset=preset.name, repeat=0, status="ok", key_args=preset.key_args(), mode="capacity",
                   port=port)
    preset = replace(preset, port=port)
    spec = preset.launch_spec(preset.resolve_model(options.model))
    server = EngineServer(spec, preset_name=preset.name, log_path=log_dir / f"{preset.name}.log")
    run.started_at = time.time()
    server.start()
    return _Served(preset, spec, server, run), run


def _wait_ready(s: _Served, options: SweepOptions, cancel: threading.Event) -> None:
    """Wait for the server; the run says how it went (status stays 'ok' when ready)."""
    deadline = time.monotonic() + options.ready_timeout_s
    st = s.server.status
    while time.monotonic() < deadline and not cancel.is_set():
        st = s.server.wait_ready(min(1.0, max(0.0, deadline - time.monotonic())))
        if st.state != ServerState.STARTING:
            break
    run = s.ready
    if cancel.is_set():
        run.status, run.message = "cancelled", "cancelled while starting"
    elif st.state != ServerState.READY:
        err = st.error
        run.status = f"failed: {err.kind.value}" if err else "failed: timeout"
        run.message = err.message if err else f"not ready after {options.ready_timeout_s:.0f} s"
    else:
        report = s.server.report
        run.ready_s = (st.ready_at - st.started_at) if st.ready_at and st.started_at else None
        run.weights_gib, run.kv_cache_gib = report.weights_gib, report.kv_cache_gib
        run.vllm_version, run.platform = report.vllm_version, report.platform
        run.kv_cache_tokens, run.max_concurrency = report.kv_cache_tokens, report.max_concurrency


def _skipped(preset: Preset, result: Any) -> SweepRun:
    problem = result.first_error()
    return SweepRun(preset=preset.name, repeat=0, status=f"skipped: {problem.kind.value if problem else 'preflight'}",
                    message=f"preflight: {problem.message if problem else 'failed'}", key_args=preset.key_args(),
                    mode="capacity")


def start_all(presets: list[Preset], options: SweepOptions, capacity: CapacitySweep, log_dir: Path,
              cancel: threading.Event, tokens_per_request: int | None = None
              ) -> tuple[list[_Served], list[SweepRun], str]:
    """Preflight every preset, then start them and wait for each: (the ones
    serving, the runs of the ones that are not, how they share the machine).
    ([], [], why) when they cannot share it (the caller runs the sequential
    sweep instead). All start at once: on CPU and stand-ins as they are; on
    one GPU with each KV pool pinned (_pin_kv). Only where a pool could not
    be pinned do they start one after another: vLLM would size it from the
    memory it sees free while it profiles, which a neighbour starting beside
    it changes."""
    checked = [(p, run_preflight(p, p.resolve_model(options.model))) for p in presets]
    skipped = [_skipped(p, r) for p, r in checked if not r.ok]
    fit = [(p, r) for p, r in checked if r.ok]
    shared, how = co_residency([p for p, _ in fit], [r for _, r in fit],
                               capacity.search.max_concurrency, options.model, tokens_per_request)
    if shared is None:
        return [], [], how
    one_gpu = any(r.estimate is not None and r.estimate.platform == "cuda" for _, r in fit)
    one_by_one = one_gpu and any(p.kv_cache_memory_bytes is None for p in shared)
    served: list[_Served] = []
    ports: set[int] = set()
    for p in shared:
        port = _trial_port(p, ports)
        ports.add(port)
        s, _run = _start_one(p, port, options, log_dir)
        served.append(s)
        if one_by_one:
            _wait_ready(s, options, cancel)
    for s in served if not one_by_one else []:
        _wait_ready(s, options, cancel)
    failed = [s for s in served if s.ready.status != "ok"]
    stop_all(failed)
    return [s for s in served if s.ready.status == "ok"], skipped + [s.ready for s in failed], how


def stop_all(served: list[_Served]) -> None:
    """Stop every server, all at once (a stop waits out its grace periods:
    one after another they added up, 20 s a stand-in)."""

    def stop(s: _Served) -> None:
        try:
            if s.server.status.running or s.server.status.state == ServerState.CRASHED:
                s.server.stop()
        finally:
            s.server.close()
            s.ready.ended_at = time.time()

    threads = [threading.Thread(target=stop, args=(s,), name=f"stop-{s.preset.name}") for s in served]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- round 0: every preset's search, the levels taking turns ------------------------------

def _search_one(s: _Served, search: Any, capacity: CapacitySweep, burst_config: BurstConfig,
                gate: TurnGate, runners: dict[str, Any], on_event: Callable[[dict[str, Any]], None],
                cancel: threading.Event) -> tuple[SweepRun, CapacityResult | None]:
    """One preset's search, its levels taking turns at the gate; its level
    runner is kept in `runners` for the duels."""
    from ernie_tui.engine_ctl.load import (  # lazy: when a search runs
        ProbeFailure,
        Workload,
        find_tokenizer,
        run_capacity,
    )

    run = replace(s.ready, repeat=0, started_at=time.time(), record_id=None, load_pid=os.getpid())
    name = s.preset.name

    def gated(runner: Any) -> Any:
        # run_capacity closes its runner when the search ends (its stream
        # processes, with --client-procs > 1); the duels still need it: the
        # close is kept for the sweep's end (run_paired_sweep).
        runners[name] = runner
        runner.close_later = runner.close
        runner.close = lambda: None
        return gate.wrap(name, runner)

    try:
        workload = Workload(list(capacity.workload_items), "file") if capacity.workload_items else None
        tokenizer = None
        if workload is None:
            try:
                tokenizer = find_tokenizer(model_dir=s.spec.model)
            except ProbeFailure:
                tokenizer = None  # the search asks the server's /tokenize instead
        result = run_capacity(s.spec.url, capacity.slo, search_config=search, rules=capacity.rules,
                              settings=capacity.settings, workload=workload, burst_config=burst_config,
                              tokenizer=tokenizer, model=s.spec.served_model_name, api_key=s.preset.api_key(),
                              progress=on_event, cancel=cancel, level_gate=gated)
    except Exception as exc:  # noqa: BLE001  one search's surprise must not stop its neighbours; its row says it
        log.exception("paired search of %s failed", name)
        run.status, run.message = "failed: error", f"{type(exc).__name__}: {exc}"
        return run, None
    finally:
        gate.leave(name)
        run.ended_at = time.time()
    fill_capacity_columns(run, result)
    run.burst_s = result.seconds
    if result.stop_reason == "cancelled" or cancel.is_set():
        run.status, run.message = "cancelled", "cancelled during the capacity search"
    elif result.stop_reason == "server_down":
        run.status, run.message = "failed: capacity", result.stop_message
    return run, result


def search_round(served: list[_Served], capacity: CapacitySweep, burst_config: BurstConfig,
                 emit: Callable[..., None], cancel: threading.Event, total: int, runners: dict[str, Any],
                 save: bool = True) -> tuple[list[tuple[SweepRun, CapacityResult | None]], list[str]]:
    """Every preset's search at once, one thread each, their levels taking
    turns. Returns (run, result) in served's order and the gate's turns."""
    gate = TurnGate([s.preset.name for s in served], cancel)
    out: list[Any] = [None] * len(served)

    def work(i: int, s: _Served) -> None:
        ev = dict(preset=s.preset.name, repeat=0, index=i, total=total, port=s.ready.port)
        emit(**ev, phase="capacity")
        knee = (capacity.knees or {}).get(s.preset.name)
        search = capacity.search if knee is None else search_around(capacity.search, knee)
        out[i] = _search_one(s, search, capacity, burst_config, gate, runners,
                             lambda e: emit(**ev, phase="capacity", capacity_event=e), cancel)
        run, result = out[i]
        if save and result is not None:
            record = save_run("capacity", result.to_dict(), preset=s.preset, engine_report=s.server.report.to_dict(),
                              url=s.spec.url, model=s.spec.served_model_name, notes="paired sweep search")
            run.record_id = record.id
        emit(**ev, phase="done", status=run.status, run=run)

    threads = [threading.Thread(target=work, args=(i, s), name=f"paired-{s.preset.name}", daemon=True)
               for i, s in enumerate(served)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, gate.order


def search_around(search: SearchConfig | None, knee: float) -> SearchConfig:
    """A search that starts at a knee an earlier run found (--knees-from)
    and steps up by (1 + tolerance): where the knee holds, two levels (the
    knee passes, the step above fails) instead of a whole search (the 22nd
    GPU run's round 0: 5-7 levels a preset from 64, 7.6 min for five
    presets). Where the step above passes too, it goes on stepping up to the
    search's own ceiling (before 2026-12-06 it stopped there: in the 24th GPU
    run two presets' duels ran at a lower bound, one step above their old
    knees); failing the knee bisects below it."""
    base = search or SearchConfig()
    growth = 1 + base.tolerance
    if base.rate:
        return replace(base, start_rate=knee, growth=growth, max_rate=max(base.max_rate, round(knee * growth, 3)))
    start = max(1, int(knee))
    return replace(base, start=start, growth=growth,
                   max_concurrency=max(base.max_concurrency, start + 1, math.ceil(start * growth)))


def knees_from(path: Path) -> dict[str, float]:
    """Each preset's duel load in a paired sweep's JSON export (its
    `paired.searches`), for search_around(). ValueError with a plain
    message for a file that is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    paired = data.get("paired") if isinstance(data, dict) else None
    searches = paired.get("searches") if isinstance(paired, dict) else None
    if not isinstance(searches, list):
        raise ValueError(f"{path} is not a paired sweep's JSON export (no paired.searches): write one with "
                         "`ernie-tui sweep A B --capacity --out FILE.json`")
    # The knee its ladder ended on where the export has one (since 2026-12-07), else where its duels ran.
    knees = {s["preset"]: float(s.get("final_knee") or s["duel_load"]) for s in searches
             if isinstance(s, dict) and s.get("preset") and (s.get("final_knee") or s.get("duel_load"))}
    if not knees:
        raise ValueError(f"{path} holds no preset's duel load (its searches found no capacity)")
    return knees


def _preset_round(run: SweepRun, result: CapacityResult | None, step: float = 0.1, rate: bool = False
                  ) -> PresetRound:
    cap = run.capacity_rate if run.capacity_rate is not None else run.capacity_concurrency
    found = duel_load(result) or cap
    # far under the limit there: start higher (knee_ladder.start_knee)
    load = kl.start_knee(found, result.levels, step, rate) if result is not None else found
    return PresetRound(preset=run.preset, round=0, capacity=cap, goodput_output_tps=run.goodput_output_tps,
                       stop=result.stop_reason if result else run.status, levels=len(result.levels) if result else 0,
                       started_at=run.started_at, ended_at=run.ended_at,
                       at_ceiling=bool(result and result.at_ceiling), duel_load=load,
                       duel_seconds=duel_seconds(result, found), rung_seconds=rung_seconds(result, found),
                       doubts=kl.search_doubts(result.levels) if result else [])


def duel_load(result: CapacityResult | None) -> float | None:
    """Where a preset's duels run: the highest load that passed in its
    search (decided), not the capacity the search ended on. Under drift a
    search's answer sinks to the host's slowest minutes (a confirmation that
    fails moves the bracket down, none moves it up): on the drifting
    stand-in (+-30 % over 2 min, a loaded 2-core box) both presets' searches
    of one run ended at 9 where they had passed 16 and 20 (their knees 8 and
    10), and a duel at 9 compared the stronger below its knee (+11 % read
    for a true +25 %). The highest pass is what each carried at the best
    minutes of the same interleaved search, so the two are alike."""
    if result is None:
        return None
    passed = [lv.load for lv in result.levels if lv.passed and lv.decided and lv.stop != "cancelled"]
    return max(passed) if passed else None


def _level_times(result: CapacityResult | None, load: float | None) -> tuple[float, float, float] | None:
    """(warm-up, one request's time, window) of the search's passing level
    at `load`, seconds; None where it has none (or no warm-up)."""
    level = None
    if result is not None and load is not None:
        at = [lv for lv in result.levels if lv.load == load and lv.passed and lv.stop != "cancelled"]
        level = at[-1] if at else None
    if level is None or not level.warmup_s:
        return None
    e2e = [m / 1000.0 for m in (level.window_e2e_ms or []) if m is not None and math.isfinite(m)]
    request_s = statistics.median(e2e) if e2e else level.warmup_s
    return level.warmup_s, request_s, level.window_s or 1.0  # (capacity's shortest window)


def rung_seconds(result: CapacityResult | None, load: float | None) -> float:
    """How long a rung of the ladder may run: RUNG_SHARE of the duel level,
    but never less than a pass takes under the search's rules: its warm-up,
    DEFAULT_MIN_WINDOWS windows that agree and one more (a window closes
    only once its requests have ended), and one request's time. Shorter, a
    rung that passes would end undecided at its cap and move no knee up. On
    the paced stand-in (requests 0.7 s, windows 1 s) that is 5.4 s of an 8 s
    duel level; a fail decides sooner."""
    duel = duel_seconds(result, load)
    times = _level_times(result, load)
    warm, request_s, window = times if times is not None else (1.0, 1.0, 1.0)
    return round(min(duel, max(RUNG_SHARE * duel, warm + (DEFAULT_MIN_WINDOWS + 1) * window + request_s)), 1)


def duel_seconds(result: CapacityResult | None, load: float | None) -> float:
    """How long a duel level at `load` may run: DUEL_LEVEL_S, or longer
    where the preset's requests take long at that load: its search's level
    there, warm-up plus four request times (the median of its windows'
    median E2E). A level's window counts only once every request sent in it
    has ended, so a level must outlast its warm-up and a few requests. Why:
    on an H100 (the 22nd GPU run) requests at concurrency 256 took 2-4 s; an
    8 s duel level closed one window or none and its figure came from a
    handful of requests (the same server read 16.5 k, then 10.3 k tok/s 48 s
    later), so every pair stayed within noise but one."""
    times = _level_times(result, load)
    if times is None:
        return DUEL_LEVEL_S
    warm, request_s, _window = times
    return max(DUEL_LEVEL_S, round(warm + 4 * request_s, 1))


# -- rounds 1..R: duels at each preset's capacity --------------------------------------------------

def _reuse(runner: Any, rules: Any, seconds: float = DUEL_LEVEL_S) -> None:
    """A search's level runner made ready for the duel's levels: each runs
    `seconds` (duel_seconds(); or to --max-requests), not until a verdict
    (its min requests raised to its max, so no early pass or fail ends it).
    The floor under a verdict stays the search's (LevelRules.judged_floor):
    raised with min_requests, a duel level of 8 s at concurrency 24 on the
    loaded 2-core box counted fewer than its 60 and read "too few requests",
    no pass, and the ladder lost that knee's reading."""
    runner.rules = replace(rules, min_requests=rules.max_requests, min_judged=rules.judged_floor,
                           time_cap_s=min(rules.time_cap_s, seconds))


def duel_order(names: list[str], r: int) -> list[str]:
    """Round r's levels (r from 1): the names rotated by r - 1, the first of
    them (the round's reference) once more at the end."""
    k = (r - 1) % len(names)
    order = names[k:] + names[:k]
    return [*order, order[0]]


def drawn_orders(names: list[str], rounds: int, rng: random.Random) -> list[list[str]]:
    """Each ladder round's order (as duel_order's): the rotation, over the
    names in an order drawn at random afresh every len(names) rounds, so each
    block of rounds has every preset as its reference once, in a random turn.

    Why draw it: the linear drift correction leaves a miss where the host's
    speed curves, of one sign at a peak and the other at a trough, and the
    rotation turns it round each round with the reference. Rounds about half
    a drift period apart then put it on the same side of the pair every
    round, and the rounds agree on a bias: on the simulated host (+-30 %
    over a minute, rounds of 33 s with half-length rungs) an A/A pair read
    9-12 % apart "beyond noise" in 6 of 100 runs. A turn drawn at random
    cannot line up with any period of the host's; in blocks, every preset is
    still the reference as often as the others (drawn freely, one preset was
    the reference in all three rounds of an A/A run and read 6 % ahead).
    curvature_residual() widens the interval for what remains."""
    out: list[list[str]] = []
    n = len(names)
    perm: list[str] = []
    for r in range(rounds):
        if r % n == 0:
            perm = rng.sample(names, n)
        k = r % n
        order = perm[k:] + perm[:k]
        out.append([*order, order[0]])
    return out


def adjust(levels: list[DuelLevel], clamp: bool = False) -> bool:
    """Each level's output tok/s over the reference's at the same moment:
    ln(reference) interpolated in wall time between its two looks (so a
    drift that is linear over the round cancels exactly). False when the
    reference's two looks are not both measured (nothing adjusted).
    `clamp`: a level outside the two looks (a ladder's step) is divided by
    the nearer look, not by a line drawn past it."""
    refs = [d for d in levels if d.reference]
    if len(refs) != 2 or not all(d.output_tps for d in refs):
        return False
    a, b = refs
    la, lb = math.log(a.output_tps or 1.0), math.log(b.output_tps or 1.0)
    for d in levels:
        if d.output_tps:
            w = (d.at - a.at) / (b.at - a.at) if b.at > a.at else 0.5
            w = min(1.0, max(0.0, w)) if clamp else w
            d.adjusted = math.exp(math.log(d.output_tps) - (la + w * (lb - la)))
    return True


def duel_round(r: int, names: list[str], loads: dict[str, float], runners: dict[str, Any], rate: bool,
               emit: Callable[..., None], cancel: threading.Event, first_index: int, total: int,
               clock: Callable[[], float] = time.time) -> list[DuelLevel]:
    """One duel round at fixed loads (the design before 2026-12-07, kept for
    comparison: bench/verdict_calibration.py --design fixed): a short level
    per preset at its capacity load, the reference first and last
    (duel_order), then adjust()."""
    order = duel_order(names, r)
    out: list[DuelLevel] = []
    for k, name in enumerate(order):
        if cancel.is_set():
            break
        load = loads[name]
        t0 = clock()
        try:
            lv = runners[name](load if rate else int(load))
        except Exception:  # noqa: BLE001  one level's surprise leaves a hole in the round, not the sweep's end
            log.exception("duel level of %s failed", name)
            lv = None
        t1 = clock()
        tps_of = (lv.stream_output_tps or lv.output_tps) if lv else None  # see LevelResult.stream_output_tps
        out.append(DuelLevel(name, r, load, (t0 + t1) / 2, t1 - t0, tps_of, lv and lv.goodput_output_tps,
                             bool(lv and lv.passed), reference=k in (0, len(order) - 1),
                             window_output_tps=lv and lv.window_output_tps))
        tps = f"{tps_of:,.0f} tok/s" if tps_of else "no figure"
        emit(preset=name, repeat=r, index=first_index + k, total=total,
             phase=f"duel round {r}: {'rate' if rate else 'concurrency'} {load:g}, {tps}")
    adjust(out)
    return out


# (preset, load, kind) -> LevelResult | None. kind: "figure" (a knee level
# whose tok/s the pairs compare: the duel's full length), "rung" (a step of
# the ladder: only its verdict counts, so it may end as soon as that is
# clear), "longer" (a second look near the limit: twice the requests and time).
Measure = Callable[[str, float, str], Any]


def ladder_round(r: int, names: list[str], knees: dict[str, float], measure: Measure, rate: bool, step: float,
                 emit: Callable[..., None], cancel: threading.Event, first_index: int, total: int,
                 clock: Callable[[], float] = time.time, ceiling: float | None = None,
                 order: list[str] | None = None, seen: dict[str, list[kl.Look]] | None = None,
                 floors: dict[str, float | None] | None = None) -> tuple[list[DuelLevel], list[kl.KneeRound]]:
    """One duel round of ladders (knee_ladder.py): in duel_order, each preset
    at its knee, the round's reference at its knee again at the end; then
    for each, one step above where its knee passed, else its knee once more
    and, where that failed too, one rung below (and one more where that
    failed). A level near its limit whose percentile rests on few
    requests (knee_ladder.thin_near_limit), or undecided near it, is measured
    once more, longer (`measure(name, load, "longer")`), and the second look
    counts: the search's remeasure, for the tail. Returns the levels
    (adjusted against the reference) and each preset's reading. `order`:
    the round's (drawn_orders); None: duel_order's rotation. `seen`: filled
    with each preset's decided-or-not looks in the order measured (second
    looks included), for its knee_ladder.Bracket; `floors`: each preset's
    highest live decided pass (Bracket.live), which the first rung below a
    failed knee does not go under."""
    order = order or duel_order(names, r)
    out: list[DuelLevel] = []
    looks: dict[str, list[kl.Look]] = {n: [] for n in names}
    thin: dict[str, list[str]] = {n: [] for n in names}
    finals: dict[str, list[DuelLevel]] = {n: [] for n in names}
    again: set[str] = set()

    def one(name: str, load: float, rung: str, reference: bool = False) -> Any:
        index = first_index + len(out)
        kind = "figure" if rung in ("at", "again") else "rung"
        lv, t0, t1 = _timed(measure, name, load, kind, clock)
        look = kl.Look.of(lv) if lv is not None else None
        if look is not None and rung != "again" and name not in again and _worth_again(look):
            again.add(name)  # one second look a preset a round: the round's length stays bounded
            out.append(_duel(name, r, load, t0, t1, lv, False, f"{rung} (first look)"))
            lv, t0, t1 = _timed(measure, name, load, "longer", clock)
            look = kl.Look.of(lv) if lv is not None else None
            still = look and kl.thin_near_limit(look)
            if still:
                thin[name].append(f"{load:g}: {still}")
        d = _duel(name, r, load, t0, t1, lv, reference, rung)
        out.append(d)
        if look is not None and seen is not None:
            seen.setdefault(name, []).append(look)
        if look is not None and rung != "again":
            looks[name].append(look)
            finals[name].append(d)
        tps = f"{d.output_tps:,.0f} tok/s" if d.output_tps else "no figure"
        verdict = f", {d.verdict}" if d.verdict else ""
        emit(preset=name, repeat=r, index=index, total=total,
             phase=f"duel round {r}: {'rate' if rate else 'concurrency'} {load:g} ({rung}), {tps}{verdict}")
        return lv

    # First each preset at its knee, the reference first and again last: the
    # levels whose tok/s the pairs compare, within as short a span as the
    # fixed-load duels had (a round of five levels spanned 40 s, a third of
    # the drifting stand-in's period, and the interpolation kept its curve).
    # Then each one's step above (its knee passed) or below (it failed).
    for k, name in enumerate(order):
        if cancel.is_set():
            break
        one(name, knees[name], "again" if k == len(order) - 1 else "at", reference=k in (0, len(order) - 1))
    for name in order[:-1]:
        at = knees[name]
        if cancel.is_set() or not looks[name]:
            continue
        if not looks[name][0].passed and not looks[name][0].decided:
            continue  # undecided: no evidence to step down on (knee_ladder.next_after)
        if looks[name][0].passed:
            # (never past the search's ceiling: on one GPU each KV pool was sized to hold it)
            up = kl.step_up(at, step, rate) if ceiling is None else min(ceiling, kl.step_up(at, step, rate))
            if up > at:
                one(name, up, "above")
            continue
        # A knee that failed is measured once more before the ladder goes
        # down: a tail spike fails one level by as much as the host's drift
        # (issue #56: 23.6 ms against 20 where the gaps were 10-13), and a
        # knee moved down by a spike read the next round far under it.
        if one(name, at, "at, once more") is None or looks[name][-1].passed or not looks[name][-1].decided:
            continue
        load: float | None = at
        floor = (floors or {}).get(name)
        for i in range(2):  # as far below as the failed level read over its limit (knee_ladder.down_steps)
            load = kl.step_down(load, step, rate, kl.down_steps(looks[name][-1], step)) if load is not None else None
            # The first rung not under the highest load that passed, decided, in recent rounds: a
            # queueing knee's fail reads far over its limit one step past the knee, so down_steps()
            # went 4 steps under a knee bracketed one step wide (knee_ladder.Bracket).
            if i == 0 and load is not None and floor is not None and load < floor < at:
                load = floor
            if load is None or cancel.is_set():
                break
            if one(name, load, "below") is None or looks[name][-1].passed or not looks[name][-1].decided:
                break
    adjust(out, clamp=True)
    readings = []
    for name in names:
        if not looks[name]:
            continue
        # Its tok/s at its knee: the level at the knee it brought into the
        # round, measured between the reference's looks, whatever its
        # verdict. The ladder's rungs come later in the round, where the
        # reference's line no longer reaches: on the drifting stand-in (+-30 %
        # over 2 min) their figures strayed by up to 20 %; and dropping the
        # rounds whose knee level failed by more than a little dropped one
        # round in three there, as the host moved every knee alike. What
        # pairs the presets is that each is at the knee its ladder tracks;
        # one far under it beside another at its own is marked a lower
        # bound (knee_ladder.mark_lower_bounds) and left out.
        first = finals[name][0] if finals[name] and finals[name][0].step == "at" else None
        look = looks[name][0] if first is not None else None
        counted = first
        reading = kl.read_round(name, r, knees[name], looks[name], step, rate, thin[name], look)
        if counted is not None:
            counted.counted = True
            reading.output_tps, reading.adjusted = counted.output_tps, counted.adjusted
            reading.goodput_output_tps = counted.goodput_output_tps
        readings.append(reading)
    kl.mark_lower_bounds(readings)
    return out, readings


def _worth_again(look: kl.Look) -> bool:
    """A level to measure once more: its verdict rests on a percentile of few
    samples near its limit, or it ended undecided near its limit."""
    h = kl.headroom(look)
    near = h is not None and abs(h) <= kl.NEAR_LIMIT
    return bool(kl.thin_near_limit(look)) or (not look.decided and near)


def _timed(measure: Measure, name: str, load: float, kind: str, clock: Callable[[], float]
           ) -> tuple[Any, float, float]:
    t0 = clock()
    try:
        lv = measure(name, load, kind)
    except Exception:  # noqa: BLE001  one level's surprise leaves a hole in the round, not the sweep's end
        log.exception("duel level of %s failed", name)
        lv = None
    return lv, t0, clock()


def _duel(name: str, r: int, load: float, t0: float, t1: float, lv: Any, reference: bool, rung: str) -> DuelLevel:
    tps_of = (lv.stream_output_tps or lv.output_tps) if lv else None  # see LevelResult.stream_output_tps
    return DuelLevel(name, r, load, (t0 + t1) / 2, t1 - t0, tps_of, lv and lv.goodput_output_tps,
                     bool(lv and lv.passed), reference=reference, window_output_tps=lv and lv.window_output_tps,
                     step=rung, verdict=(lv.verdict if lv else "") or "")


def run_paired_sweep(presets: list[Preset], burst_config: BurstConfig, options: SweepOptions,
                     capacity: CapacitySweep, rounds: int = DEFAULT_ROUNDS, progress: Progress | None = None,
                     cancel: threading.Event | None = None,
                     confidence: float = rk.DEFAULT_CONFIDENCE, min_difference: float = rk.DEFAULT_MIN_DIFFERENCE
                     ) -> tuple[list[SweepRun], PairedResult]:
    """The paired sweep (see the module's docstring): the runs (one search
    per preset, as a sequential sweep's rows) and the PairedResult. When the
    servers cannot be up side by side (one GPU too small for them) nothing is
    started, the runs are empty and result.refused says why."""
    cancel = cancel or threading.Event()
    t0 = time.monotonic()
    log_dir = options.log_dir or Path(__import__("tempfile").mkdtemp(prefix="ernie-sweep-"))
    paths.private_dir(log_dir)  # each server's log holds the prompts
    lock = threading.Lock()

    def emit(**event: Any) -> None:
        _emit(progress, lock, **event)

    result = PairedResult(presets=[p.name for p in presets], min_difference=min_difference)
    longest = None if capacity.workload_items else burst_config.max_tokens_in + burst_config.max_tokens
    served, runs, result.co_residency = start_all(presets, options, capacity, log_dir, cancel, longest)
    if not served and not runs:
        result.refused = result.co_residency
        return [], result
    runners: dict[str, Any] = {}
    try:
        _measure(result, runs, served, capacity, burst_config, rounds, runners, emit, cancel, options.save_records)
    finally:
        for runner in runners.values():
            getattr(runner, "close_later", runner.close)()
        stop_all(served)
    result.presets = [s.preset.name for s in served]
    result.analyse(confidence)
    result.seconds = time.monotonic() - t0
    return runs, result


def _measure(result: PairedResult, runs: list[SweepRun], served: list[_Served], capacity: CapacitySweep,
             burst_config: BurstConfig, rounds: int, runners: dict[str, Any], emit: Callable[..., None],
             cancel: threading.Event, save: bool) -> None:
    """Round 0 (the searches), then the duel rounds at the capacities found."""
    n = len(served)
    total = n + rounds * (2 * n + 1)  # a ladder's two levels a preset and the reference's closing look
    done, result.turns = search_round(served, capacity, burst_config, emit, cancel, total, runners, save)
    search = capacity.search or SearchConfig()
    for run, res in done:
        runs.append(run)
        result.searches.append(_preset_round(run, res, search.tolerance, search.rate))
    if any(r.at_ceiling for r in result.searches):
        result.notes.append("a search stopped at its ceiling: that preset's ladder stays at or under the ceiling, "
                            "a lower bound of its capacity")
    loads = {r.preset: r.duel_load for r in result.searches if r.duel_load}
    names = [s.preset.name for s in served if s.preset.name in loads and s.preset.name in runners]
    left_out = [s.preset.name for s in served if s.preset.name not in names]
    if left_out:
        result.notes.append(f"no capacity to duel at for {', '.join(left_out)}: not compared")
    if len(names) < 2:
        return
    seconds = {r.preset: r.duel_seconds or DUEL_LEVEL_S for r in result.searches}
    # A rung's rules: the search's own (a fail decides at once, a pass once
    # its windows agree), capped at rung_seconds() (RUNG_SHARE of the duel
    # level's length, or what a pass needs where that is more).
    rungs = {r.preset: r.rung_seconds or RUNG_SHARE * seconds[r.preset] for r in result.searches}
    rung_rules = {n: replace(capacity.rules or runners[n].rules,
                             time_cap_s=min((capacity.rules or runners[n].rules).time_cap_s, rungs[n]))
                  for n in names}
    for name in names:
        _reuse(runners[name], capacity.rules or runners[name].rules, seconds[name])
    rate = bool(capacity.search and capacity.search.rate)
    result.step = (capacity.search or SearchConfig()).tolerance
    knees = {k: float(v) for k, v in loads.items() if v is not None}

    def measure(name: str, load: float, kind: str) -> Any:
        runner = runners[name]
        rules = runner.rules
        if kind == "longer":  # twice the requests and time: the tail near the limit, measured wider
            runner.rules = replace(rules, min_requests=2 * rules.min_requests, max_requests=2 * rules.max_requests,
                                   time_cap_s=2 * rules.time_cap_s)
        elif kind == "rung":
            runner.rules = rung_rules[name]
        try:
            return runner(load if rate else int(load))
        finally:
            runner.rules = rules

    ceiling = float(search.max_rate if rate else search.max_concurrency)
    duel_rounds(result, names, {k: min(v, ceiling) for k, v in knees.items()}, measure, rounds, rate, emit, cancel,
                n, total, ceiling=ceiling, searched={run.preset: res.levels for run, res in done if res})


def duel_rounds(result: PairedResult, names: list[str], knees: dict[str, float], measure: Measure, rounds: int,
                rate: bool, emit: Callable[..., None], cancel: threading.Event, first_index: int = 0,
                total: int = 0, clock: Callable[[], float] = time.time, ceiling: float | None = None,
                order_seed: int | None = None, searched: dict[str, Sequence[Any]] | None = None) -> None:
    """Rounds 1..rounds of ladders from `knees` (each preset's starting
    load), each round starting where the last left each knee; the levels and
    readings go into `result` (its `step` set), each search row's final_knee
    too. The rounds' orders are drawn at random (drawn_orders) from
    `order_seed`, kept in result.order_seed; None: a seed of its own. Apart
    from the servers: a simulation hands in its own measure, clock and seed.
    `searched`: each preset's round-0 search levels; with every ladder level
    they make its knee_ladder.Bracket, which holds each round's knee between
    the live decided pass and fail (a queueing knee's tail says nothing of
    how far the knee is, so the climb and the step down alone wandered)."""
    knees = dict(knees)
    brackets = {n: kl.Bracket() for n in names}
    for n, levels in (searched or {}).items():
        if n in brackets:
            brackets[n].add(0, [kl.Look.of(lv) for lv in levels if getattr(lv, "stop", "") != "cancelled"])
            knees[n] = brackets[n].clamp(knees[n], 1)
    result.order_seed = random.SystemRandom().randrange(2 ** 31) if order_seed is None else order_seed
    orders = drawn_orders(names, rounds, random.Random(result.order_seed))
    for r in range(1, rounds + 1):
        if cancel.is_set():
            break
        seen: dict[str, list[kl.Look]] = {}
        levels, readings = ladder_round(r, names, knees, measure, rate, result.step, emit, cancel,
                                        first_index + (r - 1) * (2 * len(names) + 1), total, clock, ceiling,
                                        orders[r - 1], seen, {n: b.live(r)[0] for n, b in brackets.items()})
        result.duels += levels
        result.knee_rounds += readings
        for k in readings:
            brackets[k.preset].add(r, seen.get(k.preset, []))
            if k.next_knee is not None:
                k.next_knee = brackets[k.preset].clamp(k.next_knee, r + 1)
                knees[k.preset] = k.next_knee if ceiling is None else min(ceiling, k.next_knee)
    for row in result.searches:
        row.final_knee = knees.get(row.preset)
