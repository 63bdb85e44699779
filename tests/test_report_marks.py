"""The report's PNGs, round three (issue #59, items 5 and 10), checked on the
figures matplotlib draws (as test_report_figures.py does):

- a line joins one point per load, in load order; a load measured again
  (the walkthrough's confirmation at c=128) is a mark of its own beside it;
- the SLO's label covers no point;
- attainment runs 0-100 % (no tick above 100);
- a tune of one trial has a trial axis of whole trials, and its long title
  is wrapped, not cut;
- a paired sweep's verdict is on the PNG, as it is on the page, and in
  `runs show`.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.control import PairedResult
from ernie_tui.engine_ctl.control import ranking as rk
from ernie_tui.engine_ctl.report import figures as F
from ernie_tui.engine_ctl.report import load_report_data
from ernie_tui.engine_ctl.report import tune_figures as TF
from report_records import FIVE_PRESETS, capacity_like_issue_44, five_preset_sweep
from test_report_figures import _axes_titled, _in_view


@pytest.fixture(scope="module")
def capacity_curve(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capacity")
    rec = capacity_like_issue_44()
    path = folder / f"{rec['id']}.json"
    path.write_text(json.dumps(rec))
    (curve,) = load_report_data([str(path)], folder).curves
    return curve


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def test_lines_join_one_point_per_load_and_a_load_measured_again_is_marked(capacity_curve):
    # The walkthrough measured c=128, then confirmed it: the lines ran
    # 128 -> 128 (a vertical stroke) before going on, a zigzag on the knee.
    assert [lv.x for lv in capacity_curve.levels].count(128) == 2
    fig = F.curve_figure(capacity_curve)
    (tput,) = _axes_titled(fig, "throughput by load (the knee)")
    for gid in ("throughput-output", "throughput-goodput"):
        (line,) = [ln for ln in tput.lines if ln.get_gid() == gid]
        xs = list(line.get_xdata())
        assert xs == sorted(set(xs)), (gid, xs)  # strictly along the load: one point a load
    again = [c for c in tput.collections if str(c.get_gid() or "").startswith("throughput-output-again-")]
    assert [c.get_gid() for c in again] == ["throughput-output-again-c=128"]
    (x, y), = again[0].get_offsets()
    assert x == 128 and y == 1265.0  # the confirmation's own figure, off the line (the first look: 1,270)
    (line,) = [ln for ln in tput.lines if ln.get_gid() == "throughput-output"]
    assert again[0].get_paths()[0] != line.get_marker()  # (a marker of its own)
    assert "load measured again" in [t.get_text() for t in tput.get_legend().get_texts()]
    for title in ("TTFT p99 by load", "ITL p99 by load"):
        (ax,) = _axes_titled(fig, title)
        (joined,) = [ln for ln in ax.lines if ln.get_gid() is None and len(ln.get_xdata()) > 2]
        xs = list(joined.get_xdata())
        assert xs == sorted(set(xs)), (title, xs)


def _point_boxes(ax, renderer):
    """Every scatter point's and line marker's box on the axes (display units)."""
    from matplotlib.transforms import Bbox

    boxes = []
    for coll in ax.collections:
        offsets = coll.get_offsets()
        sizes = coll.get_sizes()
        for i, xy in enumerate(coll.get_offset_transform().transform(offsets)):
            r = (sizes[i % len(sizes)] ** 0.5 if len(sizes) else 6.0) * renderer.points_to_pixels(1.0) / 2
            boxes.append(Bbox([[xy[0] - r, xy[1] - r], [xy[0] + r, xy[1] + r]]))
    for line in ax.lines:
        if line.get_marker() in (None, "None", ""):
            continue
        r = line.get_markersize() * renderer.points_to_pixels(1.0) / 2
        for xy in line.get_transform().transform(line.get_xydata()):
            boxes.append(Bbox([[xy[0] - r, xy[1] - r], [xy[0] + r, xy[1] + r]]))
    return boxes


def test_the_slo_labels_cover_no_point(capacity_curve):
    fig = F.curve_figure(capacity_curve)
    renderer = _drawn(fig)
    checked = 0
    for ax in fig.get_axes():
        for text in ax.texts:
            if not str(text.get_gid() or "").startswith("label-slo-"):
                continue
            box = text.get_window_extent(renderer)
            covered = [p for p in _point_boxes(ax, renderer) if box.overlaps(p)]
            assert not covered, f"{text.get_text()!r} covers {len(covered)} point(s)"
            checked += 1
    assert checked == 2  # TTFT's and ITL's


def test_attainment_runs_from_0_to_100_percent(capacity_curve):
    fig = F.curve_figure(capacity_curve)
    _drawn(fig)
    (ax,) = _axes_titled(fig, "SLO attainment by load")
    low, high = ax.get_ylim()
    assert 100 < high <= 104 and low >= -4, (low, high)  # it ran to 106 %
    ticks = [t for t in ax.get_yticks() if _in_view(t, low, high)]
    assert ticks and max(ticks) == 100 and min(ticks) >= 0, ticks
    # Every mark whole: the lowest interval (the 256 level: 25 %) and 100 % in view.
    assert low < 25 and high > 100


def _one_trial_tune():
    from ernie_tui.engine_ctl.control.tune import TrialRow, TuneResult, compare_to_base
    from ernie_tui.engine_ctl.load import save_run
    from ernie_tui.presets import Preset

    trial = TrialRow(0, "seed-A-tune-0", {"max_num_seqs": 256}, "measured", 1500.0, "", capacity=128.0,
                     ttft_p99_ms=455.0, itl_p99_ms=31.0, seconds=95.0)
    result = TuneResult(
        study_name="tune-seed-A-one", study_dir="/tmp/study", base="seed-A", slo="ttft_p99=500ms itl_p99=40ms",
        space=["max_num_seqs in [64, 128, 256, 512]"], settings_in_space=4, trials=[trial], best=trial,
        base_goodputs=[1300.0], best_goodputs=[1500.0], verdict=compare_to_base([1300.0], [1500.0]),
        importances=None, effects={"max_num_seqs": {"256": 1500.0}}, refused=[], stopped="budget: 1 trial",
        seconds=100.0, measured_trials=1,
        base_summary={"goodput": 1300.0, "capacity": 128, "ttft_p99_ms": 430.0, "itl_p99_ms": 30.0})
    return save_run("tune", result.to_dict(), preset=Preset("seed-A", {"max_num_seqs": 128}),
                    notes=result.study_name)


def test_a_one_trial_tunes_png_has_whole_trials_and_its_whole_title():
    data = load_report_data([_one_trial_tune().id])
    (tune,) = data.tunes
    fig = F.overview_figure(data.curves, data.comparisons, [(partial(TF.draw_tune_rows, tune=tune),
                                                             TF.rows_height(tune))])
    renderer = _drawn(fig)
    (ax,) = _axes_titled(fig, "goodput per trial, the best so far and BASE")
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if _in_view(t, low, high)]
    assert ticks == [0.0], ticks  # it read -0.045 … 0.045
    star = next(c for c in ax.collections if c.get_gid() == "goodput-trial-0")
    assert star.get_offsets()[0][1] < 0.95 * ax.get_ylim()[1]  # the best's star not cut at the top
    title = fig.subfigs[0]._suptitle
    text = title.get_text()
    assert text.startswith("tune of seed-A under ttft_p99=500ms itl_p99=40ms: best trial 0") and "\n" in text
    assert "--confirm N measures both again" in " ".join(text.split())  # all of it, wrapped
    box = title.get_window_extent(renderer)
    assert box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)


def _paired_sweep(folder):
    """The five-preset sweep with a paired sweep's verdicts in its record."""
    path = five_preset_sweep(folder)
    rec = json.loads(path.read_text())
    names = [n for n, *_ in FIVE_PRESETS]
    values = {n: [100.0, 130.0, 115.0] for n in names}
    values["kv-128M"] = [200.0, 270.0, 250.0]  # beyond noise over every other; the rest within it
    result = PairedResult(presets=names, co_residency="every server up at once")
    result.pairs = rk.compare_all(names, values, metric="output_tps_at_capacity")
    result.ranking = rk.rank(names, result.pairs)
    result.drift = {"own_range_pct": {n: 30.0 for n in names}}
    rec["results"]["paired"] = result.to_dict()
    path.write_text(json.dumps(rec))
    return path, rec, result


def test_a_paired_sweeps_png_carries_its_verdict(tmp_path):
    path, _, result = _paired_sweep(tmp_path)
    data = load_report_data([str(path)], tmp_path)
    fig = F.overview_figure(data.curves, data.comparisons)
    renderer = _drawn(fig)
    row = fig.subfigs[0]
    verdict = row._supxlabel
    assert verdict is not None and verdict.get_gid() == "paired-verdict"
    text = verdict.get_text()
    flat = " ".join(text.split())  # (a line too wide for the row is wrapped)
    assert f"ranking (pairs beyond noise only): {result.ranking.text()}" in flat
    wins = [p for p in result.pairs if p.beyond_noise]
    assert wins and all(p.text() in flat for p in wins[:3])
    assert "more pair(s): the HTML report lists every one" in text  # 10 pairs, 6 written
    box = verdict.get_window_extent(renderer)
    assert row.bbox.x0 <= box.x0 and box.x1 <= row.bbox.x1 + 1 and box.y0 >= row.bbox.y0 - 1
    # The PNG's bytes are drawn from this same figure; the SVG keeps the words.
    svg = F.render(F.overview_figure(data.curves, data.comparisons), "svg").decode()
    assert 'id="paired-verdict"' in svg and "Paired verdict (3 duel round(s))" in svg


def test_runs_show_gives_a_paired_sweeps_ranking_and_verdicts(tmp_path, capsys):
    path, rec, result = _paired_sweep(tmp_path)
    assert main(["runs", "show", rec["id"], "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  ranking:  by the pairs beyond noise" in out
    lines = out.splitlines()
    (best,) = [ln for ln in lines if ln.lstrip().startswith("#1 ")]
    assert "kv-128M" in best and best.rstrip().endswith("best")
    for name in ("b32-len2048", "b16-len2048"):
        (line,) = [ln for ln in lines if f" {name} " in ln and "%" in ln and "vs kv-128M" in ln]
        assert line.lstrip().startswith("#2 ")
    for pair in result.pairs:
        assert f"    {pair.text()}" in lines
    assert f"  verdict:  {result.ranking.text()} (pairs beyond noise only)" in lines
    assert "  drift:    each preset's tok/s moved across rounds by b32-len2048 30 %" in out
    assert "  runs:" in lines and any(ln.startswith("    kv-128M r0: ok, record ") for ln in lines)


def test_a_page_of_a_sweep_that_measured_one_preset_claims_no_spread_and_no_noise():
    # (issue #59, 4: the HTML table's notes as the CLI's: one preset measured
    # is compared with nothing; the skipped one reads "not measured (why)")
    from ernie_tui.engine_ctl.control import SweepRun
    from ernie_tui.engine_ctl.report import report_html
    from ernie_tui.engine_ctl.report.inputs import ReportData, comparison_of

    runs = [SweepRun("a", 0, "ok", output_tps=100.0),
            SweepRun("busy", 0, "skipped: port_in_use", message="preflight: port 8000 is already in use")]
    cmp_ = comparison_of(runs, {}, "sweep x")
    page = report_html(ReportData(comparisons=[cmp_]))
    assert "not measured (port_in_use)" in page
    assert "no spread was measured" not in page and "Within noise of the best" not in page
