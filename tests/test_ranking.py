"""The paired comparison's statistics (engine_ctl/control/ranking.py): pure, fast."""

from __future__ import annotations

import math
import random

import pytest

from ernie_tui.engine_ctl.control.ranking import (
    PairVerdict,
    compare_all,
    compare_pair,
    drift_seen,
    paired_interval,
    rank,
    t_two_sided,
    unpaired_interval,
)


def test_t_quantiles_match_the_tables():
    # Two-sided 95 %: 12.706 (1 df), 4.303 (2), 2.776 (4), 2.228 (10).
    assert t_two_sided(0.95, 1) == pytest.approx(12.706, rel=1e-3)
    assert t_two_sided(0.95, 2) == pytest.approx(4.303, rel=1e-3)
    assert t_two_sided(0.95, 4) == pytest.approx(2.776, rel=0.01)
    assert t_two_sided(0.95, 10) == pytest.approx(2.228, rel=0.01)


def drifting_rounds(gap: float, host: list[float], noise: float, seed: int) -> tuple[list[float], list[float]]:
    """Goodputs of A (100 at host speed 1) and B (gap x A) in rounds whose
    host speed is `host`, each with its own measurement noise (relative sd)."""
    rng = random.Random(seed)
    a = [100.0 * h * (1 + rng.gauss(0, noise)) for h in host]
    b = [100.0 * gap * h * (1 + rng.gauss(0, noise)) for h in host]
    return a, b


def test_pairing_finds_a_25_percent_gap_that_unpaired_calls_noise():
    # The host ran at 0.75, 1.3 and 1.0 of its speed in the three rounds: more
    # than the presets differ. Both members of each pair met the same round.
    a, b = drifting_rounds(1.25, [0.75, 1.3, 1.0], noise=0.02, seed=1)
    v = compare_pair("A", "B", a, b)
    assert v.beyond_noise and v.better == "B" and v.worse == "A"
    gap, lo, hi = v.gap_pct()
    assert abs(gap - 25.0) < 5.0 and lo < 25.0 < hi
    assert v.text().startswith("B carries 2") and "more goodput than A (" in v.text()
    mean, low, high = unpaired_interval(a, b)
    assert low < 0 < high  # each preset's own rounds spread wider than the gap
    assert mean == pytest.approx(v.mean)


def test_ten_percent_gap_is_never_called_the_wrong_way():
    # 200 drifting runs of three rounds, noise 4 % per figure: the verdict
    # names B or says within noise, never A.
    wrong = called = 0
    for seed in range(200):
        rng = random.Random(1000 + seed)
        host = [math.exp(rng.gauss(0, 0.25)) for _ in range(3)]
        v = compare_pair("A", "B", *drifting_rounds(1.10, host, noise=0.04, seed=seed))
        wrong += v.better == "A"
        called += v.better == "B"
    assert wrong == 0
    assert called > 0  # it is not a comparison that never calls anything


def test_within_noise_and_too_few_rounds():
    v = compare_pair("A", "B", [100, 90, 110], [102, 88, 108])
    assert not v.beyond_noise and v.better is None
    assert "within noise" in v.text()
    one = compare_pair("A", "B", [100, None, 0], [120, 130, 140])  # one round on both
    assert one.rounds == 1 and one.mean is None and not one.beyond_noise
    assert "not enough rounds" in one.text()
    assert paired_interval([0.1]) is None


def test_a_pair_where_a_carries_more_reads_as_a():
    v = compare_pair("A", "B", [125, 160, 100], [100, 128, 80])
    assert v.better == "A"
    gap, lo, hi = v.gap_pct()
    assert gap == pytest.approx(25.0, abs=0.5) and lo <= gap <= hi
    d = v.to_dict()
    assert d["better"] == "A" and d["beyond_noise"] and d["rounds"] == 3 and d["text"] == v.text()


def test_ranking_is_a_partial_order_with_ties_named():
    host = [0.8, 1.25, 1.0]
    values = {"A": [100 * h for h in host],
              "B": [101 * h * (1 + e) for h, e in zip(host, (0.02, -0.02, 0.01), strict=True)],
              "C": [150 * h for h in host]}
    verdicts = compare_all(["A", "B", "C"], values)
    r = rank(["A", "B", "C"], verdicts)
    assert r.tiers == [["C"], ["A", "B"]]
    assert ("A", "B") in r.ties
    assert r.text() == "C > A = B"
    # A chain with a tie across tiers: C over A, and B within noise of both.
    values["B"] = [125 * h * (1 + e) for h, e in zip(host, (0.2, -0.2, 0.1), strict=True)]
    r = rank(["A", "B", "C"], compare_all(["A", "B", "C"], values))
    assert r.tiers == [["B", "C"], ["A"]]
    assert r.ties == [("A", "B"), ("B", "C")]
    assert r.text() == "C > A; not placed (no pair beyond noise): B"
    assert r.to_dict()["wins"] == [["C", "A"]]


def _verdict(a: str, b: str, mean: float) -> PairVerdict:
    """A pair's verdict as compare_pair leaves it: beyond noise when mean is
    not 0 (an interval of +-0.05 around it), within noise otherwise."""
    return PairVerdict(a, b, "output_tps_at_capacity", [mean] * 3, 0.95, mean, mean - 0.05, mean + 0.05)


def test_ranking_text_claims_only_the_wins_measured():
    names = ["seed-A", "seed-C", "long-doc", "seqs128", "batch16k"]
    # The 22nd GPU run: one pair beyond noise of ten. Tiers alone read
    # 'seed-A = seed-C = seqs128 = batch16k > long-doc', three wins never seen.
    one = [_verdict(a, b, 0.33 if (a, b) == ("long-doc", "seqs128") else 0.0)
           for i, a in enumerate(names) for b in names[i + 1:]]
    assert rank(names, one).text() == "seqs128 > long-doc; not placed (no pair beyond noise): seed-A, seed-C, batch16k"
    # Two wins that say nothing about each other are listed as they are.
    two = [_verdict("A", "B", -0.2), _verdict("C", "D", -0.2), _verdict("A", "C", 0.0), _verdict("A", "D", 0.0),
           _verdict("B", "C", 0.0), _verdict("B", "D", 0.0)]
    assert rank(list("ABCD"), two).text() == "A > B; C > D"
    # A chain: the win its links imply is not repeated, and the tiers are whole.
    chain = [_verdict("A", "B", -0.2), _verdict("B", "C", -0.2), _verdict("A", "C", -0.4)]
    assert rank(list("ABC"), chain).text() == "A > B > C"
    chain[2] = _verdict("A", "C", 0.0)  # A ~ C: A > B > C still holds through B
    assert rank(list("ABC"), chain).text() == "A > B > C"
    # A cycle (by chance only) shows its wins, not a tier of equals.
    cycle = [_verdict("A", "B", -0.2), _verdict("B", "C", -0.2), _verdict("A", "C", 0.2)]
    assert rank(list("ABC"), cycle).text() == "A > B; B > C; C > A"
    assert rank(list("AB"), [_verdict("A", "B", 0.0)]).text() == "no pair beyond noise (A, B)"


def test_drift_seen_shows_the_presets_moving_together():
    host = [0.75, 1.3, 1.0]
    values = {"A": [100 * h for h in host], "B": [125 * h for h in host]}
    seen = drift_seen(["A", "B"], values)
    assert seen["own_range_pct"]["A"] == pytest.approx(73.3, abs=0.1)  # 1.3 / 0.75
    assert seen["pair_range_pct"]["A/B"] == pytest.approx(0.0, abs=0.01)
    assert seen["host_index"][1] > 1 > seen["host_index"][0]


# -- the floor: the smallest difference a verdict names (ranking.paired_verdict) ----------

def _pv(a_values, b_values, **kw):
    from ernie_tui.engine_ctl.control.ranking import paired_verdict

    return paired_verdict("aa", "aa-tune-0", a_values, b_values, **kw)


# tune-confirm-aa.md, run 4: an A/A pair on the near-deterministic stand-in, three rounds agreeing to
# hundredths of a percent: +0.014 % (+0.004 to +0.025 %) was "beyond noise" and a copy of BASE was written.
AA_A = [1000.0, 1000.0, 1000.0]
AA_B = [1000.14, 1000.10, 1000.18]


def test_a_gap_of_hundredths_of_a_percent_is_no_difference_worth_naming():
    v = _pv(AA_A, AA_B)
    assert v.interval_excludes_zero  # true of the measurement ...
    assert not v.beyond_noise and v.better is None  # ... and worth nothing to an operator
    assert v.within_floor and v.min_difference == pytest.approx(0.02)
    assert v.text().startswith("aa vs aa-tune-0: within noise: no difference of 2 % or more (aa-tune-0 +0.01 %")
    assert "interval +0.00 to +0.02 %" in v.text()
    d = v.to_dict()
    assert d["beyond_noise"] is False and d["min_difference_pct"] == 2.0 and d["text"] == v.text()
    # --min-difference 0: any interval that excludes 0, as before.
    assert _pv(AA_A, AA_B, min_difference=0.0).better == "aa-tune-0"


def test_the_whole_interval_must_clear_the_floor():
    # +3 % with an interval of about +1 to +5 %: apart from 0, not surely 2 % or more.
    v = _pv([100.0, 100.0, 100.0], [102.0, 103.0, 104.0])
    lo, hi = v.gap_pct()[1:]
    assert 0 < lo < 2 < hi
    assert not v.beyond_noise and not v.within_floor
    assert "within noise: less than the 2 % worth naming" in v.text()
    # A floor of 0.5 %: the same rounds are beyond noise.
    assert _pv([100.0, 100.0, 100.0], [102.0, 103.0, 104.0], min_difference=0.005).better == "aa-tune-0"
    # Beyond the floor either way: 20 % more, and 20 % less.
    up = _pv([100.0, 100.0, 100.0], [119.0, 120.0, 121.0])
    assert up.better == "aa-tune-0" and up.text().startswith("aa-tune-0 carries 20 % more")
    down = _pv([119.0, 120.0, 121.0], [100.0, 100.0, 100.0])
    assert down.better == "aa" and down.worse == "aa-tune-0"


def test_an_interval_across_0_and_the_floor_is_plain_within_noise():
    v = _pv([100.0, 100.0, 100.0], [90.0, 110.0, 104.0])
    assert not v.interval_excludes_zero and not v.within_floor and not v.beyond_noise
    assert v.text().startswith("aa vs aa-tune-0: within noise (aa-tune-0 +")
