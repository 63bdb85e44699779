"""Our capacity search against GuideLLM's goodput search, on one server.

Both tools search the same way (double the concurrency until a level misses
the objectives, then bisect between the highest pass and the lowest fail until
they are within the tolerance), so they should find the same capacity; ours
should take at most half the wall time, because a level stops as soon as a
confidence bound decides it, where GuideLLM runs each level to its request or
time budget.

Rounds alternate the tool that goes first. Each run gets fresh prompts (a new
seed), written once as JSONL and given to both tools, so both send the same
prompts of exactly --prompt-tokens tokens with --max-tokens output tokens
(ignore_eos). What each tool is given:

    ours                          GuideLLM 0.8.1 (`run --profile kind=goodput`)
    --slo ttft_p95=100ms          slo {"ttft_ms": 100}, target_attainment 0.95
    --slo e2e_p95=2s              slo {"e2el_ms": 2000}
    --slo itl_p95=50ms            slo {"tpot_ms": 50}  (approximate, see below)
    --start-concurrency C         initial_streams C
    --max-concurrency C           max_streams C
    --tolerance F                 tolerance F
    --confidence P                confidence P (its Wilson interval; report only)
    --max-requests N              constraint max_requests N (per level)
    --level-time S                constraint max_duration S (per level)
    --workload FILE               json_file FILE (prompt, output_tokens_count)

The objectives map exactly only for one ttft or e2e objective: "the pNN is
within the limit" is "at least NN % of requests are within it". GuideLLM's
tpot is each request's mean token gap, ours the pNN of every gap; and with
several objectives GuideLLM asks NN % of requests to meet all at once, ours
each percentile on its own. All objectives must share one percentile.

    .venv/bin/python bench/capacity_vs_guidellm.py --server paced --rounds 2
    .venv/bin/python bench/capacity_vs_guidellm.py --server vllm --slo ttft_p95=300ms --rounds 2
    .venv/bin/python bench/capacity_vs_guidellm.py --url http://127.0.0.1:8000 --model-dir DIR

Goals: both capacities within the tolerance of each other; ours <= 0.5x
GuideLLM's wall time. GuideLLM conflicts with vLLM's pins: install it in a
venv of its own and pass --guidellm VENV/bin/guidellm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ernie_tui.demo_model import write_demo_model  # noqa: E402
from ernie_tui.engine_ctl.launch import free_port  # noqa: E402
from ernie_tui.engine_ctl.load import (  # noqa: E402  # noqa: E402  # noqa: E402
    REQUEST_SUCCESS,
    TTFT,
    BurstConfig,
    MetricsClient,
    MetricsSnapshot,
    Objective,
    burst_workload,
    counter_delta,
    find_tokenizer,
    histogram_delta,
    parse_slo,
    resolve_model,
)

GUIDELLM_SLO_KEYS = {"ttft": "ttft_ms", "e2e": "e2el_ms", "itl": "tpot_ms"}


# -- objectives ------------------------------------------------------------------

def guidellm_objectives(slo: list[Objective]) -> tuple[dict[str, float], float, list[str]]:
    """GuideLLM's slo dict and target attainment for our objectives, and notes
    where the two do not mean quite the same."""
    pcts = {o.percentile for o in slo}
    if len(pcts) != 1:
        raise SystemExit("GuideLLM has one target attainment: give every --slo the same percentile")
    notes = []
    if any(o.metric == "itl" for o in slo):
        notes.append("itl: GuideLLM's tpot is each request's mean token gap, ours the percentile of every gap")
    if len(slo) > 1:
        notes.append("several objectives: GuideLLM asks the share of requests meeting all of them at once, "
                     "ours each percentile on its own")
    return ({GUIDELLM_SLO_KEYS[o.metric]: o.limit_s * 1000.0 for o in slo}, pcts.pop() / 100.0, notes)


# -- servers ---------------------------------------------------------------------

def wait_health(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} was not ready after {timeout:.0f} s")


def start_server(kind: str, args: argparse.Namespace, workdir: Path) -> tuple[str, subprocess.Popen]:
    port = free_port()
    if kind == "paced":
        argv = [sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", str(port),
                "--slots", str(args.paced_slots), "--ttft-ms", str(args.paced_ttft_ms),
                "--itl-ms", str(args.paced_itl_ms), "--itl-knee", str(args.paced_itl_knee),
                "--itl-slope-ms", str(args.paced_itl_slope_ms), "--itl-wander", str(args.paced_itl_wander)]
    else:
        # Prefix caching off: GuideLLM may send a prompt again at a later level
        # (and the tools follow each other on one server); a cache hit would
        # make that level look cheaper for one tool only.
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model_dir),
                "--host", "127.0.0.1", "--port", str(port), "--block-size", "32",
                "--kv-cache-memory-bytes", args.kv_cache, "--no-enable-prefix-caching"]
    # Same session as the clients, not a new one: with the kernel's
    # autogroup scheduling, a server in a session of its own shares one
    # group's CPU among its busy threads, and on two shared cores the API
    # server then delivered tokens ~100 ms after vLLM's own TTFT (5 ms).
    with open(workdir / f"{kind}-server.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc, 600 if kind == "vllm" else 30)
    return url, proc


def stop_server(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGKILL, to the server and every process it started."""
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        for p in tree:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(tree, timeout=wait)
        if not alive:
            break
    proc.poll()


# -- the shared workload ---------------------------------------------------------

def write_workload(url: str, model: str, model_dir: Path | None, args: argparse.Namespace, seed: int,
                   path: Path) -> int:
    """Prompts of exactly --prompt-tokens tokens (the server's tokenizer), one
    JSON line each, with the keys both tools read. Enough that neither tool
    runs out: GuideLLM stops a level when its data ends."""
    tok = find_tokenizer(model_dir, None, url, model)
    n = max(2 * args.max_requests + args.max_concurrency, 64)
    cfg = BurstConfig(min_tokens=args.prompt_tokens, max_tokens_in=args.prompt_tokens,
                      max_tokens=args.max_tokens, seed=seed)
    items = burst_workload(cfg, tok, size=n).items
    with path.open("w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps({"prompt": it.prompt, "max_tokens": it.max_tokens,
                                "prompt_tokens_count": it.prompt_tokens,
                                "output_tokens_count": it.max_tokens}) + "\n")
    return len(items)


# -- the server's own view of GuideLLM's levels ------------------------------------

class MetricsRecorder(threading.Thread):
    """Scrapes /metrics twice a second while GuideLLM runs, so each of its
    levels (start and end times in its JSON) can be set beside vLLM's own TTFT
    histogram for that window, as our levels carry it."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = MetricsClient(url)
        self.snaps: list[MetricsSnapshot] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            snap = self.client.try_fetch(only=(*TTFT, *REQUEST_SUCCESS))
            if snap is not None:
                self.snaps.append(snap)
            self.halt.wait(0.5)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.client.close()

    def window(self, start: float, end: float) -> dict[str, float | None] | None:
        """vLLM's TTFT p50/p99 (ms) between the last scrape before `start` and
        the first after `end` (wall-clock seconds)."""
        before = [x for x in self.snaps if x.timestamp <= start]
        after = [x for x in self.snaps if x.timestamp >= end]
        if not before or not after:
            return None
        h = histogram_delta(before[-1], after[0], TTFT)

        def q(p: float) -> float | None:
            v = h.quantile(p) if h is not None else None
            return None if v is None else v * 1000.0

        return {"ttft_p50_ms": q(0.5), "ttft_p99_ms": q(0.99),
                "requests_finished": counter_delta(before[-1], after[0], REQUEST_SUCCESS)}


# -- the two tools ---------------------------------------------------------------

def run_ours(url: str, args: argparse.Namespace, workload: Path, log: Path) -> dict:
    argv = [sys.executable, "-m", "ernie_tui", "probe", "--url", url, "--capacity", "--json", "--no-save",
            "--workload", str(workload), "--max-tokens", str(args.max_tokens),
            "--start-concurrency", str(args.start_concurrency), "--max-concurrency", str(args.max_concurrency),
            "--tolerance", str(args.tolerance), "--confidence", str(args.confidence)]
    if not args.defaults:
        argv += ["--min-requests", str(args.min_requests), "--max-requests", str(args.max_requests),
                 "--level-time", str(args.level_time)]
    for o in args.slo:
        argv += ["--slo", o]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    log.write_text(p.stdout + p.stderr)
    try:
        r = json.loads(p.stdout)
    except ValueError:
        raise SystemExit(f"our search failed ({p.returncode}); see {log}") from None
    cap = r.get("capacity") or {}
    return {"tool": "ours", "capacity": cap.get("concurrency"), "wall_s": wall,
            "goodput_rps": cap.get("goodput_rps"), "goodput_output_tps": cap.get("goodput_output_tps"),
            "levels": [lv["concurrency"] for lv in r["levels"]],
            "requests": sum(lv["requests"] for lv in r["levels"]),
            "verdicts": {lv["concurrency"]: ("pass" if lv["passed"] else "fail") for lv in r["levels"]},
            "per_level": [{"concurrency": lv["concurrency"], "requests": lv["requests"], "seconds": lv["seconds"],
                           "requests_per_s": lv["requests_per_s"], "ttft_p50_ms": lv["ttft_p50_ms"],
                           "ttft_p95_ms": _pct(lv["objectives"], "ttft"), "attainment": lv["attainment"],
                           "passed": lv["passed"], "vllm": lv.get("vllm")} for lv in r["levels"]],
            "stop": r.get("stop_reason")}


def _pct(objectives: list[dict], metric: str) -> float | None:
    return next((o["value_ms"] for o in objectives if o["metric"] == metric), None)


def run_guidellm(binary: str, url: str, model: str, model_dir: Path, args: argparse.Namespace,
                 workload: Path, rundir: Path) -> dict:
    slo, target, _ = guidellm_objectives(args.objectives)
    out = rundir / "guidellm.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions"},
        "profile": {"kind": "goodput", "initial_streams": args.start_concurrency,
                    "max_streams": args.max_concurrency, "tolerance": args.tolerance,
                    "target_attainment": target, "confidence": args.confidence},
        "constraints": [{"kind": "max_requests", "count": args.max_requests},
                        {"kind": "max_duration", "seconds": args.level_time}],
        "data": [{"kind": "json_file", "path": str(workload)}],
        "tokenizer": {"kind": "hf_auto", "model": str(model_dir)},
        "metrics": {"kind": "generative", "slo": slo},
        "outputs": [{"kind": "json", "path": str(out)}],
    }}
    scen = rundir / "guidellm-scenario.json"
    scen.write_text(json.dumps(scenario, indent=1))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    recorder = MetricsRecorder(url)
    recorder.start()
    t0 = time.perf_counter()
    try:
        p = subprocess.run([binary, "run", "-c", str(scen), "--disable-console-interactive"],
                           capture_output=True, text=True, env=env, check=False)
    finally:
        wall = time.perf_counter() - t0
        recorder.stop()
    (rundir / "guidellm.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0 or not out.is_file():
        raise SystemExit(f"GuideLLM failed ({p.returncode}); see {rundir / 'guidellm.log'}")
    report = json.loads(out.read_text())
    search = report["conclusions"][0]
    per_level = []
    for b in report["benchmarks"]:
        m = b["metrics"]
        ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
        per_level.append({"concurrency": b["config"]["strategy"]["streams"],
                          "requests": m["request_totals"]["successful"], "seconds": b["duration"],
                          "requests_per_s": m["requests_per_second"]["successful"]["mean"],
                          "ttft_p50_ms": ttft["p50"], "ttft_p95_ms": ttft["p95"],
                          "attainment": m["slo_attainment"],
                          "vllm": recorder.window(b["start_time"], b["end_time"])})
    probes = search["probes"]
    best = search.get("best_passing_streams")
    at_best = next((pr for pr in probes if pr["streams"] == best), {})
    return {"tool": "guidellm", "capacity": best, "wall_s": wall, "goodput_rps": at_best.get("goodput"),
            "goodput_output_tps": None, "levels": [pr["streams"] for pr in probes],
            "requests": sum(pr["determined_requests"] for pr in probes),
            "verdicts": {pr["streams"]: ("pass" if pr["passed"] else "fail") for pr in probes},
            "per_level": per_level, "stop": search.get("stop_reason")}


# -- verdicts and output ---------------------------------------------------------

def same_capacity(a: int | None, b: int | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a == b
    return abs(a - b) <= tolerance * max(a, b)


def summarise(rounds: list[dict], tolerance: float) -> dict:
    for r in rounds:
        o, g = r["ours"], r["guidellm"]
        r["same_capacity"] = same_capacity(o["capacity"], g["capacity"], tolerance)
        r["time_ratio"] = o["wall_s"] / g["wall_s"]
    ours_total = sum(r["ours"]["wall_s"] for r in rounds)
    gl_total = sum(r["guidellm"]["wall_s"] for r in rounds)
    return {"same_capacity_every_round": all(r["same_capacity"] for r in rounds),
            "time_ratio_total": ours_total / gl_total,
            "time_ratio_worst": max(r["time_ratio"] for r in rounds),
            "time_goal_met": all(r["time_ratio"] <= 0.5 for r in rounds)}


def verdict_at(run: dict, concurrency: int) -> str | None:
    v = run["verdicts"]  # int keys, or str ones once read back from --json
    return v.get(concurrency, v.get(str(concurrency)))


def table(rounds: list[dict], verdict: dict, tolerance: float) -> str:
    def g(v, fmt=".2f"):
        return "-" if v is None else format(v, fmt)

    lines = [("| round (first) | ours: capacity | wall | levels | requests | goodput req/s "
              "| GuideLLM: capacity | wall | levels | requests | goodput req/s | same (±tol) | ours ÷ GuideLLM |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        o, gl = r["ours"], r["guidellm"]
        lines.append(f"| {r['round']} ({r['first']}) | {o['capacity']} | {o['wall_s']:.1f} s | "
                     f"{','.join(map(str, o['levels']))} | {o['requests']} | {g(o['goodput_rps'])} | "
                     f"{gl['capacity']} | {gl['wall_s']:.1f} s | {','.join(map(str, gl['levels']))} | "
                     f"{gl['requests']} | {g(gl['goodput_rps'])} | {'yes' if r['same_capacity'] else 'NO'} | "
                     f"{r['time_ratio']:.2f} |")
    lines += ["", "Levels both tools measured (the round's figures; vLLM's own TTFT from /metrics over each window):",
              ("| round | concurrency | ours: req/s | TTFT p50 / p95 | vLLM TTFT p50 / p99 | verdict "
               "| GuideLLM: req/s | TTFT p50 / p95 | vLLM TTFT p50 / p99 | verdict |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        theirs = {lv["concurrency"]: lv for lv in r["guidellm"].get("per_level", [])}
        for o in r["ours"].get("per_level", []):
            t = theirs.get(o["concurrency"])
            if t is None:
                continue
            cells = []
            for lv, tool in ((o, "ours"), (t, "guidellm")):
                v = lv.get("vllm") or {}
                cells.append(f"{g(lv['requests_per_s'], '.1f')} | {g(lv['ttft_p50_ms'], '.1f')} / "
                             f"{g(lv['ttft_p95_ms'], '.1f')} ms | {g(v.get('ttft_p50_ms'), '.1f')} / "
                             f"{g(v.get('ttft_p99_ms'), '.1f')} ms | {verdict_at(r[tool], lv['concurrency'])}")
            lines.append(f"| {r['round']} | {o['concurrency']} | {cells[0]} | {cells[1]} |")
    lines.append("")
    lines.append(f"same capacity within {tolerance:g} in every round: "
                 f"{'met' if verdict['same_capacity_every_round'] else 'NOT met'}")
    lines.append(f"ours <= 0.5x GuideLLM's wall time in every round: "
                 f"{'met' if verdict['time_goal_met'] else 'NOT met'} (worst {verdict['time_ratio_worst']:.2f}, "
                 f"total {verdict['time_ratio_total']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server")
    where.add_argument("--server", choices=("paced", "vllm"),
                       help="start one: the paced stand-in (known capacity) or vLLM CPU on the tiny model")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="model dir: vLLM's model and GuideLLM's tokenizer (default: a tiny demo model)")
    p.add_argument("--kv-cache", default="256M", help="vLLM's --kv-cache-memory-bytes (default 256M)")
    p.add_argument("--paced-slots", type=int, default=8)
    p.add_argument("--paced-ttft-ms", type=float, default=30.0)
    p.add_argument("--paced-itl-ms", type=float, default=10.0)
    p.add_argument("--paced-itl-knee", type=int, default=0,
                   help="with --paced-itl-slope-ms: requests in slots beyond this slow every token gap")
    p.add_argument("--paced-itl-slope-ms", type=float, default=0.0,
                   help="ms each gap grows per request in a slot beyond --paced-itl-knee (0: off)")
    p.add_argument("--paced-itl-wander", type=float, default=0.0,
                   help="the stand-in's speed wanders within 1 +- F, one factor a second (0: off)")
    p.add_argument("--guidellm", default=None,
                   help="GuideLLM's command (default: guidellm on PATH); it conflicts with vLLM's pins, "
                        "so install it in a venv of its own and pass VENV/bin/guidellm")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the tool going first alternates")
    p.add_argument("--ours-only", action="store_true",
                   help="run only our search (where GuideLLM cannot be installed); its figures stand alone")
    p.add_argument("--defaults", action="store_true",
                   help="ours with its own defaults for the level options (no --min/--max-requests, "
                        "--level-time): the default search the goal is about")
    p.add_argument("--first", choices=("ours", "guidellm"), default="ours", help="who goes first in round 1")
    p.add_argument("--slo", action="append", default=None,
                   help="objective, ours' syntax (default ttft_p95=100ms); one percentile for all")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--start-concurrency", type=int, default=1)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--min-requests", type=int, default=20, help="ours only: GuideLLM has no early stop")
    p.add_argument("--max-requests", type=int, default=400, help="per level, both tools")
    p.add_argument("--level-time", type=float, default=60.0, help="seconds per level at most, both tools")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=1, help="first run's prompt seed (each run adds one)")
    p.add_argument("--workdir", type=Path, default=None, help="keep logs, scenarios and prompts here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.slo = args.slo or ["ttft_p95=100ms"]
    args.objectives = parse_slo(args.slo)
    _, _, notes = guidellm_objectives(args.objectives)

    binary = args.guidellm or shutil.which("guidellm") or ""
    if args.ours_only:
        binary = ""
    elif not binary or not Path(binary).exists() and not shutil.which(binary):
        raise SystemExit("GuideLLM not found: install it in a venv of its own (it conflicts with vLLM's pins) "
                         "and pass --guidellm VENV/bin/guidellm")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="capacity-vs-guidellm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # Our prompts are built with the server's tokenizer unless a model dir is
    # given (or vLLM is started on one); GuideLLM always wants one to load.
    given_dir = args.model_dir is not None
    if args.model_dir is None:
        args.model_dir = workdir / "tiny-model"
        if not (args.model_dir / "config.json").is_file():
            write_demo_model(args.model_dir, shape="tiny")
    prompt_tokenizer_dir = args.model_dir if (given_dir or args.server == "vllm") else None

    proc = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            url, proc = start_server(args.server, args, workdir)
        model = resolve_model(url).id
        rounds = []
        run_no = 0
        for rnd in range(1, args.rounds + 1):
            order = ["ours"] if args.ours_only else ["ours", "guidellm"]
            if (args.first == "guidellm") != (rnd % 2 == 0):
                order.reverse()
            row = {"round": rnd, "first": order[0]}
            for tool in order:
                run_no += 1
                rundir = workdir / f"round{rnd}-{tool}"
                rundir.mkdir(exist_ok=True)
                prompts = rundir / "prompts.jsonl"
                write_workload(url, model, prompt_tokenizer_dir, args, args.seed + run_no - 1, prompts)
                print(f"round {rnd}: {tool} ...", file=sys.stderr, flush=True)
                if tool == "ours":
                    row[tool] = run_ours(url, args, prompts, rundir / "ours.log")
                else:
                    row[tool] = run_guidellm(binary, url, model, args.model_dir, args, prompts, rundir)
                res = row[tool]
                print(f"  capacity {res['capacity']}, {res['wall_s']:.1f} s, levels {res['levels']}",
                      file=sys.stderr, flush=True)
            rounds.append(row)
    finally:
        if proc is not None:
            stop_server(proc)
    if args.ours_only:
        out = [{"round": r["round"], "capacity": r["ours"]["capacity"], "wall_s": round(r["ours"]["wall_s"], 1),
                "levels": r["ours"]["levels"], "requests": r["ours"]["requests"],
                "goodput_output_tps": r["ours"]["goodput_output_tps"]} for r in rounds]
        if args.json:
            print(json.dumps({"slo": args.slo, "rounds": out}, indent=1))
        else:
            for r in out:
                print(f"round {r['round']}: ours capacity {r['capacity']} in {r['wall_s']} s, levels {r['levels']}, "
                      f"{r['requests']} requests counted")
        return 0
    verdict = summarise(rounds, args.tolerance)
    setup = {"url": args.url, "server": args.server, "model": model, "slo": args.slo, "notes": notes,
             "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
             "start_concurrency": args.start_concurrency, "max_concurrency": args.max_concurrency,
             "tolerance": args.tolerance, "min_requests": args.min_requests, "max_requests": args.max_requests,
             "level_time_s": args.level_time, "confidence": args.confidence, "workdir": str(workdir)}
    if args.server == "paced":
        setup["paced"] = {"slots": args.paced_slots, "ttft_ms": args.paced_ttft_ms, "itl_ms": args.paced_itl_ms,
                          "itl_knee": args.paced_itl_knee, "itl_slope_ms": args.paced_itl_slope_ms,
                          "itl_wander": args.paced_itl_wander}
    if args.json:
        print(json.dumps({"setup": setup, "rounds": rounds, "verdict": verdict}, indent=1))
    else:
        print(f"SLO {' '.join(args.slo)}, prompts {args.prompt_tokens} tokens, {args.max_tokens} out, "
              f"tolerance {args.tolerance:g}, per level at most {args.max_requests} requests / "
              f"{args.level_time:g} s; work files in {workdir}")
        for n in notes:
            print(f"note: {n}")
        print(table(rounds, verdict, args.tolerance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
