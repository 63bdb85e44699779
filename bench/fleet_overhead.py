"""What does the fleet view cost? Idle CPU and key latency of `ernie-tui`
watching N servers (the fleet view) against one (`--attach URL`).

    .venv/bin/python bench/fleet_overhead.py [--servers 8] [--seconds 60] [--key-seconds 30]

The servers are stand-ins (tests/tui_fake_vllm.py: vLLM's captured log and a
real 53 KB /metrics capture, served as-is), each its own process on its own
port, started once and shared by both runs. Each run starts the real app in
a real terminal (a private tmux server, 120x40; the machinery is
bench/tui_overhead.py's, imported, not copied):

  single  `ernie-tui --attach URL --log LOG`: the attach dashboard of one of them;
  fleet   `ernie-tui --fleet FILE` naming all N: one row per server.

Once every server shows ready, each run measures --seconds of idle (nothing
happens but the app's own polling; CPU of the app process alone, all its
threads, as % of one core) and then --key-seconds of key presses timed until
the screen shows them: in the dashboard `?` (help) and `v` (log prefixes);
in the fleet `?` (help) and down/up (the highlighted server, which the
detail line under the table names).

Goals: fleet idle CPU <= 2x the single-server idle CPU; fleet key p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ernie_tui.engine_ctl.launch import free_port
from tui_overhead import DASHBOARD_PRESSES, FIXTURES, HELP_PRESS, ROOT, Tmux, key_latencies, measure  # noqa: E402  (bench/ is no package)

GOALS = {"idle_cpu_ratio": 2.0, "key_p99_ms": 100.0}
CPU_FIXTURES = FIXTURES / "cpu-vllm0.32.0"


def highlighted_server(screen: str) -> str | None:
    """The server the fleet's detail line names (the highlighted row)."""
    for line in reversed(screen.splitlines()):
        words = line.split()
        if len(words) >= 2 and words[1].startswith("http://"):
            return words[0]
    return None


FLEET_PRESSES = (HELP_PRESS, HELP_PRESS, ("move", "Down", highlighted_server), ("move", "Up", highlighted_server))


def start_stand_ins(n: int, home: Path) -> list[tuple[str, str, Path, subprocess.Popen]]:
    env = {**os.environ, "ERNIE_FAKE_FIXTURES": str(CPU_FIXTURES), "ERNIE_FAKE_DELAY": "0.05",
           "ERNIE_FAKE_METRICS": str(CPU_FIXTURES / "ok_block32_len2048.metrics")}
    out = []
    for i in range(n):
        name, port = f"s{i + 1}", free_port()
        log = home / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "tui_fake_vllm.py"), "--model",
                                     str(home / "model"), "--port", str(port), "--block-size", "32"],
                                    stdout=f, stderr=subprocess.STDOUT, env=env)
        out.append((name, f"http://127.0.0.1:{port}", log, proc))
    deadline = time.monotonic() + 60
    for name, url, _, proc in out:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"stand-in {name} did not come up")
            time.sleep(0.2)
    return out


def run_app(label: str, argv: list[str], home: Path, ready, args, presses) -> dict:
    """Start the app in tmux, wait until ready(screen), measure idle and keys."""
    tmux = Tmux(f"ernie-fleet-bench-{os.getpid()}-{label}")
    command = " ".join([f"cd {ROOT} && exec env -u COLUMNS -u LINES ERNIE_TUI_HOME={home}",
                        f"PYTHONPATH={ROOT / 'src'}", sys.executable, "-m", "ernie_tui", *argv])
    try:
        tmux.start(command)
        app = psutil.Process(tmux.pane_pid())
        t0 = time.monotonic()
        while not ready(tmux.screen()):
            if not tmux.alive() or time.monotonic() - t0 > 60:
                raise SystemExit(f"{label}: not ready after {time.monotonic() - t0:.0f} s:\n{tmux.screen()}")
            time.sleep(0.5)
        time.sleep(5)  # let the first samples and the report settle
        print(f"{label}: ready; measuring idle for {args.seconds:.0f} s", flush=True)
        idle = measure(app, args.seconds)
        print(f"{label}: idle {json.dumps(idle)}", flush=True)
        keys = measure(app, args.key_seconds, during=lambda s: key_latencies(tmux, app, s, presses))
        print(f"{label}: keys {json.dumps(keys['keys']['all'])} ({keys['keys']['misses']} missed)", flush=True)
        screen = tmux.screen()
        tmux.keys("q")
        t1 = time.monotonic()
        while tmux.alive() and time.monotonic() - t1 < 20:
            time.sleep(0.3)
        return {"idle": idle, "keys": keys, "screen": screen}
    finally:
        tmux.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0, help="idle measurement per run")
    ap.add_argument("--key-seconds", type=float, default=30.0)
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is required", file=sys.stderr)
        return 2
    home = Path(tempfile.mkdtemp(prefix="ernie-fleet-bench-"))
    stand_ins: list = []
    results: dict = {"servers": args.servers, "seconds": args.seconds, "goals": GOALS}
    try:
        stand_ins = start_stand_ins(args.servers, home)
        name, url, log, _ = stand_ins[0]
        results["single"] = run_app("single", ["--attach", url, "--log", str(log)], home,
                                    lambda s: "READY" in (s.splitlines()[:1] or [""])[0], args, DASHBOARD_PRESSES)
        fleet = home / "fleet.toml"
        fleet.write_text("".join(f'[servers.{n}]\nurl = "{u}"\nlog = "{lg}"\n\n' for n, u, lg, _ in stand_ins))
        results["fleet"] = run_app("fleet", ["--fleet", str(fleet)], home,
                                   lambda s: s.count(" ready ") >= args.servers, args, FLEET_PRESSES)
    finally:
        for *_, proc in stand_ins:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)

    single, fleet = results["single"], results["fleet"]
    ratio = fleet["idle"]["cpu_pct"] / max(single["idle"]["cpu_pct"], 0.01)
    keys = fleet["keys"]["keys"]["all"]
    verdict = {"idle_cpu_ratio": (round(ratio, 2), ratio <= GOALS["idle_cpu_ratio"]),
               "key_p99_ms": (keys.get("p99_ms"), keys.get("p99_ms") is not None
                              and keys["p99_ms"] <= GOALS["key_p99_ms"])}
    results["verdict"] = {k: {"value": v, "goal": GOALS[k], "ok": ok} for k, (v, ok) in verdict.items()}
    print()
    print(f"{args.servers} stand-in servers, {args.seconds:.0f} s idle per run, {args.key_seconds:.0f} s of keys")
    for label in ("single", "fleet"):
        r = results[label]
        k = r["keys"]["keys"]
        print(f"  {label:6s} idle CPU {r['idle']['cpu_pct']:6.2f} % of one core, RSS {r['idle']['rss_mb_max']:.0f} MB; "
              f"keys p50 {k['all'].get('p50_ms')} ms, p99 {k['all'].get('p99_ms')} ms, "
              f"max {k['all'].get('max_ms')} ms over {k['all'].get('presses')} presses, {k['misses']} missed")
    print(f"  fleet / single idle CPU: {ratio:.2f}x (goal <= {GOALS['idle_cpu_ratio']}x); "
          f"fleet key p99 {keys.get('p99_ms')} ms (goal <= {GOALS['key_p99_ms']} ms)")
    load = os.getloadavg()
    print(f"  box load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(ok for _, ok in verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
