"""The fault and fuzz rows of bench/reliability.py, small and seeded.

Each test runs one row of the bench at a size that takes seconds (the full
sizes and their figures are in docs/lab/reliability.md) and checks its verdict
and the figures that make it. The tests for defects the rows found sit next
to them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench_scripts import load_bench

ROOT = Path(__file__).resolve().parent.parent


bench = load_bench("reliability")


def passed(verdict) -> bool:
    """assert passed(v): on failure pytest shows the verdict's report."""
    assert verdict.ok, verdict.report()
    return True


def test_start_stop_restart_kill9_cycles_on_the_stand_in(tmp_path):
    # Seed 11 draws every operation: restart, restart, stop, kill -9 then
    # stop, kill -9 then the next start straight after the crash.
    v = bench.row_cycles("stand-in", n=5, seed=11, workdir=tmp_path)
    assert passed(v)
    f = v.figures
    assert f["stop"] and f["restart"] and f["kill9"] and f["kill9_then_start"]
    assert f["launches"] == 7
    assert f["orphans"] == f["port_held_starts"] == f["leaked_fds"] == f["old_group_alive_at_launch"] == 0


def test_parser_fuzz_small(tmp_path):
    v = bench.row_parser_fuzz(seed=2, junk_lines=20_000, long_line=1 << 20, random_bytes=1 << 20,
                              workdir=tmp_path, cli=False)
    assert passed(v)
    assert v.figures["exceptions"] == v.figures["swallowed"] == 0
    assert v.figures["peak_rss_growth_mb"] < 50


def test_tailer_truncate_rotate_delete(tmp_path):
    v = bench.row_tailer(events=200, live_events=6, seed=3, workdir=tmp_path)
    assert passed(v)
    f = v.figures
    assert f["truncate"] and f["rotate"] and f["delete"] and f["lines"] > 5000 and f["live_lines"] > 100
    assert f["lost"] == f["doubled"] == f["live_lost"] == f["live_doubled"] == 0


def test_tailer_check_catches_a_lost_line():
    """The sequence check the tailer row relies on sees a gap and a repeat."""
    assert bench._check_sequence(["line 0 .", "line 1", "line 3"], 4) == (1, 0, 0)
    assert bench._check_sequence(["line 0", "line 1", "line 1"], 2) == (0, 1, 1)


def test_malformed_presets_name_file_and_line(tmp_path):
    v = bench.row_presets(mutations=60, seed=4, processes=False, workdir=tmp_path)
    assert passed(v)
    assert v.figures["good_errors"] == 2 * len(bench.PRESET_CASES)
    assert v.figures["mutation_errors"] > 10


def test_metrics_down_garbage_hanging():
    v = bench.row_metrics(timeout=0.5, seed=5, rounds=1, junk_lines=5_000)
    assert passed(v)
    assert v.figures["slowest_fetch_s"] < 3.5


def test_metrics_client_gives_up_on_a_dripping_server():
    """A /metrics that sends a few bytes every 0.2 s never trips httpx's
    per-read timeout: fetch() waited for ever. Now the whole answer has a
    deadline (the client's timeout)."""
    from ernie_tui.engine_ctl.load.metrics import MetricsClient, MetricsError

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000000\r\n\r\n"
    with bench.RawServer(lambda c, h: None) as srv:
        srv.behave = lambda c, h: bench._drip(srv, c, head, b"vllm:a 1\n")
        client = MetricsClient(srv.url, timeout=0.5)
        try:
            result, exc, secs, done = bench._timed(client.fetch, 8)
            assert done, "fetch() still blocked after 8 s"
            assert isinstance(exc, MetricsError) and "did not answer within" in str(exc)
            assert secs < 2.0
        finally:
            client.close()


def test_probe_hangs_drops_malformed_sse():
    # read_timeout 1 s, not less: the 20 MB line must stream within it on a busy box.
    v = bench.row_probe(read_timeout=1.0, total_timeout=2.5, seed=6)
    assert passed(v)
    assert v.figures["clear_errors"] == 13 and v.figures["ok_with_junk_counted"] == 2
    assert v.figures["slowest_s"] < 6.5  # the warm-up GET (1 s) and the 2.5 s deadline, plus slack
    kinds = dict(k.split(":", 1) for k in v.figures["kinds"].split(","))
    # Answers that are not a vLLM stream say so; they are not blamed on a dying server.
    assert kinds["html-200"] == kinds["not-http"] == kinds["only-garbage"] == "bad_response"
    assert kinds["only-garbage-then-done"] == "bad_response"


def test_probe_non_string_text_is_a_malformed_chunk_not_a_crash():
    """run_probe let a TypeError out (its contract: it never raises) when a
    chunk's text was not a string; now every event of the wrong shape is one
    counted malformed event (stream_chunk.read_chunk)."""
    from ernie_tui.engine_ctl.load.probe import run_probe

    def behave(c, h):
        c.sendall(bench._sse_head() + bench._chunk(b'data: {"choices": [{"text": 7}]}\n\n') + b"0\r\n\r\n")

    with bench.RawServer(behave) as srv:
        result = run_probe(srv.url, "hi", model="m", max_tokens=4, read_timeout=1, total_timeout=3)
    assert not result.ok and result.error is not None
    assert result.error.kind == "bad_response" and "1 malformed event" in result.error.message
    assert result.malformed_lines == 1


@pytest.mark.tmux
@pytest.mark.no_server  # the paced stand-in
def test_hangup_follows_each_on_exit_in_tmux(tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed")
    v = bench.row_hangup(workdir=tmp_path)
    assert passed(v)
    assert v.figures["ask_server"] == v.figures["stop_server"] == "stopped"
    assert v.figures["leave_server"] == "running" and v.figures["leave_server_json"]
