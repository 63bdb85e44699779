"""Sweep: order, folding repeats, noise marking, exports (pure), and one real
sweep on vLLM CPU with two presets plus one that preflight rejects."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.control.sweep import SweepPlan, SweepRun, fold, to_csv, to_json, to_markdown
from ernie_tui.presets import load_presets
from vllm_support import EAGER_TOML
from worker_ports import own_port


def test_rotated_order():
    book = load_presets()
    plan = SweepPlan([book.get("seed-A"), book.get("seed-B"), book.get("seed-C")], repeat=3)
    names = [p.name for _, p in plan.order()]
    assert names == ["seed-A", "seed-B", "seed-C", "seed-B", "seed-C", "seed-A", "seed-C", "seed-A", "seed-B"]


def runs_fixture():
    return [
        SweepRun("a", 0, "ok", output_tps=100.0, ttft_p50_ms=20.0),
        SweepRun("a", 1, "ok", output_tps=120.0, ttft_p50_ms=22.0),
        SweepRun("b", 0, "ok", output_tps=112.0),
        SweepRun("b", 1, "ok", output_tps=114.0),
        SweepRun("c", 0, "ok", output_tps=50.0),
        SweepRun("c", 1, "ok", output_tps=52.0),
        SweepRun("d", 0, "skipped: block_size_unsupported", message="preflight: block 16 on CPU"),
    ]


def test_fold_median_spread_and_noise():
    rows = fold(runs_fixture(), ["a", "b", "c", "d"])
    a, b, c, d = rows
    assert a.stats["output_tps"].median == 110.0 and a.stats["output_tps"].spread == 20.0
    assert b.vs_best == "best"  # median 113 beats a's 110 ...
    assert a.vs_best == "within noise"  # ... but by less than a's spread
    assert c.vs_best.startswith("-") and c.vs_best.endswith("%")
    assert d.status.startswith("skipped") and d.stats["output_tps"].median is None


def test_a_preset_not_measured_is_not_within_noise():
    # Issue #59, 4: a preset preflight skipped read "within noise" in vs best.
    rows = fold([*runs_fixture(), SweepRun("e", 0, "failed: startup_oom", message="OOM")], list("abcde"))
    d, e = rows[3], rows[4]
    assert (d.vs_best, d.rank) == ("not measured (block_size_unsupported)", None)
    assert (e.vs_best, e.rank) == ("not measured (failed: startup_oom)", None)
    md = to_markdown(rows)
    assert "| not measured (block_size_unsupported) |" in md and "within noise" in md  # (a's, measured)


def paired_runs_and_verdicts():
    cap = dict(mode="capacity")
    runs = [SweepRun("a", 0, "ok", goodput_output_tps=300.0, capacity_concurrency=4.0, **cap),
            SweepRun("b", 0, "ok", goodput_output_tps=200.0, capacity_concurrency=3.0, **cap),
            SweepRun("busy", 0, "skipped: port_in_use", message="preflight: port 8000 is already in use", **cap),
            SweepRun("big", 0, "skipped: insufficient_free_memory", message="preflight: 9 GiB free", **cap)]
    paired = {"pairs": [{"a": "a", "b": "b", "mean": -0.4, "low": -0.5, "high": -0.3, "beyond_noise": True,
                         "better": "a"}]}
    return runs, paired


def test_a_paired_sweeps_skipped_presets_read_not_measured():
    runs, paired = paired_runs_and_verdicts()
    rows = {r.preset: r for r in fold(runs, ["a", "b", "busy", "big"], paired=paired)}
    assert rows["a"].vs_best == "best" and rows["b"].vs_best.startswith("-33 %")
    assert rows["busy"].vs_best == "not measured (port_in_use)"
    assert rows["big"].vs_best == "not measured (insufficient_free_memory)"
    assert rows["busy"].rank is None and rows["big"].rank is None


def test_a_paired_sweeps_preset_with_no_duel_is_not_compared_not_within_noise():
    # A preset whose search found no capacity has no duel: its pairs have no
    # interval ("not enough rounds measured on both to compare").
    runs, paired = paired_runs_and_verdicts()
    paired["pairs"] += [{"a": "a", "b": "c", "mean": None, "low": None, "high": None, "beyond_noise": False,
                         "better": None},
                        {"a": "b", "b": "c", "mean": None, "low": None, "high": None, "beyond_noise": False,
                         "better": None}]
    paired["searches"] = [{"preset": "a", "round": 0, "capacity": 4.0, "duel_load": 4.0},
                          {"preset": "b", "round": 0, "capacity": 3.0, "duel_load": 3.0},
                          {"preset": "c", "round": 0, "capacity": 0.0, "duel_load": None}]
    runs.append(SweepRun("c", 0, "ok", goodput_output_tps=0.0, capacity_concurrency=0.0, mode="capacity"))
    rows = {r.preset: r for r in fold(runs, ["a", "b", "c", "busy", "big"], paired=paired)}
    # The words the sweep screen shows too (it folds its rows here), and the paired sweep's own note's.
    assert rows["c"].vs_best == "not compared (no capacity to duel at)" and rows["c"].rank is None
    assert rows["b"].vs_best.startswith("-33 %")  # (its measured pair still speaks)
    # A load to duel at, but no duel measured (a sweep cancelled after its searches): said so, not the above.
    paired["searches"][2].update(capacity=2.0, duel_load=2.0)
    rows = {r.preset: r for r in fold(runs, ["a", "b", "c"], paired=paired)}
    assert rows["c"].vs_best == "not compared (no duel measured)"


def test_a_table_of_nothing_measured_claims_no_spread_and_says_so():
    skipped = [SweepRun("busy", 0, "skipped: port_in_use", message="preflight: port 8000 in use"),
               SweepRun("big", 0, "skipped: insufficient_free_memory", message="preflight: 9 GiB free")]
    md = to_markdown(fold(skipped, ["busy", "big"]))
    assert "within noise" not in md and "no spread was measured" not in md
    assert "| not measured (port_in_use) |" in md and "| not measured (insufficient_free_memory) |" in md
    assert "Nothing was measured" in md
    # One preset measured beside skipped ones: compared with none, so no note about its spread either.
    one = to_markdown(fold([SweepRun("a", 0, "ok", output_tps=10.0), *skipped], ["a", "busy", "big"]))
    assert "no spread was measured" not in one and "Nothing was measured" not in one
    two = to_markdown(fold([SweepRun("a", 0, "ok", output_tps=10.0), SweepRun("b", 0, "ok", output_tps=9.0)],
                           ["a", "b"]))
    assert "no spread was measured" in two


def test_a_sweep_that_measured_nothing_fails_in_one_line(tmp_path, tiny_model, capsys):
    # `sweep busy --burst 5` with every preset skipped wrote the table, said
    # "One run per preset: no spread was measured" and exited 0.
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    presets = tmp_path / "p.toml"
    presets.write_text(textwrap.dedent(f"""
        [presets.busy]
        extends = "cpu-demo"
        model = "{tiny_model}"
        port = {port}
        [presets.nomodel]
        extends = "cpu-demo"
        model = "{tmp_path / 'no-model-here'}"
        port = {own_port(18124)}
    """))
    out = tmp_path / "sweep.md"
    try:
        code = main(["sweep", "busy", "nomodel", "--presets", str(presets), "--burst", "5", "--out", str(out),
                     "--report", str(tmp_path / "r.html")])
    finally:
        held.close()
    captured = capsys.readouterr()
    assert code == 1
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("ernie-tui: error: nothing was measured, no preset was compared (busy: port_in_use; "
                           f"nomodel: {tmp_path}/no-model-here: no such model directory"), last
    assert last.endswith("); the table says why for each")
    assert "| not measured (port_in_use) |" in captured.out and "no spread" not in captured.out
    assert "| not measured (port_in_use) |" in out.read_text()  # the reasons are kept
    assert not (tmp_path / "r.html").exists()  # nothing to draw


def test_exports_agree():
    rows = fold(runs_fixture(), ["a", "b", "c", "d"])
    md = to_markdown(rows)
    assert sum(line.startswith("| ") for line in md.splitlines()) == 5  # header + 4 rows
    assert "110 (100–120)" in md and "block 16 on CPU" in md
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert table[0]["output_tps"] == "110.0" and table[0]["output_tps_min"] == "100.0"
    data = json.loads(to_json(rows, {"date": "x"}))
    assert [r["preset"] for r in data["rows"]] == ["a", "b", "c", "d"]
    assert len(data["rows"][0]["runs"]) == 2


def test_cli_rejects_bad_out(capsys):
    assert main(["sweep", "cpu-demo", "--out", "table.txt"]) == 1
    assert "--out must end in" in capsys.readouterr().err


@pytest.mark.vllm
def test_real_sweep_a_preset_and_a_rejected_one(tmp_path, tiny_model, capsys):
    # One real start: the sweep's sequencing over several presets is the paced
    # stand-ins' (test_capacity_sweep_on_paced_stand_ins), two real presets in
    # turn the sweep screen's (test_tui_capacity_vllm.py), and a second start
    # here cost a minute of the serial real-vLLM group, CI's critical path.
    presets = tmp_path / "p.toml"
    presets.write_text(textwrap.dedent(f"""
        [presets.cpu-a]
        extends = "cpu-demo"
        model = "{tiny_model}"
        port = {own_port(18120)}
        {EAGER_TOML}
        [presets.cpu-bad]
        extends = "cpu-demo"
        model = "{tiny_model}"
        block_size = 16
        port = {own_port(18122)}
    """))
    out = tmp_path / "sweep.json"
    code = main(["sweep", "cpu-a", "cpu-bad", "--presets", str(presets), "--out", str(out),
                 "--burst", "8", "--concurrency", "2", "--min-tokens", "10", "--max-tokens-in", "40",
                 "--max-tokens", "16", "--log-dir", str(tmp_path / "logs")])
    assert code == 0
    data = json.loads(out.read_text())
    rows = {r["preset"]: r for r in data["rows"]}
    assert list(rows) == ["cpu-a", "cpu-bad"]
    assert rows["cpu-bad"]["status"] == "skipped: block_size_unsupported"
    assert not (tmp_path / "logs" / "cpu-bad-r0.log").exists()  # never launched
    row = rows["cpu-a"]
    assert row["status"] == "ok", row
    assert row["kv_cache_tokens"] == 131072  # read from the real server's log
    assert row["stats"]["output_tps"]["median"] > 0
    assert row["stats"]["ttft_p50_ms"]["median"] > 0
    assert row["runs"][0]["requests"] == 8 and row["runs"][0]["errors"] == 0
    assert row["stats"]["peak_memory_gib"]["median"] > 0  # engine RSS on CPU
    md = capsys.readouterr().out
    assert "| cpu-a |" in md and "| cpu-bad |" in md


def test_cli_global_presets_and_model_reach_sweep(tmp_path, capsys):
    """`ernie-tui --presets F --model D sweep NAME`: the global options count, as for check and presets."""
    presets = tmp_path / "p.toml"
    presets.write_text(textwrap.dedent("""
        [presets.only-in-this-file]
        extends = "cpu-demo"
        model = ""
        block_size = 16
    """))
    missing_model = tmp_path / "no-model-here"
    out = tmp_path / "sweep.json"
    code = main(["--presets", str(presets), "--model", str(missing_model), "sweep", "only-in-this-file",
                 "--out", str(out), "--log-dir", str(tmp_path / "logs")])
    assert code == 1, capsys.readouterr().err  # nothing was measured (test_a_sweep_that_measured_nothing_...)
    row = json.loads(out.read_text())["rows"][0]
    # Preflight judged the preset from the global file against the global model dir; nothing launched.
    assert row["preset"] == "only-in-this-file" and row["status"].startswith("skipped")
    assert row["message"].startswith(f"preflight: {missing_model}: no such model directory")
    assert not (tmp_path / "logs" / "only-in-this-file-r0.log").exists()


def capacity_runs():
    cap = dict(mode="capacity")
    return [
        SweepRun("a", 0, "ok", goodput_output_tps=300.0, capacity_concurrency=4.0, goodput_rps=20.0, **cap),
        SweepRun("a", 1, "ok", goodput_output_tps=340.0, capacity_concurrency=5.0, goodput_rps=22.0, **cap),
        SweepRun("b", 0, "ok", goodput_output_tps=330.0, capacity_concurrency=4.0, goodput_rps=21.0,
                 output_tps=900.0, **cap),
        SweepRun("b", 1, "ok", goodput_output_tps=332.0, capacity_concurrency=4.0, goodput_rps=21.0,
                 output_tps=900.0, **cap),
        SweepRun("c", 0, "ok", goodput_output_tps=0.0, capacity_concurrency=0.0, goodput_rps=0.0, **cap),
        SweepRun("c", 1, "ok", goodput_output_tps=0.0, capacity_concurrency=0.0, goodput_rps=0.0, **cap),
    ]


def test_capacity_sweep_ranks_by_goodput_not_raw_throughput():
    rows = fold(capacity_runs(), ["a", "b", "c"])
    a, b, c = rows
    # Ranked by the goodput median (b 331, a 320, c 0), not by raw output tok/s.
    assert b.rank == 1 and b.vs_best == "best"
    assert a.rank == 2 and a.vs_best == "within noise"  # 320 vs 331, inside a's 300-340 spread
    assert c.rank == 3 and c.vs_best == "-100.0%"
    md = to_markdown(rows)
    assert "goodput tok/s" in md and "capacity (conc.)" in md and "output tok/s" not in md
    assert "| a |" in md and "4.5 (4–5)" in md
    table = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert table[1]["goodput_output_tps"] == "331.0" and table[1]["rank"] == "1"


def test_a_capacity_at_the_searchs_ceiling_reads_as_a_lower_bound():
    # On an H200 the default --max-concurrency 256 ended long-doc's search
    # with every level passing; its row read "256" like a found capacity.
    runs = capacity_runs()
    runs[2].capacity_stop = runs[3].capacity_stop = "bracketed"
    runs[0].capacity_stop, runs[1].capacity_stop = "bracketed", "max_concurrency"
    rows = fold(runs, ["a", "b", "c"])
    md = to_markdown(rows)
    assert "| ≥ 4.5 (4–5) |" in md and "| 4 (4–4) |" in md
    assert "- **a**: ≥: a search reached its highest load allowed" in md and "- **b**" not in md
    from ernie_tui.engine_ctl.report.build import _agg_text

    assert _agg_text(rows[0], "capacity_concurrency") == "≥ 4.5 (4–5)"
    assert _agg_text(rows[1], "capacity_concurrency") == "4 (4–4)"


def test_a_preset_whose_server_moved_during_its_searches_says_so_under_the_table():
    from ernie_tui.engine_ctl.control.sweep import fill_capacity_columns
    from ernie_tui.engine_ctl.load import capacity as C
    from test_capacity import RULES, SLO, SimServer

    steady = C.search(SimServer(12).runner(SLO, RULES), SLO, C.SearchConfig(confirm_waves=8))
    moved = C.search(SimServer(12).runner(SLO, RULES), SLO, C.SearchConfig(confirm_waves=8))
    moved.speed_moved = {"load": 12.0, "figure": "output_tps", "first": 1000.0, "later": 760.0,
                         "change": -0.24, "levels": [3, 7]}
    runs = []
    for i, res in enumerate((steady, moved, steady)):
        runs.append(SweepRun("a" if i < 2 else "b", i, "ok", mode="capacity"))
        fill_capacity_columns(runs[-1], res)
    assert [r.speed_moved_pct for r in runs] == [None, -24.0, None]
    md = to_markdown(fold(runs, ["a", "b"]))
    assert ("- **a**: the server's speed moved during 1 of its 2 searches (up to -24 % between two looks at one "
            "load)") in md
    assert "- **b**: the server's speed moved" not in md


def test_a_sweeps_row_carries_the_confirmations_figures_as_the_capacity_does():
    # The first, short level at the capacity's load and its confirmation
    # read different figures; the row must carry the ones the search reports.
    from ernie_tui.engine_ctl.control.sweep import fill_capacity_columns
    from ernie_tui.engine_ctl.load import capacity as C
    from test_capacity import RULES, SLO, SimServer

    res = C.search(SimServer(12).runner(SLO, RULES), SLO, C.SearchConfig(confirm_waves=8))
    cap = res.capacity
    assert cap is not None and cap["confirmed"]
    assert res.level(res.capacity_load).goodput_output_tps != pytest.approx(cap["goodput_output_tps"])
    run = SweepRun("a", 0, "ok", mode="capacity")
    fill_capacity_columns(run, res)
    assert run.capacity_concurrency == cap["concurrency"] and run.capacity_stop == "bracketed"
    assert (run.goodput_output_tps, run.goodput_rps, run.ttft_p99_ms, run.itl_p99_ms) == (
        cap["goodput_output_tps"], cap["goodput_rps"], cap["ttft_p99_ms"], cap["itl_p99_ms"])
    assert run.levels == len(res.levels) and run.requests == sum(lv.requests for lv in res.levels)


def test_capacity_sweep_on_paced_stand_ins(tmp_path, tiny_model, capsys):
    # Two "servers" launched as presets through the sweep's own process
    # control: the paced stand-in with 2 and with 4 slots. Under the same SLO
    # the one with more slots has the higher capacity and goodput. The old
    # sequential mode (--sequential; the paired default: test_paired_sweep.py).
    import sys
    from pathlib import Path

    paced = Path(__file__).resolve().parent / "paced_server.py"
    presets = tmp_path / "p.toml"
    body = ""
    for name, slots, port in (("slots2", 2, own_port(18131)), ("slots4", 4, own_port(18132))):
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{tiny_model}"
            port = {port}
            launcher = ["{sys.executable}", "{paced}"]
            env = {{ PACED_SLOTS = "{slots}", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
        """)
    presets.write_text(body)
    out = tmp_path / "sweep.json"
    code = main(["sweep", "slots2", "slots4", "--presets", str(presets), "--out", str(out), "--capacity",
                 "--sequential", "--slo", "ttft_p90=100ms", "--max-tokens", "16", "--min-tokens", "10",
                 "--max-tokens-in", "40",
                 "--start-concurrency", "2", "--ready-timeout", "30", "--report", str(tmp_path / "sweep.html")])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    rows = {r["preset"]: r for r in data["rows"]}
    # (one over its slots a stand-in sits on the 100 ms objective's edge: see
    # test_tui_probe's capacity sweep; a full CI run once passed 5 on 4 slots there)
    assert rows["slots2"]["stats"]["capacity_concurrency"]["median"] in (2, 3)
    assert rows["slots4"]["stats"]["capacity_concurrency"]["median"] in (4, 5)
    assert rows["slots4"]["rank"] == 1 and rows["slots2"]["rank"] == 2
    g2 = rows["slots2"]["stats"]["goodput_output_tps"]["median"]
    g4 = rows["slots4"]["stats"]["goodput_output_tps"]["median"]
    assert 1.6 < g4 / g2 < 2.4
    assert "ttft_p90=100ms" in data["meta"]["capacity"]
    import os

    # A sequential sweep generates its load in this process, as it always did.
    assert {r["runs"][0]["load_pid"] for r in data["rows"]} == {os.getpid()}
    from ernie_tui.engine_ctl.load import runstore

    assert len(runstore.list_runs(kind="capacity")) == 2
    # Each run names its trial's record, and --report drew the sweep from them:
    # the ranking with the front, and each preset's curve with its SLO line.
    assert {r["runs"][0]["record_id"] for r in data["rows"]} == {r.id for r in runstore.list_runs(kind="capacity")}
    html = (tmp_path / "sweep.html").read_text()
    assert 'id="front-slots4"' in html and 'id="slo-ttft_p90"' in html  # the SLO's own percentile is drawn
    assert html.count("<svg") == 3 and "capacity c=4" in html and "capacity c=2" in html


def test_sweep_meta_is_one_dict_for_the_cli_and_the_screen():
    from ernie_tui.engine_ctl.control.sweep import CapacitySweep, sweep_meta
    from ernie_tui.engine_ctl.load.burst import BurstConfig
    from ernie_tui.engine_ctl.load.slo import parse_slo

    cfg = BurstConfig(n=50, concurrency=8, min_tokens=10, max_tokens_in=40, max_tokens=16)
    runs = [SweepRun("a", 0, "ok", vllm_version="0.32.0", platform="cpu"), SweepRun("b", 0, "ok")]
    burst = sweep_meta(["a", "b"], 2, cfg, runs)
    assert burst["presets"] == "a b" and burst["repeat"] == 2 and burst["vllm"] == "0.32.0 (cpu)"
    assert burst["burst"] == "N=50, C=8, prompts 10-40 tokens, max_tokens 16, ignore_eos"
    assert "seconds" not in burst and "capacity" not in burst
    cap = sweep_meta(["a"], 1, cfg, [], capacity=CapacitySweep(slo=parse_slo(["ttft_p99=500ms"])),
                     workload="w.jsonl", seconds=12.34)
    assert cap["capacity"] == "SLO ttft_p99=500ms, workload w.jsonl, max_tokens 16, ranked by goodput tok/s at the SLO"
    assert cap["seconds"] == 12.3 and cap["vllm"] == "-" and "burst" not in cap


def test_sigterm_ends_a_capacity_sweep_stopping_its_server_and_keeping_what_it_measured(tmp_path, tiny_model):
    # A sweep ended by SIGTERM (`timeout`, a job runner) died at once and left
    # its server running in a session of its own, which nothing then stopped.
    # Now it ends as Ctrl-C does: the server stopped, the searches so far saved.
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    paced = Path(__file__).resolve().parent / "paced_server.py"
    port = own_port(18137)
    (tmp_path / "p.toml").write_text(textwrap.dedent(f"""
        [presets.slow]
        extends = "cpu-demo"
        model = "{tiny_model}"
        port = {port}
        launcher = ["{sys.executable}", "{paced}"]
        env = {{ PACED_SLOTS = "2", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
    """))
    out = tmp_path / "sweep.json"
    proc = subprocess.Popen([sys.executable, "-m", "ernie_tui", "sweep", "slow", "--presets", str(tmp_path / "p.toml"),
                             "--out", str(out), "--capacity", "--slo", "ttft_p90=2s", "--max-tokens", "16",
                             "--min-tokens", "10", "--max-tokens-in", "40", "--start-concurrency", "1",
                             "--ready-timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:  # a level measured: the server is up and loaded
            seen.append(line)
            if "capacity: concurrency 1 pass" in line:
                break
        assert "capacity: concurrency 1 pass" in "".join(seen), seen
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, err
        assert "ended by SIGTERM: stopping the server, keeping the rows measured" in err
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the preset's server still listens on {port}")
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_left_running(paced.name, port)  # after the checks: a failed run leaves nothing behind
    from ernie_tui.engine_ctl.load import runstore

    (sweep,) = runstore.list_runs(kind="sweep")
    (run,) = sweep.results["runs"]
    assert run["preset"] == "slow" and run["status"] == "cancelled" and run["capacity_stop"] == "cancelled"
    assert run["levels"] >= 1 and runstore.load_run(run["record_id"]).kind == "capacity"
    assert "wrote " + str(out) in err and json.loads(out.read_text())["rows"][0]["preset"] == "slow"

def _kill_left_running(script: str, port: int) -> list[int]:
    """Kill a stand-in server a failed sweep left running; the pids killed."""
    import psutil

    killed = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(c.endswith(script) for c in cmd) and str(port) in cmd:
            p.kill()
            killed.append(p.pid)
    return killed
