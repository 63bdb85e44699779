"""How close `ernie-tui tune` gets to a known optimum, on the engine-shaped stand-in.

The paced stand-in (tests/paced_server.py, PACED_ENGINE_SHAPED=1) takes its
slots and token gaps from --max-num-seqs and --max-num-batched-tokens, so the
true goodput of every setting is known (paced_server.engine_shaped_goodput).
Over max_num_seqs {2,4,8,16,32} x max_num_batched_tokens {1024,...,16384}
the optimum is 188 tok/s (B 4096 with S >= 8: 3 of the 25 cells).

Each run: a fresh ERNIE_TUI_HOME, `ernie-tui tune` with a budget of N
measured trials and its own seed; then the best setting it names is scored
with the stand-in's true goodput (not the noisy measurement) against the
optimum's. Goal (issue #46): within 10 % in 5 of 5 runs. vLLM's auto_tune
grid measures every cell once: 25 trials.

    PYTHONPATH=src .venv/bin/python bench/tune_standin.py [--runs 5] [--trials 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ernie_tui.demo_model import shared_tiny_model  # noqa: E402
from paced_presets import ENGINE_SHAPED, paced_preset  # noqa: E402
from paced_server import engine_shaped_goodput  # noqa: E402

SEQS = [2, 4, 8, 16, 32]
TOKENS = [1024, 2048, 4096, 8192, 16384]
SEARCH = ["--slo", "ttft_p90=100ms", "--max-tokens", "16", "--min-tokens", "10", "--max-tokens-in", "40",
          "--start-concurrency", "4", "--max-concurrency", "40", "--ready-timeout", "30", "--confirm-waves", "0",
          "--level-time", "8", "--tolerance", "0.15"]


def files(tmp: Path, port: int) -> tuple[Path, Path]:
    model = shared_tiny_model()
    presets, space = tmp / "presets.toml", tmp / "space.toml"
    presets.write_text(paced_preset("shaped", model, port, ENGINE_SHAPED, max_num_seqs=4,
                                    max_num_batched_tokens=8192))
    space.write_text(f"max_num_seqs = {SEQS}\nmax_num_batched_tokens = {TOKENS}\n")
    return presets, space


def one_run(seed: int, trials: int, port: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        presets, space = files(tmp, port)
        env = {**os.environ, "ERNIE_TUI_HOME": str(tmp / "home")}
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ernie_tui", "tune", "shaped", "--presets", str(presets),
                               "--space", str(space), "--trials", str(trials), "--seed", str(seed), "--no-preset",
                               *SEARCH], env=env, capture_output=True, text=True, timeout=3600)
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        (record,) = (tmp / "home" / "data" / "runs").glob("*-tune-*.json")
        res = json.loads(record.read_text())["results"]
    best = res["best"]
    truth = engine_shaped_goodput(best["params"]["max_num_seqs"], best["params"]["max_num_batched_tokens"])
    return {"seed": seed, "best": best["params"], "measured": best["goodput"], "true": truth,
            "trials": res["measured_trials"], "proposals": len(res["trials"]), "seconds": seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--port", type=int, default=18461)
    args = p.parse_args()
    optimum = max(engine_shaped_goodput(s, b) for s in SEQS for b in TOKENS)
    near = sum(engine_shaped_goodput(s, b) >= 0.9 * optimum for s in SEQS for b in TOKENS)
    print(f"true optimum {optimum:.0f} tok/s; {near} of {len(SEQS) * len(TOKENS)} cells within 10 %; "
          f"a {len(SEQS)}x{len(TOKENS)} grid needs {len(SEQS) * len(TOKENS)} trials", flush=True)
    hits = 0
    for i in range(args.runs):
        r = one_run(i + 1, args.trials, args.port)
        share = r["true"] / optimum
        hits += share >= 0.9
        print(f"run {i + 1} (seed {r['seed']}): best S {r['best']['max_num_seqs']} B "
              f"{r['best']['max_num_batched_tokens']}: measured {r['measured']:.0f}, true {r['true']:.0f} tok/s = "
              f"{100 * share:.0f} % of the optimum; {r['trials']} trials measured ({r['proposals']} proposals), "
              f"{r['seconds']:.0f} s", flush=True)
    print(f"within 10 % of the optimum in {hits} of {args.runs} runs, {args.trials} measured trials each "
          f"(the grid: {len(SEQS) * len(TOKENS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
