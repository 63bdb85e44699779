"""Pure statistics: percentiles (linear interpolation), mean, rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ernie_tui.engine_ctl.load import stats


def test_percentile_known_values():
    xs = [1, 2, 3, 4]
    assert stats.percentile(xs, 0) == 1
    assert stats.percentile(xs, 100) == 4
    assert stats.percentile(xs, 50) == 2.5  # mean of the two middle values
    # rank (n-1)*p = 3*0.9 = 2.7 -> 3 + 0.7*(4-3)
    assert stats.percentile(xs, 90) == pytest.approx(3.7)
    assert stats.percentile([10, 20, 30, 40, 50], 25) == 20


def test_percentile_unsorted_and_single():
    assert stats.percentile([5, 1, 3], 50) == 3
    assert stats.percentile([7.5], 99) == 7.5


def test_percentile_empty_and_missing_values():
    assert stats.percentile([], 50) is None
    assert stats.percentile([None, float("nan")], 50) is None
    # None/NaN are "not measured", not zero
    assert stats.percentile([None, 2.0, float("nan"), 4.0], 50) == 3.0


def test_percentile_rejects_bad_p():
    with pytest.raises(ValueError):
        stats.percentile([1, 2], 101)
    with pytest.raises(ValueError):
        stats.percentiles([1, 2], (50, -1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=60),
       st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy_linear(xs, p):
    ours = stats.percentile(xs, p)
    ref = float(np.percentile(np.array(xs, dtype=float), p, method="linear"))
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-6)
    assert min(xs) <= ours <= max(xs)


def test_percentiles_keys_and_summary():
    out = stats.percentiles(range(1, 101), (50, 90, 99, 99.9))
    assert set(out) == {"p50", "p90", "p99", "p99.9"}
    assert out["p50"] == pytest.approx(50.5)
    s = stats.summarize([0.1, 0.2, 0.3])
    assert s["count"] == 3 and s["mean"] == pytest.approx(0.2) and s["p50"] == pytest.approx(0.2)
    empty = stats.summarize([])
    assert empty["count"] == 0 and empty["mean"] is None and empty["p99"] is None


def test_mean_is_exact_on_long_sums():
    xs = [0.1] * 10_000
    assert stats.mean(xs) == pytest.approx(0.1, rel=1e-15)
    assert stats.mean([]) is None


def test_rates():
    assert stats.rate(100, 4) == 25
    assert stats.rate(100, 0) is None
    assert stats.rate(None, 3) is None
    assert stats.counter_rate(10, 40, 3) == 10
    assert stats.counter_rate(40, 10, 3) is None  # counter reset: server restarted
    assert stats.counter_rate(None, 10, 3) is None


def test_relative_diff():
    assert stats.relative_diff(105, 100) == pytest.approx(0.05)
    assert stats.relative_diff(1, 0) is None
    assert stats.relative_diff(None, 1) is None
    assert math.isclose(stats.relative_diff(97, 100), -0.03)
