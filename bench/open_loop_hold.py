"""Does the open loop's hold before a pass (capacity.open_loop_hold_s) cost
or save a rate search time, and does it keep short passes over the capacity
out? On the paced stand-in, whose capacity is set (--slots / the time each
request holds a slot: 32 / 0.64 s = 50 req/s here), the same rate search
runs with the hold (derived from the SLO and the tolerance) and without it
(min_pass_s 0, the rule before), interleaved, --rounds times.

    PYTHONPATH=src python bench/open_loop_hold.py --rounds 2

Prints per search: the answer, the wall time, the levels (+ pass, - fail,
c confirmation), the passes above the stand-in's capacity and the failed
confirmations.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import capacity_run as R
from ernie_tui.engine_ctl.load import slo as S

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slo", default="ttft_p99=1000ms")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--start-rate", type=float, default=8.0)
    p.add_argument("--level-time", type=float, default=20.0)
    p.add_argument("--max-requests", type=int, default=300)
    a = p.parse_args()
    capacity = a.slots / ((a.ttft_ms + (a.max_tokens - 1) * a.itl_ms) / 1000.0)
    srv = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0",
                            "--slots", str(a.slots), "--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = srv.stdout.readline().split()[-1]
        slo = S.parse_slo_text(a.slo)
        base = C.LevelRules(max_requests=a.max_requests, time_cap_s=a.level_time)
        hold = C.open_loop_hold_s(slo, a.tolerance, a.level_time)
        print(f"stand-in keeps up with {capacity:.1f} req/s; SLO {a.slo}; tolerance {a.tolerance}; "
              f"hold {hold:g} s; level cap {a.level_time:g} s, {a.max_requests} requests at most", flush=True)
        for k in range(a.rounds):
            arms = [("hold", None), ("no hold", 0.0)]
            for name, min_pass in (arms if k % 2 == 0 else arms[::-1]):
                cfg, settings = R.request_setup(min_tokens=10, max_tokens_in=40, max_tokens=a.max_tokens)
                t = time.monotonic()
                res = R.run_capacity(url, slo, search_config=C.SearchConfig(mode="rate", start_rate=a.start_rate,
                                                                            tolerance=a.tolerance),
                                     rules=replace(base, min_pass_s=min_pass), settings=settings,
                                     burst_config=cfg, use_metrics=False)
                wall = time.monotonic() - t
                over = [lv for lv in res.levels if lv.passed and not lv.confirmation
                        and (lv.rate or 0) > capacity * (1 + a.tolerance / 2)]
                bad = [lv for lv in res.levels if lv.confirmation and not lv.passed]
                levels = " ".join(f"{lv.rate:g}{'c' if lv.confirmation else ''}{'+' if lv.passed else '-'}"
                                  for lv in res.levels)
                cap = res.capacity or {}
                print(f"round {k + 1} {name:7s}: answer {cap.get('rate')} ({res.stop_reason}), {wall:.0f} s, "
                      f"{len(res.levels)} levels, {len(over)} passes over the capacity, {len(bad)} failed "
                      f"confirmations; goodput {cap.get('goodput_output_tps') or 0:.0f} tok/s; {levels}", flush=True)
    finally:
        srv.terminate()
        srv.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
