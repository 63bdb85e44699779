"""SLO objectives, order-statistic bounds, Wilson intervals, attainment (pure)."""

from __future__ import annotations

import math
import random

import pytest

from ernie_tui.engine_ctl.load import slo as S


def test_parse_objectives():
    assert S.parse_objective("ttft_p99=500ms") == S.Objective("ttft", 99, 0.5)
    assert S.parse_objective("ITL_p50 = 0.05s") == S.Objective("itl", 50, 0.05)
    assert S.parse_objective("e2e_p90<=2s") == S.Objective("e2e", 90, 2.0)
    assert str(S.parse_objective("e2e_p90=2s")) == "e2e_p90=2s"
    assert str(S.parse_objective("ttft_p95=250ms")) == "ttft_p95=250ms"
    for bad in ("ttft_p98=1s", "tpot_p99=1s", "ttft_p99=500", "ttft_p99=0ms", "ttft=1s", ""):
        with pytest.raises(ValueError):
            S.parse_objective(bad)
    with pytest.raises(ValueError, match="twice"):
        S.parse_slo(["ttft_p99=1s", "ttft_p99=2s"])
    with pytest.raises(ValueError, match="at least one"):
        S.parse_slo([])


def test_rank_bounds_need_enough_samples_for_a_tail():
    # P(all n below the p99) = 0.99^n: an upper bound at 95 % exists from n = 299 on.
    assert S.quantile_rank_bounds(298, 0.99, 0.95)[1] is None
    assert S.quantile_rank_bounds(299, 0.99, 0.95)[1] == 299
    # The median of 5 values: the largest bounds it from above with 1 - 0.5^5 = 96.9 %.
    assert S.quantile_rank_bounds(5, 0.5, 0.95) == (1, 5)
    assert S.quantile_rank_bounds(4, 0.5, 0.95) == (None, None)
    lo, hi = S.quantile_rank_bounds(100, 0.5, 0.95)
    assert lo < 50 < hi and hi - lo < 20


def test_quantile_interval_covers_the_true_quantile():
    # Distribution-free: for any continuous distribution each one-sided bound
    # holds at least `confidence` of the time. Exponential latencies, p90.
    rng = random.Random(1)
    true_p90 = -math.log(0.1)
    trials, n = 600, 60
    above = below = 0
    for _ in range(trials):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        lo, hi = S.quantile_interval(xs, 0.9, 0.95)
        above += lo > true_p90
        below += hi < true_p90
    assert above / trials <= 0.08 and below / trials <= 0.08  # 5 % nominal, sampling slack


def test_neff_widens_the_interval_for_correlated_gaps():
    gaps = [0.01 + 0.0001 * i for i in range(1000)]
    lo1, hi1 = S.quantile_interval(gaps, 0.5, 0.95)
    lo2, hi2 = S.quantile_interval(gaps, 0.5, 0.95, n_eff=10)
    assert lo2 < lo1 and hi2 > hi1


def test_wilson_interval():
    lo, hi = S.wilson_interval(8, 10, 0.95)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    lo, hi = S.wilson_interval(10, 10, 0.95)
    assert hi == 1.0 and 0.69 < lo < 0.73
    assert S.wilson_interval(0, 0) == (None, None)


def ok(ttft, itls=(0.01,) * 9, latency=None):
    return S.RequestOutcome(ok=True, ttft_s=ttft, itls=list(itls), latency_s=latency or ttft + sum(itls),
                            completion_tokens=len(itls) + 1)


def test_request_meets_is_vllms_goodput_ttft_tpot_e2el_and_failures_miss():
    slo = S.parse_slo(["ttft_p99=100ms", "itl_p50=20ms"])
    assert S.goodput_limits(slo) == {"ttft": 0.1, "tpot": 0.02}
    assert S.request_meets(ok(0.05), slo)
    assert not S.request_meets(ok(0.15), slo)
    # TPOT is the mean gap after the first token, (e2e - ttft) / (tokens - 1),
    # as vLLM's --goodput: one slow gap of 0.5 s among nine makes it 64 ms.
    assert ok(0.05, [0.01] * 8 + [0.5]).tpot_s == pytest.approx(0.58 / 9)
    assert not S.request_meets(ok(0.05, [0.01] * 8 + [0.5]), slo)
    assert S.request_meets(ok(0.05, [0.01] * 8 + [0.05]), slo)  # 14 ms
    # e2e limits the whole request; the tightest limit of a metric counts.
    slo2 = S.parse_slo(["e2e_p50=1s", "e2e_p99=500ms"])
    assert S.goodput_limits(slo2) == {"e2el": 0.5}
    assert not S.request_meets(ok(0.05, [0.1] * 5), slo2) and S.request_meets(ok(0.05, [0.05] * 5), slo2)
    assert S.request_meets(ok(0.05, []), slo)  # one token: no gap to miss
    assert not S.request_meets(S.RequestOutcome(ok=False, error_kind="timeout"), slo)


def test_evaluate_decides_pass_fail_and_undecided():
    slo = S.parse_slo(["ttft_p90=100ms"])
    fast = [ok(0.02 + 0.0001 * i) for i in range(40)]
    ev = S.evaluate(fast, slo)
    assert ev.verdict == S.PASS and ev.objectives[0].how == "bounds" and ev.attainment == 1.0
    slow = [ok(0.3 + 0.001 * i) for i in range(10)]
    assert S.evaluate(slow, slo).verdict == S.FAIL
    # 10 % over the limit: the p90 sits on the limit and no bound excludes it.
    edge = [ok(0.05)] * 27 + [ok(0.5)] * 3
    ev = S.evaluate(edge, slo)
    assert ev.verdict == S.UNDECIDED and ev.met == 27
    assert ev.attainment == pytest.approx(0.9) and ev.attainment_low < 0.9 < ev.attainment_high
    # Failed requests are infinitely slow for ttft: enough of them fail the level.
    failed = fast[:20] + [S.RequestOutcome(ok=False, error_kind="server_error")] * 20
    assert S.evaluate(failed, slo).verdict == S.FAIL


def test_narrow_interval_decides_by_estimate():
    slo = S.parse_slo(["ttft_p50=100ms"])
    # Half just under the limit, half just over: the bounds straddle it, but
    # only 1.5 ms apart, within 5 % of the limit, so the sample median decides.
    near = [ok(0.099)] * 125 + [ok(0.1005)] * 125
    ev = S.evaluate(near, slo, precision=0.05)
    assert ev.objectives[0].how == "precision" and ev.verdict == S.PASS
    assert S.evaluate(near, slo, precision=0.0).verdict == S.UNDECIDED


def test_objectives_on_one_line_as_a_form_field_takes_them():
    assert S.parse_slo_text("ttft_p99=500ms itl_p99=50ms") == [S.Objective("ttft", 99, 0.5),
                                                               S.Objective("itl", 99, 0.05)]
    assert S.parse_slo_text(" ttft_p90=1s,e2e_p50=2s ") == [S.Objective("ttft", 90, 1.0),
                                                           S.Objective("e2e", 50, 2.0)]
    with pytest.raises(ValueError, match="at least one objective"):
        S.parse_slo_text("  ")
    with pytest.raises(ValueError, match="given twice"):
        S.parse_slo_text("ttft_p99=1s ttft_p99=2s")
    with pytest.raises(ValueError, match="p97"):
        S.parse_slo_text("ttft_p97=1s")
    assert S.limit_ms(S.parse_slo_text("itl_p50=20ms ttft_p99=0.5s"), "ttft", 99) == 500.0
    assert S.limit_ms(S.parse_slo_text("ttft_p90=1s"), "ttft", 99) is None


def test_itl_objective_with_no_gap_seen_is_met_not_a_failure():
    # Real vLLM CPU at C=2 with 8-token answers: every answer arrived in one read,
    # so no token gap was seen. Nothing can miss an ITL limit then (attainment
    # says so already); the level used to fail and the search stopped at 1.
    slo = S.parse_slo(["ttft_p90=5s", "itl_p50=2s"])
    whole = [S.RequestOutcome(ok=True, ttft_s=0.02 + 0.001 * i, latency_s=0.03, itls=(), completion_tokens=8)
             for i in range(40)]
    ev = S.evaluate(whole, slo)
    itl = ev.objectives[1]
    assert itl.value_ms is None and itl.verdict == S.PASS and itl.how == "no gaps"
    assert ev.verdict == S.PASS and ev.point_pass and ev.attainment == 1.0
    # With no request answered there is nothing to call met.
    failed = [S.RequestOutcome(ok=False, error_kind="server_error")] * 10
    assert S.evaluate(failed, slo).objectives[1].verdict == S.UNDECIDED


def test_batch_means_bound_is_wider_for_correlated_windows_than_for_independent_requests():
    # 300 requests in 6 windows; in one window (one slow second) 30 of 50 miss.
    lim = S.parse_slo(["ttft_p90=100ms"])[0]
    fast = [ok(0.05) for _ in range(50)]
    slow = [ok(0.5) for _ in range(30)] + [ok(0.05) for _ in range(20)]
    blocks = [fast, fast, fast, slow, fast, fast]
    flat = [o for b in blocks for o in b]
    # As independent samples: 270 of 300 within (90 %), the order-statistic bound is tight.
    share, low, high = S.share_bounds([sum(o.ttft_s <= 0.1 for o in b) for b in blocks], [50] * 6, 0.95)
    assert share == pytest.approx(0.9)
    assert high - low > 0.15  # one window's luck moves it: wide
    r = S.judge_blocks(lim, blocks, 0.95)
    assert r.verdict == S.UNDECIDED and r.how == "estimate" and r.blocks == 6
    # The same values as six windows that agree: decided.
    even = [[ok(0.5)] * 3 + [ok(0.05)] * 47 for _ in range(6)]
    assert S.judge_blocks(lim, even, 0.95).verdict == S.PASS
    bad = [[ok(0.5)] * 10 + [ok(0.05)] * 40 for _ in range(6)]
    assert S.judge_blocks(lim, bad, 0.95).verdict == S.FAIL
    assert S.evaluate(flat, [lim]).objectives[0].samples == 300


def test_attainment_target_fails_a_level_whose_objectives_pass():
    # The percentile objective holds (p50 of ttft), but a third of the requests miss.
    slo = S.parse_slo(["ttft_p50=100ms"])
    blocks = [[ok(0.05)] * 6 + [ok(0.2)] * 3 for _ in range(4)]
    ev = S.evaluate_blocks(blocks, slo, 0.95, attainment_target=0.9)
    assert ev.objectives[0].verdict == S.PASS
    assert ev.attainment == pytest.approx(2 / 3) and ev.attainment_verdict == S.FAIL and ev.verdict == S.FAIL
    assert S.evaluate_blocks(blocks, slo, 0.95, attainment_target=0.5).verdict == S.PASS


def test_t_quantile_is_close_to_students():
    for df, exact in ((2, 2.920), (3, 2.353), (5, 2.015), (10, 1.812), (30, 1.697)):
        assert S.t_quantile(0.95, df) == pytest.approx(exact, rel=0.015)


def _window(over: int, near: int, *, over_s: float = 0.104, near_s: float = 0.097, n: int = 200) -> list:
    """One window of n TTFTs: `over` past a 100 ms limit, `near` just within it, the rest far within."""
    return [ok(0.05)] * (n - over - near) + [ok(near_s)] * near + [ok(over_s)] * over


def test_resolution_decides_a_level_at_its_limit_that_the_exact_test_leaves_open():
    lim = S.parse_slo(["ttft_p99=100ms"])[0]
    # p99 104 ms, 4 % over: the windows' shares within 100 ms (0.98-0.995)
    # straddle 99 %, so the exact test cannot tell; within 95 ms every
    # window is surely under 99 %: the p99 is surely past 95 ms.
    over = [_window(k, 2) for k in (1, 4, 2, 3, 1)]
    exact = S.judge_blocks(lim, over, 0.95)
    assert exact.value_ms == pytest.approx(104) and exact.verdict == S.UNDECIDED
    r = S.judge_blocks(lim, over, 0.95, resolution=0.05)
    assert r.verdict == S.FAIL and r.how == "resolution"
    assert r.band_ms == pytest.approx(95) and r.band_share_bound < 0.99
    # p99 97 ms: the shares within 100 ms (0.985-1) straddle 99 % too, but
    # every value is within 105 ms: the p99 is surely within 5 % of the limit.
    under = [_window(k, 3) for k in (0, 3, 0, 2, 0)]
    exact = S.judge_blocks(lim, under, 0.95)
    assert exact.value_ms == pytest.approx(97) and exact.verdict == S.UNDECIDED
    r = S.judge_blocks(lim, under, 0.95, resolution=0.05)
    assert r.verdict == S.PASS and r.how == "resolution" and r.band_ms == pytest.approx(105)
    # A band narrower than the tail is no help: the 104 ms values are past 103.
    assert S.judge_blocks(lim, under, 0.95, resolution=0.03).verdict == S.UNDECIDED
    # The level's evaluation carries it through.
    assert S.evaluate_blocks(under, [lim], 0.95, resolution=0.05).verdict == S.PASS
    assert S.evaluate_blocks(over, [lim], 0.95, resolution=0.05).verdict == S.FAIL


def test_resolution_never_passes_a_percentile_read_past_the_limit_nor_fails_one_within():
    lim = S.parse_slo(["ttft_p99=100ms"])[0]
    # Far tails on either side, windows that disagree: a sample p99 past the
    # limit is never a pass, one within it never a fail, whatever the band.
    rng = random.Random(7)
    for _ in range(40):
        blocks = [_window(rng.randint(0, 5), rng.randint(0, 5), over_s=rng.uniform(0.1, 0.2),
                          near_s=rng.uniform(0.06, 0.1)) for _ in range(rng.randint(2, 8))]
        for res in (0.02, 0.05, 0.2):
            r = S.judge_blocks(lim, blocks, 0.95, resolution=res)
            if r.verdict == S.PASS:
                assert r.value_ms <= 100
            if r.verdict == S.FAIL and r.how == "resolution":
                assert r.value_ms > 100
    # A far tail that comes in some windows only stays open: within the limit
    # by the sample, but the bound cannot place the p99 within 105 ms.
    wide = [_window(k, 0, over_s=0.2) for k in (0, 4, 0, 3, 0)]
    assert S.judge_blocks(lim, wide, 0.95).value_ms <= 100
    assert S.judge_blocks(lim, wide, 0.95, resolution=0.05).verdict == S.UNDECIDED
