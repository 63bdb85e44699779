"""A capacity level's streams spread over child processes (a closed loop's
slots shared out, or an open loop's rate).

Why: one Python process cannot time 400-500 streams at 15-20 k tokens/s
closely enough. On an H200 behind four API servers (docs/lab/capacity-h200/2026-12-04-run18.md,
eighteenth run), with the level already on uvloop and the collector paused,
the search's loop still lagged p99 14-54 ms at concurrency 320-512 and read
ITL p99 50-73 ms where vLLM's own histogram put every level under 50: the
searches answered 352-384 below the bench client's [448, 512). Its judgements
(up to 240 ms each, in a thread) share that process's interpreter too.

So each child keeps its share of the level's slots busy (or sends its share
of the rate on its own schedule) on its own event loop (uvloop, collector
paused) and sends back, per request, when it started
and what it measured. The parent, the search, keeps the LevelMonitor, the
judgements, the /metrics sampler and the server's CPU watch, and times no
stream. The children live for the whole search (spawning one costs about a
second of imports) and are told one level at a time.

Times: a child stamps with time.perf_counter() less the parent's t0. On Linux
that is CLOCK_MONOTONIC, one clock for every process of the machine, so a
start in one child and an end in another fall on the same axis.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ernie_tui.engine_ctl.load import slo as S
from ernie_tui.engine_ctl.load.arrivals import arrival_stream
from ernie_tui.engine_ctl.load.burst import ClientHealth
from ernie_tui.engine_ctl.load.http_client import fast_loop_factory, new_async_client
from ernie_tui.engine_ctl.load.probe import stream_request
from ernie_tui.engine_ctl.load.stream_timing import ProbeRequest
from ernie_tui.engine_ctl.load.traffic_replay import RateCurve, curve_stream

# A child is a fresh interpreter (not a fork: the parent runs threads, the
# dashboard's, the /metrics sampler, the judge, whose locks a fork would copy
# mid-use; not multiprocessing's spawn either: it runs the parent's main
# script again, which a script without a __main__ guard does not survive).
# It talks over one end of a socket pair, its number in argv; everything else,
# the API key too, comes over it.
CHILD_CODE = "from ernie_tui.engine_ctl.load.level_procs import child_entry; child_entry()"
# A child asks for more prompts when fewer than this many turnovers of its slots are left.
REFILL_TURNOVERS = 2
# How long the parent waits for a child to finish its part of a level, or to start.
ANSWER_TIMEOUT_S = 60.0


def supported() -> bool:
    """A child inherits its end of the socket pair by descriptor (pass_fds): POSIX."""
    return os.name == "posix"


# `--client-procs auto`: a stream process for every this many usable cores,
# at most AUTO_MAX. On a 16-core H200 host four brought a level's loop lag
# p99 from 14-54 ms (one process, eighteenth run) to 1-4.5 ms, and its ITL
# readings to or under vLLM's own histogram (nineteenth and twentieth runs;
# two sessions, not one interleave). On 2 cores shared with the server two
# processes read no better than one (docs/lab/benchmarks/level-client-cost.md): there it stays 1.
AUTO_CORES_PER_PROC = 4
AUTO_MAX = 4


def auto_procs(cores: int | None = None, *, searches_at_once: int = 1) -> int:
    """The stream processes a search uses unless told: one per
    AUTO_CORES_PER_PROC of this process's usable cores (its share of them,
    when searches_at_once run side by side, as a parallel sweep's), 1 to
    AUTO_MAX; 1 where stream processes are not supported."""
    if not supported():
        return 1
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    return max(1, min(AUTO_MAX, cores // max(1, searches_at_once) // AUTO_CORES_PER_PROC))


def split(slots: int, procs: int) -> list[int]:
    """`slots` streams over at most `procs` children, as evenly as they go
    (no child with none)."""
    n = max(1, min(procs, slots))
    base, extra = divmod(slots, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def closed_specs(slots: int, procs: int) -> list[dict[str, Any]]:
    """A closed loop of `slots` streams, shared out over at most `procs` children."""
    return [{"slots": n, "connections": n + 2, "refill": REFILL_TURNOVERS * n, "warm_n": min(n, 64)}
            for n in split(slots, procs)]


def open_specs(rate: float, procs: int, *, connections: int, arrivals: str, seed: int,
               late_s: float, burstiness: float = 1.0, curve: RateCurve | None = None) -> list[dict[str, Any]]:
    """An open loop at `rate` req/s over `procs` children, each at rate/procs:
    Poisson arrivals at R/K each (their own seeds) add up to Poisson arrivals
    at R; evenly spaced ones are staggered by 1/R, so that together they are
    evenly spaced at R (child i: i/R later than child 0, the first send still
    at 1/R). A burstiness other than 1 (a traffic profile's) is kept by
    each child; their sum is less bursty than one such stream would be.
    A rate curve (a traffic profile's) is followed by each child at its
    share, so their sum follows it too."""
    k = max(1, procs)
    share = rate / k
    conns = max(16, math.ceil(connections / k))
    shape = None if curve is None else [curve.window_s, list(curve.rates), curve.shape]
    return [{"rate": share, "arrivals": arrivals, "seed": seed * 7919 + i, "burstiness": burstiness, "curve": shape,
             "offset_s": (i + 1 - k) / rate if arrivals == "constant" else 0.0, "late_s": late_s,
             "connections": conns, "refill": int(share * 4) + 16, "warm_n": min(conns, 64, math.ceil(share))}
            for i in range(k)]


def request_outcome(res: Any, start_s: float, end_s: float) -> S.RequestOutcome:
    """What a level keeps of one streamed request (a probe.ProbeResult), with
    when it was sent and ended on the level's clock: in the search's own
    process and in a stream process alike."""
    return S.RequestOutcome(ok=res.ok, ttft_s=res.ttft_s, latency_s=res.latency_s, itls=list(res.itls),
                            completion_tokens=res.completion_tokens, prompt_tokens=res.prompt_tokens,
                            error_kind=res.error.kind if res.error else None, start_s=start_s, end_s=end_s)


@dataclass
class ChildTotals:
    """What one child saw of its own process during a level."""

    lags: list[float]
    gc_full: int
    gc_pause_max_s: float
    cpu_s: float
    loop: str
    late_sends: int = 0  # open loop: sends more than late_s behind their time
    late_send_max_s: float = 0.0


# -- the child ---------------------------------------------------------------------

def child_entry() -> None:
    """`python -c CHILD_CODE FD`: the child's start."""
    from multiprocessing.connection import Connection

    conn = Connection(int(sys.argv[1]))
    url, model, api_key, read_timeout_s, total_timeout_s = conn.recv()
    child_main(conn, url, model, api_key, read_timeout_s, total_timeout_s)


def _read_into(conn: Any, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any], None],
               last: tuple[str, ...]) -> threading.Thread:
    """A thread that reads `conn` (blocking: the connection is never handed to
    the event loop, whose non-blocking reads would split a message) and hands
    each message to deliver() on `loop`; it ends after a message whose kind is
    in `last`, or at the end of the pipe (deliver(("gone",)))."""
    def read() -> None:
        try:
            while True:
                msg = conn.recv()
                loop.call_soon_threadsafe(deliver, msg)
                if msg[0] in last:
                    return
        except (EOFError, OSError):
            try:
                loop.call_soon_threadsafe(deliver, ("gone",))
            except RuntimeError:
                pass  # the loop is closed: nobody is listening
    t = threading.Thread(target=read, name="ernie-tui level pipe", daemon=True)
    t.start()
    return t


def child_main(conn: Any, url: str, model: str, api_key: str | None, read_timeout_s: float,
               total_timeout_s: float) -> None:
    """A child's life: levels, one at a time, until told to quit or the parent goes."""
    async def life() -> None:
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        _read_into(conn, asyncio.get_running_loop(), inbox.put_nowait, ("quit",))
        while True:
            msg = await inbox.get()
            if msg[0] in ("quit", "gone"):
                return
            if msg[0] == "level":
                if await _child_level(conn, inbox, msg[1], url, model, api_key, read_timeout_s, total_timeout_s):
                    return
    try:
        with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
            runner.run(life())
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent is gone: nothing to tell
    except BaseException:  # noqa: BLE001 - told to the parent, who raises it; printing would scribble on a TUI
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass


async def _child_level(conn: Any, inbox: asyncio.Queue[Any], spec: dict[str, Any], url: str, model: str,
                       api_key: str | None, read_timeout_s: float, total_timeout_s: float) -> bool:
    """One level's share; True when the parent said to quit (or went) meanwhile.

    spec: "slots" (closed loop: that many streams, each sending its next
    request when its last ends) or "rate" (open loop: requests sent on this
    child's arrival schedule, "arrivals" and "seed", shifted by "offset_s"),
    "connections", "refill" (ask for that many more prompts when fewer are
    left), "warm" (a 1-token request, sent on up to "warm_n" connections
    first, or None) and "requests" (the first prompts)."""
    level = _ChildLevel(conn, inbox, spec, url, model, read_timeout_s, total_timeout_s)
    return await level.run(api_key)


class _ChildLevel:
    """A child's share of one level: its connections warmed, "ready" told,
    then its streams from the parent's "go" (t0) until its "stop", and its
    totals sent back."""

    def __init__(self, conn: Any, inbox: asyncio.Queue[Any], spec: dict[str, Any], url: str, model: str,
                 read_timeout_s: float, total_timeout_s: float) -> None:
        self.conn, self.inbox, self.spec = conn, inbox, spec
        self.url, self.model = url, model
        self.read_timeout_s, self.total_timeout_s = read_timeout_s, total_timeout_s
        self.slots: int = spec.get("slots") or 0
        self.rate: float | None = spec.get("rate")
        self.refill: int = spec["refill"]
        self.queue: deque[ProbeRequest] = deque(spec["requests"])
        self.more = asyncio.Event()
        self.stop = asyncio.Event()
        self.go: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.asked = False
        self.quit_after = False
        self.health = ClientHealth()
        self.tasks: set[asyncio.Future[None]] = set()
        self.late_n, self.late_max = 0, 0.0
        self.t0 = 0.0

    async def run(self, api_key: str | None) -> bool:
        pumping = asyncio.ensure_future(self.pump())
        try:
            async with new_async_client(api_key, self.read_timeout_s,
                                        max_connections=self.spec["connections"]) as client:
                await self.warm_up(client)
                self.conn.send(("ready",))
                try:
                    self.t0 = await self.go
                except asyncio.CancelledError:
                    if not self.stop.is_set():
                        raise
                    self.conn.send(("end", ChildTotals([], 0, 0.0, 0.0, _loop_name())))
                    return self.quit_after
                await self.stream_until_stopped(client)
                return self.quit_after
        finally:
            pumping.cancel()

    async def pump(self) -> None:
        """The parent's messages while the level runs: go, more prompts, stop."""
        while True:
            msg = await self.inbox.get()
            if msg[0] == "go" and not self.go.done():
                self.go.set_result(msg[1])
            elif msg[0] == "more":
                self.queue.extend(msg[1])
                self.asked = False
                self.more.set()
            elif msg[0] in ("stop", "quit", "gone"):
                self.quit_after = self.quit_after or msg[0] != "stop"
                self.stop.set()
                if not self.go.done():
                    self.go.cancel()

    async def warm_up(self, client: Any) -> None:
        warm = self.spec.get("warm")
        if warm is not None:
            # This child's connections opened before the level, so their
            # set-up is not billed to its first TTFTs (the in-process
            # level does the same with its own client).
            await asyncio.gather(*(stream_request(client, self.url, warm, self.model,
                                                  read_timeout=self.read_timeout_s,
                                                  total_timeout=self.total_timeout_s)
                                   for _ in range(self.spec["warm_n"])))

    async def stream_until_stopped(self, client: Any) -> None:
        health = self.health
        health.start(freeze=True, pause_collector=True)
        cpu0 = time.process_time()
        lag_task = asyncio.ensure_future(health.watch_loop())
        if self.rate is None:
            self.tasks.update(asyncio.ensure_future(self.worker(client)) for _ in range(self.slots))
        else:
            self.tasks.add(asyncio.ensure_future(self.sender(client)))
        try:
            await self.stop.wait()
        finally:
            # In flight at the stop: a window not counted, cancelled (vLLM
            # aborts it) rather than drained at a lighter load, as in-process.
            out = list(self.tasks)
            for t in out:
                t.cancel()
            await asyncio.gather(*out, return_exceptions=True)
            lag_task.cancel()
            await asyncio.gather(lag_task, return_exceptions=True)
            health.stop()
        self.conn.send(("end", ChildTotals(health.lags, health.gc_count[2], health.gc_pause_max_s,
                                           time.process_time() - cpu0, _loop_name(), self.late_n, self.late_max)))

    async def one(self, client: Any) -> None:
        while not self.queue:
            self.more.clear()
            await self.more.wait()
        request = self.queue.popleft()
        if not self.asked and len(self.queue) < self.refill:
            self.asked = True
            self.conn.send(("more", self.refill))
        t_s = time.perf_counter() - self.t0
        self.conn.send(("s", t_s))
        res = await stream_request(client, self.url, request, self.model, read_timeout=self.read_timeout_s,
                                   total_timeout=self.total_timeout_s)
        self.conn.send(("o", request_outcome(res, t_s, time.perf_counter() - self.t0)))

    async def worker(self, client: Any) -> None:  # closed loop: one slot
        while not self.stop.is_set():
            await self.one(client)

    async def sender(self, client: Any) -> None:  # open loop: on schedule, whatever is still out
        spec, rate = self.spec, self.rate
        assert rate is not None
        curve = spec.get("curve")
        stream = curve_stream(RateCurve(curve[0], tuple(curve[1]), curve[2]), rate, seed=spec["seed"]) \
            if curve else arrival_stream(rate, spec["arrivals"], seed=spec["seed"],
                                         burstiness=spec.get("burstiness", 1.0))
        for due in stream:
            due += spec["offset_s"]
            delay = due - (time.perf_counter() - self.t0)
            if delay > 0:
                await asyncio.sleep(delay)  # (cancelled at the stop)
            lag = (time.perf_counter() - self.t0) - due
            if lag > spec["late_s"]:
                self.late_n += 1
                self.late_max = max(self.late_max, lag)
            t = asyncio.ensure_future(self.one(client))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)


def _loop_name() -> str:
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


# -- the parent's side -------------------------------------------------------------

class ChildFailed(RuntimeError):
    """A child process died or raised; its traceback, where it sent one, is the message."""


def _fail_level(failure: list[str], waiting: list[asyncio.Future[Any]], stop: asyncio.Event, text: str) -> None:
    """A child failed: the first failure kept, every answer still awaited
    failed with it, and the level stopped (finish() then raises it)."""
    if not failure:
        failure.append(text)
    for f in waiting:
        if not f.done():
            f.set_exception(ChildFailed(text))
            f.exception()  # (retrieved here: the caller raises failure[0])
    stop.set()


class _ChildMessages:
    """What one child tells the parent during a level, handled in the
    parent's loop: a request started or ended, more prompts wanted, ready,
    its totals at the end, or its failure."""

    def __init__(self, conn: Any, ready: asyncio.Future[Any], ended: asyncio.Future[Any], take: Any,
                 on_started: Any, on_outcome: Any, fail: Callable[[str], None]) -> None:
        self.conn, self.ready, self.ended = conn, ready, ended
        self.take, self.on_started, self.on_outcome, self.fail = take, on_started, on_outcome, fail

    def __call__(self, msg: Any) -> None:
        kind = msg[0]
        if kind == "s":
            self.on_started(msg[1])
        elif kind == "o":
            self.on_outcome(msg[1])
        elif kind == "more":
            self.conn.send(("more", self.take(msg[1])))
        elif kind == "ready":
            if not self.ready.done():
                self.ready.set_result(None)
        elif kind == "end":
            if not self.ended.done():
                self.ended.set_result(msg[1])
        elif kind == "error":
            self.fail(f"a level's stream process failed:\n{msg[1]}")
        elif kind == "gone":
            self.fail("a level's stream process ended unexpectedly (its pipe closed)")


class LevelProcs:
    """The children of one search: started at its first level, ended by close()."""

    def __init__(self, procs: int, url: str, model: str, api_key: str | None, read_timeout_s: float,
                 total_timeout_s: float) -> None:
        self.procs = procs
        self._args = (url, model, api_key, read_timeout_s, total_timeout_s)
        self._children: list[tuple[Any, Any]] = []  # (process, connection)
        self._level: list[tuple[Any, Any]] = []  # the children of the level begun
        self._ended: list[asyncio.Future[Any]] = []
        self._failure: list[str] = []

    def start(self) -> None:
        from multiprocessing.connection import Connection

        if self._children:
            return
        # The child imports this package from where the parent found it.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for _ in range(self.procs):
            ours, theirs = socket.socketpair()
            p = subprocess.Popen([sys.executable, "-c", CHILD_CODE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, close_fds=True)
            theirs.close()
            conn = Connection(ours.detach())
            conn.send(self._args)
            self._children.append((p, conn))

    def close(self) -> None:
        """Tell every child to quit, and end it if it does not within 5 s."""
        for _, conn in self._children:
            try:
                conn.send(("quit",))
            except (OSError, ValueError):
                pass
        self._end_children(wait_s=5.0)

    async def begin(self, specs: list[dict[str, Any]], requests: list[ProbeRequest], warm: ProbeRequest | None,
                    take: Any, on_started: Any, on_outcome: Any, stop: asyncio.Event, *,
                    when_ready: Callable[[], Awaitable[None]] | None = None) -> float:
        """Start one level over the children, one spec each (closed_specs,
        open_specs); returns its t0 (the parent's perf_counter once every
        child is ready).

        requests: prompts to hand out first (more come from take(n) as a
        child asks); warm: a 1-token request each child sends on some of its
        connections first; on_started(t_s) and on_outcome(outcome) run in
        the parent's loop as each request starts and ends; when_ready: awaited
        once every child has opened its connections (warm-up done) and before
        any starts the level. A child that fails sets `stop` (finish() then
        raises ChildFailed)."""
        self.start()
        self._level = children = self._children[:len(specs)]
        loop = asyncio.get_running_loop()
        ready = [loop.create_future() for _ in children]
        self._ended = ended = [loop.create_future() for _ in children]
        failure: list[str] = []
        self._failure = failure
        fail = partial(_fail_level, failure, ready + ended, stop)
        per = [requests[i::len(children)] for i in range(len(children))]
        for i, ((_, conn), spec) in enumerate(zip(children, specs, strict=True)):
            on_message = _ChildMessages(conn, ready[i], ended[i], take, on_started, on_outcome, fail)
            _read_into(conn, loop, on_message, ("end", "error"))
            conn.send(("level", {**spec, "requests": per[i], "warm": warm}))
        try:
            await asyncio.wait_for(asyncio.gather(*ready), ANSWER_TIMEOUT_S)
        except (asyncio.TimeoutError, ChildFailed):
            if not failure:
                failure.append(f"a level's stream process was not ready within {ANSWER_TIMEOUT_S:.0f} s")
            await self.finish()  # raises ChildFailed(failure[0])
            raise
        if when_ready is not None:
            await when_ready()
        t0 = time.perf_counter()
        for _, conn in children:
            conn.send(("go", t0))
        return t0

    async def finish(self) -> list[ChildTotals]:
        """End the level begin() started: every child cancels what it has in
        flight and sends its totals. ChildFailed if a child failed or did not answer."""
        children, ended, failure = self._level, self._ended, self._failure
        for _, conn in children:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        totals: list[ChildTotals] = []
        try:
            totals = list(await asyncio.wait_for(asyncio.gather(*ended), ANSWER_TIMEOUT_S))
        except asyncio.TimeoutError:
            if not failure:
                failure.append(f"a level's stream process did not end its part within {ANSWER_TIMEOUT_S:.0f} s")
        except ChildFailed:
            pass  # failure[0] says
        finally:
            self._level, self._ended = [], []
        if failure:
            self._abandon()
            raise ChildFailed(failure[0])
        return totals

    def _abandon(self) -> None:
        """Children that failed or stopped answering: gone, and a fresh set at the next level."""
        self._end_children(wait_s=0.0)

    def _end_children(self, wait_s: float) -> None:
        """Each child given wait_s to exit, then terminated, then killed."""
        for p, conn in self._children:
            for end in (None, p.terminate, p.kill):
                if end is not None and p.poll() is None:
                    end()
                try:
                    p.wait(wait_s if end is None else 5.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
            conn.close()
        self._children = []
