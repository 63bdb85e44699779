"""Ranking two real vLLM presets on this CPU box: does `sweep --capacity`
(the paired default) rank two tiny-model presets that really differ the same
way round, run after run? (#43's CPU goal: 3 of 3.)

The two presets extend `cpu-demo` and differ in one engine argument,
max_num_seqs (default 2 against 16): with at most 2 sequences a step the
server queues what is past 2, so under a TTFT limit it carries fewer
requests; with 16 it batches them. Both servers are up side by side (the
paired sweep's co-residency; each holds its own 64 MiB KV cache), and the
load alternates between them.

    .venv/bin/python bench/rank_vllm_cpu.py --runs 3
    .venv/bin/python bench/rank_vllm_cpu.py --runs 3 --seqs 4 8   # a closer pair

Each run prints the sweep's pair verdict and its wall time; the tally says
how many runs named the same preset beyond noise, and whether any run named
the other one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from vllm_support import tiny_model_dir  # noqa: E402  (the tests' tiny ERNIE-4.5-shaped model)

# The tiny model on 2 cores: ~30 output tokens a request, prompts up to 200
# words, an SLO loose enough that a batching server passes a few levels.
SWEEP_ARGS = ["--max-tokens", "32", "--min-tokens", "30", "--max-tokens-in", "200", "--client-procs", "1",
              "--ready-timeout", "600", "--slo", "ttft_p99=2s", "--slo", "itl_p99=300ms",
              "--start-concurrency", "2", "--max-concurrency", "32", "--level-time", "15"]


def write_presets(path: Path, seqs: tuple[int, int], port: int = 28461) -> tuple[str, str]:
    names = (f"seqs{seqs[0]}", f"seqs{seqs[1]}")
    body = ""
    for i, (name, n) in enumerate(zip(names, seqs, strict=True)):
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{tiny_model_dir()}"
            port = {port + i}
            max_num_seqs = {n}
        """)
    path.write_text(body)
    return names


def run_once(presets: Path, names: tuple[str, str], out: Path, extra: list[str]) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "ernie_tui", "sweep", *names, "--presets", str(presets), "--capacity",
           "--out", str(out), *SWEEP_ARGS, *extra]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.monotonic() - t0, proc.returncode, proc.stdout[-3000:] + proc.stderr[-2000:]


def verdict_of(out: Path) -> dict:
    paired = json.loads(out.read_text()).get("paired") or {}
    pair = (paired.get("pairs") or [None])[0]
    if pair is None:
        return {"better": None, "gap_pct": None, "text": "no pair measured: " + "; ".join(paired.get("notes", []))}
    gap = pair.get("gap_pct")
    return {"better": pair.get("better"), "gap_pct": gap[0] if gap else None,
            "interval": gap[1:] if gap else None, "text": pair.get("text", "")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seqs", type=int, nargs=2, default=(2, 16), metavar=("A", "B"),
                   help="the two presets' max_num_seqs (2 16)")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here")
    args, extra = p.parse_known_args()
    tmp = Path(tempfile.mkdtemp(prefix="rank-vllm-cpu-"))
    names = write_presets(tmp / "presets.toml", tuple(args.seqs))
    seen: list[dict] = []
    for i in range(args.runs):
        out = tmp / f"run-{i}.json"
        wall, code, tail = run_once(tmp / "presets.toml", names, out, extra)
        v = verdict_of(out) if out.exists() else {"better": None, "gap_pct": None, "text": f"no export (exit {code})"}
        v.update(run=i + 1, wall_s=round(wall, 1), exit=code)
        seen.append(v)
        print(f"run {i + 1}: {v['text']} | {wall:.0f} s | exit {code}", flush=True)
        if code != 0:
            print(tail, file=sys.stderr)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(v) + "\n")
    named = [v["better"] for v in seen if v["better"]]
    first = max(set(named), key=named.count) if named else None
    print(f"named beyond noise: {len(named)} of {len(seen)} runs; {first} in {named.count(first) if first else 0}, "
          f"the other in {sum(1 for n in named if n != first)}; wall {', '.join(str(v['wall_s']) for v in seen)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
