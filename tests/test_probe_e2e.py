"""Probes and bursts against real vLLM (CPU build) with the tiny stand-in,
on the session's shared server (a start costs 30-60 s on 2 cores). A burst
whose server dies under it is test_server_e2e.py's lifecycle test.
"""

from __future__ import annotations

import time

import pytest

from ernie_tui.engine_ctl.load import burst as B
from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import probe as P

pytestmark = pytest.mark.vllm

MAX_MODEL_LEN = 2048


@pytest.fixture
def vllm_server(cpu_server):
    """The session's shared cpu-demo server (served as tiny-ernie, block 32,
    max_model_len 2048), idle: these tests compare vLLM's counters before and
    after their own requests, so a request an earlier test left decoding
    would count as theirs."""
    url = cpu_server.status.url
    deadline = time.monotonic() + 60
    last = None
    while time.monotonic() < deadline:
        with M.MetricsClient(url, timeout=30.0) as client:
            snap = client.fetch()
        now = (snap.running, snap.waiting, snap.total(M.GENERATION_TOKENS))
        if now[0] == 0 and now[1] == 0 and now == last:
            return cpu_server.status
        last = now
        time.sleep(0.5)
    raise AssertionError(f"the shared server is still busy after 60 s: running, waiting, tokens {last}")


@pytest.mark.timeout(600)
def test_probe_streams_and_counts_tokens_like_the_server(vllm_server):
    url = vllm_server.url
    before = M.MetricsClient(url).fetch()
    streamed: list[str] = []
    r = P.run_probe(url, "hello world the model", max_tokens=32, ignore_eos=True, on_text=streamed.append)
    assert r.ok, r.error
    assert r.model == "tiny-ernie"  # from /v1/models
    assert r.finish_reason == "length"
    assert r.prompt_tokens == 4  # word-level tokenizer: 4 words, 4 tokens
    assert r.completion_tokens == 32
    assert r.chunks >= 2 and r.got_done
    assert "".join(streamed) == r.text
    assert r.ttft_s is not None and 0 < r.ttft_s <= r.latency_s
    assert r.itl_mean_s is not None and r.itl_p90_s is not None and r.output_tps > 0
    after = M.MetricsClient(url).fetch()
    deadline = time.monotonic() + 60
    while M.counter_delta(before, after, M.GENERATION_TOKENS) != 32 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = M.MetricsClient(url).fetch()
    assert M.counter_delta(before, after, M.GENERATION_TOKENS) == 32  # vLLM's own count agrees
    cc = after.cache_config()
    assert cc.block_size == 32
    assert cc.kv_cache_size_tokens == cc.num_gpu_blocks * 32 > 0

    chat = P.run_probe(url, P.CHINESE_PROMPT, chat=True, max_tokens=8)
    assert chat.ok, chat.error
    assert chat.endpoint == "/v1/chat/completions" and chat.completion_tokens == 8 or chat.finish_reason == "stop"

    tok = P.find_tokenizer(url=url)  # /v1/models root -> the local tokenizer.json
    assert isinstance(tok, P.LocalTokenizer)
    long = P.run_probe(url, P.ready_prompt("long", tok), max_tokens=16)
    assert long.ok, long.error
    assert long.prompt_tokens == P.LONG_PROMPT_TOKENS  # exact, as the server counts it


@pytest.mark.timeout(600)
def test_prompt_too_long_gives_the_400_message(vllm_server):
    from ernie_tui.demo_model import prompt_words

    r = P.run_probe(vllm_server.url, prompt_words(MAX_MODEL_LEN + 1, seed=5), max_tokens=8)
    assert not r.ok
    assert r.error.kind == "prompt_too_long" and r.error.status == 400
    assert r.error.max_model_len == MAX_MODEL_LEN
    assert r.error.prompt_tokens == MAX_MODEL_LEN + 1
    assert "maximum context length is 2048" in r.error.message


@pytest.mark.timeout(900)
def test_burst_of_20_at_concurrency_4(vllm_server):
    progress: list[tuple[int, int]] = []
    cfg = B.BurstConfig(n=20, concurrency=4, sample_interval_s=0.1)  # max_tokens 128: a second or more
    r = B.run_burst(vllm_server.url, cfg, progress=lambda d, t: progress.append((d, t)),
                    memory_sampler=lambda: 123.0)
    assert r.total == 20 and r.completed == 20 and r.errors["count"] == 0, B.format_burst(r)
    assert len(r.requests) == 20 and all(q.ok for q in r.requests)
    assert progress[-1] == (20, 20)
    assert r.output_tokens == 20 * 128  # ignore_eos: every request makes max_tokens
    assert r.prompt_lengths_exact, r.warnings  # server usage == planned lengths
    assert sorted(q.prompt_tokens for q in r.requests) == sorted(B.plan_lengths(cfg))
    # Sampled, not asserted >= 1: on a starved 2-core box the engine can finish
    # each wave of 4 before the API server has streamed it, so every scrape
    # may land in an idle gap (tests/test_probe_sse.py checks the peaks).
    assert r.running_peak is not None and r.waiting_peak is not None
    assert r.kv_cache_usage_peak_pct is not None
    assert r.peak_memory_bytes == 123.0
    assert r.vllm is not None
    assert r.vllm.generation_tokens == r.output_tokens  # vLLM's counter agrees exactly
    assert r.vllm.ttft_count == 20
    assert r.comparison["output_tps_diff_pct"] == pytest.approx(0.0, abs=1e-9)
    for key in ("p50", "p90", "p99"):
        assert r.ttft[key] is not None
    assert r.itl["p50"] is not None and r.latency["p90"] is not None
