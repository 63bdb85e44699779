"""The charts, one textual-plotext widget each: the dashboard's three time
series, and the capacity curves of the probe pane and the sweep screen.

The data lives outside: the sampler keeps the series and posts snapshots;
`show()` hands a widget the snapshot, the window and the clock, and the
widget only draws. The latest figure is written in each chart's border
subtitle so the number is readable even when the plot is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from textual_plotext import PlotextPlot

from ernie_tui.tui.series import ChartPoint, in_window

COLORS = ("cyan+", "magenta+", "green+", "orange+", "blue+", "red+", "yellow+", "white")


def _fmt_ago(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds == 0:
        return "now"
    if seconds % 60 == 0:
        return f"-{seconds // 60}m"
    if seconds > 60:
        return f"-{seconds // 60}m{seconds % 60:02d}"
    return f"-{seconds}s"


def _ticks(window: float) -> list[float]:
    step = {60: 15, 300: 60, 900: 300}.get(int(window), max(1, int(window) // 4))
    ticks = list(range(-int(window), 1, step))
    if ticks[-1] != 0:
        ticks.append(0)
    return [float(t) for t in ticks]


def _look(p: ChartPoint) -> tuple:
    """What of a point can change the picture (its time aside), rounded to
    what a terminal chart can show."""
    return (tuple(round(v, 2) for v in p.mem_gib), None if p.prompt_tps is None else round(p.prompt_tps, 1),
            None if p.gen_tps is None else round(p.gen_tps, 1), None if p.kv_pct is None else round(p.kv_pct, 1),
            p.running, p.waiting)


def _fits(widget, *choices: str) -> str:
    """The first of `choices` (Rich markup, longest first) whose text fits the
    widget's top or bottom border; the last one otherwise."""
    from rich.text import Text

    room = widget.size.width - 4  # the corners and a space either side
    for choice in choices:
        if room <= 0 or Text.from_markup(choice).cell_len <= room:
            return choice
    return choices[-1]


def _wrap(message: str, width: int) -> list[str]:
    """An empty chart's message in lines that fit the plot: a narrow chart
    showed the middle of one long line ("og holds no memory fig")."""
    import textwrap

    out: list[str] = []
    for line in message.split("\n"):
        out += textwrap.wrap(line, max(8, width)) or [""]
    return out


def _fmt_num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}{unit}"
    if abs(value) >= 10:
        return f"{value:.1f}{unit}"
    return f"{value:.2f}{unit}"


class TimeChart(PlotextPlot):
    """Base: a time-series chart over the last `window` seconds."""

    TITLE = ""
    KIND = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._points: Sequence[ChartPoint] = ()
        self._window = 300.0
        self._now = 0.0
        self._extra: dict = {}

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = self.TITLE
        self.replot()

    def show(self, points: Sequence[ChartPoint], window: float, now: float, **extra) -> None:
        """Draw `points` over the last `window` seconds before `now`, but only
        when the picture can differ: new or dropped points, or time moved by
        at least one braille dot column (a 5-minute window on a 36-column
        chart moves one dot every ~5 s; we redraw for every second dot). Plotext
        rebuilds cost milliseconds."""
        shown = in_window(points, window, now)
        dots = max(1, (self.size.width - 8))  # a time step of two braille dots: an idle chart rebuilds every ~10 s
        signature = (window, int(now // (window / dots)), _look(shown[-1]) if shown else None,
                     shown[0].t // (window / dots) if shown else None,
                     tuple(sorted((k, str(v)) for k, v in extra.items())), self.size)
        self._points = points
        self._window = window
        self._now = now
        self._extra = extra
        if signature != getattr(self, "_signature", None):
            self._signature = signature
            self.replot()

    def on_resize(self) -> None:
        # A screen coming back (a dialog closed) sends Resize without a new size.
        if self.size != getattr(self, "_plotted_size", None):
            self._plotted_size = self.size
            self._signature = None
            self.replot()

    def render(self):
        # Textual repaints a widget for many reasons (a toast, a dialog, a
        # scroll elsewhere); rebuild the plotext picture only when it changed.
        key = (self.size, self._version, self.app.theme)
        if key != getattr(self, "_render_key", None):
            self._render_key = key
            self._rendered = super().render()
        return self._rendered

    def replot(self) -> None:
        self._version = getattr(self, "_version", 0) + 1
        plt = self.plt
        plt.clear_figure()
        plt.xlim(-self._window, 0)
        ticks = _ticks(self._window)
        # A narrow chart (80 columns, three side by side): as many labels as
        # fit with room between them, "now" always; plotext otherwise drops
        # colliding labels of its own choosing.
        room = max(2, (self.size.width - 8) // 4)
        if len(ticks) > room:
            step = -(-len(ticks) // room)
            ticks = ticks[::-1][::step][::-1]
        plt.xticks(ticks, [_fmt_ago(-t) for t in ticks])
        points = in_window(self._points, self._window, self._now)
        drawn = self.draw(plt, points)
        problem = self._extra.get("problem")
        if problem and drawn:
            self.border_subtitle = f"[ansi_bright_red]{problem}[/]"  # the points shown are old figures
        if not drawn:
            plt.ylim(0, 1)
            plt.yticks([0, 1], ["", ""])
            message = self._extra.get(f"empty_{self.KIND}") or self._extra.get("empty") or "no samples yet"
            lines = _wrap(message, self.size.width - 4)
            for i, line in enumerate(lines):  # one text per row, centred around the middle
                plt.text(line, -self._window / 2, 0.5 + (len(lines) / 2 - 0.5 - i) * 0.25, alignment="center",
                         color="red" if problem else "gray", background="default")
        self.refresh()

    def xs(self, points: Sequence[ChartPoint]) -> list[float]:
        return [p.t - self._now for p in points]

    def draw(self, plt, points: Sequence[ChartPoint]) -> bool:  # pragma: no cover - abstract
        """Plot the points; return False when there was nothing to plot."""
        raise NotImplementedError

    @staticmethod
    def series(points: Sequence[ChartPoint], xs: list[float], get) -> tuple[list[float], list[float]]:
        out_x, out_y = [], []
        for x, p in zip(xs, points, strict=False):
            v = get(p)
            if v is not None:
                out_x.append(x)
                out_y.append(float(v))
        return out_x, out_y


class MemoryChart(TimeChart):
    """GPU memory used per GPU (NVML), or the engine's RSS (labelled so)."""

    TITLE = "Memory"
    KIND = "memory"

    def draw(self, plt, points: Sequence[ChartPoint]) -> bool:
        label = self._extra.get("memory_label") or "memory"
        source = self._extra.get("memory_source") or ""
        totals: tuple[float, ...] = self._extra.get("gpu_totals") or ()
        self.border_title = (_fits(self, "GPU memory GiB · NVML", "GPU GiB") if source == "nvml"
                             else _fits(self, "Engine RSS GiB · not GPU", "RSS GiB · not GPU", "RSS GiB")
                             if source == "rss" else "Memory GiB")
        self.tooltip = label
        xs = self.xs(points)
        count = max((len(p.mem_gib) for p in points), default=0)
        latest: list[str] = []
        top = 0.0
        for i in range(count):
            x, y = self.series(points, xs, lambda p, i=i: p.mem_gib[i] if i < len(p.mem_gib) else None)
            if not y:
                continue
            name = f"GPU{i}" if source == "nvml" else "RSS"
            plt.plot(x, y, marker="braille", color=COLORS[i % len(COLORS)])
            top = max(top, max(y))
            latest.append(f"{name} {y[-1]:.2f}" + (f"/{totals[i]:.0f}" if i < len(totals) else ""))
        if source == "nvml" and totals:
            plt.ylim(0, max(totals))
        elif top > 0:
            plt.ylim(0, top * 1.25)
        else:
            plt.ylim(0, 1)
        self.border_subtitle = _fits(self, " · ".join(latest) + " GiB", " · ".join(latest)) if latest else "no samples"
        return bool(latest)


class ThroughputChart(TimeChart):
    """Prompt and generation tokens/s from /metrics counters (or stats lines)."""

    TITLE = "Tokens/s"
    KIND = "tokens"

    def draw(self, plt, points: Sequence[ChartPoint]) -> bool:
        xs = self.xs(points)
        px, py = self.series(points, xs, lambda p: p.prompt_tps)
        gx, gy = self.series(points, xs, lambda p: p.gen_tps)
        top = max([*py, *gy, 0.0])
        if py:
            plt.plot(px, py, marker="braille", color="cyan+")
        if gy:
            plt.plot(gx, gy, marker="braille", color="magenta+")
        plt.ylim(0, top * 1.25 if top > 0 else 1)
        self.border_title = _fits(self, "Tokens/s · [ansi_bright_cyan]prompt[/] / [ansi_bright_magenta]gen[/]",
                                  "tok/s [ansi_bright_cyan]prompt[/]/[ansi_bright_magenta]gen[/]")
        if py or gy:
            p, g = _fmt_num(py[-1] if py else None), _fmt_num(gy[-1] if gy else None)
            self.border_subtitle = _fits(self, f"prompt {p} · gen {g}", f"{p} / {g}")
        else:
            self.border_subtitle = "no samples"
        return bool(py or gy)


class KVChart(TimeChart):
    """KV-cache usage % with running / waiting requests (right axis)."""

    TITLE = "KV cache %"
    KIND = "kv"

    def draw(self, plt, points: Sequence[ChartPoint]) -> bool:
        xs = self.xs(points)
        kx, ky = self.series(points, xs, lambda p: p.kv_pct)
        rx, ry = self.series(points, xs, lambda p: p.running)
        wx, wy = self.series(points, xs, lambda p: p.waiting)
        if ky:
            plt.plot(kx, ky, marker="braille", color="green+")
        plt.ylim(0, 100)
        reqs_top = max([*ry, *wy, 0.0])
        if ry:
            plt.plot(rx, ry, marker="braille", color="cyan+", yside="right")
        if wy:
            plt.plot(wx, wy, marker="braille", color="red+", yside="right")
        if ry or wy:
            plt.ylim(0, max(4.0, reqs_top * 1.25), yside="right")
        self.border_title = _fits(self, "[ansi_bright_green]KV cache %[/] · [ansi_bright_cyan]running[/] / "
                                  "[ansi_bright_red]waiting[/]",
                                  "[ansi_bright_green]KV %[/] · [ansi_bright_cyan]run[/]/[ansi_bright_red]wait[/]")
        if ky or ry:
            kv = _fmt_num(ky[-1] if ky else None, '%')
            run, wait = int(ry[-1]) if ry else '–', int(wy[-1]) if wy else '–'
            self.border_subtitle = _fits(self, f"KV {kv} · run {run} · wait {wait}", f"{kv} · {run}/{wait}")
        else:
            self.border_subtitle = "no samples"
        return bool(ky or ry or wy)


# -- capacity curves ------------------------------------------------------------------------------

@dataclass
class CapacityCurve:
    """One capacity search as the chart draws it: its levels (capacity.LevelResult
    or anything with concurrency, ttft_p99_ms, output_tps and passed), the
    concurrency it settled on, and whether it is on the sweep's Pareto front."""

    name: str
    levels: Sequence[Any]
    capacity: float | None = None  # a concurrency, or (rate search) a rate in req/s
    front: bool = False


def _load(level: Any) -> float:
    """A level's load: its request rate (open loop) or its concurrency."""
    rate = getattr(level, "rate", None)
    return float(rate if rate is not None else (level.concurrency or 0))


def _load_label(level: Any) -> str:
    """'c8', or for a rate level '2.5/s'."""
    rate = getattr(level, "rate", None)
    return f"{rate:g}/s" if rate is not None else f"c{level.concurrency}"


PASS_MARKER, FAIL_MARKER, FRONT_MARKER = "●", "×", "◆"


def place_labels(spots: Sequence[tuple[str, int, int]], width: int,
                 order: Sequence[int] | None = None) -> dict[int, int]:
    """Where each point's label goes, as {index: first column}, in a canvas
    `width` cells wide; `spots` are (label, column, row) of the points'
    markers. A label stands right of its marker, or left of it where the
    right edge would cut it; it is left out where it would touch a label
    already placed (a free cell between them) or cover any point's marker.
    `order`: which labels are placed first (all, in turn, by default).
    Points close together read "c32cc34" when each got its label (issue 59, 8)."""
    placed: dict[int, int] = {}
    taken: dict[int, list[tuple[int, int]]] = {}  # row: (first, last) columns of the labels placed there
    markers: dict[int, set[int]] = {}
    for _, col, row in spots:
        markers.setdefault(row, set()).add(col)
    for i in (range(len(spots)) if order is None else order):
        text, col, row = spots[i]
        n = len(text)
        for start in (col + 1, col - n):
            end = start + n - 1
            if start < 0 or end >= width:
                continue
            if any(start <= c <= end for c in markers.get(row, ())):
                continue
            if any(start <= last + 1 and first <= end + 1 for first, last in taken.get(row, [])):
                continue
            placed[i] = start
            taken.setdefault(row, []).append((start, end))
            break
    return placed


def canvas_cell(value: float, top: float, cells: int) -> int:
    """The cell (column or row from the bottom) plotext draws `value` in, on
    an axis from 0 to `top` that is `cells` wide (its own rounding)."""
    if top <= 0 or cells <= 1:
        return 0
    return math.floor(round(0.5 + (cells - 1) * value / top, 8))


def value_ticks(top: float, rows: int) -> tuple[list[float], list[str]]:
    """The y axis's ticks from 0 to `top` and their labels, set here rather
    than left to plotext, so that the labels' width (and so where each
    point lands) is known before the picture is built."""
    n = max(2, min(7, rows // 5 + 1))
    ticks = [top * i / (n - 1) for i in range(n)]
    fmt = ",.0f" if top >= 100 else ".1f" if top >= 10 else ".2f"
    return ticks, [format(t, fmt) for t in ticks]


def ttft_at(level: Any, percentile: int) -> float | None:
    """A level's TTFT at a percentile, in ms: p50 and p99 are its own
    columns, another percentile is there when the SLO judged it."""
    if percentile in (50, 99):
        return getattr(level, f"ttft_p{percentile}_ms")
    for o in getattr(level, "objectives", None) or ():
        if o.get("metric") == "ttft" and o.get("percentile") == percentile:
            return o.get("value_ms")
    return None


class CapacityChart(PlotextPlot):
    """Output tok/s against TTFT (p99, or the percentile the SLO judges),
    one curve per search, its points in load order (concurrency, or req/s): ● a level that
    met the SLO, × one that missed it, ◆ the capacity of a curve on the
    Pareto front. The SLO's TTFT limit is the red vertical line. The curves
    live outside; `show()` hands them in and the widget only draws."""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.curves: tuple[CapacityCurve, ...] = ()
        self.limit_ms: float | None = None
        self.percentile = 99
        self.points_drawn = 0
        self._empty = "no level measured yet"
        self.note = ""  # said after the subtitle's counts (the sweep's Pareto front); kept across redraws

    def on_mount(self) -> None:
        super().on_mount()
        self.replot()

    def show(self, curves: Sequence[CapacityCurve], limit_ms: float | None = None, percentile: int = 99,
             empty: str | None = None, note: str = "") -> None:
        """Draw `curves` with TTFT p`percentile` across and its SLO limit
        (None: the SLO sets none on that percentile); `note` ends the
        subtitle (a resize redraws it too)."""
        self.curves = tuple(curves)
        self.note = note
        self.limit_ms = limit_ms
        self.percentile = percentile
        if empty is not None:
            self._empty = empty
        self.replot()

    def on_resize(self) -> None:
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_figure()
        xs_all: list[float] = []
        ys_all: list[float] = []
        self.points_drawn = 0
        self.labels_placed: list[tuple[str, int, int]] = []  # (label, canvas column, canvas row from the bottom)
        p = self.percentile
        drawn: list[tuple[int, CapacityCurve, list[Any], list[float], list[float]]] = []
        for i, curve in enumerate(self.curves):
            levels = sorted((lv for lv in curve.levels if ttft_at(lv, p) is not None and lv.output_tps is not None),
                            key=_load)
            if levels:
                drawn.append((i, curve, levels, [float(ttft_at(lv, p)) for lv in levels],
                              [float(lv.output_tps) for lv in levels]))
        for _, _, _, xs, ys in drawn:
            xs_all += xs
            ys_all += ys
        right = max([*xs_all, self.limit_ms or 0.0], default=0.0) * 1.1 or 1.0
        top = max(ys_all, default=0.0) * 1.2 or 1.0
        ticks, tick_labels = value_ticks(top, self.size.height - 3)
        for i, curve, levels, xs, ys in drawn:
            label = curve.name + (f" {FRONT_MARKER} front" if curve.front else "")
            plt.plot(xs, ys, marker="braille", color=COLORS[i % len(COLORS)],
                     label=label if len(self.curves) > 1 else None)
            if len(self.curves) == 1:  # one search: say which load (concurrency, or req/s) each point is
                self._label_points(plt, curve, levels, xs, ys, right, top, max(map(len, tick_labels)))
            for lv, x, y in zip(levels, xs, ys, strict=True):
                at_capacity = curve.capacity is not None and _load(lv) == float(curve.capacity)
                marker = FRONT_MARKER if curve.front and at_capacity else (
                    PASS_MARKER if lv.passed else FAIL_MARKER)
                plt.scatter([x], [y], marker=marker, color="green+" if lv.passed else "red+")
            self.points_drawn += len(levels)
        if self.limit_ms is not None:
            plt.vline(self.limit_ms, color="red")
        if xs_all:
            plt.xlim(0, right)
            plt.ylim(0, top)
            plt.yticks(ticks, tick_labels)
        else:
            plt.xlim(0, (self.limit_ms or 1.0) * 1.5)
            plt.ylim(0, 1)
            plt.yticks([0, 1], ["", ""])
            plt.text(self._empty, (self.limit_ms or 1.0) * 0.75, 0.5, alignment="center", color="gray",
                     background="default")
        self.border_title = f"output tok/s against TTFT p{p} ms"
        limit = f" · [ansi_bright_red]limit {self.limit_ms:g} ms[/]" if self.limit_ms is not None else ""
        rate = any(getattr(lv, "rate", None) is not None for c in self.curves for lv in c.levels)
        self.border_subtitle = f"{self.points_drawn} level(s){' in req/s' if rate else ''}{limit}{self.note}"
        self.refresh()

    def _label_points(self, plt, curve: CapacityCurve, levels: Sequence[Any], xs: list[float], ys: list[float],
                      right: float, top: float, ylabel_width: int) -> None:
        """Each point's load beside it, where it fits without touching
        another label or covering a marker: the answer's first, then by load."""
        # The canvas plotext draws in: the widget less its two y axes and the
        # y labels across, less the two x axes and the x labels down.
        width, height = self.size.width - 2 - ylabel_width, self.size.height - 3
        self.canvas_origin = (ylabel_width + 1, self.size.height - 3)  # the canvas' bottom-left cell in the widget
        if width < 4 or height < 2:
            return
        spots = [(_load_label(lv), canvas_cell(x, right, width), canvas_cell(y, top, height))
                 for lv, x, y in zip(levels, xs, ys, strict=True)]
        answer = [i for i, lv in enumerate(levels) if curve.capacity is not None and _load(lv) == float(curve.capacity)]
        order = answer + [i for i in range(len(levels)) if i not in answer]
        for i, start in place_labels(spots, width, order).items():
            plt.text(spots[i][0], start * right / (width - 1), ys[i], color="gray", alignment="left")
            self.labels_placed.append((spots[i][0], start, spots[i][2]))
