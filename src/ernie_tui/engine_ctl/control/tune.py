"""`ernie-tui tune`: search the engine's settings for the most goodput under an SLO.

Each trial is BASE's preset with the values Optuna's TPE sampler (seeded)
picks from the space (presets/space.py): the candidate `BASE-tune-N`.
Preflight judges it first: a setting vLLM would refuse is pruned with
preflight's reason and costs no server start. A candidate that passes is
measured by `measure_candidate`, the one objective: today a one-preset
capacity sweep (sweep.py's run_sweep), whose goodput at the SLO is the
trial's value. BASE itself is measured once at the start, for the answer's
"how far the best beats BASE" (`compare_to_base`).

With --gpus, trials run side by side in lanes, one per set of the GPUs
BASE needs, each lane its own GPUs and port (Optuna's study takes asks and
tells from threads; a proposal made while a neighbour measures does not see
that trial's value yet).

The study lives in a journal file under the tune's own directory, so a tune
ended by a signal or a closed session continues from its saved trials when
run again: finished trials are kept, the one cut short runs first.

Optuna is imported only here, and only when a tune runs (an optional extra).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ernie_tui import paths
from ernie_tui.engine_ctl.control import ranking as rk
from ernie_tui.engine_ctl.control import tune_budget as tb
from ernie_tui.engine_ctl.control.paired_sweep import run_paired_sweep
from ernie_tui.engine_ctl.control.sweep import CapacitySweep, SweepOptions, SweepPlan, SweepRun, run_sweep
from ernie_tui.engine_ctl.control.tune_storage import Heartbeats, StorageError, open_storage
from ernie_tui.engine_ctl.launch import gpus_needed, next_free_port, port_is_free, run_preflight
from ernie_tui.engine_ctl.load import BurstConfig
from ernie_tui.presets.model import Preset
from ernie_tui.presets.space import Param, SearchSpace

log = logging.getLogger(__name__)

INSTALL_HINT = "ernie-tui tune needs Optuna: pip install 'ernie-tui[tune]' (or pip install 'optuna>=4')"
# A study proposing only settings that are refused or measured already gives
# up after this many proposals in a row (a space that is nearly all refused).
MAX_IDLE_PROPOSALS = 50
MIN_TRIALS_FOR_IMPORTANCE = 4
# How long a trial waits for the values of one asked just before it (by
# another driver of a shared study) to be written in full: see _same_setting.
PARAMS_WRITTEN_WAIT_S = 5.0

Progress = Callable[[dict[str, Any]], None]


class TuneError(Exception):
    """A tune that cannot start or go on; the message is for humans."""


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TuneError(INSTALL_HINT) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass
class TuneSetup:
    """What a tune searches and how each candidate is measured."""

    base: Preset
    space: SearchSpace
    capacity: CapacitySweep
    burst_config: BurstConfig  # the prompts and max_tokens of the capacity search
    options: SweepOptions
    study_dir: Path
    study_name: str
    max_trials: int | None = None  # measured trials (refusals and repeats do not count)
    budget_s: float | None = None  # wall time of this invocation
    seed: int = 0
    confirm_rounds: int = 0  # at the end: BASE and the best measured again, alternately, this many times
    # The port every trial's server gets (BASE's own port may be taken by the
    # server the operator runs now); None: each preset's own.
    port: int | None = None
    # --storage: an SQLAlchemy URL for the study (tune_storage.py: several
    # drivers share it); None: the journal file under study_dir.
    storage: str | None = None
    # --min-difference: the smallest gain over BASE the verdict names (a
    # share; ranking.paired_verdict), so the smallest a written preset claims.
    min_difference: float = rk.DEFAULT_MIN_DIFFERENCE


@dataclass
class Measurement:
    """One candidate measured: its goodput (output tok/s at the SLO; None when
    not measured to the end) and the sweep row that says how."""

    goodput: float | None
    status: str
    message: str = ""
    run: SweepRun | None = None


def measure_candidate(candidate: Preset, setup: TuneSetup, cancel: threading.Event,
                      progress: Progress | None = None) -> Measurement:
    """THE objective, kept behind this one function so that a better one can
    be swapped in without touching the search: today one capacity search on
    the candidate's own server (a one-preset capacity sweep), goodput at the
    SLO. The best found is then compared with BASE paired (--confirm N,
    _confirm_paired), as `sweep --capacity` compares presets: a search per
    trial is what fits the budget, the paired rounds what an answer needs."""
    if setup.port is not None:
        candidate = replace(candidate, port=setup.port)
    runs = run_sweep(SweepPlan([candidate]), setup.burst_config, setup.options, progress, cancel,
                     capacity=setup.capacity)
    if not runs:
        return Measurement(None, "cancelled", "cancelled before it started")
    run = runs[0]
    if run.status != "ok":
        return Measurement(None, run.status, run.message, run)
    return Measurement(run.goodput_output_tps or 0.0, "ok", "", run)


@dataclass
class Verdict:
    """How far the best setting beats BASE: `text` is what an operator reads."""

    text: str
    gain_pct: float | None = None
    low_pct: float | None = None
    high_pct: float | None = None
    beyond_noise: bool | None = None  # None: one measurement each, no noise estimate
    # Why a gain that measured apart from 0 is still within noise: the floor
    # (--min-difference, ranking.floor_reason's words); "" otherwise.
    floor: str = ""


def compare_to_base(base: list[float], best: list[float], min_difference: float = 0.0) -> Verdict:
    """The answer's "how far the best beats BASE" from each one's goodputs,
    where no paired comparison was made (--confirm 0, or the two could not
    be served side by side): medians, and with repeats the min-max ranges;
    ranges that overlap are noise, and so are ranges apart by less than
    `min_difference` (a share) at their nearest ends (the paired verdict's
    floor, ranking.clears_floor: the whole range of gaps beyond it)."""
    if not base or not best:
        return Verdict("not compared: " + ("BASE was not measured" if not base else "no setting was measured"))
    b, t = statistics.median(base), statistics.median(best)
    if b <= 0:
        return Verdict(f"BASE carried nothing at the SLO; the best carries {t:,.0f} tok/s")
    gain = 100 * (t - b) / b
    if len(base) < 2 or len(best) < 2:
        return Verdict(f"the best carries {gain:+.1f} % against BASE (one measurement each: no noise "
                       "estimate; --confirm N measures both again)", gain)
    low, high = 100 * (min(best) - max(base)) / b, 100 * (max(best) - min(base)) / b
    if min(best) <= max(base) and max(best) >= min(base):
        return Verdict(f"within noise ({gain:+.1f} %, ranges overlap: {low:+.1f} to {high:+.1f} %)",
                       gain, low, high, False)
    floor = 100 * min_difference
    if low < floor and high > -floor:
        why = f"less than the {floor:g} % worth naming"
        return Verdict(f"within noise: {why} ({gain:+.1f} %, ranges {low:+.1f} to {high:+.1f} %)",
                       gain, low, high, False, why)
    more = "more" if gain > 0 else "less"
    return Verdict(f"the best carries {abs(gain):.1f} % {more} ({low:+.1f} to {high:+.1f} %)", gain, low, high, True)


def distributions(space: SearchSpace) -> dict[str, Any]:
    """The space as Optuna distributions."""
    optuna = require_optuna()
    out: dict[str, Any] = {}
    for p in space.params:
        out[p.name] = _distribution(optuna, p)
    return out


def _distribution(optuna: Any, p: Param) -> Any:
    d = optuna.distributions
    if p.choices is not None:
        return d.CategoricalDistribution(list(p.choices))
    return d.IntDistribution(p.low, p.high, log=p.log, step=p.step or 1)


def startup_trials(max_trials: int | None) -> int:
    """Random trials before TPE models the space: a third of the budget, 3 to 10."""
    return 5 if max_trials is None else max(3, min(10, max_trials // 3))


def sampler(setup: TuneSetup, trials_so_far: int) -> Any:
    """Optuna's TPE. Multivariate: engine arguments interact (max_num_seqs is
    only worth what max_num_batched_tokens lets a step hold). Few random
    trials first when the budget is small, so TPE has trials left to use."""
    import warnings

    optuna = require_optuna()
    with warnings.catch_warnings():  # multivariate TPE is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=setup.seed + trials_so_far, multivariate=True,
                                          n_startup_trials=startup_trials(setup.max_trials))


def open_study(setup: TuneSetup) -> Any:
    """The tune's study, created or loaded from its journal file; a trial
    left running by a tune that was killed is failed and queued again."""
    optuna = require_optuna()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    paths.private_dir(setup.study_dir)  # the trials' server logs go here too, with the prompts
    if setup.storage:
        try:
            storage = open_storage(optuna, setup.storage)
        except StorageError as exc:
            raise TuneError(str(exc)) from None
    else:
        storage = JournalStorage(JournalFileBackend(str(setup.study_dir / "journal.log")))
    study = optuna.create_study(study_name=setup.study_name, storage=storage, direction="maximize",
                                load_if_exists=True)
    # Seeded, and on a resumed study seeded past its trials: the same seed
    # would draw the first run's proposals again.
    study.sampler = sampler(setup, len(study.get_trials(deepcopy=False)))
    if setup.storage:  # shared: only a trial whose driver stopped beating is left over
        optuna.storages.fail_stale_trials(study)
        return study
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params)
    return study


# -- the trials ------------------------------------------------------------------------

@dataclass
class TrialRow:
    """One trial as the answer lists it."""

    number: int
    preset: str
    params: dict[str, Any]
    outcome: str  # measured | refused | repeat | failed | cancelled
    goodput: float | None = None
    reason: str = ""
    capacity: float | None = None
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    record_id: str | None = None
    seconds: float | None = None
    gpus: str | None = None  # with --gpus: the trial's CUDA_VISIBLE_DEVICES
    server_from_to: list[float] | None = None  # wall clock: its server launched, stopped
    node: str | None = None  # with --ray: the node's address it ran on
    retried_after_node_loss: bool = False  # with --ray: it ran again after its first node was lost


def _summary(m: Measurement, seconds: float) -> dict[str, Any]:
    run = m.run
    return {"goodput": m.goodput, "status": m.status, "reason": m.message, "seconds": round(seconds, 1),
            "capacity": None if run is None else (run.capacity_concurrency if run.capacity_rate is None
                                                  else run.capacity_rate),
            "ttft_p99_ms": None if run is None else run.ttft_p99_ms,
            "itl_p99_ms": None if run is None else run.itl_p99_ms,
            "record_id": None if run is None else run.record_id,
            "gpus": None if run is None else run.gpus,
            "server_from_to": None if run is None or run.started_at is None else [run.started_at, run.ended_at],
            "node": None if run is None else run.node,
            "retried_after_node_loss": False if run is None else run.retried_after_node_loss}


def trial_rows(study: Any) -> list[TrialRow]:
    """Every trial the study holds (this invocation's and earlier ones'), in order."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if "outcome" not in a or a["outcome"] == tb.GIVEN_BACK:  # running now; or asked past --trials, never run
            continue
        s = a.get("summary") or {}
        rows.append(TrialRow(t.number, a.get("preset", ""), dict(t.params), a["outcome"], s.get("goodput"),
                             a.get("reason", ""), s.get("capacity"), s.get("ttft_p99_ms"), s.get("itl_p99_ms"),
                             s.get("record_id"), s.get("seconds"), s.get("gpus"), s.get("server_from_to"),
                             s.get("node"), bool(s.get("retried_after_node_loss"))))
    return rows


def _same_setting(study: Any, params: dict[str, Any], trial: Any = None) -> Any:
    """An earlier trial of the study with exactly these values, measured or
    refused; or, given this `trial`, one asked before it that is being
    measured now (by another lane or another driver of a shared study).

    "Before" is by the storage's trial id, not the trial number: on a
    database two drivers asking at once can get the same number (Optuna
    counts the trials with a lower id, each driver's new row not yet seen by
    the other), never the same id. And a trial asked before this one whose
    values are still being written (Optuna writes them one by one) is read
    again until they are all there, so that the two do not both measure."""
    for t in study.get_trials(deepcopy=False):
        if t.params == params and t.user_attrs.get("outcome") in ("measured", "refused", "failed"):
            return t
    if trial is None:
        return None
    mine = trial._trial_id
    deadline = time.monotonic() + PARAMS_WRITTEN_WAIT_S
    while True:
        partial = False
        for t in study.get_trials(deepcopy=False):
            if t._trial_id >= mine or "outcome" in t.user_attrs or t.state.name != "RUNNING":
                continue
            if t.params == params:
                return t
            partial = partial or (len(t.params) < len(params) and
                                  all(params.get(k) == v for k, v in t.params.items()))
        if not partial or time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _preflight_refusal(candidate: Preset, setup: TuneSetup) -> str | None:
    """What preflight refuses in the candidate (its first error), or None."""
    result = run_preflight(_as_launched(candidate, setup), setup.options.model)
    problem = result.first_error()
    return None if result.ok or problem is None else f"{problem.kind.value}: {problem.message}"


def _as_launched(candidate: Preset, setup: TuneSetup) -> Preset:
    """The candidate as its trial will launch it: on the tune's port and the --gpus given."""
    if setup.port is not None:
        candidate = replace(candidate, port=setup.port)
    ids = setup.options.gpu_ids
    if not ids:
        return candidate
    return replace(candidate, env={**candidate.env, "CUDA_VISIBLE_DEVICES": ",".join(ids)})


def _emit(progress: Progress | None, **event: Any) -> None:
    if progress is not None:
        try:
            progress(event)
        except Exception:  # noqa: BLE001  a display callback must not end the tune
            log.exception("tune progress callback failed")


def _run_trial(study: Any, trial: Any, setup: TuneSetup, stop: threading.Event, progress: Progress | None) -> str:
    """Ask's trial to its end: a repeat of an earlier setting, a preflight
    refusal (pruned, no server), or a measurement; returns its outcome."""
    optuna = require_optuna()
    state = optuna.trial.TrialState
    params = dict(trial.params)
    name = f"{setup.base.name}-tune-{trial.number}"
    trial.set_user_attr("preset", name)
    base_setting = {k: setup.base.get(k) for k in params}
    if params == base_setting and study.user_attrs.get("base"):  # BASE is measured already
        trial.set_user_attr("outcome", "repeat")
        trial.set_user_attr("reason", "BASE's own setting")
        study.tell(trial, statistics.median(study.user_attrs["base"]["goodputs"]))
        return "repeat"
    earlier = _same_setting(study, params, trial)
    if earlier is not None:  # TPE proposes a setting again: its value is known (or coming), no second run
        trial.set_user_attr("outcome", "repeat")
        trial.set_user_attr("reason", f"same setting as trial {earlier.number}"
                            + ("" if "outcome" in earlier.user_attrs else ", measured now by another lane or driver"))
        if earlier.state == state.COMPLETE:
            study.tell(trial, earlier.value)
        else:
            study.tell(trial, state=state.PRUNED)
        return "repeat"
    candidate = setup.space.candidate(setup.base, params, name)
    _emit(progress, event="trial_start", number=trial.number, preset=name, params=params)
    refusal = _preflight_refusal(candidate, setup)
    if refusal is not None:
        trial.set_user_attr("outcome", "refused")
        trial.set_user_attr("reason", f"preflight: {refusal}")
        study.tell(trial, state=state.PRUNED)
        return "refused"
    t0 = time.monotonic()
    m = measure_candidate(candidate, setup, stop, _relay(progress, trial.number))
    trial.set_user_attr("summary", _summary(m, time.monotonic() - t0))
    if m.goodput is None and stop.is_set():
        trial.set_user_attr("outcome", "cancelled")
        trial.set_user_attr("reason", "stopped while measuring; runs first when the tune goes on")
        study.tell(trial, state=state.FAIL)
        study.enqueue_trial(params)
        return "cancelled"
    if m.goodput is None:  # a setting that does not serve carries nothing at the SLO
        trial.set_user_attr("outcome", "failed")
        trial.set_user_attr("reason", f"{m.status}: {m.message}")
        study.tell(trial, 0.0)
        return "failed"
    trial.set_user_attr("outcome", "measured")
    study.tell(trial, m.goodput)
    return "measured"


def _relay(progress: Progress | None, number: int) -> Progress | None:
    """The sweep's events of one trial, tagged with its number."""
    if progress is None:
        return None
    return lambda ev: _emit(progress, event="sweep", number=number, sweep=ev)


def _measured(rows: list[TrialRow]) -> list[TrialRow]:
    return [r for r in rows if r.outcome in ("measured", "failed")]


def _settings_tried(rows: list[TrialRow]) -> int:
    """Distinct settings with a known answer (a repeat of BASE's own setting included)."""
    return len({tuple(sorted(r.params.items())) for r in rows
                if r.outcome in ("measured", "failed", "refused", "repeat")})


def best_row(rows: list[TrialRow]) -> TrialRow | None:
    scored = [r for r in rows if r.outcome == "measured" and r.goodput is not None]
    return max(scored, key=lambda r: r.goodput or 0.0) if scored else None


@dataclass
class _Progress:
    """What the search's lanes share: trial durations, proposals in a row
    that measured nothing, trials being measured now; under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    durations: list[float] = field(default_factory=list)
    idle: int = 0
    in_flight: int = 0
    beats: Heartbeats | None = None  # --storage: this driver's heartbeats for its trials


# _why_stop's answer when --trials is taken only by other drivers' trials in
# flight: look again in a moment (tune_budget.py says why).
WAIT = "wait"


def room_for_trial(now: float, deadline: float, durations: list[float]) -> bool:
    """Whether a trial started now would end by the deadline, as long as the
    longest one so far took (none yet: it may start). The longest, not the
    mean: a trial cut at the deadline is lost work and its server's stop
    runs past the budget. On vLLM CPU (tune against the grid, 2026-12-07, run
    1) trials took 49-52 s; one started with the mean's 50 s left was cut
    after 51 s, and the 251 s tune ended at 252.3 s."""
    return not durations or now + max(durations) <= deadline


def _why_stop(study: Any, setup: TuneSetup, stop: threading.Event, cancel: threading.Event,
              deadline: float | None, seen: _Progress) -> str | None:
    """Why the search stops before the next trial, WAIT, or None to go on (call under seen.lock)."""
    if cancel.is_set():
        return "stopped by the operator"
    if stop.is_set():
        return "budget: wall time"
    if seen.beats is not None:  # shared: a dead driver's trial stops counting, and runs again
        tb.fail_stale(require_optuna(), study)
    rows = trial_rows(study)
    measured, in_flight = tb.taken(study)  # every lane's and driver's (tune_budget.py)
    full = setup.max_trials is not None and measured + in_flight >= setup.max_trials
    if full and (measured >= (setup.max_trials or 0) or seen.in_flight or seen.beats is None):
        return f"budget: {setup.max_trials} trials measured"
    if deadline is not None and not room_for_trial(time.monotonic(), deadline, seen.durations):
        return "budget: wall time (no room for another trial)"
    if _settings_tried(rows) >= setup.space.size():
        return "every setting of the space tried"
    if seen.idle >= MAX_IDLE_PROPOSALS:
        return f"{seen.idle} proposals in a row were refused or repeats"
    return WAIT if full else None


def _lane(study: Any, setup: TuneSetup, stop: threading.Event, cancel: threading.Event,
          deadline: float | None, progress: Progress | None, seen: _Progress) -> str:
    """One after another, trials on one lane's GPUs until the budget; returns why it stopped."""
    dists = distributions(setup.space)
    waiting = False
    while True:
        pause = tb.POLL_S
        with seen.lock:
            why = _why_stop(study, setup, stop, cancel, deadline, seen)
            if why is None:
                trial = study.ask(dists)
                seen.in_flight += 1
                if seen.beats is not None:
                    seen.beats.add(trial)
                    # Asked first, then counted: of two drivers that both saw one trial left, one gives back.
                    if setup.max_trials is not None and tb.over_budget(study, setup.max_trials):
                        seen.beats.discard(trial)
                        seen.in_flight -= 1
                        tb.give_back(require_optuna(), study, trial)
                        why, pause = WAIT, tb.backoff()
        if why == WAIT:
            if not waiting:
                _emit(progress, event="waiting", max_trials=setup.max_trials)
            waiting = True
            stop.wait(pause)
            continue
        if why is not None:
            return why
        waiting = False
        t0 = time.monotonic()
        try:
            outcome = _run_trial(study, trial, setup, stop, progress)
        finally:
            with seen.lock:
                seen.in_flight -= 1
                if seen.beats is not None:
                    seen.beats.discard(trial)
        with seen.lock:
            if outcome in ("measured", "failed"):
                seen.durations.append(time.monotonic() - t0)
                seen.idle = 0
            else:
                seen.idle += 1
            rows = trial_rows(study)
        _emit(progress, event="trial_done", row=next((r for r in rows if r.number == trial.number), None),
              best=best_row(rows), measured=len(_measured(rows)), max_trials=setup.max_trials,
              deadline=deadline)


def lanes(setup: TuneSetup) -> list[TuneSetup]:
    """The trials that run side by side: one lane without --gpus; with them,
    one lane per set of the GPUs BASE needs (tensor x pipeline x local data
    parallel), each with its own GPUs and port."""
    ids = setup.options.gpu_ids or []
    per = gpus_needed(setup.base)
    ray = setup.options.ray  # --ray: as many lanes as the cluster's nodes hold trials at once
    count = ray.slots(setup.base) if ray is not None else len(ids) // per
    if count < 2:
        return [setup]
    out: list[TuneSetup] = []
    port = setup.port or setup.base.port
    for i in range(count):
        port = _free_port(setup.base.host, port, {s.port for s in out})
        options = setup.options if ray is not None else replace(setup.options, gpu_ids=ids[i * per:(i + 1) * per])
        out.append(replace(setup, options=options, port=port))
    return out


def _free_port(host: str, start: int, taken: set[int | None]) -> int:
    port = start
    while port in taken or not port_is_free(host, port)[0]:
        nxt = next_free_port(host, port + 1)
        if nxt is None:
            raise TuneError(f"no free port after {start} on {host} for the trials' servers")
        port = nxt
    return port


def _search(study: Any, setup: TuneSetup, stop: threading.Event, cancel: threading.Event,
            deadline: float | None, progress: Progress | None, beats: Heartbeats | None = None) -> str:
    """Trials until the budget, side by side on disjoint GPUs where --gpus
    gives several lanes (Optuna's study takes asks and tells from threads);
    returns why it stopped."""
    seen = _Progress(beats=beats)
    ways = lanes(setup)
    if len(ways) == 1:
        return _lane(study, setup, stop, cancel, deadline, progress, seen)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(ways), thread_name_prefix="tune-lane") as pool:
        whys = [f.result() for f in [pool.submit(_lane, study, lane, stop, cancel, deadline, progress, seen)
                                     for lane in ways]]
    return whys[0]


# -- BASE, the confirmation and the answer ----------------------------------------------

def _measure_base(study: Any, setup: TuneSetup, stop: threading.Event, progress: Progress | None,
                  beats: Heartbeats | None = None) -> list[float]:
    """BASE's goodput, measured once per study (a resumed tune keeps it);
    [] when the tune was stopped before it was measured."""
    kept = study.user_attrs.get("base")
    if kept:
        return list(kept["goodputs"])
    if beats is not None and not beats.claim_base(stop):  # another driver of the shared study measured it
        kept = study.user_attrs.get("base")
        return list(kept["goodputs"]) if kept else []
    refusal = _preflight_refusal(setup.base, setup)
    if refusal is not None:
        raise TuneError(f"BASE {setup.base.name} fails preflight, so there is nothing to compare with: {refusal}")
    _emit(progress, event="base_start", preset=setup.base.name)
    t0 = time.monotonic()
    m = measure_candidate(setup.base, setup, stop, _relay(progress, -1))
    if m.goodput is None:
        if stop.is_set():
            return []
        raise TuneError(f"BASE {setup.base.name} could not be measured: {m.status}: {m.message}")
    study.set_user_attr("base", {"goodputs": [m.goodput], "summary": _summary(m, time.monotonic() - t0)})
    if beats is not None:
        beats.base_done()
    _emit(progress, event="base_done", preset=setup.base.name, goodput=m.goodput)
    return [m.goodput]


def paired_verdict(pair: rk.PairVerdict) -> Verdict:
    """The paired sweep's verdict on BASE (a) against the best (b), as the answer says it."""
    if pair.mean is None or pair.low is None or pair.high is None:
        return Verdict(f"not compared: {pair.text()}")
    gain, low, high = (100.0 * (math.exp(x) - 1.0) for x in (pair.mean, pair.low, pair.high))
    if pair.within_floor or (pair.interval_excludes_zero and not pair.clears_floor):
        # The floor (--min-difference) in PairVerdict.text's words: said the same everywhere.
        why = rk.floor_reason(pair)
        return Verdict(f"within noise: {why} ({rk.pct_span(gain)} %, interval {rk.pct_span(low, high)} %, paired "
                       f"over {pair.rounds} rounds)", gain, low, high, False, why)
    if not pair.beyond_noise:
        # How many rounds the best led: two of two is no verdict (one degree
        # of freedom, an interval of ±12.7 standard errors), but the operator
        # should see which way they leaned and what would settle it.
        ahead = sum(1 for d in pair.diffs if d > 0)
        return Verdict(f"within noise ({gain:+.1f} %, interval {low:+.1f} to {high:+.1f} %, paired over "
                       f"{pair.rounds} rounds; the best ahead in {ahead} of them: more rounds, --confirm N, "
                       "narrow it)", gain, low, high, False)
    more = "more" if gain > 0 else "less"
    return Verdict(f"the best carries {abs(gain):.1f} % {more} ({low:+.1f} to {high:+.1f} %, paired over "
                   f"{pair.rounds} rounds)", gain, low, high, True)


def _confirm_paired(setup: TuneSetup, best: TrialRow, stop: threading.Event,
                    progress: Progress | None) -> tuple[Verdict | None, dict[str, Any] | None]:
    """BASE and the best compared as `sweep --capacity` compares presets:
    both served at once, their levels taking turns, then confirm_rounds duel
    rounds (at least 2, for an interval). (None, None) when they cannot be
    served side by side (the caller measures them one after another)."""
    best_preset = _as_launched(setup.space.candidate(setup.base, best.params, best.preset), setup)
    base = _as_launched(setup.base, setup)
    _emit(progress, event="confirm", round=1, preset=f"{base.name} and {best_preset.name}, paired")
    _runs, result = run_paired_sweep([base, best_preset], setup.burst_config, setup.options, setup.capacity,
                                     max(2, setup.confirm_rounds), _relay(progress, -2), stop,
                                     min_difference=setup.min_difference)
    if result.refused or not result.pairs:
        return None, None
    return paired_verdict(result.pairs[0]), result.to_dict()


def _confirm(setup: TuneSetup, best: TrialRow, stop: threading.Event,
             progress: Progress | None) -> tuple[list[float], list[float]]:
    """BASE and the best measured again, alternately, confirm_rounds times
    (what was measured before the budget ran out): where the two cannot be
    served side by side for the paired comparison."""
    best_preset = setup.space.candidate(setup.base, best.params, best.preset)
    base_again: list[float] = []
    best_again: list[float] = []
    for r in range(setup.confirm_rounds):
        for preset, into in ((setup.base, base_again), (best_preset, best_again)):
            if stop.is_set():
                return base_again, best_again
            _emit(progress, event="confirm", round=r + 1, preset=preset.name)
            m = measure_candidate(preset, setup, stop, _relay(progress, -2))
            if m.goodput is not None:
                into.append(m.goodput)
    return base_again, best_again


def importances(study: Any) -> dict[str, float] | None:
    """Optuna's parameter importances (its default, PED-ANOVA: no scikit-learn; over the study's
    complete trials, a repeat counted with the value it repeats) once a few
    trials are measured; None before, or when no parameter varied."""
    optuna = require_optuna()
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("outcome") == "measured"]
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        return None
    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ImportError) as exc:  # e.g. every trial had the same values
        log.info("no importances: %s", exc)
        return None
    return {k: round(float(v), 3) for k, v in found.items()}


def effects(rows: list[TrialRow]) -> dict[str, dict[str, float]]:
    """Each parameter's effect: the median goodput of the measured trials at each of its values."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in _measured(rows):
        for k, v in r.params.items():
            out.setdefault(k, {}).setdefault(str(v), []).append(r.goodput or 0.0)
    return {k: {v: round(statistics.median(g), 1) for v, g in sorted(vals.items(), key=lambda x: _num(x[0]))}
            for k, vals in out.items()}


def _num(text: str) -> tuple[int, float | str]:
    try:
        return 0, float(text)
    except ValueError:
        return 1, text


@dataclass
class TuneResult:
    """The answer, as printed and as the run record keeps it."""

    study_name: str
    study_dir: str
    base: str
    slo: str
    space: list[str]
    settings_in_space: int
    trials: list[TrialRow]
    best: TrialRow | None
    base_goodputs: list[float]
    best_goodputs: list[float]
    verdict: Verdict
    importances: dict[str, float] | None
    effects: dict[str, dict[str, float]]
    refused: list[TrialRow]
    stopped: str
    seconds: float
    measured_trials: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # BASE's own measurement (_summary: capacity, latencies, the record id of
    # its capacity search), for the report's reference point and curve.
    base_summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _watch(stop: threading.Event, cancel: threading.Event, deadline: float | None, done: threading.Event) -> None:
    """Sets `stop` when the operator cancels or the wall-time budget is spent."""
    while not done.wait(0.2):
        if cancel.is_set() or (deadline is not None and time.monotonic() >= deadline):
            stop.set()
            return


_held: dict[str, int] = {}  # study dir -> the open file descriptor holding its lock


def _hold(study_dir: Path) -> None:
    """One tune per study at a time: two would fail each other's running
    trials as left over from a killed tune. The lock goes with the process
    (or with _let_go)."""
    import fcntl
    import os

    paths.private_dir(study_dir)
    fd = os.open(study_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TuneError(f"another tune is running this study now ({study_dir}); wait for it, or give this one "
                        "--study NAME") from None
    _held[str(study_dir)] = fd


def _let_go(study_dir: Path) -> None:
    import os

    fd = _held.pop(str(study_dir), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock


def run_tune(setup: TuneSetup, progress: Progress | None = None, cancel: threading.Event | None = None) -> TuneResult:
    """Measure BASE (once per study), search until the budget, confirm the
    best against BASE if asked; never leaves a server running."""
    cancel = cancel or threading.Event()
    t0 = time.monotonic()
    deadline = t0 + setup.budget_s if setup.budget_s else None
    stop, done = threading.Event(), threading.Event()
    threading.Thread(target=_watch, args=(stop, cancel, deadline, done), name="tune-budget", daemon=True).start()
    beats: Heartbeats | None = None
    try:
        if not setup.storage:  # a shared study (--storage) is guarded by heartbeats instead
            _hold(setup.study_dir)
        study = open_study(setup)
        beats = Heartbeats(study) if setup.storage else None
        base = _measure_base(study, setup, stop, progress, beats)
        why = _search(study, setup, stop, cancel, deadline, progress, beats) if base else (
            "stopped by the operator" if cancel.is_set() else "budget: wall time")
        rows = trial_rows(study)
        best = best_row(rows)
        best_values = [best.goodput] if best is not None and best.goodput is not None else []
        verdict, paired = None, None
        if best is not None and setup.confirm_rounds and not stop.is_set():
            verdict, paired = _confirm_paired(setup, best, stop, progress)
            if verdict is None and not stop.is_set():
                more_base, more_best = _confirm(setup, best, stop, progress)
                base, best_values = base + more_base, best_values + more_best
        return TuneResult(
            study_name=setup.study_name, study_dir=str(setup.study_dir), base=setup.base.name,
            slo=" ".join(str(o) for o in setup.capacity.slo), space=[p.describe() for p in setup.space.params],
            settings_in_space=setup.space.size(), trials=rows, best=best, base_goodputs=base,
            best_goodputs=best_values, verdict=verdict or compare_to_base(base, best_values, setup.min_difference),
            importances=importances(study), effects=effects(rows), refused=[r for r in rows if r.outcome == "refused"],
            stopped=why, seconds=round(time.monotonic() - t0, 1), measured_trials=len(_measured(rows)),
            extra={**({"paired": paired} if paired else {}),
                   "min_difference_pct": round(100 * setup.min_difference, 3)},
            base_summary=dict((study.user_attrs.get("base") or {}).get("summary") or {}))
    finally:
        done.set()
        if beats is not None:
            beats.close()
        _let_go(setup.study_dir)


def _against_base(result: TuneResult) -> str:
    """The verdict in a few words, for the preset's description."""
    v = result.verdict
    if not result.base_goodputs or v.gain_pct is None:
        return v.text
    base = f"BASE's {statistics.median(result.base_goodputs):,.0f}"
    if v.beyond_noise is False:
        return f"within noise of {base}"
    if v.beyond_noise is None:
        return f"{v.gain_pct:+.1f} % on {base} (one measurement each)"
    return f"{v.gain_pct:+.1f} % ({v.low_pct:+.1f} to {v.high_pct:+.1f} %) on {base}"


@dataclass(frozen=True)
class PresetChoice:
    """Whether the best setting is written as a preset (BASE-tuned), and why.

    The rule: written only when the comparison with BASE says the best
    carries more beyond noise; a `BASE-tuned` preset in the operator's
    file reads as "better than BASE", so one that measured within noise or
    below it (cpu-demo-tuned, 6.5 % below BASE, issue #56), or was never
    compared beyond one measurement each (--confirm 0), is not written
    unless the operator asks (--write-even-if-not-better)."""

    write: bool
    confirmed: bool  # the best beat BASE beyond noise
    why: str  # why it is not confirmed, in words ("" when it is)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _estimate(v: Verdict) -> str:
    text = f"estimate {v.gain_pct:+.1f} %"
    if v.low_pct is not None and v.high_pct is not None:
        text += f", interval {v.low_pct:+.1f} to {v.high_pct:+.1f} %"
    return text


def preset_choice(result: TuneResult, even_if_not_better: bool = False) -> PresetChoice:
    """The rule above, from the verdict's public fields (beyond noise, the
    estimate, its interval) whichever comparison made it: the paired one
    (--confirm N), BASE and the best measured again in turn, or one
    measurement each (--confirm 0: no noise estimate, so never confirmed)."""
    if result.best is None:
        return PresetChoice(False, False, "no setting was measured")
    v = result.verdict
    if v.gain_pct is None:
        why = f"the best trial was not compared with BASE ({v.text})"
    elif v.beyond_noise is None:
        why = (f"the best trial was measured once, as BASE was: no noise estimate ({_estimate(v)}; "
               "--confirm N compares them)")
    elif not v.beyond_noise:
        why = f"the best trial did not beat BASE beyond noise ({v.floor + ': ' if v.floor else ''}{_estimate(v)})"
    elif v.gain_pct <= 0 or (v.low_pct is not None and v.low_pct <= 0):
        why = f"the best trial measured below BASE, beyond noise ({_estimate(v)})"
    else:
        return PresetChoice(True, True, "")
    return PresetChoice(even_if_not_better, False, why)


def tuned_preset(setup: TuneSetup, result: TuneResult, name: str, run_id: str | None,
                 unconfirmed: str = "") -> Preset | None:
    """The best setting as a preset to switch to, its description saying
    where it came from (and, written at the operator's word though it was
    not confirmed better, why not: `unconfirmed`); None when no trial was
    measured."""
    best = result.best
    if best is None:
        return None
    vs = _against_base(result)
    changes = ", ".join(f"{k} {v}" for k, v in best.params.items())
    description = (f"ernie-tui tune of {setup.base.name} (run {run_id or '-'}, {time.strftime('%Y-%m-%d')}, "
                   f"trial {best.number}): {changes}. SLO {result.slo}: goodput {best.goodput or 0:,.0f} tok/s, {vs}.")
    if unconfirmed:
        description += f" Not confirmed better: {unconfirmed}; written with --write-even-if-not-better."
    return replace(setup.space.candidate(setup.base, best.params, name), description=description, source="user")
