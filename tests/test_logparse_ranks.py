"""Every rank of a parallel server in the startup report: its name as the log
prefix gives it, its pid, and the KV/memory figures it logged itself.

No multi-GPU capture is in tests/fixtures yet, so the DP and TP logs here are
the real H200 capture (gpu-h200-vllm0.26.0/ok_block16_len4096.log) with its
engine lines re-prefixed the way vLLM 0.32 names parallel processes
(`EngineCore_DP{rank}` in vllm/v1/engine/core.py, `Worker[_DP{d}][_PP{p}]_TP{t}`
in vllm/v1/executor/multiproc_executor.py, Ray's `(RayWorkerWrapper pid=N,
ip=ADDR)`), and the figures vLLM logs once per node (`info_once`) kept on
the first local rank only, as vLLM does."""

from __future__ import annotations

import json
import re

from ernie_tui.cli import main
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file
from ernie_tui.engine_ctl.logs.ranks import describe_rank, note_rank, parallel_ranks
from ernie_tui.engine_ctl.logs.report import RankInfo

H200 = "gpu-h200-vllm0.26.0/ok_block16_len4096.log"
ENGINE = "(EngineCore pid=2040) "
WORKER_LINES = ("Loading weights took", "Model loading took", "Available KV cache memory")


def h200_lines(fixtures_dir) -> list[str]:
    return (fixtures_dir / H200).read_text().splitlines(keepends=True)


def dp2_log(fixtures_dir) -> list[str]:
    """Two data-parallel engines: each engine line twice, DP1's KV figures its own."""
    out = []
    for line in h200_lines(fixtures_dir):
        if not line.startswith(ENGINE):
            out.append(line)
            continue
        out.append(line.replace(ENGINE, "(EngineCore_DP0 pid=2040) "))
        dp1 = line.replace(ENGINE, "(EngineCore_DP1 pid=2041) ")
        dp1 = dp1.replace("Available KV cache memory: 127.4 GiB", "Available KV cache memory: 126.9 GiB")
        dp1 = dp1.replace("GPU KV cache size: 7,421,344 tokens", "GPU KV cache size: 7,392,160 tokens")
        dp1 = dp1.replace("4,096 tokens per request: 1811.85x", "4,096 tokens per request: 1804.73x")
        out.append(dp1)
    return out


def tp2_log(fixtures_dir) -> list[str]:
    """One engine core with two TP workers; the worker's once-per-node lines on TP0 only."""
    out = []
    for line in h200_lines(fixtures_dir):
        if line.startswith(ENGINE) and any(w in line for w in WORKER_LINES):
            out.append(line.replace(ENGINE, "(Worker_TP0 pid=2050) "))
            if "Loading weights took" in line:  # not info_once: both workers print it
                out.append(line.replace(ENGINE, "(Worker_TP1 pid=2051) "))
        else:
            out.append(line)
    return out


def test_two_data_parallel_engines_each_with_its_own_figures(fixtures_dir):
    parser = LogParser()
    parser.feed_many(dp2_log(fixtures_dir))
    r = parser.report
    assert [(x.name, x.pid) for x in r.ranks] == [("EngineCore_DP0", 2040), ("EngineCore_DP1", 2041)]
    dp0, dp1 = r.ranks
    assert (dp0.weights_gib, dp0.kv_cache_gib, dp0.kv_cache_tokens, dp0.max_concurrency) == (0.7, 127.4, 7421344,
                                                                                           1811.85)
    assert (dp1.weights_gib, dp1.kv_cache_gib, dp1.kv_cache_tokens, dp1.max_concurrency) == (0.7, 126.9, 7392160,
                                                                                           1804.73)
    assert r.ready and r.pids["EngineCore"] == 2040 and r.pids["EngineCore_DP1"] == 2041
    assert "APIServer" in r.pids and all(x.name != "APIServer" for x in r.ranks)


def test_tensor_parallel_workers_listed_with_what_each_logged(fixtures_dir):
    parser = LogParser()
    parser.feed_many(tp2_log(fixtures_dir))
    ranks = {x.name: x for x in parser.report.ranks}
    assert list(ranks) == ["EngineCore", "Worker_TP0", "Worker_TP1"]
    assert ranks["Worker_TP0"].pid == 2050 and ranks["Worker_TP0"].kv_cache_gib == 127.4
    assert ranks["Worker_TP0"].weights_gib == 0.7
    assert ranks["Worker_TP1"].pid == 2051 and ranks["Worker_TP1"].kv_cache_gib is None  # logged on TP0 only
    assert ranks["EngineCore"].kv_cache_tokens == 7421344 and ranks["EngineCore"].kv_cache_gib is None
    assert parallel_ranks(parser.report.ranks) == parser.report.ranks


def test_a_worker_named_late_and_ray_workers():
    p = LogParser()
    p.feed_many([
        "(Worker pid=31) INFO 11-30 03:20:01 [parallel_state.py:1] world_size=2 rank=0\n",
        "(Worker_DP1_TP0 pid=31) INFO 11-30 03:20:09 [gpu_worker.py:760] Available KV cache memory: 60.25 GiB\n",
        "(RayWorkerWrapper pid=2436, ip=10.0.0.2) INFO 11-30 03:20:09 [gpu_worker.py:760] "
        "Available KV cache memory: 59.5 GiB\n",
        "(DPCoordinator pid=40) INFO 11-30 03:20:10 [coordinator.py:1] started\n",
    ])
    assert [(x.name, x.pid, x.kv_cache_gib) for x in p.report.ranks] == [
        ("Worker_DP1_TP0", 31, 60.25), ("RayWorkerWrapper", 2436, 59.5)]


def test_single_gpu_and_unprefixed_logs_show_no_rank_list(fixtures_dir):
    r = parse_file(fixtures_dir / H200)
    assert [x.name for x in r.ranks] == ["EngineCore"] and r.ranks[0].kv_cache_tokens == 7421344
    assert parallel_ranks(r.ranks) == []
    p = LogParser()
    p.feed_many(["INFO 11-30 03:20:30 [gpu_worker.py:560] Available KV cache memory: 12.0 GiB\n"])
    assert p.report.kv_cache_gib == 12.0 and p.report.ranks == []


def test_rank_list_is_copy_on_write(fixtures_dir):
    """A shallow copy of the report (what the dashboard keeps) never changes under it."""
    import dataclasses

    lines = dp2_log(fixtures_dir)
    cut = next(i for i, ln in enumerate(lines) if "Available KV cache memory: 126.9" in ln)
    p = LogParser()
    p.feed_many(lines[:cut])
    shot = dataclasses.replace(p.report)
    before = [dataclasses.astuple(x) for x in shot.ranks]
    p.feed_many(lines[cut:])
    assert [dataclasses.astuple(x) for x in shot.ranks] == before
    assert p.report.ranks[1].kv_cache_gib == 126.9 and shot.ranks[1].kv_cache_gib is None
    same = note_rank(p.report.ranks, "EngineCore_DP1", 2041, kv_cache_gib=126.9)
    assert same is p.report.ranks  # nothing new: no new list


def test_parse_log_lists_every_rank(fixtures_dir, tmp_path, capsys):
    log = tmp_path / "dp2.log"
    log.write_text("".join(dp2_log(fixtures_dir)))
    assert main(["parse-log", str(log)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"ranks\s+EngineCore_DP0 pid 2040: weights 0.7 GiB, KV 127.4 GiB = 7,421,344 tokens, "
                     r"1811.85x concurrency", text), text
    assert "EngineCore_DP1 pid 2041: weights 0.7 GiB, KV 126.9 GiB = 7,392,160 tokens" in text
    assert main(["parse-log", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [x["name"] for x in data["ranks"]] == ["EngineCore_DP0", "EngineCore_DP1"]
    assert data["ranks"][1]["kv_cache_tokens"] == 7392160
    assert main(["parse-log", str(fixtures_dir / H200)]) == 0
    assert "ranks" not in capsys.readouterr().out


def test_describe_says_only_what_is_known():
    assert describe_rank(RankInfo("Worker_TP1", 9)) == "Worker_TP1 pid 9"
    assert describe_rank(RankInfo("EngineCore", 7, kv_cache_tokens=1000)) == "EngineCore pid 7: KV 1,000 tokens"


async def test_report_panel_shows_every_rank(fixtures_dir):
    from textual.app import App
    from textual.widgets import Static

    from ernie_tui.tui.widgets.report_panel import ReportPanel

    class One(App):
        def compose(self):
            yield ReportPanel(id="report")

    dp2 = LogParser()
    dp2.feed_many(dp2_log(fixtures_dir))
    app = One()
    async with app.run_test(size=(140, 30)) as pilot:
        panel = app.query_one(ReportPanel)
        panel.set_report(dp2.report)
        await pilot.pause()
        text = str(app.query_one("#report-body", Static).content)
        assert "EngineCore_DP0 pid 2040  KV 127.4 GiB = 7,421,344 tokens  1811.85×" in text
        assert "EngineCore_DP1 pid 2041  KV 126.9 GiB = 7,392,160 tokens  1804.73×" in text
        panel.set_report(parse_file(fixtures_dir / H200))  # one GPU: no rank rows
        await pilot.pause()
        assert "ranks" not in str(app.query_one("#report-body", Static).content)
