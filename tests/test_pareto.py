"""The Pareto front of a capacity sweep (pure): presets whose goodput and
TTFT p99 no other preset beats on both."""

from __future__ import annotations

from ernie_tui.engine_ctl.control.sweep import SweepRun, fold
from ernie_tui.engine_ctl.load.pareto import dominates, front_of_rows, pareto_front


def test_dominates_needs_both_as_good_and_one_better():
    assert dominates((300.0, 40.0), (200.0, 50.0))
    assert dominates((300.0, 40.0), (300.0, 50.0))  # same goodput, faster
    assert not dominates((300.0, 40.0), (300.0, 40.0))  # a tie beats nothing
    assert not dominates((300.0, 60.0), (200.0, 50.0))  # more goodput, but slower: a trade


def test_front_keeps_the_trades_and_drops_the_beaten():
    points = {
        "fast": (200.0, 30.0),     # least latency
        "big": (400.0, 90.0),      # most goodput
        "middle": (300.0, 60.0),   # a trade between the two: on the front
        "beaten": (250.0, 70.0),   # middle has more goodput and less TTFT
        "twin": (400.0, 90.0),     # the same figures as big: neither beats the other
        "unmeasured": (None, None),
        "no_ttft": (500.0, None),  # no level met the SLO: nothing to compare
    }
    assert pareto_front(points) == {"fast", "big", "middle", "twin"}
    assert pareto_front({}) == set()
    assert pareto_front({"only": (1.0, 1.0)}) == {"only"}


def test_front_of_folded_rows_uses_the_medians():
    cap = dict(mode="capacity", capacity_concurrency=4.0)
    runs = [
        SweepRun("a", 0, "ok", goodput_output_tps=300.0, ttft_p99_ms=50.0, **cap),
        SweepRun("a", 1, "ok", goodput_output_tps=320.0, ttft_p99_ms=70.0, **cap),
        SweepRun("a", 2, "ok", goodput_output_tps=310.0, ttft_p99_ms=60.0, **cap),  # medians 310, 60
        SweepRun("b", 0, "ok", goodput_output_tps=305.0, ttft_p99_ms=65.0, **cap),  # beaten by a's medians
        SweepRun("c", 0, "ok", goodput_output_tps=200.0, ttft_p99_ms=20.0, **cap),
        SweepRun("d", 0, "failed: capacity", mode="capacity"),
    ]
    rows = fold(runs, ["a", "b", "c", "d"])
    assert front_of_rows(rows) == {"a", "c"}
