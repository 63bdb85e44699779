"""`ernie-tui tune` against vLLM's own grid (`python -m vllm.benchmarks.sweep.serve`),
on real vLLM CPU with the tests' tiny model (#58).

The same space for both: max_num_seqs x max_num_batched_tokens (--seqs,
--tokens; 4 x 4 by default), BASE the `cpu-demo` preset. The same SLO:
TTFT p99 and ITL p99 (--ttft-ms, --itl-ms).

1. vLLM's grid: `vllm.benchmarks.sweep.serve` starts a server for every
   setting (`--serve-params`, the cpu-demo preset's own argv as its
   `--serve-cmd`) and runs `vllm bench serve` against it (random prompts,
   --num-prompts at --concurrency, p99 TTFT and ITL). Its answer: the
   setting with the most output tok/s among those whose p99s meet the SLO.
   Timed from start to its summary.csv.
2. `ernie-tui tune` with a wall-time budget of a third of the grid's
   (--budget-fraction): the capacity search under the SLO per trial.
3. Both answers side by side: `ernie-tui sweep GRID_BEST TUNE_BEST --capacity`,
   the paired sweep (both served at once, --rounds duel rounds) and its
   verdict. Skipped when both answers are the same setting.

Everything runs in a work folder of its own (ERNIE_TUI_HOME inside it), and
prints what ran, each tool's answer and wall time, and the verdict; a JSON
summary is written there too.

    .venv/bin/python bench/tune_vs_grid.py                          # 4 x 4, the issue's goal
    .venv/bin/python bench/tune_vs_grid.py --seqs 2,8 --tokens 2048,8192 --keep /tmp/tvg   # 2 x 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
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

from vllm_support import tiny_model_dir  # noqa: E402  (the tests' tiny ERNIE-4.5-shaped model)

# The capacity search's load on this box (bench/rank_vllm_cpu.py's, its SLO from --ttft-ms / --itl-ms).
TUNE_LOAD = ["--max-tokens", "32", "--min-tokens", "30", "--max-tokens-in", "200", "--client-procs", "1",
             "--ready-timeout", "600", "--start-concurrency", "2", "--max-concurrency", "32", "--level-time", "15"]


# `vllm bench serve` by its module: the CLI entry asks importlib.metadata for
# "vllm", and the CPU build is installed as "vllm-cpu".
from vb_source import BENCH_CLIENT  # noqa: E402  (`vllm bench serve` by its module, kept in one place)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def write_presets(work: Path, port: int, base_seqs: int, base_tokens: int, name: str = "base") -> Path:
    """BASE is a point of the grid (--base-seqs x --base-tokens): the tune's
    answer "keep BASE" is then a setting of the same space, and the grid's
    server command (BASE's argv, the swept arguments replaced) is the same."""
    presets = work / "presets.toml"
    presets.write_text(textwrap.dedent(f"""
        [presets.{name}]
        description = "cpu-demo on the tiny model: BASE of the tune, the grid's server"
        extends = "cpu-demo"
        model = "{tiny_model_dir()}"
        port = {port}
        max_num_seqs = {base_seqs}
        max_num_batched_tokens = {base_tokens}
    """))
    return presets


def run_grid(work: Path, presets: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[dict, float]:
    """vLLM's sweep over the grid; (its best setting and figures, wall seconds)."""
    from ernie_tui.presets import load_presets

    base = load_presets([presets]).get("base")
    spec = base.launch_spec(str(tiny_model_dir()))
    params = [{"max_num_seqs": s, "max_num_batched_tokens": t} for s in args.seqs for t in args.tokens]
    (work / "grid.json").write_text(json.dumps(params))
    bench = [sys.executable, "-c", BENCH_CLIENT, "--backend", "vllm",
             "--base-url", spec.url, "--model", spec.served_model_name, "--tokenizer", str(tiny_model_dir()),
             "--dataset-name", "random", "--random-input-len", "100", "--random-output-len", "32",
             "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency), "--ignore-eos",
             "--percentile-metrics", "ttft,itl", "--metric-percentiles", "99"]
    argv = [sys.executable, "-m", "vllm.benchmarks.sweep.serve", "--serve-cmd", shlex.join(spec.argv),
            "--bench-cmd", shlex.join(bench), "--serve-params", str(work / "grid.json"), "-o", str(work / "grid"),
            "-e", "grid", "--server-ready-timeout", "600", "--num-runs", str(args.grid_runs), "--continue-on-error",
            # It resets vLLM's prefix cache between runs only for a command
            # named `vllm`; the preset's is `python -m ...`, and random prompts
            # share no prefix: nothing to reset.
            "--after-bench-cmd", shlex.join([sys.executable, "-c", "pass"])]
    print("$", shlex.join(argv), flush=True)
    t0 = time.monotonic()
    with open(work / "grid.log", "w") as log:
        done = subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              check=False)
    wall = time.monotonic() - t0
    print(f"grid: exit {done.returncode}, {wall:.0f} s wall ({len(params)} settings; log {work / 'grid.log'})",
          flush=True)
    return grid_answer(work / "grid" / "grid", len(params), args), wall


def grid_answer(folder: Path, settings: int, args: argparse.Namespace) -> dict:
    """The grid's best from each setting's run files (SERVE--max_num_seqs=A-max_num_batched_tokens=B/run=N.json;
    its summary.csv is not read: writing it fails on the CPU build, whose package metadata is vllm-cpu)."""
    rows = []
    for run in sorted(folder.glob("SERVE-*/run=*.json")):
        found = dict(re.findall(r"(max_num_seqs|max_num_batched_tokens)=(\d+)", run.parent.name))
        rows.append({**json.loads(run.read_text()), **found})
    ok = [r for r in rows if _f(r.get("p99_ttft_ms")) <= args.ttft_ms and _f(r.get("p99_itl_ms")) <= args.itl_ms]
    for r in rows:
        print(f"  grid {r.get('max_num_seqs')} x {r.get('max_num_batched_tokens')}: "
              f"{_f(r.get('output_throughput')):.1f} tok/s, TTFT p99 {_f(r.get('p99_ttft_ms')):.0f} ms, "
              f"ITL p99 {_f(r.get('p99_itl_ms')):.0f} ms", flush=True)
    if not ok:
        return {"settings": settings, "measured": len(rows), "best": None}
    best = max(ok, key=lambda r: _f(r.get("output_throughput")))
    return {"settings": settings, "measured": len(rows), "meet_slo": len(ok),
            "best": {"max_num_seqs": int(best["max_num_seqs"]),
                     "max_num_batched_tokens": int(best["max_num_batched_tokens"]),
                     "output_tps": _f(best.get("output_throughput"))}}


def _f(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("inf")


def run_tune(work: Path, presets: Path, args: argparse.Namespace, budget_s: float,
             env: dict[str, str]) -> tuple[dict, float]:
    space = work / "space.toml"
    space.write_text(f"max_num_seqs = {args.seqs}\nmax_num_batched_tokens = {args.tokens}\n")
    argv = [sys.executable, "-m", "ernie_tui", "tune", "base", "--presets", str(presets), "--space", str(space),
            "--budget", f"{max(60, int(budget_s))}s", "--confirm", "0", "--out-preset", "tuned",
            "--seed", str(args.seed),
            "--slo", f"ttft_p99={args.ttft_ms}ms", "--slo", f"itl_p99={args.itl_ms}ms", *TUNE_LOAD]
    print("$", shlex.join(argv[1:]), flush=True)
    t0 = time.monotonic()
    with open(work / "tune.log", "w") as log:
        done = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              check=False)
    wall = time.monotonic() - t0
    print(f"tune: exit {done.returncode}, {wall:.0f} s wall (log {work / 'tune.log'})", flush=True)
    from ernie_tui.engine_ctl.load import runstore

    runs = runstore.list_runs(kind="tune")
    res = runs[0].results if runs else {}
    best = res.get("best") or None
    base = statistics.median(res["base_goodputs"]) if res.get("base_goodputs") else None
    answer = None if best is None else {**best["params"], "goodput": best.get("goodput")}
    if base is not None and (answer is None or (answer["goodput"] or 0.0) <= base):
        # No trial carried more than BASE: the tune's answer is BASE's own setting.
        answer = {"max_num_seqs": args.base_seqs, "max_num_batched_tokens": args.base_tokens, "goodput": base,
                  "keep_base": True}
    return {"measured_trials": res.get("measured_trials"), "stopped": res.get("stopped"), "base_goodput": base,
            "best_trial": None if best is None else {**best["params"], "goodput": best.get("goodput")},
            "best": answer}, wall


def run_paired(work: Path, presets: Path, grid_best: dict, tune_best: dict, args: argparse.Namespace,
               env: dict[str, str]) -> tuple[str, float]:
    """Both answers as presets, compared by the paired sweep."""
    text = presets.read_text()
    for name, best in (("grid-best", grid_best), ("tune-best", tune_best)):
        text += textwrap.dedent(f"""
            [presets.{name}]
            extends = "base"
            max_num_seqs = {best["max_num_seqs"]}
            max_num_batched_tokens = {best["max_num_batched_tokens"]}
        """)
    both = work / "paired-presets.toml"
    both.write_text(text)
    argv = [sys.executable, "-m", "ernie_tui", "sweep", "grid-best", "tune-best", "--presets", str(both),
            "--capacity", "--repeat", str(args.rounds), "--out", str(work / "paired.json"),
            "--slo", f"ttft_p99={args.ttft_ms}ms", "--slo", f"itl_p99={args.itl_ms}ms", *TUNE_LOAD]
    print("$", shlex.join(argv[1:]), flush=True)
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - t0
    (work / "paired.log").write_text(done.stdout + done.stderr)
    # The pair's line under "Pairs": "- A carries N % more ... than B (..)" or "- ... within noise ...";
    # the table's rows name both presets too ("vs tune-best"), so only the list's lines are read.
    verdict = next((ln[2:] for ln in done.stdout.splitlines() if ln.startswith("- ") and "grid-best" in ln
                    and "tune-best" in ln), f"(exit {done.returncode}; see {work / 'paired.log'})")
    print(f"paired: {verdict} ({wall:.0f} s wall)", flush=True)
    return verdict, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=_ints, default=[2, 4, 8, 16], help="max_num_seqs values (2,4,8,16)")
    ap.add_argument("--tokens", type=_ints, default=[2048, 4096, 8192, 16384],
                    help="max_num_batched_tokens values (2048,4096,8192,16384)")
    ap.add_argument("--ttft-ms", type=int, default=2000)
    ap.add_argument("--itl-ms", type=int, default=300)
    ap.add_argument("--num-prompts", type=int, default=64, help="the grid's requests per setting (64)")
    ap.add_argument("--concurrency", type=int, default=8, help="the grid's concurrency (8)")
    ap.add_argument("--grid-runs", type=int, default=1, help="the grid's bench runs per setting (1)")
    ap.add_argument("--budget-fraction", type=float, default=1 / 3, help="tune's budget: this part of the grid's wall")
    ap.add_argument("--rounds", type=int, default=3, help="the paired comparison's duel rounds (3)")
    ap.add_argument("--base-seqs", type=int, default=4, help="BASE's max_num_seqs, a grid point (4)")
    ap.add_argument("--base-tokens", type=int, default=4096, help="BASE's max_num_batched_tokens, a grid point (4096)")
    ap.add_argument("--seed", type=int, default=0, help="tune's sampler seed (0): give each run its own")
    ap.add_argument("--port", type=int, default=28491)
    ap.add_argument("--keep", type=Path, help="work here (kept) instead of a temporary folder")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tune-vs-grid-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    env = {**os.environ, "ERNIE_TUI_HOME": str(home), "PYTHONPATH": str(ROOT / "src")}
    os.environ["ERNIE_TUI_HOME"] = str(home)  # run records read below
    if args.base_seqs not in args.seqs or args.base_tokens not in args.tokens:
        ap.error("BASE (--base-seqs x --base-tokens) must be a point of the grid")
    presets = write_presets(work, args.port, args.base_seqs, args.base_tokens)
    grid, grid_wall = run_grid(work, presets, args, env)
    print("grid best:", grid["best"], flush=True)
    tune, tune_wall = run_tune(work, presets, args, grid_wall * args.budget_fraction, env)
    print("tune best:", tune["best"], "stopped:", tune["stopped"], flush=True)
    verdict, paired_wall = "not compared", 0.0
    if grid["best"] and tune["best"]:
        same = all(grid["best"][k] == tune["best"][k] for k in ("max_num_seqs", "max_num_batched_tokens"))
        verdict = "the same setting" if same else ""
        if not same:
            verdict, paired_wall = run_paired(work, presets, grid["best"], tune["best"], args, env)
    summary = {"grid": {**grid, "wall_s": round(grid_wall, 1)}, "tune": {**tune, "wall_s": round(tune_wall, 1)},
               "paired": {"verdict": verdict, "wall_s": round(paired_wall, 1)},
               "args": vars(args) | {"keep": str(work)}}
    (work / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))
    print("work folder:", work)


if __name__ == "__main__":
    main()
