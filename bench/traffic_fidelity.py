"""Traffic fidelity on real vLLM CPU (#57): a source of a known shape feeds a
server; a profile is captured from /metrics alone and from the request log;
each profile is replayed (`probe --burst --traffic`'s path, run_burst with
replay_settings) and the replica is compared with the source.

The source: N requests to /v1/completions, gamma arrivals of
shape --shape (gap CV 1/sqrt(shape)) at --rate req/s, --share of them opening
with one 200-word system prompt, user parts of Pareto(1.2) x 20 words (at most
600), output lengths long-tailed (lognormal, median --out-median, at most 400)
realised as max_tokens with ignore_eos (a random-weight model's EOS cannot be
steered), all seeded by --seed. The source is sent by the same client as
the replicas: run_burst, streamed, each request at its planned time
(`sends`), so source and replica differ only in the requests they send
(--source-client threads: the first record's non-streamed client of Python
threads, for comparison).

Compared, source against each replica: p10/p50/p90 of the prompt and output
lengths (the server's usage of every request), the mean arrival rate
(requests over the span of their sends), the prefix-cache hit rate and,
from vLLM's own /metrics over each window, output tok/s and TTFT p50.

    .venv/bin/python bench/traffic_fidelity.py                       # starts its own server
    .venv/bin/python bench/traffic_fidelity.py --url URL --log LLM.LOG  # a server already up

--source vllm-bench: the source is vLLM's own bench client instead
(bench/vb_source.py: its random dataset, prompt and output lengths uniform
over len * (1 -/+ --vb-range-ratio), one --vb-prefix-len prefix in every
prompt, gamma arrivals of shape --shape at --rate, ignore_eos, seeded by
the round's seed). Captured, replayed and compared as the other source;
its /metrics window opens when the bench client says it sends its first
request and closes when it says its last answer is in (on our clock; its
process starts ~10 s before, vLLM's import and the dataset, which a
capture would read as empty windows). Its row's output tok/s and vLLM TTFT
are the server's /metrics over that window, its client TTFT the bench
client's own per-request timing, and the output tok/s and vLLM TTFT cells
add in brackets what the bench client reported (a cross-check of our
reading). Rerun a seed only on a fresh server: the dataset's prompts are
fixed by it, and the prefix cache would hold them.

Its own server: the tests' tiny model, --enable-log-requests and prefix
caching, VLLM_LOGGING_LEVEL=DEBUG so the log carries each prompt's tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE.parent))  # vb_source, beside this file

from ernie_tui.engine_ctl.load import (  # noqa: E402
    BuiltPrompt,  # noqa: E402
    BurstConfig,
    LengthDist,
    build_profile,
    find_tokenizer,
    from_log_requests,
    from_metrics,
    parse_request_log,
    replay_settings,
    run_burst,
    save_profile,
)
from ernie_tui.engine_ctl.load import metrics as M  # noqa: E402
from vb_source import BenchShape, run_bench_source  # noqa: E402


def tiny_model_dir() -> Path:
    """The tests' tiny ERNIE-4.5-shaped model (imported here, not at the top:
    a GPU run copies src/ and bench/ only, and names its model with --tokenizer)."""
    from vllm_support import tiny_model_dir as tiny

    return Path(tiny())


WORDS = ("the model reads a long prompt and the engine splits it into blocks of the cache so that each "
         "request can share memory with other requests in the same batch").split()


def start_server(port: int, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir()),
            "--served-model-name", "tiny-ernie", "--host", "127.0.0.1", "--port", str(port),
            "--disable-access-log-for-endpoints", "/metrics,/health", "--block-size", "32",
            "--max-model-len", "2048", "--kv-cache-memory-bytes", "67108864", "--enforce-eager",
            "--enable-log-requests", "--enable-prefix-caching"]
    f = open(log, "wb")  # noqa: SIM115 - the server's stdout for its whole life
    proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited; see {log}")
        time.sleep(2)
    raise SystemExit("the server did not get ready")


def source_plan(n: int, rate: float, shape: float, share: float, out_median: float, seed: int) -> list[tuple]:
    """The shape from `seed`; the words new every run (their own generator):
    a server that served a source of the same seed before must not find
    its prompts in the prefix cache."""
    rng = random.Random(seed)
    words_rng = random.Random(random.SystemRandom().randrange(1 << 30))
    system = " ".join(words_rng.choice(WORDS) for _ in range(200))
    t, plan = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, 1 / (rate * shape))
        words = min(int(rng.paretovariate(1.2) * 20), 600)
        user = " ".join(words_rng.choice(WORDS) for _ in range(words))
        prompt = (system + " " + user) if rng.random() < share else user
        out = max(1, min(400, int(rng.lognormvariate(0, 0.9) * out_median)))
        plan.append((t, prompt, out))
    return plan


def run_source(url: str, plan: list[tuple]) -> list[dict]:
    done: list[dict] = [{} for _ in plan]

    def one(i: int, prompt: str, out: int) -> None:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny-ernie", "prompt": prompt, "max_tokens": out,
                                                       "ignore_eos": True}, timeout=600)
        r.raise_for_status()
        u = r.json()["usage"]
        done[i].update(prompt_tokens=u["prompt_tokens"], output_tokens=u["completion_tokens"])

    t0 = time.monotonic()
    threads = []
    for i, (due, prompt, out) in enumerate(plan):
        d = t0 + due - time.monotonic()
        if d > 0:
            time.sleep(d)
        done[i]["sent"] = time.monotonic() - t0
        th = threading.Thread(target=one, args=(i, prompt, out))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return done


def run_source_burst(url: str, plan: list[tuple], tok) -> list[dict]:
    """The source through the replicas' own client: run_burst, streamed,
    each request at its planned time with its max_tokens (ignore_eos)."""
    prompts = [BuiltPrompt(prompt, len(tok.encode(prompt)), len(tok.encode(prompt))) for _, prompt, _ in plan]
    t_last = plan[-1][0]
    cfg = BurstConfig(n=len(plan), seed=0, concurrency=0, rate=len(plan) / t_last, warmup=False, ignore_eos=True,
                      max_tokens=max(o for _, _, o in plan), min_tokens=1, max_tokens_in=max(p.tokens for p in prompts))
    r = run_burst(url, cfg, prompts=prompts, sends=[(t, o) for t, _, o in plan], tokenizer=tok, use_metrics=False)
    if r.failed:
        print(f"source: {r.failed} failed", file=sys.stderr)
    return [{"sent": x.start_offset_s, "prompt_tokens": x.prompt_tokens, "output_tokens": x.completion_tokens,
             "ttft_s": x.ttft_s} for x in r.requests if x.ok]


def scrape(url: str) -> M.MetricsSnapshot:
    with M.MetricsClient(url, timeout=30) as c:
        return c.fetch()


def server_view(before: M.MetricsSnapshot, after: M.MetricsSnapshot, span_s: float) -> dict:
    ttft = M.histogram_delta(before, after, M.TTFT)
    gen = M.counter_delta(before, after, M.GENERATION_TOKENS) or 0.0
    q = M.counter_delta(before, after, M.PREFIX_QUERIES) or 0.0
    h = M.counter_delta(before, after, M.PREFIX_HITS) or 0.0
    return {"ttft_p50_s": ttft.quantile(0.5) if ttft else None, "output_tps": gen / span_s if span_s else None,
            "prefix_hit_rate": h / q if q else None}


def lengths(values: list[int]) -> dict:
    d = LengthDist.from_values(values)
    return {f"p{int(q * 100)}": round(d.quantile(q), 1) for q in (0.1, 0.5, 0.9)}


def client_ttft_p50(values: list) -> float | None:
    """The client's own TTFT p50 (each request timed to its first token):
    finer than vLLM's histogram, whose 10-20 ms bucket holds this model's
    whole p50 and is read by interpolating inside it."""
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def measure_source(url: str, plan: list[tuple] | BenchShape, log: Path, interval: float, client: str,
                   tok, n: int = 0, seed: int = 0, tokenizer_dir: str = "") -> tuple[dict, list]:
    """The source's row and its two captures. `plan` is a BenchShape for
    client "vllm-bench" (n requests from seed, tokenizer_dir for it)."""
    offset = log.stat().st_size
    snaps: list[M.MetricsSnapshot] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            snaps.append(scrape(url))

    w = threading.Thread(target=watch, daemon=True)
    window: dict = {}

    def begin() -> None:
        """The /metrics window opens: now for our own clients; for vLLM's
        bench client when it says it sends its first request (its process's
        start, ~10 s before, would be read as empty windows of traffic)."""
        window["before"] = scrape(url)
        window["t0"] = time.monotonic()
        w.start()

    bench = None
    if isinstance(plan, BenchShape):
        done, bench = run_bench_source(url, tokenizer_dir, plan, n, seed, on_start=begin)
        if "t0" not in window:
            raise RuntimeError("vLLM's bench client never said it began sending (its output has changed?)")
        # to when it said its last answer was in, on our clock (its own
        # duration is the cross-check: row["bench_client"]["duration_s"])
        span = (bench.pop("ended_at") or time.monotonic()) - window["t0"]
    else:
        begin()
        done = run_source_burst(url, plan, tok) if client == "burst" else run_source(url, plan)
        span = time.monotonic() - window["t0"]
    before = window["before"]
    stop.set()
    w.join()
    time.sleep(1.5)
    after = scrape(url)
    with open(log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", "replace").splitlines()
    sends = [d["sent"] for d in done]
    row = {"prompt": lengths([d["prompt_tokens"] for d in done]), "output": lengths([d["output_tokens"] for d in done]),
           "rate": (len(sends) - 1) / (max(sends) - min(sends)), "span_s": span,
           "client_ttft_p50_s": client_ttft_p50([d.get("ttft_s") for d in done]),
           **server_view(before, after, span)}
    if bench is not None:
        row["bench_client"] = bench
    caps = [from_metrics(before, after, snaps), from_log_requests(parse_request_log(lines))]
    return row, caps


def measure_replay(url: str, profile, n: int, seed: int, tok, arrivals: str) -> dict:
    from dataclasses import replace

    cfg = replace(BurstConfig(n=n, seed=seed, concurrency=0, rate=profile.arrivals.rate_per_s, warmup=False,
                              arrival_seed=seed), **replay_settings(profile, arrivals=arrivals))
    before = scrape(url)
    t0 = time.monotonic()
    r = run_burst(url, cfg, tokenizer=tok, use_metrics=False)
    span = time.monotonic() - t0
    time.sleep(1.5)
    after = scrape(url)
    ok = [x for x in r.requests if x.ok]
    sched = [x.scheduled_offset_s for x in r.requests if x.scheduled_offset_s is not None]
    return {"prompt": lengths([x.prompt_tokens for x in ok]), "output": lengths([x.completion_tokens for x in ok]),
            "rate": (len(sched) - 1) / (max(sched) - min(sched)), "failed": r.failed, "span_s": span,
            "client_ttft_p50_s": client_ttft_p50([x.ttft_s for x in ok]),
            **server_view(before, after, span)}


def _pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or a == 0 else f"{(b - a) / a * 100:+.0f} %"


def _quantiles(rep: dict, src: dict, kind: str) -> str:
    return " / ".join(f"{rep[kind][p]:.0f}" + ("" if rep is src else f" ({_pct(src[kind][p], rep[kind][p])})")
                      for p in ("p10", "p50", "p90"))


def _value(rep: dict, src: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    x = rep.get(key)
    s = "-" if x is None else format(x * scale, fmt)
    if rep is src:
        # vLLM's bench client as the source: what it reported (output tok/s,
        # TTFT p50), beside our reading of the server's /metrics
        theirs = (rep.get("bench_client") or {}).get(key)
        return s if theirs is None else f"{s} [bench {theirs * scale:{fmt}}]"
    return f"{s} ({_pct(src.get(key), x)})"


def _hits(rep: dict, src: dict) -> str:
    hits = rep.get("prefix_hit_rate")
    text = "-" if hits is None else f"{hits * 100:.0f} %"
    if rep is not src and hits is not None and src.get("prefix_hit_rate") is not None:
        text += f" ({(hits - src['prefix_hit_rate']) * 100:+.0f} pts)"
    return text


def summarise(rows: list[dict]) -> str:
    """A Markdown table from the JSON lines: each replica against its round's source."""
    out = ["| round | replica | prompt p10 / p50 / p90 | output p10 / p50 / p90 | rate req/s | prefix hits "
           "| output tok/s | TTFT p50 ms (vLLM) | TTFT p50 ms (client) |", "|---|---|---|---|---|---|---|---|---|"]
    src: dict = {}
    for r in rows:
        if "source" in r:
            src = rep = r["source"]
            name = "source"
        elif "replica" in r:
            rep, name = r, r["replica"]
        else:
            continue
        out.append(f"| {r['round']} | {name} | {_quantiles(rep, src, 'prompt')} | {_quantiles(rep, src, 'output')} "
                   f"| {_value(rep, src, 'rate', '.3f')} | {_hits(rep, src)} | {_value(rep, src, 'output_tps', '.1f')} "
                   f"| {_value(rep, src, 'ttft_p50_s', '.1f', 1000)} "
                   f"| {_value(rep, src, 'client_ttft_p50_s', '.1f', 1000)} |")
    return "\n".join(out)


def windows_table(keep: Path, n: int, rate: float, shape: float, share: float, out_median: float, seed: int,
                  rounds: int) -> str:
    """How the sends of each round's replicas fall in the windows of the
    profile's rate series, beside the source's (all recomputed from the
    seeds and the profiles kept with --keep; no server): the distance
    sum |replica - source| / N over the windows, and the gap CVs."""
    from ernie_tui.engine_ctl.load import TrafficProfile, arrival_offsets, curve_of, curve_offsets

    def counts(ts: list[float], w: float, k: int) -> list[int]:
        out = [0] * k
        for t in ts:
            i = int((t - ts[0]) // w)
            if i < k:
                out[i] += 1
        return out

    def gap_cv(ts: list[float]) -> float:
        g = [b - a for a, b in zip(ts, ts[1:], strict=False)]
        return statistics.stdev(g) / statistics.mean(g)

    rows = ["| round | capture | windows | source per window (first 12) | curve replica | mean replica "
            "| distance curve / mean | gap CV source / curve / mean |", "|---|---|---|---|---|---|---|---|"]
    for rnd in range(rounds):
        src = [t for t, _, _ in source_plan(n, rate, shape, share, out_median, seed + rnd)]
        for cap in ("request-log", "metrics"):
            prof = TrafficProfile.from_json((keep / f"round{rnd + 1}-{cap}.json").read_text())
            a = prof.arrivals
            curve = curve_of(prof)
            if curve is None or not a.window_s:
                continue
            cur = curve_offsets(curve, n, a.rate_per_s, seed=seed + rnd)
            mean = arrival_offsets(n, a.rate_per_s, seed=seed + rnd, burstiness=a.gamma_shape)
            w, k = a.window_s, len(a.rate_series)
            cs, cc, cm = counts(src, w, k), counts(cur, w, k), counts(mean, w, k)
            dist = [sum(abs(x - y) for x, y in zip(cs, c, strict=True)) / sum(cs) for c in (cc, cm)]
            rows.append(f"| {rnd + 1} | {cap} | {k} x {w:.2f} s | {' '.join(map(str, cs[:12]))} "
                        f"| {' '.join(map(str, cc[:12]))} | {' '.join(map(str, cm[:12]))} "
                        f"| {dist[0]:.2f} / {dist[1]:.2f} "
                        f"| {gap_cv(src):.2f} / {gap_cv(cur):.2f} / {gap_cv(mean):.2f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--log", help="with --url: the server's log (needs --enable-log-requests)")
    ap.add_argument("--port", type=int, default=28571)
    ap.add_argument("-n", type=int, default=60)
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--shape", type=float, default=0.4)
    ap.add_argument("--share", type=float, default=0.7)
    ap.add_argument("--out-median", type=float, default=40)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--summarise", metavar="FILE.jsonl", help="print the table of an earlier run's output")
    ap.add_argument("--keep", metavar="DIR", help="write each round's captured profiles there")
    ap.add_argument("--source-client", choices=["burst", "threads"], default="burst",
                    help="burst (default): the source sent by run_burst, as the replicas are; threads: the "
                         "first record's non-streamed client of Python threads")
    ap.add_argument("--aa", action="store_true",
                    help="also send a second source of the same shape from another seed (seed + 1000): how far "
                         "two draws of the source itself differ, the floor under any replica's difference")
    ap.add_argument("--replicas", default="metrics:curve,request-log:curve,request-log:mean",
                    help="the replicas of each round: capture:arrivals, arrivals curve (the profile's rate "
                         "window by window) or mean (gamma gaps at its mean rate)")
    ap.add_argument("--source", choices=["plan", "vllm-bench"], default="plan",
                    help="plan (default): the source_plan shape, sent by --source-client; vllm-bench: vLLM's own "
                         "bench client sends the source (its random dataset, the --vb-* shape, gamma arrivals of "
                         "--shape at --rate, -n requests, seeded by the round's seed)")
    vb = BenchShape()
    ap.add_argument("--vb-input-len", type=int, default=vb.input_len,
                    help="vllm-bench: the prompt's drawn part, tokens (before the prefix)")
    ap.add_argument("--vb-output-len", type=int, default=vb.output_len, help="vllm-bench: output tokens")
    ap.add_argument("--vb-range-ratio", type=float, default=vb.range_ratio,
                    help="vllm-bench: both lengths uniform over len * (1 - r) .. len * (1 + r)")
    ap.add_argument("--vb-prefix-len", type=int, default=vb.prefix_len,
                    help="vllm-bench: tokens of one prefix every prompt opens with")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="the served model's directory (its tokenizer.json; the bench client's --tokenizer); "
                         "default the tests' tiny model")
    ap.add_argument("--windows", metavar="DIR", help="with the -n, --seed and --rounds of an earlier run, the "
                    "profiles it kept (--keep DIR): the sends per window of its replicas against its source")
    args = ap.parse_args()
    if args.windows:
        print(windows_table(Path(args.windows), args.n, args.rate, args.shape, args.share, args.out_median,
                            args.seed, args.rounds))
        return 0
    if args.summarise:
        print(summarise([json.loads(line) for line in Path(args.summarise).read_text().splitlines() if line]))
        return 0
    rows: list[dict] = []
    proc = None
    if args.url:
        url, log = args.url, Path(args.log)
    else:
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"traffic-fidelity-{os.getpid()}.log"
        proc = start_server(args.port, log)
        url = f"http://127.0.0.1:{args.port}"
    tok_dir = str(args.tokenizer or tiny_model_dir())
    tok = find_tokenizer(tok_dir)  # its tokenizer.json
    try:
        for rnd in range(args.rounds):
            seed = args.seed + rnd
            plan: list[tuple] | BenchShape
            if args.source == "vllm-bench":
                plan = BenchShape(args.vb_input_len, args.vb_output_len, args.vb_range_ratio, args.vb_prefix_len,
                                  args.rate, args.shape)
            else:
                plan = source_plan(args.n, args.rate, args.shape, args.share, args.out_median, seed)
            src, caps = measure_source(url, plan, log, args.interval, args.source_client, tok, args.n, seed, tok_dir)
            rows.append({"round": rnd + 1, "source": src})
            print(json.dumps(rows[-1]), flush=True)
            profiles = {"metrics": build_profile("metrics", [caps[0]]),
                        "request-log": build_profile("request-log", [caps[1]])}
            for name, prof in profiles.items():
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)  # --keep DIR need not exist yet
                    save_profile(prof, Path(args.keep) / f"round{rnd + 1}-{name}.json")
                print(json.dumps({"round": rnd + 1, "profile": name, "cv": prof.arrivals.cv,
                                  "rate": prof.arrivals.rate_per_s, "window_s": prof.arrivals.window_s,
                                  "series": prof.arrivals.rate_series, "prefix": prof.prefix.__dict__,
                                  "notes": prof.notes}), flush=True)
            if args.aa:
                again = plan if isinstance(plan, BenchShape) else source_plan(args.n, args.rate, args.shape,
                                                                              args.share, args.out_median, seed + 1000)
                other, _ = measure_source(url, again, log, args.interval, args.source_client, tok, args.n,
                                          seed + 1000, tok_dir)
                rows.append({"round": rnd + 1, "replica": "source, another draw", **other})
                print(json.dumps(rows[-1]), flush=True)
            for spec in args.replicas.split(","):
                name, arrivals = spec.split(":")
                rep = measure_replay(url, profiles[name], args.n, seed, tok, arrivals)
                rows.append({"round": rnd + 1, "replica": f"{name} ({arrivals})", **rep})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print(summarise(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
