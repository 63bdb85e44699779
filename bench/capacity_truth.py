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

Arguments after `--` go to every search as they are (e.g. level caps).
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agree_vllm_bench  # noqa: E402
from agree_vllm_bench import Server, Shape, run_theirs  # noqa: E402
from ernie_tui.engine_ctl.load import parse_slo, resolve_model  # noqa: E402

_BENCH_METRIC = {"ttft": "ttft", "itl": "itl", "e2e": "e2el"}


# -- pure parts (tests/test_agree_bench.py) -------------------------------------------

def run_meets(percentiles_ms: dict[str, float], objectives: list[Any]) -> bool | None:
    """Does one bench-client run meet every objective? None when one of the
    percentiles is missing from its result."""
    ok = True
    for o in objectives:
        name = _BENCH_METRIC[o.metric]
        v = percentiles_ms.get(f"p{o.percentile}_{name}_ms")
        if v is None and o.percentile == 50:
            v = percentiles_ms.get(f"median_{name}_ms")
        if v is None:
            return None
        ok = ok and v <= o.limit_s * 1000.0
    return ok


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
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    wall = time.time() - t
    try:
        d = json.loads(p.stdout)
    except ValueError:
        return {"error": (p.stderr or p.stdout)[-1500:], "wall_s": wall}
    cap = d.get("capacity") or {}
    key = "rate" if rate else "concurrency"
    return {"answer": cap.get(key), "goodput_output_tps": cap.get("goodput_output_tps"),
            "attainment": cap.get("attainment"), "seconds": d.get("seconds"), "wall_s": wall,
            "stop_reason": d.get("stop_reason"),
            "levels": [{k: lv.get(k) for k in ("concurrency", "rate", "passed", "decided", "requests", "seconds")}
                       for lv in d.get("levels") or []]}


def joined_brackets(files: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The bench client's runs per mode from earlier --json outputs of this
    script (whole or cut short), joined: a bracket taken over several device
    calls on one server is one bracket."""
    modes: dict[str, dict[str, Any]] = {}
    for d in files:
        for mode, m in (d.get("modes") or {}).items():
            if m.get("runs"):
                modes.setdefault(mode, {"runs": []})["runs"].extend(m["runs"])
    return modes


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--slo", action="append", required=True, metavar="METRIC_pNN=LIMIT")
    p.add_argument("--concurrency", type=int, nargs="*", default=[], metavar="C")
    p.add_argument("--rate", type=float, nargs="*", default=[], metavar="R")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--waves", type=int, default=8)
    p.add_argument("--rate-seconds", type=float, default=30.0)
    p.add_argument("--only", choices=("concurrency", "rate"),
                   help="bracket and search this mode alone (a device call each)")
    p.add_argument("--searches", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=0.10, help="the search's tolerance step (default 0.10)")
    p.add_argument("--input-len", type=int, default=165)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.8182)
    p.add_argument("--bench-python", default=sys.executable)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--bench-process-per-run", action="store_true",
                   help="start vLLM's bench client afresh for each run (default: one process kept for all runs)")
    p.add_argument("--bracket-from", metavar="FILE", action="append", default=[],
                   help="take the bracket's runs from an earlier --json of this script (same server) instead of "
                        "running the bench client again: one device call brackets, the next searches; give it "
                        "once per file to join brackets taken in several calls")
    p.add_argument("--keep-records", action="store_true",
                   help="let each search save its run record (for `ernie-tui report`)")
    args = p.parse_args(argv)
    agree_vllm_bench.KEEP_BENCH_PROCESS = not args.bench_process_per_run
    earlier = joined_brackets([json.loads(Path(f).read_text()) for f in args.bracket_from])
    objectives = parse_slo(args.slo)
    model = args.model or resolve_model(args.url).id
    srv = Server(args.url.rstrip("/"), model, args.tokenizer)
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
    for mode, levels in modes:
        if not levels and mode not in earlier:
            continue
        verdicts: dict[float, list[bool | None]] = {}
        runs: list[dict[str, Any]] = []
        if mode in earlier:
            runs = earlier[mode]["runs"]
            for r in runs:
                verdicts.setdefault(float(r["level"]) if mode == "rate" else int(r["level"]), []).append(r["meets"])
            levels = []  # nothing to run again
        for lv in levels:
            for k in range(args.rounds):
                conc = int(lv) if mode == "concurrency" else None
                rate = float(lv) if mode == "rate" else None
                n = args.waves * int(lv) if mode == "concurrency" else max(1, round(lv * args.rate_seconds))
                r = run_theirs(srv, shape, concurrency=conc, rate=rate, n=n, seed=rng.randrange(1, 1 << 30),
                               python=args.bench_python, env=env, timeout_s=args.timeout, percentiles=pcts)
                met = run_meets(r["percentiles_ms"], objectives)
                verdicts.setdefault(lv, []).append(met)
                runs.append({"level": lv, "round": k, "meets": met, **r})
                if args.json:  # after every run: a call cut by its deadline keeps the runs it finished
                    partial = {**out, "modes": {**out["modes"], mode: {"runs": runs, "partial": True}}}
                    Path(args.json).write_text(json.dumps(partial, indent=1))
                print(f"  bench client {mode} {lv:g} round {k + 1}: {'meets' if met else 'misses'} the SLO "
                      f"({r['output_tps'] or 0:.0f} tok/s, TTFT p99 {r['ttft_p99_ms'] or 0:.0f} ms, ITL p99 "
                      f"{r['itl_p99_ms'] or 0:.1f} ms)", flush=True)
        br = bracket(verdicts)
        print(f"{mode}: bracket [{br['low']}, {br['high']}) borderline {br['borderline']}"
              + (f" inconsistent {br['inconsistent']}" if br["inconsistent"] else ""), flush=True)
        searches: list[dict[str, Any]] = []
        offered = mode == "concurrency" or search_offers_rate(help_text)
        if not offered:
            print(f"  our search: `probe --capacity --rate` is not in this CLI; {mode} searches skipped", flush=True)
        for i in range(args.searches if offered else 0):
            s = run_search(srv, shape, args.slo, rate=mode == "rate", extra=extra, python=args.bench_python,
                           env=env, timeout_s=args.timeout, keep_records=args.keep_records)
            s["verdict"] = judge(s.get("answer"), br["low"], br["high"], args.tolerance)
            searches.append(s)
            if args.json:  # each search kept as it ends: a deadline that cuts the run keeps the finished ones
                partial = {**out, "modes": {**out["modes"], mode: {"bracket": br, "searches": searches,
                                                                    "partial": True}}}
                Path(args.json).write_text(json.dumps(partial, indent=1))
            print(f"  our search {i + 1}: {mode} {s.get('answer')} -> {s['verdict']}; goodput "
                  f"{s.get('goodput_output_tps') or 0:.0f} tok/s; {s.get('wall_s', 0):.0f} s"
                  + (f"; error: {s['error'][-300:]}" if "error" in s else ""), flush=True)
        out["modes"][mode] = {"levels": sorted(verdicts), "verdicts": {str(k): v for k, v in verdicts.items()},
                              "bracket": br, "runs": runs, "searches": searches, "search_offered": offered}
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
