"""`ernie-tui sweep NAME... --out FILE.{csv,json,md}`."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from ernie_tui.cli.capacity_args import add_capacity_args
from ernie_tui.cli.cmd_report import check_out, write_from_refs
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.interruptible import run_interruptible
from ernie_tui.cli.out_paths import check_out_files
from ernie_tui.cli.ray_args import add_ray_args, ray_trials
from ernie_tui.cli.shared_options import shared_options
from ernie_tui.cli.traffic_args import add_traffic_args, with_traffic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", parents=[shared_options(top_level=False)],
        help="measure several presets and write the comparison table: a burst each, in turn; with --capacity "
             "paired (all served at once, levels taking turns, duel rounds)",
        description="For each preset: preflight (a preset that fails it is recorded and not launched), start, "
                    "wait ready, burst, stop, wait for the engine to be gone and GPU memory back to its "
                    "baseline. With --repeat R the presets run in rotated order R times and each figure is the "
                    "median with its min-max spread. With --capacity each preset gets a capacity search under "
                    "the --slo objectives instead of a burst, and presets are ranked by goodput at the SLO: "
                    "by default as a paired comparison that holds while the host's speed drifts: every "
                    "preset's server up at once (on one GPU only when preflight says they fit side by side), "
                    "one search per preset with their levels taking turns A B A B, then --repeat duel rounds "
                    "(3): a short ladder per preset around its knee (the knee, a reference preset measured "
                    "before and after, each level's tok/s taken over the reference's at that moment; then a "
                    "step above where it passed, or below where it failed, so the next round starts at the "
                    "knee found); each pair's verdict, 'B carries 18 % more (11-25 %)' or 'within noise', "
                    "comes from the rounds' paired ratios of tok/s at each knee ('within noise / undecided: "
                    "knee uncertain' where a knee's evidence contradicts itself), and the ranking only from "
                    "pairs beyond noise. --sequential: the old "
                    "mode, one preset after another. "
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
    p.add_argument("--repeat", type=int, default=None, metavar="R",
                   help="rounds: in rotated order (1); a paired --capacity sweep's duel rounds (3; at least 2 "
                        "for an interval)")
    p.add_argument("--min-difference", type=float, default=2.0, metavar="PCT", dest="min_difference",
                   help="a paired --capacity sweep: the smallest difference a verdict names, in %%: a pair is "
                        "beyond noise only where its whole interval is at least PCT %% from 0; one wholly inside "
                        "+-PCT %% reads 'within noise: no difference of PCT %% or more'. 0: any interval that "
                        "excludes 0 (2)")
    p.add_argument("--sequential", action="store_true",
                   help="with --capacity: the old mode, one preset at a time (started, searched, stopped), "
                        "ranked by medians; the host's drift between presets lands in the comparison")
    p.add_argument("--knees-from", metavar="FILE.json", dest="knees_from",
                   help="a paired --capacity sweep: start each preset's search at the knee its duels' "
                        "ladder ended on in FILE.json (an earlier paired sweep's --out export, e.g. of another "
                        "machine) and go "
                        "step up by --tolerance while levels pass: two levels a preset where the knee holds, "
                        "not a whole search; a knee that moved up is followed; "
                        "presets not in FILE get a whole search")
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
    add_ray_args(p)
    add_capacity_args(p)
    add_traffic_args(p)
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


def _paired(presets, config, options, capacity, rounds: int, progress, cancel, min_difference: float):
    """The paired capacity sweep (control/paired_sweep.py): (runs, PairedResult)."""
    from ernie_tui.engine_ctl.control import run_paired_sweep  # lazy: --help start-up

    return run_interruptible(lambda: run_paired_sweep(presets, config, options, capacity, rounds, progress, cancel,
                                                      min_difference=min_difference / 100.0),
                             cancel, name="sweep", on_interrupt="stopping the servers, keeping the rounds measured ...")


def _check_args(args) -> bool:
    """Refuse what cannot run; settle --repeat. True: the paired capacity sweep."""
    from pathlib import Path

    for out in args.out:
        if Path(out).suffix.lower() not in (".csv", ".json", ".md"):
            raise CliError(f"--out must end in .csv, .json or .md, got {out}")
    check_out_files("--out", args.out)
    paired = bool(args.capacity and not args.sequential and args.gpus_per_trial is None and args.ray is None
                  and len(args.names) > 1)
    if args.sequential and not args.capacity:
        raise CliError("--sequential belongs to --capacity (a burst sweep is always sequential)")
    if args.knees_from and not paired:
        raise CliError("--knees-from belongs to a paired sweep: --capacity with two or more presets, without "
                       "--sequential or --gpus-per-trial")
    if args.repeat is None:
        args.repeat = 3 if paired else 1
    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    if not 0 <= args.min_difference < 100:
        raise CliError(f"--min-difference is a percentage from 0 up to 100, got {args.min_difference:g}")
    if args.report:
        check_out(args.report, "--report")
    if not args.capacity and (args.slo or args.workload):
        raise CliError("--slo and --workload belong to --capacity")
    return paired


@dataclass
class _Setup:
    presets: list
    config: Any  # BurstConfig
    gpu_ids: list[str] | None
    capacity: Any  # CapacitySweep | None
    options: Any  # SweepOptions


def _setup(args) -> _Setup:
    from pathlib import Path

    from ernie_tui.engine_ctl.control import SweepOptions  # lazy: --help start-up
    from ernie_tui.engine_ctl.load import BurstConfig  # lazy: --help start-up
    from ernie_tui.presets import load_presets

    book = load_presets(args.presets)
    presets = [book.get(n) for n in args.names]
    for p in presets:
        p.resolve_model(args.model)  # a missing model is an error now, not after the first run
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
        if args.knees_from:
            from ernie_tui.engine_ctl.control import knees_from  # lazy: --help start-up

            try:
                capacity.knees = knees_from(Path(args.knees_from))
            except ValueError as exc:
                raise CliError(str(exc)) from None
    if gpu_ids is not None:
        own = [p.name for p in presets if "CUDA_VISIBLE_DEVICES" in p.env]
        if own:
            raise CliError(f"preset {own[0]} sets CUDA_VISIBLE_DEVICES in its env, but with --gpus-per-trial "
                           "the sweep hands each trial its GPUs; remove it from the preset or sweep without "
                           "--gpus-per-trial")
    config = with_traffic(args, config, capacity)
    options = SweepOptions(model=args.model, ready_timeout_s=args.ready_timeout,
                           log_dir=Path(args.log_dir) if args.log_dir else None,
                           gpus_per_trial=args.gpus_per_trial, gpu_ids=gpu_ids,
                           ray=_ray(args, presets))
    return _Setup(presets, config, gpu_ids, capacity, options)


def _ray(args, presets: list) -> Any:
    """--ray: the connected cluster (trials each on a node of theirs, ray_trials.py)."""
    if args.ray is not None and args.gpus_per_trial is not None:
        raise CliError("--gpus-per-trial and --ray do not go together: with --ray, Ray hands each trial its GPUs")
    return ray_trials(args, presets)


class _Progress:
    """The sweep's lines on stderr, and the exports rewritten after every
    finished run (a killed or interrupted sweep still leaves the rows it
    measured on disk)."""

    def __init__(self, args, setup: _Setup) -> None:
        self.args, self.setup = args, setup
        self.done_runs: list = []
        self.last_line: dict = {}  # per trial: parallel trials' lines interleave
        self.t0 = time.monotonic()

    def meta(self) -> dict:
        from ernie_tui.engine_ctl.control import sweep_meta  # lazy: --help start-up

        a, s = self.args, self.setup
        return sweep_meta(a.names, a.repeat, s.config, self.done_runs, capacity=s.capacity, workload=a.workload,
                          seconds=time.monotonic() - self.t0,
                          parallel=(f"{a.gpus_per_trial} GPU(s) per trial on GPUs {','.join(s.gpu_ids)}"
                                    if s.gpu_ids is not None else None))

    def __call__(self, ev: dict) -> None:
        from ernie_tui.engine_ctl.control import export_sweep, fold  # lazy: --help start-up

        where = f"[{ev['index'] + 1}/{ev['total']}] {ev['preset']}"
        where += f" r{ev['repeat'] + 1}" if self.args.repeat > 1 else ""
        if ev.get("gpus"):
            where += f" (GPU {ev['gpus']})"
        if ev.get("node"):  # --ray: the node the trial runs on
            where += f" (node {ev['node']})"
        phase = _phase_text(ev)
        if phase is None:
            return
        if ev["phase"] == "done":
            self.done_runs.append(ev["run"])
            for out in self.args.out:
                export_sweep(fold(self.done_runs, [p.name for p in self.setup.presets]), out, self.meta())
        eta = ev.get("eta_s")
        line = f"{where}: {phase}" + (f"  (ETA {eta:.0f} s)" if eta and ev["phase"] == "preflight" else "")
        if line != self.last_line.get(ev["index"]):  # the start phase is reported every second: changes only
            self.last_line[ev["index"]] = line
            print(line, file=sys.stderr, flush=True)


def _phase_text(ev: dict) -> str | None:
    """What a sweep event says, in a few words; None: not worth a line."""
    phase = ev["phase"]
    if phase == "burst" and ev.get("burst_total"):
        done, n = ev.get("burst_done", 0), ev["burst_total"]
        if done not in (0, n) and done % max(1, n // 10):
            return None
        return f"burst {done}/{n}"
    if phase == "capacity" and ev.get("capacity_event"):
        ce = ev["capacity_event"]
        if ce.get("event") != "level_done":
            return None
        from ernie_tui.engine_ctl.load import verdict_text  # lazy: --help start-up

        lv = ce["level"]
        return f"capacity: concurrency {lv.concurrency} {verdict_text(lv)}, {lv.requests} requests"
    if phase == "done":
        return ev.get("status", "done")
    return phase


def _sweep(args) -> int:
    from ernie_tui.engine_ctl.control import (  # lazy: --help start-up
        SweepPlan,
        measured,
        not_measured_why,
        run_sweep,
    )

    paired = _check_args(args)
    setup = _setup(args)
    cancel = threading.Event()
    progress = _Progress(args, setup)
    runs, result = None, None
    if paired:
        runs, result = _paired(setup.presets, setup.config, setup.options, setup.capacity, args.repeat, progress,
                               cancel, args.min_difference)
        if result.refused:
            print(f"not side by side: {result.refused}; measuring one preset after another instead",
                  file=sys.stderr)
            runs, result = None, None
    if runs is None:
        plan = SweepPlan(setup.presets, args.repeat)
        runs = run_interruptible(
            lambda: run_sweep(plan, setup.config, setup.options, progress, cancel, capacity=setup.capacity),
            cancel, name="sweep", on_interrupt="stopping the server, keeping the rows measured ...")
    rows = _finish(args, setup, runs, result, progress.meta())
    if cancel.is_set():
        return 130
    if not any(measured(r) for r in rows):
        raise CliError("nothing was measured, no preset was compared ("
                       + "; ".join(f"{r.preset}: {not_measured_why(r)}" for r in rows)
                       + "); the table says why for each")
    return 0


def _finish(args, setup: _Setup, runs: list, result: Any, meta: dict) -> list:
    """The exports, the sweep's record, the table (and the pairs) on stdout;
    the rows folded."""
    from ernie_tui.engine_ctl.control import export_sweep, fold, measured, to_markdown  # lazy: --help start-up
    from ernie_tui.engine_ctl.load import save_run  # lazy: --help start-up

    rows = fold(runs, [p.name for p in setup.presets], paired=result.to_dict() if result is not None else None)
    body: dict = {"meta": meta, "runs": runs}
    if result is not None:
        meta.update(mode=f"paired: {args.repeat} rounds, levels alternating between presets",
                    servers=result.co_residency, min_difference_pct=args.min_difference)
        body["paired"] = result.to_dict()
    for out in args.out:
        export_sweep(rows, out, meta, paired=result)
    record = save_run("sweep", body, notes=" ".join(args.names))
    print(to_markdown(rows))
    if result is not None:
        print("\n".join(result.lines()))
    if args.report and (any(measured(r) for r in rows) or any(r.record_id for r in runs)):
        # (a sweep where no preset got past preflight or its start has nothing to draw)
        args.out += write_from_refs([str(record.path)], args.report)
    overheads = [r.overhead_s for r in runs if r.overhead_s is not None]
    if overheads:
        print(f"sweep overhead beyond vLLM start, burst and stop: max {max(overheads):.2f} s per preset",
              file=sys.stderr)
    print(f"wrote {', '.join(args.out)}", file=sys.stderr)
    return rows
