"""The traffic view's charts, one textual-plotext widget each: a length
histogram (prompt tokens, generation tokens, max_tokens asked) and the
requests finished per second over the window.

The data lives outside (tui/traffic_watch.py): `show()` hands a widget the
window's histogram or rate series and the widget only draws. Each chart's
border subtitle says its figures in words, readable when the plot is small.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from textual_plotext import PlotextPlot

from ernie_tui.tui.widgets.charts import _fits, _fmt_ago, _fmt_num, _wrap


def bound_label(bound: float) -> str:
    """A bucket's upper bound, short: 50, 500, 2k, 10k."""
    if math.isinf(bound):
        return "inf"
    if bound >= 1000:
        return f"{bound / 1000:g}k"
    return f"{bound:g}"


def bars(hist: Any, also: Sequence[float] = ()) -> list[tuple[str, float]]:
    """(label, requests) per bucket, from the first bucket that holds a
    request (or a value of `also`) to the last: empty buckets between stay,
    so the axis keeps vLLM's steps. Labels read "≤B"; the +Inf bucket ">B"."""
    rows: list[tuple[float, float, float]] = []  # (lower, upper, count)
    prev_bound, prev = 0.0, 0.0
    for bound, cum in hist.buckets:
        rows.append((prev_bound, bound, cum - prev))
        prev_bound, prev = bound, cum
    wanted = [i for i, (lo, hi, c) in enumerate(rows) if c > 0 or any(lo < v <= hi for v in also)]
    if not wanted:
        return []
    out = []
    for lo, hi, c in rows[min(wanted):max(wanted) + 1]:
        out.append((f">{bound_label(lo)}" if math.isinf(hi) else f"≤{bound_label(hi)}", c))
    return out


def bucket_index(labels: Sequence[str], hist: Any, value: float) -> int | None:
    """The 1-based bar (as plotext places them) whose bucket holds `value`."""
    prev_bound = 0.0
    for bound, _ in hist.buckets:
        if prev_bound < value <= bound:
            label = f">{bound_label(prev_bound)}" if math.isinf(bound) else f"≤{bound_label(bound)}"
            return labels.index(label) + 1 if label in labels else None
        prev_bound = bound
    return None


def _line_y(i: int, n: int, height: int) -> float:
    """Where line i of an n-line message goes on a 0..1 axis, one row apart,
    centred: the plot has about height - 5 rows (borders, axes, labels)."""
    row = 1.0 / max(2, height - 5)
    return 0.5 + (n / 2 - 0.5 - i) * row


def label_step(labels: Sequence[str], width: int) -> int:
    """Every how many bars a label fits, `width` columns for all the bars,
    a free column between two labels."""
    if not labels:
        return 1
    need = max(len(label) for label in labels) + 1
    per_bar = max(width, 1) / len(labels)
    return max(1, math.ceil(need / per_bar))


class LengthHistogram(PlotextPlot):
    """Requests per length bucket of the window (vLLM's 1-2-5 buckets), the
    default load's length marked by a red line."""

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.title = title
        self.hist: Any = None
        self.default: float | None = None
        self.default_text = ""
        self.empty = "no requests yet"
        self.labels: list[str] = []
        self.counts: list[float] = []

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = self.title
        self.replot()

    def show(self, hist: Any, default: float | None, default_text: str, empty: str) -> None:
        key = (None if hist is None else (hist.buckets, hist.sum), default, default_text, empty)
        if key == getattr(self, "_key", None):
            return
        self._key = key
        self.hist, self.default, self.default_text, self.empty = hist, default, default_text, empty
        self.replot()

    def on_resize(self) -> None:
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_figure()
        hist = self.hist
        shown = bars(hist, [self.default] if self.default else []) if hist is not None and hist.count > 0 else []
        self.labels = [b for b, _ in shown]
        self.counts = [c for _, c in shown]
        if shown:
            plt.bar(self.labels, self.counts, color="cyan+", width=0.6)
            # Which labels show, chosen here: where they collide plotext drops
            # some of its own choosing, not the same ones from run to run.
            step = label_step(self.labels, self.size.width - 8)
            places = [float(i) for i in range(1, len(self.labels) + 1)]
            plt.xticks(places[::step], self.labels[::step])
            top = max(self.counts) or 1.0
            plt.ylim(0, top * 1.15)
            at = bucket_index(self.labels, hist, self.default) if self.default else None
            if at is not None:
                plt.vline(at, color="red")
            mean = hist.mean
            self.border_subtitle = _fits(
                self, f"{hist.count:,.0f} req · mean {_fmt_num(mean)} · [ansi_bright_red]{self.default_text}[/]",
                f"mean {_fmt_num(mean)} · [ansi_bright_red]{self.default_text}[/]",
                f"[ansi_bright_red]{self.default_text}[/]")  # narrow: the default before the mean
        else:
            plt.ylim(0, 1)
            plt.yticks([0, 1], ["", ""])
            plt.xticks([0, 1], ["", ""])
            lines = _wrap(self.empty, self.size.width - 4)
            for i, line in enumerate(lines):
                plt.text(line, 0.5, _line_y(i, len(lines), self.size.height), alignment="center", color="gray",
                         background="default")
            self.border_subtitle = ""
        self.refresh()


class ArrivalChart(PlotextPlot):
    """Requests finished per second, per interval between scrapes, over the
    window (the counters move as requests end, not as they arrive)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.rates: tuple[tuple[float, float], ...] = ()
        self.window_s = 0.0
        self.summary = ""
        self.empty = "no interval yet"

    def on_mount(self) -> None:
        super().on_mount()
        self.replot()

    def show(self, rates: Sequence[tuple[float, float]], window_s: float, summary: str, empty: str) -> None:
        key = (tuple(rates), window_s, summary, empty)
        if key == getattr(self, "_key", None):
            return
        self._key = key
        self.rates, self.window_s, self.summary, self.empty = tuple(rates), window_s, summary, empty
        self.replot()

    def on_resize(self) -> None:
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_figure()
        self.border_title = _fits(self, "Requests/s · finished per scrape", "req/s")
        span = max(self.window_s, 1.0)
        plt.xlim(-span, 0)
        if len(self.rates) >= 1:
            xs = [t for t, _ in self.rates]
            ys = [r for _, r in self.rates]
            plt.plot(xs, ys, marker="braille", color="green+")
            plt.ylim(0, max(max(ys), 0.1) * 1.25)
            ticks = [-span, -span / 2, 0.0]
            plt.xticks(ticks, [_fmt_ago(-t) for t in ticks])
            self.border_subtitle = _fits(self, self.summary, self.summary.split(" · ")[0])
        else:
            plt.ylim(0, 1)
            plt.yticks([0, 1], ["", ""])
            plt.xticks([-span, 0], ["", ""])
            lines = _wrap(self.empty, self.size.width - 4)
            for i, line in enumerate(lines):
                plt.text(line, -span / 2, _line_y(i, len(lines), self.size.height), alignment="center",
                         color="gray", background="default")
            self.border_subtitle = ""
        self.refresh()
