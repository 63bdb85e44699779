"""The capacity search's failure modes (issue 16), each on the paced stand-in
whose load-shaped pacing the test sets (tests/paced_server.py): a level must
judge the server's steady state, not the transient a level opens with, nor
the fast requests that come back first, nor one lucky second.

Each test measures one level (start = max concurrency) and checks its
verdict against what the stand-in does in its steady state. On the search
before issue 16 (levels decided on the first requests to finish, bounds that
treat requests as independent) all three passed a level that fails.
"""

from __future__ import annotations

import heapq
import json
import math
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from urllib.request import urlopen

import pytest

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import capacity_run as R
from ernie_tui.engine_ctl.load import slo as S
from search_looks import levels_said

HERE = Path(__file__).resolve().parent


@pytest.fixture
def paced():
    procs = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, str(HERE / "paced_server.py"), "--port", "0", "--slots", "64",
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        return line.split()[-1]

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


EVENTS: list[dict] = []


def one_level(url: str, slo: str, concurrency: int, *, min_tokens: int = 10, max_tokens_in: int = 40,
              max_tokens: int = 16, rules: C.LevelRules | None = None) -> C.LevelResult:
    cfg, settings = R.request_setup(min_tokens=min_tokens, max_tokens_in=max_tokens_in, max_tokens=max_tokens)
    cancel = threading.Event()

    def progress(ev: dict) -> None:  # one level only: a failed one would bisect down
        EVENTS.append(ev)
        if ev["event"] == "level_done":
            cancel.set()

    res = R.run_capacity(url, S.parse_slo_text(slo), search_config=C.SearchConfig(start=concurrency,
                                                                                   max_concurrency=concurrency),
                         rules=rules or C.LevelRules(max_requests=200, time_cap_s=30), settings=settings,
                         burst_config=cfg, use_metrics=False, progress=progress, cancel=cancel)
    print(C.format_capacity(res))
    assert res.levels and res.levels[0].concurrency == concurrency, res
    return res.levels[0]


def test_synchronised_waves_do_not_pass_a_level_whose_steady_state_fails(paced):
    # 8 requests in flight, each 16 tokens (ignore_eos: all alike) after a
    # prefill of 40 ms + 0.2 ms a prompt token (10-40 tokens). A prefill that
    # overlaps another request's decoding costs 40 ms more per such request.
    # The first wave starts together and sees none (TTFT 42-48 ms). Its
    # requests decode at their own pace (ITL 10 ms +- 40 %, as the requests
    # of a real batch do), so they end up to ~120 ms apart and every later
    # prefill lands among the others' decodes: the steady state's TTFT p90 is
    # 200-250 ms. TTFT p90 must stay within 100 ms: the steady state fails.
    # (Without the ITL spread the waves drift apart only by chance, through
    # the prompt lengths, and on a quiet box stay in step a whole level.)
    # The prefill is 40 ms, not 10, so that a wave a busy client sends over
    # ~40 ms still starts "together": with 10 ms, a wave sent over 18 ms saw
    # its last two requests land among the first ones' decodes (52-55 ms).
    url = paced("--ttft-ms", "40", "--itl-ms", "10", "--itl-spread", "0.4", "--prefill-ms-per-token", "0.2",
                "--interference-ms", "40")
    lv = one_level(url, "ttft_p90=100ms", 8)
    assert not lv.passed, lv
    # The stand-in did what this test is about: a first wave that meets the
    # objective, and a steady state that does not.
    log = json.loads(urlopen(url + "/requests").read())
    wave = [e for e in log if e["max_tokens"] == 16][:8]
    assert all(e["first"] - e["slot"] < 0.1 for e in wave), wave
    later = sorted(e["first"] - e["slot"] for e in log[len(log) // 2:]
                   if e["first"] is not None and e["max_tokens"] == 16)
    assert later[int(0.9 * len(later))] > 0.1, later  # its TTFT p90 misses


def test_slow_requests_that_come_back_last_are_counted(paced):
    # Every 16th request waits 4 s for its first token, the others ~20 ms
    # (and ~170 ms a request): 6 % of the requests miss a TTFT p95 of 300 ms.
    # A level that stops on the first ~60 requests to come back sees only
    # fast ones: the slow are still out.
    url = paced("--ttft-ms", "20", "--itl-ms", "10", "--slow-every", "16", "--slow-ms", "4000")
    EVENTS.clear()
    lv = one_level(url, "ttft_p95=300ms", 8, rules=C.LevelRules(max_requests=200, time_cap_s=30))
    assert not lv.passed, lv
    # Progress while the level runs: requests done, in flight, elapsed, provisional figures.
    live = [e for e in EVENTS if e["event"] == "level_progress"]
    assert live and live[0]["phase"] == "warm-up" and live[0]["concurrency"] == 8
    assert {"requests", "in_flight", "elapsed_s", "windows", "ttft_p99_ms", "itl_p99_ms", "attainment"} <= set(live[0])
    assert [e["elapsed_s"] for e in live] == sorted(e["elapsed_s"] for e in live)


def test_correlated_slow_seconds_are_not_averaged_away_by_independent_bounds(paced):
    # Requests arriving in the last second of every 3 s wait 400 ms more for
    # their first token: about a third of the requests, all in the same
    # seconds. The first seconds are fast; a bound that treats ~30 requests
    # of one second as independent passes the level before its slow second.
    url = paced("--ttft-ms", "20", "--itl-ms", "10", "--stall-period-s", "3", "--stall-s", "1",
                "--stall-ms", "400")
    lv = one_level(url, "ttft_p90=300ms", 8)
    assert not lv.passed, lv


# -- open loop: the request rate ------------------------------------------------------

def test_arrival_schedules():
    from itertools import islice

    from ernie_tui.engine_ctl.load.arrivals import arrival_stream

    even = list(islice(arrival_stream(4.0, "constant"), 5))
    assert even == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])
    poisson = list(islice(arrival_stream(10.0, "poisson", seed=3), 2001))
    gaps = [b - a for a, b in zip(poisson, poisson[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    assert max(gaps) > 3 * min(gaps)  # bursts and lulls, not a metronome
    assert list(islice(arrival_stream(10.0, "poisson", seed=3), 5)) == poisson[:5]  # seeded


def test_rate_search_on_a_simulated_open_loop():
    # Pure: a server that keeps up to 20 req/s; past it the queue (and TTFT) grows.
    slo = S.parse_slo(["ttft_p90=100ms"])
    rules = C.LevelRules(min_requests=10, max_requests=300, time_cap_s=60)
    calls = []

    def run(rate: float, min_requests: int | None = None) -> C.LevelResult:
        calls.append(rate)
        level_rules = rules if min_requests is None else rules.confirming(min_requests)
        mon = C.LevelMonitor(rate, slo, level_rules, rate=True)
        t, backlog, k = 0.0, 0.0, 0
        while True:
            k += 1
            t = k / rate
            backlog = max(0.0, backlog + 1.0 / 20.0 - 1.0 / rate)
            ttft = 0.02 + backlog
            mon.started(t)
            mon.add(S.RequestOutcome(ok=True, ttft_s=ttft, latency_s=ttft + 0.15, itls=[0.01] * 15,
                                     completion_tokens=16, start_s=t, end_s=t + ttft + 0.15))
            r = mon.stop_reason(t + ttft + 0.15)
            if r:
                return mon.result(t, r)

    res = C.search(run, slo, C.SearchConfig(mode="rate", start_rate=2.0, max_rate=200.0, tolerance=0.1))
    assert res.mode == "rate" and res.stop_reason == "bracketed"
    assert calls[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert 18.0 <= res.capacity["rate"] <= 20.0 and res.capacity_load == res.capacity["rate"]
    assert all(lv.rate == c and lv.concurrency is None for lv, c in zip(res.levels, calls, strict=True))
    assert "capacity: rate " in C.format_capacity(res) and "req/s" in C.format_capacity(res)
    # the confirmation: the capacity's rate again, for 8 turnovers of its requests in flight (Little's law)
    last = res.levels[-1]
    assert last.confirmation and last.rate == res.capacity["rate"] and res.capacity["confirmed"]
    assert last.requests >= rules.max_requests  # a confirmation counts at least a level's most
    back = C.capacity_from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.mode == "rate" and back.level(res.capacity["rate"]).passed


def _open_loop(keeps_up: float, slo: list, rules: C.LevelRules, decode_s: float = 1.0, calls: list | None = None):
    """A simulated server that keeps up with `keeps_up` req/s (an H200's
    ~100-120 in docs/lab/capacity-h200/2026-12-02-run08.md); past it each arrival queues behind
    the work already waiting, so TTFT grows by (rate / keeps_up - 1) s a second."""

    def run(rate: float, min_requests: int | None = None) -> C.LevelResult:
        if calls is not None:
            calls.append(rate)
        mon = C.LevelMonitor(rate, slo, rules if min_requests is None else rules.confirming(min_requests), rate=True)
        backlog, k = 0.0, 0
        while True:
            k += 1
            t = k / rate
            backlog = max(0.0, backlog + 1.0 / keeps_up - 1.0 / rate)
            ttft = 0.05 + backlog
            mon.started(t)
            mon.add(S.RequestOutcome(ok=True, ttft_s=ttft, latency_s=ttft + decode_s, itls=[decode_s / 127] * 127,
                                     completion_tokens=128, start_s=t, end_s=t + ttft + decode_s))
            r = mon.stop_reason(t + ttft + decode_s)
            if r:
                return mon.result(t, r)
    return run


def test_an_open_loop_level_a_step_over_the_capacity_does_not_pass_in_a_few_seconds():
    # The H200 case: SLO ttft_p99=1000ms, tolerance 0.1, 600 requests a level at most, a 20 s cap.
    slo = S.parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    hold = C.open_loop_hold_s(slo, 0.10, 20.0)
    assert hold == pytest.approx(10.0)  # 1 s / 0.1
    assert C.open_loop_hold_s(slo, 0.10, 12.0) == pytest.approx(6.0)  # at most half the cap
    assert C.open_loop_hold_s(S.parse_slo(["itl_p99=50ms"]), 0.10, 20.0) == 0.0  # a queue's wait is not in ITL
    assert C.open_loop_hold_s(S.parse_slo(["ttft_p99=2s", "e2e_p90=3s"]), 0.25, 60.0) == pytest.approx(8.0)
    old = C.LevelRules(max_requests=600, time_cap_s=20, min_pass_s=0)
    new = replace(old, min_pass_s=hold)
    # One step (10 %) over a server that keeps up with 100 req/s: its queue grows 0.1 s a second.
    before = _open_loop(100.0, slo, old)(110.0)
    after = _open_loop(100.0, slo, new)(110.0)
    print(f"110 req/s: before {before.passed} in {before.windows * before.window_s:.1f} s "
          f"(TTFT p99 {before.ttft_p99_ms:.0f} ms); now {after.passed} in {after.windows * after.window_s:.1f} s "
          f"(TTFT p99 {after.ttft_p99_ms:.0f} ms)")
    assert before.passed and before.windows * before.window_s < hold  # what the H200 searches did at 128 and 144
    assert not after.passed and after.ttft_p99_ms > 1000.0
    # Under the capacity nothing queues: it passes, after the hold, and a decided pass.
    under = _open_loop(100.0, slo, new)(90.0)
    assert under.passed and under.decided and under.windows * under.window_s >= hold
    # A closed loop is not held: the rule is the open loop's.
    mon = C.LevelMonitor(8, slo, new)
    assert mon.held()


def test_an_open_loop_search_spends_no_confirmation_on_a_short_pass_over_the_capacity():
    slo = S.parse_slo(["ttft_p99=1000ms"])
    for hold, expect_false_passes in ((0.0, True), (None, False)):
        rules = C.LevelRules(max_requests=600, time_cap_s=20)
        rules = replace(rules, min_pass_s=C.open_loop_hold_s(slo, 0.1, 20.0) if hold is None else hold)
        calls: list[float] = []
        res = C.search(_open_loop(100.0, slo, rules, calls=calls), slo,
                       C.SearchConfig(mode="rate", start_rate=16.0, max_rate=256.0, tolerance=0.1))
        over = [lv for lv in res.levels if lv.passed and not lv.confirmation and lv.rate >= 110.0]
        failed_confirmations = [lv for lv in res.levels if lv.confirmation and not lv.passed]
        print(f"hold {rules.min_pass_s:g} s: capacity {res.capacity and res.capacity['rate']}, levels "
              + " ".join(f"{lv.rate:g}{'c' if lv.confirmation else ''}{'+' if lv.passed else '-'}"
                         for lv in res.levels))
        # within a tolerance step of the 100 req/s it keeps up with (104 in 8 s is 0.3 s of queue)
        assert res.capacity is not None and 90.0 <= res.capacity["rate"] < 110.0 and res.capacity["confirmed"]
        assert bool(over) is expect_false_passes
        assert bool(failed_confirmations) is expect_false_passes


def _drifting_confirmation(slow_from_s: float | None, *, noisy: bool = False, rising: bool = False,
                           tail_ms: tuple[float, float] | None = None,
                           resolution: float = C.DEFAULT_RESOLUTION) -> C.LevelResult:
    """A confirmation (1,000 counted requests at 100 req/s, open loop) on a
    simulated server whose decoding slows for requests sent after
    `slow_from_s`: 8 ms token gaps before, 19 ms after with 1.5 % of them 80 ms
    (the H200's confirmation at 144 req/s: windows' median E2E 0.8 s, then
    2.5 s and 3.6 s at the end, pooled ITL p99 46 ms), or after
    `slow_from_s` + 1.5 s once `rising` (the end no longer settles either).
    `noisy`: no slowdown, but decoding swings ±60 % over 4 s
    (unsettled, yet never missing the SLO). `tail_ms` (before, after): 8 ms
    gaps throughout, 1.5 % of them `before` ms long, `after` ms for requests
    sent after `slow_from_s` (a level sitting at an ITL limit)."""
    slo = S.parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    rules = C.LevelRules(max_requests=600, time_cap_s=60, min_pass_s=0, resolution=resolution).confirming(1000)
    mon = C.LevelMonitor(100.0, slo, rules, rate=True)
    pending: list[tuple[float, int, S.RequestOutcome]] = []  # (end, k, outcome): answered once the clock is there
    k = 0
    while True:
        k += 1
        t = k / 100.0
        while pending and pending[0][0] <= t:
            mon.add(heapq.heappop(pending)[2])
        if tail_ms is not None:
            tail = tail_ms[1] if slow_from_s is not None and t >= slow_from_s else tail_ms[0]
            gaps = [tail / 1000.0 if (k * 127 + j) % 67 == 0 else 0.008 for j in range(127)]
        elif slow_from_s is not None and t >= slow_from_s + 1.5:
            gaps = [0.080 if (k * 127 + j) % 67 == 0 else (0.030 if rising else 0.019) for j in range(127)]
        elif slow_from_s is not None and t >= slow_from_s:
            gaps = [0.080 if (k * 127 + j) % 67 == 0 else 0.019 for j in range(127)]
        elif noisy:
            gaps = [0.008 * (1.0 + 0.6 * math.sin(2 * math.pi * t / 4.0))] * 127
        else:
            gaps = [0.008] * 127
        ttft = 0.05
        latency = ttft + sum(gaps)
        mon.started(t)
        heapq.heappush(pending, (t + latency, k, S.RequestOutcome(
            ok=True, ttft_s=ttft, latency_s=latency, itls=gaps, completion_tokens=128, start_s=t, end_s=t + latency)))
        r = mon.stop_reason(t)
        if r:
            return mon.result(t, r)


def test_a_level_that_never_settles_is_judged_where_it_ended():
    drift = _drifting_confirmation(7.0)
    print(f"drifting: windows' E2E {drift.window_e2e_ms}, pooled ITL p99 {drift.itl_p99_ms:.1f} ms, "
          f"stop {drift.stop}, passed {drift.passed}, end {getattr(drift, 'end_missed', None)}")
    assert drift.stop == "max_requests" and not drift.decided
    # The pooled figures pass (what let the H200's confirmation through on its point estimates) ...
    assert drift.itl_p99_ms < 50.0 and drift.ttft_p99_ms < 1000.0 and drift.attainment == 1.0
    assert drift.window_e2e_ms[-1] > 2 * drift.window_e2e_ms[0]
    # ... but its last three windows miss ITL p99, so it is no pass, and it says why.
    assert not drift.passed
    assert drift.end_missed and "itl_p99=50ms read 80 ms" in drift.end_missed
    assert any("last windows miss the SLO" in w for w in drift.warnings)
    # The same with an end still rising (its windows never agree): no pass either.
    rising = _drifting_confirmation(6.0, rising=True)
    assert not rising.stable and not rising.decided and not rising.passed and rising.itl_p99_ms < 50.0
    # Windows that disagree without the end missing anything: still a pass on its estimates.
    noisy = _drifting_confirmation(None, noisy=True)
    assert noisy.stop == "max_requests" and not noisy.stable and noisy.passed and noisy.end_missed is None
    # A level that settled is judged as before.
    calm = _drifting_confirmation(None)
    assert calm.passed and calm.stable and calm.end_missed is None


def test_a_level_at_its_limit_is_not_failed_by_its_ends_sampling():
    # On an H200, concurrency 144 and 160 read a pooled ITL p99 of 45 and 47 ms (limit 50), their
    # last three windows 51 and 50 ms: within the spread of a p99 over a few windows, yet each
    # failed on its end, and the search answered 136 where the bench client's bracket was
    # [192, 224). An end fails a level where it moved, by more than the windows' stability share.
    # (Judged on the exact limit, as then: the resolution band decides this level, below.)
    edge = _drifting_confirmation(7.0, tail_ms=(47.0, 52.0), resolution=0.0)
    print(f"at the limit: pooled ITL p99 {edge.itl_p99_ms:.1f} ms, stop {edge.stop}, end {edge.end_missed}")
    assert edge.stop == "max_requests" and not edge.decided and edge.itl_p99_ms == pytest.approx(47.0)
    assert edge.end_missed is None and edge.passed  # 52 ms is within 15 % of 47
    # The same step, larger: the end moved, and it misses.
    moved = _drifting_confirmation(7.0, tail_ms=(47.0, 80.0), resolution=0.0)
    assert moved.end_missed == "itl_p99=50ms read 80 ms" and not moved.passed
    # With the default resolution (5 %), every gap within 52.5 ms puts the p99
    # surely within 5 % of the limit: the first level passes, decided (a
    # confirmation still counts its 1,000 requests). The second one's 80 ms
    # tail is past the band.
    band = _drifting_confirmation(7.0, tail_ms=(47.0, 52.0))
    assert band.decided and band.passed and band.stop == "decided"
    assert not _drifting_confirmation(7.0, tail_ms=(47.0, 80.0)).passed


def test_cli_rate_capacity_on_the_paced_stand_in(paced, capsys):
    # 4 slots, ~170 ms a request: it keeps up with ~23 req/s; past that the
    # queue grows with every second and TTFT with it.
    from ernie_tui.cli import main

    url = paced("--slots", "4", "--ttft-ms", "20", "--itl-ms", "10")
    code = main(["probe", "--url", url, "--capacity", "--rate", "--start-rate", "8", "--slo", "ttft_p90=150ms",
                 "--max-tokens", "16", "--min-tokens", "10", "--max-tokens-in", "40", "--level-time", "15",
                 "--tolerance", "0.3", "--json", "--no-save"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, (out["stop_reason"], out.get("warnings"), levels_said(C.capacity_from_dict(out).levels))
    assert out["mode"] == "rate" and out["config"]["search"]["mode"] == "rate"
    assert [lv["rate"] for lv in out["levels"]][:2] == [8.0, 16.0]
    assert 12.0 <= out["capacity"]["rate"] <= 24.0, out["capacity"]
    for lv in out["levels"]:
        assert lv["concurrency"] is None and lv["late_sends"] is not None and lv["windows"] is not None
    assert out["capacity"]["attainment"] >= out["config"]["level"]["attainment_target"]


def test_cli_search_finds_where_token_gaps_outgrow_an_itl_limit(paced, capsys):
    # The second case: a server whose decoding slows with its batch.
    # Each gap is 20 ms plus 8 ms for every request in a slot beyond 8, so
    # the gaps are 20, 28, 36 ms at 8, 9, 10 in flight: an ITL p50 of 24 ms
    # holds up to 8 and no further. (The median, not the p99: a busy 2-core box
    # stretched this stand-in's p99 gap to 38 ms at 4 in flight where 20 was
    # set, while its median read 20.0; the search's bisection is the same.)
    from ernie_tui.cli import main

    url = paced("--ttft-ms", "20", "--itl-ms", "20", "--itl-knee", "8", "--itl-slope-ms", "8")
    code = main(["probe", "--url", url, "--capacity", "--slo", "itl_p50=24ms", "--start-concurrency", "4",
                 "--max-tokens", "32", "--min-tokens", "10", "--max-tokens-in", "40", "--client-procs", "1",
                 "--json", "--no-save"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    levels = {lv["concurrency"]: lv for lv in out["levels"]}
    print({c: (round(lv["itl_p50_ms"], 1), round(lv["itl_p99_ms"], 1), lv["verdict"]) for c, lv in levels.items()})
    # The stand-in paced as set: the typical gap at 4 and at 16 in flight.
    assert levels[4]["itl_p50_ms"] == pytest.approx(20, rel=0.15)
    assert levels[16]["itl_p50_ms"] == pytest.approx(20 + 8 * 8, rel=0.15) and not levels[16]["passed"]
    assert out["capacity"]["concurrency"] == 8, out["capacity"]
    assert levels[8]["itl_p50_ms"] <= 24.0 and levels[8]["passed"]


def test_the_stand_ins_speed_wanders_by_period(paced):
    # --itl-wander 0.9 over 0.2 s periods: every gap starting in one period is
    # scaled by one factor within 0.1..1.9 (seeded by the period), so a
    # burst's gaps spread around the 25 ms set; without it they sit at 25 ms.
    # (Any 12 periods in a row hold factors whose p90 is 0.25 over their median.)
    # The stand-in paces by deadlines, so a box that stalls it sends the late
    # tokens back to back: on a CI box with four workers beside real vLLM the
    # steady burst once read a gap p50 of 0 (ci on 9f0a5bf). A pair whose
    # steady burst does not read its set pace measured the box, not the
    # stand-in, and is taken again (three tries).
    from ernie_tui.engine_ctl.load import BurstConfig, run_burst

    cfg = BurstConfig(n=32, concurrency=4, min_tokens=10, max_tokens_in=20, max_tokens=40)
    steady_url = paced("--itl-ms", "25")
    wander_url = paced("--itl-ms", "25", "--itl-wander", "0.9", "--itl-wander-s", "0.2")
    said = []
    for _ in range(3):
        steady = run_burst(steady_url, cfg, use_metrics=False).itl
        wander = run_burst(wander_url, cfg, use_metrics=False).itl
        said.append(f"gaps p50/p90 steady {steady['p50']:.4f}/{steady['p90']:.4f}, wandering "
                    f"{wander['p50']:.4f}/{wander['p90']:.4f}")
        if steady["p50"] == pytest.approx(0.025, rel=0.1) and steady["p90"] < 0.025 * 1.25:
            break
    print("\n".join(said))
    assert steady["p50"] == pytest.approx(0.025, rel=0.1), said
    assert wander["p90"] - wander["p50"] > steady["p90"] - steady["p50"] + 0.004, said


def _search(url: str, **kw) -> C.CapacityResult:
    cfg, settings = R.request_setup(min_tokens=10, max_tokens_in=40, max_tokens=16)
    return R.run_capacity(url, S.parse_slo_text("ttft_p90=500ms"),
                          search_config=C.SearchConfig(start=4, max_concurrency=8),
                          rules=C.LevelRules(max_requests=60, time_cap_s=20), settings=settings, burst_config=cfg,
                          use_metrics=False, **kw)


def test_transport_failures_from_a_server_that_answers_fail_the_level_and_the_search_goes_on(paced):
    # The stand-in closes 28 requests' connections without a word while
    # /v1/models answers: the first level's warm-up batch (4) and its first 8
    # requests, each sent twice (a drop before any answer goes out again
    # once), are 24; 8 failed in a row is a level's "transport failures in a
    # row"; the rest meet what was in flight as it stopped. ciZ3 ended a search
    # "server_down" against a live stand-in: such a level is now failed on
    # errors, said so, and the search goes on.
    url = paced("--slots", "8", "--drop-completions", "28")
    res = _search(url)
    first = res.levels[0]
    assert first.stop == "errors" and not first.passed, levels_said(res.levels)
    assert first.errors.get("disconnected", 0) >= 8 and set(first.errors) == {"disconnected"}, first.errors
    assert any("the server answered /v1/models" in w and "disconnected" in w for w in first.warnings), first.warnings
    assert res.stop_reason != "server_down" and res.capacity is not None and res.capacity["concurrency"] == 8, \
        (res.stop_reason, levels_said(res.levels))
    dropped = [e for e in json.loads(urlopen(url + "/requests").read()) if e.get("dropped")]
    assert len(dropped) == 28  # the stand-in did drop them all


def test_a_server_that_is_gone_still_ends_the_search_server_down():
    # The same run of transport failures from a server killed in the first
    # level: it no longer answers /v1/models, so the search ends there.
    proc = subprocess.Popen([sys.executable, str(HERE / "paced_server.py"), "--port", "0", "--slots", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = proc.stdout.readline().split()[-1]

    def progress(ev: dict) -> None:
        if ev["event"] == "level_progress" and proc.poll() is None:
            proc.kill()  # half a second into the first level

    try:
        res = _search(url, progress=progress)
    finally:
        proc.kill()
        proc.wait(10)
    assert res.stop_reason == "server_down" and res.capacity is None, (res.stop_reason, levels_said(res.levels))
    assert [lv.stop for lv in res.levels] == ["server_down"], levels_said(res.levels)
    assert not any("answered /v1/models" in w for w in res.levels[0].warnings)


def test_old_capacity_records_still_load():
    old = {"slo": ["ttft_p99=1s"], "capacity": {"concurrency": 4, "goodput_rps": 3.0, "goodput_output_tps": 48.0,
                                                 "ttft_p99_ms": 50.0, "itl_p99_ms": 10.0, "attainment": 1.0,
                                                 "decided": True},
           "levels": [{"concurrency": 4, "requests": 40, "passed": True, "ttft_p99_ms": 50.0}],
           "stop_reason": "bracketed", "stop_message": "", "seconds": 9.0, "config": {}}
    r = C.capacity_from_dict(old)
    assert r.mode == "concurrency" and r.capacity_load == 4.0 and r.level(4).requests == 40
    assert "capacity: concurrency 4" in C.format_capacity(r)


def test_each_capacity_default_has_one_home():
    # The literals live in load/capacity.py only; the CLI and both forms read them.
    import argparse
    import re

    src = HERE.parent / "src" / "ernie_tui"
    homes = [p for p in src.rglob("*.py") if re.search(r"^\s*DEFAULT_SLO\s*=", p.read_text(), re.M)]
    assert homes == [src / "engine_ctl" / "load" / "capacity.py"]
    assert not [p for p in src.rglob("*.py") if re.search(r'Input\(\s*"ttft_', p.read_text())]
    # One form (tui/widgets/capacity_form.py), used by both screens, which
    # write none of its fields themselves.
    for screen in ("tui/widgets/burst_tab.py", "tui/screens/sweep.py"):
        text = (src / screen).read_text()
        assert "CapacityForm(" in text and not re.search(r'"(?:pf|sw)-cap-(?:start|maxc|tol|minr|maxr|time)"', text)
    form = (src / "tui" / "widgets" / "capacity_form.py").read_text()
    fields = re.findall(r'^\s*\("(\w+)", "[\w-]+", "[^"]+", "(?:integer|number)", ([^\n]+)\),$', form, re.M)
    assert {arg for arg, _ in fields} == {"start", "max_concurrency", "start_rate", "max_rate", "tolerance",
                                          "attainment", "min_requests", "max_requests", "level_time_s"}
    assert all("DEFAULT_" in default for _, default in fields), fields
    from ernie_tui.cli.capacity_args import add_capacity_args

    p = argparse.ArgumentParser()
    add_capacity_args(p)
    d = p.parse_args([])
    rules, search = C.LevelRules(), C.SearchConfig()
    assert (d.start_concurrency, d.max_concurrency, d.tolerance) == (search.start, search.max_concurrency,
                                                                     search.tolerance)
    assert (d.min_requests, d.max_requests, d.level_time, d.attainment, d.stability, d.min_windows) == (
        rules.min_requests, rules.max_requests, rules.time_cap_s, rules.attainment_target, rules.stability,
        rules.min_windows)
    assert (d.start_rate, d.max_rate, d.arrivals) == (search.start_rate, search.max_rate, search.arrivals)
    assert d.resolution == rules.resolution == C.DEFAULT_RESOLUTION


def test_the_resolution_option_reaches_the_level_rules_and_is_checked():
    import argparse

    from ernie_tui.cli.capacity_args import add_capacity_args, capacity_options
    from ernie_tui.cli.errors import CliError

    p = argparse.ArgumentParser()
    add_capacity_args(p)
    assert capacity_options(p.parse_args(["--resolution", "0"])).rules.resolution == 0.0
    assert capacity_options(p.parse_args(["--resolution", "0.1"])).rules.resolution == 0.1
    for bad in ("-0.01", "0.5"):
        with pytest.raises(CliError, match="resolution is a share of each limit"):
            capacity_options(p.parse_args(["--resolution", bad]))


def test_the_command_line_search_defaults_to_the_dashboards_slo():
    # `probe --capacity` with no --slo searches under DEFAULT_SLO, as the dashboard's form does
    # (it used to stop: "give at least one objective").
    import argparse

    from ernie_tui.cli.capacity_args import add_capacity_args, capacity_options

    p = argparse.ArgumentParser()
    add_capacity_args(p)
    opts = capacity_options(p.parse_args([]))
    assert opts.describe() == " ".join(str(o) for o in C.make_search(C.DEFAULT_SLO)[0])
    assert capacity_options(p.parse_args(["--slo", "ttft_p90=1s"])).describe() == "ttft_p90=1s"
