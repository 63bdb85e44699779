"""`ernie-tui sweep NAME... --out FILE.{csv,json,md}`."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from ernie_tui.cli.capacity_args import add_capacity_args
from ernie_tui.cli.cmd_report import check_out, write_from_refs
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.interruptible import run_interruptible
from ernie_tui.cli.shared_options import shared_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", parents=[shared_options(top_level=False)],
        help="measure several presets one after another and write the comparison table",
        description="For each preset: preflight (a preset that fails it is recorded and not launched), start, "
                    "wait ready, burst, stop, wait for the engine to be gone and GPU memory back to its "
                    "baseline. With --repeat R the presets run in rotated order R times and each figure is the "
                    "median with its min-max spread. With --capacity each preset gets a capacity search under "
                    "the --slo objectives instead of a burst, and presets are ranked by goodput at the SLO. "
                    "With --gpus-per-trial N presets run at the same time on disjoint GPU sets (each its own "
                    "CUDA_VISIBLE_DEVICES, port and log; never two on one GPU). "
                    "Ctrl-C, SIGTERM or SIGHUP stops the server and keeps the rows measured.")
    p.add_argument("names", nargs="+", metavar="NAME", help="presets to measure, in order")
    p.add_argument("--out", metavar="FILE", required=True, action="append",
                   help="FILE.csv, FILE.json or FILE.md (may repeat)")
    p.add_argument("--report", metavar="FILE", action="append", default=[],
                   help="at the end, draw the sweep (ranking, Pareto front, each trial's curve) into FILE.html "
                        "(self-contained), FILE.png or FILE.svg, as `ernie-tui report` does (may repeat; needs "
                        "ernie-tui[report])")
    p.add_argument("--burst", type=int, default=100, metavar="N", help="requests per burst (100)")
    p.add_argument("--concurrency", type=int, default=4, metavar="C", help="concurrent requests (4)")
    p.add_argument("--min-tokens", type=int, default=30, metavar="A", help="shortest prompt, tokens (30)")
    p.add_argument("--max-tokens-in", type=int, default=300, metavar="B", help="longest prompt, tokens (300)")
    p.add_argument("--max-tokens", type=int, default=128, metavar="M", help="output tokens per request (128)")
    p.add_argument("--repeat", type=int, default=1, metavar="R", help="rounds, in rotated order (1)")
    p.add_argument("--ready-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--log-dir", metavar="DIR", help="keep each run's llm.log here")
    p.add_argument("--gpus-per-trial", metavar="N|auto", type=_per_trial, dest="gpus_per_trial",
                   help="run trials side by side, each on N GPUs of its own (auto: the GPUs its preset needs, "
                        "tensor x pipeline x local data parallel); a preset needing more than N is skipped")
    p.add_argument("--gpus", metavar="LIST", dest="gpu_list",
                   help="GPU ids to spread trials over, like 0,1 (default: CUDA_VISIBLE_DEVICES, else every "
                        "GPU NVML sees; needed where neither says)")
    p.add_argument("--capacity", action="store_true",
                   help="search each preset's capacity under --slo (see below) and rank by goodput")
    add_capacity_args(p)
    p.set_defaults(run=_sweep)


def _per_trial(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GPUs or auto, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1 (or auto)")
    return n


def _gpu_plan(args) -> list[str] | None:
    """The GPU ids for --gpus-per-trial, decided (and refused) before anything starts."""
    from ernie_tui.engine_ctl.control import GpuIdsError, detect_gpu_ids  # lazy: --help start-up

    if args.gpus_per_trial is None:
        if args.gpu_list:
            raise CliError("--gpus belongs to --gpus-per-trial (a sequential sweep uses the GPUs its "
                           "presets and CUDA_VISIBLE_DEVICES give it)")
        return None
    try:
        return detect_gpu_ids(args.gpu_list)
    except GpuIdsError as exc:
        raise CliError(str(exc)) from None


def _sweep(args) -> int:
    from pathlib import Path

    from ernie_tui.engine_ctl.control import (  # lazy: --help start-up
        SweepOptions,
        SweepPlan,
        export_sweep,
        fold,
        run_sweep,
        sweep_meta,
        to_markdown,
    )
    from ernie_tui.engine_ctl.load import BurstConfig, save_run  # lazy: --help start-up
    from ernie_tui.presets import load_presets

    for out in args.out:
        if Path(out).suffix.lower() not in (".csv", ".json", ".md"):
            raise CliError(f"--out must end in .csv, .json or .md, got {out}")
    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    if args.report:

        check_out(args.report)
    book = load_presets(args.presets)
    model = args.model
    presets = [book.get(n) for n in args.names]
    for p in presets:
        p.resolve_model(model)  # a missing model is an error now, not after the first run
    config = BurstConfig(n=args.burst, concurrency=args.concurrency, min_tokens=args.min_tokens,
                         max_tokens_in=args.max_tokens_in, max_tokens=args.max_tokens)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    gpu_ids = _gpu_plan(args)
    capacity = None
    if args.capacity:
        from ernie_tui.cli.capacity_args import capacity_sweep, trials_at_once  # lazy: --help start-up

        capacity = capacity_sweep(args, trials_at_once(gpu_ids, args.gpus_per_trial))
    elif args.slo or args.workload:
        raise CliError("--slo and --workload belong to --capacity")
    if gpu_ids is not None:
        own = [p.name for p in presets if "CUDA_VISIBLE_DEVICES" in p.env]
        if own:
            raise CliError(f"preset {own[0]} sets CUDA_VISIBLE_DEVICES in its env, but with --gpus-per-trial "
                           "the sweep hands each trial its GPUs; remove it from the preset or sweep without "
                           "--gpus-per-trial")
    plan = SweepPlan(presets, args.repeat)
    options = SweepOptions(model=model, ready_timeout_s=args.ready_timeout,
                           log_dir=Path(args.log_dir) if args.log_dir else None,
                           gpus_per_trial=args.gpus_per_trial, gpu_ids=gpu_ids)
    cancel = threading.Event()
    done_runs: list = []
    last_line: dict = {}  # per trial: parallel trials' lines interleave
    t0 = time.monotonic()

    def meta_now() -> dict:
        return sweep_meta(args.names, args.repeat, config, done_runs, capacity=capacity, workload=args.workload,
                          seconds=time.monotonic() - t0,
                          parallel=(f"{args.gpus_per_trial} GPU(s) per trial on GPUs {','.join(gpu_ids)}"
                                    if gpu_ids is not None else None))

    from ernie_tui.engine_ctl.load import verdict_text  # lazy: --help start-up

    def progress(ev: dict) -> None:
        eta = ev.get("eta_s")
        where = f"[{ev['index'] + 1}/{ev['total']}] {ev['preset']}"
        where += f" r{ev['repeat'] + 1}" if args.repeat > 1 else ""
        if ev.get("gpus"):
            where += f" (GPU {ev['gpus']})"
        phase = ev["phase"]
        if phase == "burst" and ev.get("burst_total"):
            done, n = ev.get("burst_done", 0), ev["burst_total"]
            if done not in (0, n) and done % max(1, n // 10):
                return
            phase = f"burst {done}/{n}"
        if phase == "capacity" and ev.get("capacity_event"):
            ce = ev["capacity_event"]
            if ce.get("event") != "level_done":
                return
            lv = ce["level"]
            phase = f"capacity: concurrency {lv.concurrency} {verdict_text(lv)}, {lv.requests} requests"
        if phase == "done":
            phase = ev.get("status", "done")
            # Write the table after every preset, so a killed or interrupted
            # sweep still leaves the rows it measured on disk.
            done_runs.append(ev["run"])
            for out in args.out:
                export_sweep(fold(done_runs, [p.name for p in presets]), out, meta_now())
        line = f"{where}: {phase}" + (f"  (ETA {eta:.0f} s)" if eta and ev["phase"] == "preflight" else "")
        if line != last_line.get(ev["index"]):  # the start phase is reported every second; print changes only
            last_line[ev["index"]] = line
            print(line, file=sys.stderr, flush=True)

    runs = run_interruptible(lambda: run_sweep(plan, config, options, progress, cancel, capacity=capacity),
                             cancel, name="sweep", on_interrupt="stopping the server, keeping the rows measured ...")
    rows = fold(runs, [p.name for p in presets])
    meta = meta_now()
    for out in args.out:
        export_sweep(rows, out, meta)
    record = save_run("sweep", {"meta": meta, "runs": runs}, notes=" ".join(args.names))
    print(to_markdown(rows))
    if args.report:

        args.out += write_from_refs([str(record.path)], args.report)
    overheads = [r.overhead_s for r in runs if r.overhead_s is not None]
    if overheads:
        print(f"sweep overhead beyond vLLM start, burst and stop: max {max(overheads):.2f} s per preset",
              file=sys.stderr)
    print(f"wrote {', '.join(args.out)}", file=sys.stderr)
    return 130 if cancel.is_set() else 0
