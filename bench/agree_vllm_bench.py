"""Does our burst put the same load on a server as vLLM's own bench client?

On one running vLLM server, at each fixed concurrency (closed loop) and each
fixed rate (open loop, Poisson), run our burst (`ernie-tui probe --burst`)
and vLLM's bench client (`vllm bench serve`, run from the installed vllm as
/work/shared/gpu/README.md shows) with the same prompt shape, interleaved
(who goes first alternates by round and flips from level to level, so
neither always opens a level; --warmup-run adds an unrecorded run), for --rounds
rounds; each run at concurrency C sends waves x C requests, so every slot is
refilled ~waves times. The arms of one round share one --seed, which draws
the bench client's prompt and output lengths and, at a rate, its arrival
times; our burst given the same --seed asks for the same lengths in the
same order and replays the same arrivals (engine_ctl.load.arrivals: numpy's
draws as vLLM's random dataset and get_request make them), so a round
compares the clients, not two draws of a workload. Each round draws a new
seed, and every run sends prompts never sent before (new words for ours,
the round's own seed for theirs): a prompt seen before comes from vLLM's
prefix cache.

The prompt shape is vLLM's random dataset's: `--random-input-len I
--random-output-len O --random-range-ratio R`, which draws prompt AND output
lengths uniformly (R applies to both: 128 +- 82 % is 23..233 output tokens);
our burst gets the same ranges (--min-tokens/--max-tokens-in,
--min-output-tokens/--max-tokens), with ignore_eos on both sides.

For each level it prints, per figure (output tok/s, TTFT p50/p99, ITL
p50/p99), each client's median over the rounds, its spread ((max - min) /
median) and the ratio ours / theirs, against the goal (tok/s within +-5 %,
latencies within +-10 %); the ratio round by round (a round's two runs
share one workload: a client that differs reads higher in every round,
a server's phases either way); and as referee, vLLM's own /metrics for each
client's windows (TTFT and ITL histogram quantiles, generation tokens over
the client's duration). Writes everything, runs included, to --json.

`--variant NAME='PROBE ARGS'` adds an arm: our burst with those options, in
the same interleaved rounds, compared with the bench client as ours is (a
suspected cause of a difference, measured side by side on one server).

    python bench/agree_vllm_bench.py --url http://127.0.0.1:8000 --tokenizer MODEL_DIR \\
        --concurrency 128 256 --rate 60 --rounds 3 --waves 8 --json agree.json

`python bench/agree_vllm_bench.py --report agree.json` prints a saved run's levels as
Markdown tables.

Needs vllm importable by --bench-python (default: this Python), for its
bench client; run with PYTHONPATH=src (ernie_tui) as the other bench scripts.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import queue
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ernie_tui.engine_ctl.load import (
    E2E,
    GENERATION_TOKENS,
    INFERENCE,
    ITL,
    PROMPT_TOKENS,
    QUEUE,
    TTFT,
    MetricsClient,
    counter_delta,
    drawn_lengths,
    histogram_delta,
    stats,
    vllm_bench_ranges,
)

# vLLM's prefill-phase histogram (v1); engine_ctl reads only the queue phase (QUEUE).
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)

from vb_source import BENCH_CLIENT  # noqa: E402  (`vllm bench serve` by its module, kept in one place)

# The same bench client kept in one process across runs: importing vllm costs it
# 10-20 s a run (15.5 s on the 2-core dev box, ~20 s of each 30-35 s run on the
# H200), which a bracket of 14 runs pays 14 times out of a lent GPU's time. Each
# run is still its own `main()` call (own session, dataset, seed, result file).
BENCH_WORKER = ("import sys, json, traceback\n"
                "from vllm.benchmarks.serve import add_cli_args, main\n"
                "from vllm.utils.argparse_utils import FlexibleArgumentParser as P\n"
                "for line in sys.stdin:\n"
                "    rc = 0\n"
                "    try:\n"
                "        p = P(); add_cli_args(p); main(p.parse_args(json.loads(line)))\n"
                "    except SystemExit as e:\n"
                "        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
                "    except BaseException:\n"
                "        traceback.print_exc(); rc = 1\n"
                "    sys.stderr.flush()\n"
                "    print('@@bench-worker-done@@', rc, flush=True)\n")
WORKER_DONE = "@@bench-worker-done@@"
# False: a fresh `python -c BENCH_CLIENT` per run (--bench-process-per-run).
KEEP_BENCH_PROCESS = True

FIGURES = ("output_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
# The goal: ours / theirs within these (fractions) on the median over rounds.
GOAL = {"output_tps": 0.05, "ttft_p50_ms": 0.10, "ttft_p99_ms": 0.10, "itl_p50_ms": 0.10, "itl_p99_ms": 0.10}


# -- pure parts (tests/test_agree_bench.py) -------------------------------------------

def spread(values: list[float]) -> float | None:
    """(max - min) / median: the round-to-round spread, as a fraction."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med else None


def summarize_figure(ours: list[float | None], theirs: list[float | None], goal: float) -> dict[str, Any]:
    """Median and spread of each client's rounds, the ratio of the medians
    (ours / theirs) and whether it is within the goal."""
    o = [x for x in ours if x is not None]
    t = [x for x in theirs if x is not None]
    mo = statistics.median(o) if o else None
    mt = statistics.median(t) if t else None
    ratio = mo / mt if mo is not None and mt else None
    so, st = spread(o), spread(t)
    return {"ours": ours, "theirs": theirs, "ours_median": mo, "theirs_median": mt,
            "ours_spread": so, "theirs_spread": st, "ratio": ratio, "goal": goal,
            "within_goal": None if ratio is None else abs(ratio - 1.0) <= goal + 1e-12,
            "spread_no_larger": None if so is None or st is None else so <= st + 1e-12}


def per_round(s: dict[str, Any]) -> tuple[list[float | None], int, int]:
    """A figure round by round: ours / theirs in each round (the two ran one
    workload, one after the other), and in how many of the rounds with both
    ours read higher. Server drift between rounds cancels in each pair: a
    client that differs shows on one side in every round, a server's phases
    on both sides."""
    ratios = [o / t if o is not None and t else None for o, t in zip(s["ours"], s["theirs"], strict=False)]
    known = [x for x in ratios if x is not None]
    return ratios, sum(1 for x in known if x > 1.0), len(known)


def figures_from_bench_json(d: dict[str, Any]) -> dict[str, Any]:
    """The five figures from vLLM's bench client's saved result."""
    def get(*keys: str) -> float | None:
        for k in keys:
            v = d.get(k)
            if isinstance(v, (int, float)):
                return float(v)
        return None
    return {"output_tps": get("output_throughput"),
            "ttft_p50_ms": get("p50_ttft_ms", "median_ttft_ms"), "ttft_p99_ms": get("p99_ttft_ms"),
            "itl_p50_ms": get("p50_itl_ms", "median_itl_ms"), "itl_p99_ms": get("p99_itl_ms"),
            "duration_s": get("duration"), "completed": get("completed"),
            "output_tokens": get("total_output_tokens"),
            "in_flight_mean": in_flight_mean(get("mean_e2el_ms"), get("completed"), get("duration"))}


def in_flight_mean(latency_mean_ms: float | None, completed: float | None, duration_s: float | None) -> float | None:
    """Requests in flight on average over a run (Little's law: the sum of the
    requests' latencies over the run's length). At a fixed concurrency C a
    client that keeps its slots full reads just under C; one slow to refill
    them (or whose server is slow to take them) reads lower."""
    if latency_mean_ms is None or not completed or not duration_s:
        return None
    return latency_mean_ms / 1000.0 * completed / duration_s


def steady_from_bench_detail(d: dict[str, Any]) -> dict[str, Any] | None:
    """The bench client's own requests, read over the part of its run in which
    the load was whole, as our capacity level reads its own: past a warm-up
    (every request sent before the first answer has ended) and before the
    drain (the last request sent; after it no slot is refilled and the load
    falls). TTFT over the requests sent in that span; ITL over every gap that
    ended in it. A run of 8 waves spends a share of its gaps in its opening
    burst and its drain, where prefill and decodes do not compete as they do
    in a steady load; this says what its figures are without them. None when
    the saved result has no per-request times (--save-detailed)."""
    starts, ttfts, itls = d.get("start_times"), d.get("ttfts"), d.get("itls")
    if not (isinstance(starts, list) and isinstance(ttfts, list) and isinstance(itls, list)) \
            or not starts or not len(starts) == len(ttfts) == len(itls):
        return None
    reqs = []  # (start, ttft, [token times])
    for t0, ttft, gaps in zip(starts, ttfts, itls, strict=True):
        if not isinstance(t0, (int, float)) or not isinstance(ttft, (int, float)) or ttft <= 0:
            continue  # a failed request
        times = [t0 + ttft]
        for g in gaps or []:
            times.append(times[-1] + g)
        reqs.append((t0, ttft, times))
    if len(reqs) < 2:
        return None
    first_end = min(times[-1] for _, _, times in reqs)
    warmup_end = max(times[-1] for t0, _, times in reqs if t0 < first_end)
    drain_at = max(t0 for t0, _, _ in reqs)
    ttft_in = [ttft for t0, ttft, _ in reqs if warmup_end <= t0 < drain_at]
    gaps_all = [(b, b - a) for _, _, times in reqs for a, b in zip(times, times[1:], strict=False)]
    gaps_in = [g for b, g in gaps_all if warmup_end < b < drain_at]  # a gap ending at warmup_end began in it

    def ms(xs: list[float], q: float) -> float | None:
        v = stats.percentile(xs, q)
        return None if v is None else v * 1000.0
    return {"span_s": max(0.0, drain_at - warmup_end), "warmup_s": warmup_end - min(t0 for t0, _, _ in reqs),
            "drain_s": max(times[-1] for _, _, times in reqs) - drain_at, "requests": len(ttft_in),
            "gaps": len(gaps_in), "share_of_gaps": len(gaps_in) / len(gaps_all) if gaps_all else 0.0,
            "ttft_p50_ms": ms(ttft_in, 50), "ttft_p99_ms": ms(ttft_in, 99),
            "itl_p50_ms": ms(gaps_in, 50), "itl_p99_ms": ms(gaps_in, 99)}


def figures_from_burst_json(d: dict[str, Any]) -> dict[str, Any]:
    """The five figures from our burst's JSON (`probe --burst --json`)."""
    def ms(block: str, key: str) -> float | None:
        v = (d.get(block) or {}).get(key)
        return None if v is None else float(v) * 1000.0
    return {"output_tps": d.get("output_tps"), "ttft_p50_ms": ms("ttft", "p50"), "ttft_p99_ms": ms("ttft", "p99"),
            "itl_p50_ms": ms("itl", "p50"), "itl_p99_ms": ms("itl", "p99"), "duration_s": d.get("duration_s"),
            "completed": d.get("completed"), "output_tokens": d.get("output_tokens"),
            "in_flight_mean": in_flight_mean(ms("latency", "mean"), d.get("completed"), d.get("duration_s"))}


# -- running the clients ----------------------------------------------------------------

@dataclass
class Shape:
    input_len: int = 165
    output_len: int = 128
    range_ratio: float = 0.8182

    def ranges(self) -> tuple[int, int, int, int]:
        return vllm_bench_ranges(self.input_len, self.output_len, self.range_ratio)


@dataclass
class Server:
    url: str
    model: str
    tokenizer: str


def referee(before, after, duration_s: float | None) -> dict[str, float | None]:
    """vLLM's /metrics over one window: histogram quantiles and the
    generation counter over the client's own duration."""
    if before is None or after is None:
        return {}
    ttft = histogram_delta(before, after, TTFT)
    itl = histogram_delta(before, after, ITL)
    gen = counter_delta(before, after, GENERATION_TOKENS)
    # Where a TTFT went, by vLLM's own clocks: waiting for the scheduler, or
    # in prefill; and the prompt tokens it was given (a different prompt
    # shape would show here first).
    queue = histogram_delta(before, after, QUEUE)
    prefill = histogram_delta(before, after, PREFILL_TIME)
    # The load each client kept on the server, by Little's law over its run:
    # request-seconds from arrival to finish (the API server's clock), and in
    # the engine (prefill + decode: what its log calls Running).
    e2e = histogram_delta(before, after, E2E)
    inference = histogram_delta(before, after, INFERENCE)

    def per_s(h) -> float | None:
        return h.sum / duration_s if h and h.count and duration_s else None

    def q(h, p: float) -> float | None:
        v = h.quantile(p) if h else None
        return None if v is None else v * 1000.0

    def mean(h) -> float | None:
        # Means, not quantiles: vLLM buckets these phases from 0.3 s up, so
        # a quantile of a light load's phases is an interpolation inside its
        # first bucket; a mean (sum / count) is exact.
        v = h.mean if h and h.count else None
        return None if v is None else v * 1000.0
    return {"ttft_p50_ms": q(ttft, 0.5), "ttft_p99_ms": q(ttft, 0.99), "itl_p50_ms": q(itl, 0.5),
            "itl_p99_ms": q(itl, 0.99), "ttft_count": ttft.count if ttft else None,
            "queue_mean_ms": mean(queue), "prefill_mean_ms": mean(prefill),
            "prompt_tokens": counter_delta(before, after, PROMPT_TOKENS),
            "generation_tokens": gen,
            "output_tps": gen / duration_s if gen is not None and duration_s else None,
            "server_in_flight": per_s(e2e), "engine_running": per_s(inference)}


class BenchWorker:
    """One long-lived Python running vLLM's bench client for run after run
    (BENCH_WORKER): argv lists in on stdin as JSON lines, a done line with the
    exit code out on stdout; stderr goes to a file, for a failed run's error."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self._err = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".err", delete=False)
        self._proc = subprocess.Popen([python, "-c", BENCH_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._err, env=env, text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the worker ended

    def alive(self) -> bool:
        return self._proc.poll() is None

    def run(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        """(exit code, the run's stdout and the end of stderr)."""
        assert self._proc.stdin is not None
        start = os.path.getsize(self._err.name)  # stderr of this run starts here
        self._proc.stdin.write(json.dumps(args) + "\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        out: list[str] = []
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.01, left))
            except queue.Empty:
                self.close()
                raise subprocess.TimeoutExpired("vLLM bench client (worker)", timeout_s) from None
            if line is None:
                return (self._proc.wait() or 1), "".join(out) + self._stderr_since(start)
            if line.startswith(WORKER_DONE):
                rc = int(line.split()[1])
                return rc, "".join(out) + (self._stderr_since(start) if rc else "")
            out.append(line)

    def _stderr_since(self, start: int) -> str:
        try:
            with open(self._err.name, encoding="utf-8", errors="replace") as f:
                f.seek(start)
                return f.read()[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._err.close()
        with contextlib.suppress(OSError):
            os.unlink(self._err.name)


_workers: dict[str, BenchWorker] = {}


def _worker(python: str, env: dict[str, str], slot: int = 0) -> BenchWorker:
    key = python if slot == 0 else f"{python}#{slot}"  # (one a process of a split run)
    w = _workers.get(key)
    if w is None or not w.alive():
        w = _workers[key] = BenchWorker(python, env)
    return w


def _shares(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def merge_bench_results(ds: list[dict[str, Any]], percentiles: str) -> dict[str, Any]:
    """One result from the saved results (--save-detailed) of several bench
    clients that ran side by side against one server: their requests pooled,
    the figures taken again over the pool (numpy's percentile, as the bench
    client's). The run's length is from the first request's start to the last
    one's last token (each client's start_times are perf_counter: on Linux one
    clock for all processes), so its tok/s reads a little above what one
    client's own duration would give."""
    import numpy as np

    lists = ("ttfts", "itls", "start_times", "input_lens", "output_lens", "errors")
    out: dict[str, Any] = {k: [x for d in ds for x in (d.get(k) or [])] for k in lists}
    ok = [(s, t, g or [], n) for s, t, g, n in zip(out["start_times"], out["ttfts"], out["itls"], out["output_lens"],
                                                    strict=True)
          if isinstance(t, (int, float)) and t > 0]
    if not ok:
        raise RuntimeError("the split bench client's runs answered no request")
    ends = [s + t + sum(g) for s, t, g, _ in ok]
    duration = max(ends) - min(s for s, _, _, _ in ok)
    out_tokens = sum(d.get("total_output_tokens") or 0 for d in ds)
    out.update(completed=sum(d.get("completed") or 0 for d in ds), total_output_tokens=out_tokens,
               total_input_tokens=sum(d.get("total_input_tokens") or 0 for d in ds), duration=duration,
               output_throughput=out_tokens / duration if duration > 0 else None, bench_procs=len(ds))
    series = {"ttft": [t for _, t, _, _ in ok], "itl": [x for _, _, g, _ in ok for x in g],
              "e2el": [t + sum(g) for _, t, g, _ in ok],
              "tpot": [sum(g) / (n - 1) for _, _, g, n in ok if isinstance(n, int) and n > 1]}
    for name, xs in series.items():
        if not xs:
            continue
        ms = np.asarray(xs, dtype=float) * 1000.0
        out[f"mean_{name}_ms"] = float(ms.mean())
        out[f"median_{name}_ms"] = float(np.median(ms))
        for p in percentiles.split(","):
            out[f"p{p}_{name}_ms"] = float(np.percentile(ms, float(p)))
    return out


@atexit.register
def close_workers() -> None:
    for w in _workers.values():
        w.close()
    _workers.clear()


def run_theirs(srv: Server, shape: Shape, *, concurrency: int | None, rate: float | None, n: int, seed: int,
               python: str, env: dict[str, str], timeout_s: float, percentiles: str = "50,99",
               procs: int = 1) -> dict[str, Any]:
    """vLLM's bench client for one run. procs > 1: that many bench clients side
    by side, each with its share of the concurrency (or the rate: Poisson
    arrivals at R/K each add up to Poisson at R), of the prompts and its own
    seed, their requests pooled (merge_bench_results). Why: on an H200 one
    bench client's process was at p90 86 % of a core at 448-512 streams, and
    its TTFT at 512 went from 0.1-0.2 s (p50, at 448) to 0.4-1.0 s."""
    procs = max(1, min(procs, concurrency or procs, n))
    with tempfile.TemporaryDirectory(prefix="agree-") as tmp:
        base = ["--backend", "vllm", "--base-url", srv.url, "--model", srv.model,
                "--tokenizer", srv.tokenizer, "--dataset-name", "random",
                "--random-input-len", str(shape.input_len), "--random-output-len", str(shape.output_len),
                "--random-range-ratio", str(shape.range_ratio), "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", percentiles,
                "--save-result", "--save-detailed", "--result-dir", tmp, "--disable-tqdm"]
        conc_k = _shares(concurrency, procs) if concurrency is not None else [None] * procs
        n_k = _shares(n, procs)
        said_k: list[tuple[int, str]] = [(1, "")] * procs

        def one(k: int) -> None:
            args = [*base, "--num-prompts", str(n_k[k]), "--seed", str(seed + k), "--result-filename", f"r{k}.json"]
            if conc_k[k] is not None:
                args += ["--max-concurrency", str(conc_k[k])]
            args += ["--request-rate", str(rate / procs) if rate is not None else "inf"]
            try:
                if KEEP_BENCH_PROCESS:
                    said_k[k] = _worker(python, env, k).run(args, timeout_s)
                else:
                    p = subprocess.run([python, "-c", BENCH_CLIENT, *args], capture_output=True, text=True,
                                       env=env, timeout=timeout_s, check=False)
                    said_k[k] = (p.returncode, p.stderr or p.stdout)
            except subprocess.TimeoutExpired as exc:
                if procs == 1:
                    raise
                said_k[k] = (1, f"timed out: {exc}")  # (in a thread: told as a failed run)
        t = time.time()
        if procs == 1:
            one(0)
        else:
            threads = [threading.Thread(target=one, args=(k,)) for k in range(procs)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        ds = []
        for k, (rc, said) in enumerate(said_k):
            if rc != 0 or not (Path(tmp) / f"r{k}.json").exists():
                raise RuntimeError(f"vLLM's bench client failed ({rc}): {said[-2000:]}")
            ds.append(json.loads((Path(tmp) / f"r{k}.json").read_text()))
    d = ds[0] if procs == 1 else merge_bench_results(ds, percentiles)
    out = figures_from_bench_json(d)
    out["wall_s"] = time.time() - t
    out["started_utc"] = time.strftime("%H:%M:%S", time.gmtime(t))  # to line up with gpu.log / box.jsonl
    out["percentiles_ms"] = {k: v for k, v in d.items()
                             if k.startswith(("p", "median_", "mean_")) and k.endswith("_ms")
                             and isinstance(v, (int, float))}
    # Its figures over the span its load was whole (none where the result has no per-request times).
    steady = steady_from_bench_detail(d)
    if steady is not None:
        out["steady"] = steady
    # What it asked for (--save-detailed): the lengths its dataset drew.
    for key in ("output_lens", "input_lens"):
        xs = [x for x in d.get(key) or [] if isinstance(x, (int, float))]
        if xs:
            out[key] = {"min": min(xs), "max": max(xs), "mean": statistics.fmean(xs)}
    # (a split run drew its lengths from K seeds: not ours request by request)
    out["lengths_unlike_ours"] = lengths_unlike_ours(d, shape, n, seed) if procs == 1 else None
    out["bench_procs"] = procs
    return out


def lengths_unlike_ours(d: dict[str, Any], shape: Shape, n: int, seed: int) -> dict[str, int] | None:
    """How many of the bench client's requests, in order, had another prompt
    or output length than our burst given the same --seed asks for: 0 and 0
    when the round's two arms sent one workload (its output lengths are what
    the server returned, all asked for under ignore_eos; its prompt lengths
    are its prompts' token counts). None: its result holds no lengths."""
    ins, outs = d.get("input_lens"), d.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != n or len(outs) != n:
        return None
    in_lo, in_hi, out_lo, out_hi = shape.ranges()
    want_in, want_out = drawn_lengths(n, (in_lo, in_hi), (out_lo, out_hi), seed=seed)
    return {"prompt": sum(1 for a, b in zip(ins, want_in, strict=True) if a != b),
            "output": sum(1 for a, b in zip(outs, want_out, strict=True) if a != b)}


def run_ours(srv: Server, shape: Shape, *, concurrency: int | None, rate: float | None, n: int, seed: int,
             python: str, env: dict[str, str], timeout_s: float, extra: list[str] | None = None) -> dict[str, Any]:
    """Our burst; seed: its prompt and output lengths and, at a rate, its
    arrival times, those of the bench client given the same --seed. Its
    words are new every run (no --word-seed)."""
    in_lo, in_hi, out_lo, out_hi = shape.ranges()
    argv = [python, "-m", "ernie_tui", "probe", "--url", srv.url, "--model", srv.model, "--tokenizer", srv.tokenizer,
            "--burst", str(n), "--min-tokens", str(in_lo), "--max-tokens-in", str(in_hi),
            "--max-tokens", str(out_hi), "--min-output-tokens", str(out_lo), "--seed", str(seed),
            "--no-save", "--json", "--timeout", "600"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if rate is not None:
        argv += ["--rate", str(rate), "--arrival-seed", str(seed)]
    argv += extra or []  # a variant's own probe options (--variant), last so they win
    t = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    try:
        d = json.loads(p.stdout)
    except ValueError as exc:
        raise RuntimeError(f"our burst failed ({p.returncode}): {(p.stderr or p.stdout)[-2000:]}") from exc
    out = figures_from_burst_json(d)
    out["wall_s"] = time.time() - t
    out["started_utc"] = time.strftime("%H:%M:%S", time.gmtime(t))
    v = d.get("vllm") or {}
    # The burst's own vLLM view starts after its warm-up (C one-token
    # requests that would pull the window's TTFT quantiles down).
    out["vllm_view"] = {"ttft_p50_ms": _ms(v.get("ttft_p50_s")), "ttft_p99_ms": _ms(v.get("ttft_p99_s")),
                        "ttft_count": v.get("ttft_count"), "prompt_tokens": v.get("prompt_tokens"),
                        "queue_mean_ms": _ms(v.get("queue_mean_s")), "output_tps": v.get("output_tps"),
                        "server_in_flight": in_flight_mean(_ms(v.get("e2e_mean_s")), v.get("requests_finished"),
                                                           out.get("duration_s")),
                        "engine_running": in_flight_mean(_ms(v.get("inference_mean_s")), v.get("requests_finished"),
                                                         out.get("duration_s"))}
    out["send_lag"] = d.get("send_lag")
    out["client"] = d.get("client")
    out["errors"] = (d.get("errors") or {}).get("count")
    return out


def without_warmup(r: dict[str, Any]) -> None:
    """Our burst's warm-up (one-token requests, before its clock starts) is
    inside the referee's window, which opens before the burst's process:
    16 TTFTs beside 600 at a rate, C beside 8 C at a concurrency, all sent
    at once. Where it can, the referee takes those figures from the burst's
    own vLLM view instead, whose window opens after the warm-up (the ITL
    histogram needs nothing: a one-token answer has no gap)."""
    view = r.get("vllm_view") or {}
    for key in ("ttft_p50_ms", "ttft_p99_ms", "ttft_count", "prompt_tokens", "queue_mean_ms", "server_in_flight",
                "engine_running"):
        if view.get(key) is not None:
            r["referee"][key] = view[key]
    r["referee"]["after_warmup"] = view.get("ttft_count") is not None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def round_order(level_index: int, k: int, arms: tuple[str, ...] = ("ours", "theirs")) -> tuple[str, ...]:
    """The order the arms run in, in round k of the level_index-th level:
    rotated by one each round and each level, so no arm always opens a level
    (the first run at a new batch size on a server pays its first batches)
    and each opens a level's rounds equally often."""
    i = (k + level_index) % len(arms)
    return arms[i:] + arms[:i]


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=PROBE ARGS` -> (NAME, argv): an extra arm of our burst, run with
    those probe options added (`quiet=--metrics-interval 30`)."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier() or name in ("ours", "theirs"):
        raise ValueError(f"a variant is NAME=PROBE ARGS with a new name (not ours/theirs): {text!r}")
    return name, shlex.split(rest)


def summarize_arm(runs: dict[str, list[dict[str, Any]]], arm: str) -> dict[str, Any]:
    """One arm of ours against the bench client: each figure's medians,
    spreads and ratio, at the client and on vLLM's /metrics (the referee)."""
    return {"figures": {f: summarize_figure([r[f] for r in runs[arm]], [r[f] for r in runs["theirs"]], GOAL[f])
                        for f in FIGURES},
            "referee": {f: summarize_figure([r["referee"].get(f) for r in runs[arm]],
                                            [r["referee"].get(f) for r in runs["theirs"]], GOAL[f])
                        for f in FIGURES}}


def one_level(srv: Server, shape: Shape, *, concurrency: int | None, rate: float | None, n: int, rounds: int,
              python: str, env: dict[str, str], timeout_s: float, log=print, checkpoint=None,
              level_index: int = 0, warmup_run: bool = False,
              variants: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Every arm's rounds at one level, interleaved. variants: extra arms of
    our burst (name -> probe options), each compared with the bench client
    as ours is, so a suspected cause of a difference is measured side by
    side on the same server rather than in a later run."""
    variants = variants or {}
    arms = ("ours", *variants, "theirs")
    metrics = MetricsClient(srv.url, None, model_name=None, timeout=30.0)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    rng = random.SystemRandom()
    try:
        if warmup_run:  # one unrecorded run of ours at this level first
            r = run_ours(srv, shape, concurrency=concurrency, rate=rate, n=n, seed=rng.randrange(1, 1 << 30),
                         python=python, env=env, timeout_s=timeout_s)
            log(f"  warm-up run (not counted): {r['output_tps'] or 0:.0f} tok/s")
        for k in range(rounds):
            order = round_order(level_index, k, arms)
            # Every arm of a round sends one workload: the bench client's --seed draws its lengths
            # (numpy's default_rng) and its gaps (numpy's legacy gamma); ours, given the same seed,
            # draws the same numbers, so a round compares the clients, not two draws. The prompts'
            # words stay each run's own (ours new words, theirs its dataset's tokens).
            seed = rng.randrange(1, 1 << 30)
            for who in order:
                before = metrics.try_fetch()
                if who == "theirs":
                    r = run_theirs(srv, shape, concurrency=concurrency, rate=rate, n=n, seed=seed, python=python,
                                   env=env, timeout_s=timeout_s)
                else:
                    r = run_ours(srv, shape, concurrency=concurrency, rate=rate, n=n, seed=seed, python=python,
                                 env=env, timeout_s=timeout_s, extra=variants.get(who))
                after = metrics.try_fetch()
                r["referee"] = referee(before, after, r.get("duration_s"))
                if who != "theirs":
                    without_warmup(r)
                r["seed"] = seed
                r["round"] = k
                runs[who].append(r)
                log(f"  round {k + 1} {who:6s}: {fmt_run(r)}")
                if checkpoint is not None:  # a run cut short keeps the rounds it finished
                    checkpoint({"concurrency": concurrency, "rate": rate, "n": n, "partial_runs": runs})
    finally:
        metrics.close()
    ours = summarize_arm(runs, "ours")
    out = {"concurrency": concurrency, "rate": rate, "n": n, "rounds": rounds, "figures": ours["figures"],
           "referee": ours["referee"], "runs": runs}
    if variants:
        out["variants"] = {name: {"args": args, **summarize_arm(runs, name)} for name, args in variants.items()}
    return out


def fmt_run(r: dict[str, Any]) -> str:
    def f(v: float | None, p: str = ".0f") -> str:
        return "-" if v is None else format(v, p)
    ref = r.get("referee") or {}
    return (f"{f(r['output_tps'])} tok/s  TTFT p50 {f(r['ttft_p50_ms'])} p99 {f(r['ttft_p99_ms'])} ms  "
            f"ITL p50 {f(r['itl_p50_ms'], '.1f')} p99 {f(r['itl_p99_ms'], '.1f')} ms  "
            f"[vLLM: {f(ref.get('output_tps'))} tok/s, TTFT p99 {f(ref.get('ttft_p99_ms'))} ms "
            f"(mean queue {f(ref.get('queue_mean_ms'), '.1f')}, prefill {f(ref.get('prefill_mean_ms'), '.1f')}), "
            f"ITL p99 {f(ref.get('itl_p99_ms'), '.1f')} ms, {f(ref.get('prompt_tokens'))} prompt tokens]  "
            f"in flight: client {f(r.get('in_flight_mean'), '.1f')}, server {f(ref.get('server_in_flight'), '.1f')}, "
            f"engine {f(ref.get('engine_running'), '.1f')}  {f(r.get('wall_s'), '.0f')} s{_unlike(r)}")


def _unlike(r: dict[str, Any]) -> str:
    u = r.get("lengths_unlike_ours")
    if not u or not (u["prompt"] or u["output"]):
        return ""  # none recorded, or the very lengths ours asks for
    return f"  LENGTHS UNLIKE OURS: {u['prompt']} prompt, {u['output']} output of {r.get('completed')}"


def format_level(lv: dict[str, Any]) -> str:
    name = f"concurrency {lv['concurrency']}" if lv["rate"] is None else f"rate {lv['rate']:g} req/s"
    lines = [f"{name}, {lv['n']} requests x {lv['rounds']} rounds:"]
    for arm_name, arm in [("ours", lv), *(lv.get("variants") or {}).items()]:
        if arm_name != "ours":
            lines.append(f"  variant {arm_name} ({' '.join(arm['args'])}) against the bench client:")
        lines += _text_table(arm, arm_name)
    lines.append("  vLLM's view of each client's requests (medians over the rounds): " + phases(lv))
    delay = client_delay_ms(lv)
    if delay:
        lines.append("  each client's TTFT p50 after vLLM's own (median over the rounds): "
                     + ", ".join(f"{who} {ms:.0f} ms" for who, ms in delay.items()))
    split = spread_split(lv)
    if split:
        lines.append("  tok/s spread, the server's output (vLLM's counter over each window) / the client's reading "
                     "of it (client ÷ counter): " + ", ".join(f"{who} {a * 100:.1f} / {b * 100:.1f} %"
                                                          for who, (a, b) in split.items()))
    note = client_bound_note(lv)
    if note:
        lines.append("  " + note)
    return "\n".join(lines)


# A client whose TTFT p50 sits further after vLLM's own than the other
# client's, by more than this and by more than the TTFT goal's share of its
# TTFT p50, is late to read its streams: the two clients' latencies then
# differ by the clients, beyond what the goal allows.
CLIENT_LATE_MS = 25.0


def client_delay_ms(lv: dict[str, Any]) -> dict[str, float]:
    """Each client's median over the rounds of its TTFT p50 minus vLLM's TTFT
    p50 for the same requests (the referee's histogram over its window). Both
    clocks see the same prefill and queue; what is left is the network, the
    API server's streaming and the client's own lateness in reading. vLLM's
    figure is interpolated within a histogram bucket, the same way for both
    clients, so the difference between the clients is the reading, not each
    one's absolute value."""
    out = {}
    for who, runs in (lv.get("runs") or {}).items():
        gaps = [r["ttft_p50_ms"] - r["referee"]["ttft_p50_ms"] for r in runs
                if r.get("ttft_p50_ms") is not None and (r.get("referee") or {}).get("ttft_p50_ms") is not None]
        if gaps:
            out[who] = statistics.median(gaps)
    return out


def spread_split(lv: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each client's tok/s spread over the rounds split in two: the spread
    of vLLM's own generation counter over its windows (what the server made
    at the load that client kept) and the spread of client / counter (the
    client's reading of it). On the H100 host at c128 (2026-12-06) ours
    spread 17.1 % against the bench client's 5.1 %; the counter's spreads
    were the same 17.1 and 5.1 %, the readings' under 0.1 % for both: the
    server made the difference, at the loads the two clients kept."""
    out = {}
    for who, runs in (lv.get("runs") or {}).items():
        pairs = [(r["output_tps"], r["referee"]["output_tps"]) for r in runs
                 if r.get("output_tps") and (r.get("referee") or {}).get("output_tps")]
        if len(pairs) < 2:
            continue
        made = [v for _, v in pairs]
        read = [c / v for c, v in pairs]
        out[who] = ((max(made) - min(made)) / statistics.median(made),
                    (max(read) - min(read)) / statistics.median(read))
    return out


def client_bound_note(lv: dict[str, Any]) -> str:
    """A line naming a client that reads its streams late, or "" (H100 host,
    2026-12-06, c128: the bench client's TTFT p50 sat 47 ms after vLLM's own,
    ours 5 ms, and its ITL p50 read 13.0 ms where vLLM's engine put both
    clients' at 5.4: its figures were the client's pace)."""
    delay = client_delay_ms(lv)
    if len(delay) < 2:
        return ""
    late = max(delay, key=lambda who: delay[who])
    other = min(delay.values())
    ttft = statistics.median([r["ttft_p50_ms"] for r in lv["runs"][late] if r.get("ttft_p50_ms") is not None])
    if delay[late] - other < CLIENT_LATE_MS or delay[late] - other < GOAL["ttft_p50_ms"] * ttft:
        return ""
    def name(who: str) -> str:
        return {"ours": "our burst", "theirs": "the bench client"}.get(who, f"variant {who}")
    others = ", ".join(f"{name(who)} {ms:.0f} ms" for who, ms in delay.items() if who != late)
    return (f"CLIENT-BOUND: {name(late)} reads TTFT p50 {delay[late]:.0f} ms after vLLM's own for its requests "
            f"({others}): it reads its streams late, so its latencies and tok/s here are its own pace, "
            "not the server's")


def _text_table(arm: dict[str, Any], label: str = "ours") -> list[str]:
    lines = [f"  {'figure':12s} {'ours median':>12s} {'spread':>7s} {'theirs median':>14s} {'spread':>7s} "
             f"{'ratio':>6s} goal   | vLLM referee ratio | round by round"]

    def n(v: float | None, p: str = ".1f") -> str:
        return "-" if v is None else format(v, p)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"
    for f in FIGURES:
        s, ref = arm["figures"][f], arm["referee"][f]
        ok = {True: "ok", False: "MISS", None: "-"}[s["within_goal"]]
        lines.append(f"  {f:12s} {n(s['ours_median']):>12s} {pct(s['ours_spread']):>7s} "
                     f"{n(s['theirs_median']):>14s} {pct(s['theirs_spread']):>7s} {n(s['ratio'], '.3f'):>6s} "
                     f"+-{s['goal'] * 100:.0f}% {ok:4s} | {n(ref['ratio'], '.3f'):>18s} | {_rounds(s, label)}")
    return lines


def _rounds(s: dict[str, Any], label: str = "ours") -> str:
    ratios, higher, known = per_round(s)
    each = " ".join("-" if x is None else f"{x:.3f}" for x in ratios)
    return f"{each} ({label} higher in {higher} of {known})"


def phases(lv: dict[str, Any]) -> str:
    """Where each client's TTFT went by vLLM's clocks, what it sent, and the
    load it kept: mean queue and prefill ms, prompt tokens per request,
    requests in flight at the client, the server and in the engine."""
    def med(who: str, key: str, per_request: bool = False, own: bool = False) -> str:
        xs = []
        for r in lv.get("runs", {}).get(who, []):
            ref = r.get("referee") or {}
            v = r.get(key) if own else ref.get(key)
            if v is not None and per_request:
                v = v / ref["ttft_count"] if ref.get("ttft_count") else None
            if v is not None:
                xs.append(v)
        return f"{statistics.median(xs):.1f}" if xs else "-"
    return "; ".join(f"{who} queue {med(who, 'queue_mean_ms')} ms, prefill {med(who, 'prefill_mean_ms')} ms, "
                     f"{med(who, 'prompt_tokens', True)} prompt tokens a request, in flight: client "
                     f"{med(who, 'in_flight_mean', own=True)}, server {med(who, 'server_in_flight')}, engine "
                     f"{med(who, 'engine_running')}" for who in lv.get("runs", {}))


def markdown_level(lv: dict[str, Any]) -> str:
    """One level as Markdown tables (for docs/lab/benchmarks/agree-vllm-bench.md): ours, then each variant."""
    name = f"concurrency {lv['concurrency']}" if lv["rate"] is None else f"rate {lv['rate']:g} req/s (Poisson)"
    out = [f"{name}, {lv['n']} requests a run, {lv['rounds']} rounds:", ""] + _markdown_table("ours", lv)
    for v, arm in (lv.get("variants") or {}).items():
        out += ["", f"variant `{v}` (`{' '.join(arm['args'])}`), same rounds:", ""] + _markdown_table(v, arm)
    return "\n".join(out)


def _markdown_table(label: str, arm: dict[str, Any]) -> list[str]:
    out = [f"| figure | {label}: median (spread) | bench client: median (spread) | ratio | goal "
           "| vLLM /metrics ratio | ratio round by round |", "|---|---|---|---|---|---|---|"]
    for f in FIGURES:
        s, ref = arm["figures"][f], arm["referee"][f]

        def n(v: float | None, whole: bool = f == "output_tps") -> str:
            return "-" if v is None else (f"{v:,.0f}" if whole else f"{v:,.1f}")

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v * 100:.1f} %"

        def r(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"
        ok = {True: "met", False: "**missed**", None: "-"}[s["within_goal"]]
        out.append(f"| {f} | {n(s['ours_median'])} ({pct(s['ours_spread'])}) | {n(s['theirs_median'])} "
                   f"({pct(s['theirs_spread'])}) | {r(s['ratio'])} | ±{s['goal'] * 100:.0f} % {ok} "
                   f"| {r(ref['ratio'])} | {_rounds(s, label)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--report":
        d = json.loads(Path(sys.argv[2]).read_text())  # tables of a saved run, no server needed
        print("\n\n".join(markdown_level(lv) for lv in d["levels"]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", help="served model name (default: the first /v1/models lists)")
    p.add_argument("--tokenizer", required=True, help="the model dir (both clients build prompts with it)")
    p.add_argument("--concurrency", type=int, nargs="*", default=[], metavar="C")
    p.add_argument("--rate", type=float, nargs="*", default=[], metavar="R", help="requests/s, Poisson arrivals")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--waves", type=int, default=8, help="requests per run = waves x concurrency (default 8)")
    p.add_argument("--rate-seconds", type=float, default=30.0,
                   help="a rate run sends rate x this many requests (default 30 s of arrivals)")
    p.add_argument("--input-len", type=int, default=165)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.8182)
    p.add_argument("--bench-python", default=sys.executable, help="Python with vllm for the bench client")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per client run at most")
    p.add_argument("--bench-process-per-run", action="store_true",
                   help="start vLLM's bench client afresh for each run (default: one process kept for all runs)")
    p.add_argument("--warmup-run", action="store_true",
                   help="run our burst once, unrecorded, at each level before its rounds")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="an extra arm of our burst, run with these probe options added and compared with the "
                        "bench client as ours is, in the same rounds (e.g. quiet='--metrics-interval 30'); "
                        "repeatable")
    p.add_argument("--json", metavar="FILE", help="write the levels, runs included, here")
    args = p.parse_args(argv)
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as exc:
        p.error(str(exc))
    global KEEP_BENCH_PROCESS
    KEEP_BENCH_PROCESS = not args.bench_process_per_run
    if not args.concurrency and not args.rate:
        p.error("give --concurrency and/or --rate levels")
    from ernie_tui.engine_ctl.load import resolve_model

    model = args.model or resolve_model(args.url).id
    srv = Server(args.url.rstrip("/"), model, args.tokenizer)
    shape = Shape(args.input_len, args.output_len, args.range_ratio)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    if src not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(x for x in (src, env.get("PYTHONPATH")) if x)
    in_lo, in_hi, out_lo, out_hi = shape.ranges()
    print(f"server {srv.url} model {model}; prompts {in_lo}..{in_hi} tokens, outputs {out_lo}..{out_hi} "
          f"(ignore_eos), {args.rounds} rounds interleaved", flush=True)
    levels: list[dict[str, Any]] = []
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "url": srv.url, "model": model,
           "argv": sys.argv[1:] if argv is None else argv,
           "shape": {"input_len": shape.input_len, "output_len": shape.output_len, "range_ratio": shape.range_ratio,
                     "ranges": shape.ranges()}, "goal": GOAL, "levels": levels}
    plan: list[tuple[int | None, float | None, int]] = [(c, None, args.waves * c) for c in args.concurrency]
    plan += [(None, r, max(1, round(r * args.rate_seconds))) for r in args.rate]
    for li, (c, r, n) in enumerate(plan):
        print(f"{'concurrency ' + str(c) if r is None else f'rate {r:g} req/s'}: {n} requests a run", flush=True)
        def checkpoint(partial: dict[str, Any]) -> None:
            if args.json:
                Path(args.json).write_text(json.dumps({**out, "in_progress": partial}, indent=1))
        lv = one_level(srv, shape, concurrency=c, rate=r, n=n, rounds=args.rounds, python=args.bench_python,
                       env=env, timeout_s=args.timeout, log=lambda s: print(s, flush=True), checkpoint=checkpoint,
                       level_index=li, warmup_run=args.warmup_run, variants=variants)
        levels.append(lv)
        print(format_level(lv), flush=True)
        if args.json:  # after every level: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(out, indent=1))
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
