"""The report's pictures read at a glance (issue #44, 8).

The walkthrough's capacity chart ran its linear TTFT axis to 8,000 ms (the
passing levels and the 500 ms SLO line in its bottom 6 %), its labels
c=128/c=136/c=160 and "62.5%"/"62.0%" overlapped, a line zigzagged in
measurement order and titles were cut. Checked here on figures drawn for
real by matplotlib from records in the saved shape (tests/report_records.py):
the walkthrough's capacity search and a five-preset sweep. Every text's box
comes from matplotlib's renderer after the figure is laid out.
"""

from __future__ import annotations

import itertools
import json

import pytest

from ernie_tui.engine_ctl.report import figures as F
from ernie_tui.engine_ctl.report import load_report_data
from report_records import FIVE_PRESETS, capacity_like_issue_44, five_preset_sweep


@pytest.fixture(scope="module")
def capacity_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capacity")
    rec = capacity_like_issue_44()
    path = folder / f"{rec['id']}.json"
    path.write_text(json.dumps(rec))
    return load_report_data([str(path)], folder)


@pytest.fixture(scope="module")
def sweep_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    return load_report_data([str(five_preset_sweep(folder))], folder)


def _in_view(value: float, lo: float, hi: float) -> bool:
    lo, hi = min(lo, hi), max(lo, hi)
    return lo - 1e-9 * abs(hi) <= value <= hi + 1e-9 * abs(hi)


def _texts(fig) -> list:
    """Every piece of text the figure shows: titles, axis labels, the tick
    labels in view, legends, and what is written on the plots."""
    out = []

    def figure_texts(f) -> None:
        if getattr(f, "_suptitle", None) is not None:
            out.append(f._suptitle)
        for legend in f.legends:
            out.extend(legend.get_texts())
        for sub in f.subfigs:
            figure_texts(sub)

    figure_texts(fig)
    for ax in fig.get_axes():
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for ticks, labels, lim in ((ax.get_xticks(), ax.get_xticklabels(), ax.get_xlim()),
                                   (ax.get_yticks(), ax.get_yticklabels(), ax.get_ylim())):
            out += [t for v, t in zip(ticks, labels, strict=True) if _in_view(v, *lim)]
        if ax.get_legend() is not None:
            out.extend(ax.get_legend().get_texts())
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def assert_reads_at_a_glance(fig) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)  # the renderer that measures the texts
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer).expanded(1.0, 1.0)) for t in _texts(fig)]
    for text, box in boxes:  # nothing cut at the figure's edge
        assert box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1 and box.y0 >= frame.y0 - 1 \
            and box.y1 <= frame.y1 + 1, f"{text!r} is cut: {box} outside {frame}"
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        shrunk_a = box_a.padded(-0.5)  # boxes that only touch do not overlap
        assert not shrunk_a.overlaps(box_b.padded(-0.5)), f"{a!r} overlaps {b!r}"


def _axes_titled(fig, title: str) -> list:
    return [ax for ax in fig.get_axes() if ax.get_title() == title]


def _slo_line_height(ax, limit: float) -> float:
    """Where the SLO's line sits on the axes, 0 (bottom) to 1 (top)."""
    return float(ax.transAxes.inverted().transform(ax.transData.transform((1.0, limit)))[1])


def test_a_capacity_run_shows_its_capacity_slo_and_knee(capacity_data):
    (curve,) = capacity_data.curves
    for fig in (F.curve_figure(curve), F.overview_figure(capacity_data.curves, capacity_data.comparisons)):
        assert_reads_at_a_glance(fig)
        texts = [t.get_text() for t in _texts(fig)]
        assert any(t.startswith("cpu-demo: capacity c=128") and "TTFT p99 ≤ 500 ms" in t for t in texts), texts
        assert texts.count("capacity c=128") >= 3 and "SLO ttft_p99 500 ms" in texts
        (ttft,) = _axes_titled(fig, "TTFT p99 by load")
        assert any(line.get_gid() == "slo-ttft_p99" for line in ttft.lines)
        assert any(line.get_gid() == "capacity-line-ttft" for line in ttft.lines)
        # The SLO line and the passing levels have room, beside the 8,163 ms level.
        assert ttft.get_ylim()[1] > 8163
        assert 0.3 < _slo_line_height(ttft, 500.0) < 0.8
        passing = [lv.ttft_p99_ms for lv in curve.levels if lv.verdict == "pass"]
        spread = _slo_line_height(ttft, max(passing)) - _slo_line_height(ttft, min(passing))
        assert spread > 0.2, "the passing levels are squashed together"  # the linear axis gave them 0.04
        # Joined in load order: the line never walks back along the load axis.
        (joined,) = [line for line in ttft.lines if line.get_gid() is None and len(line.get_xdata()) > 2]
        xs = list(joined.get_xdata())
        assert xs == sorted(xs)


def test_a_five_preset_sweep_names_each_preset_once_and_marks_the_slo(sweep_data):
    (cmp_,) = sweep_data.comparisons
    assert len(cmp_.rows) == 5 and len(sweep_data.curves) == 10
    overview = F.overview_figure(sweep_data.curves, sweep_data.comparisons)
    for fig in (F.comparison_figure(cmp_, sweep_data.curves), overview):
        assert_reads_at_a_glance(fig)
        texts = [t.get_text() for t in _texts(fig)]
        for name, *_ in FIVE_PRESETS:
            assert sum(1 for t in texts if t.startswith("#") and f" {name}" in t) == 1, (name, texts)
        assert any("★ front" in t for t in texts)
        (overlay,) = _axes_titled(fig, "every trial's TTFT p99 by load (× fail, ○ capacity)")
        assert any(line.get_gid() == "slo-ttft_p99" for line in overlay.lines)
        assert "SLO ttft_p99 150 ms" in [t.get_text() for t in overlay.texts]
    titles = [sub._suptitle.get_text() for sub in overview.subfigs[1:]]  # a row per trial, each titled
    assert len(titles) == 10 and all(": capacity c=4 (goodput " in t for t in titles), titles
