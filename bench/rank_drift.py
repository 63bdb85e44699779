"""Ranking two presets while the host drifts: does `sweep --capacity` name
the right one, with the right gap, and how long does it take?

Two paced stand-ins (tests/paced_server.py) whose capacities under the SLO
differ by a known factor (--gap 0.25: B carries 25 % more, at every moment),
both slowed by one host drift of +-A over P seconds of wall time (a sine
they share: --drift, --period). Runs `ernie-tui sweep A B --capacity` N
times (the paired default) and, with --sequential, the old mode
(`--sequential --repeat 3`) as well, and prints for each run its verdict,
the gap it estimated against the truth and its wall time, then the tally:
right preset beyond noise with its gap within 10 points of the truth, and
never the wrong preset named.

    .venv/bin/python bench/rank_drift.py --runs 10            # paired, 25 %
    .venv/bin/python bench/rank_drift.py --runs 3 --gap 0.10  # never the wrong one
    .venv/bin/python bench/rank_drift.py --runs 1 --sequential

The truth: with --itl-scale-knee K each gap is itl x f(t) x max(1, C / K),
so under itl_p99=L the capacity is K x L / (itl x f(t)) and the throughput at
it K / (itl x f(t)): preset B's K is (1 + gap) x A's.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from paced_presets import paced_preset  # noqa: E402
from vllm_support import tiny_model_dir  # noqa: E402  (the model dir preflight reads; the stand-in ignores it)

# Output tokens, prompt sizes and SLO of every run (both modes alike).
SWEEP_ARGS = ["--max-tokens", "32", "--min-tokens", "10", "--max-tokens-in", "40", "--client-procs", "1",
              "--ready-timeout", "60", "--slo", "ttft_p99=500ms", "--slo", "itl_p99=50ms"]


def write_presets(path: Path, gap: float, drift: float, period_s: float, knee_a: int = 8, itl_ms: float = 20.0,
                  port: int = 28451) -> tuple[str, str]:
    """Presets A (knee_a) and B (knee_a x (1 + gap)): the paced stand-in with
    its pacing in env, both on the same drift. Returns their names."""
    knee_b = knee_a * (1 + gap)
    if abs(knee_b - round(knee_b)) > 1e-9:
        raise SystemExit(f"--gap {gap} needs knee_a x (1 + gap) whole: {knee_b}")
    body = ""
    for i, (name, knee) in enumerate((("weaker", knee_a), ("stronger", int(round(knee_b))))):
        env = {"PACED_SLOTS": "512", "PACED_TTFT_MS": "20", "PACED_ITL_MS": str(itl_ms),
               "PACED_ITL_SCALE_KNEE": str(knee), "PACED_DRIFT": str(drift), "PACED_DRIFT_PERIOD_S": str(period_s)}
        body += paced_preset(name, tiny_model_dir(), port + i, env)
    path.write_text(body)
    return "weaker", "stronger"


def run_once(presets: Path, names: tuple[str, str], sequential: bool, out: Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "ernie_tui", "sweep", *names, "--presets", str(presets), "--capacity",
           "--out", str(out), *SWEEP_ARGS, *extra]
    if sequential:
        cmd += ["--sequential", "--repeat", "3"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"),
                                                                    **_env()})
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
    return wall


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def verdict_of(out: Path, names: tuple[str, str]) -> dict:
    """What a run's JSON export says: the preset named better (None: within
    noise), the gap it gives (of the better over the other, %) and how."""
    data = json.loads(out.read_text())
    paired = data.get("paired")
    if paired:
        pair = paired["pairs"][0] if paired.get("pairs") else None
        if pair is None:
            return {"better": None, "gap_pct": None, "text": "no pair measured"}
        gap = pair["gap_pct"]
        return {"better": pair["better"], "gap_pct": gap[0] if gap else None,
                "interval": gap[1:] if gap else None, "text": pair["text"]}
    rows = {r["preset"]: r for r in data["rows"]}
    score = {n: ((rows.get(n) or {}).get("stats", {}).get("goodput_output_tps") or {}).get("median")
             for n in names}
    if any(v is None for v in score.values()):
        return {"better": None, "gap_pct": None, "text": "a preset has no goodput"}
    a, b = (score[n] for n in names)
    noise = any(r.get("vs_best") == "within noise" for r in rows.values())
    hi, lo = (names[1], names[0]) if b >= a else (names[0], names[1])
    gap = (max(a, b) / min(a, b) - 1) * 100 if min(a, b) > 0 else math.inf
    text = f"{hi} {gap:.0f} % over {lo} (medians of 3)" + (", within noise" if noise else "")
    return {"better": None if noise else hi, "gap_pct": gap, "text": text}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="paired sweeps to run (3)")
    p.add_argument("--gap", type=float, default=0.25, help="B's capacity over A's, minus 1 (0.25)")
    p.add_argument("--drift", type=float, default=0.3, help="host speed drift, +- share (0.3)")
    p.add_argument("--period", type=float, default=120.0, help="the drift's period, s (120)")
    p.add_argument("--sequential", action="store_true", help="also run the old mode once per run")
    p.add_argument("--only-sequential", action="store_true", help="run the old mode only")
    p.add_argument("--knee", type=int, default=8, help="preset A's knee (8; B's is knee x (1 + gap))")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here")
    p.add_argument("--port", type=int, default=28451, help="the stand-ins' ports: this and the next (28451); "
                   "another at once needs its own")
    args, extra = p.parse_known_args()
    tmp = Path(tempfile.mkdtemp(prefix="rank-drift-"))
    names = write_presets(tmp / "presets.toml", args.gap, args.drift, args.period, knee_a=args.knee, port=args.port)
    truth = args.gap * 100
    modes = (["sequential"] if args.only_sequential else ["paired"] + (["sequential"] if args.sequential else []))
    tally: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(args.runs):
        for mode in modes:
            out = tmp / f"{mode}-{i}.json"
            wall = run_once(tmp / "presets.toml", names, mode == "sequential", out, extra)
            v = verdict_of(out, names) if out.exists() else {"better": None, "gap_pct": None, "text": "no export"}
            v.update(mode=mode, run=i + 1, wall_s=round(wall, 1), truth_pct=truth,
                     right=v["better"] == names[1], wrong=v["better"] == names[0],
                     within_10=v["gap_pct"] is not None and abs(v["gap_pct"] - truth) <= 10.0)
            tally[mode].append(v)
            gap = "-" if v["gap_pct"] is None else f"{v['gap_pct']:.1f} %"
            print(f"{mode} run {i + 1}: {v['text']} | gap {gap} (truth {truth:.0f} %) | {wall:.0f} s", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(v) + "\n")
    for mode, vs in tally.items():
        good = sum(1 for v in vs if v["right"] and v["within_10"])
        print(f"{mode}: right preset beyond noise, gap within 10 points: {good} of {len(vs)}; "
              f"wrong preset named: {sum(v['wrong'] for v in vs)}; wall {', '.join(str(v['wall_s']) for v in vs)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
