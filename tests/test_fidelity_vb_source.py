"""bench/vb_source.py, vLLM's bench client as the fidelity bench's source
(`bench/traffic_fidelity.py --source vllm-bench`): the argv it builds, what
it reads from the client's saved result, the source row's table cells; and
(marked vllm: it imports vLLM) the argv as vLLM's own parser reads it, and
one run of the real bench client against the paced stand-in."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench_scripts import load_bench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

V = load_bench("vb_source")
SHAPE = V.BenchShape(input_len=100, output_len=20, range_ratio=0.5, prefix_len=64, rate=12.5, burstiness=0.25)


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_the_bench_clients_argv_carries_the_shape_and_sends_only_the_source():
    argv = V.bench_args("http://127.0.0.1:9", "m", "/tok", SHAPE, 300, 7, "/res", "r.json")
    f = _flags(argv)
    assert f["--dataset-name"] == "random" and f["--base-url"] == "http://127.0.0.1:9"
    assert (f["--random-input-len"], f["--random-output-len"], f["--random-range-ratio"],
            f["--random-prefix-len"]) == ("100", "20", "0.5", "64")
    assert (f["--request-rate"], f["--burstiness"], f["--num-prompts"], f["--seed"]) == ("12.5", "0.25", "300", "7")
    assert f["--model"] == "m" and f["--tokenizer"] == "/tok"
    assert (f["--result-dir"], f["--result-filename"]) == ("/res", "r.json")
    # the drawn lengths are what the server makes (a random model's EOS is noise); per-request lists saved
    assert "--ignore-eos" in f and "--save-result" in f and "--save-detailed" in f
    # no test request before the run: the server's counters and log over its run are the source's alone
    assert f["--ready-check-timeout-sec"] == "0"
    assert "--max-concurrency" not in f  # open loop: arrivals by rate and burstiness only


def test_the_bench_clients_requests_are_read_in_send_order_without_the_failed():
    d = {"start_times": [100.4, 100.0, 100.9, 101.5], "input_lens": [150, 120, 90, 200],
         "output_lens": [12, 30, 0, 25], "ttfts": [0.05, 0.02, 0.0, 0.08],
         "errors": ["", "", "connection reset", ""]}
    reqs = V.requests_from_result(d)
    assert [r["prompt_tokens"] for r in reqs] == [120, 150, 200]
    assert [r["output_tokens"] for r in reqs] == [30, 12, 25]
    assert [round(r["sent"], 6) for r in reqs] == [0.0, 0.4, 1.5]
    assert [r["ttft_s"] for r in reqs] == [0.02, 0.05, 0.08]
    # a result saved without --save-detailed has no per-request lists
    with pytest.raises(ValueError, match="save-detailed"):
        V.requests_from_result({"output_throughput": 10.0})
    with pytest.raises(ValueError, match="no successful"):
        V.requests_from_result({**d, "errors": ["x"] * 4})


def test_the_bench_clients_summary_in_seconds_p50_before_median():
    figs = V.figures_from_result({"output_throughput": 812.5, "median_ttft_ms": 30.0, "p50_ttft_ms": 31.0,
                                  "request_throughput": 9.9, "duration": 20.2, "completed": 200, "failed": 0,
                                  "total_output_tokens": 16412})
    assert figs["output_tps"] == 812.5 and figs["ttft_p50_s"] == pytest.approx(0.031)
    assert figs["duration_s"] == 20.2 and figs["completed"] == 200.0 and figs["failed"] == 0.0
    assert V.figures_from_result({"median_ttft_ms": 30.0})["ttft_p50_s"] == pytest.approx(0.030)
    assert V.figures_from_result({})["output_tps"] is None


def test_the_source_row_shows_the_bench_clients_figures_beside_ours():
    fid = load_bench("traffic_fidelity")
    src = {"prompt": {"p10": 20, "p50": 200, "p90": 400}, "output": {"p10": 10, "p50": 40, "p90": 100},
           "rate": 2.0, "prefix_hit_rate": 0.6, "output_tps": 100.0, "ttft_p50_s": 0.020,
           "client_ttft_p50_s": 0.025, "bench_client": {"output_tps": 98.0, "ttft_p50_s": 0.0251,
                                                         "request_rate": 1.9}}
    rep = {"prompt": {"p10": 22, "p50": 200, "p90": 300}, "output": {"p10": 10, "p50": 40, "p90": 100},
           "rate": 1.9, "prefix_hit_rate": 0.55, "output_tps": 110.0, "ttft_p50_s": 0.020}
    lines = fid.summarise([{"round": 1, "source": src}, {"round": 1, "replica": "metrics", **rep}]).splitlines()
    assert "| 100.0 [bench 98.0] | 20.0 [bench 25.1] | 25.0 |" in lines[2]
    assert "| 2.000 | 60 % |" in lines[2]  # the rate cell has no bench figure
    assert "110.0 (+10 %)" in lines[3] and "[bench" not in lines[3]  # a replica's: against our reading
    # the other source (no bench client): its row as before
    plain = {k: v for k, v in src.items() if k != "bench_client"}
    assert "[bench" not in fid.summarise([{"round": 1, "source": plain}])


@pytest.mark.vllm  # imports vLLM for its bench client's parser (~15 s on 2 cores); no server
def test_vllms_own_parser_reads_the_argv_as_the_shape():
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser()
    add_cli_args(p)
    a = p.parse_args(V.bench_args("http://127.0.0.1:9", "m", "/tok", SHAPE, 300, 7, "/res", "r.json"))
    assert (a.dataset_name, a.random_input_len, a.random_output_len, a.random_prefix_len) == ("random", 100, 20, 64)
    assert float(a.random_range_ratio) == 0.5 and a.request_rate == 12.5 and a.burstiness == 0.25
    assert a.num_prompts == 300 and a.seed == 7 and a.ignore_eos and a.save_detailed
    assert a.ready_check_timeout_sec == 0 and a.max_concurrency is None


@pytest.fixture
def tiny_tokenizer(tmp_path):
    from ernie_tui.demo_model import write_demo_model

    write_demo_model(tmp_path / "tiny", "tiny")
    return tmp_path / "tiny"


@pytest.mark.vllm  # runs vLLM's bench client (~20 s on 2 cores); no vLLM server
def test_a_bench_client_source_on_the_paced_stand_in(tiny_tokenizer):
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "8", "--ttft-ms", "20", "--itl-ms", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = srv.stdout.readline().split()[-1]
        shape = V.BenchShape(input_len=40, output_len=6, range_ratio=0.5, prefix_len=16, rate=40.0, burstiness=0.5)
        said: list[float] = []
        reqs, figs = V.run_bench_source(url, str(tiny_tokenizer), shape, 12, 3,
                                        on_start=lambda: said.append(time.monotonic()), timeout_s=300)
        seen = httpx.get(url + "/requests", timeout=10).json()
        # its window on our clock (the stand-in's is time.monotonic too): opened as its first request
        # reached the server (its line and its request race by a pipe's latency), closed after its last
        # answer ended, and as long as it says it was; not from its process's start (~10 s before)
        assert len(said) == 1 and figs["ended_at"] is not None
        assert said[0] <= min(r["arrive"] for r in seen) + 0.25 and figs["ended_at"] >= max(r["end"] for r in seen)
        assert figs["duration_s"] - 0.25 <= figs["ended_at"] - said[0] < figs["duration_s"] + 1.0
        # every request the server saw was the source's: 12, no test request before them
        assert len(seen) == 12 and len(reqs) == 12 and figs["completed"] == 12.0
        # outputs of the drawn lengths (ignore_eos): 6 +- 50 %, as the server sent them
        assert all(3 <= r["output_tokens"] <= 9 for r in reqs)
        assert sorted(r["max_tokens"] for r in seen) == sorted(r["output_tokens"] for r in reqs)
        assert reqs[0]["sent"] == 0.0 and all(a["sent"] <= b["sent"] for a, b in zip(reqs, reqs[1:], strict=False))
        assert all(r["ttft_s"] >= 0.015 for r in reqs)  # the stand-in waits 20 ms before a first token
        assert figs["output_tps"] > 0 and figs["ttft_p50_s"] >= 0.015 and figs["duration_s"] > 0
    finally:
        srv.terminate()
        srv.wait(10)
