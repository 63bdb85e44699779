"""/metrics parsing against real vLLM scrapes, windows between snapshots,
renamed/missing metrics, and the chart samples."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ernie_tui.engine_ctl.load import metrics as M


@pytest.fixture(scope="module")
def cpu_scrape(fixtures_dir) -> str:
    return (fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.metrics").read_text()


@pytest.fixture(scope="module")
def gpu_scrape(fixtures_dir) -> str:
    return (fixtures_dir / "gpu-h200-vllm0.26.0" / "ok_block16_len4096.metrics").read_text()


def test_cpu_scrape_values(cpu_scrape):
    s = M.MetricsSnapshot.parse(cpu_scrape, timestamp=100.0)
    assert s.prompt_tokens == 144
    assert s.generation_tokens == 2400
    assert s.requests_finished == 24  # summed over finished_reason labels
    assert s.running == 0 and s.waiting == 0
    assert s.kv_cache_usage_pct == 0.0
    assert s.process_rss_bytes == pytest.approx(639905792)
    cc = s.cache_config()
    assert cc.kv_cache_size_tokens == 65536  # the log says "CPU KV cache size: 65,536 tokens"
    assert cc.block_size == 32
    assert cc.num_gpu_blocks == 2048
    assert cc.kv_cache_memory_bytes == 64 * 2**20
    assert cc.kv_cache_max_concurrency == 32.0
    assert cc.num_cpu_blocks is None  # "None" label
    assert cc.enable_prefix_caching is True


def test_cpu_scrape_histograms(cpu_scrape):
    s = M.MetricsSnapshot.parse(cpu_scrape, timestamp=0.0)
    ttft = s.histogram(M.TTFT)
    assert ttft.count == 24
    assert ttft.mean == pytest.approx(0.22730255126953125 / 24)
    # buckets: <=0.005: 8, <=0.01: 16, <=0.02: 20, <=0.04: 24
    assert ttft.quantile(0.5) == pytest.approx(0.0075)  # 0.005 + 0.005 * (12 - 8) / 8
    assert ttft.quantile(0.9) == pytest.approx(0.028)  # 0.02 + 0.02 * (21.6 - 20) / 4
    assert ttft.quantile(0.0) == pytest.approx(0.001)  # lower edge of the first non-empty bucket
    itl = s.histogram(M.ITL)
    assert itl.count == 2376 and itl.mean == pytest.approx(3.8654683060003663 / 2376)
    e2e = s.histogram(M.E2E)
    assert e2e.count == 24 and e2e.mean == pytest.approx(4.085172653198242 / 24)


def test_gpu_scrape_without_type_lines(gpu_scrape):
    # The 0.26 GPU excerpt has no HELP/TYPE lines: the parser makes untyped
    # families, and lookups by sample name must still work.
    s = M.MetricsSnapshot.parse(gpu_scrape, timestamp=0.0)
    assert s.prompt_tokens == 51425
    assert s.generation_tokens == 38672
    cc = s.cache_config()
    assert cc.kv_cache_size_tokens == 7421344
    assert cc.num_gpu_blocks == 463834 and cc.block_size == 16
    assert cc.gpu_memory_utilization == 0.92
    assert cc.kv_cache_memory_bytes is None
    assert s.kv_cache_usage_pct == 0.0
    # Not in the excerpt: None, never an exception.
    assert s.running is None and s.waiting is None
    assert s.histogram(M.TTFT) is None


def test_old_names_and_derived_kv_tokens():
    text = (
        '# TYPE vllm:gpu_cache_usage_perc gauge\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        'vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.1\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n'
    )
    s = M.MetricsSnapshot.parse(text, timestamp=0)
    assert s.kv_cache_usage_pct == pytest.approx(25.0)
    assert s.histogram(M.ITL).count == 4
    assert s.cache_config().kv_cache_size_tokens == 1600  # blocks * block size when the label is missing


def test_missing_everything():
    s = M.MetricsSnapshot.parse("", timestamp=0)
    assert s.prompt_tokens is None and s.kv_cache_usage_pct is None and s.cache_config() is None
    assert s.histogram(M.TTFT) is None
    empty = M.MetricsSnapshot.parse("", timestamp=1)
    assert M.counter_rate(s, empty, M.GENERATION_TOKENS) is None and M.histogram_delta(s, empty, M.TTFT) is None


def test_malformed_lines_are_skipped():
    text = (
        'vllm:num_requests_running{model_name="m"} 3\n'
        'this is { not prometheus\n'
        'vllm:num_requests_waiting{model_name="m"} 2 garbage x\n'
        'vllm:generation_tokens_total{model_name="m"} 10\n'
    )
    s = M.MetricsSnapshot.parse(text, timestamp=0)
    assert s.running == 3
    assert s.generation_tokens == 10
    assert s.waiting is None


def _scrape(gen: float, prompt: float, ttft_buckets: list[tuple[str, float]], ttft_sum: float,
            kv: float = 0.5, running: float = 2, engine_count: int = 1) -> str:
    lines = ["# TYPE vllm:generation_tokens counter", "# TYPE vllm:time_to_first_token_seconds histogram"]
    for e in range(engine_count):
        lab = f'engine="{e}",model_name="m"'
        lines.append(f"vllm:generation_tokens_total{{{lab}}} {gen}")
        lines.append(f"vllm:prompt_tokens_total{{{lab}}} {prompt}")
        lines.append(f"vllm:kv_cache_usage_perc{{{lab}}} {kv + e * 0.1}")
        lines.append(f"vllm:num_requests_running{{{lab}}} {running}")
        lines.append(f"vllm:num_requests_waiting{{{lab}}} 0")
        for le, c in ttft_buckets:
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {c}')
        lines.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {ttft_sum}")
        lines.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {ttft_buckets[-1][1]}")
    return "\n".join(lines) + "\n"


def test_window_rates_and_histogram_delta():
    a = M.MetricsSnapshot.parse(_scrape(100, 1000, [("0.1", 5), ("1", 10), ("+Inf", 10)], 2.0), timestamp=10.0)
    b = M.MetricsSnapshot.parse(_scrape(500, 3000, [("0.1", 9), ("1", 20), ("+Inf", 20)], 6.0), timestamp=14.0)
    assert M.elapsed(a, b) == 4.0
    assert M.counter_rate(a, b, M.GENERATION_TOKENS) == pytest.approx(100.0)
    assert M.counter_rate(a, b, M.PROMPT_TOKENS) == pytest.approx(500.0)
    # window histogram: <=0.1: 4, <=1: 10, mean (6-2)/10
    ttft = M.histogram_delta(a, b, M.TTFT).summary()
    assert ttft["count"] == 10
    assert ttft["mean"] == pytest.approx(0.4)
    assert ttft["p50"] == pytest.approx(0.1 + 0.9 * (5 - 4) / 6)


def test_window_over_restart_gives_none():
    a = M.MetricsSnapshot.parse(_scrape(500, 3000, [("0.1", 9), ("+Inf", 20)], 6.0), timestamp=0.0)
    b = M.MetricsSnapshot.parse(_scrape(10, 20, [("0.1", 1), ("+Inf", 1)], 0.1), timestamp=5.0)
    assert M.counter_rate(a, b, M.GENERATION_TOKENS) is None
    assert M.histogram_delta(a, b, M.TTFT) is None


def test_quantile_in_inf_bucket_and_empty():
    h = M.Histogram(((0.5, 1.0), (1.0, 1.0), (float("inf"), 10.0)), 50.0, 10.0)
    assert h.quantile(0.99) == 1.0  # beyond the last finite bound: report that bound
    assert M.Histogram(((1.0, 0.0), (float("inf"), 0.0)), 0.0, 0.0).quantile(0.5) is None
    with pytest.raises(ValueError):
        h.quantile(1.5)


def test_multiple_engines_are_summed_and_kv_is_the_fullest():
    s = M.MetricsSnapshot.parse(_scrape(100, 10, [("1", 2), ("+Inf", 2)], 1.0, kv=0.5, running=3, engine_count=2),
                        timestamp=0)
    assert s.generation_tokens == 200
    assert s.running == 6
    assert s.kv_cache_usage_pct == pytest.approx(60.0)
    assert s.histogram(M.TTFT).count == 4


def test_model_name_filter():
    text = ('vllm:num_requests_running{model_name="a"} 1\n'
            'vllm:num_requests_running{model_name="b"} 5\n')
    assert M.MetricsSnapshot.parse(text, timestamp=0, model_name="a").running == 1
    assert M.MetricsSnapshot.parse(text, timestamp=0).running == 6


def test_only_filter_keeps_named_metrics(cpu_scrape):
    s = M.MetricsSnapshot.parse(cpu_scrape, timestamp=0, only=M.LIVE_METRICS)
    assert s.generation_tokens == 2400 and s.kv_cache_usage_pct == 0.0
    assert s.histogram(M.TTFT) is None  # not asked for


def test_first_sample_has_no_rate():
    s = M.derive_sample(None, M.MetricsSnapshot.parse(_scrape(10, 10, [("+Inf", 0)], 0), timestamp=0))
    assert s.generation_tps is None and s.running == 2


def test_metrics_url():
    assert M.metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert M.metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert M.metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"


class _Handler(BaseHTTPRequestHandler):
    body = b""
    status = 200
    seen_auth: list = []

    def do_GET(self):  # noqa: N802
        type(self).seen_auth.append(self.headers.get("Authorization"))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def test_client_fetches_and_reports_errors(cpu_scrape):
    _Handler.body = cpu_scrape.encode()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with M.MetricsClient(url, api_key="sekret") as c:
            snap = c.fetch()
            assert snap.cache_config().kv_cache_size_tokens == 65536
            assert _Handler.seen_auth[-1] == "Bearer sekret"
        _Handler.status = 500
        with M.MetricsClient(url) as c:
            with pytest.raises(M.MetricsError, match="HTTP 500") as err:
                c.fetch()
            assert err.value.reason == "HTTP 500"  # the few words a status line shows
            assert c.try_fetch() is None
    finally:
        _Handler.status = 200
        srv.shutdown()
        srv.server_close()
    with M.MetricsClient(url, timeout=1.0) as c:  # nothing listens there now
        with pytest.raises(M.MetricsError, match="cannot connect") as err:
            c.fetch()
        assert err.value.reason == "connection refused"
