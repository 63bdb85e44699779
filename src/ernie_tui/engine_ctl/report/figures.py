"""The report's pictures, drawn with matplotlib on its Agg backend (headless,
no display, nothing fetched): PNG or SVG bytes. matplotlib is the optional
`report` extra; without it every function here raises ReportError saying
how to install it.

One look should give the capacity, the SLO and the knee (vLLM's
plot_pareto and GuideLLM's report are the bar). So each run is a row whose
title states what it found, and every panel has the load on its x axis
(concurrency or request rate): TTFT and ITL against the SLO's line,
throughput with its knee, and attainment (0-100 %). Lines join one point
per load, in load order, so they never zigzag: a load measured again (a
confirmation, a remeasure) is a point of its own, off the line, with a
marker of its own. A latency axis spanning more than a decade is
logarithmic, so passing levels and the SLO line are not squashed under one
slow level. The SLO line and the capacity are labelled on the plot itself;
those labels are moved off each other, legends and the points, and nothing
else is written beside points (the axes carry the values). A title too
wide for its row is wrapped, not cut.

SVG keeps its text as text (svg.fonttype "none"), so a browser draws it with
a local font and a test can find the labels, and each artist that matters
carries an id (gid): level-<label>-<verdict>, slo-<metric>, capacity,
front-<preset>, attainment-<label>, overlay-<trial>.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ernie_tui.engine_ctl.load import second_look
from ernie_tui.engine_ctl.report.inputs import Comparison, Curve, Level, ReportError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure
    from matplotlib.text import Text

INSTALL_HINT = "the report's pictures need matplotlib: pip install 'ernie-tui[report]'"

VERDICT_STYLE = {  # marker, colour, filled
    "pass": ("o", "#1a9850", True),
    "fail": ("X", "#d73027", True),
    "undecided": ("o", "#777777", False),
    "": ("D", "#4575b4", True),  # a burst: no verdict
}
SLO_COLOUR = "#d73027"
PALETTE = ["#4575b4", "#d73027", "#1a9850", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#666666"]
LOG_SPAN = 10.0  # a latency axis whose values span this factor or more is drawn on a log scale


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError(INSTALL_HINT) from None
    matplotlib.use("Agg", force=True)
    return matplotlib


def new_figure(width: float, height: float) -> "Figure":
    _mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Figure() (not pyplot): no global state, no GUI, safe from any thread;
    # an Agg canvas of its own measures the labels (finish()).
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def render(fig: "Figure", fmt: str, salt: str = "ernie-tui", dpi: float | None = None) -> bytes:
    """The figure as PNG or SVG bytes (SVG text stays text; ids are stable)."""
    mpl = _mpl()
    buf = io.BytesIO()
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format=fmt, dpi=dpi or "figure", metadata={"Date": None} if fmt == "svg" else None)
    return buf.getvalue()


def _verdict_label(verdict: str) -> str:
    return {"": "measured"}.get(verdict, verdict)


def curve_title(curve: Curve) -> str:
    """The preset, and which repeat of a sweep (r1, r2, ... as the sweep counts them)."""
    tail = curve.repeat.removeprefix("sweep repeat ")
    return f"{curve.name} r{int(tail) + 1}" if tail.isdigit() and tail != curve.repeat else curve.name


def latency_name(curve: Curve, metric: str) -> str:
    """The percentile a latency picture shows: the SLO's own on that metric
    (so its line and its points speak of the same figure), else p99."""
    own = sorted(name for name in curve.limits if name.startswith(metric + "_"))
    return own[0] if own else f"{metric}_p99"


def _shown(name: str) -> str:
    """"ttft_p99" -> "TTFT p99"."""
    return name.replace("_", " ").upper().replace(" P", " p")


def row_title(curve: Curve) -> str:
    """What the run found, as the title of its row: the capacity and the SLO first."""
    slo = ", ".join(f"{_shown(k)} ≤ {v:g} ms" for k, v in curve.limits.items())  # in the SLO's order
    cap = curve.capacity
    if curve.kind == "burst" and curve.levels:
        lv = curve.levels[0]
        tps = f"{lv.output_tps:,.0f} output tok/s" if lv.output_tps is not None else "no output"
        ttft = f", TTFT p99 {lv.ttft_p99_ms:,.0f} ms" if lv.ttft_p99_ms is not None else ""
        return f"{curve_title(curve)}: burst at {lv.label}: {tps}{ttft}"
    if cap is None:
        return f"{curve_title(curve)}: no capacity under {slo or 'its SLO'} (search stopped: {curve.stop or '?'})"
    good = f" (goodput {cap.goodput_output_tps:,.0f} tok/s)" if cap.goodput_output_tps is not None else ""
    return f"{curve_title(curve)}: capacity {cap.label}{good} under {slo}"


# -- axes ----------------------------------------------------------------------------------

def _plain_ticks(axis: Any) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.10g}"))
    axis.set_minor_formatter(NullFormatter())


def _load_axis(ax: "Axes", curve_key: str, xs: list[float]) -> None:
    """The load on x: concurrency or request rate, log 2 once it spans 8x
    (a search doubles its load), with plain numbers as ticks."""
    ax.set_xlabel("concurrency" if curve_key == "concurrency" else "request rate (req/s)")
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
        _plain_ticks(ax.xaxis)


def _latency_axis(ax: "Axes", values: list[float], label: str) -> None:
    """Latency on y: logarithmic when it spans a decade or more, so the
    passing levels and the SLO line keep their room beside one slow level."""
    from matplotlib.ticker import LogLocator

    ax.set_ylabel(label)
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) >= LOG_SPAN:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        _plain_ticks(ax.yaxis)


def _points(curve: Curve, value: Any) -> list[tuple[float, float, Level]]:
    """(load, figure, level) for each level with the figure, in load order
    (a level measured twice, as a confirmation, keeps its measuring order)."""
    out = []
    for lv in sorted(curve.levels, key=lambda lv: lv.x):
        y = value(lv)
        if y is not None:
            out.append((lv.x, y, lv))
    return out


def _first_looks(pts: list[tuple[float, float, Level]]) -> tuple[list[tuple[float, float, Level]],
                                                                  list[tuple[float, float, Level]]]:
    """(one point per load, the loads measured again): what a line joins,
    in load order, and what is marked beside it. A load's first look is the
    one on the line (a confirmation or a remeasure is its second look)."""
    line: dict[float, tuple[float, float, Level]] = {}
    for p in sorted(pts, key=lambda p: (p[0], bool(second_look(p[2].raw)))):
        line.setdefault(p[0], p)
    kept = {id(p[2]) for p in line.values()}
    return sorted(line.values(), key=lambda p: p[0]), [p for p in pts if id(p[2]) not in kept]


AGAIN_MARKER = "^"  # a load measured again: hollow, beside the line's own marker


def _mark_slo(ax: "Axes", name: str, limit: float) -> "Text":
    """The SLO's limit as a dashed line, labelled on the line at its right end."""
    ax.axhline(limit, color=SLO_COLOUR, ls="--", lw=1.3, zorder=2).set_gid(f"slo-{name}")
    label = ax.text(0.99, limit, f"SLO {name} {limit:g} ms", transform=ax.get_yaxis_transform(), ha="right",
                    va="bottom", fontsize=8, color=SLO_COLOUR, zorder=5,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    label.set_gid(f"label-slo-{name}")
    return label


def _mark_capacity(ax: "Axes", cap: Level | None, gid: str = "capacity-level") -> "Text | None":
    """The capacity's load as a dotted vertical line, labelled at its top."""
    if cap is None:
        return None
    ax.axvline(cap.x, color="#000000", ls=":", lw=1.3, zorder=2).set_gid(gid)
    label = ax.text(cap.x, 0.98, f"capacity {cap.label}", transform=ax.get_xaxis_transform(), ha="left",
                    va="top", fontsize=8, fontweight="bold", zorder=5,
                    bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "none", "alpha": 0.8})
    label.set_gid("label-capacity")
    return label


# -- a run's panels --------------------------------------------------------------------------

def draw_latency(ax: "Axes", curve: Curve, metric: str) -> None:
    """`metric`'s percentile (the SLO's own, else p99) against the load: a
    point per level with its verdict, joined in load order; the SLO limit
    and the capacity drawn and labelled, the capacity's point ringed."""
    name = latency_name(curve, metric)
    pts = _points(curve, lambda lv: lv.latency(name))
    for x, y, lv in pts:
        marker, colour, filled = VERDICT_STYLE.get(lv.verdict, VERDICT_STYLE["undecided"])
        dot = ax.scatter([x], [y], marker=marker, s=55, zorder=3, c=colour if filled else "none",
                         edgecolors=colour, linewidths=1.5)
        dot.set_gid(f"level-{lv.label}-{lv.verdict or 'measured'}")
    joined, _again = _first_looks(pts)  # (the looks again keep their verdict's marker, off the line)
    if len(joined) > 1:
        ax.plot([p[0] for p in joined], [p[1] for p in joined], color="#999999", lw=1, zorder=1)
    limit = curve.limits.get(name)
    if limit is not None:
        _mark_slo(ax, name, limit)
    cap = curve.capacity
    cap_y = cap.latency(name) if cap is not None else None
    if cap is not None and cap_y is not None:
        ring = ax.scatter([cap.x], [cap_y], s=240, facecolors="none", edgecolors="#000000", linewidths=1.8,
                          zorder=4)
        ring.set_gid("capacity")
    _mark_capacity(ax, cap, gid=f"capacity-line-{metric}")
    _load_axis(ax, curve.level_key, [p[0] for p in pts])
    _latency_axis(ax, [p[1] for p in pts] + ([limit] if limit is not None else []), f"{_shown(name)} (ms)")
    ax.set_title(f"{_shown(name)} by load", fontsize=10)
    ax.margins(y=0.14)  # room at the top for the capacity's label above the points
    ax.grid(True, which="major", alpha=0.3)


def draw_throughput(ax: "Axes", curve: Curve) -> None:
    """Output tok/s and goodput (tok/s within the SLO) against the load:
    the knee is where more load stops buying more tokens."""
    out, out_again = _first_looks(_points(curve, lambda lv: lv.output_tps))
    good, good_again = _first_looks(_points(curve, lambda lv: lv.goodput_output_tps))
    if curve.kind == "burst":
        good, good_again = [], []
    if out:
        ax.plot([p[0] for p in out], [p[1] for p in out], color="#4575b4", lw=2, marker="o", ms=4, zorder=2,
                label="output tok/s")[0].set_gid("throughput-output")
    if good:  # drawn over output, thinner: where all is good they coincide
        ax.plot([p[0] for p in good], [p[1] for p in good], color="#1a9850", lw=1.2, ls="--", marker="s", ms=3,
                zorder=3, label="goodput (within SLO)")[0].set_gid("throughput-goodput")
    for again, colour, what in ((out_again, "#4575b4", "output"), (good_again, "#1a9850", "goodput")):
        for x, y, lv in again:
            ax.scatter([x], [y], marker=AGAIN_MARKER, s=45, zorder=4, facecolors="none", edgecolors=colour,
                       linewidths=1.4).set_gid(f"throughput-{what}-again-{lv.label}")
    if out_again or good_again:
        ax.scatter([], [], marker=AGAIN_MARKER, s=45, facecolors="none", edgecolors="#333333",
                   label="load measured again")
    _mark_capacity(ax, curve.capacity, gid="capacity-line-throughput")
    _load_axis(ax, curve.level_key, [p[0] for p in out])
    ax.set_ylabel("tok/s")
    ax.margins(y=0.14)
    ax.set_ylim(bottom=0)
    ax.set_title("throughput by load (the knee)", fontsize=10)
    ax.grid(True, alpha=0.3)
    if out:
        ax.legend(fontsize=7, loc="lower right")


def draw_attainment(ax: "Axes", curve: Curve) -> None:
    """Each level's SLO attainment with its confidence interval."""
    levels = sorted((lv for lv in curve.levels if lv.attainment is not None), key=lambda lv: lv.x)
    for lv in levels:
        marker, colour, filled = VERDICT_STYLE.get(lv.verdict, VERDICT_STYLE["undecided"])
        a = lv.attainment or 0.0
        lo = a - lv.attainment_low if lv.attainment_low is not None else 0.0
        hi = lv.attainment_high - a if lv.attainment_high is not None else 0.0
        bar = ax.errorbar([lv.x], [a * 100], yerr=[[max(lo, 0) * 100], [max(hi, 0) * 100]], fmt=marker,
                          color=colour, mfc=colour if filled else "none", capsize=4, ms=7)
        bar.lines[0].set_gid(f"attainment-{lv.label}")
    _mark_capacity(ax, curve.capacity)
    _load_axis(ax, curve.level_key, [lv.x for lv in levels])
    ax.set_ylabel("SLO attainment (%)")
    if levels:
        low = min(min(lv.attainment or 0.0, lv.attainment_low if lv.attainment_low is not None else 1.0)
                  for lv in levels) * 100
        _percent_axis(ax, low)
    ax.set_title("SLO attainment by load", fontsize=10)
    ax.grid(True, alpha=0.3)
    if not levels:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no SLO attainment:\na burst is measured, not judged", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="#555555")


def _percent_axis(ax: "Axes", low: float) -> None:
    """0-100 % at most: from a little under the lowest figure (0 at least)
    to 100, with a few points of room each side so a mark at 0 or 100 % is
    whole, and no tick beyond 0-100 (an axis to 106 % read as a figure)."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    bottom = max(0.0, low - 0.08 * (100.0 - low))
    pad = 0.035 * (100.0 - bottom) + 0.5
    ax.set_ylim(bottom - pad, 100.0 + pad)
    ticks = [t for t in MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(bottom, 100.0)
             if bottom - 1e-9 <= t <= 100.0 + 1e-9]
    ax.yaxis.set_major_locator(FixedLocator(ticks))


def _verdict_legend(parent: "Figure | SubFigure", curve: Curve) -> None:
    """One legend for the row: what each marker means."""
    from matplotlib.lines import Line2D

    seen = []
    for verdict in ("pass", "fail", "undecided", ""):
        if any(lv.verdict == verdict for lv in curve.levels):
            marker, colour, filled = VERDICT_STYLE[verdict]
            seen.append(Line2D([], [], ls="none", marker=marker, ms=7, color=colour,
                               mfc=colour if filled else "none", label=_verdict_label(verdict)))
    if curve.capacity is not None:
        seen.append(Line2D([], [], ls="none", marker="o", ms=12, mfc="none", mec="#000000",
                           label=f"capacity {curve.capacity.label}"))
    if seen:
        parent.legend(handles=seen, loc="outside right upper", fontsize=8, frameon=False)


def draw_curve_row(parent: "Figure | SubFigure", curve: Curve) -> None:
    """A run's row: its finding as the title, then TTFT, ITL, throughput and attainment by load."""
    axes = parent.subplots(1, 4)
    draw_latency(axes[0], curve, "ttft")
    draw_latency(axes[1], curve, "itl")
    draw_throughput(axes[2], curve)
    draw_attainment(axes[3], curve)
    parent.suptitle(row_title(curve), fontsize=11, fontweight="bold", x=0.01, ha="left")
    _verdict_legend(parent, curve)


def curve_figure(curve: Curve) -> "Figure":
    fig = new_figure(16, 4.0)
    draw_curve_row(fig, curve)
    return finish(fig)


# -- presets side by side ----------------------------------------------------------------------

def _preset_colours(cmp_: Comparison) -> dict[str, str]:
    """A colour per preset, the same in the front and in every trial's curve."""
    return {r.preset: PALETTE[i % len(PALETTE)] for i, r in enumerate(cmp_.rows)}


def draw_front(ax: "Axes", cmp_: Comparison) -> None:
    """Each preset at its capacity: goodput (x) against TTFT p99 (y), the
    min-max of its repeats as error bars, the Pareto front joined and
    starred; presets named in the legend (rank first), never beside points."""
    colours = _preset_colours(cmp_)
    pts = []
    for row in sorted(cmp_.rows, key=lambda r: r.rank or 10**6):
        g, t = row.stats.get("goodput_output_tps"), row.stats.get("ttft_p99_ms")
        if g is None or t is None or g.median is None or t.median is None:
            continue
        on = row.preset in cmp_.front
        xerr = [[g.median - (g.low if g.low is not None else g.median)],
                [(g.high if g.high is not None else g.median) - g.median]]
        yerr = [[t.median - (t.low if t.low is not None else t.median)],
                [(t.high if t.high is not None else t.median) - t.median]]
        label = (f"#{row.rank} " if row.rank else "") + row.preset + (" ★ front" if on else "")
        bar = ax.errorbar([g.median], [t.median], xerr=xerr, yerr=yerr, fmt="*" if on else "o",
                          ms=15 if on else 8, color=colours[row.preset], mec="#000000", capsize=3, label=label)
        bar.lines[0].set_gid(f"{'front' if on else 'preset'}-{row.preset}")
        pts.append((g.median, t.median, on))
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="#fdae61", lw=2, zorder=0,
                label="Pareto front")[0].set_gid("pareto-front")
    ax.set_xlabel("goodput at the SLO (output tok/s; more is better →)")
    ax.set_ylabel("TTFT p99 at capacity (ms; ← less is better)")
    ax.set_title("each preset at its capacity (median, min-max of repeats)", fontsize=10)
    ax.grid(True, alpha=0.3)
    if pts:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    else:
        ax.text(0.5, 0.5, "no preset has goodput and TTFT at a capacity", ha="center", va="center",
                transform=ax.transAxes, fontsize=8)


def draw_scores(ax: "Axes", cmp_: Comparison) -> None:
    """A burst sweep: each preset's score (median, min-max bar), ranked."""
    rows = [r for r in cmp_.rows if r.stats.get(cmp_.score) and r.stats[cmp_.score].median is not None]
    rows.sort(key=lambda r: r.rank or 10**6)
    for i, row in enumerate(rows):
        a = row.stats[cmp_.score]
        med = a.median or 0.0
        ax.barh([i], [med], color="#4575b4", alpha=0.7)
        ax.errorbar([med], [i], xerr=[[med - (a.low if a.low is not None else med)],
                                      [(a.high if a.high is not None else med) - med]],
                    fmt="none", color="#000000", capsize=4)
        ax.annotate(row.vs_best, (med, i), textcoords="offset points", xytext=(8, -3), fontsize=8)
    ax.set_yticks(range(len(rows)), [r.preset for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel({"output_tps": "output tok/s"}.get(cmp_.score, cmp_.score.replace("_", " ")))
    ax.set_title("ranking (median, min-max of repeats)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)


def draw_overlay(ax: "Axes", cmp_: Comparison, curves: list[Curve], metric: str = "ttft") -> None:
    """Every trial's curve on one axes against the load, a colour per preset
    (a dashed line for a later repeat), failed levels crossed, capacities
    ringed, the SLO's line labelled."""
    colours = _preset_colours(cmp_)
    mine = [c for c in curves if c.name in colours]
    limits: dict[str, float] = {}
    values: list[float] = []
    xs: list[float] = []
    seen: dict[str, int] = {}
    for c in mine:
        name = latency_name(c, metric)
        pts = _points(c, lambda lv, name=name: lv.latency(name))
        if not pts:
            continue
        nth = seen[c.name] = seen.get(c.name, -1) + 1
        colour = colours[c.name]
        joined, again = _first_looks(pts)
        line = ax.plot([p[0] for p in joined], [p[1] for p in joined], color=colour, lw=1.3, alpha=0.9,
                       ls="-" if nth == 0 else "--", marker="o", ms=3, label=curve_title(c))[0]
        if again:
            ax.scatter([p[0] for p in again], [p[1] for p in again], marker=AGAIN_MARKER, s=30, facecolors="none",
                       edgecolors=colour, linewidths=1.2, zorder=3)
        line.set_gid(f"overlay-{_slug(curve_title(c))}")
        fails = [(x, y) for x, y, lv in pts if lv.verdict == "fail"]
        if fails:
            ax.scatter([p[0] for p in fails], [p[1] for p in fails], marker="x", color=colour, s=40, zorder=3)
        cap_y = c.capacity.latency(name) if c.capacity is not None else None
        if c.capacity is not None and cap_y is not None:
            ax.scatter([c.capacity.x], [cap_y], s=150, facecolors="none", edgecolors=colour, linewidths=1.5,
                       zorder=4)
        limits.update({k: v for k, v in c.limits.items() if k == name})
        values += [p[1] for p in pts]
        xs += [p[0] for p in pts]
    for slo_name, limit in sorted(limits.items()):
        _mark_slo(ax, slo_name, limit)
    name = next(iter(limits)) if limits else f"{metric}_p99"
    _load_axis(ax, mine[0].level_key if mine else "concurrency", xs)
    _latency_axis(ax, values + list(limits.values()), f"{_shown(name)} (ms)")
    ax.set_title(f"every trial's {_shown(name)} by load (× fail, ○ capacity)", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text)


PAIRS_SHOWN = 6  # a paired sweep's pair verdicts written under its row; the page lists every one


def paired_verdict_lines(paired: dict[str, Any]) -> list[str]:
    """A paired sweep's verdict in a few lines, from its exported dict: the
    ranking from the pairs beyond noise, then each pair's verdict, those
    beyond noise (the ranking's) first."""
    if paired.get("refused"):
        return [f"Not measured side by side ({paired['refused']}): ranked one preset after another"]
    pairs = sorted((p for p in paired.get("pairs") or [] if isinstance(p, dict)),
                   key=lambda p: not p.get("beyond_noise"))
    rounds = max((int(p.get("rounds") or 0) for p in pairs), default=0)
    ranking = (paired.get("ranking") or {}).get("text") if isinstance(paired.get("ranking"), dict) else None
    lines = [f"Paired verdict ({rounds} duel round(s)): "
             + (f"ranking (pairs beyond noise only): {ranking}" if ranking else "no ranking")]
    lines += [f"  {p.get('text') or ''}" for p in pairs[:PAIRS_SHOWN]]
    if len(pairs) > PAIRS_SHOWN:
        lines.append(f"  … and {len(pairs) - PAIRS_SHOWN} more pair(s): the HTML report lists every one")
    return lines


def draw_comparison_row(parent: "Figure | SubFigure", cmp_: Comparison, curves: list[Curve],
                        verdict: bool = True) -> None:
    """The ranking (or the front), and beside it every trial's curve when the
    runs are at hand; under them a paired sweep's verdict (`verdict`: the
    HTML page writes it beside the picture instead)."""
    mine = [c for c in curves if c.name in {r.preset for r in cmp_.rows}]
    axes = parent.subplots(1, 2 if mine else 1, squeeze=False)[0]
    if cmp_.score == "goodput_output_tps":
        draw_front(axes[0], cmp_)
    else:
        draw_scores(axes[0], cmp_)
    if mine:
        draw_overlay(axes[1], cmp_, mine)
    parent.suptitle(cmp_.title, fontsize=11, fontweight="bold", x=0.01, ha="left")
    if verdict and cmp_.paired:
        parent.supxlabel("\n".join(paired_verdict_lines(cmp_.paired)), fontsize=9, x=0.01, ha="left",
                         linespacing=1.4).set_gid("paired-verdict")


def comparison_figure(cmp_: Comparison, curves: list[Curve] | None = None) -> "Figure":
    mine = [c for c in curves or [] if c.name in {r.preset for r in cmp_.rows}]
    fig = new_figure(16 if mine else 9, 4.8)
    draw_comparison_row(fig, cmp_, mine, verdict=False)
    return finish(fig)


def _verdict_height(cmp_: Comparison) -> float:
    """The room a paired verdict's lines take under a comparison's row, in rows."""
    return 0.06 * len(paired_verdict_lines(cmp_.paired)) if cmp_.paired else 0.0


# A section drawn above the comparisons (a tune's): what draws it, and its height in rows.
Leading = tuple[Callable[["SubFigure"], None], float]


def overview_figure(curves: list[Curve], comparisons: list[Comparison], leading: Sequence[Leading] = ()) -> "Figure":
    """Everything on one canvas, for --out FILE.png / FILE.svg: the leading
    sections, then a row per comparison, then a row per run, each row titled
    with what it found."""
    heights = ([h for _, h in leading] + [1.0 + _verdict_height(c) for c in comparisons]
               + [1.0] * len(curves))
    n = len(heights)
    if n == 0:
        raise ReportError("nothing to draw: the runs hold no levels")
    fig = new_figure(16, 4.6 * sum(heights))
    rows = list(fig.subfigures(n, 1, squeeze=False, height_ratios=heights)[:, 0])
    for sub, (draw, _) in zip(rows, leading, strict=False):
        draw(sub)
    rows = rows[len(leading):]
    for sub, cmp_ in zip(rows, comparisons, strict=False):  # the rows: comparisons first, then runs
        draw_comparison_row(sub, cmp_, curves)
    for sub, curve in zip(rows[len(comparisons):], curves, strict=True):
        draw_curve_row(sub, curve)
    return finish(fig)


# -- labels never overlap ------------------------------------------------------------------------

def finish(fig: "Figure") -> "Figure":
    """Lay the figure out, wrap a title too wide for its row, then move the
    labels drawn on the plots (the SLO's, the capacity's) where they would
    cover each other, a legend or a point: the capacity's label flips to the
    left of its line or to the bottom, the SLO's goes to the left end or
    below its line. Where every place covers something, the one covering
    least."""
    fig.canvas.draw()  # the constrained layout places the axes; the labels' boxes are final after it
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas of new_figure
    if _wrap_titles(fig, renderer):
        fig.canvas.draw()  # a wrapped title is taller: lay out again
    for ax in fig.get_axes():
        labels = [t for t in ax.texts if str(t.get_gid() or "").startswith("label-")]
        legend = ax.get_legend()
        placed = [legend.get_window_extent(renderer)] if legend is not None else []
        points = _point_boxes(ax, renderer)
        for text in sorted(labels, key=lambda t: 0 if t.get_gid() == "label-capacity" else 1):
            best: tuple[int, Any] | None = None
            for move in _moves(text):
                move()
                box = text.get_window_extent(renderer)
                cost = 100 * sum(box.overlaps(other) for other in placed) + sum(box.overlaps(p) for p in points)
                cost += 1000 * (not _inside(box, ax, renderer))
                if best is None or cost < best[0]:
                    best = (cost, move)
                if cost == 0:
                    break
            if best is not None:
                best[1]()
            placed.append(text.get_window_extent(renderer))
    return fig


def _figures(fig: "Figure | SubFigure") -> list[Any]:
    return [fig] + [f for sub in fig.subfigs for f in _figures(sub)]


def _wrap_titles(fig: "Figure", renderer: Any) -> bool:
    """Break a (sub)figure's title, or the lines under it, that run past its
    right edge into lines that fit (the tune's title ran off the canvas).
    True when one was wrapped."""
    import textwrap

    wrapped = False
    for f in _figures(fig):
        for text in (getattr(f, "_suptitle", None), getattr(f, "_supxlabel", None)):
            if text is None or not text.get_text():
                continue
            box, room = text.get_window_extent(renderer), f.bbox
            if box.x1 <= room.x1 + 1:
                continue
            # Characters per line, scaled from this text's own width per character.
            lines = text.get_text().split("\n")
            per_char = box.width / max(len(line) for line in lines)
            width = max(20, int((room.x1 - box.x0 - 8) / per_char))
            text.set_text("\n".join(w for line in lines
                                    for w in textwrap.wrap(line, width, subsequent_indent="    ") or [""]))
            wrapped = True
    return wrapped


def _point_boxes(ax: "Axes", renderer: Any) -> list[Any]:
    """The boxes of the marks on the axes, in display units: each scatter
    point, each marker of a line and the capacity's line, so a label is not
    put over them."""
    import numpy as np
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    px = renderer.points_to_pixels(1.0)
    boxes = []
    for coll in ax.collections:
        if not isinstance(coll, PathCollection) or not coll.get_visible():
            continue
        offsets = np.asarray(coll.get_offsets())
        if len(offsets) == 0:
            continue
        sizes = coll.get_sizes()
        xy = coll.get_offset_transform().transform(offsets)
        for i, (x, y) in enumerate(xy):
            r = (float(sizes[i % len(sizes)]) ** 0.5 if len(sizes) else 6.0) * px / 2
            boxes.append(Bbox([[x - r, y - r], [x + r, y + r]]))
    frame = ax.get_window_extent(renderer)
    for line in ax.lines:
        if str(line.get_gid() or "").startswith("capacity-") and line.get_visible():
            # the capacity's dotted line: a label across it reads as struck through
            x = line.get_transform().transform(line.get_xydata())[0][0]
            boxes.append(Bbox([[x - 1, frame.y0], [x + 1, frame.y1]]))
            continue
        if line.get_marker() in (None, "None", "none", "", " ") or not line.get_visible():
            continue
        r = line.get_markersize() * px / 2
        for x, y in line.get_transform().transform(line.get_xydata()):
            boxes.append(Bbox([[x - r, y - r], [x + r, y + r]]))
    return boxes


def _moves(text: "Text") -> list[Any]:
    """Where a label may go, first choice first (each a function that puts it there)."""
    def put(x: float | None = None, ha: str | None = None, va: str | None = None, y: float | None = None) -> Any:
        props = {k: v for k, v in (("x", x), ("y", y), ("horizontalalignment", ha), ("verticalalignment", va))
                 if v is not None}
        return lambda: text.update(props)

    if text.get_gid() == "label-capacity":
        return [put(ha="left", va="top", y=0.98), put(ha="right", va="top", y=0.98),
                put(ha="left", va="bottom", y=0.02), put(ha="right", va="bottom", y=0.02)]
    return [put(0.99, "right", "bottom"), put(0.01, "left", "bottom"), put(0.99, "right", "top"),
            put(0.01, "left", "top"), put(0.5, "center", "bottom"), put(0.5, "center", "top")]


def _inside(box: Any, ax: "Axes", renderer: Any) -> bool:
    frame = ax.get_window_extent(renderer)
    return box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1
