"""A tune's pictures, drawn like the rest of the report (figures: the Agg
backend, the same palette, SVG text kept as text, ids on what matters):

- the goodput of each trial in the order run, the best so far as a step
  line and BASE's goodput as a dashed reference (ids goodput-trial-N,
  failed-trial-N, refused-trial-N, best-so-far, base-goodput);
- the Pareto front of the measured trials: goodput against each latency the
  SLO judges, at each trial's capacity, the front joined and labelled with
  its trial numbers, the rest grey (front-<metric>-N, trial-<metric>-N,
  pareto-front-<metric>, base-<metric>);
- each parameter's effect: the median goodput of the trials at each of its
  values, titled with its importance (effect-<param>, effect-<param>-<value>).

matplotlib is imported by figures, only when a picture is drawn.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ernie_tui.engine_ctl.load import pareto_front
from ernie_tui.engine_ctl.report.figures import PALETTE, SLO_COLOUR, _latency_axis, _shown, finish, new_figure
from ernie_tui.engine_ctl.report.tune_inputs import Trial, TuneReport
from ernie_tui.engine_ctl.report.values import num

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

BEST_COLOUR = "#1a9850"
FAIL_COLOUR = "#d73027"
GREY = "#aaaaaa"
FRONT_COLOUR = "#fdae61"
EFFECT_COLUMNS = 4  # parameters side by side before the effects wrap onto a second row


def _is_best(tune: TuneReport, t: Trial) -> bool:
    return tune.best is not None and t.number == tune.best.number


def _empty(ax: "Axes", text: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="#555555")


def _best_so_far(tune: TuneReport) -> tuple[list[int], list[float]]:
    """The best goodput after each measured (or failed: 0) trial, in trial order."""
    xs: list[int] = []
    ys: list[float] = []
    best = 0.0
    for t in tune.trials:
        if t.measured or t.outcome == "failed":
            best = max(best, t.goodput or 0.0)
            xs.append(t.number)
            ys.append(best)
    return xs, ys


def draw_goodput(ax: "Axes", tune: TuneReport) -> None:
    """Each trial's goodput in the order run: the best starred, a failed
    trial crossed at 0, a refused one a grey tick on the axis (no server
    ran); the best so far as a step line, BASE's goodput dashed."""
    from matplotlib.ticker import MaxNLocator

    first: set[str] = set()

    def label(kind: str) -> str:  # one legend entry per kind of mark
        seen = kind in first
        first.add(kind)
        return "_nolegend_" if seen else kind

    for t in tune.trials:
        if t.measured and t.goodput is not None:
            best = _is_best(tune, t)
            dot = ax.scatter([t.number], [t.goodput], marker="*" if best else "o", s=200 if best else 40, zorder=4,
                             c=BEST_COLOUR if best else PALETTE[0], edgecolors="#000000" if best else PALETTE[0],
                             label=f"the best, trial {t.number}" if best else label("measured"))
            dot.set_gid(f"goodput-trial-{t.number}")
        elif t.outcome == "failed":
            ax.scatter([t.number], [0], marker="X", s=60, c=FAIL_COLOUR, zorder=4, clip_on=False,
                       label=label("failed (carries 0)")).set_gid(f"failed-trial-{t.number}")
        elif t.outcome == "refused":
            ax.scatter([t.number], [0], marker="|", s=300, linewidths=2, c=GREY, zorder=3, clip_on=False,
                       label=label("refused by preflight")).set_gid(f"refused-trial-{t.number}")
    xs, ys = _best_so_far(tune)
    if xs:
        ax.step(xs, ys, where="post", color=FRONT_COLOUR, lw=2, zorder=2, label="best so far")[0].set_gid("best-so-far")
    base = tune.base_goodput
    if base is not None:
        ax.axhline(base, color="#000000", ls="--", lw=1.2, zorder=1,
                   label=f"BASE {tune.base}: {base:,.0f} tok/s").set_gid("base-goodput")
    if not tune.trials:
        _empty(ax, "no trial ran")
    else:
        # Half a trial of room each side: one trial alone was drawn on an
        # axis of its own number ±0.055, ticked -0.045 … 0.045.
        numbers = [t.number for t in tune.trials]
        ax.set_xlim(min(numbers) - 0.5, max(numbers) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("trial (in the order run)")
    ax.set_ylabel("goodput at the SLO (output tok/s)")
    # From 0 to a tenth above the highest mark: the best's star keeps its
    # room (a margin of the data's span was 24 tok/s over 1,500: cut).
    marks = [t.goodput for t in tune.trials if t.measured and t.goodput is not None] + (
        [base] if base is not None else [])
    ax.set_ylim(0, 1.12 * max(marks) if marks and max(marks) > 0 else 1.0)
    ax.set_title("goodput per trial, the best so far and BASE", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)


def _front_points(tune: TuneReport, metric: str) -> dict[int, tuple[float, float]]:
    return {t.number: (t.goodput or 0.0, lat) for t in tune.measured if (lat := t.latency(metric)) is not None}


def draw_trial_front(ax: "Axes", tune: TuneReport, metric: str) -> None:
    """The measured trials at their capacities: goodput (x) against `metric`'s
    p99 (y); the front (no trial carries more at a lower latency) joined and
    labelled with trial numbers, the others grey, BASE a black diamond."""
    name = f"{metric}_p99"
    pts = _front_points(tune, metric)
    ax.set_title(f"the Pareto front: goodput against {_shown(name)}", fontsize=10)
    if not pts:
        _empty(ax, f"no measured trial has goodput and {_shown(name)}")
        return
    front = {int(n) for n in pareto_front({str(n): p for n, p in pts.items()})}
    for n, (g, y) in sorted(pts.items()):
        on = n in front
        dot = ax.scatter([g], [y], marker="o", s=60 if on else 30, zorder=3 if on else 2,
                         c=PALETTE[0] if on else GREY, edgecolors="#000000" if on else GREY)
        dot.set_gid(f"{'front' if on else 'trial'}-{metric}-{n}")
        if on:
            ax.annotate(f"#{n}", (g, y), textcoords="offset points", xytext=(5, 5), fontsize=8,
                        fontweight="bold" if tune.best is not None and n == tune.best.number else "normal")
    line = sorted(pts[n] for n in front)
    if line:
        ax.plot([p[0] for p in line], [p[1] for p in line], color=FRONT_COLOUR, lw=2, zorder=1,
                label="Pareto front (trial numbers)")[0].set_gid(f"pareto-front-{metric}")
    if len(pts) > len(front):
        ax.scatter([], [], c=GREY, s=30, label="other trials")
    values = [p[1] for p in pts.values()]
    bg, by = num(tune.base_run.get("goodput")), num(tune.base_run.get(f"{name}_ms"))
    if bg is not None and by is not None:
        ax.scatter([bg], [by], marker="D", s=55, c="#000000", zorder=4, label=f"BASE {tune.base}").set_gid(
            f"base-{metric}")
        values.append(by)
    limit = tune.limits.get(name)
    if limit is not None:
        ax.axhline(limit, color=SLO_COLOUR, ls="--", lw=1.3, label=f"SLO {name} {limit:g} ms").set_gid(f"slo-{name}")
        values.append(limit)
    _latency_axis(ax, values, f"{_shown(name)} at capacity (ms; ← less is better)")
    ax.margins(0.08)  # a trial on the SLO's line, or the best at the right, keeps its mark and label
    ax.set_xlabel("goodput at the SLO (output tok/s; more is better →)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def draw_effect(ax: "Axes", tune: TuneReport, param: str) -> None:
    """One parameter: the median goodput of the measured trials at each of
    its values, the best's value green, BASE's hatched, BASE's goodput dashed."""
    by_value = tune.effects.get(param) or {}
    values = list(by_value)
    best = str(tune.best.params.get(param)) if tune.best is not None else None
    base = str(tune.base_args[param]) if param in tune.base_args else None
    bars = ax.bar(range(len(values)), [by_value[v] for v in values], alpha=0.85,
                  color=[BEST_COLOUR if v == best else PALETTE[0] for v in values])
    ax.bar_label(bars, fmt="{:,.0f}", fontsize=7, padding=2)  # a value whose trials all failed reads 0
    for bar, v in zip(bars, values, strict=True):
        bar.set_gid(f"effect-{param}-{v}")
        if v == base:
            bar.set_hatch("//")
            bar.set_edgecolor("#000000")
    base_goodput = tune.base_goodput
    if base_goodput is not None:
        ax.axhline(base_goodput, color="#000000", ls="--", lw=1)
    ax.set_xticks(range(len(values)), values, rotation=30 if sum(len(v) for v in values) > 24 else 0, fontsize=8)
    imp = tune.importances.get(param)
    ax.set_title(param + (f" (importance {imp:.2f})" if imp is not None else ""), fontsize=10)
    ax.set_ylabel("median goodput (tok/s)", fontsize=8)
    ax.margins(y=0.12)  # (before the bottom is fixed, so the bars' labels keep their room)
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_gid(f"effect-{param}")


def effect_order(tune: TuneReport) -> list[str]:
    """The parameters, most important first (as Optuna ranks them), then the rest as the record lists them."""
    return sorted(tune.effects, key=lambda k: -tune.importances.get(k, -1.0))


def draw_effects(parent: "Figure | SubFigure", tune: TuneReport) -> None:
    """Each parameter's effect, side by side (wrapped after EFFECT_COLUMNS)."""
    params = effect_order(tune)
    if not params:
        _empty(parent.subplots(1, 1), "no parameter's effect: no trial was measured")
        return
    cols = min(len(params), EFFECT_COLUMNS)
    axes = parent.subplots(math.ceil(len(params) / cols), cols, squeeze=False).ravel()
    for ax, param in zip(axes, params, strict=False):
        draw_effect(ax, tune, param)
    for ax in axes[len(params):]:
        ax.set_visible(False)
    parent.suptitle("each parameter's effect (median goodput per value; green: the best's, hatched: BASE's, "
                    "dashed: BASE's goodput)", fontsize=10, x=0.01, ha="left")


def tune_title(tune: TuneReport) -> str:
    """What the tune found, in one line."""
    head = f"tune of {tune.base} under {tune.slo or 'its SLO'}"
    if tune.best is None:
        return f"{head}: no trial measured ({len(tune.with_outcome('refused'))} refused by preflight)"
    g = tune.best.goodput or 0.0
    return f"{head}: best trial {tune.best.number}, {g:,.0f} tok/s; {tune.verdict.get('text') or 'not compared'}"


def goodput_figure(tune: TuneReport) -> "Figure":
    fig = new_figure(11, 4.0)
    draw_goodput(fig.subplots(1, 1), tune)
    return finish(fig)


def front_figure(tune: TuneReport) -> "Figure":
    metrics = tune.judged()
    fig = new_figure(6.5 * len(metrics), 4.6)
    for ax, metric in zip(fig.subplots(1, len(metrics), squeeze=False)[0], metrics, strict=True):
        draw_trial_front(ax, tune, metric)
    return finish(fig)


def effects_figure(tune: TuneReport) -> "Figure":
    n = max(1, len(tune.effects))
    cols = min(n, EFFECT_COLUMNS)
    fig = new_figure(max(4.2 * cols, 8.0), 3.6 * math.ceil(n / cols) + 0.4)
    draw_effects(fig, tune)
    return finish(fig)


def rows_height(tune: TuneReport) -> float:
    """The tune's height on the overview canvas, in the canvas's rows: the
    goodput and the front, then the effects (a second row when they wrap)."""
    return 1.0 + 0.8 * math.ceil(max(1, len(tune.effects)) / EFFECT_COLUMNS)


def draw_tune_rows(parent: "Figure | SubFigure", tune: TuneReport) -> None:
    """A tune on the overview canvas (--out FILE.png / .svg): its finding as
    the title, goodput per trial and the front(s), then the effects."""
    lower = rows_height(tune) - 1.0
    top, bottom = parent.subfigures(2, 1, squeeze=False, height_ratios=[1.0, lower])[:, 0]
    metrics = tune.judged()
    axes = top.subplots(1, 1 + len(metrics), squeeze=False)[0]
    draw_goodput(axes[0], tune)
    for ax, metric in zip(axes[1:], metrics, strict=True):
        draw_trial_front(ax, tune, metric)
    draw_effects(bottom, tune)
    parent.suptitle(tune_title(tune), fontsize=11, fontweight="bold", x=0.01, ha="left")
