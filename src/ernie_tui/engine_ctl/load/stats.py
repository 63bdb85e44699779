"""Plain statistics for probe and burst figures. No numpy: the inputs are a
few hundred numbers and a pure function is easier to test and to trust.

Percentile definition (used everywhere in ernie-tui): linear interpolation
between closest ranks, the same as numpy's default ``method="linear"``
(Hyndman & Fan type 7) and Excel's PERCENTILE.INC. For sorted values
x[0..n-1] and p in [0, 100], the rank is h = (n - 1) * p / 100 and the result
is x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]).
So p0 is the minimum, p100 the maximum, p50 of an even count is the mean of
the two middle values. Empty input gives None rather than raising, because a
burst in which every request failed still has to produce a report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def _clean(values: Iterable[float | None]) -> list[float]:
    # None and NaN mean "not measured" (e.g. a request that failed before its
    # first token); they are dropped, not counted as zero. Comprehensions, not
    # a loop: a capacity level's token gaps are 100,000+ values, judged while
    # the level runs, beside the event loop that timestamps the streams (NaN
    # is the one value not equal to itself).
    out = [float(v) for v in values if v is not None]
    return [f for f in out if f == f]


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """The p-th percentile (0..100) by linear interpolation; None if empty."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    xs = sorted(_clean(values))
    return _percentile_sorted(xs, p)


def _percentile_sorted(xs: Sequence[float], p: float) -> float | None:
    n = len(xs)
    if n == 0:
        return None
    if n == 1:
        return xs[0]
    h = (n - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def percentiles(values: Iterable[float | None], ps: Iterable[float] = (50, 90, 99)) -> dict[str, float | None]:
    """Several percentiles at once, keyed 'p50', 'p90', ... (one sort)."""
    xs = sorted(_clean(values))
    out: dict[str, float | None] = {}
    for p in ps:
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile must be within 0..100, got {p}")
        key = f"p{p:g}"
        out[key] = _percentile_sorted(xs, p)
    return out


def mean(values: Iterable[float | None]) -> float | None:
    xs = _clean(values)
    # math.fsum keeps long sums of small latencies exact enough to compare
    # with vLLM's histogram sum to well under a percent.
    return math.fsum(xs) / len(xs) if xs else None


def rate(count: float | None, seconds: float | None) -> float | None:
    """count / seconds, or None when either is unknown or the window is empty."""
    if count is None or seconds is None or seconds <= 0:
        return None
    return count / seconds


def counter_rate(before: float | None, after: float | None, seconds: float | None) -> float | None:
    """Per-second rate of a monotonically increasing counter between two reads.

    A counter that went down means the server restarted between the reads
    (Prometheus counters reset to 0); the window is then meaningless, so None.
    """
    if before is None or after is None:
        return None
    delta = after - before
    if delta < 0:
        return None
    return rate(delta, seconds)


def relative_diff(ours: float | None, reference: float | None) -> float | None:
    """(ours - reference) / reference, or None if it cannot be computed."""
    if ours is None or reference is None or reference == 0:
        return None
    return (ours - reference) / reference


def summarize(values: Iterable[float | None], ps: Iterable[float] = (50, 90, 99)) -> dict[str, float | None]:
    """{'mean', 'p50', 'p90', ..., 'count'} for a latency series."""
    xs = _clean(values)
    out: dict[str, float | None] = {"count": float(len(xs)), "mean": mean(xs)}
    out.update(percentiles(xs, ps))
    return out
