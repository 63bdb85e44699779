"""Is the paired sweep's verdict ever confidently wrong? (issue #56)

Three cases, each run N times, tallied against the truth:
- A/A: one preset under two names, served side by side: "within noise" is
  the only right answer (goal: 19 of 20);
- 25 %: the stronger carries 25 % more, on a drifting host whose tail
  sometimes spikes near the limit: never the weaker beyond noise; the
  stronger beyond noise with its gap within 10 points of 25 % (goal: 16 of 20);
- 10 %: never the weaker beyond noise (goal: 10 of 10).

Two stands:
- --stand sim (the default): tests/knee_sim.py, the real search, turn
  gate, ladder and verdict over simulated servers and clock (the paced
  stand-in's --itl-scale-knee model with its drift, p99 spikes of 30-90 % in a
  share of levels, noise on every reading): a run takes a fraction of a
  second, so every case runs its full count; --design fixed runs the duels
  at the loads round 0 found, as before 2026-12-07, for comparison;
- --stand paced: `ernie-tui sweep A B --capacity` on two paced stand-ins
  (tests/paced_server.py) with --drift and --tail-jitter: minutes a run on
  the 2-core box, so --runs is what fits.

    .venv/bin/python bench/verdict_calibration.py                       # sim, 20/20/10 runs
    .venv/bin/python bench/verdict_calibration.py --design fixed        # the old duels, same cases
    .venv/bin/python bench/verdict_calibration.py --stand paced --case 25 --runs 2 --level-time 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

# case -> (knee of the weaker, knee of the stronger, runs by default)
CASES = {"aa": (8, 8, 20), "25": (8, 10, 20), "10": (10, 11, 10)}


def tally_one(pair: dict, truth_pct: float, names: tuple[str, str]) -> dict:
    better = pair.get("better") if pair.get("beyond_noise") else None
    gap = pair.get("gap_pct")
    g = gap[0] if gap else None
    return {"better": better, "gap_pct": g, "held_back": bool(pair.get("held_back")), "text": pair.get("text"),
            "right": better == names[1] and truth_pct > 0, "wrong": better is not None and (truth_pct == 0
                                                                                       or better == names[0]),
            "within_10": better == names[1] and g is not None and abs(g - truth_pct) <= 10.0}


def run_sim(case: str, runs: int, design: str, drift: float, period: float, jitter: float, first_seed: int) -> list:
    from knee_sim import SimHost, SimPreset, run

    ka, kb, _ = CASES[case]
    truth = (kb / ka - 1) * 100
    out = []
    for i in range(runs):
        seed = first_seed + i
        host = SimHost(drift=drift, period_s=period, jitter=jitter, seed=seed, phase=seed * 0.7)
        result = run([SimPreset("weaker", ka), SimPreset("stronger", kb)], host, ladder=design == "ladder")
        v = tally_one(result.pairs[0].to_dict(), truth, ("weaker", "stronger"))
        rounds = max((d.round for d in result.duels), default=0) or 1
        v.update(run=i + 1, seed=seed, sim_s=round(host.now), uncertain=[n for n, k in result.knees.items()
                                                                          if k.get("uncertain")],
                 # simulated seconds of duel levels a round (rungs and second looks included)
                 duel_round_s=round(sum(d.seconds for d in result.duels) / rounds, 1))
        out.append(v)
    return out


def write_presets(path: Path, ka: int, kb: int, drift: float, period: float, jitter: float, jitter_ms: float,
                  port: int) -> tuple[str, str]:
    from vllm_support import tiny_model_dir

    body = ""
    for i, (name, knee) in enumerate((("weaker", ka), ("stronger", kb))):
        env = {"PACED_SLOTS": "512", "PACED_TTFT_MS": "20", "PACED_ITL_MS": "20", "PACED_ITL_SCALE_KNEE": str(knee),
               "PACED_DRIFT": str(drift), "PACED_DRIFT_PERIOD_S": str(period), "PACED_TAIL_JITTER": str(jitter),
               "PACED_TAIL_JITTER_MS": str(jitter_ms)}
        env_text = ", ".join(f'{k} = "{v}"' for k, v in env.items())
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{tiny_model_dir()}"
            port = {port + i}
            launcher = ["{sys.executable}", "{ROOT / 'tests' / 'paced_server.py'}"]
            env = {{ {env_text} }}
        """)
    path.write_text(body)
    return "weaker", "stronger"


def run_paced(case: str, runs: int, drift: float, period: float, jitter: float, jitter_ms: float, port: int,
              extra: list[str]) -> list:
    import os

    ka, kb, _ = CASES[case]
    truth = (kb / ka - 1) * 100
    tmp = Path(tempfile.mkdtemp(prefix="verdict-cal-"))
    names = write_presets(tmp / "presets.toml", ka, kb, drift, period, jitter, jitter_ms, port)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")
    out = []
    for i in range(runs):
        export = tmp / f"run-{i}.json"
        cmd = [sys.executable, "-m", "ernie_tui", "sweep", *names, "--presets", str(tmp / "presets.toml"),
               "--capacity", "--out", str(export), "--max-tokens", "32", "--min-tokens", "10", "--max-tokens-in",
               "40", "--client-procs", "1", "--ready-timeout", "60", "--slo", "ttft_p99=500ms", "--slo",
               "itl_p99=50ms", *extra]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        if not export.exists():
            print(proc.stderr[-2000:], file=sys.stderr)
            out.append({"run": i + 1, "better": None, "text": "no export", "wall_s": round(wall), "right": False,
                        "wrong": False, "within_10": False, "held_back": False})
            continue
        paired = json.loads(export.read_text())["paired"]
        v = tally_one(paired["pairs"][0] if paired.get("pairs") else {}, truth, names)
        v.update(run=i + 1, wall_s=round(wall), uncertain=[n for n, k in (paired.get("knees") or {}).items()
                                                           if k.get("uncertain")])
        out.append(v)
        print(f"  run {i + 1}: {v['text']} ({wall:.0f} s)", flush=True)
    return out


def summary(case: str, vs: list) -> str:
    n = len(vs)
    if case == "aa":
        return (f"A/A: within noise {sum(1 for v in vs if v['better'] is None)} of {n} (held back by a knee "
                f"check: {sum(v['held_back'] for v in vs)}); beyond noise (wrong) {sum(v['wrong'] for v in vs)}")
    return (f"{case} %: wrong beyond noise {sum(v['wrong'] for v in vs)} of {n}; right beyond noise "
            f"{sum(v['right'] for v in vs)}, with its gap within 10 points {sum(v['within_10'] for v in vs)}; "
            f"within noise {sum(1 for v in vs if v['better'] is None)} (held back by a knee check: "
            f"{sum(v['held_back'] for v in vs)})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stand", choices=("sim", "paced"), default="sim")
    p.add_argument("--case", choices=(*CASES, "all"), default="all")
    p.add_argument("--runs", type=int, default=None, help="runs a case (sim: 20, 20, 10; paced: 1)")
    p.add_argument("--design", choices=("ladder", "fixed"), default="ladder", help="sim only: the duels' design")
    p.add_argument("--drift", type=float, default=0.3, help="host speed drift, +- share (0.3)")
    p.add_argument("--period", type=float, default=120.0, help="the drift's period, s (120)")
    p.add_argument("--jitter", type=float, default=0.15,
                   help="sim: the share of levels whose p99 spikes by 30-90 %%; paced: of 5 s "
                        "periods whose tail spikes (0.15)")
    p.add_argument("--jitter-ms", type=float, default=15.0, help="paced: a spike's extra gap, ms (15)")
    p.add_argument("--seed", type=int, default=0, help="sim: the first run's seed (0)")
    p.add_argument("--port", type=int, default=29451, help="paced: the stand-ins' ports, this and the next")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here")
    args, extra = p.parse_known_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    for case in cases:
        runs = args.runs or (CASES[case][2] if args.stand == "sim" else 1)
        t0 = time.monotonic()
        if args.stand == "sim":
            vs = run_sim(case, runs, args.design, args.drift, args.period, args.jitter, args.seed)
        else:
            vs = run_paced(case, runs, args.drift, args.period, args.jitter, args.jitter_ms, args.port, extra)
        for v in vs:
            v.update(case=case, stand=args.stand, design=args.design)
        if args.json:
            with open(args.json, "a") as f:
                f.writelines(json.dumps(v) + "\n" for v in vs)
        print(f"[{args.stand}, {args.design}] {summary(case, vs)} ({time.monotonic() - t0:.0f} s)", flush=True)
        rounds_s = [v["duel_round_s"] for v in vs if v.get("duel_round_s")]
        if rounds_s:
            print(f"    duel levels a round (simulated): mean {sum(rounds_s) / len(rounds_s):.1f} s, "
                  f"max {max(rounds_s):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
