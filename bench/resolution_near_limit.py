"""The capacity search with and without --resolution, on a stand-in whose
capacity sits at its ITL limit.

The paced stand-in (tests/paced_server.py) is paced like the H200's slow host
near its limit: many requests in flight, token gaps that grow with the batch
(10 ms + 0.25 ms for each request beyond 32), each request's own pace (+-20 %)
and a speed that wanders +-5 % from one second to the next. Under
`itl_p99=25ms` the level at 80 reads a p99 of about 24.8-25.0 ms: a level at
the limit, whose windows' share of gaps within it straddles 99 %.

Rounds alternate the order; each round runs one search with the default
resolution (0.05) and one with `--resolution 0` (the exact limit), both the
command line's `probe --capacity --json`, one after the other on one server.
Printed per search: the capacity, the wall time, the levels, and each look
at the capacity level (time, windows, verdict, how it was decided).

    .venv/bin/python bench/resolution_near_limit.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PACING = ["--slots", "160", "--ttft-ms", "30", "--itl-ms", "10", "--itl-knee", "32", "--itl-slope-ms", "0.25",
          "--itl-spread", "0.2", "--itl-wander", "0.05", "--itl-wander-s", "1"]


def start_stand_in() -> tuple[str, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0", *PACING],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the stand-in did not start: {line!r}")
    url = line.split()[-1]
    httpx.get(url + "/health", timeout=5).raise_for_status()
    return url, proc


def search(url: str, resolution: float, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "ernie_tui", "probe", "--url", url, "--capacity", "--slo", args.slo,
            "--start-concurrency", str(args.start_concurrency), "--max-tokens", str(args.max_tokens),
            "--client-procs", "1", "--resolution", str(resolution), "--json", "--no-save"]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"the search failed ({out.returncode}): {out.stderr[-2000:]}")
    res = json.loads(out.stdout)
    res["wall_s"] = wall
    return res


def describe(res: dict, resolution: float) -> str:
    cap = (res.get("capacity") or {}).get("concurrency")
    levels = ",".join(str(lv["concurrency"]) + ("ʳ" if lv.get("measured_again") else "")
                      + ("ᶜ" if lv.get("confirmation") else "") for lv in res["levels"])
    looks = [f"{lv['elapsed_s']:.1f} s/{lv['windows']}w {lv['verdict']} "
             f"({lv['objectives'][0]['how']}, p99 {lv['itl_p99_ms']:.2f} ms)"
             for lv in res["levels"] if lv["concurrency"] == cap]
    return (f"resolution {resolution:g}: capacity {cap}, wall {res['wall_s']:.1f} s, search {res['seconds']:.1f} s, "
            f"levels {levels}\n    at {cap}: " + "; ".join(looks))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slo", default="itl_p99=25ms")
    p.add_argument("--start-concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--resolution", type=float, default=0.05, help="the one compared with 0 (default 0.05)")
    p.add_argument("--json", type=Path, default=None, help="write every search's result here")
    args = p.parse_args()
    url, proc = start_stand_in()
    walls: dict[float, list[float]] = {args.resolution: [], 0.0: []}
    kept = []
    try:
        for r in range(1, args.rounds + 1):
            order = (args.resolution, 0.0) if r % 2 else (0.0, args.resolution)
            for res_value in order:
                res = search(url, res_value, args)
                walls[res_value].append(res["wall_s"])
                kept.append({"round": r, "resolution": res_value, "result": res})
                print(f"round {r}, " + describe(res, res_value), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    for res_value, w in walls.items():
        print(f"resolution {res_value:g}: wall median {statistics.median(w):.1f} s over {len(w)} "
              f"({', '.join(f'{x:.1f}' for x in w)})")
    if args.json:
        args.json.write_text(json.dumps(kept, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
