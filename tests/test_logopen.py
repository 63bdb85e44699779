"""Opening a log that holds a lot: the report from its last start, the
charts' window and the pane from its tail, the file's line numbers, earlier
lines on demand (engine_ctl.logopen, the watcher in engine_ctl.server).

The logs are a few MB made of the real fixture logs: a start, hours of
serving (access and stats lines with advancing timestamps), a restart.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from ernie_tui.engine_ctl.control.server import LogLines, LogRead, LogReplay, ReportPublished
from ernie_tui.engine_ctl.logs import logopen
from ernie_tui.engine_ctl.logs.logparse import parse_file
from ernie_tui.engine_ctl.logs.logtail import LogTailer
from ernie_tui.tui.series import log_time

CPU = "cpu-vllm0.32.0"
GPU = "gpu-h200-vllm0.26.0"


def serving(hours: float, start: datetime, per_stats: int = 12) -> str:
    """What a busy server logs: access lines, a stats line every 10 s."""
    out = []
    t = start
    for i in range(int(hours * 360)):
        for j in range(per_stats):
            out.append(f'(APIServer pid=1938) INFO:     127.0.0.1:{40000 + j} - "POST /v1/completions HTTP/1.1" '
                       f"200 OK\n")
        t += timedelta(seconds=10)
        out.append(f"(APIServer pid=1938) INFO {t:%m-%d %H:%M:%S} [loggers.py:257] Engine 000: Avg prompt "
                   f"throughput: {i % 50}.0 tokens/s, Avg generation throughput: {i % 70}.0 tokens/s, Running: "
                   f"{i % 4} reqs, Waiting: 0 reqs, GPU KV cache usage: {i % 9}.0%, Prefix cache hit rate: 0.0%\n")
    return "".join(out)


def startup(fixtures_dir: Path, name: str) -> str:
    """A fixture log up to its first stats line (its start), or all of a failed one."""
    text = (fixtures_dir / name).read_text(errors="replace")
    k = text.find("Avg prompt throughput")
    return text if k < 0 else text[:text.rfind("\n", 0, k) + 1]


def file_lines(path: Path) -> list[str]:
    tailer, out = LogTailer(path), []
    while batch := tailer.read_new():
        out += batch
    return out + ([tailer.partial] if tailer.partial else [])


@pytest.fixture
def restarted_log(tmp_path, fixtures_dir) -> Path:
    """CPU server serving 3 h, then a restart as the GPU server, serving 6 h."""
    path = tmp_path / "llm.log"
    t0 = datetime(2000, 11, 30, 3, 36)
    path.write_text(startup(fixtures_dir, f"{CPU}/ok_block32_len2048.log") + serving(3, t0)
                    + startup(fixtures_dir, f"{GPU}/ok_block16_len4096.log") + serving(6, t0 + timedelta(hours=4)))
    assert path.stat().st_size > 3 * logopen.PANE_BYTES  # a middle to skip
    return path


@pytest.fixture
def crashed_restart_log(tmp_path, fixtures_dir) -> Path:
    """A server serving 3 h, then a restart that fails (block 16 on CPU)."""
    path = tmp_path / "llm.log"
    path.write_text(startup(fixtures_dir, f"{GPU}/ok_block16_len4096.log")
                    + serving(3, datetime(2000, 11, 30, 3, 21))
                    + startup(fixtures_dir, f"{CPU}/fail_block16.log"))
    return path


def replay(path: Path) -> tuple[LogReplay, list[LogLines], int]:
    """Read `path` with the watcher a replay uses; return it, the pane's
    events and the number of snapshots it published."""
    watcher = LogReplay(path)
    events: list = []
    done = threading.Event()

    def listen(event):
        events.append(event)
        if isinstance(event, LogRead):
            done.set()

    watcher.add_listener(listen)
    watcher.start()
    assert done.wait(30), "the replay did not finish"
    watcher.close()
    published = sum(isinstance(e, ReportPublished) for e in events)
    return watcher, [e for e in events if isinstance(e, LogLines) and e.lines], published


def test_report_comes_from_the_last_start_and_matches_the_whole_file(restarted_log):
    watcher, panes, _ = replay(restarted_log)
    report = watcher.report
    whole = parse_file(restarted_log)
    assert report.vllm_version == "0.26.0" and report.kv_cache_tokens == 7_421_344 and report.ready
    mine, theirs = report.to_dict(), whole.to_dict()
    assert mine == theirs  # every figure, the line count and the latest stats sample included
    # The middle was skipped, not parsed; the stats read cover the charts' 15 minutes.
    assert len(watcher._parser.report.stats) < len(whole.stats)
    span = log_time(report.stats[-1].timestamp) - log_time(report.stats[0].timestamp)
    assert span >= logopen.CHART_WINDOW_S
    assert report.stats[-1].line_no == whole.stats[-1].line_no == len(file_lines(restarted_log))


def test_pane_lines_carry_the_files_numbers(restarted_log):
    watcher, panes, _ = replay(restarted_log)
    lines = file_lines(restarted_log)
    first = panes[0].first_line_no
    assert first > len(lines) // 2, "the pane opens on the log's end, not its first line"
    n = first
    for event in panes:
        assert event.first_line_no == n
        assert event.lines == lines[n - 1:n - 1 + len(event.lines)]
        n += len(event.lines)
    assert n - 1 == len(lines)


def test_earlier_lines_on_demand(restarted_log):
    watcher, panes, _ = replay(restarted_log)
    lines = file_lines(restarted_log)
    top = panes[0].first_line_no
    seen = 0
    while top > 1:
        earlier, first = watcher.read_earlier(watcher.run, top, 5000)
        assert earlier and first + len(earlier) == top
        assert earlier == lines[first - 1:top - 1]
        top, seen = first, seen + len(earlier)
    assert seen == panes[0].first_line_no - 1
    assert watcher.read_earlier(watcher.run, 1) == ([], 1)
    assert watcher.read_earlier(object(), 500) == ([], 500), "another run's lines are not this file's"


def test_crash_of_the_last_start_keeps_its_root_cause_line(crashed_restart_log):
    watcher, panes, _ = replay(crashed_restart_log)
    whole = parse_file(crashed_restart_log)
    err = watcher.report.error
    assert err is not None and err.kind.value == "block_size_unsupported"
    assert err.line_no == whole.error.line_no
    assert "No common block size for 16" in file_lines(crashed_restart_log)[err.line_no - 1]
    mine, theirs = watcher.report.to_dict(), whole.to_dict()
    # The whole-file parse drops the pid on the line that starts the new run
    # (LogParser resets the report after taking it); read from that line, it stays.
    assert mine.pop("pids") == {"APIServer": 7817, "EngineCore": 7919, "Worker_0": 7948}
    theirs.pop("pids")
    assert mine == theirs


def test_start_found_backwards_is_the_parsers_new_run(restarted_log, tmp_path):
    data = restarted_log.read_bytes()
    line_start = lambda k: data.rfind(b"\n", 0, k) + 1  # noqa: E731
    first = line_start(data.find(b"vLLM server version 0.32.0"))
    second = line_start(data.rfind(b"vLLM server version 0.26.0"))
    fd = os.open(restarted_log, os.O_RDONLY)
    try:
        assert logopen.find_last_start(fd, len(data)) == second
        assert logopen.find_last_start(fd, second) == first
        assert logopen.find_last_start(fd, first) == 0
        assert logopen.count_newlines(fd, 0, len(data)) == data.count(b"\n")
        assert logopen.last_start(fd, len(data)) == (second, data[second:].count(b"\n"))
    finally:
        os.close(fd)
    # A request that mentions a version is not a start: the parser judges each candidate.
    echo = tmp_path / "echo.log"
    echo.write_bytes(data[second:second + 20000]
                     + b"(APIServer pid=1938) INFO 11-30 09:00:00 [logger.py:1] Received request: prompt: "
                       b"'which server version 2.0 is best?'\n" + data[-5000:])
    fd = os.open(echo, os.O_RDONLY)
    try:
        assert logopen.find_last_start(fd, echo.stat().st_size) == 0
    finally:
        os.close(fd)


def test_snapshots_are_immutable_and_bounded(restarted_log):
    """Published snapshots never change after publishing, and a snapshot
    copies a bounded number of stats samples however long the log."""
    from ernie_tui.engine_ctl.logs.logparse import LogParser
    from ernie_tui.engine_ctl.logs.report import SNAPSHOT_STATS, ReportSnapshot

    parser = LogParser()
    parser.feed_many(file_lines(restarted_log))
    first = ReportSnapshot.of(parser.report, 1, "run")
    before = first.report.to_dict(include_stats=True)
    parser.feed_many(serving(1, datetime(2000, 12, 1)).splitlines())
    assert first.report.to_dict(include_stats=True) == before
    assert len(first.report.stats) <= SNAPSHOT_STATS and len(parser.report.stats) > SNAPSHOT_STATS
    with pytest.raises(AttributeError):
        first.version = 2  # frozen


def test_attach_follows_after_opening_with_the_files_numbers(restarted_log):
    """An attached server's log: opened like a replay, then followed; new
    lines continue the file's numbering and reach the report."""
    from ernie_tui.engine_ctl.control.server import AttachedServer

    watcher = AttachedServer("http://127.0.0.1:9", log_path=restarted_log, poll_interval=60)
    events: list = []
    watcher.add_listener(events.append)
    watcher.start()
    try:
        total = len(file_lines(restarted_log))

        def last_line_no() -> int:
            panes = [e for e in events if isinstance(e, LogLines) and e.lines]
            return panes[-1].first_line_no + len(panes[-1].lines) - 1 if panes else 0

        _wait(lambda: last_line_no() == total)
        with restarted_log.open("a") as f:
            f.write("(APIServer pid=1938) ERROR 11-30 09:00:00 [core.py:1] EngineCore encountered a fatal error.\n"
                    "(APIServer pid=1938) ERROR 11-30 09:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of "
                    "memory. Tried to allocate 2.00 GiB.\n")
        _wait(lambda: last_line_no() == total + 2)
        _wait(lambda: watcher.snapshot.report.error is not None)
        assert watcher.snapshot.report.error.kind.value == "cuda_oom"
        assert watcher.snapshot.report.error.line_no == total + 2
    finally:
        watcher.close()


def _wait(condition, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


async def test_dashboard_replay_opens_on_the_end_and_scrolls_up_into_earlier_lines(crashed_restart_log):
    """The dashboard's replay of a big log: the report and the crash panel
    from the last start, the pane on the log's end with the file's line
    numbers (the root cause is marked where the file has it), and earlier
    lines read when the pane scrolls up to its top."""
    from ernie_tui.tui.app import make_app
    from ernie_tui.tui.widgets.error_panel import ErrorPanel
    from ernie_tui.tui.widgets.log_view import LogView
    from test_tui_pilot import wait_for

    lines = [ln.expandtabs() for ln in file_lines(crashed_restart_log)]  # as the pane holds them
    app = make_app(mode="replay", replay_path=str(crashed_restart_log), live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.status is not None, what="the replay")
        log = app.main.query_one(LogView)
        log.flush()
        await pilot.pause()
        panel = app.main.query_one(ErrorPanel)
        assert panel.has_class("-visible") and "No common block size for 16" in str(panel.content)
        top = log._first_no
        assert top > 1 and log.line_count == len(lines) - top + 1
        assert log.lines() == lines[top - 1:]
        assert "No common block size for 16" in lines[log.root_cause_no - 1]
        assert f"from line {top:,}" in app.main.query_one("#log-pane").border_subtitle
        log.focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: log._first_no < top, 10, "earlier lines above the first")
        first = log._first_no
        assert log.lines() == lines[first - 1:]
        assert not log.follow and log.scroll_y > 0, "the view stays on the lines it showed"
        await pilot.press("q")
