"""Chart data, kept outside the chart widgets.

A ChartPoint is one sample of everything the three charts draw. The sampler
worker owns a bounded deque of them and posts immutable snapshots; each chart
widget draws the slice of a snapshot that falls in the selected window.
Replay builds the same points from the periodic stats lines of a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Sequence

GIB = float(1 << 30)

# Time windows the charts offer, in seconds, and their labels.
WINDOWS: tuple[tuple[int, str], ...] = ((60, "1 min"), (300, "5 min"), (900, "15 min"))
MAX_WINDOW = max(w for w, _ in WINDOWS)


@dataclass(frozen=True)
class ChartPoint:
    t: float  # seconds (epoch when live; log time when replayed)
    mem_gib: tuple[float, ...] = ()  # per GPU used GiB (NVML), or (engine RSS GiB,)
    prompt_tps: float | None = None
    gen_tps: float | None = None
    kv_pct: float | None = None
    running: int | None = None
    waiting: int | None = None


def in_window(points: Sequence[ChartPoint], window: float, now: float) -> list[ChartPoint]:
    start = now - window
    return [p for p in points if start <= p.t <= now + 1e-9]


_TS = re.compile(r"^(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)$")


def log_time(stamp: str | None, year: int = 2000) -> float | None:
    """vLLM prints 'MM-DD hh:mm:ss' without a year; good enough for spacing."""
    if not stamp:
        return None
    m = _TS.match(stamp.strip())
    if not m:
        return None
    mo, d, h, mi, s = (int(x) for x in m.groups())
    try:
        return datetime(year, mo, d, h, mi, s).timestamp()
    except ValueError:
        return None


def points_from_stats(stats: Iterable) -> list[ChartPoint]:
    """ChartPoints from a report's StatsSample list (the log's own view)."""
    out: list[ChartPoint] = []
    last_t: float | None = None
    for i, s in enumerate(stats):
        t = log_time(getattr(s, "timestamp", None))
        if t is None:
            t = (last_t + 10.0) if last_t is not None else float(i * 10)
        last_t = t
        out.append(ChartPoint(t=t, prompt_tps=s.prompt_tps, gen_tps=s.generation_tps,
                              kv_pct=s.kv_usage_pct, running=s.running, waiting=s.waiting))
    return out
