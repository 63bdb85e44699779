"""The paired sweep's knee ladder and its verdict (issue #56): a knee found
too low in round 0 is corrected, a contradictory search holds back any
verdict beyond noise that rests on it. Simulated servers and clock
(tests/knee_sim.py): no timing asserted."""

from __future__ import annotations

import json
import threading

import pytest

from ernie_tui.engine_ctl.control import knee_ladder as kl
from ernie_tui.engine_ctl.control import paired_sweep as ps
from ernie_tui.engine_ctl.control import ranking as rk
from ernie_tui.engine_ctl.load import LevelResult
from knee_sim import SimHost, SimPreset, run


def _lv(load: int, passed: bool, value_ms: float, limit_ms: float = 20.0, samples: int = 5000) -> LevelResult:
    obj = {"objective": f"itl_p99={limit_ms:g}ms", "metric": "itl", "percentile": 99, "limit_ms": limit_ms,
           "value_ms": value_ms, "samples": samples, "verdict": "pass" if passed else "fail"}
    return LevelResult(concurrency=load, requests=100, passed=passed, decided=True,
                       verdict="pass" if passed else "fail", stop="decided", objectives=[obj])


def test_the_issues_search_is_contradictory():
    # Issue #56's stronger preset: 8 failed by a spike (23.6 ms against 20), then 6 and 5 failed,
    # 5, 6 and 7 passed far under the limit: its search ended at 7, its knee near 18.
    levels = [_lv(8, False, 23.6), _lv(6, False, 21.0), _lv(5, False, 20.5), _lv(5, True, 9.0),
              _lv(6, True, 10.5), _lv(7, True, 12.0)]
    doubts = kl.search_doubts(levels)
    assert doubts[0] == "failed at 6 yet passed at 7", doubts
    assert "passed 5 55% under its limit, yet failed 6, one step up, by a little" in doubts[1], doubts
    # A clean search (passes near the limit under a fail) has none; nor has a queueing knee
    # that fails far over its limit one step above a pass with room.
    assert kl.search_doubts([_lv(8, True, 15.0), _lv(16, False, 30.0), _lv(12, True, 19.0),
                             _lv(14, False, 21.5), _lv(13, True, 19.8)]) == []
    assert kl.search_doubts([_lv(8, True, 5.0), _lv(9, False, 200.0)]) == []


def test_a_knee_found_too_low_is_corrected_by_the_ladder():
    # No noise, no drift: the stronger preset (K 10: 8 ms x 1.2 x C / 10 per gap, so its capacity
    # under 20 ms is 20) handed in at 7, far below, as issue #56's search left it; the weaker
    # (K 8, capacity 16) at 13.
    host = SimHost(p99_noise=0.0, tps_noise=0.0)
    result = run([SimPreset("weaker", 8), SimPreset("stronger", 10)], host, rounds=4,
                 knees={"weaker": 13, "stronger": 7})
    strong = [k for k in result.knee_rounds if k.preset == "stronger"]
    weak = [k for k in result.knee_rounds if k.preset == "weaker"]
    assert strong[0].lower_bound and strong[0].knee == 8  # round 1: 7 and 8 passed far under the limit
    # Its tail read 48 % of the limit at 8: the next round starts twice as high (climb(): at most a doubling).
    assert strong[0].next_knee == 16
    assert [k.knee for k in strong] == [8, 18, 19, 19] and [k.lower_bound for k in strong] == [1, 0, 0, 0]
    # The weaker's knee (16) is found too and held: 17 failed twice, 15 passed; then 16 passed, 18 failed.
    assert [k.knee for k in weak] == [14, 15, 16, 16]
    assert [r.final_knee for r in result.searches] == [16, 19]
    (pair,) = result.pairs
    # Round 1 read the stronger at 7, 12.5 % under the weaker's tok/s (its figure only a lower bound);
    # rounds 2 to 4 read the truth, +25 %. That spread stays in the interval: no verdict from a knee
    # that was this far off in a round of four (round 0's start_knee climbs such a knee first).
    assert [round(d, 3) for d in pair.diffs] == [-0.134, 0.223, 0.223, 0.223]
    assert not pair.beyond_noise and pair.capacity is not None and pair.capacity["rounds"] == 4
    assert result.knees["stronger"]["lower_bound_rounds"] == [1]
    assert "Knee of stronger: 8, 18, 19, 19 by round (only a lower bound in round 1" in "\n".join(result.lines())


def test_round_0s_knee_found_far_under_its_limit_starts_the_ladder_higher():
    # The issue's search: 7 passed with ITL p99 12 ms against 20 (40 % under): the ladder starts at 12.
    levels = [_lv(8, False, 23.6), _lv(6, False, 21.0), _lv(5, False, 20.5), _lv(5, True, 9.0),
              _lv(6, True, 10.5), _lv(7, True, 12.0)]
    assert ps.duel_load(levels_result(levels)) == 7
    assert kl.start_knee(7.0, levels, 0.1, False) == 12
    # A knee that passed near its limit starts where it is.
    assert kl.start_knee(7.0, [_lv(7, True, 18.0), _lv(8, False, 21.0)], 0.1, False) == 7
    # With the stronger's ladder started there, three rounds read +25 % beyond noise.
    host = SimHost(p99_noise=0.0, tps_noise=0.0)
    result = run([SimPreset("weaker", 8), SimPreset("stronger", 10)], host, rounds=3,
                 knees={"weaker": 13, "stronger": 12})
    (pair,) = result.pairs
    assert pair.better == "stronger" and pair.beyond_noise and round(pair.gap_pct()[0]) == 25, pair.text()


def levels_result(levels: list[LevelResult]):
    from ernie_tui.engine_ctl.load import CapacityResult

    return CapacityResult(slo=[], capacity=None, levels=levels, stop_reason="bracketed", stop_message="", seconds=0.0)


def test_a_weaker_preset_read_only_as_a_lower_bound_holds_the_verdict_back():
    # The same, the other way: the preset called weaker was read far under its knee in round 1.
    # Over all three rounds b is beyond noise; without round 1 (a's lower bound) it is not.
    v = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.5, 1.25, 1.3], a_lower=[True, False, False])
    assert v.interval_excludes_zero and not v.beyond_noise and v.better is None
    assert "a's knee uncertain (round 1 read only a lower bound" in (v.held_back or "")
    assert v.text().startswith("a vs b: within noise / undecided: a's knee uncertain")
    # A lower bound on the side called better cannot make it look better than it is.
    ok = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.5, 1.25, 1.3], b_lower=[True, False, False])
    assert ok.beyond_noise and ok.better == "b"
    # Nor does one the verdict holds without.
    fine = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.3, 1.31, 1.29], a_lower=[True, False, False])
    assert fine.beyond_noise and fine.better == "b"


def test_a_contradictory_search_blocks_beyond_noise_until_the_ladder_reads_its_knee_cleanly():
    result = ps.PairedResult(presets=["a", "b"], step=0.1)
    result.searches = [ps.PresetRound("a", 0, doubts=["failed at 5 yet passed at 7"]), ps.PresetRound("b", 0)]
    rounds = [(1.0, 1.3), (1.0, 1.31), (1.0, 1.29)]
    for r, (a, b) in enumerate(rounds, 1):
        result.knee_rounds += [kl.KneeRound("a", r, 10.0, adjusted=a, lower_bound=r == 1),
                               kl.KneeRound("b", r, 13.0, adjusted=b)]
    result.analyse()
    (pair,) = result.pairs
    # Round 1 read a only as a lower bound, but the verdict holds without it; three rounds with a knee
    # read lift round 0's doubt.
    assert pair.rounds == 3 and pair.beyond_noise and pair.better == "b", pair.text()
    assert result.knees["a"]["uncertain"] is False
    for k in result.knee_rounds:
        k.lower_bound = False
    for k in (result.knee_rounds[2], result.knee_rounds[4]):  # a's rounds 2 and 3: one clean round is left
        k.doubts = ["near its limit on few requests, twice: 10: ttft_p99 ..."]
    result.analyse()
    (pair,) = result.pairs
    assert result.knees["a"]["uncertain"] and not pair.beyond_noise
    assert "round 0 search: failed at 5 yet passed at 7" in result.knees["a"]["why"]
    assert "within noise / undecided: a's knee uncertain" in pair.text()
    assert any("Knee of a:" in line and "UNCERTAIN" in line for line in result.lines())
    data = result.to_dict()
    assert data["knees"]["a"]["uncertain"] and data["pairs"][0]["held_back"] and not data["pairs"][0]["beyond_noise"]
    result.knee_rounds[2].doubts = result.knee_rounds[4].doubts = []
    result.analyse()
    assert result.pairs[0].beyond_noise and result.pairs[0].better == "b"


def test_capacities_compared_beside_are_widened_by_a_ladder_step():
    # Knees 9 and 8 in every round: no spread, but each is known to a step (10 %) only.
    v = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.0, 1.01, 0.99], a_knees=[8, 8, 8], b_knees=[9, 9, 9],
                          step=0.1)
    assert v.capacity is not None and v.capacity["low"] > 0  # a 10 % step: 9 over 8 is beyond it
    v = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.0, 1.01, 0.99], a_knees=[8, 8, 8], b_knees=[9, 9, 9],
                          step=1 / 8)  # whole concurrencies near 8: the step is 1/8 (PairedResult.verdict)
    assert v.capacity is not None and v.capacity["low"] <= 0 < v.capacity["high"]
    # Capacities beyond noise against the tok/s: held back.
    w = rk.paired_verdict("a", "b", [1.0, 1.0, 1.0], [1.3, 1.31, 1.29], a_knees=[20, 20, 20],
                          b_knees=[10, 10, 10], step=0.1)
    assert not w.beyond_noise and "the capacities differ the other way" in (w.held_back or "")


def test_a_thin_tail_near_the_limit_is_measured_again_and_said():
    calls: list[tuple[str, float, bool]] = []

    def measure(name: str, load: float, kind: str) -> LevelResult:
        calls.append((name, load, kind))
        # 40 requests' TTFT p99 at 97 % of its limit: its slowest request, twice.
        lv = _lv(int(load), load <= 10, 485.0, limit_ms=500.0, samples=40)
        lv.output_tps = lv.stream_output_tps = 100.0
        return lv

    clock = iter(range(1000))
    levels, readings = ps.ladder_round(1, ["a", "b"], {"a": 10.0, "b": 10.0}, measure, False, 0.1,
                                       lambda **_: None, threading.Event(), 0, 0, lambda: float(next(clock)))
    assert ("a", 10.0, "longer") in calls and ("b", 10.0, "longer") in calls  # the second look, longer
    assert calls[0] == ("a", 10.0, "figure")
    assert any(d.step == "at (first look)" for d in levels)
    a = next(k for k in readings if k.preset == "a")
    assert a.doubts and "near its limit on few requests, twice" in a.doubts[0] and "40 samples" in a.doubts[0]


def test_aa_in_the_simulation_is_not_called_beyond_noise():
    # The same preset under two names, drifting host, tail spikes: a handful of fixed seeds.
    for seed in range(5):
        host = SimHost(drift=0.3, jitter=0.15, seed=seed, phase=seed * 0.7)
        result = run([SimPreset("a", 8), SimPreset("b", 8)], host)
        assert not result.pairs[0].beyond_noise, (seed, result.pairs[0].text())


def test_knees_from_prefers_where_the_ladder_ended(tmp_path):
    export = tmp_path / "run.json"
    export.write_text(json.dumps({"paired": {"searches": [{"preset": "A", "duel_load": 7.0, "final_knee": 12.0},
                                                          {"preset": "B", "duel_load": 9.0}]}}))
    assert ps.knees_from(export) == {"A": 12.0, "B": 9.0}  # B: an export from before the ladder


def test_round_0s_knee_is_not_climbed_past_a_level_its_search_failed_by_far():
    # The GPU run of 2026-12-07 (H100, seed-A, --knees-from): 224 and 280 passed with ITL p99 31 ms
    # against 50 (37 % under) and TTFT p99 335 ms against 1 s; 350 failed, TTFT p99 1451 ms (45 % over).
    # Climbed by its ITL headroom, the ladder started at 444 and failed there twice.
    def gpu(load: int, passed: bool, ttft: float, itl: float) -> LevelResult:
        lv = _lv(load, passed, itl, limit_ms=50.0)
        lv.objectives.insert(0, {"objective": "ttft_p99=1s", "metric": "ttft", "percentile": 99,
                                 "limit_ms": 1000.0, "value_ms": ttft, "samples": 800})
        return lv

    levels = [gpu(224, True, 347.6, 30.9), gpu(280, True, 334.9, 31.5), gpu(350, False, 1451.1, 59.7)]
    assert kl.start_knee(280.0, levels, 0.25, False) == 280
    # A fail above it by a spike's size (ITL p99 56 ms against 50) leaves the climb as it was ...
    spiky = [gpu(224, True, 347.6, 30.9), gpu(280, True, 334.9, 31.5), gpu(350, False, 400.0, 56.0)]
    assert kl.start_knee(280.0, spiky, 0.25, False) == 444
    # ... and a fail by far higher up caps it one step under that fail.
    high = [gpu(280, True, 334.9, 31.5), gpu(500, False, 2400.0, 90.0)]
    assert kl.start_knee(280.0, high, 0.25, False) == 400


def test_round_0s_knee_is_not_climbed_past_a_level_its_search_could_not_pass():
    # The H100 run of 2026-12-07 (the 27th), seed-C: 280 passed (TTFT p99 432 ms of 1 s, ITL p99 29 ms of
    # 50), then 350 failed twice, undecided (TTFT p99 1,111 and 1,104 ms). The climb by ITL headroom
    # started the ladder at 486; the search had not passed anything above 280.
    def gpu(load: int, passed: bool, ttft: float, itl: float, decided: bool = True) -> LevelResult:
        lv = _lv(load, passed, itl, limit_ms=50.0)
        lv.objectives.insert(0, {"objective": "ttft_p99=1s", "metric": "ttft", "percentile": 99,
                                 "limit_ms": 1000.0, "value_ms": ttft, "samples": 3000})
        lv.decided = decided
        return lv

    seed_c = [gpu(280, True, 432.0, 29.0), gpu(350, False, 1111.0, 33.0, False), gpu(350, False, 1104.0, 32.0, False)]
    assert kl.start_knee(280.0, seed_c, 0.25, False) == 350
    # One undecided fail is enough: the limit lies within that level's noise.
    assert kl.start_knee(280.0, seed_c[:2], 0.25, False) == 350
    # A level that failed at every look, twice, by a spike's size each time: the same.
    twice = [gpu(280, True, 432.0, 29.0), gpu(350, False, 1100.0, 33.0), gpu(350, False, 1090.0, 33.0)]
    assert kl.start_knee(280.0, twice, 0.25, False) == 350
    # Once, by a spike, decided, and passed at another look: the climb stands (the issue's spike).
    once = [gpu(280, True, 432.0, 29.0), gpu(350, False, 1100.0, 33.0), gpu(350, True, 600.0, 30.0)]
    assert kl.start_knee(280.0, once, 0.25, False) > 350


def test_a_knee_that_failed_twice_moves_down_though_a_rung_below_passed_undecided():
    # The same GPU run, long-doc: 515 failed twice (decided), 211 passed on its point estimate but
    # never decided; round 2 measured 515 again.
    def look(load: float, passed: bool, decided: bool, ttft: float) -> kl.Look:
        return kl.Look(load, passed, decided, [{"objective": "ttft_p99=1s", "limit_ms": 1000.0, "value_ms": ttft}])

    looks = [look(515, False, True, 1700.0), look(515, False, True, 1700.0), look(211, True, False, 900.0)]
    assert kl.next_after(515.0, looks, 0.25, False) < 515
    # A decided pass below still holds the knee where it passed.
    assert kl.next_after(515.0, [*looks[:2], look(211, True, True, 900.0)], 0.25, False) == 211


def test_an_undecided_level_moves_no_knee():
    # A loaded box: every level ends undecided, its point estimate failing (ITL p99 60 ms against 50).
    def measure(name: str, load: float, kind: str) -> LevelResult:
        lv = _lv(int(load), False, 60.0, limit_ms=50.0)
        lv.decided, lv.verdict, lv.output_tps = False, "undecided", 100.0
        return lv

    clock = iter(range(1000))
    levels, readings = ps.ladder_round(1, ["a", "b"], {"a": 5.0, "b": 8.0}, measure, False, 0.1,
                                       lambda **_: None, threading.Event(), 0, 0, lambda: float(next(clock)))
    assert [d.step for d in levels] == ["at", "at", "again"]  # no rung below on no evidence
    assert {k.preset: k.next_knee for k in readings} == {"a": 5.0, "b": 8.0}
    # Decided fails, twice at the knee: the ladder goes down.
    assert kl.next_after(5.0, [kl.Look(5.0, False, True), kl.Look(5.0, False, True)], 0.1, False) == 4.0


def test_a_duel_level_keeps_the_searchs_floor_under_a_verdict():
    from types import SimpleNamespace

    from ernie_tui.engine_ctl.load.capacity import LevelRules

    runner = SimpleNamespace(rules=None)
    ps._reuse(runner, LevelRules(min_requests=10, max_requests=60, time_cap_s=60), 8.0)
    assert runner.rules.min_requests == 60 and runner.rules.time_cap_s == 8.0
    assert runner.rules.judged_floor == 10  # not 60: a short duel level still gets a verdict


def test_a_ladder_rounds_order_is_drawn_at_random_each_preset_the_reference_once_a_block():
    import random

    orders = ps.drawn_orders(["a", "b", "c"], 6, random.Random(7))
    assert all(o[0] == o[-1] and sorted(o[:-1]) == ["a", "b", "c"] for o in orders)
    for block in (orders[:3], orders[3:]):  # every preset the reference once in each block of 3 rounds
        assert sorted(o[0] for o in block) == ["a", "b", "c"]
    # Drawn, not rotated: over many runs a two-preset block starts with either.
    firsts = {ps.drawn_orders(["a", "b"], 2, random.Random(seed))[0][0] for seed in range(20)}
    assert firsts == {"a", "b"}
    assert ps.duel_order(["a", "b"], 2) == ["b", "a", "b"]  # the fixed design: rotated
    # The run records the seed its rounds were drawn from, so it can be read back as it ran.
    result = run([SimPreset("a", 8), SimPreset("b", 8)], SimHost(seed=4))
    assert result.order_seed == 29 and result.to_dict()["order_seed"] == 29


def test_the_drift_curvature_a_preset_shows_across_rounds_is_scaled_to_a_rounds_span():
    def look(t: float, ln_tps: float, load: float = 8.0) -> ps.DuelLevel:
        import math

        return ps.DuelLevel("a", 1, load, t, 8.0, math.exp(ln_tps), step="at")

    c = 1e-4  # ln tps = c t^2: f'' = 2c, a line over a span s misses by f'' s^2 / 8 at its middle
    parabola = [look(0.0, 0.0), look(30.0, c * 900), look(60.0, c * 3600)]
    assert ps.curvature_residual(parabola, 16.0) == pytest.approx(2 * c * 16.0 ** 2 / 8)
    assert ps.curvature_residual([look(t, 0.01 * t) for t in (0.0, 30.0, 60.0)], 16.0) == pytest.approx(0.0)
    # Looks at other loads (a knee that moved) and rungs are not the same series.
    moved = [look(0.0, 0.0), look(30.0, c * 900, load=9.0), look(60.0, c * 3600)]
    assert ps.curvature_residual(moved, 16.0) == 0.0


def test_aa_on_a_host_drifting_once_a_minute_is_not_called_beyond_noise():
    # +-30 % over 60 s: rounds of half-length rungs (33 s) about half a period apart. With the reference
    # rotated and only the reference's own move widening the interval, A/A read 9-12 % apart "beyond
    # noise" in 6 of these 100 seeds (bench/verdict_calibration.py --drift 0.3 --period 60).
    called = [(seed, r.pairs[0].text()) for seed in range(1000, 1100)
              if (r := run([SimPreset("a", 8), SimPreset("b", 8)],
                           SimHost(drift=0.3, period_s=60.0, jitter=0.15, seed=seed, phase=seed * 0.7)))
              .pairs[0].beyond_noise]
    assert called == []


# -- a queueing knee (tests/knee_sim.py, model="queueing"), as vLLM 0.26 on an H100, 2026-12-07 ------

def _queueing_host(**kw) -> SimHost:
    return SimHost(model="queueing", p99_noise=0.0, tps_noise=0.0, ttft_noise=0.0, **kw)


def test_a_queueing_knee_undecided_at_every_duel_level_is_read_at_its_edge():
    # seed-A on the GPU: its duel levels at 350 ended undecided in every round (round 0's longer level
    # passed): no round read a knee ("-, -, -"). Here K 7: at 8 its TTFT p99 reads 7 % over its limit,
    # within the bounds of an 8 s level's p99 (6 requests beyond it), so every look there is undecided.
    host = _queueing_host()
    result = run([SimPreset("seed-A", 7.0), SimPreset("seed-C", 9.6)], host, knees={"seed-A": 8, "seed-C": 8})
    a = [k for k in result.knee_rounds if k.preset == "seed-A"]
    assert all(d.verdict == "undecided" for d in result.duels if d.preset == "seed-A" and d.load == 8)
    # Read at its edge (the limit lies within the level's noise), and held there: undecided moves no knee.
    assert [k.knee for k in a] == [8, 8, 8] and all(k.edge for k in a)
    assert [k.next_knee for k in a] == [8, 8, 8]
    assert result.knees["seed-A"]["knees"] == [8, 8, 8]
    # The table says how the knee was read (the summary feeds the CLI, the export and the TUI).
    assert result.knees["seed-A"]["edge_rounds"] == [1, 2, 3]
    assert "Knee of seed-A: 8, 8, 8 by round (read at an undecided level in round 1, 2, 3" in "\n".join(result.lines())


def _long_doc(levels: list[LevelResult], rounds: int = 3) -> tuple[list[kl.KneeRound], list[ps.DuelLevel]]:
    """The ladder alone (round 0 handed in as `levels`, starting where start_knee() says), on the
    queueing model without noise, knee at 9 (K 8), tolerance 0.25 as on the GPU."""
    import random

    host = _queueing_host()
    p = SimPreset("long-doc", 8.0)
    q = SimPreset("seed-C", 9.6)
    rng = random.Random(0)
    from knee_sim import level

    def measure(name: str, load: float, kind: str) -> LevelResult:
        s = {"rung": 6.0, "longer": 16.0}.get(kind, 8.0)
        return level(host, p if name == "long-doc" else q, load, s, rng)

    result = ps.PairedResult(presets=["long-doc", "seed-C"])
    result.step = 0.25
    start = kl.start_knee(8.0, levels, 0.25, False)
    assert start is not None
    ps.duel_rounds(result, ["long-doc", "seed-C"], {"long-doc": start, "seed-C": 8.0}, measure, rounds, False,
                   lambda **_: None, threading.Event(), clock=host.clock, order_seed=1,
                   searched={"long-doc": levels})
    return [k for k in result.knee_rounds if k.preset == "long-doc"], [d for d in result.duels
                                                                       if d.preset == "long-doc"]


def test_a_queueing_knee_bracketed_in_round_0_stays_in_its_bracket():
    # long-doc on the GPU: round 0 passed 320 (ITL 30-40 % under its limit, TTFT flat) and failed 400
    # by a little on ITL; the ladder climbed to 490 (failed), went down 4 steps to 201, climbed from
    # 251 to 502 (failed twice) and read 201, 251, 206. Here 4, 6 and 8 passed with wide headroom, 10
    # failed by a little (a spike): the knee lies in [8, 10).
    levels = [_lv(4, True, 10.0), _lv(6, True, 12.0), _lv(8, True, 13.0), _lv(10, False, 23.0)]
    knees, duels = _long_doc(levels)
    # Never above the fail round 0 saw (retested at most), never under its pass in one go.
    assert max(d.load for d in duels) <= 10, [(d.round, d.load, d.step, d.verdict) for d in duels]
    assert min(d.load for d in duels) >= 8, [(d.round, d.load, d.step, d.verdict) for d in duels]
    assert all(k.knee == 8 for k in knees), [k.knee for k in knees]


def test_a_bracket_binds_for_a_few_rounds_and_newer_evidence_overrules_it():
    b = kl.Bracket()
    pass_, fail_ = (lambda load: kl.Look(load, True, True, [])), (lambda load: kl.Look(load, False, True, []))
    b.add(0, [pass_(8), fail_(10)])
    assert b.clamp(20, 1) == 10  # never above the live fail: retested at most
    assert b.clamp(2, 1) == 8  # never under the live pass in one go
    assert b.clamp(20, 3) == 20 and b.clamp(2, 3) == 2  # aged out
    b.add(1, [pass_(12)])  # the host sped up: a newer pass over the old fail removes it
    assert b.live(2) == (12, None)
    b.add(2, [fail_(9)])  # then slowed: a newer fail under the pass removes it (the pass of 8 has aged out)
    assert b.live(3) == (None, 9)
    # Undecided levels are no side of the knee.
    b.add(3, [kl.Look(5, False, False, [])])
    assert b.live(3) == (None, 9)


def test_a_knee_no_ladder_round_read_holds_a_verdict_back():
    # tune-confirm-aa.md, 2026-12-07 09:10: on the loaded box every ladder level ended undecided, so
    # the rounds compared BASE at 1 with its copy at 6, round 0's loads, and wrote the copy 263 % better.
    unread = [kl.KneeRound("aa", r, None) for r in (1, 2, 3)]
    assert kl.knee_doubts([], unread) == ["its ladder read no knee in 3 of 3 rounds (no level at or around it "
                                          "passed): its figures may compare loads, not presets"]
    once = [kl.KneeRound("aa", 1, 6.0), kl.KneeRound("aa", 2, None), kl.KneeRound("aa", 3, None)]
    assert kl.knee_doubts([], once)[0].startswith("its ladder read no knee in 2 of 3 rounds")
    twice = [kl.KneeRound("aa", 1, 6.0), kl.KneeRound("aa", 2, None), kl.KneeRound("aa", 3, 7.0)]
    assert kl.knee_doubts([], twice) == []
    pair = rk.paired_verdict("aa", "aa-tune-0", [1.0, 1.0, 1.0], [3.6, 3.2, 3.7],
                             a_doubts=kl.knee_doubts([], unread))
    assert pair.interval_excludes_zero and not pair.beyond_noise
    assert "within noise / undecided: aa's knee uncertain (its ladder read no knee" in pair.text()
