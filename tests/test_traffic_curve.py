"""A replayed profile's arrivals follow its rate window by window (#57: a
burst at night's hour 2 against a lull), scaled as a whole to the rate asked
for, seeded; profiles without a curve go at their mean rate as before."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import pytest

from ernie_tui.engine_ctl.load.arrivals import arrival_offsets
from ernie_tui.engine_ctl.load.burst import BurstConfig, _BurstPlan
from ernie_tui.engine_ctl.load.level_procs import open_specs
from ernie_tui.engine_ctl.load.prompts import BuiltPrompt
from ernie_tui.engine_ctl.load.traffic import Arrivals, LengthDist, Source, TrafficProfile
from ernie_tui.engine_ctl.load.traffic_replay import (
    MIN_WINDOW_CV,
    RateCurve,
    curve_of,
    curve_offsets,
    curve_stream,
    replay_settings,
)
from ernie_tui.engine_ctl.load.traffic_shapes import built_in


def _profile(series: list[float], window_s: float = 10.0, cv: float = 1.0) -> TrafficProfile:
    mean = sum(series) / len(series)
    return TrafficProfile(
        name="night",
        prompt_tokens=LengthDist(points=[(0.0, 10), (1.0, 40)]),
        output_tokens=LengthDist(points=[(0.0, 2), (1.0, 12)]),
        arrivals=Arrivals(rate_per_s=mean, cv=cv, cv_measured=True, window_s=window_s, rate_series=series),
        source=Source(kind="request-log"))


def _counts(times: list[float], window_s: float, windows: int) -> list[int]:
    out = [0] * windows
    for t in times:
        k = int(t // window_s)
        if k < windows:
            out[k] += 1
    return out


def _gap_cv(times: list[float]) -> float:
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    m = sum(gaps) / len(gaps)
    return math.sqrt(sum((g - m) ** 2 for g in gaps) / (len(gaps) - 1)) / m


def test_the_sends_follow_the_rate_of_each_window():
    # A lull of 1 req/s, a burst of 9, a lull, a burst: 100 s at a mean of 5.
    prof = _profile([1.0, 9.0, 1.0, 9.0] * 5, window_s=5.0)
    curve = curve_of(prof)
    assert curve is not None
    times = curve_offsets(curve, 500, 5.0, seed=3)
    counts = _counts(times, 5.0, 20)
    lulls, bursts = counts[0::2], counts[1::2]
    # 5 and 45 expected a window; the burst windows carry ~9x the lulls'.
    assert sum(lulls) / len(lulls) == pytest.approx(5, abs=2)
    assert sum(bursts) / len(bursts) == pytest.approx(45, rel=0.15)
    assert times == sorted(times) and times[-1] <= 100.0 + 1e-6


def test_the_search_scales_the_whole_curve_and_keeps_its_time_axis():
    prof = _profile([1.0, 9.0] * 10, window_s=5.0)
    curve = curve_of(prof)
    assert curve is not None
    base = _counts(curve_offsets(curve, 500, 5.0, seed=1), 5.0, 20)
    double = _counts(curve_offsets(curve, 1000, 10.0, seed=1), 5.0, 20)
    # Twice the rate: each window twice its own count, bursts still where they were.
    for k in (0, 1):
        assert sum(double[k::2]) == pytest.approx(2 * sum(base[k::2]), rel=0.15)
    assert sum(double[1::2]) > 6 * sum(double[0::2])


def test_the_replay_keeps_the_profiles_gap_cv_not_the_curve_on_top_of_it():
    # The profile's CV 2 was measured over the capture, swings between
    # windows included: the gaps inside a window are given less.
    prof = _profile([1.0, 4.0] * 10, window_s=20.0, cv=2.0)
    curve = curve_of(prof)
    assert curve is not None
    inner = 1 / math.sqrt(curve.shape)
    assert MIN_WINDOW_CV < inner < 2.0
    times = curve_offsets(curve, 20000, 2.5, seed=7)
    assert _gap_cv(times) == pytest.approx(2.0, rel=0.1)
    # The same curve with the whole CV inside each window sends burstier.
    naive = RateCurve(curve.window_s, curve.rates, shape=1 / 2.0 ** 2)
    assert _gap_cv(curve_offsets(naive, 20000, 2.5, seed=7)) > 2.2


def test_a_curve_that_explains_all_the_burstiness_keeps_a_floor_inside_windows():
    curve = curve_of(_profile([0.5, 8.0] * 6, cv=1.0))
    assert curve is not None and curve.shape == pytest.approx(1 / MIN_WINDOW_CV ** 2)


def test_an_empty_window_gets_no_sends_and_the_curve_repeats_past_its_end():
    prof = _profile([2.0, 0.0, 2.0], window_s=10.0)
    curve = curve_of(prof)
    assert curve is not None
    times = curve_offsets(curve, 120, 4 / 3, seed=2)  # 40 arrivals expected a 30 s lap: three laps
    assert not [t for t in times if 10.0 < t < 20.0 or 40.0 < t < 50.0 or 70.0 < t < 80.0]
    assert times[-1] == pytest.approx(90.0, abs=1e-6)  # the n-th arrival at the end of the third lap
    stream = curve_stream(curve, 4 / 3, seed=2)
    endless = [next(stream) for _ in range(200)]
    assert endless == sorted(endless) and endless[-1] > 120.0
    assert not [t for t in endless if 100.0 < t < 110.0 or 130.0 < t < 140.0]


def test_the_same_seed_gives_the_same_sends_and_another_seed_others():
    curve = curve_of(_profile([1.0, 3.0, 2.0]))
    assert curve is not None
    a = curve_offsets(curve, 50, 2.0, seed=4)
    assert a == curve_offsets(curve, 50, 2.0, seed=4)
    assert a != curve_offsets(curve, 50, 2.0, seed=5)
    one, two = curve_stream(curve, 2.0, seed=4), curve_stream(curve, 2.0, seed=4)
    assert [next(one) for _ in range(20)] == [next(two) for _ in range(20)]


def test_profiles_without_a_curve_and_the_mean_mode_go_at_a_mean_rate():
    assert curve_of(built_in("chat")) is None  # built-in: no series
    assert curve_of(_profile([3.0])) is None  # one window
    assert curve_of(_profile([1.0, 3.0]), "mean") is None
    with pytest.raises(ValueError):
        curve_of(_profile([1.0, 3.0]), "hourly")
    # A profile file written before (no rate series, no window) still loads, and goes at its mean.
    d = _profile([1.0, 3.0]).to_dict()
    del d["arrivals"]["rate_series"], d["arrivals"]["window_s"]
    old = TrafficProfile.from_dict(d)
    assert curve_of(old) is None


def _plan(prof: TrafficProfile, mode: str) -> list[float]:
    cfg = replace(BurstConfig(n=30, rate=4.0, concurrency=0, arrival_seed=9), **replay_settings(prof, arrivals=mode))
    cfg.validate()
    prompts = [BuiltPrompt("x", 10, 10)] * 30
    return _BurstPlan.make(cfg, prompts).schedule


def test_a_burst_plans_its_sends_along_the_curve_unless_told_the_mean():
    prof = _profile([1.0, 7.0, 1.0, 7.0])
    curve = curve_of(prof)
    assert curve is not None
    assert _plan(prof, "curve") == curve_offsets(curve, 30, 4.0, seed=9)
    assert _plan(prof, "mean") == arrival_offsets(30, 4.0, seed=9, burstiness=prof.arrivals.gamma_shape)


def test_a_burst_can_send_a_recorded_load_as_given():
    cfg = BurstConfig(n=3, rate=1.0, concurrency=0)
    plan = _BurstPlan.make(cfg, [BuiltPrompt("x", 10, 10)] * 3, sends=[(0.5, 7), (0.6, 9), (3.0, 2)])
    assert plan.schedule == [0.5, 0.6, 3.0] and plan.out_lengths == [7, 9, 2]
    assert [r.max_tokens for r in plan.records] == [7, 9, 2]


def test_the_search_children_each_follow_the_curve_at_their_share():
    curve = RateCurve(5.0, (1.0, 9.0), shape=4.0)
    specs = open_specs(10.0, 2, connections=8, arrivals="poisson", seed=1, late_s=0.01, curve=curve)
    assert [s["curve"] for s in specs] == [[5.0, [1.0, 9.0], 4.0]] * 2 and [s["rate"] for s in specs] == [5.0, 5.0]
    assert open_specs(10.0, 2, connections=8, arrivals="poisson", seed=1, late_s=0.01)[0]["curve"] is None


def test_the_cli_flag_picks_how_arrivals_are_replayed(tmp_path):
    from ernie_tui.cli.traffic_args import add_traffic_args, traffic_fields
    from ernie_tui.engine_ctl.load.traffic import save_profile

    path = save_profile(_profile([1.0, 3.0]), tmp_path / "night.json")
    ap = argparse.ArgumentParser()
    add_traffic_args(ap)
    fields = traffic_fields(ap.parse_args(["--traffic", str(path)]))
    assert fields is not None and fields[1]["traffic_arrivals"] == "curve"
    fields = traffic_fields(ap.parse_args(["--traffic", str(path), "--traffic-arrivals", "mean"]))
    assert fields is not None and fields[1]["traffic_arrivals"] == "mean"


@pytest.mark.parametrize("procs", [1, 2])
def test_a_capacity_level_sends_along_the_curve(stand_in, procs):
    # Windows of 0.5 s, the second of each pair empty: a level at 20 req/s
    # sends 40 req/s for half a second, then nothing for half a second.
    # At the mean rate the gaps would be 50 ms on average, hardly one near 0.5 s.
    import json
    import urllib.request

    from ernie_tui.engine_ctl.load import capacity as C
    from ernie_tui.engine_ctl.load import capacity_run as R
    from ernie_tui.engine_ctl.load import level_procs as LP
    from ernie_tui.engine_ctl.load import slo as S
    from ernie_tui.engine_ctl.load.workload import WorkItem, Workload

    if procs > 1 and not LP.supported():
        pytest.skip("stream processes need POSIX pipes")
    url = stand_in("--slots", "64", "--ttft-ms", "5", "--itl-ms", "2")
    items = [WorkItem(prompt=f"w{i} " * 10, max_tokens=4, prompt_tokens=10) for i in range(64)]
    runner = R.HttpRateRunner(url, "paced", Workload(items, "fixed"), S.parse_slo(["ttft_p99=5s"]),
                              C.LevelRules(min_requests=70, max_requests=70),
                              R.RequestSettings(client_procs=procs, warmup=False), use_metrics=False,
                              curve=RateCurve(0.5, (1.0, 0.0), shape=25.0))
    try:
        lv = runner(20.0)
    finally:
        runner.close()
    assert lv.requests >= 70, lv
    with urllib.request.urlopen(url + "/requests", timeout=10) as r:
        arrive = sorted(e["arrive"] for e in json.loads(r.read()))
    gaps = [b - a for a, b in zip(arrive, arrive[1:], strict=False)]
    assert sum(1 for g in gaps if g > 0.3) >= 2, sorted(gaps)[-5:]
    assert sorted(gaps)[len(gaps) // 2] < 0.1  # inside a window they come close together


def test_the_workload_source_says_how_the_traffic_arrives():
    from ernie_tui.engine_ctl.load.traffic_replay import describe

    prof = _profile([1.0, 3.0, 2.0], window_s=10.0)
    assert "along its rate curve (3 windows of 10 s)" in describe(prof)
    assert "at a mean rate" in describe(prof, arrivals="mean")
    assert "at a mean rate" in describe(built_in("chat"))
