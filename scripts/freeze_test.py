"""Run one pytest test and freeze its whole process tree for a while.

    .venv/bin/python scripts/freeze_test.py TEST_ID DELAY_S FREEZE_S

DELAY_S seconds after pytest starts, every process of the run (pytest, the
stand-in servers and vLLM it started, their children) gets SIGSTOP, and
FREEZE_S seconds later SIGCONT: what a host's hiccup or a starved VM does to
every process of a CI box at once. A test against a stand-in or real vLLM
should pass through it; one that asserts what only a calm box gives goes red
here on demand instead of once a week in CI (tests/search_looks.py tells the
story of the first one found). pytest's output goes to stdout at the end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil


def send(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:  # ended meanwhile
            pass


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    test, delay, freeze = argv[0], float(argv[1]), float(argv[2])
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(delay)
    root = psutil.Process(run.pid)
    procs = [root, *root.children(recursive=True)]
    send(procs, signal.SIGSTOP)
    print(f"froze {len(procs)} processes at {delay:g} s for {freeze:g} s", flush=True)
    time.sleep(freeze)
    send(procs, signal.SIGCONT)
    out, _ = run.communicate()
    print(out, end="")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
