"""How fast is the vLLM log parser? Compare it with grep in the same run.

    .venv/bin/python bench/parse_speed.py [--lines 1000000] [--repeat 3]

Builds two logs of at least --lines lines in a temp dir, only from the
fixture logs (tests/fixtures/vllm-logs):

  fixture mix   every fixture log concatenated, over and over: a server
                start (or crash, with tracebacks and argparse dumps) every
                ~200 lines. Pessimistic: startup lines are the ones that
                reach the detailed handlers, and each start resets the report.
  serving mix   what a long-running server's llm.log looks like: the ok
                fixtures' startups once, then their steady-state part
                (access-log and periodic stats lines) repeated, then the
                shutdown.

For each it times, on that same file:

  * parse_file(path)            the whole-file path (chunks, decode, scan)
  * LogParser.feed(line)        the live path, one call per line as the server
                                watcher does it (lines pre-split: parser only)
  * grep -E -c PATTERN path     grep counting lines matching the substrings the
                                parser looks for (its prefilter, as one ERE)

and prints lines/s, the parser/grep ratio, and CPU seconds next to wall
seconds: the box is shared, and CPU time is what the parser itself costs.
Best of --repeat runs for each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from ernie_tui.engine_ctl.logs import LogParser, parse_file  # noqa: E402

# Roughly what the parser's prefilter looks for, as one ERE for grep.
GREP_PATTERN = (
    r"server version|non-default args|Resolved architecture|Using |took |KV cache|concurrency|blocks: "
    r"|Starting vLLM|Avg prompt throughput|LLM engine|Capturing|Error|Exception|error:|died"
    r"|startup complete|\[shutdown\]"
)


def fixtures_dir() -> Path:
    path = ROOT / "tests" / "fixtures" / "vllm-logs"
    if not path.is_dir():
        sys.exit(f"fixture logs not found (expected {path})")
    return path


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")


def build_fixture_mix(dest: Path, min_lines: int) -> int:
    one = b"".join(b"\n".join(_lines(p)) + b"\n" for p in sorted(fixtures_dir().glob("*/*.log")))
    per = one.count(b"\n")
    reps = -(-min_lines // per)
    with open(dest, "wb") as f:
        for _ in range(reps):
            f.write(one)
    return per * reps


def build_serving_mix(dest: Path, min_lines: int) -> int:
    heads, bodies, tails = [], [], []
    for p in sorted(fixtures_dir().glob("*/ok_*.log")):
        lines = _lines(p)
        ready = next(i for i, ln in enumerate(lines) if b"Application startup complete" in ln)
        stop = next((i for i, ln in enumerate(lines) if b"[shutdown]" in ln), len(lines))
        heads.append(lines[: ready + 1])
        bodies.append(lines[ready + 1: stop])
        tails.append(lines[stop:])
    body = [ln for b in bodies for ln in b]
    n = 0
    with open(dest, "wb") as f:
        for part in heads[:1]:  # one server: the first ok fixture's startup
            f.write(b"\n".join(part) + b"\n")
            n += len(part)
        block = b"\n".join(body) + b"\n"
        while n < min_lines - len(tails[0]):
            f.write(block)
            n += len(body)
        f.write(b"\n".join(tails[0]) + b"\n")
        n += len(tails[0])
    return n


def best(fn, repeat: int) -> tuple[float, float]:
    """(wall, cpu) seconds, each the minimum over `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def bench_one(name: str, path: Path, n: int, repeat: int) -> dict[str, float]:
    size_mb = path.stat().st_size / 1e6
    print(f"\n{name}: {n:,} lines, {size_mb:.1f} MB")
    report = parse_file(path)
    assert report.lines == n, (report.lines, n)

    w_file, c_file = best(lambda: parse_file(path), repeat)
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")[:n]

    def per_line() -> None:
        feed = LogParser().feed
        for line in lines:
            feed(line)

    w_feed, c_feed = best(per_line, repeat)
    lines = []  # frees them before the grep timing (per_line holds the cell)
    print(f"  parse_file       wall {w_file:6.3f} s  {n / w_file / 1e6:5.2f} M lines/s"
          f"   cpu {c_file:6.3f} s  {n / c_file / 1e6:5.2f} M lines/s")
    print(f"  feed() per line  wall {w_feed:6.3f} s  {n / w_feed / 1e6:5.2f} M lines/s"
          f"   cpu {c_feed:6.3f} s  {n / c_feed / 1e6:5.2f} M lines/s")
    out = {"file_wall": w_file, "file_cpu": c_file}
    grep = shutil.which("grep")
    if grep:
        cmd = [grep, "-E", "-c", GREP_PATTERN, str(path)]
        matched = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

        def run_grep() -> None:
            subprocess.run(cmd, capture_output=True, check=False)

        w_grep, _ = best(run_grep, repeat)
        t0 = os.times()
        run_grep()
        t1 = os.times()
        c_grep = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
        print(f"  grep -E -c       wall {w_grep:6.3f} s  {n / w_grep / 1e6:5.2f} M lines/s"
              f"   cpu {c_grep:6.3f} s   ({matched} lines match)")
        print(f"  ratio parse_file/grep: {w_file / w_grep:.1f}x (wall)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results = {}
    with tempfile.TemporaryDirectory(prefix="ernie-bench-") as tmp:
        for name, build in (("fixture mix", build_fixture_mix), ("serving mix", build_serving_mix)):
            path = Path(tmp) / (name.split()[0] + ".log")
            n = build(path, args.lines)
            r = bench_one(name, path, n, args.repeat)
            results[name] = n / r["file_wall"], n / r["file_cpu"]
            path.unlink()
    print()
    for name, (wall_rate, cpu_rate) in results.items():
        verdict = "met" if wall_rate >= 1e6 else ("met in CPU time only" if cpu_rate >= 1e6 else "NOT met")
        print(f"goal >= 1,000,000 lines/s, parse_file, {name}: {verdict}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
