"""`ernie-tui sweep NAME... --out FILE.{csv,json,md}`."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from ernie_tui.cli.capacity_args import add_capacity_args
from ernie_tui.cli.shared_options import shared_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", parents=[shared_options(top_level=False)], help="measure several presets one after another and write the comparison table",
        description="For each preset: preflight (a preset that fails it is recorded and not launched), start, "
                    "wait ready, burst, stop, wait for the engine to be gone and GPU memory back to its "
                    "baseline. With --repeat R the presets run in rotated order R times and each figure is the "
                    "median with its min-max spread. With --capacity each preset gets a capacity search under "
                    "the --slo objectives instead of a burst, and presets are ranked by goodput at the SLO. "
                    "Ctrl-C stops the server and keeps the rows measured.")
    p.add_argument("names", nargs="+", metavar="NAME", help="presets to measure, in order")
    p.add_argument("--out", metavar="FILE", required=True, action="append",
                   help="FILE.csv, FILE.json or FILE.md (may repeat)")
    p.add_argument("--burst", type=int, default=100, metavar="N", help="requests per burst (100)")
    p.add_argument("--concurrency", type=int, default=4, metavar="C", help="concurrent requests (4)")
    p.add_argument("--min-tokens", type=int, default=30, metavar="A", help="shortest prompt, tokens (30)")
    p.add_argument("--max-tokens-in", type=int, default=300, metavar="B", help="longest prompt, tokens (300)")
    p.add_argument("--max-tokens", type=int, default=128, metavar="M", help="output tokens per request (128)")
    p.add_argument("--repeat", type=int, default=1, metavar="R", help="rounds, in rotated order (1)")
    p.add_argument("--ready-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--log-dir", metavar="DIR", help="keep each run's llm.log here")
    p.add_argument("--capacity", action="store_true",
                   help="search each preset's capacity under --slo (see below) and rank by goodput")
    add_capacity_args(p)
    p.set_defaults(run=_sweep)


def _sweep(args) -> int:
    from pathlib import Path

    from ernie_tui.cli import CliError
    from ernie_tui.engine_ctl.burst import BurstConfig
    from ernie_tui.engine_ctl.runstore import save_run
    from ernie_tui.engine_ctl.sweep import (CapacitySweep, SweepOptions, SweepPlan, export, fold, run_sweep,
                                            sweep_meta, to_markdown)
    from ernie_tui.presets import load_presets

    for out in args.out:
        if Path(out).suffix.lower() not in (".csv", ".json", ".md"):
            raise CliError(f"--out must end in .csv, .json or .md, got {out}")
    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
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
    capacity = None
    if args.capacity:
        from ernie_tui.cli.capacity_args import capacity_options, load_workload

        opts = capacity_options(args)
        workload = load_workload(args.workload, args.max_tokens)
        capacity = CapacitySweep(slo=opts.slo, search=opts.search, rules=opts.rules,
                                 workload_items=workload.items if workload else None)
    elif args.slo or args.workload:
        raise CliError("--slo and --workload belong to --capacity")
    plan = SweepPlan(presets, args.repeat)
    options = SweepOptions(model=model, ready_timeout_s=args.ready_timeout,
                           log_dir=Path(args.log_dir) if args.log_dir else None)
    cancel = threading.Event()
    box: dict = {}
    done_runs: list = []
    last_line = [""]
    t0 = time.monotonic()

    def meta_now() -> dict:
        return sweep_meta(args.names, args.repeat, config, done_runs, capacity=capacity, workload=args.workload,
                          seconds=time.monotonic() - t0)

    def progress(ev: dict) -> None:
        eta = ev.get("eta_s")
        where = f"[{ev['index'] + 1}/{ev['total']}] {ev['preset']}" + (f" r{ev['repeat'] + 1}" if args.repeat > 1 else "")
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
            phase = (f"capacity: concurrency {lv.concurrency} {'pass' if lv.passed else 'fail'}"
                     f"{'' if lv.decided else ' (undecided)'}, {lv.requests} requests")
        if phase == "done":
            phase = ev.get("status", "done")
            # Write the table after every preset, so a killed or interrupted
            # sweep still leaves the rows it measured on disk.
            done_runs.append(ev["run"])
            for out in args.out:
                export(fold(done_runs, [p.name for p in presets]), out, meta_now())
        line = f"{where}: {phase}" + (f"  (ETA {eta:.0f} s)" if eta and ev["phase"] == "preflight" else "")
        if line != last_line[0]:  # the start phase is reported every second; print changes only
            last_line[0] = line
            print(line, file=sys.stderr, flush=True)

    def work() -> None:
        try:
            box["runs"] = run_sweep(plan, config, options, progress, cancel, capacity=capacity)
        except BaseException as exc:  # reported on the main thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="sweep", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        print("ernie-tui: interrupted: stopping the server, keeping the rows measured ...", file=sys.stderr)
        cancel.set()
        worker.join()
    if "error" in box:
        raise box["error"]
    runs = box.get("runs", [])
    rows = fold(runs, [p.name for p in presets])
    meta = meta_now()
    for out in args.out:
        export(rows, out, meta)
    save_run("sweep", {"meta": meta, "runs": runs}, notes=" ".join(args.names))
    print(to_markdown(rows))
    overheads = [r.overhead_s for r in runs if r.overhead_s is not None]
    if overheads:
        print(f"sweep overhead beyond vLLM start, burst and stop: max {max(overheads):.2f} s per preset",
              file=sys.stderr)
    print(f"wrote {', '.join(args.out)}", file=sys.stderr)
    return 130 if cancel.is_set() else 0
