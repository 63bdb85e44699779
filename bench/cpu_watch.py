"""Where a local vLLM server's busy threads ran, and how fast each CPU was, second by second.

On the H200 one server's tokens/s at a fixed load moved by up to 2x between
runs a minute apart (fifteenth run: 8,820 and 19,849 tok/s at 128 in
flight, 33 s apart), while its engine core used the same 90-95 % of a core
in every run: the same CPU time did half the work. Either the CPU it ran on
was slower (the host's clock, another tenant's thread on the same physical
core, our own API server or client on its hyperthread sibling) or the work
was not the same. psutil's clock reads a constant on that VM, so this
measures speed directly. Every --every seconds, one JSON line with:

- `busy`: each CPU's busy share, %;
- `probe_us` (with --probe): for each CPU, the best of 3 timings of a fixed
  pure-Python loop run pinned to that CPU, in microseconds (a CPU whose
  clock dropped, or whose physical core is shared, reads slower; one that a
  busy thread holds reads slower again, since the probe takes turns with it);
- `threads`: each server thread busier than --min-pct over the interval:
  its process's part (API server, engine core, ...), its % of a core, and
  the CPU it last ran on (/proc/PID/task/TID/stat, field 39).

The first line (`topology`) lists each CPU's hyperthread siblings.

    PYTHONPATH=src python bench/cpu_watch.py --url http://127.0.0.1:8000 --probe --out cpu.jsonl   (until killed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

from ernie_tui.engine_ctl.load import server_pid, server_processes

# About 2-5 ms of one core on a current x86 CPU: short enough to take every
# CPU each second, long enough to time well.
PROBE_LOOPS = 100_000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def siblings() -> dict[int, list[int]]:
    """Each CPU's hyperthread siblings, itself included (empty where sysfs does not say)."""
    out: dict[int, list[int]] = {}
    for cpu in range(psutil.cpu_count() or 0):
        f = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        ids: list[int] = []
        for part in text.split(","):
            a, _, b = part.partition("-")
            ids.extend(range(int(a), int(b or a) + 1))
        out[cpu] = ids
    return out


def probe(cpus: list[int]) -> dict[int, float]:
    """Microseconds of PROBE_LOOPS loop turns on each CPU, the best of 3."""
    home = os.sched_getaffinity(0)
    out: dict[int, float] = {}
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter_ns()
                x = 0
                for i in range(PROBE_LOOPS):
                    x += i
                best = min(best, (time.perf_counter_ns() - t) / 1000)
            out[cpu] = round(best, 1)
    finally:
        os.sched_setaffinity(0, home)
    return out


def thread_times(pid: int) -> dict[int, tuple[float, int]]:
    """Each thread of a process: (CPU seconds, the CPU it last ran on)."""
    out: dict[int, tuple[float, int]] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            # the command may hold spaces and parentheses: split after the last ')'
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields[0] is stat's field 3: utime is field 14, stime 15, processor 39
        out[int(task.name)] = ((int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[36]))
    return out


def server_procs(url: str) -> dict[int, str]:
    """The server's processes, each with its part."""
    root = server_pid(url)
    return {} if root is None else server_processes(root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the local server whose threads to follow")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--probe", action="store_true", help="time a fixed loop on every CPU each sample")
    ap.add_argument("--min-pct", type=float, default=20.0, help="list server threads above this %% of a core")
    ap.add_argument("--out", default="-", help="a JSON-lines file (default: stdout)")
    ap.add_argument("--count", type=int, default=0, help="stop after this many samples (0: never)")
    args = ap.parse_args(argv)
    sink = sys.stdout if args.out == "-" else open(args.out, "a", buffering=1)  # noqa: SIM115  a line at a time
    cpus = sorted(os.sched_getaffinity(0))
    sink.write(json.dumps({"topology": {str(k): v for k, v in siblings().items()}, "probe_loops": PROBE_LOOPS}) + "\n")
    procs: dict[int, str] = {}
    last: dict[tuple[int, int], float] = {}
    t_last = time.monotonic()
    psutil.cpu_percent(percpu=True)
    n = 0
    while args.count == 0 or n < args.count:
        time.sleep(args.every)
        if not procs or not all(psutil.pid_exists(p) for p in procs):
            procs = server_procs(args.url)
        now = time.monotonic()
        span = now - t_last
        t_last = now
        line: dict = {"t": datetime.now(timezone.utc).strftime("%H:%M:%S"),
                      "busy": psutil.cpu_percent(percpu=True)}
        threads = []
        seen: dict[tuple[int, int], float] = {}
        for pid, what in procs.items():
            for tid, (cpu_s, on) in thread_times(pid).items():
                seen[(pid, tid)] = cpu_s
                if (pid, tid) in last:
                    pct = (cpu_s - last[(pid, tid)]) / span * 100
                    if pct >= args.min_pct:
                        threads.append({"what": what, "tid": tid, "pct": round(pct), "cpu": on})
        last = seen
        line["threads"] = sorted(threads, key=lambda x: -x["pct"])
        if args.probe:
            line["probe_us"] = probe(cpus)
        sink.write(json.dumps(line) + "\n")
        n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
