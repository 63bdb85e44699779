"""The log pane keeps following a flood past its line cap (issue #10, 1).

Pruning past the cap shrinks the pane's virtual size and Textual clamps
scroll_y; that clamp used to be read as the user scrolling up, so after a
few minutes of access-log lines a busy server's pane froze at 'PAUSED'.
Following is now changed only by what the user does: scroll up pauses it,
End / `l` (or scrolling back down to the end) resumes it.
"""

from __future__ import annotations

from pathlib import Path

from ernie_tui.tui.app import make_app
from ernie_tui.tui.widgets.log_view import LogView
from test_tui_pilot import free_port, wait_for

CAP = 20_000  # the main screen's LogView keeps this many lines
BATCH = 1_500


def access_lines(start: int, n: int) -> str:
    return "".join(f'INFO:     127.0.0.1:{40000 + (i % 20000)} - "POST /v1/completions HTTP/1.1" 200 OK #{i}\n'
                   for i in range(start, start + n))


def last_line(n: int) -> str:
    """The n-th line access_lines writes (1-based)."""
    return access_lines(n - 1, 1).rstrip("\n")


def bottom_line(log: LogView) -> str:
    """The text of the last row the pane shows."""
    height = log.scrollable_content_region.height
    return log.render_line(height - 1).text


async def test_log_follows_a_flood_past_the_cap(tmp_path: Path):
    log_file = tmp_path / "llm.log"
    log_file.write_text("")
    # Attach to a port nobody listens on: only the log matters here.
    app = make_app(mode="attach", attach_url=f"http://127.0.0.1:{free_port()}", log_path=str(log_file),
                   live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.main.query_one(LogView)
        assert log.max_lines == CAP
        written = 0
        with log_file.open("a") as f:
            while written < CAP + 3 * BATCH:  # past the cap, so at least one prune happens
                f.write(access_lines(written, BATCH))
                f.flush()
                written += BATCH
                n = written
                await wait_for(pilot, lambda n=n: log.lines()[-1:] == [last_line(n)], timeout=60,
                               what=f"line {n:,} in the pane")
                await pilot.pause()
                assert log.follow, f"following stopped by itself after {written:,} lines"
        assert log._first_no > 1, "the cap was passed: old lines were pruned"
        # The pane scrolls to the end on its next refresh: wait for it, not for a fixed 0.3 s.
        await wait_for(pilot, lambda: log.pending == 0 and bottom_line(log).rstrip().endswith(f"#{written - 1}"),
                       timeout=60, what="the newest line at the bottom of the pane")
        assert log.follow
        assert "PAUSED" not in app.main.query_one("#log-pane").border_subtitle

        # Lines written after the flood still show up at the bottom.
        with log_file.open("a") as f:
            f.write("INFO:     after the flood\n")
        await wait_for(pilot, lambda: "after the flood" in bottom_line(log), timeout=60,
                       what="the line written after the flood at the bottom")


async def test_scroll_up_pauses_and_end_resumes_past_the_cap(tmp_path: Path):
    log_file = tmp_path / "llm.log"
    log_file.write_text(access_lines(0, 500))
    app = make_app(mode="attach", attach_url=f"http://127.0.0.1:{free_port()}", log_path=str(log_file),
                   live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.main.query_one(LogView)
        await wait_for(pilot, lambda: log.line_count == 500, timeout=60, what="the first lines")
        # The pane scrolls to the end after a refresh, which a stalled box delays past a fixed pause.
        await wait_for(pilot, lambda: bottom_line(log).rstrip().endswith("#499"), timeout=60,
                       what="the last of the first lines at the bottom of the pane")
        log.focus()
        await pilot.press("up")
        await pilot.pause()
        assert not log.follow, "the user scrolling up pauses following"
        pane = app.main.query_one("#log-pane")
        assert "PAUSED" in pane.border_subtitle

        # A flood past the cap while paused: it stays paused, on the same lines,
        # and counts what arrived.
        written = 500
        with log_file.open("a") as f:
            while written < CAP + 2 * BATCH:
                f.write(access_lines(written, BATCH))
                f.flush()
                written += BATCH
                n = written
                await wait_for(pilot, lambda n=n: log.lines()[-1:] == [last_line(n)], timeout=60,
                               what=f"line {n:,} in the pane")
        await pilot.pause(0.3)
        assert not log.follow, "a flood does not resume following"
        assert log.pending >= written - 500 - 1
        assert log._first_no > 1
        assert "PAUSED" in pane.border_subtitle

        await pilot.press("end")
        await pilot.pause()
        assert log.follow and log.pending == 0
        assert bottom_line(log).rstrip().endswith(f"#{written - 1}")
        assert "following" in pane.border_subtitle

        # Mouse wheel up pauses too; scrolling back down to the end resumes.
        await pilot.pause(0.3)
        log.post_message(_wheel_up(log))
        await pilot.pause()
        assert not log.follow, "the wheel scrolling up pauses following"
        for _ in range(20):
            await pilot.press("down")
        await pilot.pause()
        assert log.follow, "scrolling back down to the end resumes following"


def _wheel_up(widget):
    from textual import events

    return events.MouseScrollUp(widget, x=5, y=5, delta_x=0, delta_y=-1, button=0, shift=False, meta=False,
                                ctrl=False)
