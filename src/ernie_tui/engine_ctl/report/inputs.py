"""What a report draws, read from saved run records and sweep exports.

The records are JSON written by other parts (runstore.save_run with a
BurstResult, a CapacityResult or a sweep's runs; control.sweep.to_json), and
their shape grows: every key is read with a default, a level may be keyed by
`concurrency` (closed loop) or `rate` (open loop), and keys nobody here knows
are kept in `raw` and go to the CSV. Nothing here draws.

- Curve: one burst or one capacity search (a preset's curve): its levels,
  its SLO limits, its capacity, and what it ran on.
- Comparison: presets side by side (a sweep, or several capacity searches):
  the sweep's own fold (median, min-max spread, rank, "within noise") and
  load.pareto's front, reused, not recomputed here.
- TuneReport (tune_inputs): a tune's answer and trials, with the capacity
  curves of its best, BASE and a few more trials.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ernie_tui.engine_ctl.control import SweepRow, SweepRun, fold, score_column
from ernie_tui.engine_ctl.load import RunRecord, RunStoreError, TrafficProfile, front_of_rows, list_runs, load_run
from ernie_tui.engine_ctl.report.tune_inputs import TuneReport, tune_of, wanted_curves
from ernie_tui.engine_ctl.report.values import num as _num
from ernie_tui.engine_ctl.report.values import slo_limits


class ReportError(Exception):
    """A report that cannot be made; the message is for humans."""


# A level's x: closed-loop concurrency, or open-loop request rate.
LEVEL_KEYS = ("concurrency", "rate")


def _ms_from_s(d: dict[str, Any] | None, key: str) -> float | None:
    v = _num((d or {}).get(key))
    return None if v is None else v * 1000.0


@dataclass
class Level:
    """One measured level (or a burst's single point)."""

    key: str  # "concurrency" | "rate"
    x: float
    verdict: str  # pass | fail | undecided | "" (a burst has no verdict)
    output_tps: float | None = None
    goodput_output_tps: float | None = None
    goodput_rps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    attainment: float | None = None
    attainment_low: float | None = None
    attainment_high: float | None = None
    requests: int | None = None
    stop: str = ""
    vllm: dict[str, Any] = field(default_factory=dict)  # the server's own histogram figures
    # Each objective's measured percentile, "ttft_p90" -> ms: what the SLO judged.
    slo_values: dict[str, float] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def latency(self, name: str) -> float | None:
        """`ttft_p99` and such in ms: the objective's own figure, else the level's column."""
        if name in self.slo_values:
            return self.slo_values[name]
        return getattr(self, f"{name}_ms", None)

    @property
    def label(self) -> str:
        short = "c" if self.key == "concurrency" else "r"
        return f"{short}={self.x:g}"


@dataclass
class Curve:
    """One run: a capacity search's levels, or a burst's one point."""

    name: str  # the preset, else the run id
    run_id: str
    kind: str  # capacity | burst
    timestamp: str = ""
    levels: list[Level] = field(default_factory=list)
    slo: list[str] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)  # "ttft_p99" -> ms
    capacity: Level | None = None
    stop: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # what it ran on: label -> text
    engine_args: dict[str, Any] = field(default_factory=dict)
    repeat: str = ""  # "sweep repeat 1" and such
    # What the run itself warned of (not confirmed, the server's speed moved,
    # its CPU bound it, ...): a shared figure without them claims more than it knows.
    warnings: list[str] = field(default_factory=list)

    @property
    def level_key(self) -> str:
        return self.levels[0].key if self.levels else "concurrency"


@dataclass
class Comparison:
    """Presets side by side: the sweep's rows (rank, spread, noise) and the front."""

    title: str
    rows: list[SweepRow]
    score: str
    front: set[str]
    meta: dict[str, Any] = field(default_factory=dict)
    # A paired sweep's verdicts (control's PairedResult.to_dict(): pairs,
    # ranking, drift), as its export or record holds them; None otherwise.
    paired: dict[str, Any] | None = None


@dataclass
class ReportData:
    curves: list[Curve] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    tunes: list[TuneReport] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


# -- one level / one record ------------------------------------------------------

def level_of(d: dict[str, Any]) -> Level | None:
    key = next((k for k in LEVEL_KEYS if _num(d.get(k)) is not None), None)
    if key is None:
        return None
    verdict = str(d.get("verdict") or ("pass" if d.get("passed") else "fail" if d.get("decided") else "undecided"))
    vllm = d.get("vllm") if isinstance(d.get("vllm"), dict) else {}
    return Level(
        key=key, x=float(d[key]), verdict=verdict,
        output_tps=_num(d.get("output_tps")), goodput_output_tps=_num(d.get("goodput_output_tps")),
        goodput_rps=_num(d.get("goodput_rps")),
        ttft_p50_ms=_num(d.get("ttft_p50_ms")), ttft_p99_ms=_num(d.get("ttft_p99_ms")),
        itl_p50_ms=_num(d.get("itl_p50_ms")), itl_p99_ms=_num(d.get("itl_p99_ms")),
        e2e_p99_ms=_num(d.get("e2e_p99_ms")),
        attainment=_num(d.get("attainment")), attainment_low=_num(d.get("attainment_low")),
        attainment_high=_num(d.get("attainment_high")),
        requests=int(d["requests"]) if _num(d.get("requests")) is not None else None,
        stop=str(d.get("stop") or ""), vllm=dict(vllm or {}), raw=d,
        slo_values={f"{o.get('metric')}_p{_num(o.get('percentile')):g}": float(o["value_ms"])
                    for o in d.get("objectives") or []
                    if isinstance(o, dict) and _num(o.get("value_ms")) is not None
                    and _num(o.get("percentile")) is not None},
    )


def _info(rec: RunRecord, results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what it ran on, the preset's engine arguments) from whatever the record holds."""
    er = rec.engine_report or {}
    preset = rec.preset or {}
    info: dict[str, Any] = {}

    def put(label: str, value: Any) -> None:
        if value not in (None, "", {}, []):
            info[label] = value

    put("run record", rec.id)
    put("time (UTC)", rec.timestamp)
    put("preset", preset.get("name"))
    put("model", rec.model or results.get("model") or er.get("model"))
    put("url", rec.url or results.get("url"))
    put("vLLM version", er.get("vllm_version"))
    platform = er.get("platform")
    put("platform", {"cuda": "GPU (CUDA)", "cpu": "CPU"}.get(str(platform), platform))
    for key in ("gpu", "gpus", "gpu_name", "device", "cpu"):  # when a newer record holds them
        put(key, er.get(key) if er.get(key) is not None else preset.get(key))
    put("attention backend", er.get("attention_backend"))
    put("block size", er.get("block_size"))
    put("max model len", er.get("max_model_len"))
    put("weights GiB", er.get("weights_gib"))
    put("KV cache GiB", er.get("kv_cache_gib"))
    put("KV cache tokens", er.get("kv_cache_tokens"))
    put("max concurrency (vLLM)", er.get("max_concurrency"))
    put("vLLM non-default args", er.get("non_default_args"))
    workload = results.get("workload")
    put("workload", workload)
    config = results.get("config")
    traffic = config.get("traffic") if isinstance(config, dict) else None
    put("traffic", TrafficProfile.from_dict(traffic).label() if traffic else None)  # a burst's --traffic
    put("load config", config)
    put("SLO", " ".join(str(s) for s in results.get("slo") or []))
    put("notes", rec.notes)
    args = preset.get("engine_args") if isinstance(preset.get("engine_args"), dict) else {}
    return info, dict(args or {})


def curve_of(rec: RunRecord) -> Curve:
    """A capacity or burst record as a curve."""
    res = rec.results or {}
    info, args = _info(rec, res)
    curve = Curve(name=rec.preset_name or rec.id, run_id=rec.id, kind=rec.kind, timestamp=rec.timestamp,
                  info=info, engine_args=args, repeat=rec.notes or "",
                  warnings=[str(w) for w in res.get("warnings") or [] if w])
    if rec.kind == "burst":
        cfg = res.get("config") or {}
        ttft, itl = res.get("ttft") or {}, res.get("itl") or {}
        vllm = res.get("vllm") or {}
        key = "rate" if _num(cfg.get("rate")) is not None and _num(cfg.get("concurrency")) is None else "concurrency"
        x = _num(cfg.get(key)) or 0.0
        curve.levels = [Level(
            key=key, x=x, verdict="", output_tps=_num(res.get("output_tps")),
            ttft_p50_ms=_ms_from_s(ttft, "p50"), ttft_p99_ms=_ms_from_s(ttft, "p99"),
            itl_p50_ms=_ms_from_s(itl, "p50"), itl_p99_ms=_ms_from_s(itl, "p99"),
            e2e_p99_ms=_ms_from_s(res.get("latency"), "p99"),
            requests=int(_num(res.get("total")) or 0), stop="cancelled" if res.get("cancelled") else "done",
            vllm={k: (v * 1000.0 if k.endswith("_s") and _num(v) is not None else v)
                  for k, v in vllm.items()} if isinstance(vllm, dict) else {},
            raw={k: v for k, v in res.items() if not isinstance(v, (dict, list))},
        )]
        curve.stop = "burst"
        return curve
    curve.slo = [str(s) for s in res.get("slo") or []]
    curve.limits = slo_limits(res.get("slo") or [])
    curve.levels = [lv for lv in (level_of(d) for d in res.get("levels") or [] if isinstance(d, dict))
                    if lv is not None]
    curve.stop = str(res.get("stop_reason") or "")
    cap = res.get("capacity")
    if isinstance(cap, dict):
        ckey = next((k for k in LEVEL_KEYS if _num(cap.get(k)) is not None), None)
        if ckey is not None:
            at = float(cap[ckey])
            # The last level at that load that passed: its confirmation, whose
            # figures the capacity reports (the first look was a shorter level).
            same = [lv for lv in curve.levels if lv.key == ckey and lv.x == at]
            passed = [lv for lv in same if lv.raw.get("passed")]  # (a pass at a cap reads "undecided")
            curve.capacity = passed[-1] if passed else (same[0] if same else level_of(cap))
    return curve


# -- comparisons -------------------------------------------------------------------

_RUN_FIELDS = {f.name for f in dataclasses.fields(SweepRun)}


def _sweep_run(d: dict[str, Any]) -> SweepRun | None:
    try:
        return SweepRun(**{k: v for k, v in d.items() if k in _RUN_FIELDS})
    except TypeError:  # a record missing preset/repeat/status
        return None


def sweep_runs(raw: Any) -> list[SweepRun]:
    """A record's or export's runs, those that read."""
    return [r for r in (_sweep_run(d) for d in raw or [] if isinstance(d, dict)) if r is not None]


def comparison_of(runs: list[SweepRun], meta: dict[str, Any], title: str,
                  paired: dict[str, Any] | None = None) -> Comparison | None:
    runs = [r for r in runs if r is not None]
    if not runs:
        return None
    order = list(dict.fromkeys(r.preset for r in runs))
    score = score_column(runs)
    rows = fold(runs, order, score, paired=paired if isinstance(paired, dict) else None)
    front = front_of_rows(rows) if score == "goodput_output_tps" else set()
    return Comparison(title=title, rows=rows, score=score, front=front, meta=dict(meta or {}),
                      paired=paired if isinstance(paired, dict) else None)


def _capacity_as_run(curve: Curve, repeat: int) -> SweepRun:
    """A lone capacity search as one sweep run, so several are folded and
    ranked (spread, noise) by the sweep's own code."""
    cap = curve.capacity
    run = SweepRun(preset=curve.name, repeat=repeat, status="ok", mode="capacity",
                   key_args=" ".join(f"--{k}={v}" for k, v in curve.engine_args.items()),
                   capacity_stop=curve.stop or None)
    failed = cap is None and curve.stop == "first_level_failed"  # no load met the SLO: 0
    load = cap.x if cap is not None else 0.0 if failed else None
    if curve.level_key == "rate":  # an open-loop search: its capacity is a request rate
        run.capacity_rate = load
    else:
        run.capacity_concurrency = load
    if cap is not None:
        run.goodput_rps, run.goodput_output_tps = cap.goodput_rps, cap.goodput_output_tps
        run.output_tps, run.ttft_p50_ms, run.ttft_p99_ms = cap.output_tps, cap.ttft_p50_ms, cap.ttft_p99_ms
        run.itl_p50_ms, run.itl_p99_ms = cap.itl_p50_ms, cap.itl_p99_ms
    elif failed:
        run.goodput_rps, run.goodput_output_tps = 0.0, 0.0
    return run


# -- reading references ------------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from exc


def _trial_records(sweep: RunRecord | None, runs: list[SweepRun], meta: dict[str, Any],
                   directory: Path | None) -> list[RunRecord]:
    """Each sweep trial's own record: by the id the run keeps, else (older
    sweeps) the records of its presets saved while the sweep ran."""
    out: list[RunRecord] = []
    missing = False
    for r in runs:
        if r.record_id:
            try:
                out.append(load_run(r.record_id, directory))
                continue
            except RunStoreError:
                pass
        missing = missing or r.status == "ok"
    if missing and not out and sweep is not None:
        seconds = _num(meta.get("seconds"))
        names = {r.preset for r in runs}
        start = sweep.created - (seconds or 0.0) - 5.0
        for rec in reversed(list_runs(directory=directory)):
            if rec.kind in ("capacity", "burst") and rec.preset_name in names and start <= rec.created <= sweep.created:
                out.append(rec)
    return out


def load_report_data(refs: list[str], directory: str | Path | None = None) -> ReportData:
    """The curves and comparisons of run ids, run-record files and sweep exports.
    A sweep brings its trials' curves (found in the run store beside it)."""
    if not refs:
        raise ReportError("name at least one run (an id from `ernie-tui runs list`, a run-record file, "
                          "or a sweep's JSON export)")
    reader = _ReportReader(directory)
    for ref in refs:
        p = Path(ref)
        if p.is_file() and reader.read_export(p):
            continue
        reader.read_record(ref)
    reader.compare_lone()
    return reader.data


class _ReportReader:
    """What load_report_data has read so far: the report's data, the record
    ids drawn (each once), and the lone capacity searches to compare."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = directory
        self.folder = Path(directory) if directory else None
        self.data = ReportData()
        self.seen: set[str] = set()
        self.lone: list[Curve] = []

    def add_curve(self, rec: RunRecord, alone: bool) -> Curve | None:
        """The record's curve, added; None when it was drawn already."""
        if rec.id in self.seen:
            return None
        self.seen.add(rec.id)
        curve = curve_of(rec)
        self.data.curves.append(curve)
        if alone and rec.kind == "capacity":
            self.lone.append(curve)
        return curve

    def add_tune(self, rec: RunRecord) -> None:
        """A tune's answer, and the capacity curves of its best, BASE and a
        few more trials (found in the run store beside it); a record not
        found is said on the page, never an error."""
        tune = tune_of(rec)
        tune.info = _info(rec, {})[0]  # (not the results: a tune's SLO is one string, shown apart)
        self.data.tunes.append(tune)
        folder = self.folder or (rec.path.parent if rec.path else None)
        for what, rid in wanted_curves(tune):
            if not rid:
                tune.missing.append(f"{what}: no capacity record was kept")
                continue
            try:
                trial = load_run(rid, folder)
            except RunStoreError:
                tune.missing.append(f"{what}: its capacity record {rid} is not in the run store")
                continue
            if trial.kind != "capacity":
                tune.missing.append(f"{what}: record {rid} is a {trial.kind} record, not a capacity search")
                continue
            curve = self.add_curve(trial, False)
            if curve is not None:
                curve.repeat = f"tune of {tune.base}: {what}"
            tune.curves.append((what, rid))

    def add_sweep(self, sweep: RunRecord | None, found: list[SweepRun | None], meta: dict[str, Any], title: str,
                  paired: Any, folder: Path | None) -> None:
        """A sweep's comparison, and its trials' curves."""
        runs = [r for r in found if r]
        cmp_ = comparison_of(runs, meta, title, paired)
        if cmp_:
            self.data.comparisons.append(cmp_)
        for rec in _trial_records(sweep, runs, meta, folder):
            self.add_curve(rec, False)

    def read_export(self, p: Path) -> bool:
        """A sweep's JSON export; False when the file is something else (a run record)."""
        raw = _read_json(p)
        if not (isinstance(raw, dict) and "rows" in raw and "kind" not in raw):
            return False
        runs = [_sweep_run(d) for row in raw.get("rows") or [] for d in row.get("runs") or []
                if isinstance(d, dict)]
        self.add_sweep(None, runs, raw.get("meta") or {}, f"sweep {p.name}", raw.get("paired"), self.folder)
        self.data.sources.append(str(p))
        return True

    def read_record(self, ref: str) -> None:
        """A run record (by id or file): a sweep, a capacity search, a burst or a tune."""
        try:
            rec = load_run(ref, self.directory)
        except RunStoreError as exc:
            raise ReportError(str(exc)) from None
        self.data.sources.append(str(rec.path or ref))
        if rec.kind == "sweep":
            res = rec.results or {}
            runs = [_sweep_run(d) for d in res.get("runs") or [] if isinstance(d, dict)]
            self.add_sweep(rec, runs, res.get("meta") or {}, f"sweep {rec.id}", res.get("paired"),
                           self.folder or (rec.path.parent if rec.path else None))
        elif rec.kind in ("capacity", "burst"):
            self.add_curve(rec, True)
        elif rec.kind == "tune":
            self.add_tune(rec)
        else:
            raise ReportError(f"{rec.id} is a {rec.kind} record; a report draws bursts, capacity searches, "
                              "sweeps and tunes")

    def compare_lone(self) -> None:
        """Several lone capacity searches: side by side, as a sweep's runs."""
        if len(self.lone) > 1:
            counts: dict[str, int] = {}
            lone_runs: list[SweepRun] = []
            for c in self.lone:
                lone_runs.append(_capacity_as_run(c, counts.get(c.name, 0)))
                counts[c.name] = counts.get(c.name, 0) + 1
            cmp_ = comparison_of(lone_runs, {}, "capacity searches side by side")
            if cmp_:
                self.data.comparisons.append(cmp_)
