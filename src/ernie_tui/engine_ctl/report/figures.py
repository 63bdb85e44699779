"""The report's pictures, drawn with matplotlib on its Agg backend (headless,
no display, nothing fetched): PNG or SVG bytes. matplotlib is the optional
`report` extra; without it every function here raises ReportError saying
how to install it.

SVG keeps its text as text (svg.fonttype "none"), so a browser draws it with
a local font and a test can find the labels, and each artist that matters
carries an id (gid): level-<label>-<verdict>, slo-<metric>, capacity,
front-<preset>.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ernie_tui.engine_ctl.report.inputs import Comparison, Curve, Level, ReportError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "the report's pictures need matplotlib: pip install 'ernie-tui[report]'"

VERDICT_STYLE = {  # marker, colour, filled
    "pass": ("o", "#1a9850", True),
    "fail": ("X", "#d73027", True),
    "undecided": ("o", "#777777", False),
    "": ("D", "#4575b4", True),  # a burst: no verdict
}


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError(INSTALL_HINT) from None
    matplotlib.use("Agg", force=True)
    return matplotlib


def new_figure(width: float, height: float) -> "Figure":
    _mpl()
    from matplotlib.figure import Figure

    # Figure() (not pyplot): no global state, no GUI, safe from any thread.
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


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


def draw_latency(ax: "Axes", curve: Curve, metric: str) -> None:
    """Output tok/s (x) against `metric`'s percentile (p99, or the SLO's), a
    point per level with its verdict, the SLO limit as a line, the capacity ringed."""
    name = latency_name(curve, metric)
    shown = name.replace("_", " ").upper().replace(" P", " p")
    seen: set[str] = set()
    for lv in curve.levels:
        x, y = lv.output_tps, lv.latency(name)
        if x is None or y is None:
            continue
        marker, colour, filled = VERDICT_STYLE.get(lv.verdict, VERDICT_STYLE["undecided"])
        label = _verdict_label(lv.verdict)
        pts = ax.scatter([x], [y], marker=marker, s=60, zorder=3,
                         c=colour if filled else "none", edgecolors=colour, linewidths=1.5,
                         label=None if label in seen else label)
        pts.set_gid(f"level-{lv.label}-{lv.verdict or 'measured'}")
        seen.add(label)
        ax.annotate(lv.label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    # Joined in the order of the levels (concurrency or rate), not of throughput.
    pts_line: list[tuple[float, float]] = []
    for lv in sorted(curve.levels, key=lambda lv: lv.x):
        x, y = lv.output_tps, lv.latency(name)
        if x is not None and y is not None:
            pts_line.append((x, y))
    if len(pts_line) > 1:
        ax.plot([p[0] for p in pts_line], [p[1] for p in pts_line], color="#bbbbbb", lw=1, zorder=1)
    for slo_name, limit in sorted(curve.limits.items()):
        if slo_name == name:
            line = ax.axhline(limit, color="#d73027", ls="--", lw=1.2, label=f"SLO {slo_name} {limit:g} ms")
            line.set_gid(f"slo-{slo_name}")
    cap = curve.capacity
    cap_y = cap.latency(name) if cap is not None else None
    if cap is not None and cap.output_tps is not None and cap_y is not None:
        ring = ax.scatter([cap.output_tps], [cap_y], s=260, facecolors="none",
                          edgecolors="#000000", linewidths=1.8, zorder=4, label=f"capacity {cap.label}")
        ring.set_gid("capacity")
    ax.set_xlabel("output tok/s")
    ax.set_ylabel(f"{shown} (ms)")
    ax.set_title(f"{curve_title(curve)}: output tok/s vs {shown}", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def draw_attainment(ax: "Axes", curve: Curve) -> None:
    """Each level's SLO attainment with its confidence interval."""
    levels = [lv for lv in curve.levels if lv.attainment is not None]
    for lv in levels:
        marker, colour, filled = VERDICT_STYLE.get(lv.verdict, VERDICT_STYLE["undecided"])
        a = lv.attainment or 0.0
        lo = a - lv.attainment_low if lv.attainment_low is not None else 0.0
        hi = lv.attainment_high - a if lv.attainment_high is not None else 0.0
        bar = ax.errorbar([lv.x], [a * 100], yerr=[[max(lo, 0) * 100], [max(hi, 0) * 100]], fmt=marker,
                          color=colour, mfc=colour if filled else "none", capsize=4, ms=7)
        bar.lines[0].set_gid(f"attainment-{lv.label}")
        ax.annotate(f"{a * 100:.1f}%", (lv.x, a * 100), textcoords="offset points", xytext=(6, -3), fontsize=7)
    if curve.capacity is not None:
        v = ax.axvline(curve.capacity.x, color="#000000", ls=":", lw=1.2, label=f"capacity {curve.capacity.label}")
        v.set_gid("capacity-level")
        ax.legend(fontsize=7, loc="lower left")
    ax.set_xlabel("concurrency" if curve.level_key == "concurrency" else "request rate (req/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"{curve_title(curve)}: attainment per level", fontsize=10)
    if levels and all(lv.x > 0 for lv in levels) and max(lv.x for lv in levels) / min(lv.x for lv in levels) >= 8:
        ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    if not levels:
        ax.axis("off")
        ax.text(0.5, 0.5, "no SLO attainment:\na burst is measured, not judged", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="#555555")


def draw_front(ax: "Axes", cmp_: Comparison) -> None:
    """Each preset at its capacity: goodput (x) against TTFT p99 (y), the
    min-max of its repeats as error bars, the Pareto front joined and marked."""
    pts = []
    for row in cmp_.rows:
        g, t = row.stats.get("goodput_output_tps"), row.stats.get("ttft_p99_ms")
        if g is None or t is None or g.median is None or t.median is None:
            continue
        on = row.preset in cmp_.front
        xerr = [[g.median - (g.low if g.low is not None else g.median)],
                [(g.high if g.high is not None else g.median) - g.median]]
        yerr = [[t.median - (t.low if t.low is not None else t.median)],
                [(t.high if t.high is not None else t.median) - t.median]]
        bar = ax.errorbar([g.median], [t.median], xerr=xerr, yerr=yerr, fmt="*" if on else "o",
                          ms=13 if on else 7, color="#fdae61" if on else "#4575b4", mec="#000000", capsize=3)
        bar.lines[0].set_gid(f"{'front' if on else 'preset'}-{row.preset}")
        ax.annotate(f"{row.preset}" + (f" (#{row.rank})" if row.rank else ""), (g.median, t.median),
                    textcoords="offset points", xytext=(7, 6), fontsize=8)
        pts.append((g.median, t.median, on))
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    if len(front) > 1:
        line = ax.plot([p[0] for p in front], [p[1] for p in front], color="#fdae61", lw=1.5, zorder=0,
                       label="Pareto front")[0]
        line.set_gid("pareto-front")
        ax.legend(fontsize=7)
    ax.set_xlabel("goodput at the SLO (output tok/s)")
    ax.set_ylabel("TTFT p99 at capacity (ms)")
    ax.set_title(f"{cmp_.title}: presets at their capacity (★ Pareto front)", fontsize=10)
    ax.grid(True, alpha=0.3)
    if not pts:
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
    ax.set_title(f"{cmp_.title}: ranking (median, min-max of repeats)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)


def curve_figure(curve: Curve) -> "Figure":
    fig = new_figure(13, 3.8)
    axes = fig.subplots(1, 3)
    draw_latency(axes[0], curve, "ttft")
    draw_latency(axes[1], curve, "itl")
    draw_attainment(axes[2], curve)
    return fig


def draw_overlay(ax: "Axes", cmp_: Comparison, curves: list[Curve], metric: str = "ttft") -> None:
    """Every trial's curve on one axes, a colour per preset: output tok/s
    against `metric`'s percentile, failed levels crossed, capacities ringed."""
    presets = [r.preset for r in cmp_.rows]
    mine = [c for c in curves if c.name in presets]
    palette = ["#4575b4", "#d73027", "#1a9850", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#666666"]
    limits: dict[str, float] = {}
    for c in mine:
        colour = palette[presets.index(c.name) % len(palette)]
        name = latency_name(c, metric)
        pts: list[tuple[float, float, Level]] = []
        for lv in sorted(c.levels, key=lambda lv: lv.x):
            x, y = lv.output_tps, lv.latency(name)
            if x is not None and y is not None:
                pts.append((x, y, lv))
        if not pts:
            continue
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, lw=1, alpha=0.8,
                       marker="o", ms=4, label=curve_title(c))[0]
        line.set_gid(f"overlay-{_slug(curve_title(c))}")
        fails = [(x, y) for x, y, lv in pts if lv.verdict == "fail"]
        if fails:
            ax.scatter([p[0] for p in fails], [p[1] for p in fails], marker="x", color=colour, s=40, zorder=3)
        cap = c.capacity
        cap_y = cap.latency(name) if cap is not None else None
        if cap is not None and cap.output_tps is not None and cap_y is not None:
            ax.scatter([cap.output_tps], [cap_y], s=160, facecolors="none", edgecolors=colour, linewidths=1.5,
                       zorder=4)
        limits.update({k: v for k, v in c.limits.items() if k == name})
    for slo_name, limit in sorted(limits.items()):
        ax.axhline(limit, color="#d73027", ls="--", lw=1.2, label=f"SLO {slo_name} {limit:g} ms").set_gid(
            f"slo-{slo_name}")
    ax.set_xlabel("output tok/s")
    name = next(iter(limits)) if limits else f"{metric}_p99"
    ax.set_ylabel(f"{name.replace('_', ' ').upper().replace(' P', ' p')} (ms)")
    ax.set_title("every trial's curve (× fail, ○ capacity)", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text)


def comparison_figure(cmp_: Comparison, curves: list[Curve] | None = None) -> "Figure":
    """The ranking (or the front), and beside it every trial's curve when the runs are at hand."""
    mine = [c for c in curves or [] if c.name in {r.preset for r in cmp_.rows}]
    fig = new_figure(13 if mine else 8, 4.5)
    axes = fig.subplots(1, 2 if mine else 1, squeeze=False)[0]
    if cmp_.score == "goodput_output_tps":
        draw_front(axes[0], cmp_)
    else:
        draw_scores(axes[0], cmp_)
    if mine:
        draw_overlay(axes[1], cmp_, mine)
    return fig


def overview_figure(curves: list[Curve], comparisons: list[Comparison]) -> "Figure":
    """Everything on one canvas, for --out FILE.png / FILE.svg: a row per
    comparison, then a row per curve."""
    n = len(comparisons) + len(curves)
    if n == 0:
        raise ReportError("nothing to draw: the runs hold no levels")
    fig = new_figure(15, 4.2 * n)
    grid = fig.add_gridspec(n, 3)
    row = 0
    for cmp_ in comparisons:
        ax = fig.add_subplot(grid[row, 0:2])
        if cmp_.score == "goodput_output_tps":
            draw_front(ax, cmp_)
        else:
            draw_scores(ax, cmp_)
        if any(c.name in {r.preset for r in cmp_.rows} for c in curves):
            draw_overlay(fig.add_subplot(grid[row, 2]), cmp_, curves)
        row += 1
    for curve in curves:
        draw_latency(fig.add_subplot(grid[row, 0]), curve, "ttft")
        draw_latency(fig.add_subplot(grid[row, 1]), curve, "itl")
        draw_attainment(fig.add_subplot(grid[row, 2]), curve)
        row += 1
    return fig

