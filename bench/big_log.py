"""How long until a huge llm.log shows its report and charts, and at what memory?

    .venv/bin/python bench/big_log.py [--sizes 100M,1G] [--keep DIR]

Builds each log in a temp dir from the real fixture logs only
(tests/fixtures/vllm-logs/gpu-h200-vllm0.26.0/ok_block16_len4096.log): its
startup, then its own access-log lines and its stats line repeated, the
stats line every 10 s of log time with an advancing timestamp (a busy
server's week, ~90 bytes a line), then opens it the ways the dashboard
does, each in a fresh process running the real app headless (Textual's
Pilot):

  replay   ernie-tui --replay LOG: until the report shows the KV cache size
           and the charts have their points from the log's stats lines;
  attach   ernie-tui --attach URL --log LOG (nothing listens at URL: only
           the log is read): until the report shows the KV cache size and
           the log pane shows the file's last line.

It prints wall seconds from building the app to that moment, and peak RSS
growth over the process's RSS after its imports (ru_maxrss): flat memory
means the growth does not scale with the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-logs" / "gpu-h200-vllm0.26.0" / "ok_block16_len4096.log"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def build_log(path: Path, size: int) -> int:
    """Write a log of at least `size` bytes; return its number of lines."""
    lines = FIXTURE.read_text().splitlines(keepends=True)
    first_stats = next(i for i, ln in enumerate(lines) if "Avg prompt throughput" in ln)
    head = "".join(lines[:first_stats])
    access = [ln for ln in lines[first_stats:] if "HTTP/1.1" in ln]
    stats = lines[first_stats]
    stamp = re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", stats)
    before, after = stats[:stamp.start()], stats[stamp.end():]
    block = "".join(access[i % len(access)] for i in range(12)).encode()  # 10 s of requests
    t = datetime(2000, 11, 30, 3, 21)
    n = head.count("\n")
    with open(path, "wb") as f:
        f.write(head.encode())
        written = len(head)
        buf = []
        while written < size:
            t += timedelta(seconds=10)
            chunk = block + f"{before}{t:%m-%d %H:%M:%S}{after}".encode()
            buf.append(chunk)
            written += len(chunk)
            n += 13
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf = []
        f.write(b"".join(buf))
    return n


def measure(mode: str, log: Path) -> dict:
    """In this (fresh) process: open `log` in the app, headless; time it."""
    import asyncio

    sys.path.insert(0, str(ROOT / "src"))
    from ernie_tui.tui.app import make_app
    from ernie_tui.tui.widgets.log_view import LogView

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - 4096))
        last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()

    async def run() -> float:
        t0 = time.perf_counter()
        if mode == "replay":
            app = make_app(mode="replay", replay_path=str(log), live=False)
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            app = make_app(mode="attach", attach_url=f"http://127.0.0.1:{port}", log_path=str(log), live=True)
        async with app.run_test(size=(120, 40), headless=True) as pilot:
            def shown() -> bool:
                if app.report is None or not app.report.kv_cache_tokens:
                    return False
                if mode == "replay":
                    return app._last_series is not None and len(app._last_series.points) > 0
                view = app.main.query_one(LogView)
                view.flush()
                return view.lines()[-1:] == [last]

            while not shown():
                await pilot.pause(0.01)
                if time.perf_counter() - t0 > 300:
                    raise SystemExit("not shown after 300 s")
            took = time.perf_counter() - t0
            await pilot.press("q")
        return took

    took = asyncio.run(run())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "shown_s": round(took, 3), "rss_after_imports_mb": round(rss0, 1),
            "rss_peak_mb": round(peak, 1), "rss_growth_mb": round(peak - rss0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100M,1G", help="comma-separated log sizes (K, M, G)")
    ap.add_argument("--keep", type=Path, help="build the logs here and keep them")
    ap.add_argument("--measure", nargs=2, metavar=("MODE", "LOG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        import textual  # noqa: F401  (imports first: RSS growth counts what opening the log costs)
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]))))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="big-log-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        print(f"{'size':>8} {'lines':>12} {'mode':>7} {'shown s':>8} {'RSS growth MB':>14} {'RSS peak MB':>12}")
        for size in [0, *sizes]:  # 0: the fixture log itself, what the app costs with a small log
            log = where / f"llm-{size >> 20}M.log"
            if size:
                lines = build_log(log, size)
            else:
                log.write_bytes(FIXTURE.read_bytes())
                lines = FIXTURE.read_bytes().count(b"\n")
            for mode in ("replay", "attach"):
                out = subprocess.run([sys.executable, __file__, "--measure", mode, str(log)], check=True,
                                     capture_output=True, text=True, cwd=ROOT)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{os.path.getsize(log) / 2**20:>7.2f}M {lines:>12,} {mode:>7} {r['shown_s']:>8.2f} "
                      f"{r['rss_growth_mb']:>14.1f} {r['rss_peak_mb']:>12.1f}", flush=True)
            if args.keep is None:
                log.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
