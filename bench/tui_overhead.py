"""What does the dashboard cost? CPU and memory of the TUI process, and how
fast a key press reaches the screen while the log floods.

    .venv/bin/python bench/tui_overhead.py [--server vllm|fake] [--seconds 60] [--rate 5000]

The real `ernie-tui` runs in a real terminal (a private tmux server, 120x40)
in control mode, starts its server from a preset and watches it:

  vllm  real vLLM CPU with the tiny stand-in model (the cpu-demo preset);
  fake  tests/tui_fake_vllm.py: vLLM's log and a real 53 KB /metrics capture,
        for boxes where a real start is too slow.

Phases, once the server is ready:

  idle   (--seconds) nothing happens but the dashboard's own polling (1 Hz
         metrics and memory, the log tail, the uptime clock);
  flood  (--seconds) a writer appends --rate realistic log lines a second
         (lines drawn from the captured vLLM logs, plus stats and access-log
         lines) to the llm.log the dashboard tails;
  keys   (--key-seconds, the flood still running) key presses sent through
         tmux at a person's pace and timed until the screen shows the change
         (tmux capture-pane polled every ~2 ms): `?` opens the help screen and
         `?` closes it (each a full-screen repaint), `v` toggles the log
         pane's prefix form (a pane repaint).

CPU% is the TUI process's own CPU time (all its threads: UI, log tail and
parser, samplers) over wall time, as a percentage of one core; the server's
processes are not counted. RSS is sampled every second. Goals: idle <= 2 %,
flood <= 15 % of one core, RSS <= 150 MB, key-press p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from ernie_tui.engine_ctl.launch import free_port

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vllm-logs"
# The dashboard of the tree this script lives in, whichever environment runs
# it: a worktree without its own .venv measures its own code, not main's.
ERNIE_TUI = [sys.executable, "-m", "ernie_tui"]
TREE_PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
GOALS = {"idle_cpu_pct": 2.0, "flood_cpu_pct": 15.0, "rss_mb": 150.0, "key_p99_ms": 100.0}


class Tmux:
    def __init__(self, name: str):
        self.name = name

    def run(self, *args: str, **kw):
        return subprocess.run(["tmux", "-L", self.name, *args], **kw)

    def start(self, command: str, cols: int = 120, rows: int = 40) -> None:
        self.run("new-session", "-d", "-s", self.name, "-x", str(cols), "-y", str(rows), command,
                 ";", "set-option", "-g", "default-size", f"{cols}x{rows}",
                 ";", "set-option", "-g", "-w", "window-size", "manual", check=True)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name, capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys, check=True)

    def pane_pid(self) -> int:
        out = self.run("display-message", "-p", "-t", self.name, "#{pane_pid}", capture_output=True, text=True,
                       check=True)
        return int(out.stdout.strip())

    def alive(self) -> bool:
        return self.run("has-session", "-t", self.name, capture_output=True).returncode == 0

    def kill(self) -> None:
        self.run("kill-server", capture_output=True)
        sock = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / self.name
        sock.unlink(missing_ok=True)


def realistic_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(FIXTURES.glob("*/*.log")):
        lines += [ln for ln in path.read_text(errors="replace").splitlines() if 0 < len(ln) < 2000]
    stats = ("(APIServer pid=4242) INFO 11-30 03:35:58 [loggers.py:335] Engine 000: Avg prompt throughput: "
             "{p:.1f} tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: {k:.1f}%, Prefix cache hit rate: 0.0%")
    rng = random.Random(0)
    lines += [stats.format(p=rng.uniform(0, 500), g=rng.uniform(0, 3000), r=rng.randint(0, 8),
                           k=rng.uniform(0, 40)) for _ in range(200)]
    access = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK'
    lines += [access.format(port=rng.randint(30000, 60000)) for _ in range(2000)]
    return lines


class Flood(threading.Thread):
    """Append `rate` lines a second to `path`, in 10 ms slices."""

    def __init__(self, path: Path, rate: int):
        super().__init__(daemon=True)
        self.path, self.rate = path, rate
        self.stop = threading.Event()
        self.written = 0
        self.pool = realistic_lines()

    def run(self) -> None:
        rng = random.Random(1)
        start = time.monotonic()
        with open(self.path, "a", buffering=1 << 16) as f:
            while not self.stop.is_set():
                due = int((time.monotonic() - start) * self.rate)
                if due > self.written:
                    n = due - self.written
                    f.write("\n".join(rng.choice(self.pool) for _ in range(n)) + "\n")
                    f.flush()
                    self.written = due
                time.sleep(0.01)


class PauseWatch(threading.Thread):
    """Reads the screen every 3 s and counts the times the log pane's footer
    said PAUSED (it must keep following a flood nobody scrolls)."""

    def __init__(self, tmux: Tmux) -> None:
        super().__init__(daemon=True)
        self.tmux = tmux
        self.stop = threading.Event()
        self.checked = 0
        self.paused = 0

    def run(self) -> None:
        while not self.stop.wait(3.0):
            self.checked += 1
            if "PAUSED" in self.tmux.screen():
                self.paused += 1


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def measure(proc: psutil.Process, seconds: float, during=None, others: list[int] | None = None) -> dict:
    t0 = time.monotonic()
    c0 = proc.cpu_times()
    o0 = _tree_cpu(others or [])
    s0 = psutil.cpu_times()
    rss: list[float] = []
    result = None
    if during is not None:
        result = during(seconds)
    while time.monotonic() - t0 < seconds:
        rss.append(proc.memory_info().rss / 1e6)
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
    c1 = proc.cpu_times()
    wall = time.monotonic() - t0
    cpu = (c1.user - c0.user + c1.system - c0.system) / wall * 100
    s1 = psutil.cpu_times()

    def busy(t) -> float:
        return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
    rss.append(proc.memory_info().rss / 1e6)
    return {"seconds": round(wall, 1), "cpu_pct": round(cpu, 2), "rss_mb_max": round(max(rss), 1),
            "rss_mb_mean": round(sum(rss) / len(rss), 1), "keys": result,
            "server_cpu_pct": round((_tree_cpu(others or []) - o0) / wall * 100, 1) if others else None,
            "box_busy_pct_of_all_cores": round((busy(s1) - busy(s0)) / wall / (os.cpu_count() or 1) * 100, 1)}


def percentile(values: list[float], p: float) -> float:
    xs = sorted(values)
    h = (len(xs) - 1) * p / 100
    lo = int(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


_FULL = re.compile(r"^│\([A-Za-z_0-9-]+ pid=\d+\) (?:INFO|WARNING|ERROR|DEBUG) ")
_SHORT = re.compile(r"^│[A-Za-z_0-9-]{1,11}\s+[DIWEC] \d\d:\d\d:\d\d ")


def _log_prefixes_shown(screen: str) -> bool | None:
    """True: the log pane shows vLLM's full prefixes ('(APIServer pid=4242) INFO ...');
    False: the short form ('APIServer  I 03:35:58 ...'); None: cannot tell yet."""
    lines = screen.splitlines()
    full = sum(1 for ln in lines if _FULL.match(ln))
    short = sum(1 for ln in lines if _SHORT.match(ln))
    if full and not short:
        return True
    if short and not full:
        return False
    return None


HELP_PRESS = ("help", "?", lambda s: "keys and figures" in s)
LOG_PRESS = ("log", "v", _log_prefixes_shown)
DASHBOARD_PRESSES = (HELP_PRESS, HELP_PRESS, LOG_PRESS, LOG_PRESS)


def key_latencies(tmux: Tmux, rss_proc: psutil.Process, seconds: float,
                  presses: tuple = DASHBOARD_PRESSES) -> dict:
    """Cycle through `presses` at a person's pace, timing each press until
    the screen shows its effect. A press is (probe name, tmux key, state):
    state(screen) reads what the key changes (None: cannot tell yet), and the
    press counts once the state differs from before. The dashboard's:

    help  `?` opens the help screen, `?` closes it (full-screen repaints);
    log   `v` switches the log pane between short and full vLLM prefixes.

    Not escape to close: a terminal app cannot tell a lone ESC from the start
    of an escape sequence without waiting (Textual waits ~100 ms), which would
    measure that wait rather than the dashboard."""
    lat: dict[str, list[float]] = {name: [] for name, _, _ in presses}
    misses = 0
    end = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < end - 1:
        name, key, state = presses[turn % len(presses)]
        turn += 1
        before = state(tmux.screen())
        while before is None:  # the flood's visible lines happen to have no prefixes: look again
            time.sleep(0.05)
            before = state(tmux.screen())
        t0 = time.perf_counter()
        tmux.keys(key)
        while True:
            now_state = state(tmux.screen())
            if now_state is not None and now_state != before:
                lat[name].append((time.perf_counter() - t0) * 1000)
                break
            if time.perf_counter() - t0 > 2.0:
                misses += 1
                break
            time.sleep(0.002)
        time.sleep(0.3)  # a person's pace, not a key-repeat storm
    if "keys and figures" in tmux.screen():
        tmux.keys("?")

    def stats(values: list[float]) -> dict:
        if not values:
            return {"presses": 0}
        return {"presses": len(values), "p50_ms": round(percentile(values, 50), 1),
                "p99_ms": round(percentile(values, 99), 1), "max_ms": round(max(values), 1)}

    every = [v for values in lat.values() for v in values]
    return {"misses": misses, "all": stats(every), **{name: stats(v) for name, v in lat.items()},
            "raw_ms": {name: [round(x, 1) for x in v] for name, v in lat.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=["vllm", "fake"], default="vllm")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=int, default=5000, help="log lines a second during the flood")
    ap.add_argument("--key-seconds", type=float, default=40.0)
    ap.add_argument("--ready-timeout", type=float, default=420.0)
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is required", file=sys.stderr)
        return 2

    home = Path(tempfile.mkdtemp(prefix="ernie-bench-"))
    env = {**os.environ, "ERNIE_TUI_HOME": str(home), "PYTHONPATH": TREE_PYTHONPATH}
    model = home / "data" / "models" / "tiny-ernie"
    subprocess.run([*ERNIE_TUI, "demo-model", str(model)], env=env, check=True, capture_output=True)
    port = free_port()
    presets = home / "bench-presets.toml"
    if args.server == "vllm":
        presets.write_text(f"""[presets.bench]
description = "cpu-demo on a free port"
extends = "cpu-demo"
port = {port}
""")
    else:
        fake = ROOT / "tests" / "tui_fake_vllm.py"
        presets.write_text(f"""[presets.bench]
description = "stand-in vLLM serving a real /metrics capture"
model = "{model}"
launcher = ["{sys.executable}", "{fake}"]
block_size = 32
max_model_len = 2048
kv_cache_memory_bytes = "64M"
port = {port}

[presets.bench.env]
ERNIE_FAKE_FIXTURES = "{FIXTURES / 'cpu-vllm0.32.0'}"
ERNIE_FAKE_DELAY = "0.2"
ERNIE_FAKE_METRICS = "{FIXTURES / 'cpu-vllm0.32.0' / 'ok_block32_len2048.metrics'}"
""")
    check = subprocess.run([*ERNIE_TUI, "presets", "show", "bench", "--presets", str(presets)], env=env,
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"bad bench preset: {check.stderr.strip()}")
    log = home / "state" / "llm.log"
    tmux = Tmux(f"ernie-bench-{os.getpid()}")
    results: dict = {"server": args.server, "rate": args.rate, "seconds": args.seconds, "goals": GOALS}
    flood = None
    server_pids: list[int] = []
    try:
        tmux.start(f"cd {ROOT} && exec env -u COLUMNS -u LINES ERNIE_TUI_HOME={home} "
                   f"PYTHONPATH={shlex.quote(TREE_PYTHONPATH)} {shlex.join(ERNIE_TUI)} "
                   f"--presets {presets} --preset bench --start --on-exit stop")
        tui = psutil.Process(tmux.pane_pid())
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.ready_timeout:
            if not tmux.alive():
                raise SystemExit("ernie-tui exited before the server was ready")
            first = tmux.screen().splitlines()[:1]
            if first and "READY" in first[0]:
                break
            if first and "CRASHED" in first[0]:
                raise SystemExit(f"server crashed:\n{tmux.screen()}")
            time.sleep(1)
        else:
            raise SystemExit(f"server not ready after {args.ready_timeout} s:\n{tmux.screen()}")
        results["ready_after_s"] = round(time.monotonic() - t0, 1)
        server_pids = [p.pid for p in tui.children(recursive=True)]
        time.sleep(5)  # let the start-up settle (report, first samples)
        print(f"ready after {results['ready_after_s']} s; TUI pid {tui.pid}; measuring idle for {args.seconds:.0f} s",
              flush=True)
        results["idle"] = measure(tui, args.seconds, others=server_pids)
        print(f"idle:  {json.dumps(results['idle'])}", flush=True)

        flood = Flood(log, args.rate)
        flood.start()
        time.sleep(2)
        print(f"flood: {args.rate} lines/s into {log}; measuring for {args.seconds:.0f} s", flush=True)
        t_flood = time.monotonic()
        watch = PauseWatch(tmux)
        watch.start()
        results["flood"] = measure(tui, args.seconds, others=server_pids)
        watch.stop.set()
        watch.join()
        # A paused log pane repaints less and would flatter the figures: they
        # count only when the pane followed the whole flood.
        results["flood"]["screens_checked"] = watch.checked
        results["flood"]["screens_paused"] = watch.paused
        print(f"flood: {json.dumps(results['flood'])}", flush=True)
        print(f"keys: pressing keys for {args.key_seconds:.0f} s, the flood going on", flush=True)
        results["keys"] = measure(tui, args.key_seconds, during=lambda s: key_latencies(tmux, tui, s),
                                  others=server_pids)
        flood.stop.set()
        flood.join()
        results["flood"]["lines_written"] = flood.written
        results["flood"]["lines_per_s"] = round(flood.written / (time.monotonic() - t_flood + 2), 0)
        print(f"keys: {json.dumps(results['keys'])}", flush=True)
        results["screen_after_flood"] = tmux.screen()

        tmux.keys("q")  # --on-exit stop: quits stopping the server
        t1 = time.monotonic()
        while tmux.alive() and time.monotonic() - t1 < 60:
            time.sleep(0.5)
        left = [p for p in server_pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        results["engine_left"] = left
    finally:
        if flood is not None:
            flood.stop.set()
        tmux.kill()
        for pid in server_pids:  # only what this run started
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        shutil.rmtree(home, ignore_errors=True)

    idle, fl, kp = results["idle"], results["flood"], results["keys"]
    rss = max(idle["rss_mb_max"], fl["rss_mb_max"], kp["rss_mb_max"])
    keys = (kp["keys"] or {}).get("all", {})
    verdict = {
        "idle_cpu_pct": (idle["cpu_pct"], idle["cpu_pct"] <= GOALS["idle_cpu_pct"]),
        "flood_cpu_pct": (fl["cpu_pct"], fl["cpu_pct"] <= GOALS["flood_cpu_pct"]),
        "rss_mb": (rss, rss <= GOALS["rss_mb"]),
        "key_p99_ms": (keys.get("p99_ms"), keys.get("p99_ms") is not None and keys["p99_ms"] <= GOALS["key_p99_ms"]),
    }
    results["verdict"] = {k: {"value": v, "goal": GOALS[k], "ok": ok} for k, (v, ok) in verdict.items()}
    print()
    print(f"server {args.server}, {args.seconds:.0f} s per phase, flood {fl['lines_per_s']:.0f} lines/s")
    print(f"  idle CPU   {idle['cpu_pct']:6.2f} % of one core   (goal <= {GOALS['idle_cpu_pct']} %)")
    print(f"  flood CPU  {fl['cpu_pct']:6.2f} % of one core   (goal <= {GOALS['flood_cpu_pct']} %)")
    print(f"  RSS max    {rss:6.1f} MB                (goal <= {GOALS['rss_mb']} MB)")
    print(f"  key->screen during the flood: p50 {keys.get('p50_ms')} ms, p99 {keys.get('p99_ms')} ms, "
          f"max {keys.get('max_ms')} ms over {keys.get('presses')} presses, {kp['keys']['misses']} missed "
          f"(goal p99 <= {GOALS['key_p99_ms']} ms)")
    for name in ("help", "log"):
        k = kp["keys"].get(name, {})
        print(f"      {name:5s} p50 {k.get('p50_ms')} ms, p99 {k.get('p99_ms')} ms, max {k.get('max_ms')} ms "
              f"({k.get('presses')} presses)")
    print(f"  CPU while pressing keys in the flood: {kp['cpu_pct']:.2f} % of one core")
    print(f"  the server's own processes: idle {idle['server_cpu_pct']} %, flood {fl['server_cpu_pct']} %, "
          f"keys {kp['server_cpu_pct']} % of one core; whole box busy: idle {idle['box_busy_pct_of_all_cores']} %, "
          f"flood {fl['box_busy_pct_of_all_cores']} %, keys {kp['box_busy_pct_of_all_cores']} % of all cores")
    load = os.getloadavg()
    print(f"  box load average during the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(f"  engine processes left after quit: {results.get('engine_left') or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(ok for _, ok in verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
