"""The paced stand-in's /metrics as a traffic capture reads them: length
histograms with vLLM's bounds up to max_model_len, and (--prefix-block) a
prefix cache counted in whole blocks that spares the cached tokens' prefill."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ernie_tui.engine_ctl.load import from_metrics  # noqa: E402
from ernie_tui.engine_ctl.load import metrics as M  # noqa: E402
from paced_server import block_hits, length_buckets  # noqa: E402


def test_length_buckets_follow_max_model_len_as_vllms_do():
    assert length_buckets(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert length_buckets(16384)[-3:] == [2000, 5000, 10000]
    assert length_buckets(100) == [1, 2, 5, 10, 20, 50, 100]


def test_block_hits_count_the_whole_blocks_an_earlier_prompt_opened_with():
    seen: set[int] = set()
    assert block_hits(list(range(10)), 4, seen) == 0  # nothing before it
    assert block_hits(list(range(10)), 4, seen) == 8  # its two whole blocks; the 2 left over are not a block
    assert block_hits([0, 1, 2, 3, 4, 5, 9, 9, 8, 8], 4, seen) == 4  # the second block differs
    assert block_hits([9, 1, 2, 3, 4, 5, 6, 7], 4, seen) == 0  # a block counts only after the ones before it
    assert block_hits([0, 1, 2, 3, 4, 5, 9, 9, 8, 8, 8, 8], 4, seen) == 8  # the block the third prompt added


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "paced_server.py"), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("listening on "), line
    return proc, line.split()[-1]


def _send(url: str, prompt: str, max_tokens: int = 2) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def test_prefix_block_cache_on_metrics_and_in_the_prefill():
    proc, url = _start("--slots", "2", "--ttft-ms", "1", "--itl-ms", "1", "--prefix-block", "16",
                       "--prefill-ms-per-token", "0.5", "--max-model-len", "16384")
    try:
        with M.MetricsClient(url, timeout=10) as c:
            before = c.fetch()
            system = " ".join(f"s{i}" for i in range(1600))  # 100 blocks of 16
            _send(url, system + " first question here")
            _send(url, system + " another one")
            _send(url, " ".join(f"u{i}" for i in range(2500)), max_tokens=3)  # past the old 2,000 bound
            after = c.fetch()
        log = json.loads(urllib.request.urlopen(url + "/requests", timeout=10).read())
    finally:
        proc.terminate()
        proc.wait(10)
    assert after.cache_config() is not None and after.cache_config().block_size == 16
    assert M.counter_delta(before, after, M.PREFIX_QUERIES) == 1603 + 1602 + 2500
    assert M.counter_delta(before, after, M.PREFIX_HITS) == 1600  # the second prompt's 100 shared blocks
    # The first prompt's prefill is paid in full (1,603 x 0.5 ms); the second's
    # only for its 2 tokens past the cached blocks.
    first, second = (e["first"] - e["slot"] for e in log[:2])
    assert first >= 0.75
    assert second < 0.4
    prompts = M.histogram_delta(before, after, ("vllm:request_prompt_tokens",))
    assert prompts is not None and (2000.0, 2.0) in prompts.buckets and (5000.0, 3.0) in prompts.buckets
    cap = from_metrics(before, after)
    assert cap.prefix is not None and cap.prefix.hit_rate is not None
    assert abs(cap.prefix.hit_rate - 1600 / 5705) < 1e-3
