"""Probes and bursts against real vLLM (CPU build) with the tiny stand-in.

One server for the module, started here from argv in its own process group
(starts cost 30-60 s on 2 cores). The last test kills it mid-burst, which is
why this module does not borrow the session's shared server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.load import burst as B
from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load import probe as P

pytestmark = pytest.mark.vllm

READY_TIMEOUT = 300.0
MAX_MODEL_LEN = 2048


class VllmProcess:
    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = model_dir
        self.log_path = log_path
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", "tiny-ernie", "--host", "127.0.0.1", "--port", str(self.port),
                "--block-size", "32", "--max-model-len", str(MAX_MODEL_LEN),
                "--kv-cache-memory-bytes", "67108864", "--enforce-eager"]  # eager: see vllm_support.EAGER
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.pids: set[int] = {self.proc.pid}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; log tail:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.remember_tree()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {READY_TIMEOUT} s; log tail:\n{self.log_tail()}")

    def remember_tree(self) -> None:
        try:
            self.pids |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> list[int]:
        out = []
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def stop(self) -> None:
        self.remember_tree()
        self.kill_group(signal.SIGINT)
        deadline = time.monotonic() + 30
        while self.alive() and time.monotonic() < deadline:
            self.proc.poll()
            time.sleep(0.2)
        if self.alive():
            self.kill_group(signal.SIGKILL)
            for pid in self.alive():  # a child that left the group
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    from ernie_tui.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("probe-e2e")
    model_dir = root / "tiny-ernie"
    write_demo_model(model_dir, "tiny")
    server = VllmProcess(model_dir, root / "llm.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        left = server.alive()
        assert not left, f"vLLM processes left behind: {left}"


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


@pytest.mark.timeout(900)
def test_killing_the_server_mid_burst_ends_with_errors(vllm_server):
    """Runs last: it kills the module's server (SIGKILL to the whole group)."""
    killed = threading.Event()

    def on_progress(done: int, total: int) -> None:
        if done >= 3 and not killed.is_set():
            killed.set()
            vllm_server.remember_tree()
            vllm_server.kill_group(signal.SIGKILL)

    r = B.run_burst(vllm_server.url, B.BurstConfig(n=60, concurrency=4, max_tokens=128, read_timeout_s=30),
                    progress=on_progress)
    assert killed.is_set()
    assert 3 <= r.completed < 60
    assert r.errors["count"] == 60 - r.completed
    kinds = set(r.errors["by_kind"])
    assert kinds & {"disconnected", "connection_refused", "connect_error"}, r.errors
    assert "timeout" not in kinds, r.errors  # the dead server's requests ended at once, none waited out 30 s
    assert r.errors["first"], r.errors
    deadline = time.monotonic() + 30
    while vllm_server.alive() and time.monotonic() < deadline:
        vllm_server.proc.poll()
        time.sleep(0.2)
    assert not vllm_server.alive()
