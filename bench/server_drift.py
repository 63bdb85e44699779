"""Does a vLLM server's speed move with its age? vLLM's bench client, back to back, for a while.

On the H200 one unchanged server read 16 k generated tok/s in its first
search and 26.5 k ten minutes later (thirteenth run), and both clients
rose 20 % together within six minutes of another server's start
(fourteenth run), while vLLM's API server and engine core each held a
whole CPU core. Whether that is a warm-up (a fresh server is slow for its
first minutes, so a search right after a start reads low) or a wander
(the host's CPU speed, any time) decides what a capacity search should do
about it. This runs vLLM's own bench client only (no client of ours in the
loop), at each --concurrency in turn, run after run for --seconds, each run
waves x C requests with a new seed (prompts never sent before: a repeated
prompt would come from the prefix cache), and records for every run:

- its start, in seconds since the server's process started (psutil) and
  since --ready-at (when the server first answered /health, if given);
- output tok/s and TTFT / ITL p50 and p99 (the bench client's own);
- the CPU each server process used over the run, % of a core
  (engine_ctl.load.server_cpu: API server(s), engine core, workers);
- the host's mean CPU clock (psutil.cpu_freq; a VM may report a constant).

It prints a row a run and, per concurrency, the first third's and last
third's median tok/s and their ratio. Writes everything to --json.

    PYTHONPATH=src python bench/server_drift.py --url http://127.0.0.1:8000 --tokenizer MODEL_DIR \\
        --concurrency 128 256 --seconds 300 --json drift.json

Needs vllm importable by --bench-python (default: this Python), for its bench client.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agree_vllm_bench import Server, Shape, run_theirs  # noqa: E402
from ernie_tui.engine_ctl.load import ServerCpuWatch, resolve_model, server_pid  # noqa: E402


def cpu_mhz() -> float | None:
    """The host's mean current CPU clock, MHz (None where it cannot be read)."""
    try:
        f = psutil.cpu_freq()
    except (OSError, NotImplementedError, AttributeError):
        return None
    return round(f.current, 1) if f and f.current else None


def thirds(xs: list[float]) -> tuple[float, float] | None:
    """Median of the first and of the last third of a series (None under 3 values)."""
    if len(xs) < 3:
        return None
    k = len(xs) // 3
    return statistics.median(xs[:k]), statistics.median(xs[-k:])


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in sorted({r["concurrency"] for r in runs}):
        tps = [r["output_tps"] for r in runs if r["concurrency"] == c and r.get("output_tps")]
        row: dict[str, Any] = {"concurrency": c, "runs": len(tps)}
        t = thirds(tps)
        if t:
            row.update(first_third_tps=t[0], last_third_tps=t[1], last_over_first=t[1] / t[0])
        if tps:
            row.update(min_tps=min(tps), max_tps=max(tps), median_tps=statistics.median(tps))
        out.append(row)
    return out


def _cpu_text(cpu: list[dict[str, Any]] | None) -> str:
    return ", ".join(f"{p['what']} {p['cpu_pct']:.0f}" for p in cpu or [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", help="served model name (default: the first /v1/models lists)")
    p.add_argument("--tokenizer", required=True, help="the model dir (the bench client builds prompts with it)")
    p.add_argument("--concurrency", type=int, nargs="+", required=True, metavar="C",
                   help="run at each in turn, round after round")
    p.add_argument("--seconds", type=float, default=300.0, help="start no run after this many seconds")
    p.add_argument("--waves", type=int, default=8, help="requests per run = waves x concurrency (default 8)")
    p.add_argument("--ready-at", type=float, help="when the server first answered /health (Unix time)")
    p.add_argument("--input-len", type=int, default=165)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.8182)
    p.add_argument("--bench-python", default=sys.executable, help="Python with vllm for the bench client")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run at most")
    p.add_argument("--seed", type=int, default=1, help="seeds the runs' seeds")
    p.add_argument("--json", metavar="FILE", help="write the runs and the summary here (after every run)")
    p.add_argument("--cpus", help="run this script and its bench client on these CPUs only (e.g. 8,9,10: "
                   "off a pinned server's cores, bench/pin_server.py)")
    args = p.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})  # the bench client inherits it
    model = args.model or resolve_model(args.url).id
    srv = Server(args.url.rstrip("/"), model, args.tokenizer)
    shape = Shape(args.input_len, args.output_len, args.range_ratio)
    env = dict(os.environ)
    pid = server_pid(srv.url)
    born = None
    if pid is not None:
        try:
            born = psutil.Process(pid).create_time()
        except psutil.Error:
            pass
    seeds = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "url": srv.url, "model": model,
                           "argv": sys.argv[1:] if argv is None else argv, "server_pid": pid,
                           "server_started": born, "ready_at": args.ready_at, "cpus": args.cpus, "runs": runs}
    print(f"server {srv.url} model {model} pid {pid}; started "
          f"{'?' if born is None else time.strftime('%H:%M:%S', time.gmtime(born))} UTC", flush=True)
    t0 = time.time()
    while time.time() - t0 < args.seconds:
        for c in args.concurrency:
            if time.time() - t0 >= args.seconds:
                break
            watch = ServerCpuWatch(pid) if pid is not None else None
            if watch:
                watch.start()
            mhz0 = cpu_mhz()
            start = time.time()
            try:
                r = run_theirs(srv, shape, concurrency=c, rate=None, n=args.waves * c, seed=seeds.randrange(2**31),
                               python=args.bench_python, env=env, timeout_s=args.timeout)
            # a failed run is a row too: the series shows where it broke
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                r = {"error": str(exc)[-500:]}
            r.pop("percentiles_ms", None)
            r.update(concurrency=c, start=start, cpu_mhz=[mhz0, cpu_mhz()],
                     age_s=None if born is None else start - born,
                     since_ready_s=None if args.ready_at is None else start - args.ready_at,
                     server_cpu=watch.stop() if watch else None)
            runs.append(r)
            since = r["since_ready_s"] if r["since_ready_s"] is not None else r["age_s"]
            print(f"{'?' if since is None else f'{since:6.0f}'} s  c{c:<4} "
                  + (f"{r['output_tps']:8.0f} tok/s  TTFT p50/p99 {r['ttft_p50_ms']:5.0f}/{r['ttft_p99_ms']:5.0f}  "
                     f"ITL p50/p99 {r['itl_p50_ms']:5.1f}/{r['itl_p99_ms']:5.1f}  "
                     if "output_tps" in r else f"error: {r['error'][-200:]}  ")
                  + f"MHz {r['cpu_mhz']}  CPU {_cpu_text(r['server_cpu'])}", flush=True)
            out["summary"] = summarize([x for x in runs if "output_tps" in x])
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=1))
    for row in out.get("summary") or []:
        if "last_over_first" in row:
            print(f"c{row['concurrency']}: {row['runs']} runs; first third median {row['first_third_tps']:.0f}, "
                  f"last third {row['last_third_tps']:.0f} tok/s ({row['last_over_first']:.3f}); "
                  f"range {row['min_tps']:.0f}..{row['max_tps']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
