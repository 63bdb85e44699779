"""#57's decision goal: does a captured replica rank two presets as their
source traffic does, where the default load ranks them the other way?

Two paced stand-ins (tests/paced_server.py, 8 slots, 5 ms base TTFT, a
prefix cache of 16-token blocks, max_model_len 16,384) play two presets:
- "fast-decode": 4 ms between tokens, 1 ms of prefill per uncached prompt token;
- "fast-prefill": 12 ms between tokens, 0.05 ms per uncached prompt token.

The source (written here; the tool did not generate it): -n requests to
/v1/completions, gamma arrivals of shape --shape (gap CV 1/sqrt(shape)) at
--rate req/s; a --share of them open with one system prompt of --system
words; user parts of Pareto(1.3) x --user-scale words (at most 3,000); answers
long-tailed and short, lognormal(0, 1) x --out-median tokens (at most 300),
realised as max_tokens (the stand-in never stops early). Its words and
shape come from the run's seed, the same for both presets. It is sent by
the tool's burst client (run_burst, each request at its planned time), so
source and replica differ only in the requests they send, and it leaves a
JSONL trace as a gateway would log it (timestamp, body, usage).

Each run, on freshly started stand-ins (empty prefix caches):
1. the source on both presets (order alternating by run). While it feeds
   fast-decode (the operator's current preset: the default load's pick),
   `ernie-tui traffic capture --url ... --interval 2` watches that
   stand-in's /metrics, and its window is ended (SIGTERM, which ends it as
   Ctrl-C does) once the last answer is in;
2. `ernie-tui traffic capture --trace` of the source's trace;
3. on both presets, through the CLI itself: `ernie-tui probe --burst N
   --traffic PROFILE --seed S` for the /metrics profile and the trace
   profile (the profile's own arrivals, as probe sends them), and the
   default load twice: `probe --burst N --seed S` (today's default: prompts
   of 30-300 tokens, 128 output tokens, concurrency 4) and the same shape
   open-loop at the source's mean rate (`--rate R --arrivals poisson`).
Every load ranks the presets by the mean end-to-end latency of its
requests (the client's, first byte sent to last token); lower wins.

    nice -n 15 .venv/bin/python bench/traffic_decision_replica.py --runs 5 --keep DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from ernie_tui.engine_ctl.load import BuiltPrompt, BurstConfig, LengthDist, load_profile, run_burst  # noqa: E402
from traffic_decision import COMMON as DECISION_COMMON  # noqa: E402  (bench/ is no package)
from traffic_decision import STAND_INS  # noqa: E402
from traffic_decision import start as start_paced  # noqa: E402

COMMON = [*DECISION_COMMON, "--prefix-block", "16"]
CAPTURED_ON = "fast-decode"
LOADS = ("source", "replica: /metrics", "replica: trace", "default (c=4)", "default at the source's rate")


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    return start_paced(args, COMMON)  # with block-counted prefix hits (--prefix-block)


def shape_of_plan(plan: list[tuple[float, str, int]], system: int, share: float) -> dict:
    """The source's own shape, as a profile would say it."""
    times = [t for t, _, _ in plan]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    head = plan_head(plan, system)
    return {"prompt": quantiles([len(p.split()) for _, p, _ in plan]), "output": quantiles([o for _, _, o in plan]),
            "rate": (len(plan) - 1) / (times[-1] - times[0]), "cv": statistics.stdev(gaps) / statistics.fmean(gaps),
            "prefix_share": sum(p.startswith(head) for _, p, _ in plan) / len(plan), "prefix_tokens": system}


def plan_head(plan: list[tuple[float, str, int]], system: int) -> str:
    """The system prompt: the first `system` words of the longest prompt
    that carries it (the longest prompt among those that open alike)."""
    firsts: dict[str, int] = {}
    for _, p, _ in plan:
        firsts[p.split(" ", 1)[0]] = firsts.get(p.split(" ", 1)[0], 0) + 1
    top = max(firsts, key=firsts.__getitem__)
    carrier = next(p for _, p, _ in plan if p.startswith(top + " ") and len(p.split()) > system)
    return " ".join(carrier.split()[:system]) + " "


def shape_of_profile(path: Path) -> dict:
    prof = load_profile(str(path))
    a, pre = prof.arrivals, prof.prefix
    return {"prompt": {q: round(prof.prompt_tokens.quantile(q / 100)) for q in (10, 50, 90)},
            "output": {q: round(prof.output_tokens.quantile(q / 100)) for q in (10, 50, 90)},
            "rate": a.rate_per_s, "cv": a.cv, "prefix_share": pre.share, "prefix_tokens": pre.tokens,
            "hit_rate": pre.hit_rate}


def quantiles(values: list[int]) -> dict:
    d = LengthDist.from_values(values)
    return {q: round(d.quantile(q / 100)) for q in (10, 50, 90)}


def source_plan(n: int, rate: float, shape: float, share: float, system_words: int, user_scale: float,
                out_median: float, seed: int) -> list[tuple[float, str, int]]:
    """(send offset s, prompt, max_tokens) for each request, all from `seed`."""
    rng = random.Random(f"decision-source-{seed}")
    vocab = [f"v{k}" for k in range(5000)]  # words of its own: none is a filler word the replicas draw
    system = " ".join(rng.choice(vocab) for _ in range(system_words))
    t, plan = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, 1 / (rate * shape))
        user = " ".join(rng.choice(vocab) for _ in range(min(3000, int(rng.paretovariate(1.3) * user_scale))))
        prompt = (system + " " + user) if rng.random() < share else user
        out = max(1, min(300, int(rng.lognormvariate(0, 1.0) * out_median)))
        plan.append((t, prompt, out))
    return plan


def send_source(url: str, plan: list[tuple[float, str, int]], trace: Path | None) -> dict:
    """The source through run_burst (each request at its planned time, its
    max_tokens); with `trace`, its JSONL trace as a gateway would log it."""
    prompts = [BuiltPrompt(p, len(p.split()), len(p.split())) for _, p, _ in plan]
    cfg = BurstConfig(n=len(plan), seed=0, concurrency=0, rate=len(plan) / plan[-1][0], warmup=False,
                      ignore_eos=True, max_tokens=max(o for _, _, o in plan), min_tokens=1,
                      max_tokens_in=max(p.tokens for p in prompts))
    wall0 = time.time()
    r = run_burst(url, cfg, prompts=prompts, sends=[(t, o) for t, _, o in plan], use_metrics=False)
    if trace is not None:
        with open(trace, "w", encoding="utf-8") as f:
            for (due, prompt, out), x in zip(plan, r.requests, strict=True):
                line = {"timestamp": round(wall0 + (x.start_offset_s if x.start_offset_s is not None else due), 4),
                        "body": {"model": "paced", "prompt": prompt, "max_tokens": out, "ignore_eos": True}}
                if x.ok:
                    line["usage"] = {"prompt_tokens": x.prompt_tokens, "completion_tokens": x.completion_tokens}
                    line["finish_reason"] = x.finish_reason
                f.write(json.dumps(line) + "\n")
    return summary([x.latency_s for x in r.requests if x.ok], [x.ttft_s for x in r.requests if x.ok],
                   r.failed, r.requests_per_s)


def summary(lat: list, ttft: list, failed: int, rps: float | None) -> dict:
    lat = [v for v in lat if v is not None]
    ttft = [v for v in ttft if v is not None]
    return {"e2e_mean_s": statistics.fmean(lat) if lat else None,
            "e2e_p50_s": statistics.median(lat) if lat else None,
            "ttft_p50_s": statistics.median(ttft) if ttft else None, "ok": len(lat), "failed": failed,
            "req_per_s": rps}


def cli(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-m", "ernie_tui", *args], env=env, capture_output=True, text=True, **kw)
    if check and out.returncode != 0:
        raise SystemExit(f"ernie-tui {' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out


def probe(url: str, *args: str) -> dict:
    out = json.loads(cli("probe", "--url", url, "--json", "--no-save", *args).stdout)
    lat = out.get("latency") or {}
    return {"e2e_mean_s": lat.get("mean"), "e2e_p50_s": lat.get("p50"),
            "ttft_p50_s": (out.get("ttft") or {}).get("p50"),
            "ok": out.get("completed"), "failed": out.get("failed"), "req_per_s": out.get("requests_per_s")}


def start_capture(url: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "ernie_tui", "traffic", "capture", "--url", url, "--window", "30m",
                             "--interval", "2", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline() if proc.stderr else ""
    if not line.startswith("watching "):
        raise SystemExit(f"traffic capture did not start: {line}")
    time.sleep(0.5)  # its first scrape
    return proc


def end_capture(proc: subprocess.Popen) -> None:
    # SIGTERM ends the window as Ctrl-C does (cli/interruptible.py) and is
    # handled even where a shell started this bench in the background, with
    # SIGINT ignored (which the capture then inherits and never sees).
    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if proc.returncode != 0:
        raise SystemExit(f"traffic capture failed ({proc.returncode}): {err[-2000:]}")


def one_run(run: int, seed: int, args: argparse.Namespace, keep: Path) -> dict:
    servers = {name: start(extra) for name, extra in STAND_INS.items()}
    order = list(servers) if run % 2 else list(reversed(servers))
    res: dict[str, dict[str, dict]] = {load: {} for load in LOADS}
    try:
        plan = source_plan(args.n, args.rate, args.shape, args.share, args.system, args.user_scale,
                           args.out_median, seed)
        metrics_profile, trace, trace_profile = keep / f"run{run}-metrics.json", keep / f"run{run}-trace.jsonl", \
            keep / f"run{run}-trace.json"
        for name in order:
            url = servers[name][1]
            cap = start_capture(url, metrics_profile) if name == CAPTURED_ON else None
            res["source"][name] = send_source(url, plan, trace if name == CAPTURED_ON else None)
            if cap is not None:
                end_capture(cap)
        cli("traffic", "capture", "--trace", str(trace), "--out", str(trace_profile))
        source_rate = len(plan) / plan[-1][0]
        for name in order:
            url = servers[name][1]
            s = str(seed)
            res["replica: /metrics"][name] = probe(url, "--burst", str(args.n), "--traffic", str(metrics_profile),
                                                   "--seed", s, "--arrival-seed", s)
            res["replica: trace"][name] = probe(url, "--burst", str(args.n), "--traffic", str(trace_profile),
                                                "--seed", s, "--arrival-seed", s)
            res["default (c=4)"][name] = probe(url, "--burst", str(args.n), "--seed", s)
            res["default at the source's rate"][name] = probe(url, "--burst", str(args.n), "--seed", s, "--rate",
                                                              f"{source_rate:.3f}", "--arrivals", "poisson",
                                                              "--arrival-seed", s)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    shapes = {"source": shape_of_plan(plan, args.system, args.share), "/metrics": shape_of_profile(metrics_profile),
              "trace": shape_of_profile(trace_profile)}
    return {"run": run, "seed": seed, "order": order, "source_rate": source_rate, "loads": res, "shapes": shapes,
            "winners": {load: min(r, key=lambda k: r[k]["e2e_mean_s"] or float("inf")) for load, r in res.items()}}


def table(rows: list[dict]) -> str:
    names = list(STAND_INS)
    out = ["| run (seed) | load | " + " / ".join(names) + ": mean e2e s | ratio | req/s | TTFT p50 ms | better |",
           "|---|---|---|---|---|---|---|"]
    for row in rows:
        for load in LOADS:
            r = row["loads"][load]
            fmt = " / ".join(f"{r[n]['e2e_mean_s']:.3f}" for n in names) + \
                f" | {r[names[0]]['e2e_mean_s'] / r[names[1]]['e2e_mean_s']:.2f}"
            rps = " / ".join(f"{r[n]['req_per_s']:.2f}" for n in names)
            ttft = " / ".join(f"{r[n]['ttft_p50_s'] * 1000:.0f}" for n in names)
            fails = sum(r[n]["failed"] or 0 for n in names)
            out.append(f"| {row['run']} ({row['seed']}) | {load} | {fmt} | {rps} | {ttft} | {row['winners'][load]}"
                       + (f" ({fails} failed)" if fails else "") + " |")
    return "\n".join(out)


def shapes_table(rows: list[dict]) -> str:
    out = ["| run | shape of | prompt p10 / p50 / p90 | output p10 / p50 / p90 | rate req/s | gap CV "
           "| shared prefix |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        for name, sh in row["shapes"].items():
            pre = f"{sh['prefix_share'] * 100:.0f} % x {sh['prefix_tokens']}"
            if sh.get("hit_rate") is not None:
                pre += f" (hit rate {sh['hit_rate'] * 100:.0f} %)"
            q = lambda d: " / ".join(str(d[k]) for k in sorted(d, key=int))  # noqa: E731
            out.append(f"| {row['run']} | {name} | {q(sh['prompt'])} | {q(sh['output'])} | {sh['rate']:.2f} "
                       f"| {sh['cv']:.2f} | {pre} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1, help="run k uses seed + k - 1")
    ap.add_argument("-n", type=int, default=60)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--shape", type=float, default=0.35)
    ap.add_argument("--share", type=float, default=0.6)
    ap.add_argument("--system", type=int, default=512, help="words (tokens) of the shared system prompt")
    ap.add_argument("--user-scale", type=float, default=80, help="the user parts' Pareto(1.3) scale, words")
    ap.add_argument("--out-median", type=float, default=12)
    ap.add_argument("--keep", metavar="DIR", help="keep the traces, profiles and results here (default: a temp dir)")
    ap.add_argument("--table", metavar="FILE.jsonl", help="print the table of an earlier run's results")
    args = ap.parse_args()
    if args.table:
        rows = [json.loads(s) for s in Path(args.table).read_text().splitlines() if s.strip()]
        print(table(rows) + "\n\n" + shapes_table(rows))
        return 0
    keep = Path(args.keep or f"/tmp/traffic-decision-{os.getpid()}")
    keep.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in range(1, args.runs + 1):
        row = one_run(run, args.seed + run - 1, args, keep)
        rows.append(row)
        with open(keep / "results.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({"run": run, "winners": row["winners"], "load": os.getloadavg()[0]}), flush=True)
    print(table(rows) + "\n\n" + shapes_table(rows))
    src = [r["winners"]["source"] for r in rows]
    for load in LOADS[1:]:
        same = sum(r["winners"][load] == s for r, s in zip(rows, src, strict=True))
        print(f"{load}: ranks as the source in {same} of {len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
