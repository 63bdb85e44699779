"""Where is the true capacity, and does our search find it, every time?

1. Brackets the capacity under --slo with vLLM's own bench client's long
   runs, on one running server: at each --concurrency level (closed loop,
   waves x C requests a run) and each --rate level (Poisson arrivals, rate x
   --rate-seconds requests a run), --rounds runs with fresh prompts. A run
   meets the SLO when every objective's percentile, as the bench client
   reports it (TTFT per request, ITL over all gaps, E2E per request), is
   within its limit. The bracket: the highest level whose rounds ALL meet it,
   and the lowest level above that whose rounds ALL miss it; levels between
   (some rounds meet, some miss) are borderline.
2. Runs our search (`ernie-tui probe --capacity`, and with `--rate` when
   the CLI's capacity options offer it: read from `probe --help`) --searches
   times against the same server, and prints each answer against the
   bracket: inside it, within one tolerance step of it, or outside.

    python bench/capacity_truth.py --url http://127.0.0.1:8000 --tokenizer MODEL_DIR \\
        --slo ttft_p99=1000ms --slo itl_p99=50ms --concurrency 128 160 192 224 256 \\
        --rate 60 80 100 --rounds 2 --searches 3 --json truth.json -- --start-concurrency 16

With --interleave the bench client's rounds and our searches alternate
(round, search, round, ..., each round one run at every level): on a busy
host the bracket moves within minutes, and each search is judged against
the whole bracket and against its "local" one, the rounds taken just before
and just after it. Runs (and searches) from --bracket-from files are joined,
so the alternation can span device calls; --judge-only re-judges such files
with no server.

Arguments after `--` go to every search as they are (e.g. level caps);
--alternate ARGS adds more to every second search, for an A/B of two search
settings on one server (each search records its own, `search_args`).
The prompt shape is vLLM's random dataset's (--input-len, --output-len,
--range-ratio, as bench/agree_vllm_bench.py); the search is given the same
prompt range and output range (--min-output-tokens..--max-tokens: the bench
client's range ratio applies to outputs too), with ignore_eos and the
server's sampling defaults, so both send one workload.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agree_vllm_bench  # noqa: E402
from agree_vllm_bench import Server, Shape, run_theirs  # noqa: E402
from ernie_tui.engine_ctl.load import ServerCpuWatch, parse_slo, resolve_model, server_pid  # noqa: E402

_BENCH_METRIC = {"ttft": "ttft", "itl": "itl", "e2e": "e2el"}


# -- pure parts (tests/test_agree_bench.py) -------------------------------------------

def _meets(value: Any, objectives: list[Any]) -> bool | None:
    """Every objective within its limit, each figure read by value(objective)
    in ms; None when one is missing."""
    ok = True
    for o in objectives:
        v = value(o)
        if v is None:
            return None
        ok = ok and v <= o.limit_s * 1000.0
    return ok


def run_meets(percentiles_ms: dict[str, float], objectives: list[Any]) -> bool | None:
    """Does one bench-client run meet every objective? None when one of the
    percentiles is missing from its result."""
    def value(o: Any) -> float | None:
        name = _BENCH_METRIC[o.metric]
        v = percentiles_ms.get(f"p{o.percentile}_{name}_ms")
        return percentiles_ms.get(f"median_{name}_ms") if v is None and o.percentile == 50 else v
    return _meets(value, objectives)


def steady_meets(steady: dict[str, Any] | None, objectives: list[Any]) -> bool | None:
    """Does a bench-client run meet every objective over the part of it in
    which its load was whole (agree_vllm_bench.steady_from_bench_detail)?
    None when that reading lacks one of the objectives' figures."""
    if not steady:
        return None
    return _meets(lambda o: steady.get(f"{o.metric}_p{o.percentile}_ms"), objectives)


def referee_note(v: dict[str, Any]) -> str:
    """vLLM's view of a bench-client run, for its progress line ('' without one)."""
    if not v or v.get("ttft_p99_ms") is None:
        return ""
    queue = v.get("queue_mean_ms")
    return (f"; vLLM's histograms: TTFT p99 {v['ttft_p99_ms']:.0f} ms, ITL p99 {v.get('itl_p99_ms') or 0:.1f} ms"
            + (f", queue mean {queue:.0f} ms" if queue is not None else ""))


def server_cpu_note(procs: list[dict[str, Any]] | None) -> str:
    """The server's busiest processes over a bench-client run, for its
    progress line ('' when the server is not on this machine). Why: in the
    eighteenth H200 run every one of the bench client's runs at 512 held one
    of four API servers at 100-104 % of a core (the others at 5-50 %), and its
    TTFT p50 rose to 0.4-1 s while vLLM's scheduler never saw a request
    waiting: vLLM 0.26's API servers share one socket and whichever wakes
    first accepts what is queued, so where a burst of connections lands
    decides which one saturates. Our levels at 512 there held none above 81 %."""
    if not procs:
        return ""
    return "; server CPU: " + ", ".join(f"{p['what']} {p['cpu_pct']:.0f} %" for p in procs)


def bracket(verdicts: dict[float, list[bool | None]]) -> dict[str, Any]:
    """From each level's per-round verdicts (True: met the SLO): the highest
    level whose rounds all met it ("low"), the lowest level above it whose
    rounds all missed ("high", None if none did), the mixed levels between
    ("borderline"), and levels that contradict the order ("inconsistent":
    all-miss below low)."""
    levels = sorted(verdicts)

    def all_(level: float, want: bool) -> bool:
        vs = verdicts[level]
        return bool(vs) and all(v is want for v in vs)
    passing = [lv for lv in levels if all_(lv, True)]
    low = max(passing) if passing else None
    above = [lv for lv in levels if low is None or lv > low]
    failing = [lv for lv in above if all_(lv, False)]
    high = min(failing) if failing else None
    borderline = [lv for lv in levels if (low is None or lv > low) and (high is None or lv < high)
                  and not all_(lv, False)]
    inconsistent = [lv for lv in levels if low is not None and lv < low and all_(lv, False)]
    return {"low": low, "high": high, "borderline": borderline, "inconsistent": inconsistent}


def judge(answer: float | None, low: float | None, high: float | None, tolerance: float) -> str:
    """'inside' (low <= answer < high), 'one step' (within one tolerance
    step of that range), 'over' / 'under' (beyond it), 'none' (no answer),
    'unbracketed' (no bracket to judge by)."""
    if answer is None:
        return "none"
    if low is None and high is None:
        return "unbracketed"
    lo = low if low is not None else 0.0
    if answer >= lo and (high is None or answer < high):
        return "inside"
    if answer >= lo / (1.0 + tolerance) and (high is None or answer <= high * (1.0 + tolerance)):
        return "one step"
    return "under" if answer < lo else "over"


def local_bracket(runs: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """The bracket from the runs nearest a search in time: at each level, the
    last run that ended before the search started and the first that started
    after it ended (runs carry started_at/ended_at; those without are left out)."""
    verdicts: dict[float, list[bool | None]] = {}
    for lv in sorted({float(r["level"]) for r in runs}):
        at = [r for r in runs if float(r["level"]) == lv and r.get("started_at") is not None]
        before = [r for r in at if r["ended_at"] <= start]
        after = [r for r in at if r["started_at"] >= end]
        near = ([max(before, key=lambda r: r["ended_at"])] if before else []) + \
               ([min(after, key=lambda r: r["started_at"])] if after else [])
        if near:
            verdicts[lv] = [r["meets"] for r in near]
    return bracket(verdicts)


def level_key(mode: str, level: Any) -> float:
    return float(level) if mode == "rate" else int(level)


def judged_files(files: list[dict[str, Any]], tolerance: float) -> dict[str, dict[str, Any]]:
    """Every run and search of several --json outputs, per mode: the joined
    bracket, and each search judged against it and against its local one."""
    modes = joined_brackets(files)
    for d in files:
        for mode, m in (d.get("modes") or {}).items():
            modes.setdefault(mode, {"runs": []}).setdefault("searches", []).extend(m.get("searches") or [])
    for mode, m in modes.items():
        m["searches"] = _once(m.get("searches") or [])
        # each level's verdicts; and over the part in which the runs' load was whole, where they carry it
        verdicts: dict[float, list[bool | None]] = {}
        steady: dict[float, list[bool | None]] = {}
        for r in m["runs"]:
            verdicts.setdefault(level_key(mode, r["level"]), []).append(r["meets"])
            if r.get("meets_steady") is not None:
                steady.setdefault(level_key(mode, r["level"]), []).append(r["meets_steady"])
        m["bracket"] = br = bracket(verdicts)
        if steady:
            m["steady_bracket"] = bracket(steady)
        m["verdicts"] = {str(k): v for k, v in sorted(verdicts.items())}
        for srch in m["searches"]:
            if srch.get("cut_short"):
                srch["verdict"] = "cut short"
                continue
            srch["verdict"] = judge(srch.get("answer"), br["low"], br["high"], tolerance)
            if srch.get("started_at") is not None:
                loc = local_bracket(m["runs"], srch["started_at"], srch["ended_at"])
                srch["local_bracket"] = loc
                srch["local_verdict"] = judge(srch.get("answer"), loc["low"], loc["high"], tolerance)
    return modes


def capacity_group(help_text: str) -> str:
    """The capacity options' part of `probe --help` (from its group title to
    the next group title)."""
    lines = help_text.splitlines()
    out: list[str] = []
    inside = False
    for line in lines:
        if line and not line.startswith(" ") and line.rstrip().endswith(":"):
            inside = "capacity" in line.lower()
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def search_offers_rate(help_text: str) -> bool:
    """Does `probe --capacity` take --rate (an open-loop search)? Only when
    --rate is among the capacity options, not the burst's."""
    return "--rate" in capacity_group(help_text)


# -- running ---------------------------------------------------------------------------

def run_search(srv: Server, shape: Shape, slo: list[str], *, rate: bool, extra: list[str], python: str,
               env: dict[str, str], timeout_s: float, keep_records: bool = False) -> dict[str, Any]:
    in_lo, in_hi, out_lo, out_hi = shape.ranges()
    # The bench client's workload: its input range, and its drawn output lengths
    # (its range ratio applies to outputs too), with the server's sampling defaults.
    argv = [python, "-m", "ernie_tui", "probe", "--url", srv.url, "--model", srv.model, "--tokenizer", srv.tokenizer,
            "--capacity", "--min-tokens", str(in_lo), "--max-tokens-in", str(in_hi),
            "--min-output-tokens", str(out_lo), "--max-tokens", str(out_hi), "--json"]
    if not keep_records:
        argv.append("--no-save")
    for s in slo:
        argv += ["--slo", s]
    if rate:
        argv.append("--rate")
    argv += extra
    t = time.time()
    # Its own session: `timeout` signals its whole process group, and a search
    # signalled twice is killed; Ending passes it one SIGTERM, so it winds its
    # level down and prints the levels it measured.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    Ending.child = proc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # past --timeout: ended as SIGTERM ends it, its levels kept
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=SEARCH_WIND_DOWN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
    finally:
        Ending.child = None
    t_end = time.time()
    when = {"started_at": t, "ended_at": t_end, "wall_s": t_end - t}
    try:
        d = json.loads(stdout)
    except ValueError:
        return {"error": (stderr or stdout)[-1500:], **when}
    cap = d.get("capacity") or {}
    key = "rate" if rate else "concurrency"
    out = {"answer": cap.get(key), "goodput_output_tps": cap.get("goodput_output_tps"),
           "attainment": cap.get("attainment"), "seconds": d.get("seconds"), **when,
           "stop_reason": d.get("stop_reason"), "run_record": d.get("run_record"),
           "levels": [{k: lv.get(k) for k in _LEVEL_KEYS} for lv in d.get("levels") or []]}
    if d.get("stop_reason") == "cancelled":
        out["cut_short"] = True  # its levels are kept; its answer is no search's answer
    return out


# How long a search ended by --timeout may take to wind its level down.
SEARCH_WIND_DOWN_S = 60.0


class Ending:
    """SIGTERM to this script (the device call's `timeout`): the running search
    gets one SIGTERM of its own, and the script stops after that step, with
    every finished run and the cut search's levels in its --json."""

    signalled = False
    child: subprocess.Popen | None = None

    @classmethod
    def on_signal(cls, signum: int, _frame: Any) -> None:
        cls.signalled = True
        if cls.child is not None and cls.child.poll() is None:
            cls.child.send_signal(signal.SIGTERM)


class Stopped(Exception):
    """Raised after the step that SIGTERM cut: the --json holds what finished."""


# What a search's summary keeps of each level: enough to read its path
# (second looks, confirmations, an end that missed, our client's stalls) and
# to set its figures beside the bench client's runs at the same load (an H200
# run's records did not come back; this file did).
_LEVEL_KEYS = ("concurrency", "rate", "passed", "decided", "requests", "seconds", "stop", "confirmation",
               "measured_again", "end_missed", "client_lag_max_ms", "ttft_p99_ms", "itl_p99_ms", "output_tps",
               "attainment", "waiting_peak")


def joined_brackets(files: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The bench client's runs per mode from earlier --json outputs of this
    script (whole or cut short), joined: a bracket taken over several device
    calls on one server is one bracket."""
    modes: dict[str, dict[str, Any]] = {}
    for d in files:
        for mode, m in (d.get("modes") or {}).items():
            if m.get("runs"):
                modes.setdefault(mode, {"runs": []})["runs"].extend(m["runs"])
    for m in modes.values():  # a later file carries the runs it was given: each run once
        m["runs"] = _once(m["runs"])
    return modes


def _once(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    kept = []
    for x in items:
        key = json.dumps({k: v for k, v in x.items() if k not in ("verdict", "local_bracket", "local_verdict")},
                         sort_keys=True)
        if key not in seen:
            seen.add(key)
            kept.append(x)
    return kept


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    judge_only = "--judge-only" in argv  # no server: url, tokenizer and SLO are not needed
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=not judge_only)
    p.add_argument("--model")
    p.add_argument("--tokenizer", required=not judge_only)
    p.add_argument("--slo", action="append", required=not judge_only, metavar="METRIC_pNN=LIMIT")
    p.add_argument("--concurrency", type=int, nargs="*", default=[], metavar="C")
    p.add_argument("--rate", type=float, nargs="*", default=[], metavar="R")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--waves", type=int, default=8)
    p.add_argument("--rate-seconds", type=float, default=30.0)
    p.add_argument("--only", choices=("concurrency", "rate"),
                   help="bracket and search this mode alone (a device call each)")
    p.add_argument("--searches", type=int, default=3)
    p.add_argument("--interleave", action="store_true",
                   help="alternate the bench client's rounds with our searches (round, search, round, ...; "
                        "rounds beyond the searches come last), joining the runs of --bracket-from files "
                        "instead of standing in for new ones")
    p.add_argument("--judge-only", action="store_true",
                   help="no server: join the --bracket-from files (runs and searches) and judge every search "
                        "against the whole bracket and against the rounds taken just before and after it")
    p.add_argument("--tolerance", type=float, default=0.10, help="the search's tolerance step (default 0.10)")
    p.add_argument("--input-len", type=int, default=165)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.8182)
    p.add_argument("--bench-python", default=sys.executable)
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds a bench run or a search may take; a search past it is ended as SIGTERM ends it "
                        "(its levels kept, marked cut_short)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--bench-procs", type=int, default=1, metavar="K",
                   help="each bench run split over K bench clients side by side (each C/K or R/K, n/K prompts, "
                        "its own seed), their requests pooled: one bench client's process near a core reads "
                        "its own delays as the server's (default 1)")
    p.add_argument("--bench-process-per-run", action="store_true",
                   help="start vLLM's bench client afresh for each run (default: one process kept for all runs)")
    p.add_argument("--bracket-from", metavar="FILE", action="append", default=[],
                   help="take the bracket's runs from an earlier --json of this script (same server) instead of "
                        "running the bench client again: one device call brackets, the next searches; give it "
                        "once per file to join brackets taken in several calls")
    p.add_argument("--alternate", metavar="ARGS", default="",
                   help="search options every second search of a call adds to those after `--` (one string, "
                        "split as a shell would, e.g. '--resolution 0'): an A/B of two settings on one server, "
                        "the searches taking turns; each search records the options it ran with (search_args)")
    p.add_argument("--keep-records", action="store_true",
                   help="let each search save its run record (for `ernie-tui report`)")
    args = p.parse_args(argv)
    alternate = shlex.split(args.alternate)
    files = [json.loads(Path(f).read_text()) for f in args.bracket_from]
    if args.judge_only:
        judged = judged_files(files, args.tolerance)
        for mode, m in judged.items():
            print(report_mode(mode, m), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"judged_from": args.bracket_from, "modes": judged}, indent=1))
        return 0
    agree_vllm_bench.KEEP_BENCH_PROCESS = not args.bench_process_per_run
    metrics = agree_vllm_bench.MetricsClient(args.url.rstrip("/"), None, model_name=None, timeout=30.0)
    earlier = joined_brackets(files)
    objectives = parse_slo(args.slo)
    model = args.model or resolve_model(args.url).id
    srv = Server(args.url.rstrip("/"), model, args.tokenizer)
    pid = server_pid(srv.url)  # a server on this machine: its processes' CPU per bench-client run
    shape = Shape(args.input_len, args.output_len, args.range_ratio)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (src, env.get("PYTHONPATH")) if x)
    pcts = ",".join(sorted({str(o.percentile) for o in objectives} | {"50", "99"}, key=int))
    rng = random.SystemRandom()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "url": srv.url, "model": model,
                           "slo": args.slo, "argv": argv, "search_args": extra, "modes": {}}
    print(f"SLO {' '.join(args.slo)}; prompts {shape.ranges()[0]}..{shape.ranges()[1]} tokens, bench client "
          f"outputs {shape.ranges()[2]}..{shape.ranges()[3]} (both clients)", flush=True)
    help_text = subprocess.run([args.bench_python, "-m", "ernie_tui", "probe", "--help"], capture_output=True,
                               text=True, env=env, check=False).stdout
    modes = [("concurrency", args.concurrency)] + ([("rate", args.rate)] if args.rate or "rate" in earlier else [])
    if args.only:
        modes = [m for m in modes if m[0] == args.only]

    def do_mode(mode: str, levels: list[Any]) -> None:
        runs: list[dict[str, Any]] = list(earlier[mode]["runs"]) if mode in earlier else []
        if mode in earlier and not args.interleave:
            levels = []  # the bracket is taken: nothing to run again
        searches: list[dict[str, Any]] = []
        offered = mode == "concurrency" or search_offers_rate(help_text)
        if not offered:
            print(f"  our search: `probe --capacity --rate` is not in this CLI; {mode} searches skipped", flush=True)

        def save(partial: bool) -> None:
            # after every run and search: a call cut by its deadline keeps what it finished
            if args.json:
                m = {"runs": runs, "searches": searches, "search_offered": offered, "partial": partial}
                Path(args.json).write_text(json.dumps({**out, "modes": {**out["modes"], mode: m}}, indent=1))

        def bench_run(lv: float, k: int) -> None:
            conc = int(lv) if mode == "concurrency" else None
            rate = float(lv) if mode == "rate" else None
            n = args.waves * int(lv) if mode == "concurrency" else max(1, round(lv * args.rate_seconds))
            t = time.time()
            before = metrics.try_fetch()
            watch = ServerCpuWatch(pid) if pid is not None else None
            if watch is not None:
                watch.start()
            try:
                r = run_theirs(srv, shape, concurrency=conc, rate=rate, n=n, seed=rng.randrange(1, 1 << 30),
                               python=args.bench_python, env=env, timeout_s=args.timeout, percentiles=pcts,
                               procs=args.bench_procs)
            except Exception:
                if Ending.signalled:  # the bench client died of the same SIGTERM: this run is lost, not failed
                    raise Stopped from None
                raise
            # vLLM's own view of the run (the referee, as in agree_vllm_bench):
            # its mean wait in the queue says whether a long TTFT was the
            # server queueing or the bench client's own process.
            r["referee"] = agree_vllm_bench.referee(before, metrics.try_fetch(), r.get("duration_s"))
            r["server_cpu"] = watch.stop() if watch is not None else None
            met = run_meets(r["percentiles_ms"], objectives)
            st = r.get("steady")
            runs.append({"level": lv, "round": k, "meets": met, "meets_steady": steady_meets(st, objectives), **r,
                         "started_at": t, "ended_at": time.time()})
            save(True)
            print(f"  bench client {mode} {lv:g} round {k + 1}: {'meets' if met else 'misses'} the SLO "
                  f"({r['output_tps'] or 0:.0f} tok/s, TTFT p99 {r['ttft_p99_ms'] or 0:.0f} ms, ITL p99 "
                  f"{r['itl_p99_ms'] or 0:.1f} ms)"
                  + (f"; over its whole load ({st['share_of_gaps']:.0%} of gaps): TTFT p99 "
                     f"{st['ttft_p99_ms'] or 0:.0f} ms, ITL p99 {st['itl_p99_ms'] or 0:.1f} ms" if st else "")
                  + referee_note(r["referee"]) + server_cpu_note(r["server_cpu"]),
                  flush=True)
            if Ending.signalled:
                raise Stopped

        def our_search(i: int) -> None:
            alt = bool(alternate) and i % 2 == 1
            these = extra + alternate if alt else extra
            s = run_search(srv, shape, args.slo, rate=mode == "rate", extra=these, python=args.bench_python,
                           env=env, timeout_s=args.timeout, keep_records=args.keep_records)
            s["search_args"] = these
            searches.append(s)
            save(True)
            print(f"  our search {i + 1}" + (f" (with {' '.join(alternate)})" if alt else "")
                  + f": {mode} {s.get('answer')}; goodput "
                  f"{s.get('goodput_output_tps') or 0:.0f} tok/s; {s.get('wall_s', 0):.0f} s"
                  + (" (cut short by SIGTERM: its levels kept, its answer not judged)" if s.get("cut_short") else "")
                  + (f"; error: {s['error'][-300:]}" if "error" in s else ""), flush=True)
            if Ending.signalled:
                raise Stopped

        if args.interleave:
            # rounds go on counting from the earlier calls' (a round: one run at every level)
            first = 1 + max((int(r.get("round", -1)) for r in runs), default=-1)
            for i in range(max(args.rounds if levels else 0, args.searches if offered else 0)):
                if i < args.rounds:
                    for lv in levels:
                        bench_run(lv, first + i)
                if offered and i < args.searches:
                    our_search(i)
        else:
            for lv in levels:
                for k in range(args.rounds):
                    bench_run(lv, k)
            for i in range(args.searches if offered else 0):
                our_search(i)
        m = judged_files([{"modes": {mode: {"runs": runs, "searches": searches}}}], args.tolerance)[mode]
        out["modes"][mode] = {"levels": sorted(level_key(mode, k) for k in m["verdicts"]), **m,
                              "search_offered": offered}
        print(report_mode(mode, m), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    previous = signal.signal(signal.SIGTERM, Ending.on_signal)
    try:
        for mode, levels in modes:
            if not levels and mode not in earlier:
                continue
            do_mode(mode, levels)
    except Stopped:
        print(f"ended by SIGTERM: {args.json or 'nothing'} keeps the runs that finished and the searches "
              "(a cut one with the levels it measured)", flush=True)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def report_mode(mode: str, m: dict[str, Any]) -> str:
    """One mode's bracket and searches, as printed."""
    br = m["bracket"]
    lines = [f"{mode}: bracket [{br['low']}, {br['high']}) borderline {br['borderline']}"
             + (f" inconsistent {br['inconsistent']}" if br["inconsistent"] else "")]
    if m.get("steady_bracket"):
        sb = m["steady_bracket"]
        lines.append(f"  the same runs over their whole load alone: [{sb['low']}, {sb['high']}) "
                     f"borderline {sb['borderline']}")
    for i, srch in enumerate(m.get("searches") or []):
        loc = srch.get("local_bracket")
        lines.append(f"  our search {i + 1}"
                     + (f" ({' '.join(srch['search_args'])})" if srch.get("search_args") else "")
                     + f": {mode} {srch.get('answer')} -> {srch.get('verdict')}"
                     + (f" (local bracket [{loc['low']}, {loc['high']})"
                        + (f" inconsistent {loc['inconsistent']}" if loc.get("inconsistent") else "")
                        + f": {srch.get('local_verdict')})" if loc else "")
                     + f"; goodput {srch.get('goodput_output_tps') or 0:.0f} tok/s; {srch.get('wall_s') or 0:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
