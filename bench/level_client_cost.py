"""Does the capacity search's own client lengthen the token gaps it judges?

On the H200 (docs/lab/capacity-h200/2026-12-04-run17.md, seventeenth run), behind four API
servers at concurrency 320-512, the search's levels read ITL p99 56-93 ms
where vLLM's own histogram put it under 50 ms and vLLM's bench client read
35-47 ms at the same concurrency; the search's event loop lagged p99
36-80 ms. A level is more than a burst: it judges itself while it runs and
keeps every answer for the verdict. This script measures what that costs.

It starts bench/client_cpu.py's stand-in for vLLM's streaming endpoint in its
own process, stepping every --step-ms: every gap the server makes is one step
(a reader that falls behind gets its tokens merged, as vLLM does), so any
token gap longer than that is the client's. Then, side by side in one run,
each in a fresh process, at each concurrency:

- "level": one closed-loop capacity level, exactly as a search runs it
  (HttpLevelRunner on the runner's own event loop);
- "level, before": the same as the runner ran before 2026-12-04: on plain
  asyncio's loop, the garbage collector left running through the level;
- "vLLM bench client": vLLM's own request function (aiohttp), the same
  concurrency and request count, timed as `vllm bench serve` times it.

Prints each one's ITL p50/p99 (and p99 minus the step: the client's part),
the client's loop lag, GC pauses, its slowest judgement, its CPU per token
and the stand-in's.

    PYTHONPATH=src .venv/bin/python bench/level_client_cost.py [--concurrency 256 448] [--step-ms 20]
        [--tokens 128] [--rounds 2] [--candidates ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"
CLIENT_CPU = HERE.parent / "client_cpu.py"

CANDIDATES = ("level", "level, before", "level in processes", "vLLM bench client")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100.0 * (len(xs) - 1))))]


def run_level(url: str, conc: int, tokens: int, loop: str, procs: int = 1) -> dict:
    # The level runner's module itself (tests/test_bench_imports.py allows it
    # here): one level run directly, and the "before" arm run as it ran then.
    import ernie_tui.engine_ctl.load.capacity_run as capacity_run
    from ernie_tui.engine_ctl.load import Workload, parse_slo

    items = [capacity_run.WorkItem(prompt=f"w{i} " * 10, max_tokens=tokens, prompt_tokens=10) for i in range(64)]
    slo = parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    # Every level runs to the same count (8 turnovers) unless grossly over, so candidates compare like for like.
    rules = capacity_run.C.LevelRules(min_requests=8 * conc, max_requests=8 * conc)
    runner = capacity_run.HttpLevelRunner(url, "m", Workload(items, "fixed"), slo, rules,
                                          capacity_run.RequestSettings(client_procs=procs), use_metrics=False)
    cpu0 = _cpu()
    if loop == "before":
        health = capacity_run.ClientHealth
        start = health.start
        health.start = lambda self, freeze, pause_collector=False: start(self, freeze)  # type: ignore[method-assign]
        lv = asyncio.run(runner.run_async(conc))
    else:
        try:
            lv = runner(conc)
        finally:
            runner.close()
    cpu = _cpu() - cpu0 + sum(lv.client_procs_cpu_s or [])  # (the stream processes' time spent in the level)
    return {"itl_p50_ms": lv.itl_p50_ms, "itl_p99_ms": lv.itl_p99_ms, "ttft_p99_ms": lv.ttft_p99_ms,
            "output_tps": lv.output_tps, "requests": lv.requests, "verdict": lv.verdict, "stop": lv.stop,
            "lag_p99_ms": lv.client_lag_p99_ms, "lag_max_ms": lv.client_lag_max_ms,
            "gc_pause_max_ms": lv.client_gc_pause_max_ms, "gc_full": lv.client_gc_full,
            "judge_max_ms": lv.client_judge_max_ms, "cpu_s": cpu, "elapsed_s": lv.elapsed_s,
            "loop": lv.client_loop,
            "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


async def _bench_client(url: str, conc: int, n: int, tokens: int) -> dict:
    from client_cpu import vllm_bench_outputs

    results, wall, cpu = await vllm_bench_outputs(url, conc, n, tokens)
    ok = [r for r in results if r.success]
    gaps = [g for r in ok for g in r.itl]
    return {"itl_p50_ms": _pct(gaps, 50) * 1e3 if gaps else None, "itl_p99_ms": _pct(gaps, 99) * 1e3 if gaps else None,
            "ttft_p99_ms": (_pct([r.ttft for r in ok], 99) or 0) * 1e3,
            "output_tps": sum(r.output_tokens for r in ok) / wall, "requests": len(ok), "verdict": "-",
            "stop": "-", "lag_p99_ms": None, "lag_max_ms": None, "gc_pause_max_ms": None, "gc_full": None,
            "judge_max_ms": None, "cpu_s": cpu, "elapsed_s": wall}


def child_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(SRC))
    if args.candidate == "vLLM bench client":
        out = asyncio.run(_bench_client(args.url, args.concurrency, args.requests, args.tokens))
    else:
        out = run_level(args.url, args.concurrency, args.tokens,
                        "before" if args.candidate == "level, before" else "runner",
                        procs=args.procs if args.candidate == "level in processes" else 1)
    print(json.dumps(out), flush=True)


def _get(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def main_compare(args: argparse.Namespace) -> None:
    import psutil

    sys.path.insert(0, str(SRC))
    from ernie_tui.engine_ctl.launch import free_port

    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, str(CLIENT_CPU), "serve", "--port", str(port),
                               "--step-ms", str(args.step_ms)], stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        srv = psutil.Process(server.pid)
        print(f"stand-in stepping every {args.step_ms:g} ms; {args.tokens} output tokens a request")
        for conc in args.concurrency:
            # as many requests as the level counts at most (8 turnovers), and its warm-up
            n = 10 * conc
            for rnd in range(args.rounds):
                for name in args.candidates:
                    _get(url + "/reset")
                    s0 = sum(srv.cpu_times()[:2])
                    argv = [sys.executable, str(HERE), "child", "--candidate", name, "--url", url,
                            "--concurrency", str(conc), "--requests", str(n), "--tokens", str(args.tokens),
                            "--procs", str(args.procs)]
                    out = subprocess.run(argv, capture_output=True, text=True, check=False)
                    if out.returncode != 0:
                        print(f"C={conc} {name}: failed\n{out.stderr[-2000:]}")
                        continue
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    st = _get(url + "/stats")
                    row.update(candidate=name, concurrency=conc, round=rnd,
                               server_cpu_s=sum(srv.cpu_times()[:2]) - s0, server_tokens=st["tokens"],
                               merged_events=st["merged_events"])
                    tok = max(1, row["server_tokens"])
                    rows.append(row)

                    def f(v: float | None, fmt: str = ".1f") -> str:
                        return "-" if v is None else format(v, fmt)
                    print(f"C={conc:4d} r{rnd} {name:20s} ITL p50 {f(row['itl_p50_ms'])} p99 {f(row['itl_p99_ms'])} "
                          f"(+{f((row['itl_p99_ms'] or 0) - args.step_ms)} over the step)  TTFT p99 "
                          f"{f(row['ttft_p99_ms'], '.0f')}  {f(row['output_tps'], '.0f')} tok/s  "
                          f"lag p99/max {f(row['lag_p99_ms'])}/{f(row['lag_max_ms'], '.0f')}  "
                          f"gc max {f(row['gc_pause_max_ms'])} (full {row['gc_full']})  "
                          f"judge max {f(row['judge_max_ms'], '.0f')}  client {row['cpu_s'] / tok * 1e6:.1f} "
                          f"us/tok  stand-in {row['server_cpu_s'] / tok * 1e6:.1f} us/tok  "
                          f"peak RSS {row.get('rss_peak_mib', 0):.0f} MiB  "
                          f"{row['requests']} req {row['verdict']}/{row['stop']}  "
                          f"merged {row['merged_events']}",
                          flush=True)
    finally:
        server.terminate()
        server.wait(10)
    by: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if r["itl_p99_ms"] is not None:
            by.setdefault((r["concurrency"], r["candidate"]), []).append(r["itl_p99_ms"])
    print("median ITL p99 (ms) over rounds:")
    for (conc, name), v in sorted(by.items()):
        print(f"  C={conc:4d} {name:20s} {statistics.median(v):.1f}  ({len(v)} rounds)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--candidate", required=True, choices=CANDIDATES)
    c.add_argument("--url", required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--requests", type=int, required=True)
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[256, 448])
    ap.add_argument("--step-ms", type=float, default=20.0, help="the stand-in's engine step (every token gap)")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=2, help="stream processes of the 'level in processes' candidate")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.cmd == "child":
        child_main(args)
    else:
        main_compare(args)


if __name__ == "__main__":
    main()
