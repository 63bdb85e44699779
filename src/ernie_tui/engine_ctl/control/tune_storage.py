"""A tune's study shared by several drivers (`tune --storage URL`).

Without --storage the study is a journal file only one tune opens at a
time (tune._hold), and a trial found RUNNING was left by a tune that was
killed. With a database several tunes of one study run at once (say one on
each of two login nodes, or one restarted while the other goes on), so:

- a trial is left over only when its driver stopped beating: each driver
  records a heartbeat for the trials it runs (Optuna's RDB heartbeat), and
  one found stale on opening is failed and queued again;
- a setting asked by one driver while another measures it is not measured
  twice: the lower-numbered trial measures it, the other is a repeat
  (tune._same_setting);
- BASE is measured once: the driver that claims it measures it (a claim
  written, then read back: the last writer wins, and both read the same),
  the others wait for its value while its claim is fresh.

Optuna is imported by the caller (tune.require_optuna).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

log = logging.getLogger(__name__)

HEARTBEAT_S = 10  # how often a driver says it is alive, for each of its running trials
GRACE_S = 60  # a trial (or a BASE claim) not heard of for this long belongs to a driver that died
CLAIM_SETTLE_S = 1.0  # between writing the BASE claim and reading back who won


def open_storage(optuna: Any, url: str) -> Any:
    """Optuna's RDB storage for `url` (sqlite:///study.db, postgresql://...),
    with heartbeats; a stale trial is queued again with its values."""

    def requeue(study: Any, trial: Any) -> None:
        log.info("trial %s of a driver that stopped: queued again", trial.number)
        study.enqueue_trial(trial.params)

    from sqlalchemy.exc import SQLAlchemyError  # Optuna's own dependency

    # sqlite: two drivers write the same file; wait for its lock, not fail.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, failed_trial_callback=requeue)
        except SQLAlchemyError:
            # Two drivers opening a new database at once both create its
            # tables; the one that lost finds them made on its next try.
            if attempt == 2:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


class Heartbeats:
    """One driver's heartbeats for its running trials and its BASE claim."""

    def __init__(self, study: Any) -> None:
        self.study = study
        self.me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._trials: set[int] = set()
        self._claiming = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="tune-heartbeat", daemon=True)
        self._thread.start()

    def add(self, trial: Any) -> None:
        self.study._storage.record_heartbeat(trial._trial_id)
        with self._lock:
            self._trials.add(trial._trial_id)

    def discard(self, trial: Any) -> None:
        with self._lock:
            self._trials.discard(trial._trial_id)

    def close(self) -> None:
        self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(HEARTBEAT_S):
            with self._lock:
                ids, claiming = list(self._trials), self._claiming
            try:
                for tid in ids:
                    self.study._storage.record_heartbeat(tid)
                if claiming:
                    self.study.set_user_attr("base_claim", {"by": self.me, "at": time.time()})
            except Exception:  # noqa: BLE001  a missed beat is retried next time; the tune goes on
                log.exception("tune heartbeat failed")

    # -- BASE, measured by one driver ------------------------------------------------

    def claim_base(self, stop: threading.Event) -> bool:
        """True: this driver measures BASE. False: another did (its value is
        in the study now) or the tune was stopped while waiting for it."""
        while not stop.is_set():
            attrs = self.study.user_attrs
            if attrs.get("base"):
                return False
            claim = attrs.get("base_claim")
            if claim is None or claim.get("by") == self.me or time.time() - float(claim.get("at", 0)) > GRACE_S:
                self.study.set_user_attr("base_claim", {"by": self.me, "at": time.time()})
                time.sleep(CLAIM_SETTLE_S)
                if (self.study.user_attrs.get("base_claim") or {}).get("by") == self.me:
                    with self._lock:
                        self._claiming = True
                    return True
                continue
            stop.wait(2.0)  # another driver measures BASE now
        return False

    def base_done(self) -> None:
        with self._lock:
            self._claiming = False
