"""`sweep --capacity`'s paired default, end to end on two drifting stand-ins
(tests/paced_server.py) whose capacities differ threefold: the pair's verdict
names the stronger one and every export carries the pair. No timing asserted."""

from __future__ import annotations

import csv
import json

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.control.paired_sweep import (
    DUEL_LEVEL_S,
    DuelLevel,
    adjust,
    duel_order,
    duel_seconds,
    knees_from,
    search_around,
)
from ernie_tui.engine_ctl.load import CapacityResult, LevelResult, SearchConfig
from paced_presets import paced_preset
from worker_ports import own_port


def test_duel_order_rotates_the_reference():
    assert duel_order(["A", "B"], 1) == ["A", "B", "A"]
    assert duel_order(["A", "B"], 2) == ["B", "A", "B"]
    assert duel_order(["A", "B", "C"], 3) == ["C", "A", "B", "C"]


def test_adjust_divides_out_a_linear_drift():
    # The host speeds up linearly from 100 to 140 % over the round: A's two
    # looks read 100 and 140 tok/s; B, twice A at every moment, read 240 at
    # the middle. Adjusted, B is 2.0 of A and A is 1.0 of itself.
    levels = [DuelLevel("A", 1, 8, at=0.0, seconds=5, output_tps=100.0, reference=True),
              DuelLevel("B", 1, 16, at=5.0, seconds=5, output_tps=240.0),
              DuelLevel("A", 1, 8, at=10.0, seconds=5, output_tps=140.0, reference=True)]
    assert adjust(levels)
    assert [round(d.adjusted, 3) for d in levels] == [1.0, round(240 / (100 * 1.4 ** 0.5), 3), 1.0]
    # a reference look without a figure: nothing adjusted
    levels[2].output_tps = None
    for d in levels:
        d.adjusted = None
    assert not adjust(levels) and all(d.adjusted is None for d in levels)


def _search(*levels: LevelResult) -> CapacityResult:
    return CapacityResult([], None, list(levels), stop_reason="bracketed", stop_message="", seconds=1.0)


def _level(concurrency: int, passed: bool, warmup_s: float | None, e2e_ms: list[float] | None) -> LevelResult:
    return LevelResult(concurrency=concurrency, requests=100, ok=100, seconds=10.0, passed=passed, decided=True,
                       warmup_s=warmup_s, window_e2e_ms=e2e_ms)


def test_a_duel_level_outlasts_its_warm_up_and_four_requests():
    # The 22nd GPU run's seed-A at 256: warm-up 2.3 s, requests of about 2.5 s.
    slow = _search(_level(128, True, 1.1, [1100.0] * 4), _level(256, True, 2.3, [2400.0, 2500.0, float("nan"), 2600.0]),
                   _level(320, False, 3.1, [3300.0] * 3))
    assert duel_seconds(slow, 256.0) == 2.3 + 4 * 2.5
    # Short requests (the stand-ins): the floor.
    quick = _search(_level(8, True, 0.3, [250.0] * 3))
    assert duel_seconds(quick, 8.0) == DUEL_LEVEL_S
    # No warm-up measured, no level at that load, no search: the floor.
    assert duel_seconds(_search(_level(8, True, None, None)), 8.0) == DUEL_LEVEL_S
    assert duel_seconds(slow, 192.0) == DUEL_LEVEL_S
    assert duel_seconds(None, 256.0) == DUEL_LEVEL_S


def test_knees_from_reads_a_paired_export_and_the_search_starts_there(tmp_path):
    export = tmp_path / "rank.json"
    export.write_text(json.dumps({"paired": {"searches": [{"preset": "A", "duel_load": 256.0},
                                                           {"preset": "B", "duel_load": None}]}}))
    assert knees_from(export) == {"A": 256.0}
    around = search_around(SearchConfig(tolerance=0.25, max_concurrency=1024), 256.0)
    assert (around.start, around.growth, around.max_concurrency, around.tolerance) == (256, 1.25, 1024, 0.25)
    # A knee at or above the search's own ceiling: still one step up.
    assert search_around(SearchConfig(tolerance=0.1, max_concurrency=2), 2.0).max_concurrency == 3
    rate = search_around(SearchConfig(tolerance=0.25, mode="rate", max_rate=500.0), 80.0)
    assert (rate.start_rate, rate.growth, rate.max_rate) == (80.0, 1.25, 500.0)
    for text, says in (("{}", "not a paired sweep"), ("not json", "cannot read"),
                       ('{"paired": {"searches": []}}', "no preset's duel load")):
        export.write_text(text)
        with pytest.raises(ValueError, match=says):
            knees_from(export)


def test_sweep_capacity_pairs_two_drifting_stand_ins(tmp_path, tiny_model, capsys):
    env = {"PACED_SLOTS": "64", "PACED_TTFT_MS": "10", "PACED_ITL_MS": "20", "PACED_DRIFT": "0.3",
           "PACED_DRIFT_PERIOD_S": "60"}
    body = "".join(paced_preset(name, tiny_model, port, {**env, "PACED_ITL_SCALE_KNEE": str(knee)})
                   for name, knee, port in (("weak", 2, own_port(18161)), ("strong", 6, own_port(18162))))
    presets = tmp_path / "p.toml"
    presets.write_text(body)
    outs = [tmp_path / f"sweep.{ext}" for ext in ("json", "md", "csv")]
    args = ["sweep", "weak", "strong", "--presets", str(presets), "--capacity", "--slo", "itl_p99=50ms",
            "--max-tokens", "8", "--min-tokens", "5", "--max-tokens-in", "20", "--max-requests", "40",
            "--level-time", "15", "--confirm-waves", "0", "--client-procs", "1", "--ready-timeout", "30"]
    base = list(args)
    for out in outs:
        args += ["--out", str(out)]
    # A second sweep only where the first was not beyond noise, never where it was wrong: on a CI box
    # running four test workers one duel level read 22 tok/s against 200-300 around it (the box
    # stalled the stand-in), and "within noise" was the honest answer (ci5, 2026-12-07). The landing
    # CI of stop 64 read within noise twice in a row with the strong knee at 4 (twice the weak's
    # capacity): "+54 %, -53 to +400 %", its duel levels at 87-311 tok/s where a quiet box reads
    # steady figures. At 6 (three times) the gap is 200 %, where 2 hogged cores read 179-243 %.
    verdicts = []
    for attempt in (1, 2):
        assert main(args) == 0, capsys.readouterr().err
        data = json.loads(outs[0].read_text())
        paired = data["paired"]
        (pair,) = paired["pairs"]
        verdicts.append(pair["text"])
        assert not (pair["beyond_noise"] and pair["better"] == "weak"), pair["text"]  # never the wrong way
        if pair["beyond_noise"] or attempt == 2:
            break
        capsys.readouterr()
    assert [r["preset"] for r in paired["searches"]] == ["weak", "strong"]
    assert len({d["round"] for d in paired["duels"]}) == 3  # the default: three duel rounds
    assert pair["better"] == "strong" and pair["beyond_noise"], verdicts
    assert pair["text"].startswith("strong carries ")
    assert set(paired["turns"]) == {"weak", "strong"}
    assert data["meta"]["mode"].startswith("paired")
    assert "Pairs (" in outs[1].read_text() and pair["text"] in outs[1].read_text()
    # Each knee by round, in the export and under the table (issue #56).
    assert set(paired["knees"]) == {"weak", "strong"} and len(paired["knee_rounds"]) == 6
    assert "Knee of strong: " in outs[1].read_text()
    # The table's rank and vs best are the pair's, not the two round-0 searches'.
    table = {r["preset"]: (r["rank"], r["vs_best"]) for r in data["rows"]}
    assert table["strong"] == (1, "best") and table["weak"][0] == 2, table
    assert table["weak"][1].startswith("-") and table["weak"][1].endswith(" vs strong"), table
    assert "Rank and vs best come from the paired duels" in outs[1].read_text()
    assert "One run per preset" not in outs[1].read_text()
    with open(tmp_path / "sweep-pairs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["a"], r["b"], r["better"]) for r in rows] == [("weak", "strong", "strong")]
    assert pair["text"] in capsys.readouterr().out
    # Again from the first sweep's knees (where each ladder ended): each search starts at its knee.
    knees = {r["preset"]: int(r["final_knee"]) for r in paired["searches"]}
    assert main([*base, "--out", str(tmp_path / "again.json"), "--knees-from", str(outs[0])]) == 0
    err = capsys.readouterr().err
    for name, knee in knees.items():
        first = next(line for line in err.splitlines() if f" {name} r1: capacity: concurrency " in line)
        assert f"capacity: concurrency {knee} " in first, (first, knees)
    redone = json.loads((tmp_path / "again.json").read_text())["paired"]
    assert {d["round"] for d in redone["duels"]} == {1, 2, 3}


def test_one_gpu_side_by_side_only_when_each_share_holds_the_search(monkeypatch):
    # No GPU here: preflight's answer for a CUDA machine is given. Each
    # server's KV pool at its share of the GPU must hold the search's top.
    from types import SimpleNamespace

    from ernie_tui.engine_ctl.control import paired_sweep
    from ernie_tui.presets import load_presets

    book = load_presets(include_user=False)
    a, b = book.get("seed-A"), book.get("seed-C")

    def preflight(preset, model):  # the KV pool grows with the memory share
        util = preset.get("gpu_memory_utilization") or 0.9
        return SimpleNamespace(ok=True, first_error=lambda: None,
                               estimate=SimpleNamespace(platform="cuda", max_concurrency=1000 * util))

    monkeypatch.setattr(paired_sweep, "run_preflight", preflight)
    cuda = [preflight(a, None), preflight(b, None)]
    shared, how = paired_sweep.co_residency([a, b], cuda, 256, model="/m")
    assert [p.get("gpu_memory_utilization") for p in shared] == [0.45, 0.45]
    assert "side by side on one GPU" in how and "KV pool 450 requests" in how
    refused, why = paired_sweep.co_residency([a, b], cuda, 1024, model="/m")
    assert refused is None
    assert why == ("seed-A does not fit beside the others on one GPU: its KV pool at gpu_memory_utilization "
                   "0.45 holds 450 requests where the search may go to 1024")
    cpu = [SimpleNamespace(estimate=SimpleNamespace(platform="cpu"))] * 2
    assert paired_sweep.co_residency([a, b], cpu, 1024)[0] == [a, b]


def test_one_gpu_share_is_sized_by_the_loads_longest_request_when_known(monkeypatch):
    # Preflight's max_concurrency counts requests of max_model_len tokens; the
    # sweep's load is shorter. 900,000 KV tokens at 0.45 of the GPU hold 219
    # requests of 4,096 tokens but 2,093 of the load's 430 (300 in, 128 out + 2).
    from types import SimpleNamespace

    from ernie_tui.engine_ctl.control import paired_sweep
    from ernie_tui.presets import load_presets

    book = load_presets(include_user=False)
    a, b = book.get("seed-A"), book.get("seed-C")

    def preflight(preset, model):
        util = preset.get("gpu_memory_utilization") or 0.9
        tokens = int(2_000_000 * util)
        return SimpleNamespace(ok=True, first_error=lambda: None,
                               estimate=SimpleNamespace(platform="cuda", kv_cache_tokens=tokens,
                                                        max_concurrency=tokens / 4096))

    monkeypatch.setattr(paired_sweep, "run_preflight", preflight)
    cuda = [preflight(a, None), preflight(b, None)]
    assert paired_sweep.co_residency([a, b], cuda, 1024, model="/m")[0] is None  # 219 at 4,096 tokens each
    shared, how = paired_sweep.co_residency([a, b], cuda, 1024, model="/m", tokens_per_request=430)
    assert shared is not None and "KV pool 2093 requests of 430 tokens" in how, how


def test_one_gpu_pins_each_kv_pool_so_the_servers_start_at_once(monkeypatch, tmp_path):
    # With each KV pool fixed (kv_cache_memory_bytes), vLLM skips the memory
    # profile that a neighbour's start would upset: every server is launched
    # before any is waited for. A pool that cannot be pinned (no estimate of
    # its bytes) keeps the one-after-another start.
    import threading
    from types import SimpleNamespace

    from ernie_tui.engine_ctl.control import paired_sweep
    from ernie_tui.engine_ctl.control.sweep import CapacitySweep, SweepOptions
    from ernie_tui.presets import load_presets

    book = load_presets(include_user=False)
    a, b = book.get("seed-A"), book.get("seed-C")

    def preflight(preset, model, kv=True):
        util = preset.get("gpu_memory_utilization") or 0.9
        est = SimpleNamespace(platform="cuda", kv_cache_tokens=int(2_000_000 * util), max_concurrency=400,
                              kv_cache_bytes=int(util * 10 * (1 << 30)) + 12345 if kv else 0)
        return SimpleNamespace(ok=True, first_error=lambda: None, estimate=est)

    monkeypatch.setattr(paired_sweep, "run_preflight", preflight)
    shared, how = paired_sweep.co_residency([a, b], [preflight(a, None)] * 2, 256, model="/m")
    assert [p.kv_cache_memory_bytes for p in shared] == [int(0.45 * 10 * (1 << 30)) // (1 << 20) << 20] * 2
    assert "pinned at 4.50 GiB" in how
    assert "--kv-cache-memory-bytes" in shared[0].launch_spec("/m").argv

    def order_of_starts(kv: bool) -> list[str]:
        monkeypatch.setattr(paired_sweep, "run_preflight", lambda p, m: preflight(p, m, kv))
        seen: list[str] = []

        def start(preset, port, options, log_dir):
            seen.append(f"start {preset.name}")
            run = paired_sweep.SweepRun(preset=preset.name, repeat=0, status="ok")
            return SimpleNamespace(preset=preset, ready=run), run

        monkeypatch.setattr(paired_sweep, "_start_one", start)
        monkeypatch.setattr(paired_sweep, "_wait_ready", lambda s, o, c: seen.append(f"wait {s.preset.name}"))
        capacity = CapacitySweep(slo=None, search=SimpleNamespace(max_concurrency=256))
        served, failed, _ = paired_sweep.start_all([a, b], SweepOptions(model="/m"), capacity, tmp_path,
                                                   threading.Event(), 430)
        assert len(served) == 2 and not failed
        return seen

    assert order_of_starts(kv=True) == ["start seed-A", "start seed-C", "wait seed-A", "wait seed-C"]
    assert order_of_starts(kv=False) == ["start seed-A", "wait seed-A", "start seed-C", "wait seed-C"]
