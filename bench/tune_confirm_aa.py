"""An A/A check of `ernie-tui tune --confirm`: BASE against a copy of itself.

BASE is the paced stand-in (tests/paced_server.py) with a proportional knee
(every token gap is itl x max(1, running / K)), so under `itl_p99` its
capacity is K x limit / itl. The space names one value of max_num_seqs, an
engine argument this stand-in ignores (it is not --engine-shaped): the one
trial, `aa-tune-0`, is BASE under another name and serves exactly as BASE
does. Each run is a whole tune in a fresh ERNIE_TUI_HOME (BASE measured, the
trial measured, then the paired confirmation of --confirm N rounds), and
reads the verdict from the run record. The truth is "no difference", so every
"beyond noise" is a false alarm, and a preset written would be a copy of BASE
called better. Issue #56's goal: "within noise" in at least 19 of 20 runs.

    PYTHONPATH=src .venv/bin/python bench/tune_confirm_aa.py --runs 20 [--confirm 3] [--json FILE]
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

from paced_presets import paced_preset  # noqa: E402
from vllm_support import tiny_model_dir  # noqa: E402  (the model dir preflight reads; the stand-in ignores it)

# The knee at K = 4 requests with 20 ms gaps: under itl_p99=50ms the capacity
# is 10, inside the search's 4..16. Short requests and levels keep a run
# near two and a half minutes on the 2-core box.
SEARCH = ["--slo", "itl_p99=50ms", "--slo", "ttft_p99=500ms", "--max-tokens", "16", "--min-tokens", "10",
          "--max-tokens-in", "40", "--start-concurrency", "4", "--max-concurrency", "16", "--level-time", "4",
          "--ready-timeout", "60", "--client-procs", "1"]


def files(tmp: Path, port: int, knee: int) -> tuple[Path, Path]:
    presets, space = tmp / "presets.toml", tmp / "space.toml"
    env = {"PACED_SLOTS": "512", "PACED_TTFT_MS": "20", "PACED_ITL_MS": "20", "PACED_ITL_SCALE_KNEE": str(knee)}
    presets.write_text(paced_preset("aa", tiny_model_dir(), port, env, max_num_seqs=2))
    space.write_text("max_num_seqs = [3]  # ignored by this stand-in: the trial is BASE under another name\n")
    return presets, space


def one_run(i: int, confirm: int, port: int, knee: int, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tune-aa-") as tmp_dir:
        tmp = Path(tmp_dir)
        presets, space = files(tmp, port, knee)
        env = {**os.environ, "ERNIE_TUI_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT / "src")}
        cmd = [sys.executable, "-m", "ernie_tui", "tune", "aa", "--presets", str(presets), "--space", str(space),
               "--trials", "1", "--confirm", str(confirm), "--seed", str(i), *SEARCH]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        (record,) = (tmp / "home" / "data" / "runs").glob("*-tune-*.json")
        res = json.loads(record.read_text())["results"]
        if keep is not None:  # the whole record: the paired duels say why a verdict went as it did
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"run-{port}-{i + 1}.json").write_text(record.read_text())
        written = (tmp / "home" / "config" / "presets.toml").exists()
    v, decided = res["verdict"], res["extra"].get("preset", {})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("preset ")), "")
    return {"run": i + 1, "beyond_noise": v["beyond_noise"], "gain_pct": v["gain_pct"], "low_pct": v["low_pct"],
            "high_pct": v["high_pct"], "text": v["text"], "write": decided.get("write"), "preset_file": written,
            "answer": line, "base": res["base_goodputs"], "best": res["best"]["goodput"] if res["best"] else None,
            "seconds": round(wall, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--confirm", type=int, default=3, help="tune's --confirm N (3, its default)")
    p.add_argument("--knee", type=int, default=4, help="the stand-in's K (4: capacity 10 under itl_p99=50ms)")
    p.add_argument("--port", type=int, default=28461)
    p.add_argument("--json", metavar="FILE", help="append one JSON line per run here")
    p.add_argument("--keep", metavar="DIR", type=Path, help="copy each run's tune record here")
    p.add_argument("--first", type=int, default=1, help="number the runs from this one (a second stream)")
    args = p.parse_args()
    print(f"A/A: aa against aa-tune-0 (the same server under another name), --confirm {args.confirm}, "
          f"{args.runs} runs", flush=True)
    calm = alarms = written = 0
    for i in range(args.first - 1, args.first - 1 + args.runs):
        r = one_run(i, args.confirm, args.port, args.knee, args.keep)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(r) + "\n")
        calm += r["beyond_noise"] is False
        alarms += r["beyond_noise"] is True
        written += bool(r["preset_file"])
        print(f"run {i + 1}: {r['text']}; {r['answer'] or 'no preset line'}; {r['seconds']:.0f} s", flush=True)
    print(f"within noise in {calm} of {args.runs} runs; beyond noise (false alarms) in {alarms}; "
          f"a preset written in {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
