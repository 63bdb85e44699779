"""Does a capacity search's client stall when a level outruns its prompts?

A level sends more requests than it counts (the warm-up, the last window,
those in flight at the end). Before e8b14e3 every prompt past the ones built
before the level was built on the event loop that timestamps the streams,
each with a fresh scan of the tokenizer's vocabulary: on an H200 with the
0.3B-shape stand-in (103k words) the loop stood still for 9-20 s and levels
read TTFT p99s of 10-20 s.

This runs the same search against the paced stand-in (its capacity is its
slot count; its TTFT and ITL are set) with a tokenizer of the 0.3B shape, once
per source tree given (--src, e.g. a worktree of an older commit and src/),
and prints each level's TTFT p99, how long the client's loop stood still, and
the answer. Run from the repository root:

    PYTHONPATH=src .venv/bin/python bench/prompt_supply.py --src /tmp/old/src --src src
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

HERE = Path(__file__).resolve().parent.parent


def write_tokenizer(directory: Path, shape: str) -> None:
    from ernie_tui import demo_model as D

    words = D.vocabulary(D.SHAPES[shape].vocab_size)
    (directory / "tokenizer.json").write_text(json.dumps(D._tokenizer_json(words), ensure_ascii=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", required=True, help="a src/ folder to run the search from (repeat)")
    ap.add_argument("--slots", type=int, default=32, help="the stand-in's capacity (default 32)")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--shape", default="ernie-4.5-0.3b", help="the tokenizer's model shape (default ernie-4.5-0.3b)")
    ap.add_argument("--port", type=int, default=8961)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="prompt-supply-"))
    write_tokenizer(tmp, args.shape)
    env = {**os.environ, "PYTHONPATH": str(HERE / "src")}
    server = subprocess.Popen([sys.executable, str(HERE / "tests" / "paced_server.py"), "--port", str(args.port),
                               "--slots", str(args.slots), "--ttft-ms", str(args.ttft_ms), "--itl-ms",
                               str(args.itl_ms)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "listening on ..."
        print(f"paced stand-in: {args.slots} slots, TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms; "
              f"tokenizer of the {args.shape} shape")
        for src in args.src:
            cmd = [sys.executable, "-m", "ernie_tui", "probe", "--url", f"http://127.0.0.1:{args.port}",
                   "--tokenizer", str(tmp), "--capacity", "--start-concurrency", str(args.slots),
                   "--max-concurrency", str(args.slots), "--slo", "ttft_p99=1000ms", "--max-tokens", "16",
                   "--min-tokens", "30", "--max-tokens-in", "300", "--no-save", "--json"]
            t0 = time.monotonic()
            out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(Path(src).resolve())},
                                 capture_output=True, text=True, timeout=900)
            wall = time.monotonic() - t0
            if out.returncode not in (0, 1):
                print(f"{src}: exit {out.returncode}\n{out.stderr[-2000:]}")
                continue
            res = json.loads(out.stdout)
            res = res if "levels" in res else next(v for v in res.values() if isinstance(v, dict) and "levels" in v)
            cap = (res.get("capacity") or {}).get("concurrency")
            print(f"\n{src}: answer {cap} (true capacity {args.slots}), {wall:.1f} s; "
                  f"prompts built during a level on the loop: {res['workload'].get('built_when_dry', 'not counted')}")
            for lv in res["levels"]:
                tag = " (confirmation)" if lv.get("confirmation") else ""
                print(f"  C={lv['concurrency']:>3}{tag:15} {lv['verdict']:9} TTFT p99 {lv['ttft_p99_ms']:8.0f} ms  "
                      f"loop stood still up to {lv['client_lag_max_ms']:7.0f} ms")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
