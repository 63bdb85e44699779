"""The Pareto front of a capacity sweep: the presets no other preset beats.

A preset is judged by two figures at its capacity under the SLO: goodput
(output tok/s of the requests meeting the SLO; more is better) and TTFT p99
(less is better). Another preset dominates it when it is at least as good on
both and better on one. The front is every preset nothing dominates: the
choices worth making, one trading latency for throughput against the next.

Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The figures the front is taken over: goodput (more is better), TTFT p99 (less is better).
FRONT_COLUMNS = ("goodput_output_tps", "ttft_p99_ms")


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(goodput, ttft) a is at least as good as b on both and better on one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_front(points: Mapping[str, tuple[float | None, float | None]]) -> set[str]:
    """The names whose (goodput, ttft) no other point dominates. A point
    missing either figure (a preset that met the SLO at no level has no
    TTFT at its capacity) is never on the front."""
    known = {name: (float(g), float(t)) for name, (g, t) in points.items() if g is not None and t is not None}
    return {name for name, p in known.items()
            if not any(dominates(q, p) for other, q in known.items() if other != name)}


def front_of_rows(rows: Sequence[Any]) -> set[str]:
    """The front of folded sweep rows (sweep.SweepRow): each preset's median
    goodput and TTFT p99 over its repeats."""
    points: dict[str, tuple[float | None, float | None]] = {}
    for row in rows:
        figures = []
        for column in FRONT_COLUMNS:
            agg = row.stats.get(column)
            figures.append(agg.median if agg is not None else None)
        points[row.preset] = (figures[0], figures[1])
    return pareto_front(points)
