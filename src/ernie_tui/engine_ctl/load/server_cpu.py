"""How much CPU the serving processes used during a level, where the server runs on this machine.

On an H200 the 0.3B-shape stand-in's vLLM kept its API server and its engine
core each at a whole CPU core (100-106 %) at every concurrency from 128 to 512,
while the GPU held its full clock at 120-225 W of 700 W and was at most 58 %
busy, and the host's other 14 cores stood mostly idle (docs/lab/capacity-h200/2026-12-04-run14.md,
fourteenth run). Its capacity was set by two Python threads, not by the GPU:
the same preset on a host with other CPUs answers differently, and an operator
planning GPUs from that figure needs to know it. Each process's CPU time is
read at a level's start and end (nothing samples during the level).

A server elsewhere (another host's URL) is not read: None, and nothing said.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

import psutil

# Mean CPU over a level, as % of one core, at which a process counts as held
# at a core: vLLM's API server and engine core each run their work on one
# Python thread (the H200 run read 100-106 % for both, beside a little of
# other threads), so a level spent at >= 90 % had no time to spare.
SATURATED_PCT = 90.0
# The busiest processes kept per level (API server, engine core, workers).
KEEP = 4
# The processes whose one busy thread bounds a server when held at a core: vLLM's
# front end and its scheduler. A worker is left out of the note: on vLLM's CPU
# build it runs the model itself (88-93 % of a core at 1-8 in flight on a 2-core
# box), and busy is then its job, not a bound beside the accelerator.
SINGLE_THREADED = ("API server", "engine core")


def is_local_host(host: str) -> bool:
    """Whether `host` (a URL's host name or address) is this machine."""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    try:
        return any(a.address.split("%")[0] == host for addrs in psutil.net_if_addrs().values() for a in addrs)
    except OSError:
        return False


def _is_vllm_server(p: psutil.Process) -> bool:
    """Whether a process is one of vLLM's serving processes by its command
    line: a vllm.entrypoints module, the `vllm serve` script, or a VLLM::
    process title."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return False
    if not cmd:
        return False
    return (cmd[0].startswith("VLLM::") or any("vllm.entrypoints" in c for c in cmd)
            or (Path(cmd[0]).name == "vllm" and cmd[1:2] == ["serve"]))


def _top(pid: int, listeners: set[int]) -> int:
    """From a listening process up to the server's top one: past its
    ancestors that listen too, then past vLLM ones that do not (`vllm serve
    --api-server-count N` gives its N API servers one shared socket; the
    process above them all holds the engine core, and is the server)."""
    try:
        p = psutil.Process(pid)
        for a in p.parents():
            if a.pid in listeners or _is_vllm_server(a):
                pid = a.pid
            else:
                break
    except psutil.Error:
        pass
    return pid


def listening_pid(port: int) -> int | None:
    """The top process of the server listening on `port` here (only ones
    this user may see)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    listeners = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    if not listeners:
        return None
    return _top(min(listeners), listeners)


def server_pid(url: str) -> int | None:
    """The pid serving `url` when that is this machine and this user may see
    it, else None."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if not is_local_host(parts.hostname or ""):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return listening_pid(port)


def _what(p: psutil.Process, root: int) -> str:
    """A process's part in the server: vLLM names its children by process
    title (VLLM::EngineCore, VLLM::Worker_TP0, VLLM::APIServer_1); the
    listening one is the API server (_parts calls it the supervisor where
    API servers of their own run under it)."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        cmd = []
    title = cmd[0] if cmd else ""
    if title.startswith("VLLM::"):
        name = title.split()[0][len("VLLM::"):]
        if name.startswith("APIServer"):
            return f"API server {name[len('APIServer'):].lstrip('_')}".rstrip()
        return "engine core" if name.startswith("EngineCore") else name
    if p.pid == root:
        return "API server" if any("vllm" in c for c in cmd) else "server"
    try:
        return p.name()
    except psutil.Error:
        return "?"


def _parts(procs: Iterable[psutil.Process], root: int) -> dict[int, str]:
    """Each process's part (_what), the top one's read beside the others'."""
    whats = {p.pid: _what(p, root) for p in procs}
    # `vllm serve --api-server-count N`: the listening parent only supervises its API servers.
    if whats.get(root) == "API server" and any(_is_api_server(w) for pid, w in whats.items() if pid != root):
        whats[root] = "server supervisor"
    return whats


def server_processes(pid: int) -> dict[int, str]:
    """The server whose top process is `pid` and each of its descendants,
    with its part; empty where it cannot be read."""
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return {}
    return _parts(procs, pid)


def _is_api_server(what: str) -> bool:
    return what == "API server" or what.startswith("API server ")


def _cpu_s(p: psutil.Process) -> float | None:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


@dataclass(frozen=True)
class ProcessCpu:
    what: str  # "API server", "engine core", a worker's title, or the process's name
    pid: int
    cpu_pct: float  # mean over the level, % of one core


class ServerCpuWatch:
    """The server's processes (the listening one and its descendants) read
    at start() and at stop(): each one's CPU over that span, busiest first."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._t0 = 0.0
        self._start: list[tuple[psutil.Process, float]] = []

    def start(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        self._start = [(p, t) for p in procs if (t := _cpu_s(p)) is not None]
        self._t0 = time.monotonic()

    def stop(self) -> list[dict[str, Any]] | None:
        """Each process's mean CPU over the span, as % of one core (a
        process that ended meanwhile is left out). None: none could be read."""
        span = time.monotonic() - self._t0
        if not self._start or span <= 0:
            return None
        whats = _parts((p for p, _ in self._start), self.pid)
        out = []
        for p, t in self._start:
            now = _cpu_s(p)
            if now is not None:
                out.append(ProcessCpu(what=whats[p.pid], pid=p.pid, cpu_pct=round((now - t) / span * 100, 1)))
        out.sort(key=lambda x: -x.cpu_pct)
        return [asdict(x) for x in out[:KEEP]] or None


def cpu_bound_note(levels: Iterable[Any]) -> str | None:
    """A warning for a search whose server held its API server or engine
    core at a whole core through a level (levels: LevelResults with
    server_cpu), else None."""
    hot: list[tuple[Any, dict[str, Any]]] = []
    measured = 0
    for lv in levels:
        procs = getattr(lv, "server_cpu", None) or []
        measured += bool(procs)
        hot += [(lv, p) for p in procs
                if (p["what"] in SINGLE_THREADED or _is_api_server(p["what"])) and p["cpu_pct"] >= SATURATED_PCT]
    if not hot:
        return None
    levels_hot = {id(lv): lv for lv, _ in hot}
    lowest = min(levels_hot.values(), key=lambda lv: lv.load)
    rate = getattr(lowest, "rate", None)
    load = f"{rate:g} req/s" if rate is not None else f"concurrency {lowest.concurrency}"
    names = " and ".join(dict.fromkeys(p["what"] for _, p in hot))
    peak = max(p["cpu_pct"] for _, p in hot)
    # Which one decides the fix: vLLM runs several API servers under `vllm
    # serve`, never more than one engine core per engine. On an H200 (0.3B
    # shape, 256 in flight) four API servers cut the TTFT p99 from 1.2-2.5 s
    # to 0.4-1.1 s and left the engine core at a core and tok/s no higher.
    if any(p["what"] == "engine core" for _, p in hot):
        fix = ("more API servers (api_server_count = N, with `vllm serve` as the preset's launcher) can shorten "
               "the TTFT a busy API server adds, but the tokens/s stay where the engine core's thread holds them")
    else:
        fix = ("the engine core kept up: more API servers (api_server_count = N, with `vllm serve` as the "
               "preset's launcher) spread the API server's work")
    return (f"the server's {names} used a whole CPU core (>= {SATURATED_PCT:.0f} %, up to {peak:.0f} %) in "
            f"{len(levels_hot)} of {measured} levels, from {load}: this capacity is bound by those processes' "
            f"single threads, not by the GPU alone, and moves with this host's CPU (another host, or a busy one, "
            f"answers differently); {fix}")


__all__ = ["SATURATED_PCT", "ServerCpuWatch", "cpu_bound_note", "is_local_host", "listening_pid", "server_pid"]
