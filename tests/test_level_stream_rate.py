"""A level's stream rate (LevelResult.stream_output_tps): what the paired
sweep's duels compare, and what a closed-loop level's rates are scaled to,
because a short level's windowed rate jumps by a wave of requests against a
server whose requests end together. On an H100 a level read 12,136 tok/s by
its windows where vLLM's own counter read 17,228 and the streams 16,548
(docs/lab/capacity-h200/2026-12-06-tune-h100.md)."""

from __future__ import annotations

import pytest

from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.capacity import LevelResult, level_result


def waves(concurrency: int, n_waves: int, tokens: int, seconds: float) -> list[S.RequestOutcome]:
    """C streams, each answering `n_waves` requests of `tokens` tokens back to back."""
    return [S.RequestOutcome(ok=True, ttft_s=0.02, latency_s=seconds, completion_tokens=tokens,
                             itls=[(seconds - 0.02) / (tokens - 1)] * (tokens - 1), start_s=w * seconds,
                             end_s=(w + 1) * seconds)
            for w in range(n_waves) for _ in range(concurrency)]


def judged(outcomes, concurrency, window_s):
    slo = S.parse_slo(["ttft_p99=1s"])
    return level_result(concurrency, outcomes, slo, S.evaluate(outcomes, slo), window_s, "time_cap")


def test_a_window_holding_four_waves_or_five_reads_the_same_stream_rate():
    # 26 streams of 32-token answers, 2 s each: 416 tok/s held. An 8.3 s window
    # counts the requests sent in it: 4 waves or 5 as its edges fall.
    four, five = judged(waves(26, 4, 32, 2.0), 26, 8.3), judged(waves(26, 5, 32, 2.0), 26, 8.3)
    assert five.window_output_tps / four.window_output_tps == 1.25  # the windowed figure jumps by a wave
    assert four.stream_output_tps == five.stream_output_tps == 26 * 32 / 2.0
    # ... and the level's own rates are the streams' (d845722): the same either way
    assert four.output_tps == five.output_tps == 26 * 32 / 2.0
    assert four.requests_per_s == five.requests_per_s == four.goodput_rps == 26 / 2.0


def test_the_stream_rate_weighs_each_request_by_its_time_and_needs_a_closed_loop():
    fast = S.RequestOutcome(ok=True, ttft_s=0.01, latency_s=1.0, completion_tokens=30)
    slow = S.RequestOutcome(ok=True, ttft_s=0.01, latency_s=3.0, completion_tokens=30)
    failed = S.RequestOutcome(ok=False, error_kind="disconnected")
    assert judged([fast, slow, failed], 2, 4.0).stream_output_tps == 2 * 60 / 4.0  # not the mean of 30 and 10
    assert judged([fast, slow], None, 4.0).stream_output_tps is None  # open loop: no fixed number of streams
    assert judged([failed], 2, 4.0).stream_output_tps is None


# -- the level's rates scaled to the streams' (a wave-free reading) ------------------------

SLO = S.parse_slo(["ttft_p99=1s"])
STREAMS, TOKENS, LATENCY, PERIOD = 4, 10, 1.35, 1.4  # each stream: a 1.35 s request every 1.4 s


def wave_starts(starts: list[float], ok: bool = True) -> list[S.RequestOutcome]:
    return [S.RequestOutcome(ok=ok, ttft_s=0.1, latency_s=LATENCY, itls=[0.125] * (TOKENS - 1),
                             completion_tokens=TOKENS, start_s=t, end_s=t + LATENCY)
            for t in starts for _ in range(STREAMS)]


def result(outcomes: list[S.RequestOutcome], concurrency: int | None, span: float) -> LevelResult:
    return level_result(concurrency, outcomes, SLO, S.evaluate(outcomes, SLO), span, "decided")


def test_three_waves_in_a_three_second_span_read_the_streams_rate_not_the_wave_starts():
    # Waves start at 0, 1.4 and 2.8 s: all three inside a 3 s span, so the
    # windows hold 12 requests (40 tok/s) where the streams carry 29.6.
    res = result(wave_starts([0.0, PERIOD, 2 * PERIOD]), STREAMS, 3.0)
    streams = STREAMS * TOKENS / LATENCY
    assert res.window_output_tps == pytest.approx(12 * TOKENS / 3.0)
    assert res.stream_output_tps == pytest.approx(streams)
    assert res.output_tps == pytest.approx(streams)
    assert res.goodput_output_tps == pytest.approx(streams)  # every request met the SLO
    assert res.requests_per_s == pytest.approx(STREAMS / LATENCY)
    assert res.goodput_rps == pytest.approx(STREAMS / LATENCY)
    # The true rate (a request every 1.4 s a stream, 28.6 tok/s) is within the
    # 50 ms a stream spends between requests; the windows' was 40 % over it.
    assert abs(res.output_tps / (STREAMS * TOKENS / PERIOD) - 1) < 0.05


def test_the_same_streams_read_alike_whether_two_waves_or_three_fell_in_the_span():
    two = result(wave_starts([0.0, PERIOD]), STREAMS, 2.9)
    three = result(wave_starts([0.0, PERIOD, 2 * PERIOD]), STREAMS, 2.9)
    assert three.window_output_tps / two.window_output_tps == pytest.approx(1.5)
    assert three.output_tps == pytest.approx(two.output_tps)


def test_only_meeting_requests_count_as_goodput_at_the_streams_rate():
    slow = [S.RequestOutcome(ok=True, ttft_s=2.0, latency_s=LATENCY, itls=[0.125] * (TOKENS - 1),
                             completion_tokens=TOKENS, start_s=0.0, end_s=LATENCY) for _ in range(STREAMS)]
    res = result(wave_starts([PERIOD, 2 * PERIOD]) + slow, STREAMS, 3.0)
    assert res.goodput_output_tps == pytest.approx(res.output_tps * 2 / 3)


def test_open_loop_and_levels_with_failures_keep_the_windows_rate():
    arrivals = result(wave_starts([0.0, PERIOD, 2 * PERIOD]), None, 3.0)  # open loop: no streams
    assert arrivals.stream_output_tps is None
    assert arrivals.output_tps == pytest.approx(arrivals.window_output_tps)
    failed = wave_starts([0.0, PERIOD]) + wave_starts([2 * PERIOD], ok=False)
    closed = result(failed, STREAMS, 3.0)
    assert closed.output_tps == pytest.approx(8 * TOKENS / 3.0)


def test_the_bench_reads_the_h100_records_windows_against_streams_against_vllms_counter(capsys):
    """bench/level_rates.py on the H100 tune's records (docs/lab/data): the
    windows' rate strayed to 0.69 of vLLM's counter, the streams' stayed
    within 0.95-1.09."""
    from bench_scripts import BENCH, load_bench

    bench = load_bench("level_rates")
    root = BENCH.parent
    records = sorted((root / "docs/lab/data/h100-tune-2026-12-06/home/data/runs").glob("*capacity*.json"))
    assert bench.main([str(p) for p in records]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "30 levels; windows' rate over vLLM's counter 0.692-1.056, streams' 0.953-1.084"
