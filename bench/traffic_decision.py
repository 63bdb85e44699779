"""Does the traffic decide which preset wins? (#57's decision goal, on stand-ins.)

Two paced stand-ins (tests/paced_server.py) built so that the better one
depends on the traffic: "fast-decode" (4 ms between tokens, 1 ms of
prefill a prompt token) and "fast-prefill" (12 ms between tokens, 0.05 ms a
prompt token). Each is loaded by the same bursts, and they are ranked by
the requests a second they carry at concurrency 8:
- the default load (prompts of 30-300 tokens, 128 output tokens each);
- `--traffic long-doc-qa` (the built-in shape: prompts around 4,000
  tokens, short answers).
Rounds alternate which stand-in goes first. By construction the default
load should pick fast-decode and the long-document traffic fast-prefill;
what this checks is that a replayed profile carries that decision through
the tool's own load path (prompts built to the drawn lengths, the outputs
asked for), round after round.

    .venv/bin/python bench/traffic_decision.py --rounds 5
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from ernie_tui.engine_ctl.load import (  # noqa: E402
    BurstConfig,
    find_tokenizer,
    load_profile,
    replay_settings,
    run_burst,
)

STAND_INS = {
    "fast-decode": ["--itl-ms", "4", "--prefill-ms-per-token", "1.0"],
    "fast-prefill": ["--itl-ms", "12", "--prefill-ms-per-token", "0.05"],
}
COMMON = ["--slots", "8", "--ttft-ms", "5", "--max-model-len", "16384"]


def start(args: list[str], common: list[str] = COMMON) -> tuple[subprocess.Popen, str]:
    """A paced stand-in on a free port: (its process, its URL). Also traffic_decision_replica.py's."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "paced_server.py"), "--port", "0", *common, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening on "):
        raise SystemExit(f"the stand-in did not start: {line}")
    return proc, line.split()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--traffic", default="long-doc-qa")
    args = ap.parse_args()
    servers = {name: start(extra) for name, extra in STAND_INS.items()}
    profile = load_profile(args.traffic)
    wins = {"default": [], args.traffic: []}
    try:
        toks = {name: find_tokenizer(url=url) for name, (_, url) in servers.items()}
        for rnd in range(1, args.rounds + 1):
            order = list(servers) if rnd % 2 else list(reversed(servers))
            base = BurstConfig(n=args.n, concurrency=8, seed=rnd, warmup=True)
            loads = {"default": base, args.traffic: replace(base, **replay_settings(profile))}
            for load, cfg in loads.items():
                rps = {}
                for name in order:
                    r = run_burst(servers[name][1], cfg, tokenizer=toks[name])
                    rps[name] = r.requests_per_s or 0.0
                    if r.failed:
                        print(f"  {name}: {r.failed} failed: {r.errors.get('first')}", flush=True)
                best = max(rps, key=rps.__getitem__)
                wins[load].append(best)
                print(f"round {rnd} {load}: " + ", ".join(f"{k} {v:.2f} req/s" for k, v in rps.items())
                      + f" -> {best}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    for load, names in wins.items():
        print(f"{load}: " + ", ".join(f"{n} {names.count(n)} of {len(names)}" for n in STAND_INS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
