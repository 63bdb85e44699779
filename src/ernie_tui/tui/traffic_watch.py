"""The traffic view's data, kept outside its widgets (as series.py keeps the charts').

TrafficWatch: the dashboard's sampler hands it a /metrics scrape every few
seconds, with the families a capture reads (traffic_capture.TRAFFIC_METRICS),
and it keeps the window's first scrape, those since (thinned to a bound) and
the newest. `state()` reads them through the capture's own code (from_metrics,
build_profile), so the view shows what `ernie-tui traffic capture` would write:
the window's length histograms, the requests finished per interval, the
prefix-cache hit rate, and the profile so far. A server restart (its counters
fall) or another URL starts a new window. Thread-safe: the sampler adds from
its thread, the view asks for a new window from the UI's.

`comparison()` lays profiles beside the synthetic default load (the bench's
uniform prompts and fixed, never-stopping outputs): the rows the view shows.
Pure: no Textual.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Sequence

from ernie_tui.engine_ctl.load import (
    REQUEST_SUCCESS,
    BurstConfig,
    Histogram,
    MetricsSnapshot,
    TrafficError,
    TrafficProfile,
    build_profile,
    from_metrics,
    interval_completions,
    since_start,
    window_histograms,
)

# Scrapes kept in a window: beyond this, every other one between the first and
# the newest is dropped (the rate series coarsens, the window keeps its start).
MAX_SCRAPES = 240
SCOPES = ("window", "start")
QS = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class TrafficState:
    """What the traffic view draws: one window of a server's /metrics."""

    url: str | None = None
    window_s: float = 0.0
    scrapes: int = 0
    requests: float = 0.0
    # The window's histograms (metrics.Histogram: cumulative buckets), None where
    # /metrics has none: prompt tokens, generation tokens, max_tokens asked.
    prompt: Histogram | None = None
    output: Histogram | None = None
    max_tokens: Histogram | None = None
    # Requests finished per interval between scrapes: (seconds before the
    # newest scrape, so <= 0; requests/s).
    rates: tuple[tuple[float, float], ...] = ()
    watched_s: float = 0.0  # from the first scrape watched to the newest (the span of `rates`)
    hit_rate: float | None = None  # prefix-cache hits / queries in the window
    profile: TrafficProfile | None = None
    problem: str | None = None  # why there is no profile yet
    scope: str = "window"  # "window": since the first scrape (or n); "start": all since the server started
    served: float | None = None  # requests the server finished since it started (its counter)


class TrafficWatch:
    def __init__(self, max_scrapes: int = MAX_SCRAPES) -> None:
        self._lock = threading.Lock()
        self._url: str | None = None
        self._snaps: list[MetricsSnapshot] = []
        self.scope = "window"
        self.max_scrapes = max(4, max_scrapes)

    def restart(self) -> None:
        """Begin a new window: it opens at the next scrape."""
        with self._lock:
            self._snaps = []
            self.scope = "window"

    def set_scope(self, scope: str) -> None:
        """"window" (since the window opened) or "start" (all the server
        served since it started: since_start)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
        with self._lock:
            self.scope = scope

    def add(self, url: str, snap: MetricsSnapshot) -> None:
        with self._lock:
            if url != self._url or (self._snaps and _restarted(self._snaps[-1], snap)):
                self._snaps, self._url = [], url
            self._snaps.append(snap)
            if len(self._snaps) > self.max_scrapes:
                inner = self._snaps[1:-1]
                self._snaps = [self._snaps[0], *inner[1::2], self._snaps[-1]]

    def state(self) -> TrafficState:
        """The window so far, read by the capture's code."""
        with self._lock:
            snaps, url, scope = list(self._snaps), self._url, self.scope
        served = snaps[-1].total(REQUEST_SUCCESS) if snaps else None
        if scope == "start" and snaps:
            before = since_start(snaps[-1])
            if before is None:
                return TrafficState(url=url, scrapes=len(snaps), scope=scope, served=served,
                                    problem="this server's /metrics does not say when it started")
            between = []  # from its start: nothing was watched in between
        elif len(snaps) < 2:
            return TrafficState(url=url, scrapes=len(snaps), scope=scope, served=served,
                                problem="waiting for a second /metrics scrape" if url else "no /metrics read yet")
        else:
            before, between = snaps[0], snaps[1:-1]
        after = snaps[-1]
        prompt, output, max_tokens = window_histograms(before, after)
        base = dict(url=url, window_s=float(after.mono) - float(before.mono),  # type: ignore[arg-type]
                    watched_s=float(after.mono) - float(snaps[0].mono),  # type: ignore[arg-type]
                    scrapes=len(snaps), prompt=prompt, output=output, max_tokens=max_tokens, scope=scope,
                    served=served, rates=tuple((end - float(after.mono), count / width)  # type: ignore[arg-type]
                                               for end, width, count in interval_completions(snaps)))
        try:
            cap = from_metrics(before, after, between)
            if scope == "start":
                cap.notes.append("/metrics: all the server served since it started; the mean rate is over its "
                                 "whole uptime, idle hours included")
            profile = build_profile("captured", [cap], url=url)
        except TrafficError as exc:
            return TrafficState(**base, problem=str(exc))  # type: ignore[arg-type]
        return TrafficState(**base, requests=cap.requests,  # type: ignore[arg-type]
                            hit_rate=cap.prefix.hit_rate if cap.prefix else None, profile=profile)


def _restarted(last: MetricsSnapshot, snap: MetricsSnapshot) -> bool:
    """The server restarted between two scrapes: its finished-request counter fell."""
    a, b = last.total(REQUEST_SUCCESS), snap.total(REQUEST_SUCCESS)
    return a is not None and b is not None and b < a


# -- beside the default load ------------------------------------------------------

@dataclass(frozen=True)
class DefaultLoad:
    """The synthetic load every figure is measured on without --traffic:
    prompts of uniform length, every output asking for the same max_tokens
    with ignore_eos (none stops early), sent closed-loop, no shared prefix."""

    min_tokens: int
    max_tokens_in: int
    max_tokens: int
    concurrency: int

    @classmethod
    def from_config(cls, config: BurstConfig | None = None) -> DefaultLoad:
        c = config or BurstConfig()
        return cls(**{f.name: getattr(c, f.name) for f in fields(cls)})

    def prompt_quantile(self, q: float) -> float:
        return self.min_tokens + q * (self.max_tokens_in - self.min_tokens)


def _lengths(values: Sequence[float]) -> str:
    return "/".join(f"{v:,.0f}" for v in values)


def _profile_cells(p: TrafficProfile | None) -> list[str]:
    if p is None:
        return ["–"] * len(ROWS)
    a, pre = p.arrivals, p.prefix
    return [
        f"{p.source.requests:,.0f}" if p.source.requests else "–",
        _lengths([p.prompt_tokens.quantile(q) for q in QS]),
        _lengths([p.output_tokens.quantile(q) for q in QS]),
        _lengths([p.max_tokens.quantile(q) for q in QS]) if p.max_tokens else "–",
        "–" if p.eos_share is None else f"{p.eos_share * 100:.0f} %",
        f"{a.rate_per_s:.3g}/s CV {a.cv:.1f}" + ("" if a.cv_measured else "?"),
        f"{pre.share * 100:.0f} % × {pre.tokens}" if pre.share > 0 and pre.tokens > 0 else "none",
        "–" if pre.hit_rate is None else f"{pre.hit_rate * 100:.1f} %",
    ]


def _default_cells(d: DefaultLoad) -> list[str]:
    return ["", _lengths([d.prompt_quantile(q) for q in QS]), _lengths([d.max_tokens] * 3),
            _lengths([d.max_tokens] * 3), "0 %", f"closed, {d.concurrency} at once", "none", "–"]


# The rows of the comparison, in order: (label, what it means, for the help line).
ROWS: tuple[str, ...] = ("requests", "prompt p10/50/90", "output p10/50/90", "max_tokens", "stop early",
                         "arrivals", "shared prefix", "prefix hits")


def comparison(columns: Sequence[tuple[str, TrafficProfile | None]], default: DefaultLoad
               ) -> tuple[list[str], list[list[str]]]:
    """(header, rows): each row its label, one cell per profile column, and
    the default load's cell last."""
    header = ["", *(name for name, _ in columns), "default load"]
    cells = [_profile_cells(p) for _, p in columns]
    dcells = _default_cells(default)
    rows = [[label, *(c[i] for c in cells), dcells[i]] for i, label in enumerate(ROWS)]
    return header, rows


def how_far(profile: TrafficProfile, default: DefaultLoad) -> str:
    """One line: where the default load stands against `profile`, as the
    ratios of their medians and the parts the default lacks."""
    bits = []
    for what, theirs, ours in (("prompt", profile.prompt_tokens.quantile(0.5), default.prompt_quantile(0.5)),
                               ("output", profile.output_tokens.quantile(0.5), float(default.max_tokens))):
        if theirs > 0:
            bits.append(f"{what} p50 ×{ours / theirs:.2g}")
    if profile.eos_share:
        bits.append(f"stops early 0 % vs {profile.eos_share * 100:.0f} %")
    if profile.prefix.share > 0 and profile.prefix.tokens > 0:
        bits.append(f"no shared prefix vs {profile.prefix.share * 100:.0f} %")
    if profile.arrivals.cv_measured and profile.arrivals.cv > 1.2:
        bits.append(f"no bursts vs gap CV {profile.arrivals.cv:.1f}")
    return f"the default load against {profile.name}: " + ", ".join(bits) if bits else ""
