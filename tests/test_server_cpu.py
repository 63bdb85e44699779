"""The serving processes' CPU per capacity level, where the server is local.

On an H200 the 0.3B-shape stand-in's vLLM held its API server and engine core
each at a whole core at every load while the GPU was at most 58 % busy: its
capacity was bound by two Python threads. The search reads each local server
process's CPU time over every level and says so when one was held at a core.
The stand-in's --busy-child is such a process (titled VLLM::EngineCore)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.load import LevelResult
from ernie_tui.engine_ctl.load.server_cpu import (
    SATURATED_PCT,
    ServerCpuWatch,
    cpu_bound_note,
    server_pid,
    server_processes,
)
from test_loadgen import PacedServer


@pytest.fixture
def paced():
    servers: list[PacedServer] = []

    def start(*args: str) -> PacedServer:
        servers.append(PacedServer(*args))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _children(pid: int, n: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"process {pid} has no {n} children after 60 s")


# Each child runs until its parent, whose pid it is handed (not its own
# getppid() at start: a parent killed before a slow child got there left it
# reparented, comparing against init, alive for good; ci7 left two), is gone.
SPIN = "import os, sys\nq = int(sys.argv[1])\nwhile os.getppid() == q: pass"
IDLE = "import os, sys, time\nq = int(sys.argv[1])\nwhile os.getppid() == q: time.sleep(0.1)"


def _read_tree(children: list[tuple[str, str]], *parent_args: str):
    """A parent running each child's code under its title (argv[0]), its
    tree's CPU read over 1.5 s: (parent pid, children, the reading, each
    child's CPU in % of a core as the kernel counted it over the same span)."""
    code = ("import os, subprocess, sys, time\n"
            + "".join(f"subprocess.Popen([{title!r}, '-c', {body!r}, str(os.getpid())], executable=sys.executable)\n"
                      for title, body in children)
            + "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, *parent_args])
    try:
        kids = _children(parent.pid, len(children))
        watch = ServerCpuWatch(parent.pid)
        before = _cpu_seconds(kids)
        t0 = time.monotonic()
        watch.start()
        time.sleep(1.5)  # the window read, not a wait for something to happen
        read = watch.stop()
        used = _cpu_seconds(kids)
        span = time.monotonic() - t0
    finally:
        parent.kill()
        parent.wait()
    # What the kernel says each child used in the same window, in % of a core:
    # the reading must agree with it, whatever share of a core a busy box left it.
    kernel_pct = {pid: (used[pid] - before[pid]) / span * 100 for pid in used}
    return parent.pid, kids, read, kernel_pct


def _cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        t = p.cpu_times()
        out[p.pid] = t.user + t.system
    return out


def test_a_busy_child_reads_as_a_core_and_its_idle_parent_as_next_to_nothing():
    parent_pid, (child,), read, kernel_pct = _read_tree([("VLLM::EngineCore", SPIN)])
    assert read is not None
    by_pid = {p["pid"]: p for p in read}
    assert by_pid[child.pid]["what"] == "engine core"
    # as much of a core as the kernel counted for it (a whole one on a quiet
    # box; a busy 2-core box once left it less than half)
    assert by_pid[child.pid]["cpu_pct"] == pytest.approx(kernel_pct[child.pid], abs=15), kernel_pct
    assert by_pid[child.pid]["cpu_pct"] > 5
    assert by_pid[parent_pid]["cpu_pct"] < 20 and by_pid[parent_pid]["what"] == "server"
    assert read[0]["pid"] == child.pid  # busiest first


def test_the_server_processes_are_the_top_one_and_its_descendants_each_with_its_part():
    # bench/cpu_watch.py follows these processes' threads second by second
    code = ("import os, subprocess, sys, time\n"
            f"subprocess.Popen(['VLLM::EngineCore', '-c', {IDLE!r}, str(os.getpid())], executable=sys.executable)\n"
            f"subprocess.Popen(['VLLM::Worker_TP0', '-c', {IDLE!r}, str(os.getpid())], executable=sys.executable)\n"
            "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, "vllm"])
    try:
        kids = _children(parent.pid, 2)
        procs = server_processes(parent.pid)
        assert procs[parent.pid] == "API server"  # the top one, a vllm command line
        assert sorted(procs[k.pid] for k in kids) == ["Worker_TP0", "engine core"]
        assert len(procs) == 3
    finally:
        parent.kill()
        parent.wait()
    parent.wait()
    assert server_processes(parent.pid) == {}  # gone: nothing, no error


def test_a_gone_server_reads_as_nothing():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    watch = ServerCpuWatch(p.pid)
    watch.start()
    assert watch.stop() is None


def test_the_server_pid_is_the_local_listener_and_none_elsewhere(paced):
    srv = paced("--slots", "2")
    assert server_pid(srv.url) == srv.proc.pid
    assert server_pid(srv.url.replace("127.0.0.1", "localhost")) == srv.proc.pid
    assert server_pid("http://192.0.2.7:8000") is None  # TEST-NET: not this machine, not read
    assert server_pid("http://127.0.0.1:1") is None  # nothing listens there


def test_the_server_pid_of_api_servers_sharing_a_socket_is_the_vllm_process_above_them():
    # `vllm serve --api-server-count 4` on an H200: the listener found was
    # VLLM::APIServer_3, which read 8 % of a core and no engine core at all.
    # Here a child titled so listens; its parent (vllm serve's command line)
    # does not, and is the server.
    listen = ("import os, socket, sys\nq = os.getppid()\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n"
              "s.listen()\nprint(s.getsockname()[1], flush=True)\nimport time\n"
              "while os.getppid() == q: time.sleep(0.1)")
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"subprocess.Popen(['VLLM::APIServer_3', '-c', {listen!r}], executable=sys.executable)\n"
                               "time.sleep(60)", "vllm.entrypoints.cli.main", "serve"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        port = int(parent.stdout.readline())
        _children(parent.pid, 1)
        assert server_pid(f"http://127.0.0.1:{port}") == parent.pid
    finally:
        parent.kill()
        parent.wait()


def _level(load: int, *cpu: float, rate: bool = False) -> LevelResult:
    lv = LevelResult(concurrency=None if rate else load, requests=100, rate=float(load) if rate else None)
    lv.server_cpu = [{"what": w, "pid": 10 + i, "cpu_pct": c} for i, (w, c) in
                     enumerate(zip(("API server", "engine core"), cpu, strict=False))] or None
    return lv


def test_api_servers_of_their_own_are_named_and_their_parent_reads_as_their_supervisor():
    # `vllm serve --api-server-count 2`: the listening parent only supervises
    # VLLM::APIServer_0 and _1, which answer the requests (one busy here).
    _, _, read, kernel_pct = _read_tree([("VLLM::APIServer_0", SPIN), ("VLLM::APIServer_1", IDLE)], "vllm")
    assert read is not None
    whats = {p["what"]: p for p in read}
    assert set(whats) == {"API server 0", "API server 1", "server supervisor"}
    assert whats["API server 0"]["cpu_pct"] == pytest.approx(kernel_pct[whats["API server 0"]["pid"]], abs=15), \
        kernel_pct
    assert whats["API server 0"]["cpu_pct"] > 5 and whats["API server 1"]["cpu_pct"] < 20
    lv = _level(16)
    lv.server_cpu = [{**whats["API server 0"], "cpu_pct": 97.0}, whats["API server 1"]]
    assert (cpu_bound_note([lv]) or "").startswith("the server's API server 0 used a whole CPU core")


def test_the_note_names_the_processes_held_at_a_core_and_the_lowest_load_where_they_were():
    note = cpu_bound_note([_level(16, 40.0, 30.0), _level(64, 99.0, 92.0), _level(32, 95.0, 60.0)])
    assert note is not None
    assert note.startswith("the server's API server and engine core used a whole CPU core (>= 90 %, up to 99 %) "
                           "in 2 of 3 levels, from concurrency 32:")
    assert "not by the GPU alone" in note
    assert "the tokens/s stay where the engine core's thread holds them" in note
    api_only = cpu_bound_note([_level(16, 97.0, 60.0)]) or ""
    assert api_only.startswith("the server's API server used a whole CPU core")
    assert "the engine core kept up: more API servers (api_server_count = N" in api_only
    assert "from 8 req/s" in (cpu_bound_note([_level(8, 91.0, rate=True)]) or "")
    assert cpu_bound_note([_level(16, SATURATED_PCT - 0.1, 10.0)]) is None
    assert cpu_bound_note([_level(16), _level(32)]) is None  # a server elsewhere: nothing read, nothing said
    # A worker busy at a core (vLLM's CPU build runs the model there) is its job, not a bound: no note.
    worker = _level(8, 40.0, 30.0)
    worker.server_cpu = [*(worker.server_cpu or []), {"what": "Worker", "pid": 99, "cpu_pct": 97.0}]
    assert cpu_bound_note([worker]) is None


def test_a_search_on_a_local_server_reads_its_processes_cpu_per_level_and_says_when_one_held_a_core(
        paced, capsys):
    srv = paced("--slots", "3", "--ttft-ms", "20", "--itl-ms", "20", "--busy-child")
    code = main(["probe", "--url", srv.url, "--capacity", "--slo", "ttft_p90=200ms", "--max-concurrency", "2",
                 "--level-time", "8", "--max-tokens", "16", "--min-tokens", "10", "--max-tokens-in", "40", "--json",
                 "--no-save"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    child = _children(srv.proc.pid, 1)[0].pid
    for lv in out["levels"]:
        by_pid = {p["pid"]: p for p in lv["server_cpu"]}
        assert set(by_pid) == {srv.proc.pid, child}
        assert by_pid[child]["what"] == "engine core" and by_pid[child]["cpu_pct"] >= 0.0
    # The child spins through every level, but how much of a core it gets is the
    # scheduler's: a CI box running vLLM beside it gave it 2 %. That the figure
    # matches the kernel's count is the _read_tree tests' job; here, that the
    # search read it at all: some level saw it run.
    assert max(lv_cpu["cpu_pct"] for lv in out["levels"] for lv_cpu in lv["server_cpu"]
               if lv_cpu["pid"] == child) > 0.0, [lv["server_cpu"] for lv in out["levels"]]
    # The note is there exactly when a level read the child at 90 % or more (on a
    # busy 2-core box it may get less of a core than that).
    held = any(p["what"] == "engine core" and p["cpu_pct"] >= SATURATED_PCT
               for lv in out["levels"] for p in lv["server_cpu"])
    said = [w for w in out["warnings"] if w.startswith("the server's engine core used a whole CPU core")]
    assert bool(said) == held, (out["warnings"], [lv["server_cpu"] for lv in out["levels"]])


def test_a_search_prints_the_server_cpu_under_each_level(paced, capsys):
    srv = paced("--slots", "2", "--ttft-ms", "10", "--itl-ms", "10")
    code = main(["probe", "--url", srv.url, "--capacity", "--slo", "ttft_p90=500ms", "--max-concurrency", "1",
                 "--level-time", "8", "--max-tokens", "8", "--min-tokens", "4", "--max-tokens-in", "8", "--no-save"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "server CPU (% of a core): server " in text
