"""Server-Sent Events: an incremental parser and the payload decoder.

Why our own parser and not httpx-sse: probes and bursts stream over aiohttp
by default (httpx is kept only as a fallback transport), and httpx-sse reads
httpx responses only. The timing also needs what httpx-sse does not give:
every event of one network read, so the read's arrival time can be shared by
its events (see stream_timing.StreamState.handle_read), where httpx-sse
yields events one by one with the read boundaries lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# A single SSE line larger than this is not something vLLM sends; drop it
# rather than grow memory without bound.
MAX_SSE_LINE = 16 * 1024 * 1024


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    """Incremental Server-Sent Events parser (the WHATWG rules, tolerant).

    Feed it bytes as they arrive; it returns complete events. Lines may end
    in \\n, \\r\\n or \\r and may be split anywhere across feeds (also inside
    a UTF-8 sequence: lines are decoded only once complete). Comment lines
    (':' keep-alives) are counted and skipped, lines of unknown fields
    counted (non_sse_lines) and skipped, bytes that are not UTF-8 replaced. A line longer than `max_line` is dropped and
    counted as malformed instead of growing memory.
    """

    def __init__(self, max_line: int = MAX_SSE_LINE) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._skip_to_eol = False
        self._pending_cr = False
        self.max_line = max_line
        self.comments = 0
        self.oversized_lines = 0
        self.non_sse_lines = 0  # lines that are no SSE field: not an event stream, or a broken one

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        if self._pending_cr:
            # A \r ended the previous feed; a \n starting this one belongs to it.
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        if b"\r" not in buf:
            return self._feed_lf(events)
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl != -1 else n)
            if cr != -1:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt:nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif nl != -1:
                end, nxt = nl, nl + 1
            else:
                break
            line = bytes(buf[start:end])
            start = nxt
            if self._skip_to_eol:
                self._skip_to_eol = False
                continue
            ev = self._line(line.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        del buf[:start]
        if len(buf) > self.max_line:
            buf.clear()
            self._skip_to_eol = True
            self.oversized_lines += 1
        return events

    def _feed_lf(self, events: list[SSEEvent]) -> list[SSEEvent]:
        """The common case, \n line ends only (what vLLM sends): one split
        instead of a search per line; a third of the parser's CPU per event."""
        lines = self._buf.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if self._skip_to_eol:
                self._skip_to_eol = False
                continue
            ev = self._line(line.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        if len(rest) > self.max_line:
            rest = bytearray()
            self._skip_to_eol = True
            self.oversized_lines += 1
        self._buf = bytearray(rest)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event not followed by a blank line still counts
        (some proxies drop the final blank line)."""
        events: list[SSEEvent] = []
        if self._buf and not self._skip_to_eol:
            ev = self._line(self._buf.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        self._buf.clear()
        ev = self._dispatch()
        if ev is not None:
            events.append(ev)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name != "retry":
            # The SSE rules ignore unknown fields; we count them, as a stream
            # of them is not an event stream and the probe says so.
            self.non_sse_lines += 1
        # 'retry': nothing to do for a one-shot stream.
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = None
            return None
        ev = SSEEvent("\n".join(self._data), self._event, self._id)
        self._data = []
        self._event = None
        return ev


DONE = object()  # the `data: [DONE]` sentinel


def decode_payload(data: str) -> dict | object | None:
    """JSON object of one event, DONE for `[DONE]`, None if malformed."""
    s = data.strip()
    if s == "[DONE]":
        return DONE
    if not s:
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
