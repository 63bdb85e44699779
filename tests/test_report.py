"""`ernie-tui report` and `ernie-tui runs`: reports drawn from saved run records.

The fixture records in tests/fixtures/runs/ are real runs against the paced
stand-in (tests/paced_server.py), made with this code (see
tests/fixtures/runs/README.md): a capacity sweep of two presets (2 and 4
slots) repeated twice (one sweep record, four capacity records), a lone
capacity search, one whose first level failed, and a burst. The pictures are
drawn by matplotlib for real and checked structurally: the SVG keeps its text
and the ids of what matters (levels, SLO lines, capacity, the front).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.report import ReportError, levels_csv, load_report_data, network_refs, report_html
from ernie_tui.engine_ctl.report.build import write_report

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
EXPORT = Path(__file__).resolve().parent / "fixtures" / "runs-sweep-export.json"
SWEEP = "20261201T110044-sweep-8cd620"
LONE = "20261201T110427-capacity-55ef31"
FIRST_FAILED = "20261201T110335-capacity-4cf7a0"
BURST = "20261201T110347-burst-93bcd1"


@pytest.fixture(scope="module")
def sweep_html() -> str:
    """The sweep's page, drawn once for the tests that read it."""
    return report_html(load_report_data([SWEEP], RUNS))


@pytest.fixture
def store(tmp_path) -> Path:
    """A run store holding the fixture records (ERNIE_TUI_HOME is a temp dir already)."""
    from ernie_tui import paths

    folder = paths.runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for p in RUNS.glob("*.json"):
        shutil.copy(p, folder / p.name)
    return folder


def _record(name: str) -> dict:
    return json.loads((RUNS / f"{name}.json").read_text())


def _write(folder: Path, rec: dict) -> Path:
    p = folder / f"{rec['id']}.json"
    p.write_text(json.dumps(rec))
    return p


# -- what is read ------------------------------------------------------------------

def test_a_sweep_brings_its_ranking_front_and_every_trials_curve(store):
    data = load_report_data([SWEEP])
    assert len(data.comparisons) == 1
    cmp_ = data.comparisons[0]
    rows = {r.preset: r for r in cmp_.rows}
    assert rows["slots4"].rank == 1 and rows["slots2"].rank == 2
    assert cmp_.score == "goodput_output_tps"
    # Both are on the front: slots4 has the goodput, slots2 the lower TTFT p99 at its capacity.
    assert cmp_.front == {"slots2", "slots4"}
    # Medians with min-max of the two repeats, from the sweep's own fold.
    assert rows["slots4"].stats["capacity_concurrency"].median == 4
    assert rows["slots4"].stats["goodput_output_tps"].spread > 0
    assert sorted(c.name for c in data.curves) == ["slots2", "slots2", "slots4", "slots4"]
    for c in data.curves:
        assert c.limits == {"ttft_p99": 150.0, "itl_p99": 40.0}
        assert c.capacity is not None and c.capacity.x == (2 if c.name == "slots2" else 4)
        assert any(lv.verdict == "fail" for lv in c.levels)


def test_a_sweep_export_reads_like_the_sweep_record(store):
    a = load_report_data([SWEEP]).comparisons[0]
    b_data = load_report_data([str(EXPORT)])
    b = b_data.comparisons[0]
    assert [(r.preset, r.rank, r.vs_best) for r in a.rows] == [(r.preset, r.rank, r.vs_best) for r in b.rows]
    assert len(b_data.curves) == 4  # found in the run store by the runs' record ids


def test_a_paired_sweeps_verdicts_ranking_and_drift_are_on_the_page(store, tmp_path):
    # The fixture export with a paired sweep's verdicts beside it, as `sweep
    # --capacity` writes them: the stronger preset beyond noise on rounds that
    # drifted together (slots4 over slots2 by 1.9-2.1x while both moved 40 %).
    from ernie_tui.engine_ctl.control import PairedResult
    from ernie_tui.engine_ctl.control import ranking as rk

    values = {"slots2": [100.0, 140.0, 120.0], "slots4": [200.0, 270.0, 250.0]}
    result = PairedResult(presets=["slots2", "slots4"], co_residency="every server up at once")
    result.pairs = rk.compare_all(result.presets, values, metric="output_tps_at_capacity")
    result.ranking = rk.rank(result.presets, result.pairs)
    result.drift = {"own_range_pct": {"slots2": 40.0, "slots4": 35.0},
                    "adjusted_pair_range_pct": {"slots2/slots4": 8.3}}
    raw = json.loads(EXPORT.read_text())
    raw["paired"] = result.to_dict()
    export = tmp_path / "paired.json"
    export.write_text(json.dumps(raw))
    data = load_report_data([str(export)])
    assert data.comparisons[0].paired is not None
    # The table ranks by the pair beyond noise; presets in no pair are not placed.
    ranks = {r.preset: (r.rank, r.vs_best) for r in data.comparisons[0].rows}
    assert ranks["slots4"] == (1, "best") and ranks["slots2"][0] == 2 and ranks["slots2"][1].endswith("vs slots4")
    assert all(rank is None and vs == "within noise" for name, (rank, vs) in ranks.items()
               if name not in ("slots2", "slots4"))
    page = report_html(data)
    assert "Rank and vs best come from the paired duels" in page
    verdict = result.pairs[0]
    assert verdict.better == "slots4"
    assert verdict.text().replace("'", "&#x27;") in page
    assert "Ranking</b> (pairs beyond noise only): slots4 &gt; slots2" in page
    assert "Drift seen" in page and "slots2/slots4 8 %" in page
    # A sweep without verdicts (the sequential mode) shows no pairs section.
    assert "Pairs, measured in the same minutes" not in report_html(load_report_data([str(EXPORT)]))


def test_an_older_sweep_without_record_ids_finds_its_trials_by_time(tmp_path):
    for p in RUNS.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    rec = _record(SWEEP)
    for r in rec["results"]["runs"]:
        r.pop("record_id")
    _write(tmp_path, rec)
    data = load_report_data([SWEEP], tmp_path)
    # the four trials of the sweep, not the lone searches made after it
    assert sorted(c.run_id for c in data.curves) == sorted(r["record_id"] for r in _record(SWEEP)["results"]["runs"])


def test_lone_capacity_searches_are_ranked_with_the_sweeps_noise_rule(tmp_path):
    # Two repeats of slots4 as lone searches, plus the first repeat again
    # under another name: its goodput lies inside slots4's range, so it is
    # "within noise" of the best, as a sweep would say.
    r0, r1 = _record("20261201T105951-capacity-2860ef"), _record("20261201T110022-capacity-fb1c52")
    twin = copy.deepcopy(r0)
    twin["id"], twin["preset"]["name"] = "twin-capacity-000000", "slots4-twin"
    refs = [str(_write(tmp_path, r)) for r in (r0, r1, twin)]
    refs.append(str(RUNS / "20261201T105921-capacity-0b68a5.json"))  # slots2: clearly behind
    data = load_report_data(refs)
    cmp_ = data.comparisons[0]
    rows = {r.preset: r for r in cmp_.rows}
    assert {rows["slots4"].vs_best, rows["slots4-twin"].vs_best} == {"best", "within noise"}
    assert rows["slots2"].vs_best.startswith("-")
    assert "within noise" in report_html(data)


def test_a_burst_sweep_is_ranked_by_output_tps_with_each_burst_a_point():
    data = load_report_data(["20261201T112204-sweep-101453"], RUNS)
    (cmp_,) = data.comparisons
    assert cmp_.score == "output_tps" and cmp_.front == set()
    rows = {r.preset: r for r in cmp_.rows}
    assert rows["slots4"].vs_best == "best" and rows["slots2"].rank == 2 and rows["slots2"].vs_best.endswith("%")
    assert [c.kind for c in data.curves] == ["burst", "burst"]
    html = report_html(data)
    assert 'id="overlay-slots4-r1"' in html and 'id="level-c=4-measured"' in html
    assert "no SLO attainment" in html and "Pareto front" not in html.split("<h2")[1]


def test_rate_keyed_levels_are_read_like_concurrency(tmp_path):
    # The open-loop mode keys each level (and the capacity) by `rate`.
    rec = _record(LONE)
    for lv in rec["results"]["levels"]:
        lv["rate"] = float(lv.pop("concurrency")) * 1.5
    cap = rec["results"]["capacity"]
    cap["rate"] = float(cap.pop("concurrency")) * 1.5
    data = load_report_data([str(_write(tmp_path, rec))])
    curve = data.curves[0]
    assert curve.level_key == "rate" and curve.capacity is not None and curve.capacity.x == 12.0
    html = report_html(data)
    assert "r=12" in html and "request rate" in html
    assert "level_key" in levels_csv(data) and ",rate,12," in levels_csv(data)
    from ernie_tui.engine_ctl.load import load_run
    from ernie_tui.engine_ctl.report import describe, headline

    back = load_run(tmp_path / f"{rec['id']}.json")
    assert headline(back).startswith("capacity r=12.0 under ttft_p99=400ms")
    assert "rate 12.0: undecided" in describe(back)


def test_a_rate_capacity_is_compared_in_req_s_from_a_lone_search_and_from_a_rate_sweep(tmp_path):
    # An open-loop search's capacity is a request rate: the comparison's
    # capacity column says so, and a rate sweep (whose runs carry no
    # concurrency) shows its rates rather than "–".
    recs = []
    for name, k in ((LONE, 1.5), ("20261201T105921-capacity-0b68a5", 2.0)):
        rec = _record(name)
        for lv in rec["results"]["levels"]:
            lv["rate"] = float(lv.pop("concurrency")) * k
        cap = rec["results"]["capacity"]
        cap["rate"] = float(cap.pop("concurrency")) * k
        recs.append(str(_write(tmp_path, rec)))
    data = load_report_data(recs)
    rows = data.comparisons[0].rows
    assert all(r.stats["capacity_rate"].median is not None and r.stats["capacity_concurrency"].median is None
               for r in rows)
    html = report_html(data)
    assert re.search(r"<td>12 req/s</td>", html) and re.search(r"<td>4 req/s</td>", html), html

    sweep = _record(SWEEP)
    for run in sweep["results"]["runs"]:
        run["capacity_rate"], run["capacity_concurrency"] = run["capacity_concurrency"] * 3.0, None
    html = report_html(load_report_data([str(_write(tmp_path, sweep))]))
    assert re.search(r"<td>6 req/s \(6–6\)</td>", html) and re.search(r"<td>12 req/s \(12–12\)</td>", html), html


def test_the_capacity_point_is_its_confirmation_and_a_ceiling_reads_as_a_lower_bound(tmp_path):
    # A confirmed capacity has two passing levels at its load; the report
    # draws and ranks the confirmation, whose figures the capacity reports.
    rec = _record(LONE)
    res = rec["results"]
    confirmation = dict(res["levels"][-1], confirmation=True, goodput_output_tps=201.0, goodput_rps=12.5,
                        ttft_p99_ms=512.0, requests=64)
    res["levels"].append(confirmation)
    res["capacity"].update(goodput_output_tps=201.0, goodput_rps=12.5, ttft_p99_ms=512.0, confirmed=True)
    res["stop_reason"] = "max_concurrency"
    other = RUNS / "20261201T105921-capacity-0b68a5.json"  # a second lone search: the two are ranked
    data = load_report_data([str(_write(tmp_path, rec)), str(other)])
    cap = data.curves[0].capacity
    assert cap is not None and (cap.goodput_output_tps, cap.ttft_p99_ms, cap.requests) == (201.0, 512.0, 64)
    row = next(r for r in data.comparisons[0].rows if r.preset == data.curves[0].name)
    assert row.stats["goodput_output_tps"].median == 201.0
    assert "≥ 8" in report_html(data)  # the search stopped at its ceiling: at least 8


def test_a_capacity_shared_in_a_report_keeps_the_searchs_warnings(tmp_path):
    # A search that says its capacity is not confirmed, or that the server's
    # speed moved under it, must say so in the page it is shared as too.
    rec = _record(LONE)
    said = ["the capacity is not confirmed: the confirmations at 8 failed <after> their levels had passed",
            "the server's speed moved during the search: at concurrency 4 it read 300 output tok/s ..."]
    rec["results"]["warnings"] = said
    data = load_report_data([str(_write(tmp_path, rec))])
    assert data.curves[0].warnings == said
    html = report_html(data)
    assert '<ul class="warnings"><li>warning: the capacity is not confirmed' in html
    assert "failed &lt;after&gt; their levels" in html  # escaped, as every text from a record
    assert "warning: the server&#x27;s speed moved during the search" in html
    quiet = report_html(load_report_data([str(RUNS / f"{LONE}.json")]))
    assert '<ul class="warnings">' not in quiet  # the fixture's search warned of nothing


def test_a_burst_is_one_point_and_a_failed_first_level_no_capacity(store):
    data = load_report_data([BURST, FIRST_FAILED])
    burst, failed = data.curves
    assert burst.kind == "burst" and len(burst.levels) == 1 and burst.levels[0].verdict == ""
    assert burst.levels[0].output_tps and burst.levels[0].ttft_p99_ms
    assert failed.capacity is None and failed.stop == "first_level_failed"
    html = report_html(data)
    assert "no capacity under SLO" in html and "first_level_failed" in html


def test_unknown_runs_and_other_kinds_are_refused(store, tmp_path):
    with pytest.raises(ReportError, match="no run record"):
        load_report_data(["nope"])
    with pytest.raises(ReportError):
        load_report_data([])


# -- what is drawn -------------------------------------------------------------------

def test_html_holds_the_points_slo_lines_capacity_front_and_engine_args(sweep_html):
    html = sweep_html
    assert html.count("<svg") == 5  # the front with every curve, and one row of pictures per trial
    for text in ("c=1", "c=2", "c=4", "c=8"):
        assert text in html  # the levels' labels, as SVG text
    assert 'id="slo-ttft_p99"' in html and 'id="slo-itl_p99"' in html
    assert "SLO ttft_p99 150 ms" in html
    assert 'id="capacity"' in html and "capacity c=4" in html and "capacity c=2" in html
    assert 'id="level-c=4-fail"' in html or 'id="level-c=8-fail"' in html
    assert 'id="front-slots4"' in html and 'id="front-slots2"' in html and "on the front" in html
    assert 'id="attainment-c=1"' in html
    assert 'id="overlay-slots2-r1"' in html and 'id="overlay-slots4-r2"' in html  # every trial on one axes
    # the exact engine arguments, the workload and the SLO of each run
    assert "--block-size 32" in html and "--kv-cache-memory-bytes 64M" in html
    assert "built prompts of 10-40 tokens" in html and "ttft_p99=150ms itl_p99=40ms" in html
    # vLLM's own histogram figures beside ours
    assert "vLLM TTFT p99" in html and "vLLM ITL p99" in html
    assert 'href="data:text/csv;charset=utf-8;base64,' in html


def test_html_opens_with_no_network(sweep_html):
    html = sweep_html + report_html(load_report_data([BURST, LONE], RUNS))
    assert network_refs(html) == []
    assert "<script" not in html.lower() and "@import" not in html
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html)  # url(#clip) inside the SVGs is local
    assert "<link" not in html.lower()
    # the check itself catches what it is for
    assert network_refs('<img src="https://example.com/x.png"><a href=//cdn.example/x>')


def test_html_shows_the_vllm_version_and_platform_the_record_holds(tmp_path, fixtures_dir):
    # A record whose engine report came from a real vLLM log (the GPU box's).
    from ernie_tui.engine_ctl.logs.logparse import parse_file

    report = parse_file(fixtures_dir / "gpu-h200-vllm0.26.0" / "ok_block16_len4096.log").to_dict()
    rec = _record(LONE)
    rec["engine_report"] = report
    html = report_html(load_report_data([str(_write(tmp_path, rec))]))
    assert report["vllm_version"] and f"<code>{report['vllm_version']}</code>" in html
    assert "GPU (CUDA)" in html


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_png_is_drawn_headless(store, tmp_path):
    # In a fresh interpreter with no display: the Agg backend draws it.
    out = tmp_path / "sweep.png"
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    proc = subprocess.run([sys.executable, "-m", "ernie_tui", "report", SWEEP, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    width, height = _png_size(data)
    assert width >= 1000 and height >= 5 * 300  # the front and four trials, one row each
    assert len(data) > 50_000


def test_svg_is_valid_xml_with_its_text(store, tmp_path):
    out = write_report(load_report_data([LONE]), tmp_path / "lone.svg")
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    texts = {"".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {"1", "2", "4", "8", "concurrency"} <= texts  # the load axis: each level where it was measured
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    assert {"level-c=1-undecided", "level-c=8-undecided", "capacity", "slo-ttft_p99"} <= ids
    assert "capacity c=8" in texts and "SLO ttft_p99 400 ms" in texts


def test_csv_has_every_level_with_vllms_figures(store):
    import csv
    import io

    data = load_report_data([SWEEP])
    rows = list(csv.DictReader(io.StringIO(levels_csv(data))))
    assert len(rows) == sum(len(c.levels) for c in data.curves)
    caps = [r for r in rows if r["is_capacity"] == "True"]
    assert sorted((r["preset"], r["level"]) for r in caps) == [("slots2", "2"), ("slots2", "2"),
                                                                ("slots4", "4"), ("slots4", "4")]
    assert all(r["vllm_ttft_p99_ms"] for r in rows)
    assert {r["verdict"] for r in rows} >= {"fail"}


def test_without_matplotlib_the_error_says_how_to_install(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ReportError, match=r"pip install 'ernie-tui\[report\]'"):
        report_html(load_report_data([LONE]))
    assert main(["report", LONE, "--out", "x.html"]) == 1


# -- the command line -----------------------------------------------------------------

def test_cli_runs_list_and_show(store, capsys):
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert SWEEP in out and LONE in out and BURST in out
    assert "capacity c=8 under ttft_p99=400ms itl_p99=40ms" in out
    assert main(["runs", "list", "--kind", "sweep"]) == 0
    out = capsys.readouterr().out
    assert SWEEP in out and LONE not in out and "capacity sweep of slots2 slots4" in out
    assert main(["runs", "show", SWEEP]) == 0
    out = capsys.readouterr().out
    assert "slots4 r1: ok, record 20261201T110022-capacity-fb1c52" in out
    assert main(["runs", "show", LONE]) == 0
    out = capsys.readouterr().out
    assert "concurrency 8: undecided" in out
    assert main(["runs", "show", LONE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == LONE
    assert main(["runs", "show", "nope"]) == 1


def test_cli_runs_list_on_an_empty_store_and_another_folder(capsys):
    assert main(["runs", "list"]) == 0
    assert "no run records" in capsys.readouterr().out
    assert main(["runs", "list", "--kind", "burst", "--runs-dir", str(RUNS)]) == 0
    out = capsys.readouterr().out
    assert BURST in out and SWEEP not in out and "burst N=30 C=3" in out
    assert main(["runs", "show", BURST, "--runs-dir", str(RUNS)]) == 0


def test_cli_report_writes_html_and_csv(store, tmp_path, capsys):
    html, csv_path = tmp_path / "r.html", tmp_path / "r.csv"
    assert main(["report", SWEEP, BURST, "--out", str(html), "--csv", str(csv_path), "--title", "my sweep"]) == 0
    text = html.read_text()
    assert "<title>my sweep</title>" in text and network_refs(text) == []
    assert csv_path.read_text().startswith("run_id,preset,kind")
    assert main(["report", SWEEP, "--out", str(tmp_path / "r.pdf")]) == 1
    assert "must end in .html, .png or .svg" in capsys.readouterr().err
    assert main(["report", SWEEP]) == 1
    assert main(["probe", "--url", "http://127.0.0.1:9", "--burst", "3", "--report", "x.html"]) == 1
    assert "--report belongs to --capacity" in capsys.readouterr().err


def test_cli_probe_capacity_report_draws_the_search_it_just_saved(tmp_path, capsys):
    import subprocess

    here = Path(__file__).resolve().parent
    proc = subprocess.Popen([sys.executable, str(here / "paced_server.py"), "--port", "0", "--slots", "2",
                             "--ttft-ms", "20", "--itl-ms", "10"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening on "), line
        url = line.split()[-1]
        out = tmp_path / "cap.html"
        code = main(["probe", "--url", url, "--capacity", "--slo", "ttft_p90=2s", "--max-tokens", "8",
                     "--min-tokens", "10", "--max-tokens-in", "20", "--max-concurrency", "2", "--level-time", "3",
                     "--report", str(out)])
        assert code == 0, capsys.readouterr().err
    finally:
        proc.terminate()
        proc.wait(10)
    html = out.read_text()
    assert 'id="slo-ttft_p90"' in html and "c=1" in html and "c=2" in html and network_refs(html) == []
    from ernie_tui.engine_ctl.load import list_runs

    (rec,) = list_runs(kind="capacity")
    assert rec.id in html


def test_matplotlib_is_imported_only_when_drawing():
    # `ernie-tui --help`, `runs list` and the dashboard work without the
    # report extra, and pay nothing for it.
    import subprocess

    code = ("import sys, ernie_tui.engine_ctl.report, ernie_tui.cli, ernie_tui.cli.cmd_report, "
            "ernie_tui.cli.cmd_runs; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
