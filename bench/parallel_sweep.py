"""Parallel sweep trials: do they halve the wall time, and do they leave
each other's figures alone?

Runs the same sweep twice through engine_ctl.sweep.run_sweep: first one
preset after another (every trial alone on the machine), then with
--gpus-per-trial N (trials side by side on disjoint GPU sets). Prints both
wall times and, per preset, the score measured alone and beside a
neighbour (output tok/s, or goodput tok/s at the SLO with --capacity), TTFT
p50 and peak memory, with the difference and whether it is inside the
spread the repeats measured (noise) or not.

    .venv/bin/python bench/parallel_sweep.py seed-A seed-C long-doc seed-A-util85 \\
        --model /models/ERNIE-4.5-0.3B-PT --gpus 0,1 --gpus-per-trial 1 --repeat 3

On a machine without GPUs the stand-in server (tests/paced_server.py) can be
the presets' launcher, with made-up GPU ids: --stand-ins writes four such
presets and sweeps them (`--gpus 0,1` is then just a label each stand-in
sees in its CUDA_VISIBLE_DEVICES).

    .venv/bin/python bench/parallel_sweep.py --stand-ins --gpus 0,1 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent / "src"))

from ernie_tui.cli.capacity_args import add_capacity_args, capacity_sweep, trials_at_once  # noqa: E402
from ernie_tui.engine_ctl.control import SweepOptions, SweepPlan, detect_gpu_ids, fold, run_sweep, score_column  # noqa: E402
from ernie_tui.engine_ctl.load import BurstConfig  # noqa: E402
from ernie_tui.presets import load_presets  # noqa: E402


def tiny_model() -> str:
    """Preflight reads a model's config even for a stand-in: the tiny demo
    model the tests use (written once, a few MB)."""
    from ernie_tui.demo_model import shared_tiny_model

    return str(shared_tiny_model())


def stand_in_presets(directory: Path, model: str, slots: int = 4, itl_ms: float = 10) -> tuple[Path, list[str]]:
    """Four presets launched as the paced stand-in (20 ms TTFT, by default
    10 ms ITL and 4 slots)."""
    paced = HERE.parent.parent / "tests" / "paced_server.py"
    body = ""
    names = []
    for i in range(4):
        name = f"stand-in-{i}"
        names.append(name)
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{model}"
            launcher = ["{sys.executable}", "{paced}"]
            env = {{ PACED_SLOTS = "{slots}", PACED_TTFT_MS = "20", PACED_ITL_MS = "{itl_ms:g}" }}
        """)
    path = directory / "stand-ins.toml"
    path.write_text(body)
    return path, names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="presets to sweep")
    p.add_argument("--presets", action="append", default=[], metavar="FILE", help="extra presets file")
    p.add_argument("--model", metavar="DIR", help="model dir for presets that name none")
    p.add_argument("--gpus", metavar="LIST", help="GPU ids, like 0,1 (default: CUDA_VISIBLE_DEVICES or NVML)")
    p.add_argument("--gpus-per-trial", default="1", metavar="N|auto")
    p.add_argument("--stand-ins", action="store_true", help="sweep four paced stand-in servers (no vLLM)")
    p.add_argument("--burst", type=int, default=100, metavar="N")
    p.add_argument("--concurrency", type=int, default=4, metavar="C")
    p.add_argument("--min-tokens", type=int, default=30)
    p.add_argument("--max-tokens-in", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=1, metavar="R")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", metavar="DIR", help="keep each run's log (sequential/ and parallel/ in it)")
    p.add_argument("--json", metavar="FILE", help="write both sweeps' runs and the wall times")
    p.add_argument("--capacity", action="store_true", help="capacity search per preset (needs --slo)")
    add_capacity_args(p)
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="parallel-sweep-"))
    files = list(args.presets)
    names = list(args.names)
    model = args.model
    if args.stand_ins:
        path, names = stand_in_presets(tmp, model or tiny_model())
        files.append(str(path))
        if args.burst == 100:  # a stand-in burst that takes seconds, not minutes
            args.burst, args.max_tokens, args.min_tokens, args.max_tokens_in = 16, 64, 10, 40
    if not names:
        p.error("name presets to sweep, or pass --stand-ins")
    book = load_presets(files)
    presets = [book.get(n) for n in names]
    per = args.gpus_per_trial if args.gpus_per_trial == "auto" else int(args.gpus_per_trial)
    gpu_ids = detect_gpu_ids(args.gpus)
    config = BurstConfig(n=args.burst, concurrency=args.concurrency, min_tokens=args.min_tokens,
                         max_tokens_in=args.max_tokens_in, max_tokens=args.max_tokens)
    capacity = None
    if args.capacity:
        capacity = capacity_sweep(args, trials_at_once(gpu_ids, per))
    logs = Path(args.log_dir) if args.log_dir else tmp / "logs"

    def progress(ev: dict) -> None:
        if ev["phase"] == "done":
            gpus = f" GPU {ev['gpus']}" if ev.get("gpus") else ""
            why = f" ({ev['run'].message})" if ev["status"] != "ok" and ev["run"].message else ""
            print(f"  [{ev['index'] + 1}/{ev['total']}] {ev['preset']} r{ev['repeat'] + 1}{gpus}: {ev['status']}{why}",
                  file=sys.stderr, flush=True)

    results = {}
    for mode in ("sequential", "parallel"):
        options = SweepOptions(model=model, ready_timeout_s=args.ready_timeout, log_dir=logs / mode,
                               gpus_per_trial=per if mode == "parallel" else None,
                               gpu_ids=gpu_ids if mode == "parallel" else None, save_records=False)
        if mode == "sequential":
            # With N per trial, the first N GPUs for every trial, as many as a
            # parallel trial gets: the comparison is then about neighbours,
            # not about GPUs. With auto, all of them (each preset takes what it needs).
            import os

            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids if per == "auto" else gpu_ids[:per])
        print(f"{mode}: {len(presets)} presets x {args.repeat}" +
              (f" on GPUs {','.join(gpu_ids)}, {per} per trial" if mode == "parallel" else ""), file=sys.stderr)
        t0 = time.monotonic()
        try:
            runs = run_sweep(SweepPlan(presets, args.repeat), config, options, progress, capacity=capacity)
        finally:
            if mode == "sequential":
                import os

                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        results[mode] = (time.monotonic() - t0, runs)

    seq_s, seq_runs = results["sequential"]
    par_s, par_runs = results["parallel"]
    order = [p.name for p in presets]
    alone = {r.preset: r for r in fold(seq_runs, order)}
    beside = {r.preset: r for r in fold(par_runs, order)}
    score = score_column(seq_runs + par_runs)
    print()
    print(f"wall time: sequential {seq_s:.1f} s, parallel {par_s:.1f} s "
          f"({par_s / seq_s:.2f} of sequential; {len(gpu_ids)} GPUs, {per} per trial)")
    print()
    head = f"| preset | {score} alone | {score} beside | diff | TTFT p50 ms alone | beside | peak GiB alone | beside |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))

    def med(row, col):
        a = row.stats.get(col) if row else None
        return None if a is None else a.median

    def show(v):
        return "–" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}")

    for name in order:
        a, b = alone.get(name), beside.get(name)
        sa, sb = med(a, score), med(b, score)
        if sa is None or sb is None:
            diff = "–"
        else:
            spread = max(a.stats[score].spread, b.stats[score].spread)
            pct = 100 * (sb - sa) / sa if sa else 0.0
            if args.repeat < 2:
                diff = f"{pct:+.1f}% (no spread: --repeat 3)"
            elif abs(sb - sa) <= spread:
                diff = f"{pct:+.1f}% within noise"
            else:
                diff = f"{pct:+.1f}% beyond noise"
        print(f"| {name} | {show(sa)} | {show(sb)} | {diff} | {show(med(a, 'ttft_p50_ms'))} | "
              f"{show(med(b, 'ttft_p50_ms'))} | {show(med(a, 'peak_memory_gib'))} | "
              f"{show(med(b, 'peak_memory_gib'))} |")
    if args.json:
        from dataclasses import asdict

        Path(args.json).write_text(json.dumps({
            "sequential_s": seq_s, "parallel_s": par_s, "gpus": gpu_ids, "gpus_per_trial": per,
            "sequential": [asdict(r) for r in seq_runs], "parallel": [asdict(r) for r in par_runs]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
