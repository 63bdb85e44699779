"""The pure parts of bench/agree_vllm_bench.py (medians, spreads, ratios
against the goal, reading both clients' results) and bench/capacity_truth.py
(a run against the SLO, the bracket, an answer against it, finding an
open-loop search in --help); and one small run of the agreement bench
against the paced stand-in, vLLM's bench client included."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench_scripts import load_bench
from ernie_tui.engine_ctl.load import parse_slo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


A = load_bench("agree_vllm_bench")
T = load_bench("capacity_truth")


def test_figure_summary_medians_spreads_ratio_and_goal():
    s = A.summarize_figure([100.0, 104.0, 96.0], [100.0, 110.0, 90.0], 0.05)
    assert s["ours_median"] == 100.0 and s["theirs_median"] == 100.0
    assert s["ours_spread"] == pytest.approx(0.08) and s["theirs_spread"] == pytest.approx(0.20)
    assert s["ratio"] == pytest.approx(1.0) and s["within_goal"] is True and s["spread_no_larger"] is True
    off = A.summarize_figure([106.0, 106.0, 106.0], [100.0, 100.0, 100.0], 0.05)
    assert off["ratio"] == pytest.approx(1.06) and off["within_goal"] is False
    edge = A.summarize_figure([95.0], [100.0], 0.05)
    assert edge["within_goal"] is True  # -5 % exactly is inside the goal
    none = A.summarize_figure([None, None], [1.0], 0.1)
    assert none["ours_median"] is None and none["ratio"] is None and none["within_goal"] is None
    assert A.spread([]) is None and A.spread([5.0]) == 0.0


def test_a_figure_is_also_read_round_by_round_as_pairs():
    # Rounds share one workload, so each round is a pair: at rate 80 on an H200 (10 s runs) ours
    # read higher in all 3 rounds, at 20 s in 1 of 3 with 2 rounds within 4 %. The medians' ratio
    # alone does not tell the two apart.
    s = A.summarize_figure([66.0, 65.0, 74.0], [56.0, 51.0, 50.0], 0.1)
    ratios, higher, known = A.per_round(s)
    assert ratios == pytest.approx([66 / 56, 65 / 51, 74 / 50]) and (higher, known) == (3, 3)
    mixed = A.summarize_figure([64.0, None, 75.0], [106.0, 85.0, 80.0], 0.1)
    assert A.per_round(mixed)[1:] == (0, 2) and A.per_round(mixed)[0][1] is None
    lv = {"concurrency": None, "rate": 80.0, "n": 800, "rounds": 3,
          "figures": {f: s for f in A.FIGURES}, "referee": {f: s for f in A.FIGURES}}
    assert "| 1.179 1.275 1.480 (ours higher in 3 of 3) |" in A.markdown_level(lv)
    assert "1.179 1.275 1.480 (ours higher in 3 of 3)" in A.format_level({**lv, "runs": {}})
    # A variant arm's rows name the variant.
    with_variant = {**lv, "variants": {"quiet": {"args": ["--metrics-interval", "30"], **lv}}}
    assert "(quiet higher in 3 of 3)" in A.markdown_level(with_variant)
    assert "(quiet higher in 3 of 3)" in A.format_level({**with_variant, "runs": {}})


def test_neither_client_always_opens_a_level():
    firsts = [A.round_order(li, 0)[0] for li in range(4)]
    assert firsts == ["ours", "theirs", "ours", "theirs"]
    for li in range(3):
        rounds = [A.round_order(li, k) for k in range(4)]
        assert all(set(r) == {"ours", "theirs"} for r in rounds)
        assert [r[0] for r in rounds].count("ours") == 2


def test_with_a_variant_arm_each_arm_opens_a_level_and_runs_once_a_round():
    arms = ("ours", "quiet", "theirs")
    assert [A.round_order(li, 0, arms)[0] for li in range(3)] == ["ours", "quiet", "theirs"]
    for li in range(3):
        rounds = [A.round_order(li, k, arms) for k in range(3)]
        assert all(sorted(r) == sorted(arms) for r in rounds)
        assert sorted(r[0] for r in rounds) == sorted(arms)  # each opens the level once in 3 rounds
    assert A.parse_variant("quiet=--metrics-interval 30") == ("quiet", ["--metrics-interval", "30"])
    for bad in ("--metrics-interval 30", "ours=--x", "theirs=", "a b=--x"):
        with pytest.raises(ValueError):
            A.parse_variant(bad)


def test_every_arm_of_a_round_sends_one_workload_at_a_concurrency_and_at_a_rate(monkeypatch):
    # Different draws for the two clients were noise in every ratio: on an H200 at 80 req/s the
    # engine held ours longer in 2 of 3 rounds (two Poisson draws); on the paced stand-in with one
    # arrival sequence the TTFT tail still differed round by round (two draws of output lengths).
    # Now a round's arms share one --seed: the bench client's lengths and arrivals, replayed by ours.
    calls = []

    def fake(who):
        def run(srv, shape, *, seed, rate, extra=None, **kw):
            calls.append({"who": "quiet" if extra else who, "seed": seed, "rate": rate})
            return {**{f: 1.0 for f in A.FIGURES}, "duration_s": 1.0, "completed": 1}
        return run

    class NoMetrics:
        def __init__(self, *a, **kw):
            pass

        def try_fetch(self):
            return None

        def close(self):
            pass
    monkeypatch.setattr(A, "run_ours", fake("ours"))
    monkeypatch.setattr(A, "run_theirs", fake("theirs"))
    monkeypatch.setattr(A, "MetricsClient", NoMetrics)
    for concurrency, rate in ((128, None), (None, 80.0)):
        calls.clear()
        lv = A.one_level(A.Server("http://127.0.0.1:9", "m", "tok"), A.Shape(), concurrency=concurrency, rate=rate,
                         n=800, rounds=3, python=sys.executable, env={}, timeout_s=10, log=lambda *a: None,
                         variants={"quiet": ["--metrics-interval", "30"]})
        assert len(calls) == 9
        rounds = [calls[i:i + 3] for i in range(0, 9, 3)]
        for rnd in rounds:
            assert {c["who"] for c in rnd} == {"ours", "quiet", "theirs"}
            assert len({c["seed"] for c in rnd}) == 1  # one workload a round
        assert len({rnd[0]["seed"] for rnd in rounds}) == 3  # a new one each round
        assert [r["seed"] for r in lv["runs"]["theirs"]] == [rnd[0]["seed"] for rnd in rounds]


def test_our_burst_gets_the_rounds_seed_for_lengths_and_arrivals_and_new_words(monkeypatch):
    # The seed is the bench client's --seed: our --seed (lengths) and --arrival-seed take it; no
    # --word-seed, so our prompts' words are new every run (never from vLLM's prefix cache).
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="{}", stderr="")
    monkeypatch.setattr(A.subprocess, "run", fake_run)
    monkeypatch.setattr(A, "figures_from_burst_json", lambda d: {"duration_s": 1.0})
    for rate in (None, 80.0):
        A.run_ours(A.Server("http://127.0.0.1:9", "m", "tok"), A.Shape(), concurrency=None if rate else 128,
                   rate=rate, n=800, seed=4242, python=sys.executable, env={}, timeout_s=10)
    closed, open_ = seen
    assert closed[closed.index("--seed") + 1] == "4242" and "--arrival-seed" not in closed
    assert open_[open_.index("--seed") + 1] == "4242" and open_[open_.index("--arrival-seed") + 1] == "4242"
    assert not any("--word-seed" in argv for argv in seen)


def test_the_bench_clients_lengths_are_checked_against_ours_request_by_request():
    shape = A.Shape(165, 128, 0.8182)
    in_lo, in_hi, out_lo, out_hi = shape.ranges()
    ins, outs = A.drawn_lengths(50, (in_lo, in_hi), (out_lo, out_hi), seed=9)
    assert A.lengths_unlike_ours({"input_lens": ins, "output_lens": outs}, shape, 50, 9) == {"prompt": 0, "output": 0}
    outs2 = list(outs)
    outs2[7] = 0  # a failed request: nothing returned
    ins2 = [x + 1 for x in ins[:3]] + ins[3:]
    assert A.lengths_unlike_ours({"input_lens": ins2, "output_lens": outs2}, shape, 50, 9) == {"prompt": 3,
                                                                                              "output": 1}
    assert A.lengths_unlike_ours({"input_lens": ins, "output_lens": outs}, shape, 50, 10)["output"] > 40
    assert A.lengths_unlike_ours({"ttfts": [0.1]}, shape, 50, 9) is None
    assert "LENGTHS UNLIKE OURS: 3 prompt, 1 output" in A.fmt_run(
        {f: 1.0 for f in A.FIGURES} | {"output_tps": 1.0, "referee": {}, "completed": 50,
                                       "lengths_unlike_ours": {"prompt": 3, "output": 1}})


def test_the_bench_clients_run_read_over_its_whole_load_alone():
    # Two slots. Warm-up: the first wave (gaps 20 ms); then whole load (30 ms); the last request
    # is sent at 0.65 s and the drain that follows runs lighter (5 ms). A figure over the whole
    # run mixes the three; the steady reading keeps the 30 ms gaps and the TTFTs sent in between.
    d = {"start_times": [0.0, 0.0, 0.2, 0.28, 0.45, 0.65],
         "ttfts": [0.1, 0.1, 0.1, 0.2, 0.2, 0.1],
         "itls": [[0.02] * 5, [0.02] * 9, [0.03] * 5, [0.03] * 5, [0.03] * 5, [0.005] * 20]}
    st = A.steady_from_bench_detail(d)
    assert st["requests"] == 2 and st["ttft_p50_ms"] == pytest.approx(200.0)  # sent at 0.28 and 0.45
    assert st["itl_p50_ms"] == pytest.approx(30.0) and st["itl_p99_ms"] == pytest.approx(30.0)
    assert st["warmup_s"] == pytest.approx(0.28) and st["span_s"] == pytest.approx(0.37)
    assert 0 < st["share_of_gaps"] < 0.5  # most of this short run's gaps were in its warm-up and drain
    # A failed request (ttft 0) is left out; a result without per-request times has no reading.
    d["ttfts"][2] = 0.0
    assert A.steady_from_bench_detail(d)["requests"] == 2
    assert A.steady_from_bench_detail({"ttfts": [0.1]}) is None
    # One wave and nothing after it: no span in which the load was whole, and no figure from it.
    one = A.steady_from_bench_detail({"start_times": [0.0, 0.0], "ttfts": [0.1, 0.1], "itls": [[0.02], [0.02]]})
    assert one["span_s"] == 0.0 and one["gaps"] == 0 and one["itl_p99_ms"] is None


def test_reading_both_clients_results():
    theirs = {"output_throughput": 15259.0, "p50_ttft_ms": 590.0, "p99_ttft_ms": 1470.0, "median_itl_ms": 20.0,
              "p99_itl_ms": 37.0, "duration": 17.2, "completed": 2048, "total_output_tokens": 262144}
    f = A.figures_from_bench_json(theirs)
    assert (f["output_tps"], f["ttft_p50_ms"], f["ttft_p99_ms"], f["itl_p50_ms"], f["itl_p99_ms"]) == \
        (15259.0, 590.0, 1470.0, 20.0, 37.0)
    ours = {"output_tps": 14111.0, "ttft": {"p50": 0.3, "p99": 0.9}, "itl": {"p50": 0.02, "p99": 0.04},
            "duration_s": 18.0, "completed": 2048, "output_tokens": 262144}
    g = A.figures_from_burst_json(ours)
    assert g["ttft_p50_ms"] == pytest.approx(300.0) and g["itl_p99_ms"] == pytest.approx(40.0)
    assert A.Shape().ranges() == (29, 301, 23, 233)


def test_a_run_meets_the_slo_by_the_bench_clients_percentiles():
    slo = parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    assert T.run_meets({"p99_ttft_ms": 999.0, "p99_itl_ms": 50.0}, slo) is True
    assert T.run_meets({"p99_ttft_ms": 1001.0, "p99_itl_ms": 20.0}, slo) is False
    assert T.run_meets({"p99_ttft_ms": 10.0}, slo) is None  # ITL missing: no verdict
    e2e = parse_slo(["e2e_p50=2s"])
    assert T.run_meets({"median_e2el_ms": 1500.0}, e2e) is True


def test_the_bracket_and_answers_against_it():
    # The table: 128 yes, 160/192 borderline, 224+ no.
    v = {128: [True, True], 160: [True, False], 192: [False, True], 224: [False, False], 256: [False, False]}
    b = T.bracket(v)
    assert (b["low"], b["high"], b["borderline"], b["inconsistent"]) == (128, 224, [160, 192], [])
    assert T.judge(192, b["low"], b["high"], 0.10) == "inside"
    assert T.judge(240, b["low"], b["high"], 0.10) == "one step"
    assert T.judge(320, b["low"], b["high"], 0.10) == "over"
    assert T.judge(100, b["low"], b["high"], 0.10) == "under"
    assert T.judge(None, b["low"], b["high"], 0.10) == "none"
    # Noise against the order: an all-miss level below the all-meet one.
    b2 = T.bracket({8: [False], 16: [True], 32: [False]})
    assert (b2["low"], b2["high"], b2["inconsistent"]) == (16, 32, [8])
    # Nothing passes / nothing fails.
    assert T.bracket({8: [False], 16: [False]})["low"] is None
    assert T.bracket({8: [True], 16: [True]}) == {"low": 16, "high": None, "borderline": [], "inconsistent": []}


def test_brackets_taken_over_several_calls_are_joined():
    conc = {"modes": {"concurrency": {"runs": [{"level": 128, "meets": True}, {"level": 160, "meets": False}]}}}
    cut = {"modes": {"concurrency": {"runs": [{"level": 192, "meets": False}], "partial": True}}}
    rate = {"modes": {"rate": {"runs": [{"level": 80.0, "meets": True}]}, "concurrency": {"runs": []}}}
    j = T.joined_brackets([conc, cut, rate])
    assert [r["level"] for r in j["concurrency"]["runs"]] == [128, 160, 192]
    assert [r["level"] for r in j["rate"]["runs"]] == [80.0]
    assert T.joined_brackets([]) == {}


def test_each_search_is_judged_against_the_rounds_around_it_too():
    # On a noisy H200 the bench client's bracket moved within minutes (it met the SLO at
    # concurrency 256 after missing twice at 224): a search is judged against the whole bracket
    # and against the rounds taken just before and just after it.
    def run(level, meets, t):
        return {"level": level, "meets": meets, "started_at": t, "ended_at": t + 10}
    early = [run(128, True, 0), run(160, True, 10), run(192, False, 20)]  # before the search
    late = [run(128, True, 300), run(160, False, 310), run(192, False, 320)]  # after it
    far = [run(128, True, 600), run(160, True, 610), run(192, True, 620), run(224, False, 630)]
    srch = {"answer": 176, "started_at": 100, "ended_at": 250}
    loc = T.local_bracket(early + late + far, 100, 250)
    assert (loc["low"], loc["high"], loc["borderline"]) == (128, 192, [160])
    call1 = {"modes": {"concurrency": {"runs": early + late, "searches": [srch]}}}
    call2 = {"modes": {"concurrency": {"runs": early + late + far, "searches": []}}}  # carries call 1's runs
    j = T.judged_files([call1, call2], 0.10)["concurrency"]
    assert len(j["runs"]) == 10  # each run once
    assert (j["bracket"]["low"], j["bracket"]["high"]) == (128, 224)
    (s,) = j["searches"]
    assert s["verdict"] == "inside" and s["local_verdict"] == "inside"
    assert T.judge(200, loc["low"], loc["high"], 0.10) == "one step"
    # A local bracket that contradicts the order says so where it is printed: on an H200 two
    # rounds met at 192 and both missed at 144, and a search answering 136 read 'under' [192, 224).
    noisy = [run(144, False, 0), run(192, True, 10), run(224, False, 20),
             run(144, False, 300), run(192, True, 310)]
    m = {"bracket": T.bracket({144: [False], 192: [True], 224: [False]}),
         "searches": [{"answer": 136, "local_bracket": T.local_bracket(noisy, 100, 250), "local_verdict": "under"}]}
    assert "(local bracket [192.0, 224.0) inconsistent [144.0]: under)" in T.report_mode("concurrency", m)
    # A search from before runs had times (an earlier run's file) keeps the whole bracket's verdict alone.
    j = T.judged_files([{"modes": {"rate": {"runs": [{"level": 140.0, "meets": True}],
                                            "searches": [{"answer": 144.0}]}}}], 0.10)["rate"]
    assert j["searches"][0]["verdict"] == "inside" and "local_verdict" not in j["searches"][0]


def test_interleaved_rounds_and_searches_alternate_and_span_calls(tmp_path, monkeypatch):
    # The order and the joining are this script's; the bench client's and the search's own
    # parts run for real in test_one_bench_client_process_serves_... and the CLI's tests.
    said: list[str] = []

    def theirs(srv, shape, *, concurrency, rate, n, seed, python, env, timeout_s, percentiles, procs):
        assert procs == 1  # (--bench-procs not given: one bench client a run)
        said.append(f"R{concurrency}")
        meets = concurrency <= 16
        # over its whole load alone the run reads worse: 16 misses there too
        steady = {"ttft_p99_ms": 1200.0, "itl_p99_ms": 5.0, "share_of_gaps": 0.7}
        return {"percentiles_ms": {"p99_ttft_ms": 500.0 if meets else 1500.0}, "output_tps": 1.0,
                "ttft_p99_ms": 1.0, "itl_p99_ms": 1.0, "steady": steady}

    def search(srv, shape, slo, *, rate, extra, python, env, timeout_s, keep_records):
        said.append("S")
        t = time.time()
        time.sleep(0.01)  # the rounds around it are stamped with the same clock
        return {"answer": 16, "started_at": t, "ended_at": time.time(), "wall_s": 0.01}

    monkeypatch.setattr(T, "run_theirs", theirs)
    monkeypatch.setattr(T, "run_search", search)
    common = ["--url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", "t", "--slo", "ttft_p99=1000ms",
              "--only", "concurrency", "--concurrency", "16", "32", "--interleave"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert T.main([*common, "--rounds", "2", "--searches", "2", "--json", str(one)]) == 0
    assert T.main([*common, "--rounds", "1", "--searches", "0", "--bracket-from", str(one), "--json", str(two)]) == 0
    assert said == ["R16", "R32", "S", "R16", "R32", "S", "R16", "R32"]
    out = tmp_path / "judged.json"
    assert T.main(["--judge-only", "--bracket-from", str(one), "--bracket-from", str(two), "--json", str(out)]) == 0
    m = json.loads(out.read_text())["modes"]["concurrency"]
    assert len(m["runs"]) == 6 and len(m["searches"]) == 2
    assert (m["bracket"]["low"], m["bracket"]["high"]) == (16, 32)
    assert (m["steady_bracket"]["low"], m["steady_bracket"]["high"]) == (None, 16)
    assert T.steady_meets({"ttft_p99_ms": 900.0}, parse_slo(["ttft_p99=1s"])) is True
    assert T.steady_meets({"ttft_p99_ms": 900.0}, parse_slo(["ttft_p99=1s", "e2e_p99=5s"])) is None
    assert [s["local_verdict"] for s in m["searches"]] == ["inside", "inside"]
    # each search's local bracket is from one round before it and one after it
    assert all(s["local_bracket"]["low"] == 16 and s["local_bracket"]["high"] == 32 for s in m["searches"])
    first, second = m["searches"]  # the rounds count on across calls: 0, search, 1, search, 2
    assert sorted(r["round"] for r in m["runs"]) == [0, 0, 1, 1, 2, 2]
    assert max(r["ended_at"] for r in m["runs"] if r["round"] == 0) <= first["started_at"]
    assert first["ended_at"] <= min(r["started_at"] for r in m["runs"] if r["round"] == 1)
    assert max(r["ended_at"] for r in m["runs"] if r["round"] == 1) <= second["started_at"]
    assert second["ended_at"] <= min(r["started_at"] for r in m["runs"] if r["round"] == 2)


def test_alternate_options_go_to_every_second_search_and_are_recorded(tmp_path, monkeypatch, capsys):
    # An A/B on one server (e.g. --resolution 0 against the default): the searches take turns.
    given: list[list[str]] = []

    def search(srv, shape, slo, *, rate, extra, python, env, timeout_s, keep_records):
        given.append(list(extra))
        t = time.time()
        return {"answer": 16, "started_at": t, "ended_at": t, "wall_s": 0.0}

    monkeypatch.setattr(T, "run_search", search)
    out = tmp_path / "ab.json"
    assert T.main(["--url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", "t", "--slo", "ttft_p99=1000ms",
                   "--only", "concurrency", "--concurrency", "16", "--interleave", "--rounds", "0", "--searches", "3",
                   "--alternate", "--resolution 0", "--json", str(out), "--", "--start-concurrency", "16"]) == 0
    base = ["--start-concurrency", "16"]
    assert given == [base, [*base, "--resolution", "0"], base]
    searches = json.loads(out.read_text())["modes"]["concurrency"]["searches"]
    assert [s["search_args"] for s in searches] == given
    assert "our search 2 (with --resolution 0)" in capsys.readouterr().out


def test_an_open_loop_search_is_found_only_among_the_capacity_options():
    help_text = subprocess.run([sys.executable, "-m", "ernie_tui", "probe", "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert T.search_offers_rate(help_text)  # --rate is declared with the capacity options
    # a CLI whose --rate is the burst's alone offers no open-loop search
    assert not T.search_offers_rate("capacity search (--capacity):\n  --start-concurrency C  first level\n"
                                    "burst:\n  --rate R  requests a second\n")


@pytest.fixture
def tiny_tokenizer(tmp_path):
    from ernie_tui.demo_model import write_demo_model

    write_demo_model(tmp_path / "tiny", "tiny")
    return tmp_path / "tiny"


@pytest.mark.vllm  # runs vLLM's bench client (imports vLLM, ~20 s a run on 2 cores); no vLLM server
def test_agreement_bench_on_the_paced_stand_in(tmp_path, tiny_tokenizer):
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "4", "--ttft-ms", "20", "--itl-ms", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = srv.stdout.readline().split()[-1]
        out = tmp_path / "agree.json"
        rc = A.main(["--url", url, "--tokenizer", str(tiny_tokenizer), "--concurrency", "2", "--rounds", "1",
                     "--waves", "3", "--input-len", "20", "--output-len", "8", "--json", str(out),
                     "--variant", "busy=--metrics-interval 0.01"])
        assert rc == 0
        d = json.loads(out.read_text())
        (lv,) = d["levels"]
        runs = lv["runs"]
        assert len(runs["ours"]) == 1 and len(runs["theirs"]) == 1 and len(runs["busy"]) == 1
        # The variant's options reached its burst: it scraped /metrics every 10 ms where ours takes one
        # at the start (the default is one a second; this run lasts ~0.2 s); and it is compared with the
        # bench client as ours is.
        busy, ours = runs["busy"][0], runs["ours"][0]
        assert busy["client"]["metrics_samples"] >= 4 * ours["client"]["metrics_samples"] >= 4, (busy, ours)
        assert busy["completed"] == 6 and lv["variants"]["busy"]["args"] == ["--metrics-interval", "0.01"]
        assert lv["variants"]["busy"]["figures"]["output_tps"]["ratio"] is not None
        # The load each arm kept, by Little's law: 2 in flight at the client, the same at the server and
        # in its slots (4 slots: no queue), a little under 2 for the ramp and drain of a 6-request run.
        for who in ("ours", "busy", "theirs"):
            r = runs[who][0]
            client, server, engine = r["in_flight_mean"], r["referee"]["server_in_flight"], \
                r["referee"]["engine_running"]
            assert 1.2 < client <= 2.05 and 0.8 * client < server <= client * 1.05, (who, client, server)
            assert 0.85 * server < engine <= server * 1.02, (who, server, engine)
        assert "in flight: client " in A.phases(lv)
        assert "variant busy (--metrics-interval 0.01)" in A.format_level(lv)
        assert "variant `busy`" in A.markdown_level(lv)
        for who in ("ours", "theirs"):
            r = runs[who][0]
            assert r["completed"] == 6 and r["output_tps"] > 0
            # vLLM's side of the window (here the stand-in's): every generated token
            assert r["referee"]["generation_tokens"] >= r["output_tokens"]
            # and where its TTFT went, and the prompts it was given (20 +- 82 %: 4..36 tokens)
            ref = r["referee"]
            assert 0 <= ref["queue_mean_ms"] and 20 <= ref["prefill_mean_ms"] <= ref["ttft_p99_ms"]
            # 6 prompts, plus a warm-up of 2 short ones (ours) or a test prompt (theirs)
            assert 6 * 3 <= ref["prompt_tokens"] <= 7 * 36 + 2 * 8, ref
        # Our referee is the burst's own window, after its warm-up: our requests only.
        assert runs["ours"][0]["referee"]["ttft_count"] == 6 and runs["ours"][0]["referee"]["after_warmup"]
        assert runs["theirs"][0]["referee"]["ttft_count"] >= 6
        # Both drew their output lengths from the same range (8 +- 82 %: 1..15).
        assert 1 <= runs["theirs"][0]["output_lens"]["min"] <= runs["theirs"][0]["output_lens"]["max"] <= 15
        assert lv["figures"]["output_tps"]["ratio"] is not None
        line = A.phases(lv)
        assert line.startswith("ours queue ") and "; theirs queue " in line and " - " not in line, line
    finally:
        srv.terminate()
        srv.wait(10)


@pytest.mark.vllm  # imports vLLM once for its bench client (~15 s on 2 cores); no vLLM server
def test_one_bench_client_process_serves_a_whole_bracket_taken_in_two_calls(tmp_path, tiny_tokenizer):
    """The bench client is kept in one process across runs (importing vLLM is
    most of a short run's time); a bad run says why and leaves it usable; a
    bracket written after every run and taken in two calls (one mode each)
    is joined by the search phase."""
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "4", "--ttft-ms", "20", "--itl-ms", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    A.close_workers()
    try:
        url = srv.stdout.readline().split()[-1]
        common = ["--url", url, "--model", "tiny", "--tokenizer", str(tiny_tokenizer), "--slo", "ttft_p99=1000ms",
                  "--rounds", "2", "--waves", "2", "--input-len", "20", "--output-len", "8", "--searches", "0"]
        conc, rate, joined = tmp_path / "bracket-concurrency.json", tmp_path / "bracket-rate.json", tmp_path / "j.json"
        assert T.main([*common, "--only", "concurrency", "--concurrency", "1", "2", "--json", str(conc)]) == 0
        (worker,) = A._workers.values()
        pid = worker._proc.pid
        assert T.main([*common, "--only", "rate", "--rate", "4", "--rate-seconds", "1", "--json", str(rate)]) == 0
        # six bench runs, one process
        assert [w._proc.pid for w in A._workers.values()] == [pid] and worker.alive()
        c = json.loads(conc.read_text())["modes"]["concurrency"]
        assert [r["level"] for r in c["runs"]] == [1, 1, 2, 2] and all(r["completed"] == 2 * r["level"]
                                                                        for r in c["runs"])
        # vLLM's detailed result carries per-request times: each run is read over its whole load too
        assert all(r["steady"]["gaps"] >= 0 and "itl_p99_ms" in r["steady"] for r in c["runs"])
        # and vLLM's /metrics over each run, the referee: every request seen, and its wait in the queue
        assert all(r["referee"]["ttft_count"] >= r["completed"] and r["referee"]["queue_mean_ms"] is not None
                   for r in c["runs"])
        # and the server's processes' CPU over each run (it is on this machine): the stand-in's own
        assert all(r["server_cpu"] and r["server_cpu"][0]["pid"] == srv.pid for r in c["runs"]), c["runs"][0]
        assert "rate" not in json.loads(conc.read_text())["modes"]
        # the search phase reads both files as one bracket
        assert T.main([*common, "--bracket-from", str(conc), "--bracket-from", str(rate), "--json", str(joined)]) == 0
        j = json.loads(joined.read_text())["modes"]
        assert j["concurrency"]["levels"] == [1, 2] and j["rate"]["levels"] == [4.0]
        assert j["concurrency"]["bracket"]["low"] == 2  # the stand-in meets a 1 s TTFT at 2 of 4 slots
        # a run that fails inside vLLM's bench client: its traceback comes back, the process stays for the next run
        with pytest.raises(RuntimeError, match=r"(?s)bench client failed \(1\).*Traceback"):
            A.run_theirs(A.Server(url, "tiny", str(tiny_tokenizer)), A.Shape(20, 8, 0.8182), concurrency=-1,
                         rate=None, n=2, seed=1, python=sys.executable, env=dict(__import__("os").environ),
                         timeout_s=120)
        rc, said = worker.run(["--no-such-flag"], 60)
        assert rc == 2 and "unrecognized arguments: --no-such-flag" in said
        assert worker.alive() and worker._proc.pid == pid
    finally:
        A.close_workers()
        srv.terminate()
        srv.wait(10)


@pytest.mark.vllm  # runs vLLM's bench client twice over (imports vLLM in each)
def test_a_bench_run_split_over_two_bench_clients_keeps_its_concurrency_and_pools_their_requests(tiny_tokenizer):
    # On an H200 one bench client's process sat at p90 86 % of a core at
    # 448-512 streams; a run split over K of them, each with C/K, is the
    # same load with K cores to read it.
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "8", "--ttft-ms", "20", "--itl-ms", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    A.close_workers()
    try:
        url = srv.stdout.readline().split()[-1]
        env = dict(__import__("os").environ)
        r = A.run_theirs(A.Server(url, "tiny", str(tiny_tokenizer)), A.Shape(20, 8, 0.8182), concurrency=4,
                         rate=None, n=24, seed=7, python=sys.executable, env=env, timeout_s=300, procs=2)
        assert len(A._workers) == 2  # two bench clients, each kept for the next split run
        assert r["bench_procs"] == 2 and r["completed"] == 24 and r["lengths_unlike_ours"] is None
        assert r["output_tokens"] > 0 and r["duration_s"] > 0 and r["output_tps"] > 0
        assert 20.0 <= r["ttft_p50_ms"] <= 200.0 and 4.0 <= r["itl_p50_ms"] <= 50.0, r
        assert {"p99_ttft_ms", "p99_itl_ms", "p99_e2el_ms", "p99_tpot_ms"} <= set(r["percentiles_ms"])
        assert r["steady"] is not None  # per-request times pooled on one clock
        # the server saw both clients, never more than 4 requests at once (2 + 2)
        with __import__("urllib.request").request.urlopen(url + "/requests", timeout=10) as resp:
            log = [e for e in json.loads(resp.read()) if e["end"] is not None]
        # (an end is logged just after the last bytes go out, when the client may already have sent
        # its next request: ends taken 10 ms early, so that race does not read as one more in flight)
        edges = sorted([(e["arrive"], 1) for e in log] + [(e["end"] - 0.01, -1) for e in log])
        level = peak = 0
        for _, d in edges:
            level += d
            peak = max(peak, level)
        assert len(log) == 24 and peak <= 4, peak
    finally:
        A.close_workers()
        srv.terminate()
        srv.wait(10)


def test_a_truth_call_cut_by_timeout_keeps_the_search_it_was_running(tmp_path, tiny_tokenizer):
    # The device call's `timeout` sends SIGTERM to the script's whole process
    # group. The running search died of it and the script with it: an H200
    # rate search cut that way left nothing. Now the search, in a session of
    # its own, gets one SIGTERM from the script, winds its level down and
    # prints the levels it measured; the script keeps them, unjudged.
    import os
    import signal
    from urllib.request import urlopen

    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "3", "--ttft-ms", "20", "--itl-ms", "20"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = tmp_path / "il.json"
    truth = None
    try:
        url = srv.stdout.readline().split()[-1]
        truth = subprocess.Popen([sys.executable, str(ROOT / "bench" / "capacity_truth.py"), "--url", url,
                                  "--model", "m", "--tokenizer", str(tiny_tokenizer), "--slo", "ttft_p90=2s",
                                  "--only",
                                  "concurrency", "--concurrency", "1", "--interleave", "--rounds", "0",
                                  "--searches", "1", "--input-len", "20", "--output-len", "8", "--json", str(out),
                                  "--", "--start-concurrency", "1"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
        # once two requests are in flight together the first level (one at a time) is done
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = json.loads(urlopen(url + "/requests", timeout=5).read())
            if any(b["arrive"] < (a["end"] or float("inf")) for a, b in zip(log, log[1:], strict=False)):
                break
            if truth.poll() is not None:
                pytest.fail(truth.communicate()[0])
            time.sleep(0.2)
        else:
            pytest.fail("the search never reached its second level")
        os.killpg(truth.pid, signal.SIGTERM)  # as `timeout` does
        said, _ = truth.communicate(timeout=90)
    finally:
        if truth is not None and truth.poll() is None:
            truth.kill()
        srv.terminate()
        srv.wait(10)
    assert truth.returncode == 143, said
    assert "cut short by SIGTERM" in said and f"ended by SIGTERM: {out} keeps" in said
    (search,) = json.loads(out.read_text())["modes"]["concurrency"]["searches"]
    assert search["cut_short"] and search["stop_reason"] == "cancelled"
    assert search["levels"][0]["concurrency"] == 1 and search["levels"][0]["passed"]
    # each level's figures ride along, to set beside the bench client's runs
    assert search["levels"][0]["ttft_p99_ms"] > 0 and search["levels"][0]["output_tps"] > 0
    # judged later, it gets no verdict of its own
    judged = T.judged_files([json.loads(out.read_text())], 0.1)["concurrency"]
    assert judged["searches"][0]["verdict"] == "cut short"


def test_a_search_past_its_timeout_is_ended_as_sigterm_ends_it(tmp_path, tiny_tokenizer):
    # --timeout used to kill the search (its levels lost); now it gets SIGTERM
    # and a minute to wind down, and its levels are kept, unjudged.
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", "3", "--ttft-ms", "20", "--itl-ms", "20"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = tmp_path / "il.json"
    try:
        url = srv.stdout.readline().split()[-1]
        rc = T.main(["--url", url, "--model", "m", "--tokenizer", str(tiny_tokenizer), "--slo", "ttft_p90=2s",
                     "--only", "concurrency", "--concurrency", "1", "--interleave", "--rounds", "0", "--searches",
                     "1", "--input-len", "20", "--output-len", "8", "--timeout", "12", "--json", str(out), "--",
                     "--start-concurrency", "1"])
    finally:
        srv.terminate()
        srv.wait(10)
    assert rc == 0
    (search,) = json.loads(out.read_text())["modes"]["concurrency"]["searches"]
    assert search["cut_short"] and search["verdict"] == "cut short" and search["levels"], search
    assert 12 <= search["wall_s"] < 12 + T.SEARCH_WIND_DOWN_S


def test_a_bench_runs_line_names_the_servers_busiest_processes():
    # eighteenth H200 run, the bench client at 512: one API server held at a core
    procs = [{"what": "API server 3", "pid": 1020, "cpu_pct": 103.8}, {"what": "engine core", "pid": 1016,
                                                                      "cpu_pct": 102.7}]
    assert T.server_cpu_note(procs) == "; server CPU: API server 3 104 %, engine core 103 %"
    assert T.server_cpu_note(None) == "" and T.server_cpu_note([]) == ""


def test_a_client_that_reads_its_streams_late_is_named_client_bound():
    # The H100 host's c128 level (2026-12-06): vLLM's own TTFT p50 for both
    # clients' requests 110-178 ms; ours read 5-11 ms after it, the bench client 40-60.
    def run(client_ms: float, vllm_ms: float) -> dict:
        return {"ttft_p50_ms": client_ms, "referee": {"ttft_p50_ms": vllm_ms}}
    lv = {"runs": {"ours": [run(121.6, 110.1), run(132.8, 127.9), run(147.6, 138.7)],
                   "theirs": [run(221.4, 174.2), run(237.2, 177.7), run(212.8, 164.9)]}}
    delay = A.client_delay_ms(lv)
    assert round(delay["ours"]) == 9 and round(delay["theirs"]) == 48
    note = A.client_bound_note(lv)
    assert note.startswith("CLIENT-BOUND: the bench client reads TTFT p50 48 ms after vLLM's own"), note
    assert "our burst 9 ms" in note
    text = A.format_level({**lv, "concurrency": 128, "rate": None, "n": 1024, "rounds": 3,
                           "figures": {f: A.summarize_figure([1.0], [1.0], g) for f, g in A.GOAL.items()},
                           "referee": {f: A.summarize_figure([1.0], [1.0], g) for f, g in A.GOAL.items()}})
    assert note in text and "TTFT p50 after vLLM's own (median over the rounds): ours 9 ms, theirs 48 ms" in text
    # A gap under the TTFT goal's 10 % of the late client's TTFT p50 (here 53 ms of 587) names nobody:
    # vLLM's histogram is interpolated within a bucket, and the goal allows that much.
    lv256 = {"runs": {"ours": [run(587.0, 449.6)], "theirs": [run(481.3, 396.8)]}}
    assert A.client_bound_note(lv256) == ""
    # Nor does one client alone, or runs without vLLM's view.
    alone = {"runs": {"ours": [run(100, 50)], "theirs": [{"ttft_p50_ms": 300, "referee": {}}]}}
    assert A.client_bound_note(alone) == ""


def test_a_tok_s_spread_is_split_into_the_servers_output_and_the_clients_reading():
    # Ours read what vLLM's counter made to 0.1 %, round by round; the counter itself moved 17 %.
    def run(client: float, counter: float) -> dict:
        return {"output_tps": client, "referee": {"output_tps": counter}}
    lv = {"runs": {"ours": [run(20540.7, 20561.0), run(19371.1, 19390.0), run(17232.0, 17248.0)],
                   "theirs": [run(18000.0, 20000.0), run(18000.0, 18000.0)],  # a reading 10 % off in one round
                   "alone": [run(100.0, 100.0)]}}
    split = A.spread_split(lv)
    made, read = split["ours"]
    assert abs(made - (20561.0 - 17248.0) / 19390.0) < 1e-9 and read < 0.001
    made, read = split["theirs"]
    assert abs(made - 2000.0 / 19000.0) < 1e-9 and abs(read - 0.1 / 0.95) < 1e-9
    assert "alone" not in split  # one round has no spread

