"""`ernie-tui tune BASE --space FILE.toml --slo ... [--budget 25m | --trials N]`."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ernie_tui.cli.capacity_args import add_capacity_args
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.interruptible import run_interruptible
from ernie_tui.cli.ray_args import add_ray_args, ray_trials
from ernie_tui.cli.shared_options import shared_options
from ernie_tui.cli.traffic_args import add_traffic_args, traffic_fields, with_traffic

DEFAULT_TRIALS = 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", parents=[shared_options(top_level=False)],
        help="search engine settings for the most goodput under an SLO; save the best as a preset if it beats BASE",
        description="Search the engine arguments named in --space for the setting that carries the most goodput "
                    "(output tok/s of the requests meeting the SLO, at the capacity the search finds) and write it "
                    "as a preset when it beat BASE beyond noise. Each trial is BASE with the values Optuna's TPE "
                    "sampler picks (the preset "
                    "BASE-tune-N): preflight judges it first, and a setting vLLM would refuse is pruned with the "
                    "reason, no server started; the others get a server and a capacity search under --slo. BASE "
                    "is measured too, for how far the best beats it. "
                    "The space file names each argument's choices (max_num_seqs = [64, 128, 256]) or integer "
                    "range (max_num_batched_tokens = {min = 2048, max = 16384, log = true}; step = N optional); "
                    "booleans are choices ([true, false]). "
                    "Resuming: the study is kept in a journal under the run store, named tune-BASE-HASH, the "
                    "hash of BASE's settings, the space, the SLO and the prompts: run the same command again and "
                    "it goes on from the trials it saved (the one cut short runs first); --study NAME names it "
                    "yourself, --fresh starts it over. Ctrl-C, SIGTERM or SIGHUP stop the tune, the server "
                    "stopped, every finished trial kept. The budget (--budget wall time of this run, --trials "
                    "measured trials of the study) counts neither refusals nor repeats of a setting.")
    p.add_argument("base", metavar="BASE", help="the preset to start from and compare with")
    p.add_argument("--space", metavar="FILE.toml", required=True, help="the engine arguments to search")
    p.add_argument("--budget", metavar="TIME", type=_duration,
                   help="wall time for this run, like 25m, 90s or 1h, counted from the command's start (no new "
                        "trial starts unless the longest so far would fit; a trial still running at the end is "
                        "stopped and runs first next time)")
    p.add_argument("--trials", type=int, metavar="N",
                   help=f"measured trials in the study (default {DEFAULT_TRIALS} unless --budget is given); with "
                        "--storage, the study's budget over all its drivers")
    p.add_argument("--gpus", metavar="LIST", dest="gpu_list",
                   help="GPU ids for the trials' servers, like 0,1,2,3: trials run side by side, each on as many "
                        "of them as BASE needs (tensor x pipeline x local data parallel; CUDA_VISIBLE_DEVICES) "
                        "with a port of its own")
    p.add_argument("--out-preset", metavar="NAME",
                   help="the name the best setting is written under in the user presets file (default "
                        "BASE-tuned), when it beat BASE beyond noise")
    p.add_argument("--no-preset", action="store_true", help="write no preset, only the run record")
    p.add_argument("--write-even-if-not-better", action="store_true",
                   help="write the best as a preset even when the comparison did not show it beating BASE "
                        "beyond noise (within noise, below BASE, or --confirm 0); the answer and the preset's "
                        "description say so. Without it such a setting is not written (exit 0: an honest answer, "
                        "the run record keeps every measurement)")
    p.add_argument("--study", metavar="NAME", help="the study's name (default tune-BASE-HASH: see above)")
    p.add_argument("--fresh", action="store_true", help="start the study over, forgetting its saved trials")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="the sampler's seed (0)")
    p.add_argument("--confirm", type=int, default=3, metavar="N",
                   help="at the end, compare the best with BASE as `sweep --capacity` compares presets: both "
                        "served at once, their levels taking turns, then N duel rounds (at least 2): 'the best "
                        "carries X %% more (lo to hi %%)' or 'within noise'. Where the two cannot be served side "
                        "by side, each is measured again N times, alternately, and their ranges compared. The best "
                        "is written as a preset only when it carries more beyond noise. 0: no comparison beyond "
                        "the search's one measurement each, so no preset is written unless "
                        "--write-even-if-not-better (3)")
    p.add_argument("--min-difference", type=float, default=2.0, metavar="PCT", dest="min_difference",
                   help="the smallest gain over BASE the comparison names, in %%: the best beats BASE beyond "
                        "noise, and is written as a preset, only where the whole interval is at least PCT %% above "
                        "0; an interval wholly inside +-PCT %% reads 'within noise: no difference of PCT %% or "
                        "more'. 0: any interval that excludes 0 (2)")
    p.add_argument("--tui", action="store_true",
                   help="show the tune on a screen: trials as they finish, the best so far, the budget left "
                        "(x stops it, keeping what was measured; q quits once it has ended)")
    p.add_argument("--min-tokens", type=int, default=30, metavar="A", help="shortest prompt, tokens (30)")
    p.add_argument("--max-tokens-in", type=int, default=300, metavar="B", help="longest prompt, tokens (300)")
    p.add_argument("--max-tokens", type=int, default=128, metavar="M", help="output tokens per request (128)")
    p.add_argument("--ready-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--log-dir", metavar="DIR", help="keep each trial's llm.log here")
    add_ray_args(p)
    p.add_argument("--storage", metavar="URL",
                   help="keep the study in a database instead of the journal file (an SQLAlchemy URL Optuna "
                        "takes: sqlite:///study.db, postgresql://user@host/db with pip install 'ernie-tui[postgres]'): "
                        "several tunes of one study, on one machine or several, then run at once and share it, "
                        "no setting measured twice, --trials N measured in all (one that finds the last ones "
                        "being measured by the others waits for them)")
    add_capacity_args(p)
    add_traffic_args(p)
    p.set_defaults(run=_tune)


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a time like 25m, 90s or 1h, got {text!r}")
    return float(m.group(1)) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


def study_name(base: Any, space: Any, args: argparse.Namespace) -> str:
    """tune-BASE-HASH: the same BASE settings, space, SLO, prompts and traffic give the same study.
    The traffic counts by its profile's digest (its numbers, not its file's
    name or path) and how its outputs end: a tune on another shape is another
    study, not a resumed one. Without --traffic the key has no traffic entry,
    so the studies of earlier versions keep their names."""
    from ernie_tui.presets.store import preset_table  # lazy: --help start-up

    fields: dict[str, Any] = {"base": preset_table(base), "space": space.digest(), "slo": sorted(args.slo),
                              "prompts": [args.min_tokens, args.max_tokens_in, args.max_tokens],
                              "workload": args.workload, "rate": args.rate is not None, "seed": args.seed}
    traffic = traffic_fields(args)
    if traffic is not None:
        fields["traffic"] = [traffic[0].digest, getattr(args, "traffic_outputs", "lengths")]
    key = json.dumps(fields, sort_keys=True, default=str)
    return f"tune-{base.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _setup(args: argparse.Namespace) -> Any:
    """The TuneSetup from the command line, every mistake refused before anything starts."""
    from ernie_tui import paths  # lazy: --help start-up
    from ernie_tui.cli.capacity_args import capacity_sweep
    from ernie_tui.engine_ctl.control import SweepOptions, TuneError, TuneSetup, detect_gpu_ids, require_optuna
    from ernie_tui.engine_ctl.load import BurstConfig
    from ernie_tui.presets import PresetError, load_presets
    from ernie_tui.presets.space import load_space

    try:
        require_optuna()
    except TuneError as exc:
        raise CliError(str(exc)) from None
    if args.trials is not None and args.trials < 1:
        raise CliError("--trials must be at least 1")
    if args.confirm < 0:
        raise CliError("--confirm must be 0 or more")
    if args.storage:  # a database that cannot be reached is said now, before a server starts
        from ernie_tui.engine_ctl.control import StorageError, storage_reachable  # lazy: --help start-up

        try:
            storage_reachable(args.storage)
        except StorageError as exc:
            raise CliError(str(exc)) from None
    if not 0 <= args.min_difference < 100:
        raise CliError(f"--min-difference is a percentage from 0 up to 100, got {args.min_difference:g}")
    try:
        space = load_space(args.space)
        base = load_presets(args.presets).get(args.base)
        base.resolve_model(args.model)
    except PresetError as exc:
        raise CliError(str(exc)) from None
    config = BurstConfig(min_tokens=args.min_tokens, max_tokens_in=args.max_tokens_in, max_tokens=args.max_tokens)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    gpu_ids = None
    if args.gpu_list:
        from ernie_tui.engine_ctl.control import GpuIdsError  # lazy: --help start-up

        try:
            gpu_ids = detect_gpu_ids(args.gpu_list)
        except GpuIdsError as exc:
            raise CliError(str(exc)) from None
    if args.ray is not None and gpu_ids:
        raise CliError("--gpus and --ray do not go together: with --ray, Ray hands each trial its GPUs")
    name = args.study or study_name(base, space, args)
    study_dir = paths.runs_dir() / "tune" / name
    if args.fresh and (study_dir / "journal.log").exists():
        (study_dir / "journal.log").unlink()
    if args.fresh and args.storage:
        _forget_study(args.storage, name)
    options = SweepOptions(model=args.model, ready_timeout_s=args.ready_timeout,
                           log_dir=Path(args.log_dir) if args.log_dir else study_dir / "logs",
                           gpus_per_trial="auto" if gpu_ids else None, gpu_ids=gpu_ids,
                           ray=ray_trials(args, [base]))
    trials = args.trials if args.trials is not None else (None if args.budget else DEFAULT_TRIALS)
    capacity = capacity_sweep(args)
    config = with_traffic(args, config, capacity)
    return TuneSetup(base=base, space=space, capacity=capacity, burst_config=config, options=options,
                     study_dir=study_dir, study_name=name, max_trials=trials, budget_s=budget_left(args.budget),
                     seed=args.seed,
                     confirm_rounds=args.confirm, port=_trial_port(base), storage=args.storage,
                     min_difference=args.min_difference / 100.0)


def _forget_study(url: str, name: str) -> None:
    """--fresh with --storage: the study deleted from the database (if there)."""
    from ernie_tui.engine_ctl.control import require_optuna  # lazy: --help start-up

    optuna = require_optuna()
    try:
        optuna.delete_study(study_name=name, storage=url)
    except KeyError:
        pass  # no such study yet


def budget_left(budget: float | None, started: float | None = None) -> float | None:
    """--budget counts from this process's start (`started`, epoch seconds;
    psutil's create_time by default): the command ends within it, its
    imports and set-up included, as a wall clock around it reads."""
    if budget is None:
        return None
    if started is None:
        import psutil

        started = psutil.Process().create_time()
    return max(1.0, budget - max(0.0, time.time() - started))


def _trial_port(base: Any) -> int | None:
    """None when BASE's port is free; else the next free one (the operator's
    own server may be serving BASE there now), said on stderr."""
    from ernie_tui.engine_ctl.launch import next_free_port, port_is_free  # lazy: --help start-up

    if port_is_free(base.host, base.port)[0]:
        return None
    port = next_free_port(base.host, base.port)
    if port is None:
        raise CliError(f"no free port after {base.port} on {base.host} for the trials' servers")
    print(f"port {base.port} is in use: the trials' servers listen on {port}", file=sys.stderr)
    return port


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _progress(setup: Any, t0: float):
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def progress(ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "base_start":
            say(f"BASE {ev['preset']}: measuring its capacity under the SLO ...")
        elif kind == "base_done":
            say(f"BASE {ev['preset']}: {_fmt(ev['goodput'])} tok/s at the SLO")
        elif kind == "trial_start":
            say(f"trial {ev['number']} {_params(ev['params'])}: preflight ...")
        elif kind == "confirm":
            say(f"confirming, round {ev['round']}: {ev['preset']} ...")
        elif kind == "waiting":
            say(f"--trials {ev['max_trials']}: the rest are being measured by other drivers of the study; "
                "waiting, in case one turns out a repeat or its driver stops ...")
        elif kind == "sweep":
            ce = ev["sweep"].get("capacity_event")
            if ce and ce.get("event") == "level_done":
                lv = ce["level"]
                # Two lanes (--gpus, --ray) interleave their levels: each line says whose it is.
                node = ev["sweep"].get("node")
                n = int(ev.get("number", 0))
                whose = {-1: "BASE", -2: "confirming"}.get(n, f"trial {n}") + (f" on {node}" if node else "")
                say(f"  {whose}: concurrency {lv.concurrency}: {'pass' if lv.passed else 'fail'}")
        elif kind == "trial_done" and ev["row"] is not None:
            r, best = ev["row"], ev["best"]
            what = f"{_fmt(r.goodput)} tok/s" if r.outcome == "measured" else f"{r.outcome}: {r.reason}"
            left = [f"{ev['measured']}/{ev['max_trials']} trials" if ev["max_trials"] else f"{ev['measured']} trials"]
            if ev["deadline"] is not None:
                left.append(f"{max(0.0, ev['deadline'] - time.monotonic()) / 60:.1f} min left")
            best_txt = f"best trial {best.number} {_fmt(best.goodput)} tok/s" if best else "no best yet"
            say(f"trial {r.number} {r.preset} {_params(r.params)}: {what}  ({best_txt}; {', '.join(left)})")

    return progress


def answer_text(result: Any, preset: str = "") -> str:
    """The answer as printed: best setting vs BASE, whether it was written as
    a preset (`preset`, preset_line), what matters, what preflight refused."""
    lines = [f"tune of {result.base} under {result.slo} (study {result.study_name}): {result.stopped}; "
             f"{result.measured_trials} trials measured of {result.settings_in_space} settings in the space, "
             f"{result.seconds:.0f} s"]
    base = result.base_goodputs
    lines.append(f"BASE {result.base}: {_fmt(base[0]) if base else '–'} tok/s"
                 + (f" (measured {len(base)} times: {', '.join(_fmt(b) for b in base)})" if len(base) > 1 else ""))
    best = result.best
    if best is None:
        lines.append("best: none measured")
    else:
        lines.append(f"best: trial {best.number} {_params(best.params)}: {_fmt(best.goodput)} tok/s "
                     f"(capacity {best.capacity if best.capacity is not None else '–'})")
    lines.append(f"vs BASE: {result.verdict.text}")
    if preset:
        lines.append(preset)
    if result.importances:
        lines.append("what matters (Optuna's importances): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in result.importances.items()))
    for k, by_value in result.effects.items():
        lines.append(f"  {k}: " + ", ".join(f"{v} -> {_fmt(g)}" for v, g in by_value.items()) + " tok/s (median)")
    if result.refused:
        lines.append("preflight refused:")
        lines += [f"  trial {r.number} {_params(r.params)}: {r.reason}" for r in result.refused]
    lines.append("")
    lines.append("| trial | setting | outcome | goodput tok/s | capacity | TTFT p99 ms | ITL p99 ms | s |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in result.trials:
        outcome = r.outcome if r.outcome == "measured" else f"{r.outcome}: {r.reason}"
        lines.append(f"| {r.number} | {_params(r.params)} | {outcome.replace('|', '/')} | {_fmt(r.goodput)} | "
                     f"{'–' if r.capacity is None else f'{r.capacity:g}'} | {_fmt(r.ttft_p99_ms)} | "
                     f"{_fmt(r.itl_p99_ms)} | {_fmt(r.seconds)} |")
    return "\n".join(lines) + "\n"


def preset_name(setup: Any, args: argparse.Namespace) -> str:
    return args.out_preset or f"{setup.base.name}-tuned"


def preset_line(name: str, choice: Any, written: bool) -> str:
    """The answer's line on the preset (PresetChoice: written only when the best beat BASE beyond noise)."""
    if written and choice.confirmed:
        return f"preset {name}: written (the best beat BASE beyond noise)"
    if written:
        return (f"preset {name}: written although {choice.why}, because --write-even-if-not-better asked for it; "
                "its description says so")
    if choice.write:
        return f"preset {name}: not written: the presets file could not be written (see above)"
    if choice.why == "no setting was measured":
        return f"preset {name}: not written: no setting was measured"
    return (f"preset {name}: not written: {choice.why}. Every measurement is in the run record; "
            "--write-even-if-not-better writes it anyway")


def _write_preset(setup: Any, result: Any, name: str, run_id: str, unconfirmed: str) -> bool:
    from ernie_tui.engine_ctl.control import tuned_preset  # lazy: --help start-up
    from ernie_tui.presets import PresetError
    from ernie_tui.presets.store import save_preset

    preset = tuned_preset(setup, result, name, run_id, unconfirmed)
    if preset is None:
        return False
    try:
        path = save_preset(preset, note=f"written by ernie-tui tune, run {run_id}")
    except PresetError as exc:
        print(f"ernie-tui: could not write preset {name}: {exc}", file=sys.stderr)
        return False
    print(f"wrote preset {name} to {path}: {preset.description}", file=sys.stderr)
    return True


def _tune_on_screen(setup: Any, cancel: threading.Event, args: argparse.Namespace) -> Any:
    """The tune on its own screen (--tui); `cancel` set when the operator stopped it."""
    from ernie_tui.tui.tune_app import TuneApp  # lazy: Textual only when asked for

    app = TuneApp(setup, preset=None if args.no_preset else preset_name(setup, args),
                  write_anyway=args.write_even_if_not_better)
    result = app.run()
    if app.stopped_by_operator:
        cancel.set()
    if result is None:
        raise CliError(f"the tune ended without an answer: {app.tune_screen.error or 'the screen was closed'}")
    return result


def _tune(args: argparse.Namespace) -> int:
    from ernie_tui.engine_ctl.control import TuneError, preset_choice, run_tune  # lazy: --help start-up
    from ernie_tui.engine_ctl.load import save_run

    setup = _setup(args)
    cancel = threading.Event()
    print(f"study {setup.study_name} in {setup.study_dir} ({setup.space.size()} settings; "
          + ", ".join(p.describe() for p in setup.space.params) + ")", file=sys.stderr)
    if args.tui:
        result = _tune_on_screen(setup, cancel, args)
    else:
        try:
            result = run_interruptible(lambda: run_tune(setup, _progress(setup, time.monotonic()), cancel), cancel,
                                       name="tune", on_interrupt="stopping the trial's server, keeping the trials "
                                                                 "measured (run the same command to go on) ...")
        except TuneError as exc:
            raise CliError(str(exc)) from None
    choice, line = None, ""
    if not args.no_preset and not cancel.is_set():
        # Decided before the record is saved, so the record says what was decided and why.
        choice = preset_choice(result, args.write_even_if_not_better)
        result.extra["preset"] = {"name": preset_name(setup, args), **choice.to_dict()}
    record = save_run("tune", result.to_dict(), preset=setup.base, notes=setup.study_name)
    if choice is not None:
        name = preset_name(setup, args)
        written = choice.write and _write_preset(setup, result, name, record.id, choice.why)
        line = preset_line(name, choice, written)
        if written:
            print(f"switch to it in the dashboard (presets panel; an open dashboard shows it within seconds) or: "
                  f"ernie-tui --preset {name}", file=sys.stderr)
    print(answer_text(result, line))
    print(f"saved run {record.id}", file=sys.stderr)
    return 130 if cancel.is_set() else 0
