"""A tune's study shared by several drivers (`tune --storage URL`).

Without --storage the study is a journal file only one tune opens at a
time (tune._hold), and a trial found RUNNING was left by a tune that was
killed. With a database several tunes of one study run at once (say one on
each of two login nodes, or one restarted while the other goes on), so:

- a trial is left over only when its driver stopped beating: each driver
  records a heartbeat for the trials it runs (Optuna's RDB heartbeat), and
  one found stale (on opening, or by a driver still searching) is failed
  and queued again;
- --trials is the study's, counted over every driver (tune_budget.py);
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
CONNECT_TIMEOUT_S = 10  # a database server that does not answer in this long is reported, not waited for
# SQLAlchemy 2.1 reads postgresql:// as psycopg (3); postgresql+psycopg2:// names the older driver.
POSTGRES_HINT = "pip install 'ernie-tui[postgres]' (psycopg 3), or name your driver: postgresql+psycopg2://..."


class StorageError(Exception):
    """--storage URL cannot be opened; the message is one line for humans."""


def open_storage(optuna: Any, url: str) -> Any:
    """Optuna's RDB storage for `url` (sqlite:///study.db, postgresql://...),
    with heartbeats; a stale trial is queued again with its values.
    StorageError when the URL is malformed, its driver is not installed, or
    its server does not answer."""

    def requeue(study: Any, trial: Any) -> None:
        log.info("trial %s of a driver that stopped: queued again", trial.number)
        study.enqueue_trial(trial.params)

    from sqlalchemy.exc import SQLAlchemyError  # Optuna's own dependency

    where = reachable(url)
    # sqlite: two drivers write the same file; wait for its lock, not fail.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, failed_trial_callback=requeue)
        except SQLAlchemyError as exc:
            # Two drivers opening a new database at once both create its
            # tables; the one that lost finds them made on its next try.
            if attempt == 2:
                raise StorageError(f"--storage {where}: {_first_line(exc)}") from None
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


def reachable(url: str) -> str:
    """Connect once to `url` and let go; the URL as it may be shown (no
    password). StorageError, one line, when it cannot be: the URL malformed,
    SQLAlchemy's driver for it missing, the server not answering or refusing."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except ArgumentError as exc:
        raise StorageError(f"--storage takes an SQLAlchemy URL like postgresql://user@host/db or "
                           f"sqlite:///study.db: {_first_line(exc)}") from None
    shown = parsed.render_as_string(hide_password=True)
    try:
        engine = sqlalchemy.create_engine(parsed, **({"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
                                                     if parsed.get_backend_name() == "postgresql" else {}))
    except ImportError as exc:  # the dialect's DBAPI module (psycopg for postgresql://) is not installed
        hint = POSTGRES_HINT if parsed.get_backend_name() == "postgresql" else "install SQLAlchemy's driver for it"
        raise StorageError(f"--storage {shown}: no driver ({exc}): {hint}") from None
    except ArgumentError as exc:  # e.g. a dialect SQLAlchemy does not know
        raise StorageError(f"--storage {shown}: {_first_line(exc)}") from None
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        why = getattr(exc, "orig", None) or exc  # the driver's own words, without SQLAlchemy's wrapping
        raise StorageError(f"--storage {shown}: cannot connect: {_first_line(why)}") from None
    finally:
        engine.dispose()
    return shown


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (the driver's and
    SQLAlchemy's run on for several, with a link to their docs)."""
    text = str(exc).strip().splitlines()
    return text[0].strip() if text else type(exc).__name__


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
