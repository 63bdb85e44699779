"""The paced stand-in's host drift (--drift, --itl-scale-knee): the pacing it
was set to have, with margins that hold on a busy box."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from paced_server import host_factor  # noqa: E402


def test_host_factor_is_a_sine_of_wall_time():
    assert host_factor(0.3, 120.0, t=30.0) == pytest.approx(1.3)  # a quarter period: the slowest
    assert host_factor(0.3, 120.0, t=90.0) == pytest.approx(0.7)
    assert host_factor(0.3, 120.0, t=120.0 * 1000 + 30.0) == pytest.approx(1.3)  # any server, any start
    assert host_factor(0.0, 120.0, t=30.0) == 1.0


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "paced_server.py"), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    return proc, line.split()[-1]


def _mean_gaps_ms(url: str, n: int, tokens: int) -> list[float]:
    """Send n streaming requests at once; each one's mean gap between
    tokens, from the server's own log (first token to last)."""
    import threading

    def one() -> None:
        body = json.dumps({"prompt": "a b c", "max_tokens": tokens, "stream": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    before = len(json.loads(urllib.request.urlopen(url + "/requests", timeout=10).read()))
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log = json.loads(urllib.request.urlopen(url + "/requests", timeout=10).read())[before:]
    return [(e["end"] - e["first"]) * 1000.0 / (tokens - 1) for e in log]


def _wait_for_phase(period_s: float, phase: float, lead_s: float) -> None:
    """Sleep until `lead_s` before the wall clock's next `phase` (0..1) of the period."""
    now = time.time()
    target = math.floor(now / period_s) * period_s + phase * period_s - lead_s
    while target <= now:
        target += period_s
    time.sleep(target - now)


def test_drift_scales_the_gaps_by_the_host_factor_and_the_knee():
    # Period 8 s, +-50 %: at a quarter the gaps are 1.5 x, at three quarters
    # 0.5 x. A burst of 8 requests on a knee of 4 doubles every gap: 40 ms x 2.
    period, amp, itl = 8.0, 0.5, 40.0
    proc, url = _start("--slots", "16", "--itl-ms", str(itl), "--ttft-ms", "5", "--itl-scale-knee", "4",
                       "--drift", str(amp), "--drift-period-s", str(period))
    try:
        tokens = 6  # 5 gaps of 40-120 ms: within +-0.3 s of the phase, the factor moves 3 % at most
        _wait_for_phase(period, 0.25, lead_s=0.25)
        slow = _mean_gaps_ms(url, 8, tokens)
        _wait_for_phase(period, 0.75, lead_s=0.15)
        fast = _mean_gaps_ms(url, 8, tokens)
    finally:
        proc.terminate()
        proc.wait(10)
    # Set: 40 x 2 x 1.5 = 120 ms and 40 x 2 x 0.5 = 40 ms. A busy box only adds
    # to a gap (a late wake-up), and the burst's first requests decode
    # briefly below the knee: margins for both.
    # The medians, not every request: a loaded box once held one request's
    # thread past its phase. The two phases are 3x apart, far beyond either margin.
    assert len(slow) == len(fast) == 8
    assert 100.0 <= statistics.median(slow) <= 170.0, slow
    assert 32.0 <= statistics.median(fast) <= 70.0, fast
