"""`tune --ray` on a Ray cluster of `ray start` nodes on this one box, with
real vLLM CPU trials (#58's Ray goals), or the engine-shaped paced stand-in
to try the bench itself (`--stand paced`).

The cluster: a head (`ray start --head`, no trial slot) and worker nodes
(`ray start --address`, each `--resources '{"trial_slot": 1}'`: one trial at
a time), every node on loopback (`--node-ip-address 127.0.0.1`), each a
`ray start --block` in a process group of its own: the group is the node
(its raylet, agents and workers), so killing the group is the node lost.
With --pin (the default), worker node k's environment has
VLLM_CPU_OMP_THREADS_BIND=k-1 (mod the cores): its trials' vLLM engines run
their OpenMP threads on that core (vLLM's own "auto" binds every engine to
core 0, reserving the last core for the rest), the way two machines would
not share one. Nothing of the product is changed for this: Ray's workers
and the trials' servers inherit the node's environment. With --own-cores,
worker node k's `ray start` is also bound to core k-1 by CPU affinity before
it runs, so everything the node starts (raylet, Ray workers, the trials'
servers and load generators) runs on that core alone: nodes with resources
of their own ("two machines"), part 1's single node one core, as each of
part 2's. The head and the tune's driver stay unbound.

The parts, on one cluster, each a fresh run store (ERNIE_TUI_HOME) and study:
  1. one worker node: `ernie-tui tune BASE --space S --trials N --confirm 0
     --ray 127.0.0.1:PORT --ray-resources '{"trial_slot": 1}'`, timed;
  2. a second worker node added: the same tune, timed; the ratio to part 1,
     and the trials' server intervals (their records' server_from_to) read
     for overlap: two at a time shown, not assumed;
  3. the same tune again on the two workers; once one trial has finished
     and another is in its capacity search, the node it runs on is killed
     (SIGKILL to the node's process group: `ray start`, raylet, agents,
     workers). Then: the trial ran again on the other node and its row says
     so, every trial finished before the kill is in the answer, the killed
     trial's server went (how fast), and after the tune no vLLM (cmdline
     `vllm.entrypoints`) and no server of this bench runs.
Then the cluster is stopped: each node's `ray start --block` sent SIGTERM
(workers first; `ray stop` alone leaves those processes running), then
`ray stop` when no other Ray runs on the box (it is machine-wide), then
whatever is left killed and said. Last, a local tune (no --ray,
`--local-trials`) gives the record form each tune of parts 1-3 is compared
with (keys of the tune record, its trial rows, BASE's summary, the capacity
records, their results and engine reports).

    PYTHONPATH=src nice -n 15 .venv/bin/python bench/ray_vllm_cpu.py --stand paced
    PYTHONPATH=src .venv/bin/python bench/ray_vllm_cpu.py --stand vllm --keep /tmp/rayvllm --json out.json
    PYTHONPATH=src .venv/bin/python bench/ray_vllm_cpu.py --stand vllm --own-cores --parts 1,2 --json out.json

Every figure is printed; --json keeps them. `--deadline HH:MM` (UTC): past
it the running tune is stopped (SIGTERM: it stops its servers), the
cluster stopped, and what was seen is still printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from paced_presets import ENGINE_SHAPED, paced_preset  # noqa: E402
from vllm_support import tiny_model_dir  # noqa: E402  (the tests' tiny ERNIE-4.5-shaped model)

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI, by module: the venv's script may not run
# `ray start`, Ray's own CLI, with --node-ip-address 127.0.0.1 kept as given.
# On Linux Ray 2.60 swaps a loopback node address for the host's outward one
# (services.resolve_ip_for_localhost: the node registers, and its agents
# listen, there); the switch that keeps loopback, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# (what the tests' cluster_utils nodes run with), also makes `ray start
# --address` refuse to join a worker ("not supported on Windows and OSX").
# So the nodes run with the switch at 0 (every process Ray starts keeps
# loopback) and this one process, the CLI, is told clusters are allowed and
# to leave the given address alone.
RAY_START = [sys.executable, "-c",
             "import sys, ray._private.ray_constants as c, ray._private.services as s; "
             "c.ENABLE_RAY_CLUSTER = True; s.resolve_ip_for_localhost = lambda host: host; "
             "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()", "start"]
SLOT = '{"trial_slot": 1}'
BASE = "raycpu"
MARK_ENV = "ERNIE_BENCH_MARK"  # in each trial server's env (the preset's): this bench's servers, found by it
# A lost node is seen in seconds (the tests' setting), not Ray's default half minute.
SYSTEM_CONFIG = '{"health_check_period_ms": 1000, "health_check_failure_threshold": 3}'

# Real vLLM: the load of bench/rank_vllm_cpu.py, with short levels and a low
# ceiling, so that a trial is a server start (~50 s eager on 2 cores) and a
# few 6 s levels.
VLLM_LOAD = ["--max-tokens", "32", "--min-tokens", "30", "--max-tokens-in", "200", "--client-procs", "1",
             "--ready-timeout", "600", "--slo", "ttft_p99=2s", "--slo", "itl_p99=300ms",
             "--start-concurrency", "2", "--max-concurrency", "8", "--level-time", "6"]
VLLM_SPACE = "max_num_seqs = [2, 4, 8]\nmax_num_batched_tokens = [2048, 4096]\n"
# The stand-in: the --ray tests' fast load.
PACED_LOAD = ["--slo", "ttft_p90=100ms", "--max-tokens", "8", "--min-tokens", "10", "--max-tokens-in", "40",
              "--start-concurrency", "1", "--max-concurrency", "2", "--min-windows", "2", "--max-requests", "20",
              "--confirm-waves", "0", "--level-time", "5", "--tolerance", "0.5", "--ready-timeout", "60"]
PACED_SPACE = "max_num_seqs = [1, 2, 3]\nmax_num_batched_tokens = [2048, 4096]\n"  # BASE (2, 1024) not in it


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%H:%M:%S")


def say(text: str) -> None:
    print(f"[{now_utc()}] {text}", flush=True)


# -- the presets -----------------------------------------------------------------------

def write_presets(work: Path, stand: str, port: int, mark: str) -> tuple[Path, Path, list[str]]:
    presets = work / f"presets-{stand}.toml"
    if stand == "paced":
        presets.write_text(paced_preset(BASE, tiny_model_dir(), port, {**ENGINE_SHAPED, MARK_ENV: mark},
                                        max_num_seqs=2, max_num_batched_tokens=1024))
        space, load = PACED_SPACE, PACED_LOAD
    else:
        # cpu-demo (block 32, max_model_len 2048) with its KV cache given in
        # bytes, eager (the tests' choice: a start of ~50 s instead of ~100 s
        # on this box, torch.compile skipped), max_num_seqs 2 as BASE.
        presets.write_text(textwrap.dedent(f"""
            [presets.{BASE}]
            description = "cpu-demo, 64 MiB KV cache, block 32, eager, max_num_seqs 2: the Ray bench's BASE"
            extends = "cpu-demo"
            model = "{tiny_model_dir()}"
            port = {port}
            block_size = 32
            kv_cache_memory_bytes = "64M"
            enforce_eager = true
            max_num_seqs = 2
            env = {{ {MARK_ENV} = "{mark}" }}
        """))
        space, load = VLLM_SPACE, VLLM_LOAD
    space_file = work / f"space-{stand}.toml"
    space_file.write_text(space)
    return presets, space_file, load


# -- the cluster -----------------------------------------------------------------------

def ray_env() -> dict[str, str]:
    """The environment of the nodes: loopback kept in every process Ray starts (see RAY_START)."""
    return {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class Cluster:
    """A head and worker nodes, each a `ray start --block` in a process
    group of its own (the node: its raylet, agents and Ray workers)."""

    def __init__(self, port: int, work: Path, pin: bool, own_cores: bool = False) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.work = work
        self.pin = pin
        self.own_cores = own_cores
        self.cores: dict[str, int] = {}  # --own-cores: name -> the one core its processes may run on
        self.temp_dir = f"/tmp/ray-bench-{port}"  # short: Ray's socket paths must fit 107 bytes
        self.nodes: dict[str, subprocess.Popen] = {}  # name -> its `ray start --block`
        self.pins: dict[str, str] = {}

    def _start(self, name: str, argv: list[str], env: dict[str, str], core: int | None = None) -> None:
        log = open(self.work / f"node-{name}.log", "ab")  # noqa: SIM115  (kept open for the node's life)
        # --own-cores: the node's `ray start` is bound to its core before it runs, so its raylet, workers,
        # trials' servers and load generators (all its descendants) inherit the binding: a node with a
        # core of its own, as a machine of its own would have.
        bind = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
        self.nodes[name] = subprocess.Popen([*RAY_START, "--block", *argv], env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=bind)
        if core is not None:
            self.cores[name] = core

    def start_head(self) -> None:
        p = self.port
        self._start("head", ["--head", "--node-ip-address", "127.0.0.1", "--port", str(p),
                             "--ray-client-server-port", str(p + 1), "--dashboard-port", str(p + 2),
                             "--include-dashboard", "false", "--num-cpus", "1", "--object-store-memory", "80000000",
                             "--dashboard-agent-listen-port", str(p + 10), "--min-worker-port", str(p + 100),
                             "--max-worker-port", str(p + 199), "--disable-usage-stats", "--temp-dir", self.temp_dir,
                             "--system-config", SYSTEM_CONFIG], ray_env())
        self.wait_nodes(1)

    def add_worker(self) -> str:
        k = sum(1 for n in self.nodes if n != "head") + 1
        name = f"w{k}"
        env = ray_env()
        core = (k - 1) % (os.cpu_count() or 1)
        if self.pin or self.own_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.pins[name] = str(core)
        p = self.port
        self._start(name, ["--address", self.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                           "--resources", SLOT, "--object-store-memory", "80000000",
                           "--dashboard-agent-listen-port", str(p + 10 + 10 * k),
                           "--min-worker-port", str(p + 100 + 100 * k), "--max-worker-port", str(p + 199 + 100 * k),
                           "--disable-usage-stats", "--temp-dir", self.temp_dir], env,
                    core if self.own_cores else None)
        self.wait_nodes(len(self.nodes))
        return name

    def raylet(self, name: str) -> psutil.Process | None:
        return next((p for p in self.group(name) if _name(p) == "raylet"), None)

    def node_id(self, name: str) -> str | None:
        """The node's id, from its raylet's command line (--node_id=...)."""
        raylet = self.raylet(name)
        try:
            args = raylet.cmdline() if raylet is not None else []
        except psutil.Error:
            return None
        return next((a.split("=", 1)[1] for a in args if a.startswith("--node_id=")), None)

    def workers(self, name: str) -> list[psutil.Process]:
        """The node's Ray workers (the trials' actors among them): its
        raylet's children, each in a process group of its own."""
        raylet = self.raylet(name)
        try:
            kids = raylet.children() if raylet is not None else []
        except psutil.Error:
            kids = []
        return [p for p in kids if p.pid not in {q.pid for q in self.group(name)}]

    def wait_nodes(self, count: int, timeout: float = 180.0) -> None:
        """Until `count` raylets of this cluster run (each node has one) and each has registered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.nodes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"node {name} exited {proc.returncode}: see {self.work}/node-{name}.log")
            if all(self.node_id(n) for n in self.nodes) and len(self.nodes) >= count:
                time.sleep(3.0)  # its raylet registered with the GCS (the tune counts the live nodes)
                return
            time.sleep(1.0)
        raise RuntimeError(f"the cluster's nodes did not come up in {timeout:.0f} s")

    def group(self, name: str) -> list[psutil.Process]:
        """The processes of a node: its `ray start`'s process group."""
        pgid = self.nodes[name].pid
        out = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid:
                    out.append(proc)
            except (ProcessLookupError, psutil.Error, PermissionError):
                continue
        return out

    def name_of(self, label: str) -> str | None:
        """Which of the nodes a node label (`127.0.0.1 5f3a9c0e1b2d`) names."""
        prefix = label.split(" ", 1)[-1]
        return next((n for n in self.nodes if (self.node_id(n) or "").startswith(prefix)), None)

    def kill(self, name: str) -> list[int]:
        """The node lost: SIGKILL to its whole process group, no goodbye."""
        pids = [p.pid for p in self.group(name)]
        os.killpg(self.nodes[name].pid, signal.SIGKILL)
        self.nodes[name].wait(timeout=30)
        return pids

    def stop(self) -> dict[str, Any]:
        """Each node's `ray start --block` told to stop (SIGTERM: it stops
        its node's processes), workers first, the head last; then `ray stop`
        over the box when every Ray process on it was this cluster's (it is
        machine-wide: it would stop another's cluster too), for what is left.
        What still runs after both is killed, and said."""
        mine = {p.pid for n in self.nodes for p in self.group(n) + self.workers(n)}
        foreign = [p for p in ray_processes() if p.pid not in mine and p.pid != os.getpid()]
        out: dict[str, Any] = {"other_ray_processes": [f"{p.pid} {_cmd(p)[:100]}" for p in foreign]}
        t0 = time.monotonic()
        for name in reversed(list(self.nodes)):
            proc = self.nodes[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
        left = wait_gone(lambda: [p for n in self.nodes for p in self.group(n) + self.workers(n)], 30.0)
        out["sigterm"] = {"seconds": round(time.monotonic() - t0, 1), "left": [f"{p.pid} {_cmd(p)[:80]}" for p in left]}
        how = "SIGTERM to each node's `ray start --block`"
        if not foreign:
            done = subprocess.run([*RAY, "stop", "--grace-period", "30"], capture_output=True, text=True,
                                  timeout=120, check=False)
            said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1:] or [""]
            out["ray_stop"] = f"exit {done.returncode}: {said[0][-160:]}"
            how += f", then ray stop ({out['ray_stop']})"
        else:
            how += f"; no `ray stop`: {len(foreign)} other Ray processes on the box"
        killed = []
        for proc in self.nodes.values():
            if proc.poll() is None:
                killed.append(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        left = wait_gone(lambda: [p for n in self.nodes for p in self.group(n) + self.workers(n)], 10.0)
        rest = [f"{p.pid} {_cmd(p)[:100]}" for p in ray_processes() if p.pid not in {q.pid for q in foreign}]
        out.update(how=how, seconds=round(time.monotonic() - t0, 1), killed_after=killed,
                   left_in_groups=[p.pid for p in left], ray_processes_left=rest)
        return out


def ray_processes() -> list[psutil.Process]:
    """Ray's processes on the box (any cluster's)."""
    out = []
    for proc in psutil.process_iter():
        try:
            name, cmd = proc.name(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if name in ("raylet", "gcs_server") or cmd.startswith("ray::") or "/site-packages/ray/" in cmd \
                or "ray.scripts.scripts" in cmd or "ray.util.client.server" in cmd:
            out.append(proc)
    return out


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def wait_gone(listing: Any, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = listing()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = listing()
    return left


# -- servers ---------------------------------------------------------------------------

def servers(mark: str) -> list[psutil.Process]:
    """This bench's trial servers still running (by the mark in their env)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK_ENV) == mark:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def vllm_processes() -> list[tuple[int, str]]:
    """Every process on the box whose command line runs vLLM's server (anyone's)."""
    out = []
    for proc in psutil.process_iter():
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "vllm.entrypoints" in cmd:
            out.append((proc.pid, cmd[:120]))
    return out


class CpuWatch:
    """Each core's busy % and the load average, every 2 s, while a part runs;
    with `mark`, also the cores this bench's trial servers were allowed (their
    CPU affinity: what --own-cores bound them to is seen, not assumed)."""

    def __init__(self, mark: str | None = None) -> None:
        self.samples: list[list[float]] = []
        self.loads: list[float] = []
        self.mark = mark
        self.affinities: set[tuple[int, ...]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        psutil.cpu_percent(percpu=True)
        while not self._stop.wait(2.0):
            self.samples.append(psutil.cpu_percent(percpu=True))
            self.loads.append(os.getloadavg()[0])
            for proc in servers(self.mark) if self.mark else []:
                try:
                    self.affinities.add(tuple(sorted(proc.cpu_affinity())))
                except psutil.Error:
                    continue

    def __enter__(self) -> CpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        cores = len(self.samples[0])
        mean = [round(sum(s[c] for s in self.samples) / len(self.samples), 1) for c in range(cores)]
        return {"core_busy_pct_mean": mean, "load1_min": min(self.loads), "load1_max": max(self.loads),
                "load1_mean": round(sum(self.loads) / len(self.loads), 2),
                "server_affinities": sorted(list(a) for a in self.affinities)}


# -- one tune --------------------------------------------------------------------------

class Tune:
    """`ernie-tui tune` as a process of its own, its stderr followed."""

    def __init__(self, label: str, work: Path, base_argv: list[str], ray: str | None) -> None:
        self.label = label
        self.home = work / f"home-{label}"
        self.logs = work / f"logs-{label}"
        self.argv = [*base_argv, "--log-dir", str(self.logs), "--fresh"]
        if ray is not None:
            self.argv += ["--ray", ray, "--ray-resources", SLOT]
        self.lines: list[tuple[float, str]] = []
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.wall: float | None = None

    def start(self) -> None:
        env = {**os.environ, "ERNIE_TUI_HOME": str(self.home), "PYTHONPATH": str(ROOT / "src")}
        say(f"{self.label}: $ ernie-tui {' '.join(self.argv)}")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "ernie_tui", *self.argv], env=env, cwd=ROOT,
                                     stdin=subprocess.DEVNULL, stdout=open(self.home.parent / f"{self.label}.out", "w"),  # noqa: SIM115
                                     stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.home.parent / f"{self.label}.err", "w") as keep:
            for line in self.proc.stderr:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                keep.write(line)
                keep.flush()
                if not line.startswith("  concurrency"):
                    print(f"    {self.label} | {line.rstrip()}", flush=True)

    def finished_trials(self) -> list[int]:
        """Trial numbers measured so far, by their trial_done line (`trial N PRESET ...: X tok/s  (best ...`)."""
        out = []
        for _t, line in self.lines:
            m = re.match(rf"trial (\d+) {BASE}-tune-\d+ [^:]*: [\d,.]+ tok/s  \(", line)
            if m:
                out.append(int(m.group(1)))
        return out

    def wait(self, deadline: float | None) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            say(f"{self.label}: past the deadline: SIGTERM to the tune (it stops its servers)")
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        self.wall = time.monotonic() - self.t0
        return code

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """This tune's run records (the files: every key), by kind, oldest first."""
        out: dict[str, list[dict[str, Any]]] = {}
        for path in sorted((self.home / "data" / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime):
            rec = json.loads(path.read_text(encoding="utf-8"))
            out.setdefault(rec.get("kind", "?"), []).append(rec)
        return out

    def tune_record(self) -> dict[str, Any] | None:
        tunes = self.records().get("tune") or []
        return tunes[-1] if tunes else None


def form(records: dict[str, list[dict[str, Any]]]) -> dict[str, set[str]]:
    """The record's form: its keys at each level a reader reads."""
    tune = (records.get("tune") or [{}])[-1]
    res = tune.get("results") or {}
    caps = records.get("capacity") or []
    return {"tune record": set(tune), "tune results": set(res),
            "trial row": set().union(*(set(r) for r in res.get("trials") or [{}])),
            "BASE summary": set(res.get("base_summary") or {}),
            "capacity record": set().union(*(set(c) for c in caps)) if caps else set(),
            "capacity results": set().union(*(set(c.get("results") or {}) for c in caps)) if caps else set(),
            "engine report": set().union(*(set(c.get("engine_report") or {}) for c in caps)) if caps else set()}


def compare_form(label: str, seen: dict[str, set[str]], local: dict[str, set[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level, keys in local.items():
        mine = seen.get(level, set())
        out[level] = {"missing": sorted(keys - mine), "extra": sorted(mine - keys), "keys": len(keys)}
        same = "same keys" if keys == mine else f"missing {sorted(keys - mine)}, extra {sorted(mine - keys)}"
        print(f"  form, {label} vs local, {level}: {same} ({len(mine)} of {len(keys)})")
    return out


def intervals(res: dict[str, Any]) -> list[tuple[str, float, float, str | None]]:
    """(who, server up, server down, node) for BASE and each measured trial."""
    out = []
    base = res.get("base_summary") or {}
    if base.get("server_from_to"):
        out.append(("BASE", *base["server_from_to"], base.get("node")))
    for r in res.get("trials") or []:
        if r.get("server_from_to"):
            out.append((f"trial {r['number']}", *r["server_from_to"], r.get("node")))
    return sorted(out, key=lambda x: x[1])


def overlap(spans: list[tuple[str, float, float, str | None]]) -> dict[str, Any]:
    """How many servers were up at once, and for how long two were."""
    edges = sorted([(a, 1) for _, a, _, _ in spans] + [(b, -1) for _, _, b, _ in spans])
    up, most, two_s, last = 0, 0, 0.0, None
    for t, d in edges:
        if last is not None and up >= 2:
            two_s += t - last
        up += d
        most = max(most, up)
        last = t
    pairs = [(x[0], y[0]) for i, x in enumerate(spans) for y in spans[i + 1:] if x[1] < y[2] and y[1] < x[2]]
    return {"most_at_once": most, "seconds_two_or_more_up": round(two_s, 1), "overlapping_pairs": pairs}


def summarise(label: str, tune: Tune, code: int) -> dict[str, Any]:
    rec = tune.tune_record()
    out: dict[str, Any] = {"label": label, "exit": code, "wall_s": round(tune.wall or 0.0, 1)}
    if rec is None:
        print(f"  {label}: no tune record")
        return out
    res = rec["results"]
    t0 = min([s[1] for s in intervals(res)] or [0.0])
    print(f"  {label}: exit {code}, wall {tune.wall:.1f} s; stopped: {res.get('stopped')}; "
          f"measured {res.get('measured_trials')}")
    base = res.get("base_summary") or {}
    print(f"    BASE: goodput {base.get('goodput')} capacity {base.get('capacity')} {base.get('seconds')} s "
          f"node {base.get('node')}")
    for r in res.get("trials") or []:
        ft = r.get("server_from_to") or [None, None]
        span = "" if ft[0] is None else f" server up {ft[0] - t0:6.1f}..{ft[1] - t0:6.1f} s"
        print(f"    trial {r['number']} {r['params']} {r['outcome']} goodput {r.get('goodput')} capacity "
              f"{r.get('capacity')} {r.get('seconds')} s node {r.get('node')} retried "
              f"{r.get('retried_after_node_loss')}{span}")
    ov = overlap(intervals(res))
    print(f"    servers at once: at most {ov['most_at_once']}; two or more up for {ov['seconds_two_or_more_up']} s; "
          f"overlapping pairs {ov['overlapping_pairs']}")
    nodes = sorted({r.get("node") for r in res.get("trials") or [] if r.get("node")})
    out.update(stopped=res.get("stopped"), measured=res.get("measured_trials"), base=base,
               trials=res.get("trials"), overlap=ov, nodes=nodes,
               trial_seconds=[r.get("seconds") for r in res.get("trials") or []],
               searches=searches(tune.records().get("capacity") or []), binds=engine_binds(tune.logs))
    for name, one in out["searches"].items():
        print(f"    search {name}: {one}")
    if out["binds"]:
        print(f"    vLLM engine OpenMP binding by trial log: {out['binds']}")
    return out


def searches(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each capacity record: its server's URL, the search's own seconds, the
    engine's start as vLLM's log told it (the engine report; None for the stand-in)."""
    out = {}
    for rec in records:
        res, eng = rec.get("results") or {}, rec.get("engine_report") or {}
        out[str((rec.get("preset") or {}).get("name", rec.get("id")))] = {
            "url": rec.get("url"), "search_s": None if res.get("seconds") is None else round(res["seconds"], 1),
            "levels": len(res.get("levels") or []), "stop": res.get("stop_reason"),
            "init_engine_s": eng.get("init_engine_seconds"), "weights_load_s": eng.get("weights_load_seconds")}
    return out


def engine_binds(logs: Path) -> dict[str, str]:
    """Each server log's `local_rank=0, core ids=[...]` (vLLM CPU's OpenMP binding)."""
    out = {}
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        m = re.search(r"local_rank=0, core ids=(\[[^\]]*\])", log.read_text(errors="replace"))
        if m:
            out[log.stem] = m.group(1)
    return out


# -- part 3: a node killed mid-trial ---------------------------------------------------------

def kill_mid_trial(tune: Tune, cluster: Cluster, mark: str, after: int, deadline: float | None) -> dict[str, Any]:
    """Once `after` trials have finished and another trial's capacity search
    runs, the node it runs on goes (its process group, SIGKILL). What the
    cluster said meanwhile (RayTrials.snapshot, as the screens show it)."""
    from ernie_tui.engine_ctl.control import RayTrials

    trials = RayTrials(cluster.address).connect()
    seen: dict[str, Any] = {"killed": None, "snapshots": 0}
    try:
        assert tune.proc is not None
        while tune.proc.poll() is None and (deadline is None or time.time() < deadline):
            snap = trials.snapshot()
            seen["snapshots"] += 1
            if seen["killed"] is None:
                done = tune.finished_trials()
                target = next((t for t in snap.trials if t.trial.startswith(f"{BASE}-tune-") and not t.lost
                               and str(t.phase).startswith("capacity")), None)
                if len(done) >= after and target is not None:
                    name = cluster.name_of(target.node)
                    if name is None or name == "head":
                        raise RuntimeError(f"trial {target.trial} on {target.node}: not a worker of this cluster")
                    raylet = cluster.raylet(name)
                    victims = [p for p in servers(mark) if raylet is not None and _descends(p, raylet.pid)]
                    tree = {c.pid for v in victims for c in [v, *_children(v)]}
                    workers = {p.pid for p in cluster.workers(name)}
                    finished_before = sorted(done)
                    pids = cluster.kill(name)
                    say(f"killed node {name} ({target.node}: SIGKILL to its process group, {len(pids)} processes) "
                        f"while {target.trial} ran '{target.phase}'; measured before: trials {finished_before}; "
                        f"its Ray workers (own groups) {sorted(workers)}; its trial's server {sorted(tree)}")
                    seen.update(killed={"node": name, "label": target.node, "trial": target.trial,
                                        "phase": target.phase, "finished_before": finished_before,
                                        "group_pids": pids, "worker_pids": sorted(workers),
                                        "server_pids": sorted(tree), "at": time.time()})
                    if not tree:
                        say("the lost trial's server was not found before the kill")
            else:
                k = seen["killed"]
                after = round(time.time() - k["at"], 1)
                for what, pids in (("server", k["server_pids"]), ("workers", k["worker_pids"])):
                    if pids and f"{what}_gone_s" not in seen and not living(pids):
                        seen[f"{what}_gone_s"] = after
                        say(f"the lost node's {'trial server' if what == 'server' else 'Ray workers'} "
                            f"{pids}: all gone {after} s after the kill")
                for n in snap.nodes:
                    if n.label == k["label"] and not n.alive and "seen_lost_after_s" not in seen:
                        seen["seen_lost_after_s"] = round(time.time() - k["at"], 1)
                        say(f"the cluster lists {n.label} as lost ({seen['seen_lost_after_s']} s after the kill)")
                for t in snap.trials:
                    if t.trial == k["trial"] and t.lost and "again_on" not in seen:
                        seen["again_on"] = t.node
                        seen["again_after_s"] = round(time.time() - k["at"], 1)
                        say(f"{t.trial} runs again on {t.node} ({seen['again_after_s']} s after the kill), "
                            f"lost: {list(t.lost)}")
            time.sleep(1.0)
    finally:
        import ray

        ray.shutdown()
    return seen


def living(pids: list[int]) -> list[int]:
    """Those of `pids` still running (not zombies)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def _descends(proc: psutil.Process, ancestor: int) -> bool:
    """Whether `ancestor` is among the process's parents (a trial's server: raylet -> worker -> server)."""
    try:
        return any(p.pid == ancestor for p in proc.parents())
    except psutil.Error:
        return False


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def check_kill(res: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any]:
    k = seen.get("killed")
    if not k or not res.get("trials"):
        return {"held": False, "why": "no node was killed mid-trial" if not k else "no tune record"}
    rows = {r["preset"]: r for r in res["trials"]}
    by_number = {r["number"]: r for r in res["trials"]}
    row = rows.get(k["trial"], {})
    again = bool(row.get("retried_after_node_loss")) and row.get("node") not in (None, k["label"]) \
        and row.get("outcome") == "measured"
    kept = [n for n in k["finished_before"] if by_number.get(n, {}).get("outcome") == "measured"]
    out = {"trial": k["trial"], "row_outcome": row.get("outcome"), "row_retried": row.get("retried_after_node_loss"),
           "row_node": row.get("node"), "killed_node": k["label"], "ran_again_elsewhere": again,
           "finished_before_kill": k["finished_before"], "kept": kept,
           "all_finished_kept": len(kept) == len(k["finished_before"])}
    print(f"  kill: trial {k['trial']} row: outcome {row.get('outcome')}, retried_after_node_loss "
          f"{row.get('retried_after_node_loss')}, node {row.get('node')} (killed {k['label']}): "
          f"{'ran again on the other node' if again else 'NOT shown to run again elsewhere'}")
    print(f"  kill: trials finished before it {k['finished_before']}, measured in the answer {kept}")
    return out


# -- main ------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stand", choices=("paced", "vllm"), default="paced",
                    help="the trials' servers: the engine-shaped paced stand-in, or real vLLM CPU")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--kill-trials", type=int, default=None, help="--trials of part 3 (default --trials)")
    ap.add_argument("--kill-after", type=int, default=1, help="part 3: kill once this many trials have finished")
    ap.add_argument("--local-trials", type=int, default=1, help="the local tune's --trials (its record's form)")
    ap.add_argument("--local-stand", choices=("paced", "vllm"), help="the local tune's servers (default --stand)")
    ap.add_argument("--local-min-s", type=float, default=300.0,
                    help="with a --deadline closer than this after the cluster's parts, the local tune runs on "
                         "the paced stand-in (its record's form is the same)")
    ap.add_argument("--parts", default="1,2,3,local", help="which of 1,2,3,local to run (local runs last)")
    ap.add_argument("--port", type=int, default=37000, help="the head's port; nodes and servers take ports above it")
    ap.add_argument("--no-pin", action="store_true", help="leave vLLM's OpenMP binding to 'auto' on every node")
    ap.add_argument("--own-cores", action="store_true",
                    help="worker node k and everything it runs (by CPU affinity) on core k-1 alone: nodes with "
                         "resources of their own, so part 1's one node has one core, as part 2's two have")
    ap.add_argument("--deadline", help="HH:MM UTC: the running tune is stopped then, the cluster stopped")
    ap.add_argument("--keep", type=Path, help="work here (kept) instead of a new temporary folder")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()

    deadline = None
    if args.deadline:
        hh, mm = (int(x) for x in args.deadline.split(":"))
        deadline = dt.datetime.now(dt.UTC).replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    parts = args.parts.split(",")
    work = args.keep or Path(tempfile.mkdtemp(prefix="ray-vllm-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex
    presets, space, load = write_presets(work, args.stand, args.port + 500, mark)
    base_argv = ["tune", BASE, "--presets", str(presets), "--space", str(space), "--confirm", "0", "--no-preset",
                 "--seed", "0", *load]
    out: dict[str, Any] = {"stand": args.stand, "argv": sys.argv, "started_utc": now_utc(),
                           "loadavg_start": os.getloadavg(), "cpus": os.cpu_count(), "work": str(work),
                           "vllm_before": vllm_processes()}
    say(f"work folder {work}; load average {os.getloadavg()}; vLLM servers on the box now: {out['vllm_before']}")

    def dump() -> None:
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=str))

    forms: dict[str, dict[str, set[str]]] = {}
    cluster = Cluster(args.port, work, pin=not args.no_pin, own_cores=args.own_cores)
    try:
        run_cluster_parts(args, parts, cluster, base_argv, work, mark, deadline, out, forms, dump)
    finally:
        say("stopping the cluster")
        out["stop"] = cluster.stop()
        out["vllm_after_stop"] = vllm_processes()
        st = out["stop"]
        say(f"cluster stopped: {st['how']}, {st['seconds']} s; left in its nodes' groups {st['left_in_groups']}; "
            f"Ray processes left (not another's) {st['ray_processes_left']}; other Ray processes on the box "
            f"{st['other_ray_processes']}; vLLM on the box {out['vllm_after_stop']}")
        dump()
    if "local" in parts:
        lstand = args.local_stand or args.stand
        if lstand == "vllm" and deadline is not None and deadline - time.time() < args.local_min_s:
            say(f"the local tune runs on the paced stand-in: {deadline - time.time():.0f} s to the deadline")
            lstand = "paced"
        lpresets, lspace, lload = write_presets(work, lstand, args.port + 700, mark)
        tune = Tune("local", work, ["tune", BASE, "--presets", str(lpresets), "--space", str(lspace), "--confirm",
                                    "0", "--no-preset", "--seed", "0", *lload, "--trials", str(args.local_trials)],
                    None)
        tune.start()
        code = tune.wait(deadline)
        out["local"] = {**summarise("local", tune, code), "stand": lstand}
        local_form = form(tune.records())
        for label, seen in forms.items():
            out[label]["form"] = compare_form(label, seen, local_form)
    out["servers_at_end"] = [p.pid for p in servers(mark)]
    out["vllm_at_end"] = vllm_processes()
    out["loadavg_end"] = os.getloadavg()
    out["ended_utc"] = now_utc()
    say(f"at the end: this bench's servers {out['servers_at_end']}; vLLM on the box {out['vllm_at_end']}; "
        f"Ray processes on the box {[p.pid for p in ray_processes()]}; load average {out['loadavg_end']}")
    dump()


def run_cluster_parts(args: argparse.Namespace, parts: list[str], cluster: Cluster, base_argv: list[str],
                      work: Path, mark: str, deadline: float | None, out: dict[str, Any],
                      forms: dict[str, dict[str, set[str]]], dump: Any) -> None:
    """Parts 1-3 on one cluster (see the module's doc)."""
    say("starting the head (no trial slot) and one worker node (trial_slot 1)")
    t0 = time.monotonic()
    cluster.start_head()
    cluster.add_worker()
    out["cluster_start_s"] = round(time.monotonic() - t0, 1)
    out["pins"] = cluster.pins
    out["own_cores"] = cluster.cores
    say(f"cluster up in {out['cluster_start_s']} s at {cluster.address}; pins {cluster.pins}; own cores "
        f"{cluster.cores or 'no (every node may use every core)'}")
    for part, workers in (("1", 1), ("2", 2), ("3", 2)):
        if part not in parts:
            continue
        if deadline is not None and time.time() > deadline:
            say(f"part {part} not started: past the deadline")
            break
        while sum(1 for n in cluster.nodes if n != "head") < workers:
            name = cluster.add_worker()
            say(f"worker node {name} added (pin {cluster.pins.get(name)}, own core {cluster.cores.get(name)})")
        trials = args.trials if part != "3" else (args.kill_trials or args.trials)
        tune = Tune(f"part{part}", work, [*base_argv, "--trials", str(trials)], cluster.address)
        with CpuWatch(mark) as cpu:
            tune.start()
            seen = kill_mid_trial(tune, cluster, mark, args.kill_after, deadline) if part == "3" else None
            code = tune.wait(deadline)
        summary = summarise(f"part {part}", tune, code)
        summary["cpu"] = cpu.summary()
        print(f"    cores busy (mean %): {summary['cpu'].get('core_busy_pct_mean')}, load1 "
              f"{summary['cpu'].get('load1_min')}..{summary['cpu'].get('load1_max')} "
              f"(mean {summary['cpu'].get('load1_mean')}); the trial servers' allowed cores "
              f"{summary['cpu'].get('server_affinities')}")
        forms[f"part{part}"] = form(tune.records())
        left = wait_gone(lambda: servers(mark), 30.0)
        summary["servers_left"] = [p.pid for p in left]
        summary["vllm_on_box_after"] = vllm_processes()
        print(f"    after the tune: servers of this bench left {summary['servers_left']}; vLLM processes on the "
              f"box {summary['vllm_on_box_after']}")
        if seen is not None:
            summary["kill"] = {**seen, **check_kill((tune.tune_record() or {}).get("results") or {}, seen)}
        out[f"part{part}"] = summary
        dump()
    if "part1" in out and "part2" in out:
        ratio = out["part2"]["wall_s"] / out["part1"]["wall_s"]
        out["ratio_2_to_1"] = round(ratio, 3)
        say(f"wall: one node {out['part1']['wall_s']} s, two nodes {out['part2']['wall_s']} s: ratio {ratio:.3f} "
            "(goal <= 0.6)")


if __name__ == "__main__":
    main()
