"""Does a trial beside it change what a parallel sweep measures?

bench/parallel_sweep.py compares one sweep run alone with one run side by
side, each trial a fresh server and a burst of seconds: server-to-server and
burst-to-burst noise then hides any effect of the neighbour. This script
keeps two servers up (preset A on the first GPU set, B on the second, each
with its own CUDA_VISIBLE_DEVICES and port, as a parallel sweep starts them)
and, round after round, measures the same burst in three ways:

  alone    A's burst with B idle, then B's with A idle;
  threads  both bursts at once from two threads of this process: their
           load generators share one interpreter (what `sweep
           --gpus-per-trial` did until its trials' loads moved to child
           processes);
  procs    both bursts at once from two child processes of this script
           (subprocess, one --one-burst each): the neighbours share the
           machine but not the interpreter;
  sweep    both bursts at once the way `sweep --gpus-per-trial` runs them
           now: two threads, each supervising a spawned child that runs the
           burst (engine_ctl.trial_load.LoadProcess, the sweep's own code,
           started and ready before the burst as the sweep's is), forwarding
           its progress through one lock and taking its result.

The order of the modes rotates by round, and every burst draws new prompts
(a seed per burst), so vLLM's prefix cache and the machine's drift are not
billed to one mode. Per preset and mode it prints the median output tok/s,
TTFT p50/p99 and ITL p99 with min-max over the rounds, and says whether the
neighbour's median lies beyond the spread of the alone rounds.

    python3 bench/neighbour_disturbance.py seed-A seed-C --presets bench/presets-h200.toml \\
        --model /root/m03 --gpus 0,1 --rounds 3 --burst 1500 --concurrency 64

Without GPUs, --stand-ins runs two paced stand-in servers (tests/paced_server.py)
instead, so the machinery can be tried on any box (`--gpus` is then a label;
--stand-in-slots and --stand-in-itl-ms set how many streams each serves at
once and how fast, i.e. how hard each load generator works):

    python3 bench/neighbour_disturbance.py --stand-ins --rounds 4 --burst 100 \\
        --concurrency 4 --max-tokens 64 --warmup 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent / "src"))
sys.path.insert(0, str(HERE.parent))

from ernie_tui.engine_ctl.load import BurstConfig, run_burst  # noqa: E402

FIGURES = ("output_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms")
MODES = ("alone", "threads", "procs", "sweep")


def figures_of(result) -> dict:
    """The burst figures compared here, from a BurstResult or its dict."""
    d = result if isinstance(result, dict) else result.to_dict(with_requests=False)

    def ms(v):
        return None if v is None else v * 1000.0

    return {"output_tps": d["output_tps"], "ttft_p50_ms": ms(d["ttft"]["p50"]),
            "ttft_p99_ms": ms(d["ttft"]["p99"]), "itl_p99_ms": ms(d["itl"]["p99"]),
            "completed": d["completed"], "total": d["total"]}


def burst_config(args, seed: int) -> BurstConfig:
    return BurstConfig(n=args.burst, concurrency=args.concurrency, min_tokens=args.min_tokens,
                       max_tokens_in=args.max_tokens_in, max_tokens=args.max_tokens, seed=seed)


def one_burst_child(args) -> int:
    """--one-burst: run one burst and print its figures as JSON (for 'procs')."""
    r = run_burst(args.one_burst, burst_config(args, args.seed), model_dir=args.model_dir)
    print(json.dumps(figures_of(r)))
    return 0


class Trial:
    """One preset served on its own GPUs and port for the whole run."""

    def __init__(self, preset, gpus: list[str], model: str | None, log: Path):
        from ernie_tui.engine_ctl.control import EngineServer
        from ernie_tui.engine_ctl.launch import free_port

        self.name = preset.name
        self.gpus = gpus
        preset = replace(preset, env={**preset.env, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}, port=free_port())
        self.spec = preset.launch_spec(preset.resolve_model(model))
        self.server = EngineServer(self.spec, preset_name=preset.name, log_path=log)

    def burst(self, args, seed: int) -> dict:
        r = run_burst(self.spec.url, burst_config(args, seed), model_dir=self.spec.model)
        return figures_of(r)

    def burst_in_child(self, args, seed: int) -> subprocess.Popen:
        argv = [sys.executable, str(HERE), "--one-burst", self.spec.url, "--model-dir", str(self.spec.model),
                "--seed", str(seed), "--burst", str(args.burst), "--concurrency", str(args.concurrency),
                "--min-tokens", str(args.min_tokens), "--max-tokens-in", str(args.max_tokens_in),
                "--max-tokens", str(args.max_tokens)]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def at_once(go: Callable[[int], None]) -> None:
    """go(0) and go(1) in two threads of this process, started together."""
    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def both_in_threads(trials: list[Trial], args, seeds: list[int]) -> list[dict]:
    out: list[dict] = [{}, {}]
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            out[i] = trials[i].burst(args, seeds[i])
        except BaseException as e:  # noqa: BLE001  re-raised in the caller
            errors.append(e)

    at_once(go)
    if errors:
        raise errors[0]
    return out


def both_in_processes(trials: list[Trial], args, seeds: list[int]) -> list[dict]:
    procs = [t.burst_in_child(args, s) for t, s in zip(trials, seeds, strict=True)]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a burst child failed ({p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def both_as_sweep_trials(trials: list[Trial], args, seeds: list[int]) -> list[dict]:
    """Both bursts as a parallel sweep's trials run them: each trial's thread
    supervises its own spawned load process (trial_load.LoadProcess) and
    forwards the progress under one lock, as sweep._run_parallel does. The
    sweep spawns that process as the trial's server starts, so it is up
    before the burst: here too, both are started and ready first."""
    from ernie_tui.engine_ctl.control import LoadJob, LoadProcess

    lock = threading.Lock()
    cancel = threading.Event()
    out: list[dict] = [{}, {}]
    errors: list[str] = []
    children = [LoadProcess(f"neighbour-bench {t.name}").start() for t in trials]
    for child in children:
        if not child.wait_ready(60):
            for c in children:
                c.close()
            raise SystemExit("a sweep-trial load process did not start")

    def progress(done: int, total: int) -> None:
        with lock:  # the sweep's emit(): listeners see one event at a time
            pass

    def go(i: int) -> None:
        t = trials[i]
        job = LoadJob("burst", t.spec.url, None, str(t.spec.model), None, burst_config(args, seeds[i]),
                      label=f"neighbour-bench {t.name}")
        got = children[i].run(job, progress, cancel)
        if got.result is None:
            errors.append(f"{t.name}: {got.error}")
        else:
            out[i] = figures_of(got.result)

    at_once(go)
    if errors:
        raise SystemExit("a sweep-trial burst failed: " + "; ".join(errors))
    return out


def spread_verdict(alone: list[float], beside: list[float]) -> str:
    """'within noise' when the neighbour's median lies inside the alone
    rounds' min-max widened by the beside rounds' own spread."""
    if len(alone) < 2:
        return "(one round: no spread)"
    lo, hi = min(alone), max(alone)
    slack = max(beside) - min(beside) if len(beside) > 1 else 0.0
    m = statistics.median(beside)
    return "within noise" if lo - slack <= m <= hi + slack else "beyond noise"


def summarize(trials: list[Trial], samples: dict) -> list[dict]:
    rows = []
    for t in trials:
        for mode in MODES:
            vals = samples[t.name][mode]
            if not vals:
                continue
            row = {"preset": t.name, "mode": mode, "rounds": len(vals)}
            for f in FIGURES:
                xs = [v[f] for v in vals if v.get(f) is not None]
                row[f] = {"median": statistics.median(xs) if xs else None,
                          "min": min(xs) if xs else None, "max": max(xs) if xs else None}
            if mode != "alone":
                alone = [v["output_tps"] for v in samples[t.name]["alone"]]
                mine = [v["output_tps"] for v in vals]
                a_med = statistics.median(alone)
                row["output_tps_vs_alone_pct"] = 100.0 * (statistics.median(mine) - a_med) / a_med
                row["verdict"] = spread_verdict(alone, mine)
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    def cell(d):
        if d["median"] is None:
            return "–"
        fmt = "{:,.0f}" if d["median"] >= 100 else "{:.1f}"
        return f"{fmt.format(d['median'])} ({fmt.format(d['min'])}–{fmt.format(d['max'])})"

    print("| preset | beside it | rounds | output tok/s median (min–max) | vs alone | TTFT p50 ms | "
          "TTFT p99 ms | ITL p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        vs = "–" if r["mode"] == "alone" else f"{r['output_tps_vs_alone_pct']:+.1f} % {r['verdict']}"
        mode = {"alone": "nothing (alone)", "threads": "a neighbour, bursts in threads",
                "procs": "a neighbour, bursts in processes",
                "sweep": "a neighbour, as sweep trials (load in child processes)"}[r["mode"]]
        print(f"| {r['preset']} | {mode} | {r['rounds']} | {cell(r['output_tps'])} | {vs} | "
              f"{cell(r['ttft_p50_ms'])} | {cell(r['ttft_p99_ms'])} | {cell(r['itl_p99_ms'])} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="two presets: A on the first GPUs, B on the next")
    p.add_argument("--presets", action="append", default=[], metavar="FILE")
    p.add_argument("--model", metavar="DIR", help="model dir for presets that name none")
    p.add_argument("--gpus", default="0,1", metavar="LIST", help="GPU ids, split in two halves (A, B)")
    p.add_argument("--stand-ins", action="store_true", help="two paced stand-in servers instead of vLLM")
    p.add_argument("--stand-in-slots", type=int, default=4, metavar="N", help="each stand-in's concurrent streams")
    p.add_argument("--stand-in-itl-ms", type=float, default=10.0, metavar="MS", help="each stand-in's token gap")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--burst", type=int, default=1500, metavar="N")
    p.add_argument("--concurrency", type=int, default=64, metavar="C")
    p.add_argument("--min-tokens", type=int, default=30)
    p.add_argument("--max-tokens-in", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=256, metavar="N", help="requests per server before round 1")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", metavar="DIR")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--one-burst", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one_burst:
        return one_burst_child(args)

    from ernie_tui.engine_ctl.control import ServerState, parse_gpu_ids
    from ernie_tui.presets import load_presets

    tmp = Path(tempfile.mkdtemp(prefix="neighbours-"))
    files, names, model = list(args.presets), list(args.names), args.model
    if args.stand_ins:
        from parallel_sweep import stand_in_presets, tiny_model

        model = model or tiny_model()
        path, all_names = stand_in_presets(tmp, model, args.stand_in_slots, args.stand_in_itl_ms)
        files.append(str(path))
        names = names or all_names[:2]
    if len(names) != 2:
        p.error("name two presets (A and B), or pass --stand-ins")
    gpu_ids = parse_gpu_ids(args.gpus)
    if len(gpu_ids) < 2:
        p.error("--gpus needs at least two ids (A gets the first half, B the rest)")
    half = len(gpu_ids) // 2
    book = load_presets(files)
    logs = Path(args.log_dir) if args.log_dir else tmp
    logs.mkdir(parents=True, exist_ok=True)
    trials = [Trial(book.get(names[0]), gpu_ids[:half], model, logs / f"A-{names[0]}.log"),
              Trial(book.get(names[1]), gpu_ids[half:], model, logs / f"B-{names[1]}.log")]
    samples: dict = {t.name: {m: [] for m in MODES} for t in trials}
    if trials[0].name == trials[1].name:
        p.error("name two different presets (the same one twice would merge their figures)")
    t0 = time.monotonic()
    try:
        for t in trials:
            t.server.start()
        for t in trials:
            st = t.server.wait_ready(args.ready_timeout)
            if st.state != ServerState.READY:
                raise SystemExit(f"{t.name} not ready: {st.state.value} {st.error}")
            print(f"{t.name} ready on GPUs {','.join(t.gpus)} at {t.spec.url} "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        # First requests pay one-off costs (sampling-kernel JIT, graph capture
        # of new batch sizes): keep them out of every round.
        if args.warmup:
            warm = argparse.Namespace(**{**vars(args), "burst": args.warmup})
            both_in_threads(trials, warm, [10_000, 10_001])
        seed = 0
        for k in range(args.rounds):
            order = MODES[k % len(MODES):] + MODES[:k % len(MODES)]
            for mode in order:
                seeds = [seed + 1, seed + 2]
                seed += 2
                t_mode = time.monotonic()
                if mode == "alone":
                    got = [trials[0].burst(args, seeds[0]), trials[1].burst(args, seeds[1])]
                elif mode == "threads":
                    got = both_in_threads(trials, args, seeds)
                elif mode == "procs":
                    got = both_in_processes(trials, args, seeds)
                else:
                    got = both_as_sweep_trials(trials, args, seeds)
                for t, g in zip(trials, got, strict=True):
                    samples[t.name][mode].append(g)
                print(f"round {k + 1} {mode:7s} ({time.monotonic() - t_mode:.0f} s): " + "; ".join(
                    f"{t.name} {g['output_tps']:,.0f} tok/s, TTFT p99 {g['ttft_p99_ms'] or 0:.0f} ms, "
                    f"{g['completed']}/{g['total']}" for t, g in zip(trials, got, strict=True)),
                    file=sys.stderr, flush=True)
    finally:
        for t in trials:
            t.server.stop()
    rows = summarize(trials, samples)
    print()
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "samples": samples,
                                               "seconds": time.monotonic() - t0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
