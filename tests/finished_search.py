"""A finished capacity search as the screens receive it (a CapacityResult),
made of the figures of the 2 am walkthrough (issue 44): levels doubled to
256, bisected down to 128, and 128's confirmation ended undecided at a cap
while 128's first look passed decided. The headline and the rows must then
agree; the tests feed it through CapacityDone, as the search's worker does."""

from __future__ import annotations

from ernie_tui.engine_ctl.load import CapacityResult, LevelResult
from ernie_tui.engine_ctl.load.capacity import capacity_summary

SLO = ["ttft_p99=500ms", "itl_p99=50ms"]


def _level(c: int, ttft: float, itl: float, *, verdict: str = "pass", passed: bool = True, stop: str = "decided",
           confirmation: bool = False, measured_again: str | None = None) -> LevelResult:
    rps = min(c, 128) * 0.11
    return LevelResult(
        concurrency=c, requests=max(40, 2 * c), ok=max(40, 2 * c), seconds=30.0, requests_per_s=rps,
        output_tps=rps * 128, ttft_p50_ms=ttft / 3, ttft_p99_ms=ttft, itl_p50_ms=itl / 2, itl_p99_ms=itl,
        attainment=1.0 if passed else 0.62, goodput_rps=rps if passed else rps * 0.6,
        goodput_output_tps=rps * 128 if passed else rps * 77, passed=passed, decided=verdict != "undecided",
        verdict=verdict, stop=stop, confirmation=confirmation, measured_again=measured_again,
        vllm={"ttft_p99_ms": ttft * 0.9, "itl_p99_ms": itl * 0.95})


def finished_search() -> CapacityResult:
    levels = [_level(1, 61.0, 9.1), _level(2, 64.0, 9.4), _level(4, 70.2, 10.3), _level(8, 88.5, 12.0),
              _level(16, 120.4, 14.8), _level(32, 180.7, 19.5), _level(64, 260.3, 27.9), _level(128, 431.9, 41.2),
              _level(256, 8163.0, 95.0, verdict="fail", passed=False),
              _level(192, 2210.0, 71.0, verdict="fail", passed=False),
              _level(160, 880.0, 55.0, verdict="fail", passed=False),
              _level(160, 912.0, 57.0, verdict="fail", passed=False, measured_again="recheck"),
              _level(128, 478.0, 44.0, verdict="undecided", stop="time_cap", confirmation=True)]
    capacity = capacity_summary(levels[-1])
    return CapacityResult(slo=SLO, capacity=capacity, levels=levels, stop_reason="bracketed",
                          stop_message="128 passed, 160 failed", seconds=151.0, url="http://127.0.0.1:8011",
                          model="tiny-ernie")
