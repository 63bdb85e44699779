"""A level's stream rate (LevelResult.stream_output_tps): what the paired
sweep's duels compare, because a short level's windowed rate jumps by a wave
of requests against a server whose requests end together."""

from __future__ import annotations

from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.capacity import level_result


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
    assert five.output_tps / four.output_tps == 1.25  # the windowed figure jumps by a wave
    assert four.stream_output_tps == five.stream_output_tps == 26 * 32 / 2.0


def test_the_stream_rate_weighs_each_request_by_its_time_and_needs_a_closed_loop():
    fast = S.RequestOutcome(ok=True, ttft_s=0.01, latency_s=1.0, completion_tokens=30)
    slow = S.RequestOutcome(ok=True, ttft_s=0.01, latency_s=3.0, completion_tokens=30)
    failed = S.RequestOutcome(ok=False, error_kind="disconnected")
    assert judged([fast, slow, failed], 2, 4.0).stream_output_tps == 2 * 60 / 4.0  # not the mean of 30 and 10
    assert judged([fast, slow], None, 4.0).stream_output_tps is None  # open loop: no fixed number of streams
    assert judged([failed], 2, 4.0).stream_output_tps is None
