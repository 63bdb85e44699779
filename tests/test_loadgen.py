"""The load generator against vLLM's bench client's load: the arrival
schedule (load/arrivals.py), output lengths drawn as the bench client draws
them, the request body, open-loop bursts with late sends counted, and the
garbage collector kept out of a burst's way. Over HTTP against the paced
stand-in, whose /requests log shows the load it was sent."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import urllib.request
from itertools import islice
from pathlib import Path

import pytest

from ernie_tui.engine_ctl.load import arrivals as A
from ernie_tui.engine_ctl.load.arrivals import (
    arrival_offsets,
    arrival_stream,
    drawn_lengths,
    send_lag,
    vllm_bench_ranges,
)
from ernie_tui.engine_ctl.load.burst import BurstConfig, format_burst, run_burst

HERE = Path(__file__).resolve().parent


class PacedServer:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "paced_server.py"), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on "), line
        self.url = line.split()[-1]

    def requests(self, measured_only: bool = True) -> list[dict]:
        with urllib.request.urlopen(self.url + "/requests", timeout=10) as r:
            log = json.loads(r.read())
        # The warm-up requests ask for one token; the measured ones more.
        return [e for e in log if not measured_only or (e["max_tokens"] or 0) > 1]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def paced():
    servers: list[PacedServer] = []

    def start(*args: str) -> PacedServer:
        s = PacedServer(*args)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


# -- the schedule --------------------------------------------------------------------

def test_poisson_arrivals_are_seeded_exponential_and_end_at_n_over_rate():
    a = arrival_offsets(2000, 40.0, "poisson", seed=3)
    assert a == arrival_offsets(2000, 40.0, "poisson", seed=3)
    assert a != arrival_offsets(2000, 40.0, "poisson", seed=4)
    assert all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert a[-1] == pytest.approx(2000 / 40.0)  # rescaled, as vLLM's client does
    gaps = [a[0]] + [y - x for x, y in zip(a, a[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 40.0, rel=1e-9)
    cv = statistics.pstdev(gaps) / mean  # exponential: coefficient of variation 1
    assert 0.9 < cv < 1.1
    # burstiness > 1 is more even (gamma shape k: cv 1/sqrt(k))
    even = arrival_offsets(2000, 40.0, "poisson", seed=3, burstiness=4.0)
    g4 = [even[0]] + [y - x for x, y in zip(even, even[1:], strict=False)]
    assert 0.4 < statistics.pstdev(g4) / statistics.fmean(g4) < 0.6


def test_an_endless_stream_draws_one_long_legacy_gamma_draw_across_its_chunks():
    # vLLM's bench client draws all its gaps at once: np.random.gamma(shape, theta, size=n) after
    # np.random.seed(--seed). An open-loop capacity level cannot know n and draws in chunks; the
    # numbers must be the one long draw's, across chunk boundaries too (the legacy sampler keeps a
    # spare normal between calls), at every burstiness (each shape takes its own path through
    # numpy's sampler: exponential, Johnk-type, Marsaglia-Tsang), and for seeds over 32 bits.
    import numpy as np

    n = 3 * A._CHUNK + 17
    for seed in (0, 3, 2**31 + 7, 2**32 - 1):
        for shape in (1.0, 0.3, 2.0):
            np.random.seed(seed)
            want = np.cumsum(np.random.gamma(shape, 1 / (40.0 * shape), size=n)).tolist()
            got = list(islice(arrival_stream(40.0, "poisson", seed=seed, burstiness=shape), n))
            assert got == pytest.approx(want, rel=1e-12), (seed, shape)
    assert list(islice(arrival_stream(40.0, seed=2**32 + 5), 50)) == list(islice(arrival_stream(40.0, seed=5), 50))


def test_a_burst_and_vllms_bench_client_send_one_arrival_sequence_for_one_seed(monkeypatch):
    # vLLM's own schedule (its get_request, its gaps, sums and rescaling), read off a fake clock,
    # against ours for the same seed: an agreement run at a rate then compares the two clients,
    # not two draws of a Poisson process.
    serve = pytest.importorskip("vllm.benchmarks.serve")
    import asyncio

    import numpy as np

    for rate, burstiness, n, seed in ((80.0, 1.0, 800, 12345), (7.5, 0.5, 200, 99), (300.0, 4.0, 500, 7)):
        clock = [0.0]

        async def fake_sleep(dt, clock=clock):
            clock[0] += dt

        monkeypatch.setattr(serve.time, "time", lambda clock=clock: clock[0])
        monkeypatch.setattr(serve.asyncio, "sleep", fake_sleep)

        async def sent(rate=rate, burstiness=burstiness, n=n, clock=clock):
            return [clock[0] async for _ in serve.get_request(list(range(n)), rate, burstiness)]
        np.random.seed(seed)
        theirs = asyncio.run(sent())
        ours = arrival_offsets(n, rate, "poisson", seed=seed, burstiness=burstiness)
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)
        assert ours != pytest.approx(arrival_offsets(n, rate, "poisson", seed=seed + 1, burstiness=burstiness))


def test_constant_arrivals_and_bad_arguments():
    assert arrival_offsets(4, 2.0, "constant") == [0.5, 1.0, 1.5, 2.0]
    assert arrival_offsets(0, 2.0) == []
    for bad in (dict(rate=0.0), dict(rate=-1.0), dict(kind="burst")):
        with pytest.raises(ValueError):
            arrival_offsets(3, **{"rate": 1.0, "kind": "poisson", **bad})


def test_send_lag_counts_late_sends_and_skips_unsent_ones():
    lag = send_lag([0.0, 1.0, 2.0, 3.0], [0.001, 1.05, 2.0, None], threshold_s=0.01)
    assert (lag.count, lag.late) == (3, 1)
    assert lag.max_s == pytest.approx(0.05)


def test_the_bench_clients_range_ratio_applies_to_output_lengths_too():
    # vLLM's random dataset: uniform in [floor(L(1-r)), ceil(L(1+r))] for input
    # and output alike, so `--random-output-len 128 --random-range-ratio 0.8182`
    # asks for 23..233 tokens, not 128 each.
    assert vllm_bench_ranges(165, 128, 0.8182) == (29, 301, 23, 233)
    assert vllm_bench_ranges(128, 128, 0.0) == (128, 128, 128, 128)
    ins, lens = drawn_lengths(5000, (29, 301), (23, 233), seed=1)
    assert min(lens) == 23 and max(lens) == 233
    assert statistics.fmean(lens) == pytest.approx(128, abs=3)
    assert min(ins) == 29 and max(ins) == 301
    with pytest.raises(ValueError):
        drawn_lengths(3, (0, 5), (1, 1))
    with pytest.raises(ValueError, match="seed must be >= 0"):  # numpy's default_rng takes none below 0
        BurstConfig(seed=-1).validate()


def _vllms_lengths(seed: int, n: int, ratio: float, input_len: int, output_len: int):
    """The prompt and output lengths vLLM's random dataset draws (its own
    get_sampling_params) for `--seed seed`, with a tokenizer adding no
    special tokens, as numpy arrays."""
    utils = pytest.importorskip("vllm.benchmarks.datasets.utils")
    import numpy as np

    class Tok:
        def num_special_tokens_to_add(self) -> int:
            return 0

        vocab_size = 1000

    ins, outs, _ = utils.get_sampling_params(np.random.default_rng(seed), n, ratio, input_len, output_len, Tok())
    return ins, outs


@pytest.mark.vllm  # imports vLLM (~20 s on 2 cores), no server
def test_our_ranges_equal_vllms_own_sampler():
    ins, outs = _vllms_lengths(0, 20000, 0.8182, 165, 128)
    lo_in, hi_in, lo_out, hi_out = vllm_bench_ranges(165, 128, 0.8182)
    assert (int(ins.min()), int(ins.max()), int(outs.min()), int(outs.max())) == (lo_in, hi_in, lo_out, hi_out)


@pytest.mark.vllm  # imports vLLM (~20 s on 2 cores), no server
def test_a_burst_asks_for_the_lengths_vllms_random_dataset_draws_for_one_seed():
    # vLLM's bench client with --seed S draws its requests' prompt and output lengths from
    # np.random.default_rng(S) (get_sampling_params). Before, our --seed drew other lengths (Python's
    # random), so at one concurrency the two clients' rounds differed in their output lengths, and
    # the TTFT tail followed them. Now --seed S asks for its lengths, request by request.
    import numpy as np

    from ernie_tui.engine_ctl.load import burst as B

    for n, seed, ratio, (i, o) in ((800, 12345, 0.8182, (165, 128)), (37, 7, 0.5, (1000, 64)), (5, 0, 0.0, (32, 8))):
        ins, outs = _vllms_lengths(seed, n, ratio, i, o)
        lo_in, hi_in, lo_out, hi_out = vllm_bench_ranges(i, o, ratio)
        cfg = BurstConfig(n=n, min_tokens=lo_in, max_tokens_in=hi_in, max_tokens=hi_out,
                          min_output_tokens=lo_out, seed=seed)
        assert B.plan_lengths(cfg) == ins.tolist()
        assert B.plan_output_lengths(cfg) == outs.tolist()
    # Without drawn output lengths every request asks for max_tokens, and the prompt lengths are the same draw.
    cfg = BurstConfig(n=50, min_tokens=10, max_tokens_in=90, max_tokens=16, seed=3)
    assert B.plan_output_lengths(cfg) == [16] * 50
    assert B.plan_lengths(cfg) == np.random.default_rng(3).integers(10, 91, size=50).tolist()


# -- what a burst sends ----------------------------------------------------------------

SHAPE = dict(min_tokens=10, max_tokens_in=30)


def test_a_burst_sends_the_bench_clients_body_no_sampling_settings(paced):
    # Before: temperature 0.7 and top_p 0.9 on every burst request, where vLLM's
    # bench client sends none; on vLLM a top_p below 1 sorts the vocabulary at
    # every decode step, a heavier load at the same concurrency.
    srv = paced("--slots", "4", "--ttft-ms", "5", "--itl-ms", "2")
    r = run_burst(srv.url, BurstConfig(n=8, concurrency=4, max_tokens=6, **SHAPE))
    assert r.completed == 8, format_burst(r)
    log = srv.requests()
    assert len(log) == 8
    for e in log:
        assert e["sampling"] == {}
        assert e["ignore_eos"] is True and e["max_tokens"] == 6
        assert e["stream_options"] == {"include_usage": True}
    # Asked for, they are sent.
    srv2 = paced("--slots", "4", "--ttft-ms", "5", "--itl-ms", "2")
    run_burst(srv2.url, BurstConfig(n=4, concurrency=4, max_tokens=6, temperature=0.7, top_p=0.9, **SHAPE))
    assert all(e["sampling"] == {"temperature": 0.7, "top_p": 0.9} for e in srv2.requests())


def _max_arrivals_within(times: list[float], window: float) -> int:
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_equal_output_lengths_refill_in_waves_drawn_lengths_do_not(paced):
    # A closed loop whose requests all ask for the same length: the C slots
    # end together and are refilled together, in waves of C sends at once
    # (after the first wave, where all C start by design). vLLM's bench client
    # draws the lengths (--random-range-ratio), so its refills spread out.
    c = 8
    n = 5 * c
    srv = paced("--slots", str(c), "--ttft-ms", "10", "--itl-ms", "10")
    fixed = run_burst(srv.url, BurstConfig(n=n, concurrency=c, max_tokens=30, **SHAPE))
    assert fixed.completed == n, format_burst(fixed)
    starts = sorted(e["arrive"] for e in srv.requests())
    later = starts[c:]  # the refills
    assert _max_arrivals_within(later, 0.030) >= c - 2

    srv2 = paced("--slots", str(c), "--ttft-ms", "10", "--itl-ms", "10")
    drawn = run_burst(srv2.url, BurstConfig(n=n, concurrency=c, max_tokens=55, min_output_tokens=5, **SHAPE))
    assert drawn.completed == n, format_burst(drawn)
    log = srv2.requests(measured_only=False)
    measured = log[-n:]
    asked = [e["max_tokens"] for e in measured]
    assert min(asked) >= 5 and max(asked) <= 55 and len(set(asked)) > 5
    assert sorted(asked) == sorted(r.max_tokens for r in drawn.requests)
    assert drawn.output_tokens == sum(asked)
    later2 = sorted(e["arrive"] for e in measured)[c:]
    assert _max_arrivals_within(later2, 0.030) <= c // 2
    # Every slot stays busy: the closed loop refills at once (no late starts).
    ends = sorted(e["end"] for e in measured)
    gaps = []
    for e_end in ends[: -c]:
        nxt = min((e["arrive"] for e in measured if e["arrive"] >= e_end - 0.001), default=None)
        if nxt is not None:
            gaps.append(nxt - e_end)
    assert statistics.median(gaps) < 0.02


def test_an_open_loop_sends_on_schedule_whatever_is_still_running(paced):
    # 2 slots, each request ~0.3 s: a closed loop would keep 2 (or C) in
    # flight; the open loop sends on its schedule and the server's queue grows.
    srv = paced("--slots", "2", "--ttft-ms", "100", "--itl-ms", "20")
    # Late: over 0.25 s, a margin for a loaded 2-core box (where the OS alone
    # holds a process back ~0.1 s at times); the median lag must stay small.
    cfg = BurstConfig(n=16, concurrency=0, max_tokens=10, rate=20.0, arrivals="constant",
                      late_threshold_s=0.25, **SHAPE)
    r = run_burst(srv.url, cfg)
    assert r.completed == 16, format_burst(r)
    assert r.send_lag is not None and r.send_lag["late"] == 0 and r.send_lag["count"] == 16
    assert r.send_lag["p50_s"] < 0.02
    assert r.in_flight_peak > 4
    log = srv.requests()
    arrive = sorted(e["arrive"] for e in log)
    # Server-side arrivals 50 ms apart (constant 20/s), within a loaded box's slack.
    gaps = [b - a for a, b in zip(arrive, arrive[1:], strict=False)]
    assert statistics.median(gaps) == pytest.approx(0.05, abs=0.015)
    assert arrive[-1] - arrive[0] < 15 * 0.05 + 0.25  # not paced by completions (16 x 0.3 s / 2 slots = 2.4 s)
    assert "req/s (constant arrivals)" in format_burst(r)


def test_an_open_loop_with_a_cap_counts_the_sends_it_held_back_as_late(paced):
    srv = paced("--slots", "4", "--ttft-ms", "100", "--itl-ms", "20")
    cfg = BurstConfig(n=12, concurrency=2, max_tokens=10, rate=40.0, arrivals="poisson", arrival_seed=5, **SHAPE)
    r = run_burst(srv.url, cfg)
    assert r.completed == 12
    assert r.in_flight_peak == 2
    assert r.send_lag["late"] >= 6 and r.send_lag["max_s"] > 0.3
    assert any("concurrency cap held them" in w for w in r.warnings)


def test_open_loop_config_checks():
    BurstConfig(rate=1.0, concurrency=0).validate()
    for bad in (dict(rate=0.0), dict(rate=1.0, arrivals="bursty"), dict(concurrency=0),
                dict(min_output_tokens=200, max_tokens=128), dict(min_output_tokens=0)):
        with pytest.raises(ValueError):
            BurstConfig(**bad).validate()


def test_a_burst_freezes_the_heap_it_found_and_reports_its_own_stalls(paced):
    srv = paced("--slots", "4", "--ttft-ms", "5", "--itl-ms", "2")
    seen: list[int] = []
    r = run_burst(srv.url, BurstConfig(n=8, concurrency=4, max_tokens=4, **SHAPE),
                  on_request=lambda rec: seen.append(gc.get_freeze_count()))
    assert r.completed == 8
    assert min(seen) > 1000  # frozen while it ran
    assert gc.get_freeze_count() == 0  # and given back
    c = r.client
    assert c["gc_frozen_objects"] > 1000 and c["loop_lag_max_s"] is not None
    assert set(c["gc_collections"]) == {"0", "1", "2"}
    off = run_burst(srv.url, BurstConfig(n=4, concurrency=4, max_tokens=4, gc_freeze=False, **SHAPE))
    assert off.client["gc_frozen_objects"] == 0


def test_cli_burst_rate_and_drawn_output_lengths(paced, capsys):
    from ernie_tui.cli import main

    srv = paced("--slots", "4", "--ttft-ms", "5", "--itl-ms", "2")
    rc = main(["probe", "--url", srv.url, "--burst", "10", "--rate", "50", "--arrivals", "constant",
               "--min-tokens", "10", "--max-tokens-in", "20", "--max-tokens", "12", "--min-output-tokens", "4",
               "--metrics-interval", "2", "--no-save", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config"]["rate"] == 50 and d["config"]["concurrency"] == 0
    assert d["config"]["sample_interval_s"] == 2.0
    assert d["send_lag"]["count"] == 10
    asked = [e["max_tokens"] for e in srv.requests(measured_only=False)[-10:]]
    assert min(asked) >= 4 and max(asked) <= 12
    assert all(e["sampling"] == {} for e in srv.requests())


def test_cli_rate_belongs_to_a_burst_and_a_probe_keeps_its_sampling(capsys):
    from ernie_tui.cli import main

    rc = main(["probe", "--url", "http://127.0.0.1:9", "--rate", "5"])
    assert rc != 0
    assert "--rate belongs to --burst" in capsys.readouterr().err


def test_a_capacity_search_sends_the_bench_clients_load_by_default(tmp_path):
    # The search's built prompts carry drawn output lengths when asked (as the
    # bench client's range ratio draws them) and no sampling settings unless
    # given: on main the search sent temperature 0.7 / top_p 0.9 and equal lengths.
    from ernie_tui.demo_model import write_demo_model
    from ernie_tui.engine_ctl.load import request_setup
    from ernie_tui.engine_ctl.load.prompts import LocalTokenizer
    from ernie_tui.engine_ctl.load.workload import burst_workload

    write_demo_model(tmp_path / "m", "tiny")
    tok = LocalTokenizer(tmp_path / "m")
    cfg, settings = request_setup(min_tokens=5, max_tokens_in=9, max_tokens=40, min_output_tokens=8)
    assert settings.temperature is None and settings.top_p is None
    wl = burst_workload(cfg, tok, 60)
    outs = [i.max_tokens for i in wl.items]
    assert min(outs) >= 8 and max(outs) <= 40 and len(set(outs)) > 10
    assert "8-40 output tokens" in wl.source
    same, _ = request_setup(min_tokens=5, max_tokens_in=9, max_tokens=40)
    assert {i.max_tokens for i in burst_workload(same, tok, 20).items} == {40}


def test_a_burst_scrapes_metrics_once_a_second_not_four_times(paced):
    """vLLM's API server renders every /metrics scrape in the process that
    streams the tokens a burst times: at 4 scrapes a second the client's ITL
    p99 read 1.1-1.2x the bench client's on an H200 (vLLM's engine-clock
    histogram: equal), and on the paced stand-in (flat 5 ms ITL) p99 rose
    5.6 -> 6.3 ms (docs/lab/load-generator.md, row 14). A burst and a capacity level
    take one a second by default."""
    from ernie_tui.engine_ctl.load.capacity_run import RequestSettings

    assert BurstConfig().sample_interval_s == RequestSettings().sample_interval_s == 1.0
    srv = paced("--slots", "4", "--ttft-ms", "20", "--itl-ms", "20")
    r = run_burst(srv.url, BurstConfig(n=16, concurrency=4, max_tokens=30, **SHAPE))  # 4 waves of ~0.6 s
    assert r.completed == 16 and r.duration_s > 2.0
    samples = r.client["metrics_samples"]
    # The first at the start, then one a second (old default: one every 0.25 s, ~10 here).
    assert 1 <= samples <= r.duration_s + 2, (samples, r.duration_s)
    assert r.kv_cache_usage_peak_pct is not None and r.running_peak == 4


class _Poller:
    """The dashboard's chart sampler in small: scrapes the server every
    `interval` s into a LatestScrape, in its own thread, counting its scrapes."""

    def __init__(self, url: str, interval: float) -> None:
        import threading

        from ernie_tui.engine_ctl.load import LatestScrape, MetricsClient

        self.latest = LatestScrape()
        self.client = MetricsClient(url)
        self.url, self.interval, self.scrapes = url, interval, 0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.halt.is_set():
            snap = self.client.try_fetch()
            if snap is not None:
                self.scrapes += 1
                self.latest.put(self.url, snap)
            self.halt.wait(self.interval)

    def close(self) -> None:
        self.halt.set()
        self.thread.join(5)
        self.client.close()


def test_a_burst_reads_the_dashboards_scrapes_instead_of_scraping_again(paced):
    """A burst run from the dashboard's probe pane used to scrape /metrics
    once a second beside the chart sampler's own scrape: two renders a second
    in the process that streams the tokens being timed. Given the dashboard's
    scrapes (LatestScrape.feed), it takes its peaks from them and scrapes
    nothing while the load runs; the feed of another server leaves it to
    scrape for itself, and peaks are never lost."""
    srv = paced("--slots", "4", "--ttft-ms", "20", "--itl-ms", "20")
    poller = _Poller(srv.url, 0.5)
    try:
        # 6 waves of ~0.6 s: the burst's sampler looks once a second, at 0 (the
        # poller's snapshot from before the burst: not counted), 1, 2, 3.
        # The feed counts as fresh for 30 s, not 1.25: a busy box held the
        # poller's 0.5 s scrape back past 1.25 s and the burst rightly scraped
        # for itself once (staleness itself: the sampler tests above).
        shared = run_burst(srv.url, BurstConfig(n=24, concurrency=4, max_tokens=30, **SHAPE),
                           metrics_feed=poller.latest.feed(srv.url, max_age_s=30.0))
        other = run_burst(srv.url, BurstConfig(n=16, concurrency=4, max_tokens=30, **SHAPE),
                          metrics_feed=poller.latest.feed("http://127.0.0.1:9", max_age_s=1.25))
    finally:
        poller.close()
    assert shared.completed == 24 and shared.duration_s > 3.0
    assert shared.client["metrics_samples"] == 0, shared.client
    assert 2 <= shared.client["metrics_samples_shared"] <= shared.duration_s + 1, shared.client
    assert shared.kv_cache_usage_peak_pct is not None and shared.running_peak == 4
    assert other.client["metrics_samples_shared"] == 0
    assert 1 <= other.client["metrics_samples"] <= other.duration_s + 2, other.client
    assert other.running_peak == 4


def test_a_shared_scrape_counts_once_and_never_from_before_the_load():
    """While the feed is live its snapshots stand for the sampler's scrapes:
    one taken before the load began is not the load's (a queue left by the
    level before), and one is counted once (a mean of the waiting queue must
    not weigh one look twice). A feed with nothing fresh, or for another
    server, leaves the sampler to scrape for itself."""
    import time

    from ernie_tui.engine_ctl.load import LatestScrape, MetricsSnapshot
    from ernie_tui.engine_ctl.load.metrics import LoadScrapes

    def snap(waiting: int) -> MetricsSnapshot:
        return MetricsSnapshot.parse(f"vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n")

    own_scrapes = []

    class Client:
        def try_fetch(self, only=()):
            own_scrapes.append(only)
            return snap(0)

    def sampler(feed):
        return LoadScrapes(Client(), feed)

    latest = LatestScrape()
    latest.put("http://h:8000/v1", snap(50))  # the last level's queue, scraped before this load
    time.sleep(0.01)
    # Live for a minute: a stalled box can hold this thread past a few seconds between the lines.
    s = sampler(latest.feed("http://h:8000", max_age_s=60.0))
    assert s.next() is None and not own_scrapes  # live but old: wait for the next
    latest.put("http://h:8000", snap(7))
    assert s.next().waiting == 7 and s.shared == 1
    assert s.next() is None and s.shared == 1  # nothing new: nothing counted
    assert not own_scrapes and s.own == 0
    elsewhere = sampler(latest.feed("http://other:8000", max_age_s=5.0))
    assert elsewhere.next().waiting == 0 and elsewhere.own == 1
    stale = sampler(latest.feed("http://h:8000", max_age_s=0.0))
    time.sleep(0.01)
    assert stale.next().waiting == 0 and stale.own == 1  # too old: scrape our own
    assert len(own_scrapes) == 2


def test_a_capacity_levels_queue_mean_weighs_each_shared_scrape_once():
    """A capacity level's sampler reads the dashboard's scrapes as a burst's
    does; its mean waiting queue (the saturation check) takes each scrape
    once however often it looks, and it never scrapes while the feed is live."""
    import time

    from ernie_tui.engine_ctl.load import LatestScrape, MetricsSnapshot
    from ernie_tui.engine_ctl.load.capacity_run import _MetricsSampler

    class Client:
        scrapes = 0

        def try_fetch(self, only=()):
            Client.scrapes += 1
            return None

        def close(self):
            pass

    def snap(waiting: int) -> MetricsSnapshot:
        return MetricsSnapshot.parse(f"vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n")

    latest = LatestScrape()
    latest.put("http://h:8000", snap(99))  # the dashboard's, from before the level: live, not the level's
    time.sleep(0.01)
    # Live for a minute, as long as each scrape is waited for: a stalled box can hold the sampler seconds.
    sampler = _MetricsSampler(Client(), 0.005, feed=latest.feed("http://h:8000", max_age_s=60.0))
    sampler.start()
    for n, waiting in enumerate((2, 10, 30), 1):  # three scrapes, each looked at many times
        latest.put("http://h:8000", snap(waiting))
        # Until the sampler has taken this one (not a fixed 50 ms: a busy box
        # can hold its thread back longer), then a few more looks at it.
        deadline = time.monotonic() + 60
        while sampler.scrapes.shared < n and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
    sampler.stop()
    assert sampler.scrapes.shared == 3 and sampler.waiting_mean == pytest.approx(14.0)
    assert sampler.waiting_peak == 30 and Client.scrapes == 0


@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking-pipe", "non-blocking-pipe"])
def test_a_bursts_json_arrives_whole_through_a_full_pipe(paced, non_blocking):
    """On the H200 a burst's `--json` (~150 KB) reached the agreement bench
    with a hole at 64 KiB and exit status 0. After the burst's uvloop loop has
    run, a write into a full pipe can return short even in blocking mode, and
    print() dropped the rest; a pipe left non-blocking (the flag is the pipe's,
    shared by whoever holds it) lost the same way. The reader here waits until
    the pipe is full, as a busy reader does, and must still get every byte."""
    import fcntl
    import os
    import termios
    import time

    srv = paced("--slots", "32", "--ttft-ms", "2", "--itl-ms", "1")
    r, w = os.pipe()
    if non_blocking:
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    proc = subprocess.Popen([sys.executable, "-m", "ernie_tui", "probe", "--url", srv.url, "--model", "m",
                             "--burst", "300", "--concurrency", "32", "--min-tokens", "4", "--max-tokens-in", "8",
                             "--max-tokens", "8", "--no-save", "--json", "--timeout", "60"],
                            stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)

    def queued() -> int:
        return int.from_bytes(fcntl.ioctl(r, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)

    deadline = time.monotonic() + 60
    while queued() < 1 << 16 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the pipe is full: a writer that gives up has time to exit
    chunks = []
    while data := os.read(r, 1 << 16):
        chunks.append(data)
    os.close(r)
    rc = proc.wait(30)
    out = b"".join(chunks)
    assert rc == 0, proc.stderr.read()
    assert len(out) > 1 << 16, "the result should outgrow the pipe for this test to mean anything"
    d = json.loads(out)
    assert len(d["requests"]) == 300
