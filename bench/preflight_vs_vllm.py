"""How much sooner `ernie-tui check` knows than vLLM itself.

For each bad preset, time `ernie-tui check NAME --json` (the real CLI in a
fresh Python, median of several runs) against the time the real vLLM CPU
server takes to exit with the error, on the tiny stand-in model. A case is
only launched when preflight says vLLM will reject it (so the "no KV size"
case never grabs 92 % of this box's memory); a preset vLLM accepts after all
is killed and reported as such.

    .venv/bin/python bench/preflight_vs_vllm.py [--cases a,b] [--check-runs 5] [--json]

Goal: ratio >= 20x for every case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import tomli_w

from ernie_tui.demo_model import shared_tiny_model
from ernie_tui.engine_ctl.launch import free_port, run_preflight
from ernie_tui.presets import load_presets
from ernie_tui.presets.store import preset_table

# name -> (changes to cpu-demo, the error kind we expect)
CASES = {
    "block16": ({"block_size": 16}, "block_size_unsupported"),
    "len_over_limit": ({"max_model_len": 8192}, "max_model_len_too_large"),
    "kv_too_small": ({"kv_cache_memory_bytes": "1M", "max_model_len": 4096}, "kv_cache_too_small"),
    "port_taken": ({}, "port_in_use"),
    "paged_attn_flag": ({"enable_paged_attn": True}, "unknown_argument"),
    "no_kv_size": ({"kv_cache_memory_bytes": None}, "insufficient_free_memory"),
}




def time_check(name: str, presets_file: Path, model: Path, env: dict, runs: int) -> tuple[float, int, dict]:
    times, rc, out = [], None, {}
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "ernie_tui", "check", name, "--presets", str(presets_file),
                            "--model", str(model), "--json"], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t)
        rc, out = p.returncode, json.loads(p.stdout)
    return statistics.median(times), rc, out


def time_vllm(argv: list[str], log: Path, timeout: float) -> tuple[float, int | None]:
    t = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # this server's own process group only
    except ProcessLookupError:
        pass
    proc.wait()
    return took, code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--check-runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ernie-bench-"))
    env = {**os.environ, "ERNIE_TUI_HOME": str(work / "home")}
    os.environ["ERNIE_TUI_HOME"] = env["ERNIE_TUI_HOME"]
    model = shared_tiny_model()  # shares vLLM's compile cache with the tests
    base = load_presets(include_user=False).get("cpu-demo")

    rows = []
    for case in args.cases.split(","):
        changes, kind = CASES[case]
        name = f"bench-{case}"
        preset = replace(base.with_changes(name=name, **changes), port=free_port())
        presets_file = work / f"{name}.toml"
        presets_file.write_text(tomli_w.dumps({"presets": {name: preset_table(preset)}}))
        holder = None
        if case == "port_taken":
            holder = socket.socket()
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", preset.port))
            holder.listen()
        try:
            t = time.perf_counter()
            pre = run_preflight(preset, str(model))
            inproc = time.perf_counter() - t
            found = [p.kind.value for p in pre.errors]
            check_s, rc, out = time_check(name, presets_file, model, env, args.check_runs)
            if kind not in found:
                rows.append({"case": case, "skipped": f"preflight found {found or 'no error'}, not {kind}: "
                                                      "not launching vLLM"})
                continue
            vllm_s, code = time_vllm(preset.launch_spec(str(model)).argv, work / f"{name}.log", args.timeout)
        finally:
            if holder is not None:
                holder.close()
        rows.append({"case": case, "kind": kind, "check_s": round(check_s, 3), "check_exit": rc,
                     "preflight_in_process_ms": round(inproc * 1000, 1), "vllm_s": round(vllm_s, 1),
                     "vllm_exit": code, "vllm_rejected": code not in (None, 0),
                     "ratio": round(vllm_s / check_s, 1)})

    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'case':<16} {'kind':<26} {'check (CLI)':>11} {'in-process':>10} {'vLLM fails':>10} {'ratio':>7}")
        for r in rows:
            if "skipped" in r:
                print(f"{r['case']:<16} skipped: {r['skipped']}")
                continue
            verdict = "" if r["vllm_rejected"] else "  (vLLM did NOT fail)"
            print(f"{r['case']:<16} {r['kind']:<26} {r['check_s']:>10.3f}s {r['preflight_in_process_ms']:>8.1f}ms "
                  f"{r['vllm_s']:>9.1f}s {r['ratio']:>6.0f}x{verdict}")
        done = [r for r in rows if "ratio" in r and r["vllm_rejected"]]
        if done:
            print(f"lowest ratio {min(r['ratio'] for r in done):.0f}x (goal >= 20x); vLLM total "
                  f"{sum(r['vllm_s'] for r in done):.0f} s vs check total {sum(r['check_s'] for r in done):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
