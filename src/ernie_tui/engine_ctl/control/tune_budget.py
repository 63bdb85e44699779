"""`tune --trials T`: the study's budget, over every driver that shares it.

T counts the settings the study measured, each a server started: trials
measured to the end or that failed to serve. A repeat (a setting measured
already, its value reused, no server) and a preflight refusal (no server)
cost nothing and do not count; the search still ends on too many of them in
a row, or when every setting of the space has an answer (tune._why_stop).

Several drivers of one `--storage` study (tune_storage.py) each run their
own search, so each counts what all of them took:

- taken = the trials measured + every trial asked and not yet told, any
  driver's or lane's (a trial in flight may still turn out a repeat: counted
  until it is told, then given back to the budget);
- a driver that finds the budget taken only by other drivers' trials in
  flight waits for them (tune._lane) instead of ending: one of them may
  turn out a repeat, or its driver may die, and the study should still get
  its T. A driver with a trial of its own in flight ends that lane: it
  looks again itself when its trial is told;
- a trial in flight whose driver died stops counting once Optuna's
  heartbeat finds it stale (no beat for tune_storage.GRACE_S): each check
  fails such trials first (the storage's failed-trial callback queues the
  setting again, so the next trial asked measures it);
- two drivers that both see one trial left: each asks its trial first (a
  row in the study), then counts again, itself included (`over_budget`).
  Whichever counts last sees the other's row (written before the other
  counted, so before it counted), so at most T pass; one that finds the
  budget over gives its trial back (`give_back`), and waits a random moment
  before it looks again, so that two giving back at once do not meet again.

The journal file (no --storage) has one driver at a time (tune._hold): its
trials in flight are its own, so the same count is exact and nothing waits
or gives back there.

Optuna is imported by the caller (tune.require_optuna).
"""

from __future__ import annotations

import logging
import random
from typing import Any

log = logging.getLogger(__name__)

COUNTED = ("measured", "failed")  # the outcomes that started a server: the ones --trials counts
GIVEN_BACK = "given back"  # the outcome of a trial asked past the budget (never run; not listed)
POLL_S = 2.0  # how often a driver waiting on other drivers' trials in flight looks again
BACKOFF_S = (0.5, 2.5)  # after a give-back: a random wait in this range before asking again


def taken(study: Any) -> tuple[int, int]:
    """(measured, in flight): the study's trials that count to --trials, and
    its trials asked and not yet told (running now, on any lane or driver)."""
    measured = in_flight = 0
    for t in study.get_trials(deepcopy=False):
        outcome = t.user_attrs.get("outcome")
        if outcome in COUNTED and t.state.name != "FAIL":
            # Counted from the moment its outcome is written, before its tell;
            # not if its driver died in between (failed as stale, its setting queued again).
            measured += 1
        elif outcome is None and t.state.name == "RUNNING":
            in_flight += 1
    return measured, in_flight


def fail_stale(optuna: Any, study: Any) -> None:
    """Fail the trials whose driver stopped beating (Optuna's heartbeat: a
    no-op on a storage without it); each is queued again by the storage's
    failed-trial callback, once, whichever driver finds it first."""
    try:
        optuna.storages.fail_stale_trials(study)
    except Exception:  # noqa: BLE001  a check missed is made again at the next; the search goes on
        log.exception("failing stale trials")


def over_budget(study: Any, max_trials: int) -> bool:
    """Called with a trial just asked (so in flight here): whether the study
    now holds more than max_trials measured or in flight."""
    measured, in_flight = taken(study)
    return measured + in_flight > max_trials


def give_back(optuna: Any, study: Any, trial: Any) -> None:
    """A trial asked past the budget, ended without running: failed, so no
    sampler learns from it; its setting queued again when it came from the
    queue (a trial cut short, or a dead driver's), so that it is not lost."""
    fixed = study._storage.get_trial(trial._trial_id).system_attrs.get("fixed_params")
    trial.set_user_attr("outcome", GIVEN_BACK)
    trial.set_user_attr("reason", "asked when the study's --trials were taken (by other drivers' trials)")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    if fixed:
        study.enqueue_trial(fixed)


def backoff() -> float:
    return random.uniform(*BACKOFF_S)
