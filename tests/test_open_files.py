"""A load's sockets under the open-file limit (ulimit -n).

Every request in flight is a socket, an open file. With a soft limit of 200
(a shell's 1,024 at concurrency 1,024 is the same story) a burst at 300 got
339 of 600 requests "cannot connect ... Too many open files" and reported
them as the server's connect errors; a search would have failed its levels
on them. Each test runs ernie-tui in a child whose limit is set, against the
paced stand-in over real HTTP, and reads what the server was sent."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from ernie_tui.engine_ctl.load import open_files
from test_loadgen import PacedServer

_SOFT, _HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


@pytest.fixture
def paced():
    servers: list[PacedServer] = []

    def start(*args: str) -> PacedServer:
        servers.append(PacedServer(*args))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _limited(soft: int, hard: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


def _probe(url: str, limit: tuple[int, int], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ernie_tui", "probe", "--url", url, "--model", "m",
                           "--min-tokens", "4", "--max-tokens-in", "8", "--max-tokens", "8", "--no-save", "--json",
                           *args], capture_output=True, text=True, timeout=240, preexec_fn=_limited(*limit))


needs_room = pytest.mark.skipif(_HARD != resource.RLIM_INFINITY and _HARD < 4096,
                                reason="this box's hard open-file limit is under 4,096")


@needs_room
def test_a_burst_past_the_soft_limit_raises_it_and_every_request_gets_through(paced):
    srv = paced("--slots", "400", "--ttft-ms", "200", "--itl-ms", "5")
    out = _probe(srv.url, (100, 4096), "--burst", "600", "--concurrency", "300")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["completed"] == 600 and d["failed"] == 0, d["errors"]
    assert len(srv.requests()) == 600


def test_a_burst_that_cannot_fit_under_the_hard_limit_says_so_and_sends_nothing(paced):
    srv = paced("--slots", "400", "--ttft-ms", "200", "--itl-ms", "5")
    out = _probe(srv.url, (100, 100), "--burst", "600", "--concurrency", "300")
    assert out.returncode == 1
    d = json.loads(out.stdout)
    assert d["completed"] == 0 and d["errors"]["by_kind"] == {"open_files": 1}
    message = d["errors"]["first"][0]
    assert "302 connections do not fit under this process's open-file limit (ulimit -n 100, hard limit 100" in message
    assert "raise the limit (`ulimit -n" in message
    assert srv.requests() == []  # not one request, not even the warm-up


def test_a_search_whose_ceiling_does_not_fit_is_lowered_to_what_does_and_says_so(paced):
    # More slots than any ceiling the limit allows: nothing queues, so the
    # search cannot stop as "saturated" (64 slots did, at a ceiling near 100,
    # rightly) and the ceiling is what it stops at.
    srv = paced("--slots", "256", "--ttft-ms", "20", "--itl-ms", "5")
    out = _probe(srv.url, (120, 120), "--capacity", "--slo", "ttft_p99=2000ms", "--start-concurrency", "16",
                 "--max-concurrency", "256")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    ceiling = d["config"]["search"]["max_concurrency"]
    assert 16 < ceiling < 120  # what fits beside the process's own files, not 256
    assert any(w.startswith(f"the highest concurrency was lowered from 256 to {ceiling}:") for w in d["warnings"])
    assert all(not lv["errors"] for lv in d["levels"]), [lv["errors"] for lv in d["levels"]]
    assert max(lv["concurrency"] for lv in d["levels"]) == ceiling
    assert d["stop_reason"] == "max_concurrency"  # the ceiling passed: "≥ ceiling", a lower bound


def test_a_search_whose_start_does_not_fit_does_not_start(paced):
    srv = paced("--slots", "64", "--ttft-ms", "20", "--itl-ms", "5")
    out = _probe(srv.url, (60, 60), "--capacity", "--slo", "ttft_p99=2000ms", "--start-concurrency", "64")
    assert out.returncode == 1
    d = json.loads(out.stdout)
    assert d["levels"] == [] and "do not fit under this process's open-file limit" in d["stop_message"]
    assert srv.requests() == []


def test_where_there_is_no_limit_to_read_the_load_goes_ahead(monkeypatch):
    monkeypatch.setattr(open_files, "resource", None)
    assert open_files.make_room(10_000) is None


def test_the_room_never_lowers_a_limit_and_counts_the_files_already_open():
    room = open_files.make_room(8)
    assert room is not None
    assert room.soft >= _SOFT or _SOFT == resource.RLIM_INFINITY
    assert room.connections >= 8 and room.in_use > 0


@needs_room
def test_an_open_loop_held_to_the_room_queues_its_sends_and_counts_none_as_the_servers_timeouts(paced):
    # 80 req/s of ~2 s requests want ~160 connections; under 120 files some 60
    # fit, so sends wait for a connection, for longer than the 5 s connect
    # timeout by the end. That wait is this client's, not the server's: it
    # belongs in those requests' TTFT (and the warning), not in failed requests.
    srv = paced("--slots", "400", "--ttft-ms", "200", "--itl-ms", "250")
    out = _probe(srv.url, (120, 120), "--burst", "400", "--rate", "80", "--min-output-tokens", "8")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["failed"] == 0, d["errors"]
    assert d["completed"] == 400 and len(srv.requests()) == 400
    assert any(w.startswith("at most ") and "waited for a connection" in w for w in d["warnings"]), d["warnings"]
    # the later sends waited seconds for a connection (the stand-in answers
    # its first token in 0.2 s), and that wait is in their TTFT
    assert d["ttft"]["p99"] > 2.0, d["ttft"]
