"""What `ernie-tui traffic capture --url` costs the server it watches (#57:
"capturing from a server this tool did not start adds <= 1 % CPU to that
server").

The server is one already running (--url; this bench starts none). Its CPU
is the CPU time (user + system) of its whole process tree, read with psutil
at the start and end of each window, as docs/lab/benchmarks/fleet-overhead.md
read the dashboard's. Windows of equal length alternate, without and with a
capture running against the server, in the order off-on, on-off, off-on ...
(so a drift in the box's load falls on both alike), all in one run. "On":
the capture is started, given --startup seconds to import and take its
first scrape, then the window is read while it scrapes every --interval
seconds (the command's default 5), and the capture's own --window outlasts
it. The load is the same in every window: none (--load idle), or a light
steady trickle from a separate process (run_burst, constant arrivals of
short requests) for the whole run (--load light), the first window only
once its requests finish at its rate. Each window also reads vLLM's
finished-request counter at its start and end (two scrapes, in every
window alike), so that equal load can be checked.

Checked that the capture scraped inside its windows: under load, the
profile it writes holds one rate per scrape interval (its rate series);
idle, no request finishes and the capture says so, naming the window it
watched between its first and last scrape.

    .venv/bin/python bench/capture_overhead.py --url http://127.0.0.1:PORT --load idle
    .venv/bin/python bench/capture_overhead.py --url http://127.0.0.1:PORT --load light

Reported: each window's server CPU (% of one core), the mean with and
without, their difference in % of one core and in % of the server's own
CPU, and the capture process's own CPU (on the box, not the server). The
same for the server's API server alone: it answers the scrapes, so the
capture's cost lands there, while vLLM CPU's model worker swings by tens
of % of a core from window to window under the same load (its threads
spin while requests are in flight), which the whole tree's figure carries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ernie_tui.engine_ctl.load import metrics as M  # noqa: E402
from ernie_tui.engine_ctl.load import server_pid  # noqa: E402


def finished(url: str) -> float:
    """vLLM's finished-request counter (one scrape: each window takes two,
    with and without a capture alike)."""
    with M.MetricsClient(url, timeout=30) as c:
        return c.fetch().requests_finished or 0.0


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of the process and all its descendants
    alive now, and of the top process alone: vLLM's API server, which
    answers /metrics (its engine core and model worker send their stats
    every step whether or not anyone scrapes)."""
    top = psutil.Process(pid)
    total = front = 0.0
    for p in [top, *top.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
        if p.pid == pid:
            front = t.user + t.system
    return total, front


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ernie_tui", *args]


def window(url: str, pid: int, seconds: float) -> dict:
    """The server's CPU over `seconds` (% of one core; the whole tree, and
    its API server alone) and the requests it finished meanwhile."""
    n0 = finished(url)
    (c0, f0), t0 = tree_cpu(pid), time.monotonic()
    time.sleep(seconds)
    (c1, f1), t1 = tree_cpu(pid), time.monotonic()
    return {"server_pct": (c1 - c0) / (t1 - t0) * 100.0, "front_pct": (f1 - f0) / (t1 - t0) * 100.0,
            "finished": finished(url) - n0}


def with_capture(url: str, pid: int, seconds: float, interval: float, startup: float, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(cli("traffic", "capture", "--url", url, "--window", f"{seconds + startup + 5:g}s",
                                "--interval", f"{interval:g}", "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    me = psutil.Process(proc.pid)
    time.sleep(startup)
    own0 = sum(me.cpu_times()[:2])
    w = window(url, pid, seconds)
    own = sum(me.cpu_times()[:2]) - own0
    stdout, stderr = proc.communicate(timeout=seconds + 120)
    scraped: dict = {"rc": proc.returncode}
    if proc.returncode == 0:
        prof = json.loads(out.read_text())
        scraped.update(intervals=len(prof["arrivals"]["rate_series"]), window_s=prof["source"]["window_s"])
    else:
        scraped["said"] = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return {**w, "capture_pct": own / seconds * 100.0, "scraped": scraped}


def start_load(url: str, rate: float, seconds: float) -> subprocess.Popen:
    """A steady trickle for the whole run, from its own process: constant
    arrivals of short requests (run_burst without its /metrics sampler, so
    the load adds no scrapes of its own)."""
    n = int(rate * seconds) + 10
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, str(HERE), "--url", url, "--trickle", str(n), "--load-rate", f"{rate:g}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def trickle(url: str, n: int, rate: float) -> None:
    from ernie_tui.engine_ctl.load import BurstConfig, run_burst

    run_burst(url, BurstConfig(n=n, rate=rate, arrivals="constant", concurrency=0, min_tokens=40, max_tokens_in=80,
                               max_tokens=16), use_metrics=False)


def steady(url: str, rate: float, every: float = 5.0, timeout: float = 300.0) -> None:
    """Until the trickle's requests finish at its rate in two looks running
    (its prompts are built before it sends: the first windows of a run that
    started at once saw none of its load)."""
    deadline = time.monotonic() + timeout
    last, good = finished(url), 0
    while time.monotonic() < deadline:
        time.sleep(every)
        now = finished(url)
        good = good + 1 if abs((now - last) / every - rate) <= 0.3 * rate else 0
        last = now
        if good >= 2:
            return
    raise SystemExit("the light load did not settle to its rate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, help="the server's top process (default: the one listening on --url)")
    ap.add_argument("--pairs", type=int, default=3, help="off/on pairs (default 3)")
    ap.add_argument("--seconds", type=float, default=30.0, help="each window (default 30)")
    ap.add_argument("--interval", type=float, default=5.0, help="the capture's --interval (default 5, its own)")
    ap.add_argument("--startup", type=float, default=4.0, help="seconds the capture gets before its window")
    ap.add_argument("--load", choices=["idle", "light"], default="idle")
    ap.add_argument("--load-rate", type=float, default=1.0, help="--load light: requests/s (default 1)")
    ap.add_argument("--trickle", type=int, help=argparse.SUPPRESS)  # the light load's own process
    args = ap.parse_args()
    if args.trickle:
        trickle(args.url, args.trickle, args.load_rate)
        return 0
    pid = args.pid or server_pid(args.url)
    if pid is None:
        raise SystemExit(f"no server process found listening for {args.url}")
    load = None
    if args.load == "light":
        total = args.pairs * 2 * (args.seconds + args.startup + 15) + 30
        load = start_load(args.url, args.load_rate, total)
        steady(args.url, args.load_rate)
    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="capture-overhead-"))
    try:
        for i in range(args.pairs):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                if on:
                    r = with_capture(args.url, pid, args.seconds, args.interval, args.startup, tmp / f"p{i}.json")
                    row = {"pair": i + 1, "capture": True, **r}
                else:
                    time.sleep(args.startup)  # the same pause as an on-window's, so the load sees the same
                    row = {"pair": i + 1, "capture": False, **window(args.url, pid, args.seconds)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if load is not None:
            load.terminate()
            load.wait(30)
    off = [r["server_pct"] for r in rows if not r["capture"]]
    on = [r["server_pct"] for r in rows if r["capture"]]
    diff = statistics.mean(on) - statistics.mean(off)
    front_off = [r["front_pct"] for r in rows if not r["capture"]]
    front_on = [r["front_pct"] for r in rows if r["capture"]]
    front_diff = statistics.mean(front_on) - statistics.mean(front_off)
    by_pair = [sorted((r for r in rows if r["pair"] == p), key=lambda r: r["capture"])
               for p in range(1, args.pairs + 1)]
    pairs = [b["server_pct"] - a["server_pct"] for a, b in by_pair]
    summary = {"load": args.load, "seconds": args.seconds, "pairs": args.pairs, "server_pid": pid,
               "off_pct": off, "on_pct": on, "off_mean": statistics.mean(off), "on_mean": statistics.mean(on),
               "diff_pct_of_core": diff, "diff_pct_of_server": diff / statistics.mean(off) * 100.0,
               "pair_diffs": pairs, "front_off_pct": front_off, "front_on_pct": front_on,
               "front_diff_pct_of_core": front_diff,
               "front_diff_pct_of_server": front_diff / statistics.mean(off) * 100.0,
               "capture_own_pct": statistics.mean(r["capture_pct"] for r in rows if r["capture"]),
               "load_average": os.getloadavg()}
    print(json.dumps({"summary": summary}), flush=True)
    print(f"server CPU, % of one core: without {summary['off_mean']:.2f} ({', '.join(f'{x:.2f}' for x in off)}), "
          f"with a capture {summary['on_mean']:.2f} ({', '.join(f'{x:.2f}' for x in on)}); difference "
          f"{diff:+.2f} % of one core = {summary['diff_pct_of_server']:+.1f} % of the server's own CPU "
          f"(pairs: {', '.join(f'{x:+.2f}' for x in pairs)}); the capture itself {summary['capture_own_pct']:.2f} %",
          file=sys.stderr)
    print(f"its API server alone: without {statistics.mean(front_off):.2f} "
          f"({', '.join(f'{x:.2f}' for x in front_off)}), with {statistics.mean(front_on):.2f} "
          f"({', '.join(f'{x:.2f}' for x in front_on)}); difference {front_diff:+.2f} % of one core = "
          f"{summary['front_diff_pct_of_server']:+.1f} % of the whole server's CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
