"""Many vLLM servers at once: the fleet file and the fleet poller.

A fleet file names the servers (TOML)::

    [servers.gpu-a]
    url = "http://10.0.0.5:8000"
    log = "/srv/vllm/gpu-a/llm.log"   # optional: the dashboard tails it (Enter)
    preset = "seed-A"                 # optional: shown as a label
    api_key_env = "GPU_A_KEY"         # optional: the variable holding its API key

Each server is polled on its own thread with its own HTTP timeout, so a
server that hangs costs its own row a timeout and never delays the others.
Figures come from /metrics through engine_ctl.metrics (its parser, its
candidate names, its histogram quantiles); nothing here parses Prometheus
text itself. A data-parallel server labels its samples ``engine="0"``,
``engine="1"`` ...: it gets one row for the whole server and one per engine.

A server that stops answering keeps its last good figures, marked with when
it stopped answering; a server that never answered has none.
"""

from __future__ import annotations

import os
import threading
import time
import tomllib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from ernie_tui.engine_ctl.control.resources import ResourceSampler
from ernie_tui.engine_ctl.control.server import process_tree
from ernie_tui.engine_ctl.load import (
    GENERATION_TOKENS,
    ITL,
    KV_USAGE,
    METRICS_TIMEOUT_S,
    RUNNING,
    TTFT,
    WAITING,
    Histogram,
    MetricsClient,
    MetricsError,
    MetricsSnapshot,
    check_server_url,
    is_local_host,
    listening_pid,
    only_metrics,
)

# The figures a row shows. Parsing only these families keeps eight servers
# at 1 Hz cheap (a real scrape is ~50 KB, mostly other histograms).
FLEET_METRICS = (*GENERATION_TOKENS, *RUNNING, *WAITING, *KV_USAGE, *TTFT, *ITL)
# Latency percentiles are over this window: long enough to hold some
# requests at low load, short enough to show a change within a minute.
LATENCY_WINDOW_S = 60.0
DEFAULT_INTERVAL_S = 1.0
SERVER_KEYS = {"url", "log", "preset", "api_key_env"}


class FleetError(Exception):
    """A fleet file that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class FleetServer:
    name: str
    url: str
    log: str | None = None
    preset: str | None = None
    api_key_env: str | None = None

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else os.environ.get("VLLM_API_KEY")


def name_for_url(url: str) -> str:
    """A short name for a server given only by URL: host:port."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return f"{parts.hostname or url}:{parts.port or 80}"


def servers_from_urls(urls: Iterable[str], taken: Iterable[str] = ()) -> list[FleetServer]:
    names = set(taken)
    out = []
    for url in urls:
        name = base = name_for_url(url)
        n = 2
        while name in names:  # the same host:port twice (different paths): keep rows apart
            name, n = f"{base}#{n}", n + 1
        names.add(name)
        out.append(FleetServer(name=name, url=url))
    return out


def load_fleet(path: str | Path) -> list[FleetServer]:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise FleetError(f"{path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"{path}: {exc}") from exc
    table = data.get("servers")
    if not isinstance(table, dict) or not table:
        raise FleetError(f"{path}: no [servers.NAME] tables")
    out = []
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise FleetError(f"{path}: servers.{name} must be a table")
        unknown = sorted(set(entry) - SERVER_KEYS)
        if unknown:
            raise FleetError(f"{path}: servers.{name}: unknown key {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(SERVER_KEYS))})")
        url = entry.get("url")
        if not isinstance(url, str) or not url.strip():
            raise FleetError(f"{path}: servers.{name} needs url = \"http://HOST:PORT\"")
        try:
            url = check_server_url(url, f"servers.{name}.url")
        except ValueError as exc:
            raise FleetError(f"{path}: {exc}") from exc
        for key in ("log", "preset", "api_key_env"):
            if key in entry and not isinstance(entry[key], str):
                raise FleetError(f"{path}: servers.{name}.{key} must be a string")
        log = entry.get("log")
        out.append(FleetServer(name=name, url=url.strip(), log=str(Path(log).expanduser()) if log else None,
                               preset=entry.get("preset"), api_key_env=entry.get("api_key_env")))
    return out


@dataclass(frozen=True)
class FleetRow:
    """One line of the fleet table: a server, or one engine of a data-parallel
    server (`engine` set). Figures are None when unknown."""

    key: str  # unique in the table: the server name, or "name/engine N"
    server: str
    url: str
    state: str  # "connecting" | "up" | "down"
    engine: str | None = None
    engines: int = 1  # how many engines the server reported
    model: str | None = None
    preset: str | None = None
    kv_pct: float | None = None
    running: float | None = None
    waiting: float | None = None
    gen_tps: float | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    memory_bytes: int | None = None
    memory_source: str | None = None  # "gpu" (NVML, per process) | "rss" (psutil) | None: not local
    last_ok: float | None = None  # wall clock of the poll the figures come from
    down_since: float | None = None  # wall clock of the first failed poll in a row
    error: str | None = None
    reason: str | None = None  # the error in a few words: "connection refused", "HTTP 500"
    polled_at: float | None = None


@dataclass(frozen=True)
class _Point:
    mono: float
    gen_tokens: float | None
    ttft: Histogram | None
    itl: Histogram | None


class _Window:
    """Recent points of one engine (or a whole server): rates from the last
    two, latency percentiles over LATENCY_WINDOW_S."""

    def __init__(self) -> None:
        self.points: deque[_Point] = deque()

    def add(self, snap: MetricsSnapshot) -> tuple[float | None, float | None, float | None]:
        mono = snap.mono if snap.mono is not None else snap.timestamp  # as MetricsSnapshot fills it in
        point = _Point(float(mono), snap.generation_tokens, snap.histogram(TTFT), snap.histogram(ITL))
        prev = self.points[-1] if self.points else None
        if prev is not None and _went_back(prev, point):
            self.points.clear()  # the server restarted: nothing spans the restart
            prev = None
        self.points.append(point)
        while len(self.points) > 2 and point.mono - self.points[1].mono >= LATENCY_WINDOW_S:
            self.points.popleft()
        gen_tps = None
        if prev is not None and prev.gen_tokens is not None and point.gen_tokens is not None:
            gen_tps = _rate(point.gen_tokens - prev.gen_tokens, point.mono - prev.mono)
        first = self.points[0]
        return gen_tps, _p99(point.ttft, first.ttft, first is point), _p99(point.itl, first.itl, first is point)


def _went_back(prev: _Point, point: _Point) -> bool:
    if prev.gen_tokens is not None and point.gen_tokens is not None and point.gen_tokens < prev.gen_tokens:
        return True
    return any(a is not None and b is not None and b.count < a.count
               for a, b in ((prev.ttft, point.ttft), (prev.itl, point.itl)))


def _rate(delta: float, seconds: float) -> float | None:
    return delta / seconds if seconds > 0 and delta >= 0 else None


def _p99(now: Histogram | None, then: Histogram | None, same: bool) -> float | None:
    if now is None or same:
        return None  # one scrape is no window
    window = now.delta(then)
    return None if window is None else window.quantile(0.99)


def _model_of(snap: MetricsSnapshot) -> str | None:
    for name in (*RUNNING, *GENERATION_TOKENS, *KV_USAGE):
        for labels, _ in snap.samples(name):
            if labels.get("model_name"):
                return labels["model_name"]
    return None


class LocalMemory:
    """Memory of a server that runs on this machine: GPU memory of its
    process tree where NVML gives per-process figures, else the tree's RSS.
    A server elsewhere has none (`local` False): NVML only sees local GPUs."""

    PID_RECHECK_S = 30.0
    TREE_RECHECK_S = 5.0

    def __init__(self, url: str, sampler_factory: Callable | None = None):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.local = is_local_host(parts.hostname or "")
        self._factory = sampler_factory
        self._sampler: ResourceSampler | None = None
        self._pid: int | None = None
        self._pid_at = -1e9
        self._tree: list[int] = []
        self._tree_at = -1e9

    def sample(self) -> tuple[int | None, str | None]:
        if not self.local:
            return None, None
        pids = self._pids()
        if not pids:
            return None, None
        if self._sampler is None:
            self._sampler = (self._factory or ResourceSampler)(pids=lambda: self._tree)
        import psutil

        try:
            ms = self._sampler.sample()
        except (OSError, psutil.Error):  # the server's processes went away between two looks
            return None, None
        if ms.engine_bytes is None:
            return None, None  # NVML without per-process figures: a box-wide total would mislead
        return int(ms.engine_bytes), "gpu" if ms.source == "nvml" else "rss"

    def _pids(self) -> list[int]:
        import psutil

        now = time.monotonic()
        if self._pid is not None and not psutil.pid_exists(self._pid):
            self._pid, self._pid_at = None, -1e9
        if self._pid is None and now - self._pid_at >= self.PID_RECHECK_S:
            self._pid_at = now
            self._pid = listening_pid(self.port)
            self._tree_at = -1e9
        if self._pid is None:
            self._tree = []
        elif now - self._tree_at >= self.TREE_RECHECK_S:
            self._tree = [p.pid for p in process_tree(self._pid)]
            self._tree_at = now
        return self._tree

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()


class ServerPoller:
    """Polls one server and turns each scrape into rows. `ingest` and
    `failed` are the pure halves (tests feed them captured texts)."""

    def __init__(self, server: FleetServer, *, timeout: float = METRICS_TIMEOUT_S,
                 client_factory: Callable | None = None, memory: LocalMemory | None = None,
                 clock: Callable[[], float] = time.time):
        self.server = server
        self.timeout = timeout
        self._client_factory = client_factory or MetricsClient
        self._client: MetricsClient | None = None
        self.memory = memory
        self.clock = clock
        self._windows: dict[str | None, _Window] = {}
        self.rows: list[FleetRow] = []  # the last rows returned
        self._good: list[FleetRow] = []  # the rows of the last good scrape
        self._down_since: float | None = None
        self._last_kept: str | None = None  # the last scrape's figures, as text
        self._last_snap: MetricsSnapshot | None = None  # ... and parsed

    def poll(self) -> list[FleetRow]:
        if self._client is None:
            self._client = self._client_factory(self.server.url, api_key=self.server.api_key, timeout=self.timeout)
        before = time.monotonic()
        try:
            text = self._client.fetch_text()
        except MetricsError as exc:
            return self.failed(str(exc), reason=exc.reason)
        mono = (before + time.monotonic()) / 2
        return self.ingest(text, mono=mono)

    def ingest(self, text: str, mono: float | None = None, now: float | None = None) -> list[FleetRow]:
        now = self.clock() if now is None else now
        mono = time.monotonic() if mono is None else mono
        kept = only_metrics(text, FLEET_METRICS)
        if kept == self._last_kept and self._last_snap is not None:
            # An idle server answers the same figures every poll: parsing
            # them again (~1 ms, mostly histogram buckets) would be the
            # fleet's main idle cost. Same samples, this poll's time.
            snap = replace(self._last_snap, timestamp=now, mono=mono)
        else:
            snap = MetricsSnapshot.parse(kept, timestamp=now, mono=mono)
            self._last_kept, self._last_snap = kept, snap
        engines = snap.label_values("engine")
        mem, source = self.memory.sample() if self.memory is not None else (None, None)
        s = self.server
        base = FleetRow(key=s.name, server=s.name, url=s.url, state="up", engines=max(1, len(engines)),
                        model=_model_of(snap), preset=s.preset, last_ok=now, polled_at=now)
        rows = [self._figures(base, snap, None, memory_bytes=mem, memory_source=source)]
        if len(engines) > 1:
            rows += [self._figures(replace(base, key=f"{s.name}/engine {e}", engine=e), snap.where("engine", e), e)
                     for e in engines]
        self._windows = {k: w for k, w in self._windows.items() if k is None or k in engines}
        self._down_since = None
        self._good = self.rows = rows
        return rows

    def _figures(self, row: FleetRow, snap: MetricsSnapshot, engine: str | None, **extra: Any) -> FleetRow:
        gen_tps, ttft, itl = self._windows.setdefault(engine, _Window()).add(snap)
        return replace(row, kv_pct=snap.kv_cache_usage_pct, running=snap.running, waiting=snap.waiting,
                       gen_tps=gen_tps, ttft_p99_s=ttft, itl_p99_s=itl, **extra)

    def failed(self, error: str, now: float | None = None, reason: str | None = None) -> list[FleetRow]:
        now = self.clock() if now is None else now
        if self._down_since is None:
            self._down_since = now
            self._windows.clear()  # the next answer may come from a restarted server
        s = self.server
        good = self._good or [FleetRow(key=s.name, server=s.name, url=s.url, state="down", preset=s.preset)]
        self.rows = [replace(r, state="down", down_since=self._down_since, error=error, reason=reason or error,
                             polled_at=now) for r in good]
        return self.rows

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self.memory is not None:
            self.memory.close()


def connecting_rows(servers: Iterable[FleetServer]) -> list[FleetRow]:
    """What the table shows before the first poll answered."""
    return [FleetRow(key=s.name, server=s.name, url=s.url, state="connecting", preset=s.preset) for s in servers]


class FleetPoller:
    """Polls every server of a fleet, each on its own thread and timeout.

    `run(on_rows, cancelled)` blocks until `cancelled()`; each server's loop
    calls `on_rows(server_name, rows)` after every poll. A server whose poll
    hangs delays only its own next poll (by at most `timeout`)."""

    def __init__(self, servers: Iterable[FleetServer], *, interval: float = DEFAULT_INTERVAL_S,
                 timeout: float | None = None, client_factory: Callable | None = None,
                 memory: bool = True, clock: Callable[[], float] = time.time):
        self.servers = list(servers)
        self.interval = interval
        # Never wait longer than the polling period allows, nor give up on a
        # busy server too soon: vLLM answers /metrics in milliseconds.
        self.timeout = timeout if timeout is not None else max(1.0, min(METRICS_TIMEOUT_S, 2 * interval))
        self.pollers = [ServerPoller(s, timeout=self.timeout, client_factory=client_factory, clock=clock,
                                     memory=LocalMemory(s.url) if memory else None) for s in self.servers]

    def poll_once(self) -> list[FleetRow]:
        """Every server once, concurrently; rows in fleet order."""
        if not self.pollers:
            return []
        with ThreadPoolExecutor(max_workers=len(self.pollers), thread_name_prefix="fleet") as pool:
            results = list(pool.map(lambda p: p.poll(), self.pollers))
        return [row for rows in results for row in rows]

    def run(self, on_rows: Callable[[str, list[FleetRow]], object], cancelled: Callable[[], bool]) -> None:
        threads = [threading.Thread(target=self._loop, args=(p, on_rows, cancelled), daemon=True,
                                    name=f"fleet-{p.server.name}") for p in self.pollers]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        finally:
            self.close()

    def _loop(self, poller: ServerPoller, on_rows: Callable[[str, list[FleetRow]], None],
              cancelled: Callable[[], bool]) -> None:
        next_at = time.monotonic()
        while not cancelled():
            try:
                rows = poller.poll()
            except Exception as exc:  # noqa: BLE001  one server's surprise must not end its loop; its row shows it
                rows = poller.failed(f"{exc.__class__.__name__}: {exc}")
            on_rows(poller.server.name, rows)
            next_at += self.interval
            while not cancelled():
                left = next_at - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(left, 0.5))  # few wakeups; a cancel still ends the loop in 0.5 s
            if next_at < time.monotonic():
                next_at = time.monotonic()  # after a hang: poll again now, then on the period

    def close(self) -> None:
        for p in self.pollers:
            p.close()
