"""Pin a running local vLLM server's processes to CPUs of their own (or let them run anywhere again).

vLLM's engine core and API server each run their work on one Python thread
(a whole core each on the H200, fifteenth run). The kernel moves such
threads between CPUs and may put two of them, or our client, on the two
hyperthreads of one physical core, where each runs slower. This sets the
CPU affinity of every thread of each server process (os.sched_setaffinity
on each thread id: a process's affinity call moves only its main thread):

  --auto     the engine core on two physical cores, the API server(s) on two
             others, their hyperthread siblings left empty, every other
             server process (workers, the supervisor) on the remaining CPUs;
             prints the CPUs left for clients (give them to the bench client
             with server_drift.py --cpus);
  --unpin    every thread of the server back on every CPU.

    PYTHONPATH=src python bench/pin_server.py --url http://127.0.0.1:8000 --auto
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_watch import server_procs, siblings  # noqa: E402


def set_threads(pid: int, cpus: set[int]) -> int:
    """Every thread of `pid` onto `cpus`; how many were set."""
    n = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setaffinity(int(task.name), cpus)
            n += 1
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return n


def plan(all_cpus: list[int], sib: dict[int, list[int]], cores_each: int = 2) -> tuple[set[int], set[int], set[int]]:
    """(engine CPUs, API server CPUs, the rest): one CPU of each of 2 x cores_each physical cores, their
    siblings left out of the rest. Leaves the first physical core to the system (interrupts, daemons)."""
    physical: list[int] = []
    taken: set[int] = set()
    for cpu in all_cpus:
        if cpu in taken:
            continue
        physical.append(cpu)
        taken.update(sib.get(cpu) or [cpu])
    picks = physical[1:1 + 2 * cores_each]
    if len(picks) < 2 * cores_each:
        raise SystemExit(f"not enough physical cores to pin to: {physical}")
    engine, api = set(picks[:cores_each]), set(picks[cores_each:])
    held = {s for c in picks for s in (sib.get(c) or [c])}
    rest = set(all_cpus) - held
    return engine, api, rest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--auto", action="store_true", help="engine core and API server on physical cores of their own")
    mode.add_argument("--unpin", action="store_true", help="every server thread back on every CPU")
    args = ap.parse_args(argv)
    procs = server_procs(args.url)
    if not procs:
        raise SystemExit(f"no local server answers at {args.url}")
    all_cpus = sorted(range(psutil.cpu_count() or 1))
    if args.unpin:
        done = {pid: set_threads(pid, set(all_cpus)) for pid in procs}
        print(json.dumps({"unpinned": {f"{procs[p]} {p}": n for p, n in done.items()}}))
        return 0
    engine, api, rest = plan(all_cpus, siblings())
    out = {}
    for pid, what in procs.items():
        cpus = engine if what == "engine core" else api if what.startswith("API server") else rest
        out[f"{what} {pid}"] = {"cpus": sorted(cpus), "threads": set_threads(pid, cpus)}
    print(json.dumps({"pinned": out, "clients": sorted(rest)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
