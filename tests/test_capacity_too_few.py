"""A capacity level with too few measured requests to judge is not judged
(issue 44, item 5): on a box saturated by another job a level at 144 counted
2 requests in its minute (0.36 req/s, TTFT p99 8.2 s), was judged failed, and
set off "the server's speed moved (-98 %)". The floor is LevelRules.min_judged
(min_requests unless set); such a level's verdict is S.TOO_FEW: not a pass,
not a fail (so the search measures it again, as any undecided miss), and no
reading of the server's speed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import capacity_run as R
from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.workload import WorkItem, Workload

HERE = Path(__file__).resolve().parent


def _level(url: str, concurrency: int, rules: C.LevelRules) -> C.LevelResult:
    items = [WorkItem(prompt=f"w{i} " * 10, max_tokens=8, prompt_tokens=10) for i in range(64)]
    runner = R.HttpLevelRunner(url, "paced", Workload(items, "fixed"), S.parse_slo(["ttft_p99=500ms"]), rules,
                               R.RequestSettings(warmup=False), use_metrics=False)
    try:
        return runner(concurrency)
    finally:
        runner.close()


def test_a_level_that_runs_out_of_time_with_too_few_requests_is_not_judged(stand_in):
    # Each request takes about 1.1 s (1 s to its first token): 2 streams
    # measure a handful in a 4 s level, under the 10 a verdict needs.
    url = stand_in("--slots", "8", "--ttft-ms", "1000", "--itl-ms", "10")
    rules = C.LevelRules(min_requests=10, max_requests=10, time_cap_s=4.0)
    lv = _level(url, 2, rules)
    assert lv.stop == "time_cap" and lv.requests < rules.judged_floor == 10, (lv.stop, lv.requests)
    assert lv.verdict == S.TOO_FEW and not lv.passed and not lv.decided
    (note,) = [w for w in lv.warnings if w.startswith("too few requests to judge")]
    assert f"{lv.requests} measured in" in note and "under the 10 a verdict needs" in note
    res = C.CapacityResult(slo=["ttft_p99=500ms"], capacity=None, levels=[lv], stop_reason="first_level_failed",
                           stop_message="", seconds=lv.elapsed_s or 0.0)
    assert "too few requests" in C.format_capacity(res)
    # The floor is the rule: set below what the level measured, the same level is judged (its TTFT misses).
    judged = _level(url, 2, replace(rules, min_judged=1))
    assert judged.stop == "time_cap" and judged.requests >= 1 and judged.verdict == S.FAIL and not judged.passed


def test_a_confirmation_keeps_its_levels_floor():
    # A confirmation counts at least its own requests (min_requests 1,000),
    # but one cut short at 600 has measured plenty to be judged.
    rules = C.LevelRules(min_requests=10, max_requests=400)
    assert rules.judged_floor == 10
    assert rules.confirming(1000).min_requests == 1000 and rules.confirming(1000).judged_floor == 10
    assert C.LevelRules(min_requests=10, min_judged=4).confirming(1000).judged_floor == 4
    with pytest.raises(ValueError):
        C.LevelRules(min_judged=0).validate()


def test_a_level_too_few_to_judge_says_nothing_of_the_servers_speed():
    # The two looks at 144: 2,300 output tok/s, then 46 from 2 requests.
    judged = C.LevelResult(concurrency=144, requests=400, output_tps=2300.0, verdict=S.PASS, passed=True,
                           decided=True)
    too_few = C.LevelResult(concurrency=144, requests=2, output_tps=46.0, verdict=S.TOO_FEW, stop="time_cap")
    assert C.speed_moved([judged, too_few]) is None
    # judged on those 2, it did read as the server's speed moving by 98 %
    moved = C.speed_moved([judged, replace(too_few, verdict=S.FAIL, decided=True)])
    assert moved is not None and moved["change"] == pytest.approx(46.0 / 2300.0 - 1)
