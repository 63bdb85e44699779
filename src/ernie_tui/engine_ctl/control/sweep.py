"""Preset sweep: the comparison table the source articles measured by hand.

For each preset: preflight (a preset that fails it is recorded with its
problem and never launched), start, wait ready, burst, stop, wait until the
engine is gone and memory is back to its baseline, then the next one. With
repeat R the presets run in rotated order R times (so no preset always goes
first onto a cold cache), and each column is reported as the median with the
min-max spread; a difference smaller than the spread is marked as noise.

With a capacity spec (run_sweep(..., capacity=CapacitySweep)) each preset
gets a capacity search under an SLO instead of a burst, and presets are
ranked by goodput at the SLO (output tok/s of the requests meeting it, at the
highest concurrency that passes) instead of raw output tok/s.

With SweepOptions.gpus_per_trial set, trials run at the same time on
disjoint GPU sets (trial_schedule.py decides which): each trial's server gets
its own CUDA_VISIBLE_DEVICES, a port no other running trial holds, and its
own log; its peak memory and its wait for memory to settle count only its
own GPUs. Each trial's load (burst or capacity search) runs in a child
process of its own (trial_load.py), so neighbouring load generators share
no GIL; the trial's thread supervises it. The runs are folded exactly as a
sequential sweep's.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ernie_tui import paths
from ernie_tui.engine_ctl.control.paired_rows import PAIRED_TABLE_NOTE, mark_paired
from ernie_tui.engine_ctl.control.resources import EngineMemory, ResourceSampler, used_on
from ernie_tui.engine_ctl.control.server import EngineServer, ServerState
from ernie_tui.engine_ctl.control.trial_load import LoadJob, LoadProcess, PeakMemory, run_load
from ernie_tui.engine_ctl.control.trial_schedule import Trial, TrialScheduler, detect_gpu_ids
from ernie_tui.engine_ctl.launch import next_free_port, port_is_free, run_preflight
from ernie_tui.engine_ctl.load import CEILING_STOPS, BurstConfig, CapacityResult, TrafficProfile, save_run
from ernie_tui.engine_ctl.logs import EngineReport
from ernie_tui.presets.model import LaunchSpec, Preset

log = logging.getLogger(__name__)

# Columns that are measured per run and aggregated across repeats.
MEASURED = ("ready_s", "output_tps", "total_tps", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms",
            "peak_memory_gib", "kv_usage_peak_pct", "capacity_concurrency", "goodput_rps", "goodput_output_tps",
            "ttft_p99_ms", "itl_p99_ms", "capacity_rate")


@dataclass
class SweepRun:
    """One preset measured once."""

    preset: str
    repeat: int
    status: str  # "ok", "failed: KIND", "skipped: KIND" (preflight), "cancelled"
    message: str = ""
    key_args: str = ""
    ready_s: float | None = None
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    output_tps: float | None = None
    total_tps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    itl_p50_ms: float | None = None
    peak_memory_gib: float | None = None
    memory_source: str | None = None
    kv_usage_peak_pct: float | None = None
    errors: int = 0
    requests: int = 0
    overhead_s: float | None = None  # our own time: preflight, bookkeeping, baseline wait
    stop_s: float | None = None
    burst_s: float | None = None
    vllm_version: str | None = None
    platform: str | None = None
    # Capacity mode: the search's answer (0 when no level met the SLO), and
    # the figures at that concurrency.
    mode: str = "burst"  # burst | capacity
    capacity_concurrency: float | None = None
    capacity_rate: float | None = None  # open-loop searches (--rate): req/s
    goodput_rps: float | None = None
    goodput_output_tps: float | None = None
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    capacity_stop: str | None = None
    levels: int | None = None
    # The search's server moved its speed between two looks at one load, by
    # this many % (CapacityResult.speed_moved); None: it held still, or burst.
    speed_moved_pct: float | None = None
    # Parallel sweeps: the GPU set and port the trial had, and when its
    # server existed (wall clock, from launch to stopped), to show which
    # trials ran side by side.
    gpus: str | None = None
    port: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # The process that generated the load: this one in a sequential sweep,
    # the trial's own child process in a parallel one (trial_load.py).
    load_pid: int | None = None
    # The trial's own run record (its burst or capacity search, with every
    # level): what `ernie-tui report` draws a sweep's curves from.
    record_id: str | None = None
    # --ray: the node the trial ran on, and whether it ran again there after
    # the node it first had was lost mid-trial (ray_trials.py).
    node: str | None = None
    retried_after_node_loss: bool = False


@dataclass
class Aggregate:
    median: float | None
    low: float | None
    high: float | None

    @property
    def spread(self) -> float:
        if self.low is None or self.high is None:
            return 0.0
        return self.high - self.low


@dataclass
class SweepRow:
    """One preset, all repeats folded together: what the table shows."""

    preset: str
    key_args: str
    status: str
    message: str
    runs: list[SweepRun] = field(default_factory=list)
    stats: dict[str, Aggregate] = field(default_factory=dict)
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    vs_best: str = ""  # the score against the best preset, "within noise", or "not measured (why)"
    rank: int | None = None  # by the score's median, 1 = best (a paired sweep: by its pairs beyond noise)
    paired: bool = False  # rank and vs best come from a paired sweep's duels (paired_rows)


@dataclass
class SweepPlan:
    presets: list[Preset]
    repeat: int = 1

    def order(self) -> list[tuple[int, Preset]]:
        """(repeat index, preset) in rotated order: round r starts at preset r."""
        n = len(self.presets)
        out = []
        for r in range(self.repeat):
            for i in range(n):
                out.append((r, self.presets[(i + r) % n]))
        return out


Progress = Callable[[dict[str, Any]], None]


def aggregate(values: list[float | None]) -> Aggregate:
    vals = [v for v in values if v is not None]
    if not vals:
        return Aggregate(None, None, None)
    return Aggregate(statistics.median(vals), min(vals), max(vals))


def score_column(runs: list[SweepRun]) -> str:
    """What presets are ranked by: goodput at the SLO in capacity mode, else output tok/s."""
    return "goodput_output_tps" if any(r.mode == "capacity" for r in runs) else "output_tps"


def fold(runs: list[SweepRun], preset_order: list[str], score: str | None = None,
         paired: dict[str, Any] | None = None) -> list[SweepRow]:
    """One row per preset. With `paired` (a paired sweep's to_dict()), rank
    and vs best come from its duels, not from the one search per preset."""
    score = score or score_column(runs)
    rows = []
    for name in preset_order:
        mine = [r for r in runs if r.preset == name]
        if not mine:
            continue
        ok = [r for r in mine if r.status == "ok"]
        first = (ok or mine)[0]
        status = "ok" if ok and len(ok) == len(mine) else (
            f"ok {len(ok)}/{len(mine)}" if ok else first.status)
        row = SweepRow(preset=name, key_args=first.key_args, status=status,
                       message="" if ok else first.message, runs=mine)
        row.stats = {col: aggregate([getattr(r, col) for r in ok]) for col in MEASURED}
        for col in ("weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency"):
            setattr(row, col, getattr(first, col))
        rows.append(row)
    if paired and not paired.get("refused"):
        mark_paired(rows, paired)
    else:
        _mark_noise(rows, score)
    for row in rows:
        if not measured(row):
            # Compared with nothing: never "within noise" (a paired sweep's
            # verdicts say that of any preset outside a pair beyond noise).
            row.rank, row.vs_best = None, not_measured_text(row)
    return rows


def measured(row: SweepRow) -> bool:
    """Some run of the row finished and was measured."""
    return any(r.status == "ok" for r in row.runs)


def not_measured_why(row: SweepRow) -> str:
    """Why a row has no measurement: the first run's failure kind
    ("port_in_use", "failed: startup_oom", "cancelled"), or where preflight
    had no kind for it ("other"), its message."""
    why = row.status.removeprefix("skipped: ")
    if why in ("other", "preflight", "") and row.message:
        why = row.message.removeprefix("preflight: ")
    return why or "no run"


def not_measured_text(row: SweepRow) -> str:
    """The vs best cell: 'not measured (port_in_use)'; a reason too long for
    a cell is left to the note under the table, which holds every message."""
    why = not_measured_why(row)
    return f"not measured ({why if len(why) <= 40 else 'see the note below'})"


def _mark_noise(rows: list[SweepRow], score: str = "output_tps") -> None:
    scored = [r for r in rows if r.stats.get(score) and r.stats[score].median is not None]
    if not scored:
        return
    ranked = sorted(scored, key=lambda r: r.stats[score].median, reverse=True)
    for i, r in enumerate(ranked, 1):
        r.rank = i
    best = ranked[0]
    b = best.stats[score]
    for r in scored:
        s = r.stats[score]
        if r is best:
            r.vs_best = "best"
            continue
        diff = s.median - b.median
        # Repeats give a spread; a gap inside either preset's spread is noise.
        if abs(diff) <= max(s.spread, b.spread):
            r.vs_best = "within noise"
        elif b.median:
            r.vs_best = f"{100 * diff / b.median:+.1f}%"
        else:
            r.vs_best = "–"


# -- export ------------------------------------------------------------------

COLUMNS = [
    ("preset", "preset"), ("key_args", "key args"), ("status", "status"),
    ("ready_s", "ready s"), ("weights_gib", "weights GiB"), ("kv_cache_gib", "KV GiB"),
    ("kv_cache_tokens", "KV tokens"), ("max_concurrency", "max conc."),
    ("output_tps", "output tok/s"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "TTFT p90 ms"),
    ("itl_p50_ms", "ITL p50 ms"), ("peak_memory_gib", "peak mem GiB"),
    ("kv_usage_peak_pct", "KV peak %"), ("vs_best", "vs best"),
]

# Capacity mode: the figures at each preset's capacity under the SLO.
CAPACITY_COLUMNS = [
    ("preset", "preset"), ("key_args", "key args"), ("status", "status"), ("ready_s", "ready s"),
    ("kv_cache_tokens", "KV tokens"), ("max_concurrency", "max conc."),
    ("capacity_concurrency", "capacity (conc.)"), ("goodput_rps", "goodput req/s"),
    ("goodput_output_tps", "goodput tok/s"), ("ttft_p99_ms", "TTFT p99 ms"), ("itl_p99_ms", "ITL p99 ms"),
    ("kv_usage_peak_pct", "KV peak %"), ("rank", "rank"), ("vs_best", "vs best"),
]


# Open-loop capacity (--rate): the request rate in place of the concurrency.
RATE_CAPACITY_COLUMNS = [("capacity_rate", "capacity (req/s)") if c == "capacity_concurrency" else (c, h)
                         for c, h in CAPACITY_COLUMNS]


def columns_for(rows: list[SweepRow]) -> list[tuple[str, str]]:
    capacity = any(x.mode == "capacity" for r in rows for x in r.runs)
    if capacity and any(x.capacity_rate is not None for r in rows for x in r.runs):
        return RATE_CAPACITY_COLUMNS
    return CAPACITY_COLUMNS if capacity else COLUMNS


def _fmt(value: Any, col: str) -> str:
    if value is None:
        return "–"
    if col == "kv_cache_tokens":
        return f"{int(value):,}"
    if col == "max_concurrency":
        return f"{value:.2f}x"
    if col in ("capacity_concurrency", "capacity_rate"):
        return f"{value:g}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return str(value)


def at_ceiling(row: SweepRow) -> bool:
    """Some run of the row stopped at the search's highest load allowed with
    every level passing: its capacity is a lower bound, not a capacity."""
    return any(r.status == "ok" and r.capacity_stop in CEILING_STOPS for r in row.runs)


def cell(row: SweepRow, col: str) -> str:
    if col in MEASURED:
        agg = row.stats.get(col)
        if agg is None or agg.median is None:
            return "–"
        text = _fmt(agg.median, col)
        if col in ("capacity_concurrency", "capacity_rate") and at_ceiling(row):
            text = "≥ " + text
        if len([r for r in row.runs if r.status == "ok"]) > 1:
            text += f" ({_fmt(agg.low, col)}–{_fmt(agg.high, col)})"
        return text
    if col == "status" and row.message and row.status != "ok":
        return f"{row.status}"
    return _fmt(getattr(row, col), col)


def speed_moved_note(row: SweepRow) -> str | None:
    """What a row's searches saw of their server's speed moving (the
    largest move), or None: for the Markdown table's notes and the
    dashboard's sweep screen alike."""
    moved = [x.speed_moved_pct for x in row.runs if x.status == "ok" and x.speed_moved_pct is not None]
    if not moved:
        return None
    ok = len([x for x in row.runs if x.status == "ok"])
    most = max(moved, key=abs)
    return (f"the server's speed moved during {len(moved)} of its {ok} searches (up to {most:+.0f} % between two "
            "looks at one load): each answer is that server's in its own minutes; rank it against others only "
            "where repeats (--repeat) leave a gap wider than their spread")


def to_markdown(rows: list[SweepRow], title: str | None = None) -> str:
    columns = columns_for(rows)
    lines = []
    if title:
        lines += [title, ""]
    lines.append("| " + " | ".join(h for _, h in columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        lines.append("| " + " | ".join(cell(row, c).replace("|", "\\|") for c, _ in columns) + " |")
    notes = [f"- **{r.preset}**: {r.message}" for r in rows if r.status != "ok" and r.message]
    notes += [f"- **{r.preset}**: ≥: a search reached its highest load allowed (--max-concurrency or --max-rate) "
              "with every level passing, so that capacity is a lower bound; raise the ceiling to find it."
              for r in rows if at_ceiling(r)]
    notes += [f"- **{r.preset}**: {moved}." for r in rows if (moved := speed_moved_note(r)) is not None]
    if not any(measured(r) for r in rows):
        notes.append(f"- {NOTHING_MEASURED}.")
    elif any(r.paired for r in rows):
        notes.append(f"- {PAIRED_TABLE_NOTE[0].upper()}{PAIRED_TABLE_NOTE[1:]}.")
    elif sum(measured(r) for r in rows) > 1 and all(
            len([x for x in r.runs if x.status == "ok"]) <= 1 for r in rows):
        # (one preset measured is compared with nothing: no 'vs best' to hedge)
        notes.append("- One run per preset: no spread was measured, so 'vs best' carries no noise "
                     "estimate; `--repeat 3` gives medians with min–max ranges.")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


NOTHING_MEASURED = "Nothing was measured: no preset got a run through (each row says why), so nothing was compared"


def to_csv(rows: list[SweepRow]) -> str:
    columns = columns_for(rows)
    buf = io.StringIO()
    w = csv.writer(buf)
    header = []
    for col, _ in columns:
        if col in MEASURED:
            header += [col, f"{col}_min", f"{col}_max"]
        else:
            header.append(col)
    w.writerow([*header, "message"])
    for row in rows:
        out = []
        for col, _ in columns:
            if col in MEASURED:
                a = row.stats.get(col) or Aggregate(None, None, None)
                out += [a.median, a.low, a.high]
            else:
                out.append(getattr(row, col))
        w.writerow([("" if v is None else v) for v in out] + [row.message])
    return buf.getvalue()


def to_json(rows: list[SweepRow], meta: dict[str, Any] | None = None, paired: Any = None) -> str:
    def row_dict(r: SweepRow) -> dict[str, Any]:
        d = {k: v for k, v in asdict(r).items() if k not in ("runs", "stats")}
        d["stats"] = {k: asdict(v) for k, v in r.stats.items()}
        d["runs"] = [asdict(x) for x in r.runs]
        return d

    out: dict[str, Any] = {"meta": meta or {}, "rows": [row_dict(r) for r in rows]}
    if paired is not None:
        out["paired"] = paired.to_dict()
    return json.dumps(out, indent=2)


def export_sweep(rows: list[SweepRow], path: str | Path, meta: dict[str, Any] | None = None,
                 paired: Any = None) -> None:
    """The table in FILE.md, .csv or .json. With `paired` (a paired sweep's
    PairedResult), its verdicts too: under the table in markdown, under
    "paired" in JSON, and as FILE-pairs.csv beside a CSV (one row per pair)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".md":
        title = None
        if meta:
            title = "\n".join(f"- {k}: {v}" for k, v in meta.items())
        text = to_markdown(rows, title)
        if paired is not None:
            text += "\n" + "\n".join(paired.lines()) + "\n"
    elif suffix == ".csv":
        text = to_csv(rows)
        if paired is not None:
            _write_atomic(p.with_name(f"{p.stem}-pairs.csv"), paired.pairs_csv())
    elif suffix == ".json":
        text = to_json(rows, meta, paired)
    else:
        raise ValueError(f"--out must end in .csv, .json or .md, got {p.name}")
    _write_atomic(p, text)


def _write_atomic(p: Path, text: str) -> None:
    p = paths.out_file(p)  # its folder must be there (OutPathError, a ValueError)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(p)


# -- running -------------------------------------------------------------------

@dataclass
class SweepOptions:
    model: str | None = None  # model dir for presets that name none
    ready_timeout_s: float = 600.0
    baseline_timeout_s: float = 60.0
    # After a stop, memory counts as back to baseline within this much.
    baseline_slack_bytes: int = 512 << 20
    log_dir: Path | None = None
    save_records: bool = True
    # Parallel trials: None runs presets one after another; an int N gives
    # each trial N GPUs, "auto" each trial the GPUs its preset needs
    # (tp x pp x dp-local). gpu_ids: the GPUs to spread over (None: this
    # process's CUDA_VISIBLE_DEVICES, else every GPU NVML sees).
    gpus_per_trial: int | str | None = None
    gpu_ids: list[str] | None = None
    # --ray: a connected ray_trials.RayTrials; each trial then runs on a node
    # of the Ray cluster instead of here.
    ray: Any = None


@dataclass
class CapacitySweep:
    """A capacity search per preset instead of a burst (see capacity.py)."""

    slo: list  # slo.Objective
    search: Any = None  # capacity.SearchConfig
    rules: Any = None  # capacity.LevelRules
    settings: Any = None  # capacity_run.RequestSettings
    workload_items: list | None = None  # workload.WorkItem; None: built prompts (burst_config)
    # The paired sweep only: presets whose search starts at a load an earlier
    # run found (--knees-from; paired_sweep.search_around).
    knees: dict[str, float] | None = None


def sweep_meta(names: list[str], repeat: int, burst_config: BurstConfig | None, runs: list[SweepRun], *,
               capacity: CapacitySweep | None = None, workload: str | None = None,
               seconds: float | None = None, parallel: str | None = None) -> dict[str, Any]:
    """What the exports and the sweep's run record say about how it was
    measured: the date, the presets, the burst (or the capacity search), the
    repeats, the time it took (when given), how trials shared the GPUs (when
    side by side) and the vLLM builds that served."""
    c = burst_config
    if capacity is not None:
        prompts = f"workload {workload}" if workload else f"prompts {c.min_tokens}-{c.max_tokens_in} tokens"
        how = {"capacity": f"SLO {' '.join(str(o) for o in capacity.slo)}, {prompts}, max_tokens {c.max_tokens}, "
                           "ranked by goodput tok/s at the SLO"}
    else:
        how = {"burst": f"N={c.n}, C={c.concurrency}, prompts {c.min_tokens}-{c.max_tokens_in} tokens, "
                        f"max_tokens {c.max_tokens}, ignore_eos"}
    meta: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "presets": " ".join(names), **how, "repeat": repeat}
    if c is not None and c.traffic:  # --traffic: its lengths replace the ranges above
        meta["traffic"] = f"{TrafficProfile.from_dict(c.traffic).label()}, outputs {c.traffic_outputs}"
    if seconds is not None:
        meta["seconds"] = round(seconds, 1)
    if parallel is not None:
        meta["parallel"] = parallel
    meta["vllm"] = ", ".join(sorted({f"{r.vllm_version} ({r.platform})" for r in runs if r.vllm_version})) or "-"
    return meta


def _gpu_indices(gpus: tuple[str, ...]) -> set[int] | None:
    """NVML indices of a trial's GPU ids; None when they are UUIDs (then
    memory figures cover every visible GPU, as in a sequential sweep)."""
    return {int(g) for g in gpus} if all(g.isdigit() for g in gpus) else None


@dataclass(frozen=True)
class _TrialEnv:
    """What a parallel trial gets: its GPUs and port, and how to wait for
    its GPUs' memory to settle after its server stopped."""

    gpus: tuple[str, ...]
    port: int
    settle: Callable[[], None]


def _emit(progress: Progress | None, **event: Any) -> None:
    if progress is not None:
        try:
            progress(event)
        except Exception:  # noqa: BLE001  a display callback must not end the sweep; logged, not lost
            log.exception("sweep progress callback failed")


def run_sweep(plan: SweepPlan, burst_config: BurstConfig | None = None, options: SweepOptions | None = None,
              progress: Progress | None = None, cancel: threading.Event | None = None,
              capacity: CapacitySweep | None = None) -> list[SweepRun]:
    """Measure every preset of the plan; returns the runs done (all of them
    unless cancelled). Never leaves a server running, even on errors. With
    `capacity`, each preset gets a capacity search (phase "capacity", with
    the search's own events under "capacity_event") instead of a burst."""
    options = options or SweepOptions()
    burst_config = burst_config or BurstConfig()
    cancel = cancel or threading.Event()
    log_dir = options.log_dir or Path(__import__("tempfile").mkdtemp(prefix="ernie-sweep-"))
    paths.private_dir(log_dir)  # each run's llm.log in it holds the prompts
    if options.ray is not None:
        return options.ray.run_sweep(plan, burst_config, replace(options, log_dir=log_dir), progress, cancel,
                                     capacity)
    if options.gpus_per_trial is not None:
        return _run_parallel(plan, burst_config, options, log_dir, progress, cancel, capacity)
    sampler = ResourceSampler()
    baseline = sampler.sample().shown_bytes if sampler.nvml else None
    order = plan.order()
    runs: list[SweepRun] = []
    durations: list[float] = []
    try:
        for index, (repeat, preset) in enumerate(order):
            if cancel.is_set():
                break
            remaining = len(order) - index
            eta = statistics.mean(durations) * remaining if durations else None
            _emit(progress, preset=preset.name, repeat=repeat, index=index, total=len(order),
                  phase="preflight", eta_s=eta)
            t0 = time.monotonic()
            run = _run_one(preset, repeat, burst_config, options, log_dir, sampler, baseline,
                           progress, cancel, index, len(order), capacity)
            runs.append(run)
            durations.append(time.monotonic() - t0)
            _emit(progress, preset=preset.name, repeat=repeat, index=index, total=len(order), phase="done",
                  status=run.status, run=run)
    finally:
        sampler.close()
    return runs


def _run_one(preset: Preset, repeat: int, burst_config: BurstConfig, options: SweepOptions, log_dir: Path,
             sampler: ResourceSampler,
             baseline: int | None, progress: Progress | None, cancel: threading.Event,
             index: int, total: int, capacity: CapacitySweep | None = None,
             trial: _TrialEnv | None = None) -> SweepRun:
    """One preset's row: preflight, start, wait ready, its burst (or
    capacity search), then stop and wait for memory to settle."""
    one = _OneRun(preset, repeat, burst_config, options, log_dir, sampler, baseline, progress, cancel, capacity,
                  trial)
    run = one.run
    if preset.get("headless") is True:
        run.status = "skipped: headless"
        run.message = ("sweep: a headless preset runs engines for a head node and serves no API to measure; "
                       "sweep the head preset instead")
        return run
    if trial is not None:
        one.take_trial_env(trial)
    model = one.preset.resolve_model(options.model)
    if not one.preflight(model):
        return run
    spec = one.preset.launch_spec(model)
    server = EngineServer(spec, preset_name=one.preset.name, log_path=log_dir / f"{one.preset.name}-r{repeat}.log")
    one.ev = dict(preset=one.preset.name, repeat=repeat, index=index, total=total)
    if trial is not None:
        one.ev.update(gpus=run.gpus, port=run.port)
    t_launch = time.monotonic()
    try:
        report = one.start(server, t_launch)
        if report is None:
            return run
        if capacity is not None:
            one.search_capacity(capacity, spec, report)
        else:
            one.burst(server, spec, report)
        return run
    finally:
        one.stop(server)


@dataclass
class _OneRun:
    """One preset measured once (_run_one): its row, its events' fields, its
    load process (parallel trials) and the times its row reports."""

    preset: Preset
    repeat: int
    burst_config: BurstConfig
    options: SweepOptions
    log_dir: Path
    sampler: ResourceSampler
    baseline: int | None
    progress: Progress | None
    cancel: threading.Event
    capacity: CapacitySweep | None
    trial: _TrialEnv | None
    t_begin: float = field(init=False)
    run: SweepRun = field(init=False)
    ev: dict[str, Any] = field(init=False, default_factory=dict)
    loader: LoadProcess | None = field(init=False, default=None)
    ready_wait: float = field(init=False, default=0.0)
    burst_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.t_begin = time.monotonic()
        self.run = SweepRun(preset=self.preset.name, repeat=self.repeat, status="ok", key_args=self.preset.key_args(),
                            mode="capacity" if self.capacity is not None else "burst")

    def take_trial_env(self, trial: _TrialEnv) -> None:
        """The trial's own GPUs and port; preflight then judges the preset
        against exactly the GPUs it will see."""
        from dataclasses import replace

        self.preset = replace(self.preset, env={**self.preset.env, "CUDA_VISIBLE_DEVICES": ",".join(trial.gpus)},
                              port=trial.port)
        self.run.gpus, self.run.port = ",".join(trial.gpus), trial.port

    def preflight(self, model: Any) -> bool:
        """Preflight; a preset that fails it is recorded with its problem and never launched."""
        run = self.run
        result = run_preflight(self.preset, model)
        if not result.ok:
            problem = result.first_error()
            run.status = f"skipped: {problem.kind.value}"
            run.message = f"preflight: {problem.message}"
            run.overhead_s = time.monotonic() - self.t_begin
            return False
        if result.estimate is not None:
            run.weights_gib = result.estimate.weights_bytes / 2**30
        return True

    def start(self, server: EngineServer, t_launch: float) -> EngineReport | None:
        """Start the server and wait until it is ready; None (the row says why) when it is not."""
        run, options, cancel = self.run, self.options, self.cancel
        _emit(self.progress, **self.ev, phase="starting")
        run.started_at = time.time()
        if self.trial is not None:
            # The trial's load process, spawned now so its start-up overlaps the server's.
            self.loader = LoadProcess(f"ernie-tui load {self.preset.name} r{self.repeat}").start()
        server.start()
        deadline = time.monotonic() + options.ready_timeout_s
        st = server.status
        while time.monotonic() < deadline and not cancel.is_set():
            st = server.wait_ready(min(1.0, max(0.0, deadline - time.monotonic())))
            if st.state != ServerState.STARTING:
                break
            if st.phase:
                _emit(self.progress, **self.ev, phase=f"starting: {st.phase}")
        self.ready_wait = time.monotonic() - t_launch
        report = server.report
        if cancel.is_set():
            run.status, run.message = "cancelled", "cancelled while starting"
            return None
        if st.state != ServerState.READY:
            err = st.error
            run.status = f"failed: {err.kind.value}" if err else "failed: timeout"
            run.message = err.message if err else f"not ready after {options.ready_timeout_s:.0f} s"
            return None
        run.ready_s = (st.ready_at - st.started_at) if st.ready_at and st.started_at else self.ready_wait
        run.weights_gib = report.weights_gib if report.weights_gib is not None else run.weights_gib
        run.kv_cache_gib = report.kv_cache_gib
        run.vllm_version, run.platform = report.vllm_version, report.platform
        run.kv_cache_tokens = report.kv_cache_tokens
        run.max_concurrency = report.max_concurrency
        return report

    def search_capacity(self, capacity: CapacitySweep, spec: LaunchSpec, report: EngineReport) -> None:
        t_search = time.monotonic()
        try:
            _measure_capacity(self.run, capacity, self.burst_config, spec, self.preset, report, self.options,
                              self.progress, self.ev, self.cancel, self.log_dir, self.loader)
        finally:
            self.burst_s = time.monotonic() - t_search
            self.run.burst_s = self.burst_s

    def burst(self, server: EngineServer, spec: LaunchSpec, report: EngineReport) -> None:
        """The burst; fills the run's burst columns and saves its record."""
        run, config, ev, progress = self.run, self.burst_config, self.ev, self.progress
        _emit(progress, **ev, phase="burst", burst_done=0, burst_total=config.n)
        # The burst's peak memory is this engine's: a fresh sampler bound to its pids.
        engine_sampler = ResourceSampler(server.engine_pids, use_nvml=self.sampler.nvml)
        # In a parallel sweep, only the trial's own GPUs: not the ones a neighbour fills.
        memory = EngineMemory(sampler=engine_sampler,
                              gpus=_gpu_indices(self.trial.gpus) if self.trial is not None else None)
        job = _load_job("burst", spec, self.preset, config, self.log_dir, self.repeat)
        t_burst = time.monotonic()
        try:
            burst = _load(run, job, lambda d, n: _emit(progress, **ev, phase="burst", burst_done=d, burst_total=n),
                          self.cancel, ev, self.loader, memory=memory, sample_interval_s=config.sample_interval_s)
        finally:
            engine_sampler.close()
        self.burst_s = run.burst_s = time.monotonic() - t_burst
        if burst is None:  # the load's child process died or raised: its row says how
            return
        _fill_burst_columns(run, burst, self.cancel)
        if self.options.save_records:
            record = save_run("burst", burst.to_dict(with_requests=False), preset=self.preset,
                              engine_report=report.to_dict(), url=spec.url, model=spec.served_model_name,
                              notes=f"sweep repeat {self.repeat}")
            run.record_id = record.id

    def stop(self, server: EngineServer) -> None:
        """Stop the server (never left running), wait for memory to settle, and time the row."""
        run = self.run
        if self.loader is not None:
            self.loader.close()  # gone already after a load; an idle one (start failed, cancelled) told to exit
        _emit(self.progress, **self.ev, phase="stopping")
        t_stop = time.monotonic()
        if server.status.running or server.status.state == ServerState.CRASHED:
            server.stop()
        stop_s = time.monotonic() - t_stop
        server.close()
        if self.trial is not None:
            self.trial.settle()
        else:
            _wait_baseline(self.sampler, self.baseline, self.options)
        run.ended_at = time.time()
        run.stop_s = stop_s
        run.overhead_s = max(0.0, (time.monotonic() - self.t_begin) - self.ready_wait - self.burst_s - stop_s)


def _fill_burst_columns(run: SweepRun, burst: Any, cancel: threading.Event) -> None:
    """A finished burst's figures in the run's columns, and its status."""
    run.requests = burst.total
    run.errors = burst.failed
    run.output_tps = burst.output_tps
    run.total_tps = burst.total_tps
    run.ttft_p50_ms = _ms(burst.ttft.get("p50"))
    run.ttft_p90_ms = _ms(burst.ttft.get("p90"))
    run.itl_p50_ms = _ms(burst.itl.get("p50"))
    run.peak_memory_gib = burst.peak_memory_bytes / 2**30 if burst.peak_memory_bytes else None
    run.memory_source = burst.memory_source
    run.kv_usage_peak_pct = burst.kv_cache_usage_peak_pct
    if burst.cancelled or cancel.is_set():
        run.status, run.message = "cancelled", "cancelled during the burst"
    elif burst.completed == 0:
        run.status = "failed: burst"
        run.message = "; ".join(burst.errors.get("first", [])[:1]) or "no request succeeded"


def _measure_capacity(run: SweepRun, capacity: CapacitySweep, burst_config: BurstConfig, spec: LaunchSpec,
                      preset: Preset, report: EngineReport,
                      options: SweepOptions, progress: Progress | None, ev: dict[str, Any],
                      cancel: threading.Event, log_dir: Path, loader: LoadProcess | None = None) -> None:
    """One preset's capacity search; fills the run's capacity columns."""
    run.mode = "capacity"
    job = _load_job("capacity", spec, preset, burst_config, log_dir, run.repeat, capacity)
    _emit(progress, **ev, phase="capacity")
    result = _load(run, job, lambda e: _emit(progress, **ev, phase="capacity", capacity_event=e), cancel, ev,
                   loader)
    if result is None:  # the search's child process died or raised: its row says how
        return
    fill_capacity_columns(run, result)
    if result.stop_reason == "cancelled" or cancel.is_set():
        run.status, run.message = "cancelled", "cancelled during the capacity search"
    elif result.stop_reason == "server_down":
        run.status, run.message = "failed: capacity", result.stop_message
    if options.save_records:
        record = save_run("capacity", result.to_dict(), preset=preset, engine_report=report.to_dict(),
                          url=spec.url, model=spec.served_model_name, notes=f"sweep repeat {run.repeat}")
        run.record_id = record.id


def fill_capacity_columns(run: SweepRun, result: CapacityResult) -> None:
    """A finished search's answer in the run's capacity columns: the figures
    of the level the capacity reports (its confirmation, when it had one)."""
    run.capacity_stop = result.stop_reason
    moved = result.speed_moved
    run.speed_moved_pct = round(moved["change"] * 100, 1) if moved else None
    run.levels = len(result.levels)
    run.requests = sum(lv.requests for lv in result.levels)
    run.errors = sum(lv.failed for lv in result.levels)
    at = result.capacity_level  # the confirmation's figures, as the search reports them
    if at is not None:
        if at.rate is not None:
            run.capacity_rate = at.rate
        else:
            run.capacity_concurrency = float(at.concurrency or 0)
        run.goodput_rps, run.goodput_output_tps = at.goodput_rps, at.goodput_output_tps
        run.output_tps = at.output_tps
        run.ttft_p50_ms, run.ttft_p99_ms = at.ttft_p50_ms, at.ttft_p99_ms
        run.itl_p50_ms, run.itl_p99_ms = at.itl_p50_ms, at.itl_p99_ms
        run.kv_usage_peak_pct = at.kv_cache_peak_pct
    elif result.stop_reason == "first_level_failed":
        # A real answer: not even the lowest load meets the SLO.
        if result.mode == "rate":
            run.capacity_rate = 0.0
        else:
            run.capacity_concurrency = 0.0
        run.goodput_rps, run.goodput_output_tps = 0.0, 0.0


def _load_job(kind: str, spec: LaunchSpec, preset: Preset, burst_config: BurstConfig, log_dir: Path, repeat: int,
              capacity: CapacitySweep | None = None) -> LoadJob:
    """The trial's load as a picklable job (trial_load.py runs it here or in a child)."""
    job = LoadJob(kind, spec.url, spec.served_model_name, spec.model, preset.api_key(), burst_config,
                  label=f"ernie-tui load {preset.name} r{repeat}",
                  log_path=log_dir / f"{preset.name}-r{repeat}.load.log")
    if capacity is not None:
        job.slo, job.search, job.rules, job.settings = capacity.slo, capacity.search, capacity.rules, capacity.settings
        job.workload_items = capacity.workload_items
    return job


def _load(run: SweepRun, job: LoadJob, on_progress: Callable[..., None], cancel: threading.Event, ev: dict[str, Any],
          loader: LoadProcess | None = None, *, memory: EngineMemory | None = None,
          sample_interval_s: float = 0.5) -> Any:
    """Run the trial's load: in this process for a sequential sweep (the
    burst samples `memory` itself), in `loader` (a parallel trial's
    trial_load.LoadProcess) for a parallel one, so neighbouring trials'
    load generators share no GIL (this thread then samples `memory` and
    puts the peak on the result). Records the load's pid on the run (and on
    the trial's events from then on). None when the child died or raised:
    the run then says so, as 'failed: error' (or 'cancelled' when the sweep
    was)."""
    if loader is None:
        run.load_pid = os.getpid()
        return run_load(job, on_progress, cancel, memory_sampler=memory)

    def started(pid: int) -> None:
        run.load_pid = ev["load_pid"] = pid

    peak = PeakMemory(memory, sample_interval_s) if memory is not None else None
    outcome = loader.run(job, on_progress, cancel, tick=peak, on_start=started)
    if outcome.result is None:
        if cancel.is_set():
            run.status, run.message = "cancelled", f"cancelled during the {job.kind}: {outcome.error}"
        else:
            run.status, run.message = "failed: error", outcome.error or "the load process sent no result"
        return None
    if peak is not None and job.kind == "burst":
        outcome.result.peak_memory_bytes = peak.peak
        outcome.result.memory_source = memory.source
    return outcome.result


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _wait_baseline(sampler: ResourceSampler, baseline: int | None, options: SweepOptions) -> None:
    """GPU memory back to where it was before the sweep (NVML only: without
    it the engine's processes are already gone, which stop() guarantees)."""
    if baseline is None or not sampler.nvml:
        return
    deadline = time.monotonic() + options.baseline_timeout_s
    while time.monotonic() < deadline:
        now = sampler.sample().shown_bytes
        if now is None or now <= baseline + options.baseline_slack_bytes:
            return
        time.sleep(0.25)


# -- parallel trials -----------------------------------------------------------------

def _trial_port(preset: Preset, taken: set[int]) -> int:
    """The preset's own port when it is free and no running trial holds it,
    else the next free one after it."""
    port = preset.port
    while port in taken or not port_is_free(preset.host, port)[0]:
        nxt = next_free_port(preset.host, port)
        if nxt is None:
            raise RuntimeError(f"no free port after {port} on {preset.host}")
        port = nxt
    return port


def _run_parallel(plan: SweepPlan, burst_config: BurstConfig, options: SweepOptions, log_dir: Path,
                  progress: Progress | None, cancel: threading.Event,
                  capacity: CapacitySweep | None) -> list[SweepRun]:
    """Run the plan's trials side by side on disjoint GPU sets; returns the
    runs in plan order (the same runs a sequential sweep would give)."""
    par = _ParallelSweep(plan, burst_config, options, log_dir, progress, cancel, capacity)
    par.skip_unfit()
    sampler = ResourceSampler()
    # Each GPU's memory before the sweep: a trial is over once its own GPUs
    # are back to where they were (its neighbours' GPUs are none of its business).
    start = sampler.sample() if sampler.nvml else None
    baselines = {g.index: g.used_bytes for g in start.gpus} if start is not None else {}
    try:
        par.run_trials(sampler, baselines)
    finally:
        sampler.close()
    return [par.runs[i] for i in sorted(par.runs)]


class _ParallelSweep:
    """The state of a parallel sweep (_run_parallel): its scheduler, the
    trials running (their GPUs, port and start time), the ports they hold,
    the runs done; and its steps."""

    def __init__(self, plan: SweepPlan, burst_config: BurstConfig, options: SweepOptions, log_dir: Path,
                 progress: Progress | None, cancel: threading.Event, capacity: CapacitySweep | None) -> None:
        self.burst_config, self.options, self.log_dir = burst_config, options, log_dir
        self.progress, self.cancel, self.capacity = progress, cancel, capacity
        self.gpu_ids = list(options.gpu_ids) if options.gpu_ids else detect_gpu_ids()
        per = None if options.gpus_per_trial == "auto" else int(options.gpus_per_trial)
        order = plan.order()
        self.sched = TrialScheduler([Trial(i, r, p) for i, (r, p) in enumerate(order)], self.gpu_ids, per)
        self.total = len(order)
        self.lock = threading.Lock()
        self.runs: dict[int, SweepRun] = {}
        self.ports: set[int] = set()
        self.durations: list[float] = []
        self.running: dict[Any, tuple[Any, int, float]] = {}

    def emit(self, **event: Any) -> None:
        with self.lock:  # trials report from their own threads; listeners see one at a time
            _emit(self.progress, **event)

    def skip_unfit(self) -> None:
        """Rows for the trials no GPU set can hold."""
        for t, why in self.sched.unfit():
            run = SweepRun(preset=t.preset.name, repeat=t.repeat, status="skipped: tp_exceeds_gpus",
                           message=f"sweep: {why}", key_args=t.preset.key_args(),
                           mode="capacity" if self.capacity is not None else "burst")
            self.runs[t.index] = run
            self.emit(preset=t.preset.name, repeat=t.repeat, index=t.index, total=self.total, phase="done",
                      status=run.status, run=run)

    def run_trials(self, sampler: ResourceSampler, baselines: dict[int, int]) -> None:
        """Start trials as GPU sets free up, until every one has ended (or the sweep is cancelled)."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        with ThreadPoolExecutor(max_workers=len(self.gpu_ids), thread_name_prefix="sweep-trial") as pool:
            while not self.sched.done:
                if self.cancel.is_set():
                    self.sched.drop_pending()
                for a in self.sched.start():
                    self.start_trial(pool, a, sampler, baselines)
                if not self.running:
                    break
                done, _ = wait(list(self.running), timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    self.finish_trial(fut)

    def start_trial(self, pool: Any, a: Any, sampler: ResourceSampler, baselines: dict[int, int]) -> None:
        """One trial on its GPU set and a port no running trial holds, in the pool."""
        t = a.trial
        port = _trial_port(t.preset, self.ports)
        self.ports.add(port)
        sched = self.sched
        left = len(sched.pending) + len(sched.running)
        eta = (statistics.mean(self.durations) * left / sched.max_parallel) if self.durations else None
        self.emit(preset=t.preset.name, repeat=t.repeat, index=t.index, total=self.total, phase="preflight",
                  eta_s=eta, gpus=a.cuda_visible_devices, port=port)
        env = _TrialEnv(gpus=a.gpus, port=port, settle=self.settle_for(a.gpus, sampler, baselines))
        fut = pool.submit(_run_one, t.preset, t.repeat, self.burst_config, self.options, self.log_dir, sampler,
                          None, _emit_to(self.emit), self.cancel, t.index, self.total, self.capacity, env)
        self.running[fut] = (a, port, time.monotonic())

    def finish_trial(self, fut: Any) -> None:
        """A trial ended: its GPUs and port back, its row (a surprise in it becomes a failed row)."""
        a, port, t0 = self.running.pop(fut)
        self.sched.finish(a)
        self.ports.discard(port)
        self.durations.append(time.monotonic() - t0)
        t = a.trial
        try:
            run = fut.result()
        except Exception as exc:  # noqa: BLE001  one trial's surprise must not stop its neighbours; its row says it
            run = SweepRun(preset=t.preset.name, repeat=t.repeat, status="failed: error",
                           message=f"{type(exc).__name__}: {exc}", key_args=t.preset.key_args(),
                           gpus=a.cuda_visible_devices, port=port)
        self.runs[t.index] = run
        self.emit(preset=t.preset.name, repeat=t.repeat, index=t.index, total=self.total, phase="done",
                  status=run.status, run=run, gpus=a.cuda_visible_devices)

    def settle_for(self, gpus: tuple[str, ...], sampler: ResourceSampler,
                   baselines: dict[int, int]) -> Callable[[], None]:
        """Wait until the trial's own GPUs' memory is back to its baseline."""
        indices = _gpu_indices(gpus)
        options, lock = self.options, self.lock

        def settle() -> None:
            if not sampler.nvml or indices is None:
                return
            base = sum(baselines.get(i, 0) for i in indices)
            deadline = time.monotonic() + options.baseline_timeout_s
            while time.monotonic() < deadline:
                with lock:  # one NVML reader at a time
                    now = used_on(sampler.sample(), indices)
                if now is None or now <= base + options.baseline_slack_bytes:
                    return
                time.sleep(0.25)

        return settle


def _emit_to(emit: Callable[..., None]) -> Progress:
    """A Progress callable for _run_one that goes through `emit` (locked)."""
    return lambda event: emit(**event)
