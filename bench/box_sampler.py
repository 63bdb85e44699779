"""What the host's CPUs did, every few seconds, beside a GPU run (one JSON line a sample).

On the H200 the 0.3B-shape stand-in is small enough that vLLM's speed is set
by its CPU side (the API server and the engine core's Python) as much as by
the chip; the thirteenth run's server rose from 16 k to 26.5 k generated
tok/s within ten minutes with nothing changed on our side. Beside
nvidia-smi's clocks (truth_h200.sh start), this says whether the host was
the one that moved: the CPUs' busy and steal shares (steal: time the
hypervisor gave this machine's CPUs to someone else), and which of our
processes (vLLM's API server and engine core, our client, the bench client)
used how much CPU.

    python bench/box_sampler.py --every 5 --out box.jsonl      (until killed)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone

import psutil


def _label(p: psutil.Process) -> str:
    """A short name for a process: its command's telling words."""
    try:
        cmd = p.cmdline()
    except (psutil.Error, OSError):
        return p.name()
    text = " ".join(cmd)
    for key, label in (("api_server", "vllm-api"), ("VLLM::APIServer", "vllm-api"), ("EngineCore", "vllm-engine"),
                       ("cli.main serve", "vllm-serve"), ("ernie_tui", "ernie-tui"), ("server_drift", "drift"),
                       ("agree_vllm_bench", "agree"), ("capacity_truth", "truth"), ("bench", "bench")):
        if key in text:
            return label
    return p.name()


def sample(procs: dict[int, psutil.Process], min_pct: float) -> dict:
    cpu = psutil.cpu_times_percent(interval=None)
    out: dict = {"t": datetime.now(timezone.utc).strftime("%H:%M:%S"),
                 "cpu": {k: round(getattr(cpu, k), 1) for k in ("user", "system", "idle", "iowait", "steal")
                         if hasattr(cpu, k)},
                 "load1": round(psutil.getloadavg()[0], 2)}
    try:  # the CPUs' mean clock: a host whose clock moves moves vLLM's Python with it (a VM may report a constant)
        freq = psutil.cpu_freq()
        out["mhz"] = round(freq.current) if freq and freq.current else None
    except (OSError, NotImplementedError, AttributeError):
        out["mhz"] = None
    seen = set()
    busy = []
    me = psutil.Process().pid
    for p in psutil.process_iter(["pid", "name"]):
        seen.add(p.pid)
        if p.pid == me:
            continue
        q = procs.setdefault(p.pid, p)
        try:
            pct = q.cpu_percent(interval=None)  # since its last sample (0.0 the first time)
        except psutil.Error:
            continue
        if pct >= min_pct:
            busy.append({"pid": p.pid, "what": _label(q), "cpu_pct": round(pct, 1)})
    for pid in list(procs):
        if pid not in seen:
            del procs[pid]
    # vLLM's engine core names itself in its process title, not always its command line
    for b in busy:
        if b["what"] == "python3" or b["what"] == "python":
            try:
                b["what"] = procs[b["pid"]].name()
            except psutil.Error:
                pass
    out["procs"] = sorted(busy, key=lambda b: -b["cpu_pct"])[:10]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--min-pct", type=float, default=5.0, help="list processes above this CPU %%")
    ap.add_argument("--out", default="-", help="a JSON-lines file (default: stdout)")
    ap.add_argument("--count", type=int, default=0, help="stop after this many samples (0: never)")
    args = ap.parse_args(argv)
    sink = sys.stdout if args.out == "-" else open(args.out, "a", buffering=1)  # noqa: SIM115  a line at a time
    procs: dict[int, psutil.Process] = {}
    psutil.cpu_times_percent(interval=None)
    sample(procs, args.min_pct)  # primes every counter: the first real sample covers one interval
    n = 0
    while args.count == 0 or n < args.count:
        time.sleep(args.every)
        sink.write(json.dumps(sample(procs, args.min_pct)) + "\n")
        n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
