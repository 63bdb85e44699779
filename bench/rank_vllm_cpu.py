"""Ranking two real vLLM presets on this CPU box: does `sweep --capacity`
(the paired default) rank two tiny-model presets that really differ the same
way round, run after run (#43's and #56's CPU goal: 3 of 3), and does it call
one preset served twice "within noise" (#56's A/A goal: 5 of 5)?

The two presets extend `cpu-demo` and differ in one engine argument,
max_num_seqs (default 2 against 16): with at most 2 sequences a step the
server queues what is past 2, so under a TTFT limit it carries fewer
requests; with 16 it batches them. Both servers are up side by side (the
paired sweep's co-residency; each holds its own 64 MiB KV cache), and the
load alternates between them.

A/A (`--aa`, or two equal --seqs): the same preset under two names,
`seqsN-a` and `seqsN-b`, whose TOML differs only in the name and the port:
the truth is "no difference", so "within noise" is right and "beyond noise"
either way is a false alarm.

    .venv/bin/python bench/rank_vllm_cpu.py --runs 3
    .venv/bin/python bench/rank_vllm_cpu.py --runs 3 --seqs 4 8        # a closer pair
    .venv/bin/python bench/rank_vllm_cpu.py --runs 5 --seqs 16 16      # A/A (or --aa)
    .venv/bin/python bench/rank_vllm_cpu.py --runs 1 --port 32001 --keep DIR --json FILE

Each run prints the sweep's pair verdict, its knees by round and its wall
time and load averages; the tally says, for a pair, how many runs named the
same preset beyond noise and whether any named the other one; for A/A, how
many were within noise and how many were false alarms. Each run's export,
stdout, server logs and run records (its own ERNIE_TUI_HOME) are kept under
--keep (default: a new folder in the temp dir, printed).
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
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from vllm_support import tiny_model_dir  # noqa: E402  (the tests' tiny ERNIE-4.5-shaped model)

# The tiny model on 2 cores: ~30 output tokens a request, prompts up to 200
# words, an SLO loose enough that a batching server passes a few levels.
SWEEP_ARGS = ["--max-tokens", "32", "--min-tokens", "30", "--max-tokens-in", "200", "--client-procs", "1",
              "--ready-timeout", "600", "--slo", "ttft_p99=2s", "--slo", "itl_p99=300ms",
              "--start-concurrency", "2", "--max-concurrency", "32", "--level-time", "15"]


def preset_names(seqs: tuple[int, int]) -> tuple[str, str]:
    """Two names, never one: equal settings (A/A) get -a and -b, alike in
    length and order, so nothing but the name tells them apart."""
    if seqs[0] == seqs[1]:
        return f"seqs{seqs[0]}-a", f"seqs{seqs[1]}-b"
    return f"seqs{seqs[0]}", f"seqs{seqs[1]}"


def write_presets(path: Path, seqs: tuple[int, int], port: int = 28461) -> tuple[str, str]:
    names = preset_names(seqs)
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


def run_once(presets: Path, names: tuple[str, str], run_dir: Path, extra: list[str]) -> tuple[float, int, str]:
    """One sweep; its export (sweep.json, sweep.md), stdout and stderr, server
    logs (logs/) and run records (home/, its own ERNIE_TUI_HOME) stay in run_dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ernie_tui", "sweep", *names, "--presets", str(presets), "--capacity",
           "--out", str(run_dir / "sweep.json"), "--out", str(run_dir / "sweep.md"),
           "--log-dir", str(run_dir / "logs"), *SWEEP_ARGS, *extra]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT / "src"),
           "ERNIE_TUI_HOME": str(run_dir / "home")}
    t0 = time.monotonic()
    with open(run_dir / "stdout.txt", "w") as out, open(run_dir / "stderr.txt", "w") as err:
        proc = subprocess.run(cmd, stdout=out, stderr=err, text=True, env=env)
    wall = time.monotonic() - t0
    tail = (run_dir / "stdout.txt").read_text()[-3000:] + (run_dir / "stderr.txt").read_text()[-2000:]
    return wall, proc.returncode, tail


def verdict_of(out: Path) -> dict[str, Any]:
    paired = json.loads(out.read_text()).get("paired") or {}
    pair = (paired.get("pairs") or [None])[0]
    knees = {name: k.get("knees") for name, k in (paired.get("knees") or {}).items()}
    round0 = {s["preset"]: s.get("capacity") for s in paired.get("searches") or [] if isinstance(s, dict)}
    if pair is None:
        return {"better": None, "beyond_noise": False, "gap_pct": None, "interval": None, "held_back": None,
                "text": "no pair measured: " + "; ".join(paired.get("notes", [])), "knees": knees,
                "round0": round0}
    gap = pair.get("gap_pct")
    return {"better": pair.get("better"), "beyond_noise": bool(pair.get("beyond_noise")),
            "gap_pct": gap[0] if gap else None, "interval": gap[1:] if gap else None,
            "held_back": pair.get("held_back"), "text": pair.get("text", ""), "knees": knees, "round0": round0,
            "uncertain": {n: k.get("why") for n, k in (paired.get("knees") or {}).items() if k.get("uncertain")}}


def commit() -> str:
    """The code measured: HEAD, with '+dirty' where the tree differs from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no")
                                                  else "")


def tally(seen: list[dict[str, Any]], aa: bool) -> str:
    walls = ", ".join(str(v["wall_s"]) for v in seen)
    if aa:
        # The truth is no difference: within noise (held back or not) is right.
        within = sum(1 for v in seen if not v["beyond_noise"] and v["gap_pct"] is not None)
        alarms = [v for v in seen if v["beyond_noise"]]
        held = sum(1 for v in seen if not v["beyond_noise"] and v.get("held_back"))
        none = sum(1 for v in seen if v["gap_pct"] is None)
        return (f"A/A: within noise (right) in {within} of {len(seen)} runs ({held} of them held back: knee "
                f"uncertain); false alarms (beyond noise, either way) in {len(alarms)}"
                + (f" ({', '.join(str(v['better']) for v in alarms)})" if alarms else "")
                + (f"; no verdict in {none}" if none else "") + f"; wall {walls} s")
    named = [v["better"] for v in seen if v["better"]]
    first = max(set(named), key=named.count) if named else None
    return (f"named beyond noise: {len(named)} of {len(seen)} runs; {first} in "
            f"{named.count(first) if first else 0}, the other in {sum(1 for n in named if n != first)}; "
            f"wall {walls} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seqs", type=int, nargs=2, default=(2, 16), metavar=("A", "B"),
                   help="the two presets' max_num_seqs (2 16); equal values: an A/A run")
    p.add_argument("--aa", action="store_true", help="A/A: both presets at the second --seqs value (16 16)")
    p.add_argument("--port", type=int, default=28461, help="the first preset's port; the second's is the next")
    p.add_argument("--keep", metavar="DIR", help="keep each run's output under DIR/run-N (default: a temp dir)")
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here")
    args, extra = p.parse_known_args()
    seqs = (args.seqs[1], args.seqs[1]) if args.aa else tuple(args.seqs)
    aa = seqs[0] == seqs[1]
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rank-vllm-cpu-"))
    base.mkdir(parents=True, exist_ok=True)
    names = write_presets(base / "presets.toml", seqs, args.port)
    code_at = commit()
    print(f"{'A/A' if aa else 'pair'}: {names[0]} vs {names[1]}, code {code_at}, output kept in {base}", flush=True)
    seen: list[dict[str, Any]] = []
    first = 1 + sum(1 for d in base.glob("run-*") if d.is_dir())  # a second call into one DIR adds runs
    for i in range(first, first + args.runs):
        run_dir = base / f"run-{i}"
        load0, started = os.getloadavg(), time.strftime("%H:%M:%S", time.gmtime())
        wall, code, tail = run_once(base / "presets.toml", names, run_dir, extra)
        load1 = os.getloadavg()
        out = run_dir / "sweep.json"
        v: dict[str, Any] = verdict_of(out) if out.exists() else {
            "better": None, "beyond_noise": False, "gap_pct": None, "interval": None,
            "text": f"no export (exit {code})"}
        v.update(case="A/A" if aa else "pair", names=list(names), seqs=list(seqs), run=i, commit=code_at,
                 started_utc=started, ended_utc=time.strftime("%H:%M:%S", time.gmtime()), wall_s=round(wall, 1),
                 exit=code, load_start=[round(x, 2) for x in load0], load_end=[round(x, 2) for x in load1],
                 dir=str(run_dir))
        if aa:
            v["reading"] = "false alarm" if v["beyond_noise"] else ("within noise" if v["gap_pct"] is not None
                                                                     else "no verdict")
        seen.append(v)
        knees = "; ".join(f"{n} {k}" for n, k in (v.get("knees") or {}).items())
        print(f"run {i}: {v['text']} | knees by round: {knees or '-'} | {wall:.0f} s | load "
              f"{load0[0]:.1f} -> {load1[0]:.1f} | exit {code}", flush=True)
        if code != 0:
            print(tail, file=sys.stderr)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(v) + "\n")
    print(tally(seen, aa))
    return 0


if __name__ == "__main__":
    sys.exit(main())
