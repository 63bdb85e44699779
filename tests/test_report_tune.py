"""`ernie-tui report` of a tune's run record (issue #46): the answer on top,
every trial in a table, the goodput per trial, the Pareto front and each
parameter's effect, and the capacity curves of the best, BASE and a few
more trials; a trial record not in the store is said, never raised.

The records are built here in the saved shape, with control.tune's own
dataclasses (TuneResult.to_dict(), as `ernie-tui tune` saves it) and
capacity records from tests/report_records.py; no server runs.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

from ernie_tui import paths
from ernie_tui.cli import main
from ernie_tui.engine_ctl.control.tune import TrialRow, TuneResult, Verdict, compare_to_base
from ernie_tui.engine_ctl.load import RunRecord, save_run
from ernie_tui.engine_ctl.report import network_refs
from ernie_tui.engine_ctl.report.tune_inputs import tune_of
from ernie_tui.presets import Preset
from report_records import capacity_like_issue_44

BASE = Preset("seed-A", {"max_num_seqs": 128, "max_num_batched_tokens": 8192, "block_size": 16})
SLO = "ttft_p99=500ms itl_p99=40ms"
GONE = "20260101T000000-capacity-90ne00"
REFUSAL = "preflight: batched_tokens_too_small: max_num_batched_tokens 2048 is below max_model_len 4096"


def _capacity(name: str, ident: str, scale: float = 1.0) -> str:
    """A trial's capacity search saved in the run store (the walkthrough's, renamed); its id."""
    rec = copy.deepcopy(capacity_like_issue_44())
    rec["id"], rec["notes"] = ident, "sweep repeat 0"
    rec["preset"]["name"] = name
    for lv in rec["results"]["levels"] + [rec["results"]["capacity"]]:
        lv["goodput_output_tps"] = (lv.get("goodput_output_tps") or 0.0) * scale
    folder = paths.runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{ident}.json").write_text(json.dumps(rec))
    return ident


def _trial(number: int, params: dict, outcome: str, goodput: float | None = None, reason: str = "",
           ttft: float | None = None, itl: float | None = None, record: str | None = None) -> TrialRow:
    return TrialRow(number, f"seed-A-tune-{number}", params, outcome, goodput, reason,
                    capacity=128.0 if goodput else None, ttft_p99_ms=ttft, itl_p99_ms=itl, record_id=record,
                    seconds=95.0 if outcome in ("measured", "failed") else None)


def _save(result: TuneResult) -> RunRecord:
    return save_run("tune", result.to_dict(), preset=BASE, notes=result.study_name)


def _tune_with_trials() -> RunRecord:
    best_id = _capacity("seed-A-tune-2", "20261206T010200-capacity-be5t02", 1.2)
    base_id = _capacity("seed-A", "20261206T010000-capacity-ba5e00")
    trials = [
        _trial(0, {"max_num_seqs": 128, "max_num_batched_tokens": 4096}, "measured", 1100.0, ttft=380.0, itl=28.0,
               record=_capacity("seed-A-tune-0", "20261206T010100-capacity-0a0a00", 0.9)),
        _trial(1, {"max_num_seqs": 64, "max_num_batched_tokens": 2048}, "refused", reason=REFUSAL),
        _trial(2, {"max_num_seqs": 256, "max_num_batched_tokens": 8192}, "measured", 1500.0, ttft=455.0,
               itl=31.0, record=best_id),
        _trial(3, {"max_num_seqs": 512, "max_num_batched_tokens": 16384}, "failed",
               reason="failed: capacity: the server exited (out of memory)"),
        _trial(4, {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, "measured", 900.0, ttft=210.0, itl=22.0,
               record=GONE),
        _trial(5, {"max_num_seqs": 256, "max_num_batched_tokens": 4096}, "measured", 1200.0, ttft=500.0,
               itl=35.0, record=None),
    ]
    verdict = Verdict("the best carries 15.4 % more (+6.1 to +24.9 %, paired over 3 rounds)", 15.4, 6.1, 24.9, True)
    result = TuneResult(
        study_name="tune-seed-A-0123456789", study_dir="/tmp/study", base="seed-A", slo=SLO,
        space=["max_num_seqs in [64, 128, 256, 512]", "max_num_batched_tokens in [2048 .. 16384] log"],
        settings_in_space=20, trials=trials, best=trials[2], base_goodputs=[1300.0], best_goodputs=[1500.0],
        verdict=verdict, importances={"max_num_seqs": 0.71, "max_num_batched_tokens": 0.29},
        effects={"max_num_seqs": {"64": 900.0, "128": 1100.0, "256": 1350.0, "512": 0.0},
                 "max_num_batched_tokens": {"4096": 1150.0, "8192": 1200.0, "16384": 0.0}},
        refused=[trials[1]], stopped="budget: 5 trials measured", seconds=1234.5, measured_trials=5,
        base_summary={"goodput": 1300.0, "capacity": 128, "ttft_p99_ms": 430.0, "itl_p99_ms": 30.0,
                      "record_id": base_id})
    return _save(result)


def test_a_tunes_report_has_the_answer_the_trials_the_three_figures_and_the_curves(tmp_path):
    rec = _tune_with_trials()
    out = tmp_path / "t.html"
    assert main(["report", rec.id, "--out", str(out)]) == 0
    html = out.read_text()
    # The answer on top: BASE, the SLO, the best setting against BASE's, the verdict, the counts.
    top = html[:html.index('id="tune-0-goodput"')]
    assert "tune of seed-A" in top and SLO in top
    assert "trial 2" in top and "max_num_seqs 128 → 256, max_num_batched_tokens 8192 (as BASE)" in top
    assert "better than BASE" in top and "+6.1 to +24.9 %" in top
    assert "5 measured (1 of them failed), 1 refused by preflight, of 20 settings in the space" in top
    assert "budget: 5 trials measured" in top and "20.6 min" in top
    # Every trial in the table: outcome, goodput, the best marked, preflight's reason, the failure.
    assert "2 ◀ best" in html and "max_num_seqs=64 max_num_batched_tokens=2048" in html
    assert REFUSAL in html and "the server exited (out of memory)" in html
    assert "<td>1,500</td>" in html and "<td>455</td>" in html
    # The three figures, by their ids and what they hold.
    for fig in ("tune-0-goodput", "tune-0-front", "tune-0-effects"):
        assert f'id="{fig}"' in html
    for gid in ("goodput-trial-2", "refused-trial-1", "failed-trial-3", "best-so-far", "base-goodput",
                "pareto-front-ttft", "pareto-front-itl", "front-ttft-2", "front-ttft-4", "trial-ttft-5",
                "base-ttft", "slo-ttft_p99", "effect-max_num_seqs", "effect-max_num_seqs-256"):
        assert f'id="{gid}"' in html, gid
    assert "max_num_seqs (importance 0.71)" in html and "#2" in html
    # The capacity curves: the best's, BASE's and the next best's drawn as runs of the page;
    # a record not in the store, and a trial that kept none, said.
    assert html.count('<h2 id="run-') == 3
    assert "20261206T010200-capacity-be5t02" in html and "tune of seed-A: BASE seed-A" in html
    assert f"trial 4: its capacity record {GONE} is not in the run store: not drawn" in html
    assert "trial 5: no capacity record was kept: not drawn" in html
    assert network_refs(html) == [] and "<script" not in html.lower()


def test_a_tune_with_no_trial_measured_still_writes_its_report(tmp_path):
    trials = [_trial(0, {"max_num_batched_tokens": 1024}, "refused", reason=REFUSAL),
              _trial(1, {"max_num_batched_tokens": 2048}, "refused", reason=REFUSAL.replace("2048", "1024"))]
    result = TuneResult(
        study_name="tune-seed-A-none", study_dir="/tmp/study", base="seed-A", slo="ttft_p99=500ms",
        space=["max_num_batched_tokens in [1024, 2048]"], settings_in_space=2, trials=trials, best=None,
        base_goodputs=[1300.0], best_goodputs=[], verdict=compare_to_base([1300.0], []), importances=None,
        effects={}, refused=trials, stopped="every setting of the space tried", seconds=12.0, measured_trials=0,
        base_summary={"goodput": 1300.0, "record_id": GONE})
    rec = _save(result)
    out = tmp_path / "t.html"
    assert main(["report", rec.id, "--out", str(out)]) == 0
    html = out.read_text()
    assert "No trial was measured" in html and "0 measured (0 of them failed), 2 refused by preflight" in html
    assert "not compared" in html and "no setting was measured" in html
    assert 'id="tune-0-goodput"' in html and 'id="refused-trial-1"' in html
    assert 'id="tune-0-front"' not in html and "no Pareto front and no parameter's effect" in html
    assert REFUSAL in html
    assert f"BASE seed-A: its capacity record {GONE} is not in the run store: not drawn" in html
    assert network_refs(html) == []


def test_a_tunes_picture_has_its_rows_on_one_canvas(tmp_path):
    rec = _tune_with_trials()
    out = tmp_path / "t.svg"
    assert main(["report", rec.id, "--out", str(out)]) == 0
    root = ET.parse(out).getroot()
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    assert {"goodput-trial-2", "best-so-far", "pareto-front-ttft", "effect-max_num_seqs", "capacity"} <= ids
    texts = {"".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert any(t.startswith("tune of seed-A under " + SLO + ": best trial 2") for t in texts), texts


def test_an_older_or_partial_tune_record_is_read_with_defaults():
    rec = RunRecord(id="20250101T000000-tune-abcdef", kind="tune", timestamp="2025-01-01T00:00:00+00:00",
                    created=0.0, results={"base": "b", "slo": "ttft_p90=1s",
                                          "trials": [{"number": 0, "params": {"x": 1}, "outcome": "measured",
                                                      "goodput": "12.5"}, {"params": {}}, "junk"],
                                          "effects": {"x": {"1": 12.5}, "y": "junk"}, "verdict": None})
    tune = tune_of(rec)
    assert tune.base == "b" and tune.limits == {"ttft_p90": 1000.0} and tune.judged() == ["ttft"]
    assert [t.number for t in tune.trials] == [0] and tune.trials[0].goodput == 12.5
    assert tune.best is None and tune.base_run == {} and tune.effects == {"x": {"1": 12.5}}
    assert tune.verdict == {} and tune.base_goodput is None
