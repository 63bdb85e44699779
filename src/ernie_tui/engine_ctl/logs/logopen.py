"""Open a log that already holds a lot, reading what the screen needs.

A server that has logged requests for a week has gigabytes of llm.log; the
report needs only its last start, the charts only their window of stats
lines, the log pane only its last screenfuls. `read_existing()` plans the
reads and hands back the lines in file order, each section marked for the
parser, the pane, or both:

    [0 .. S)   before the last start (S): skipped, its newlines counted
    [S .. E)   the startup, to the parser, until it says the server serves
    [E .. T)   the middle: skipped, its lines known from counts (bytes.count, C speed)
    [T .. P)   the charts' window of stats lines older than the pane's: parser
    [P .. end) the pane's window (the last PANE_BYTES): parser and pane

so a section's line numbers are always the file's (`less -N`, parse-log
and the crash panel agree). The caller then follows the file from `end`
with a LogTailer(offset=end). `LineIndex` finds earlier lines on demand
(the pane scrolled to its top) from a few byte-offset anchors.

The last start is found by scanning backwards for the line the parser
treats as a new run (vLLM's "server version" line or its banner); the
parser itself judges each candidate. Memory stays bounded by a block or
two, whatever the file's size, and each byte is read about once (the
backward scan counts the newlines it passes). Pure stdlib plus the parser.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime

from ernie_tui.engine_ctl.logs.logparse import LogParser
from ernie_tui.engine_ctl.logs.logtail import split_block

__all__ = ["LineIndex", "Section", "count_newlines", "find_last_start", "last_start", "read_existing"]

BLOCK = 1 << 20  # one read while scanning or parsing
COUNT_CHUNK = 8 << 20  # one read while counting newlines
PANE_BYTES = 1 << 20  # the pane opens on about this much of the file's end (~10,000 lines)
CHART_WINDOW_S = 900.0  # the charts' longest window (tui.series.MAX_WINDOW)
CHART_SCAN_BYTES = 64 << 20  # at most this much is read for the charts' window
MAX_LINE_BYTES = 16 << 20  # a "line" longer than this is read in pieces
# No start logs this much before it serves; past it (a server whose log has
# neither uvicorn's INFO lines nor stats lines) the middle is skipped anyway.
STARTUP_MAX_BYTES = 64 << 20

# The candidates for a start line: vLLM's "vLLM server version X" and its
# banner's "version X"; the parser decides which of them start a run.
_START_HINT = b" version "
# A stats line (V1 "Engine 000: Avg prompt throughput", V0 the same words).
_STATS_HINT = b"Avg prompt throughput"
_STAMP = re.compile(rb" (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


@dataclass(frozen=True)
class Section:
    """Lines of one stretch of the file, in order."""

    lines: list[str]
    first_line_no: int  # the file's number of lines[0] (1-based)
    to_parser: bool
    to_pane: bool
    begin: int  # byte offset where lines[0] begins
    end: int  # byte offset just after these lines


def count_newlines(fd: int, begin: int, end: int, chunk: int = COUNT_CHUNK) -> int:
    """Newlines in bytes [begin, end): the number of lines there (a tailer
    counts \\r\\n once and a lone \\r not at all, as this does)."""
    n = 0
    pos = begin
    while pos < end:
        data = os.pread(fd, min(chunk, end - pos), pos)
        if not data:
            break
        n += data.count(b"\n")
        pos += len(data)
    return n


def _blocks_back(fd: int, lo: int, hi: int, block: int = BLOCK) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) blocks of whole lines, from `hi` (a line boundary or
    the file's end) back to `lo` (a line boundary)."""
    while hi > lo:
        start = max(lo, hi - block)
        data = os.pread(fd, hi - start, start)
        if start > lo:
            k = data.find(b"\n")
            if k < 0:  # inside a line longer than a block: keep going back
                hi = start
                continue
            start += k + 1
            data = data[k + 1:]
        if data:
            yield start, data
        hi = start


def _is_start(line: bytes) -> bool:
    parser = LogParser()
    parser.feed(line.decode("utf-8", "replace"))
    return parser.report.vllm_version is not None  # a version line: where a server start begins


def find_last_start(fd: int, size: int, is_start: Callable[[bytes], bool] = _is_start) -> int:
    """Byte offset of the line where the log's last server start begins, or
    0 when none is found (one start, logged before its version line, or
    none: the whole file is that run)."""
    return last_start(fd, size, is_start)[0]


def last_start(fd: int, size: int, is_start: Callable[[bytes], bool] = _is_start) -> tuple[int, int]:
    """(offset of the last start, newlines from there to `size`): counted on
    the way back, from the blocks read anyway, so that opening a log reads
    each byte once (this pass, then counting what lies before the start)."""
    lines = 0
    for start, data in _blocks_back(fd, 0, size):
        at = len(data)
        while True:
            k = data.rfind(_START_HINT, 0, at)
            if k < 0:
                break
            ls = data.rfind(b"\n", 0, k) + 1
            le = data.find(b"\n", k)
            if is_start(data[ls:le if le >= 0 else len(data)]):
                return start + ls, lines + data.count(b"\n", ls)
            at = ls
        lines += data.count(b"\n")
    return 0, lines


def _stamp(line: bytes) -> float | None:
    m = _STAMP.search(line, 0, 160)
    if not m:
        return None
    mo, d, h, mi, s = (int(x) for x in m.groups())
    try:
        return datetime(2000, mo, d, h, mi, s).timestamp()  # vLLM prints no year; spacing is what counts
    except ValueError:
        return None


def chart_window_start(fd: int, lo: int, hi: int, window_s: float = CHART_WINDOW_S,
                       max_bytes: int = CHART_SCAN_BYTES) -> int:
    """Line-aligned offset in [lo, hi] from which the stats lines cover the
    last `window_s` seconds of the log (or `max_bytes` before hi)."""
    last: float | None = None
    floor = max(lo, hi - max_bytes)
    for start, data in _blocks_back(fd, floor, hi):
        at = len(data)
        while True:
            k = data.rfind(_STATS_HINT, 0, at)
            if k < 0:
                break
            ls = data.rfind(b"\n", 0, k) + 1
            t = _stamp(data[ls:k])
            if t is not None:
                if last is None:
                    last = t
                elif t < last - window_s:
                    le = data.find(b"\n", k)
                    return start + le + 1 if le >= 0 else start + len(data)
            at = ls
    if floor > lo:  # stopped by max_bytes: begin at a line start after the floor
        data = os.pread(fd, min(BLOCK, hi - floor), floor)
        k = data.find(b"\n")
        return floor + k + 1 if k >= 0 else hi
    return lo


def _line_start_at_or_after(fd: int, offset: int, end: int) -> int:
    if offset <= 0:
        return 0
    pos = offset
    while pos < end:
        data = os.pread(fd, min(BLOCK, end - pos), pos - 1)
        k = data.find(b"\n")
        if k >= 0:
            return pos - 1 + k + 1
        pos += len(data) - 1
        if len(data) <= 1:
            break
    return end


def read_lines(fd: int, begin: int, end: int, block: int = BLOCK) -> Iterator[tuple[list[str], int, int]]:
    """(lines, their first byte, the byte after them) for [begin, end), a block at a time,
    each block cut at a line boundary (`end` is one, or the file's end)."""
    pos = begin
    while pos < end:
        want = min(block, end - pos)
        data = os.pread(fd, want, pos)
        if not data:
            return
        if pos + len(data) < end:
            k = data.rfind(b"\n")
            while k < 0 and len(data) < MAX_LINE_BYTES and pos + len(data) < end:
                more = os.pread(fd, min(block, end - pos - len(data)), pos + len(data))
                if not more:
                    break
                base = len(data)
                data += more
                k = data.find(b"\n", base)
            if k >= 0:
                data = data[:k + 1]
        yield split_block(data), pos, pos + len(data)
        pos += len(data)


def read_existing(fd: int, size: int, serving: Callable[[], bool],
                  pane_bytes: int = PANE_BYTES) -> Generator[Section, None, tuple[int, int]]:
    """What `fd` holds up to `size`, as Sections in file order (see the
    module's doc). `serving()` says whether the parser has seen the server
    start serving: the startup section ends there. The generator's return
    value is (end, lines before end): where and at which line number a
    follower goes on (the file's unfinished last line is left to it)."""
    if size <= 0:
        return 0, 0
    tail = os.pread(fd, min(BLOCK, size), max(0, size - BLOCK))
    k = tail.rfind(b"\n")
    end = size - len(tail) + k + 1 if k >= 0 else (0 if size <= BLOCK else size)
    if end <= 0:
        return 0, 0
    start, after_start = last_start(fd, end)
    pane = _line_start_at_or_after(fd, end - pane_bytes, end) if end > pane_bytes else 0
    first = min(start, pane)
    n = count_newlines(fd, 0, first)
    if start >= pane:
        # The last start is in the pane's window: the pane shows what came
        # before it (the previous run's end), the parser begins at the start.
        for lines, at, stop in read_lines(fd, pane, start):
            yield Section(lines, n + 1, False, True, at, stop)
            n += len(lines)
        for lines, at, stop in read_lines(fd, start, end):
            yield Section(lines, n + 1, True, True, at, stop)
            n += len(lines)
        return end, n
    # The startup, up to where the server serves (or the pane's window).
    pos = start
    at_start = n
    for lines, at, stop in read_lines(fd, start, pane):
        yield Section(lines, n + 1, True, False, at, stop)
        n += len(lines)
        pos = stop
        if serving() or stop - start >= STARTUP_MAX_BYTES:
            break
    # The charts' window of stats lines, and the middle skipped before it.
    chart = chart_window_start(fd, pos, end) if pos < pane else pane
    chart = min(max(chart, pos), pane)
    # The middle's lines: all after the start, less the rest (read next, far fewer).
    n = at_start + after_start - count_newlines(fd, chart, end)
    for lines, at, stop in read_lines(fd, chart, pane):
        yield Section(lines, n + 1, True, False, at, stop)
        n += len(lines)
    for lines, at, stop in read_lines(fd, pane, end):
        yield Section(lines, n + 1, True, True, at, stop)
        n += len(lines)
    return end, n


class LineIndex:
    """Where some lines of one file begin, to read earlier lines on demand.

    Anchors (line number -> byte offset) are kept sparse, about one per
    `spacing` bytes, so a week of log costs a few thousand of them; the
    lines before any line are found by reading forward from the anchor at
    or before it, then backwards from there."""

    def __init__(self, spacing: int = BLOCK):
        self.spacing = spacing
        self._lines: list[int] = []
        self._offsets: list[int] = []

    def add(self, line_no: int, offset: int) -> None:
        i = bisect_right(self._lines, line_no)
        if i and self._lines[i - 1] == line_no:
            return
        if i and i == len(self._lines) and offset - self._offsets[-1] < self.spacing:
            return  # the newest anchors: one per `spacing` bytes is enough
        self._lines.insert(i, line_no)
        self._offsets.insert(i, offset)

    def offset_of(self, fd: int, line_no: int) -> int | None:
        """Byte offset where line `line_no` begins, or None if no anchor is at
        or before it."""
        i = bisect_right(self._lines, line_no)
        if i == 0:
            return None
        at_line, pos = self._lines[i - 1], self._offsets[i - 1]
        need = line_no - at_line  # newlines to pass
        while need > 0:
            data = os.pread(fd, BLOCK, pos)
            if not data:
                return None
            c = data.count(b"\n")
            if c < need:
                need -= c
                pos += len(data)
                continue
            k = -1
            for _ in range(need):
                k = data.find(b"\n", k + 1)
            pos += k + 1
            need = 0
        self.add(line_no, pos)
        return pos

    def read_before(self, fd: int, line_no: int, max_lines: int = 2000) -> tuple[list[str], int]:
        """Up to `max_lines` lines just before line `line_no`, and the number
        of the first of them; ([], line_no) when there are none or no anchor."""
        if line_no <= 1:
            return [], line_no
        off = self.offset_of(fd, line_no)
        if off is None or off <= 0:
            return [], line_no
        lines: list[str] = []
        lo = off
        for start, data in _blocks_back(fd, 0, off):
            lines[:0] = split_block(data)
            lo = start
            if len(lines) >= max_lines or off - lo >= 4 * BLOCK:
                break
        lines = lines[-max_lines:]
        first = line_no - len(lines)
        if lines:
            self.add(first, self._start_of(fd, lo, off, len(lines)))
        return lines, first

    @staticmethod
    def _start_of(fd: int, lo: int, off: int, count: int) -> int:
        """Offset where the last `count` lines of [lo, off) begin."""
        data = os.pread(fd, off - lo, lo)
        k = len(data) - 1  # the newline that ends the last line
        for _ in range(count):
            k = data.rfind(b"\n", 0, k)
            if k < 0:
                return lo
        return lo + k + 1
