"""Sweep and tune trials on a Ray cluster (`--ray [ADDRESS]`).

Each trial is a Ray actor of its own, placed by Ray's scheduler on one node
that has what the trial's preset needs: on a cluster with GPUs, a placement
group of one bundle of tp x pp x dp-local GPUs (STRICT_PACK: one node; Ray
sets the actor's CUDA_VISIBLE_DEVICES and the trial hands them to its server
as `--gpus` trials do); on a CPU cluster, one CPU or the resources given
with `--ray-resources` (say {"trial_slot": 1} per node: one trial a node).
The actor runs the same code a local trial runs (sweep._run_one: preflight,
server start, the load on the same node, stop), streams the trial's events
back (the driver drains them every half second), and returns the row, the
run records it saved and its server's log, which the driver files in its
own run store and log dir: a record has the same form as a local one.

The search itself stays with the driver (tune's study, the sweep's table).
Two things never leave one host: the paired confirmation and the duels
(they run on the driver's machine, as without --ray).

A node lost mid-trial (its raylet gone, the machine down): the actor dies
with it, the driver waits until Ray marks the node dead and runs the trial
again elsewhere, its row marked `retried_after_node_loss`. The server the
lost actor started is killed by the actor's orphan guard (orphan_guard.py),
a process of its own that outlives the actor.

Each trial's actor is named (ray_status.TRIAL_ACTOR_PREFIX) and tells what
it measures, on which node, its server's URL and what it does now
(TrialActor.status): snapshot() reads them with the cluster's nodes, for the
tune screen and the fleet view (any process joined to the cluster can).

Ray is imported only here, and only when --ray is given (an optional extra).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ernie_tui import paths
from ernie_tui.engine_ctl.control.ray_status import (
    TRIAL_ACTOR_PREFIX,
    RaySnapshot,
    build_snapshot,
    node_label,
    phase_of,
    resources_text,
)
from ernie_tui.engine_ctl.control.resources import ResourceSampler
from ernie_tui.engine_ctl.control.sweep import (
    CapacitySweep,
    Progress,
    SweepOptions,
    SweepPlan,
    SweepRun,
    _emit,
    _run_one,
    _trial_port,
    _TrialEnv,
)
from ernie_tui.engine_ctl.launch import gpus_needed
from ernie_tui.engine_ctl.load import BurstConfig
from ernie_tui.presets.model import Preset

log = logging.getLogger(__name__)

INSTALL_HINT = "--ray needs Ray: pip install 'ernie-tui[ray]' (or pip install 'ray[default]>=2.40')"
# How often the driver drains a trial's events, and how long it waits for Ray
# to say whether the node of an actor that died is gone.
POLL_S = 0.5
NODE_DEATH_WAIT_S = 60.0
LOG_TAIL_BYTES = 8 << 20  # a server log sent back is cut to its last 8 MiB
GUARD = Path(__file__).with_name("orphan_guard.py")
CONNECT_TIMEOUT_S = 5.0  # a head whose port does not answer in this long is not there
STATUS_WAIT_S = 2.0  # a snapshot waits this long for the trial actors' answers (a busy node's come next time)


class RayTrialsError(Exception):
    """--ray cannot be used as asked; the message is for humans."""


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayTrialsError(INSTALL_HINT) from None
    return ray


def parse_resources(text: str | None) -> dict[str, float]:
    """--ray-resources '{"trial_slot": 1}' (JSON) -> what each trial reserves besides GPUs."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RayTrialsError(f"--ray-resources takes JSON like '{{\"trial_slot\": 1}}': {exc}") from None
    if not isinstance(data, dict) or not data or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for k, v in data.items()):
        raise RayTrialsError(f"--ray-resources takes a JSON object of positive amounts, like "
                             f"'{{\"trial_slot\": 1}}'; got {text!r}")
    return {k: float(v) for k, v in data.items()}


@dataclass
class RayTrials:
    """The driver's side: connected to a cluster, runs trials there.
    `address`: ray://, host:port, or None for RAY_ADDRESS / the cluster
    started on this machine ("auto"). `resources`: what each trial
    reserves besides GPUs (None: one CPU)."""

    address: str | None = None
    resources: dict[str, float] | None = None
    max_node_losses: int = 2
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ports: set[int] = field(default_factory=set, init=False, repr=False)
    _gpus: bool = field(default=False, init=False)
    # This command, as its trials' actors name it (the fleet view tells drivers apart by it).
    _driver: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}", init=False)

    def connect(self) -> RayTrials:
        address = self.address or os.environ.get("RAY_ADDRESS") or ""
        if address.split(":")[0] in ("127.0.0.1", "localhost") and "ray" not in sys.modules:
            # A cluster on loopback: Ray would swap 127.0.0.1 for this host's
            # outward address (found by a UDP "connect" to a public IP), where
            # nodes started with --node-ip-address 127.0.0.1 do not listen.
            # Ray reads this switch once, at import: it keeps the address loopback.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray = require_ray()
        if not ray.is_initialized():
            _answers(self.address or os.environ.get("RAY_ADDRESS") or "")
            try:
                # log_to_driver off: the trials' own output goes to their
                # logs, not over the driver's answer or its screen.
                ray.init(address=self.address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False,
                         namespace="ernie-tui", logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = self.address or os.environ.get("RAY_ADDRESS") or "on this machine (auto)"
                raise RayTrialsError(f"no Ray cluster to join at {where}: {exc}; start one with `ray start "
                                     "--head` or pass --ray HOST:PORT") from None
        self._gpus = ray.cluster_resources().get("GPU", 0) > 0
        return self

    def need(self, preset: Preset) -> dict[str, float]:
        """What one trial of `preset` reserves on its node."""
        if self._gpus:
            return {"GPU": float(gpus_needed(preset)), **(self.resources or {})}
        return dict(self.resources or {"CPU": 1.0})

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes: id, address, resources."""
        ray = require_ray()
        return [{"id": n["NodeID"], "ip": n.get("NodeManagerAddress"), "resources": n.get("Resources", {})}
                for n in ray.nodes() if n.get("Alive")]

    def slots(self, preset: Preset) -> int:
        """How many trials of `preset` the live nodes hold at once (each on one node)."""
        need = self.need(preset)
        return sum(min(int(n["resources"].get(k, 0.0) // v) for k, v in need.items()) for n in self.nodes())

    def snapshot(self) -> RaySnapshot:
        """The cluster now: every node it knows (a lost one as lost) and each
        trial running on it (this command's and any other's), as their
        actors tell it. Never raises: a cluster that cannot be asked is a
        snapshot with its error."""
        where = self.address or os.environ.get("RAY_ADDRESS") or "auto"
        try:
            ray = require_ray()
            where = ray.get_runtime_context().gcs_address or where
            nodes = ray.nodes()
            statuses = _trial_statuses(ray)
        except Exception as exc:  # noqa: BLE001  a screen shows it; the trials go on
            return RaySnapshot(where, error=f"{type(exc).__name__}: {exc}")
        return build_snapshot(where, nodes, statuses)

    def check(self, presets: list[Preset]) -> None:
        """Refuse, before anything starts, a preset no node can hold."""
        for p in presets:
            if self.slots(p) < 1:
                have = "; ".join(f"{n['ip']}: {resources_text(n['resources'])}" for n in self.nodes()) or "none"
                raise RayTrialsError(f"no node of the Ray cluster has what a trial of {p.name} needs "
                                     f"({resources_text(self.need(p))}); the nodes have: {have}")

    # -- a sweep's trials ----------------------------------------------------------

    def run_sweep(self, plan: SweepPlan, burst_config: BurstConfig, options: SweepOptions,
                  progress: Progress | None, cancel: threading.Event,
                  capacity: CapacitySweep | None) -> list[SweepRun]:
        """Every trial of the plan on the cluster, as many at once as the
        nodes hold (Ray queues the rest); the runs in plan order (those
        started before a cancel)."""
        order = plan.order()
        total = len(order)
        emit_lock = threading.Lock()

        def emit(event: dict[str, Any]) -> None:
            with emit_lock:
                _emit(progress, **event)

        def one(index: int, repeat: int, preset: Preset) -> SweepRun | None:
            if cancel.is_set():
                return None
            with self._lock:
                port = _trial_port(preset, self._ports)
                self._ports.add(port)
            try:
                emit(dict(preset=preset.name, repeat=repeat, index=index, total=total, phase="preflight", port=port))
                try:
                    run = self.run_trial(replace(preset, port=port), repeat, index, total, burst_config, options,
                                         capacity, emit, cancel)
                except Exception as exc:  # noqa: BLE001  one trial's surprise must not stop the others; its row says it
                    log.exception("ray trial %s failed", preset.name)
                    run = SweepRun(preset=preset.name, repeat=repeat, status="failed: error",
                                   message=f"{type(exc).__name__}: {exc}", key_args=preset.key_args(),
                                   mode="capacity" if capacity is not None else "burst", port=port)
            finally:
                with self._lock:
                    self._ports.discard(port)
            emit(dict(preset=preset.name, repeat=repeat, index=index, total=total, phase="done", status=run.status,
                      run=run))
            return run

        width = max(1, min(total, max((self.slots(p) for _, p in order), default=1)))
        with ThreadPoolExecutor(width, thread_name_prefix="ray-trial") as pool:
            futures = [pool.submit(one, i, r, p) for i, (r, p) in enumerate(order)]
            runs = [f.result() for f in futures]
        return [r for r in runs if r is not None]

    # -- one trial -----------------------------------------------------------------

    def run_trial(self, preset: Preset, repeat: int, index: int, total: int, burst_config: BurstConfig,
                  options: SweepOptions, capacity: CapacitySweep | None, emit: Progress,
                  cancel: threading.Event) -> SweepRun:
        """One trial on one node; again on another when its node is lost
        (at most max_node_losses times)."""
        losses: list[str] = []
        sent = replace(options, ray=None, log_dir=None, gpus_per_trial=None, gpu_ids=None)
        while True:
            outcome = self._attempt(preset, repeat, index, total, burst_config, sent, capacity, emit, cancel,
                                    losses)
            if outcome.get("lost") is None:
                break
            losses.append(outcome["lost"])
            if len(losses) > self.max_node_losses or cancel.is_set():
                return SweepRun(preset=preset.name, repeat=repeat, status="failed: node_lost",
                                message="ray: node lost mid-trial " + ", then ".join(losses),
                                key_args=preset.key_args(), mode="capacity" if capacity is not None else "burst",
                                retried_after_node_loss=len(losses) > 1, node=outcome["lost"])
            emit(dict(preset=preset.name, repeat=repeat, index=index, total=total,
                      phase=f"node {outcome['lost']} lost: running the trial again on another node"))
        run: SweepRun = outcome["run"]
        run.node = outcome.get("node")
        run.retried_after_node_loss = bool(losses)
        if losses:
            run.message = (run.message + "; " if run.message else "") + "ran again after node " + ", ".join(losses)
        self._file(outcome, options.log_dir, preset.name, repeat)
        return run

    def _attempt(self, preset: Preset, repeat: int, index: int, total: int, burst_config: BurstConfig,
                 options: SweepOptions, capacity: CapacitySweep | None, emit: Progress,
                 cancel: threading.Event, lost: list[str]) -> dict[str, Any]:
        """One placement of the trial: {"run", "records", "log", "node"}, or
        {"lost": node} when its node died under it. `lost`: the nodes lost
        under it before (its actor tells a snapshot it runs again)."""
        ray = require_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        need = self.need(preset)
        pg = placement_group([need], strategy="STRICT_PACK", name=f"ernie-tui {preset.name} r{repeat}")
        actor = None
        node: str | None = None
        try:
            waiting = pg.ready()
            while not ray.wait([waiting], timeout=POLL_S)[0]:  # Ray's scheduler queues it until a node has room
                if cancel.is_set():
                    return {"run": _cancelled(preset, repeat, capacity), "records": [], "log": "", "node": None}
            other = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
            # Named, so that any process joined to the cluster finds it (ray_status.py).
            actor = _actor_class(ray).options(
                num_cpus=need.get("CPU", 0.0), num_gpus=need.get("GPU", 0.0), resources=other or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
                max_restarts=0, max_task_retries=0,
                name=f"{TRIAL_ACTOR_PREFIX}{self._driver}/{uuid.uuid4().hex[:12]}").remote(
                    {"trial": preset.name, "repeat": repeat, "lost": list(lost), "driver": self._driver})
            try:
                where = ray.get(actor.where.remote())
                node = where["node"]
                named = node_label(where["ip"], node)
                result = actor.run.remote(preset, repeat, index, total, burst_config, options, capacity)
                told = False
                while True:
                    done = ray.wait([result], timeout=POLL_S)[0]
                    for event in ray.get(actor.drain.remote()):
                        emit({**event, "node": named})
                    if cancel.is_set() and not told:
                        actor.stop.remote()
                        told = True
                    if done:
                        outcome = ray.get(result)
                        return {**outcome, "node": named}
            except ray.exceptions.RayActorError as exc:
                if node is not None and self._node_died(node):
                    return {"lost": named}
                raise RuntimeError(f"the trial's Ray actor died: {exc}") from None
        finally:
            if actor is not None:
                ray.kill(actor)  # its orphan guard then finds the server stopped (or stops it)
            remove_placement_group(pg)

    def _node_died(self, node_id: str) -> bool:
        """Whether Ray marks the node dead (waits for its health check to say so)."""
        ray = require_ray()
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while time.monotonic() < deadline:
            states = {n["NodeID"]: n.get("Alive") for n in ray.nodes()}
            if not states.get(node_id, False):
                return True
            time.sleep(1.0)
        return False

    def _file(self, outcome: dict[str, Any], log_dir: Path | None, name: str, repeat: int) -> None:
        """The trial's run records into this machine's run store (same ids:
        the row's record_id finds them), its server log into the log dir."""
        for record in outcome.get("records") or []:
            paths.write_private_text(paths.runs_dir() / f"{record['id']}.json",
                                     json.dumps(record, indent=1, ensure_ascii=False))
        if log_dir is not None and outcome.get("log"):
            paths.private_dir(log_dir)
            paths.write_private_text(log_dir / f"{name}-r{repeat}.log", outcome["log"])


def _answers(address: str) -> None:
    """RayTrialsError when nothing listens at a HOST:PORT address: ray.init
    would retry such a one for minutes, a warning every few seconds."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return  # ray://, "auto" or the cluster started here: Ray finds it, or says why
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RayTrialsError(f"no Ray cluster to join at {address}: nothing answers there ({exc}); start one "
                             "with `ray start --head` or pass --ray HOST:PORT of its head") from None


def _trial_statuses(ray: Any) -> list[dict[str, Any]]:
    """What each trial actor on the cluster says of itself (TrialActor.status);
    one that ended or does not answer in STATUS_WAIT_S is left out."""
    actors = []
    for name in ray.util.list_named_actors():
        if not name.startswith(TRIAL_ACTOR_PREFIX):
            continue
        try:
            actors.append(ray.get_actor(name))
        except ValueError:  # ended since it was listed
            continue
    refs = [a.status.remote() for a in actors]
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=STATUS_WAIT_S)
    out = []
    for ref in ready:
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError:  # its actor died (its node lost, or it was killed as it ended)
            continue
    return out


def _cancelled(preset: Preset, repeat: int, capacity: CapacitySweep | None) -> SweepRun:
    return SweepRun(preset=preset.name, repeat=repeat, status="cancelled", message="cancelled before it was placed",
                    key_args=preset.key_args(), mode="capacity" if capacity is not None else "burst")


_ACTOR: Any = None


def _actor_class(ray: Any) -> Any:
    """TrialActor as a Ray actor class (made once, when Ray is there).
    Threaded: drain() and stop() answer while run() measures."""
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = ray.remote(max_concurrency=4)(TrialActor)
    return _ACTOR


# -- the node's side ------------------------------------------------------------------

class TrialActor:
    """One trial on the node Ray placed it on (see the module's doc)."""

    def __init__(self, about: dict[str, Any] | None = None) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        # What status() tells: the trial, the nodes it lost before, its driver;
        # then its server's URL and what it does now.
        self._about = dict(about or {})
        self._url: str | None = None
        self._phase = "placed"
        # The guard outlives this process: a node lost takes the actor down
        # with no cleanup, and the server it started must not serve on.
        subprocess.run([sys.executable, str(GUARD), "--detach", str(os.getpid())], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def status(self) -> dict[str, Any]:
        """This trial as a snapshot lists it (ray_status.build_snapshot)."""
        where = self.where()
        with self._lock:
            return {**self._about, "node": node_label(where["ip"], where["node"]), "url": self._url,
                    "phase": self._phase}

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def stop(self) -> None:
        self._cancel.set()

    def _progress(self, event: dict[str, Any]) -> None:
        phase = phase_of(event)
        with self._lock:
            self._events.append({k: v for k, v in event.items() if k != "run"})
            if phase is not None:
                self._phase = phase

    def run(self, preset: Preset, repeat: int, index: int, total: int, burst_config: BurstConfig,
            options: SweepOptions, capacity: CapacitySweep | None) -> dict[str, Any]:
        """The trial as a local one runs, in a home of its own on this node
        (its records and log are sent back, then the home removed)."""
        import ray

        home = Path(tempfile.mkdtemp(prefix="ernie-ray-trial-"))
        os.environ["ERNIE_TUI_HOME"] = str(home)  # one trial per actor process: its records land here
        log_dir = home / "logs"
        gpus = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
        trial = None
        if gpus:  # as a --gpus trial: its CUDA_VISIBLE_DEVICES and port in the row
            trial = _TrialEnv(gpus=tuple(gpus), port=_trial_port(preset, set()), settle=lambda: None)
        else:
            preset = replace(preset, port=_trial_port(preset, set()))
        host = preset.host if preset.host not in ("", "0.0.0.0", "::") else ray.util.get_node_ip_address()
        with self._lock:
            self._url = f"http://{host}:{trial.port if trial is not None else preset.port}"
        sampler = ResourceSampler()
        try:
            run = _run_one(preset, repeat, burst_config, replace(options, log_dir=log_dir), log_dir, sampler, None,
                           self._progress, self._cancel, index, total, capacity, trial)
            records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(paths.runs_dir().glob("*.json"))]
            return {"run": run, "records": records, "log": _tail(log_dir / f"{preset.name}-r{repeat}.log")}
        finally:
            sampler.close()
            shutil.rmtree(home, ignore_errors=True)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
