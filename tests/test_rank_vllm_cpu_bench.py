"""bench/rank_vllm_cpu.py's pure parts: an A/A run names its two presets
apart and serves them alike, and its tally reads A/A verdicts as right or
false alarms (the sweep itself runs in the bench, not here)."""

from __future__ import annotations

import json
import tomllib

from bench_scripts import load_bench

rank = load_bench("rank_vllm_cpu")


def test_aa_presets_differ_only_in_name_and_port(tmp_path):
    names = rank.write_presets(tmp_path / "p.toml", (16, 16), port=32001)
    assert names == ("seqs16-a", "seqs16-b")  # two equal --seqs once gave one name twice
    tables = tomllib.loads((tmp_path / "p.toml").read_text())["presets"]
    a, b = tables[names[0]], tables[names[1]]
    assert (a.pop("port"), b.pop("port")) == (32001, 32002)
    assert a == b and a["max_num_seqs"] == 16


def test_a_pair_keeps_its_names():
    assert rank.preset_names((2, 16)) == ("seqs2", "seqs16")


def _export(path, pair):
    path.write_text(json.dumps({"paired": {"pairs": [pair], "knees": {"x": {"knees": [8, 9], "uncertain": False}},
                                           "searches": [{"preset": "x", "capacity": 8}]}}))
    return path


def test_tally_reads_aa_within_noise_as_right_and_beyond_as_false_alarm(tmp_path):
    within = rank.verdict_of(_export(tmp_path / "w.json", {
        "better": None, "beyond_noise": False, "gap_pct": [3.0, -10.0, 18.0], "text": "within noise"}))
    held = rank.verdict_of(_export(tmp_path / "h.json", {
        "better": None, "beyond_noise": False, "gap_pct": [9.0, 2.0, 16.0], "held_back": "knee uncertain",
        "text": "within noise / undecided"}))
    alarm = rank.verdict_of(_export(tmp_path / "a.json", {
        "better": "seqs16-b", "beyond_noise": True, "gap_pct": [7.0, 1.0, 13.0], "text": "seqs16-b carries 7 %"}))
    assert within["interval"] == [-10.0, 18.0] and within["knees"] == {"x": [8, 9]}
    runs = [{**v, "wall_s": 100} for v in (within, held, alarm)]
    text = rank.tally(runs, aa=True)
    assert "within noise (right) in 2 of 3 runs (1 of them held back" in text
    assert "false alarms (beyond noise, either way) in 1 (seqs16-b)" in text
    assert rank.tally(runs, aa=False).startswith("named beyond noise: 1 of 3 runs; seqs16-b in 1, the other in 0")
