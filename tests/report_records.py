"""Run records for the report's picture tests, in the saved shape.

Each is made from a real record of tests/fixtures/runs (a capacity search
and a sweep against the paced stand-in) by changing its figures and names,
so every key the report reads is there as the run store writes it:

- capacity_like_issue_44(): the walkthrough's capacity search on vLLM CPU
  (issue #44, 8): passing levels 8-128 under TTFT p99 500 ms, a bracket
  that failed at 256, 192, 160, 144 (two requests, 8,163 ms: the outlier
  that squashed the old linear axis), 136, and the confirmation at 128;
  attainments 62.5 % and 62.0 % at neighbouring loads.
- five_preset_sweep(folder): a capacity sweep of five presets, two repeats
  each: the sweep record and its ten trials' capacity records.

Run as a script, it draws the two PNGs of docs/img from them with the
report's own figures (the capacity run as `ernie-tui report RUN --out
FILE.png` draws it; of the sweep, its comparison row):
    PYTHONPATH=src .venv/bin/python tests/report_records.py docs/img
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"
LONE = "20261201T110427-capacity-55ef31"
SWEEP = "20261201T110044-sweep-8cd620"
TRIAL = "20261201T105951-capacity-2860ef"  # slots4's first repeat: one of the sweep's trials


def _record(name: str) -> dict[str, Any]:
    return json.loads((RUNS / f"{name}.json").read_text())


def _level(template: dict[str, Any], c: int, ttft: float, itl: float, tps: float, att: float, verdict: str,
           requests: int, limits: dict[str, float], confirmation: bool = False) -> dict[str, Any]:
    """A level in the saved shape: the template's keys, these figures."""
    lv = copy.deepcopy(template)
    lo, hi = max(att - 0.06, 0.0), min(att + 0.03, 1.0)
    lv.update(concurrency=c, requests=requests, ok=requests, output_tps=tps, ttft_p99_ms=ttft, itl_p99_ms=itl,
              attainment=att, attainment_low=lo, attainment_high=hi, goodput_output_tps=tps * att,
              goodput_rps=tps * att / 16, passed=verdict == "pass", decided=verdict != "undecided",
              verdict=verdict)
    if confirmation:
        lv["confirmation"] = True
    objectives = []
    for obj in template["objectives"][:2]:
        metric = obj["metric"]
        o = dict(obj, objective=f"{metric}_p99={limits[metric]:g}ms", limit_ms=limits[metric],
                 value_ms=ttft if metric == "ttft" else itl, verdict=verdict, samples=requests)
        objectives.append(o)
    lv["objectives"] = objectives
    lv["vllm"] = dict(template["vllm"], ttft_p99_ms=ttft * 0.97, itl_p99_ms=itl * 1.02)
    return lv


# (concurrency, TTFT p99 ms, ITL p99 ms, output tok/s, attainment, verdict, requests), in search order.
ISSUE_44_LEVELS = [
    (8, 95.0, 14.0, 110.0, 1.0, "pass", 120), (16, 120.0, 15.0, 215.0, 1.0, "pass", 160),
    (32, 160.0, 17.0, 410.0, 0.995, "pass", 220), (64, 240.0, 21.0, 760.0, 0.99, "pass", 300),
    (128, 430.0, 30.0, 1270.0, 0.99, "pass", 400), (256, 2900.0, 44.0, 1330.0, 0.31, "fail", 400),
    (192, 1900.0, 41.0, 1340.0, 0.48, "fail", 400), (160, 1100.0, 36.0, 1320.0, 0.62, "fail", 400),
    (144, 8163.0, 52.0, 46.0, 0.625, "fail", 2), (136, 640.0, 33.0, 1300.0, 0.88, "fail", 400),
]


def capacity_like_issue_44() -> dict[str, Any]:
    rec = _record(LONE)
    res = rec["results"]
    template = res["levels"][0]
    limits = {"ttft": 500.0, "itl": 40.0}
    levels = [_level(template, *row, limits=limits) for row in ISSUE_44_LEVELS]
    levels.append(_level(template, 128, 455.0, 31.0, 1265.0, 0.985, "undecided", 400, limits, confirmation=True))
    res["levels"] = levels
    res["slo"] = ["ttft_p99=500ms", "itl_p99=40ms"]
    cap = levels[4]
    res["capacity"] = {"concurrency": 128, "goodput_rps": cap["goodput_rps"],
                       "goodput_output_tps": cap["goodput_output_tps"], "ttft_p99_ms": 455.0,
                       "itl_p99_ms": 31.0, "attainment": 0.985, "decided": False}
    res["stop_reason"] = "bracketed"
    rec["id"] = "20261205T021500-capacity-4a4a44"
    rec["preset"] = dict(_record(TRIAL)["preset"], name="cpu-demo")
    return rec


# name, goodput scale, TTFT scale (against the trial they are made from)
FIVE_PRESETS = [
    ("b32-len2048", 1.00, 1.00), ("b16-len2048", 0.62, 1.20), ("b64-len4096", 1.06, 1.35),
    ("prefix-cache", 0.97, 1.10), ("kv-128M", 0.55, 0.70),
]


def _trial(template: dict[str, Any], name: str, repeat: int, tps_k: float, ttft_k: float, ident: str) -> dict:
    rec = copy.deepcopy(template)
    rec["id"] = ident
    rec["preset"]["name"] = name
    rec["notes"] = f"sweep repeat {repeat}"  # as a sweep tags its trials
    k_rep = 1.0 + 0.02 * repeat  # the second repeat a little apart, as repeats are
    for lv in rec["results"]["levels"] + [rec["results"]["capacity"]]:
        for key in ("output_tps", "goodput_output_tps", "goodput_rps"):
            if lv.get(key) is not None:
                lv[key] *= tps_k * k_rep
        if lv.get("ttft_p99_ms") is not None:
            lv["ttft_p99_ms"] *= ttft_k / k_rep
        for obj in lv.get("objectives") or []:
            if obj["metric"] == "ttft" and obj.get("value_ms") is not None:
                obj["value_ms"] *= ttft_k / k_rep
    return rec


def five_preset_sweep(folder: Path) -> Path:
    """Write the sweep and its ten trials into `folder` (a run store); the sweep record's path."""
    sweep = _record(SWEEP)
    run_template = sweep["results"]["runs"][1]  # slots4 r1: a capacity trial's row
    template = _record(TRIAL)
    runs = []
    for i, (name, tps_k, ttft_k) in enumerate(FIVE_PRESETS):
        for repeat in (0, 1):
            ident = f"20261205T03{i}{repeat}00-capacity-5p{i}{repeat}000"
            trial = _trial(template, name, repeat, tps_k, ttft_k, ident)
            (folder / f"{ident}.json").write_text(json.dumps(trial))
            cap = trial["results"]["capacity"]
            runs.append(dict(run_template, preset=name, repeat=repeat, record_id=ident,
                             capacity_concurrency=float(cap["concurrency"]),
                             goodput_output_tps=cap["goodput_output_tps"],
                             goodput_rps=cap["goodput_rps"], output_tps=cap["goodput_output_tps"],
                             ttft_p99_ms=cap["ttft_p99_ms"]))
    sweep["results"]["runs"] = runs
    sweep["results"]["meta"]["presets"] = " ".join(p[0] for p in FIVE_PRESETS)
    sweep["id"] = "20261205T040000-sweep-5p5p5p"
    sweep["notes"] = sweep["results"]["meta"]["presets"]
    path = folder / f"{sweep['id']}.json"
    path.write_text(json.dumps(sweep))
    return path


def draw_examples(folder: Path) -> list[Path]:
    """docs/img/report-capacity.png and report-sweep.png, from the records above."""
    import tempfile

    from ernie_tui.engine_ctl.report import figures as F
    from ernie_tui.engine_ctl.report import load_report_data
    from ernie_tui.engine_ctl.report.build import write_report

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        rec = capacity_like_issue_44()
        path = store / f"{rec['id']}.json"
        path.write_text(json.dumps(rec))
        written = [write_report(load_report_data([str(path)], store), folder / "report-capacity.png")]
        # The sweep's own row (the front and every trial's curve): the whole
        # page adds a row per trial, ten here, drawn as the capacity run is.
        data = load_report_data([str(five_preset_sweep(store))], store)
        fig = F.comparison_figure(data.comparisons[0], data.curves)
        target = folder / "report-sweep.png"
        target.write_bytes(F.render(fig, "png"))
        written.append(target)
    return written


if __name__ == "__main__":
    import sys

    for p in draw_examples(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")):
        print(f"wrote {p}")
