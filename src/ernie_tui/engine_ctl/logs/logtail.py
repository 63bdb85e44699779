"""Follow a growing log file (vLLM's llm.log) without threads.

`LogTailer.read_new()` is a non-blocking poll: it returns the complete lines
written since the previous call. Callers (process control, the dashboard's
worker) call it from their own loop, so there is no thread to stop and no
lock to share.

What a live vLLM log throws at a tailer, and what we do about it:

* the file does not exist yet (server still starting)  -> return [] and retry;
* truncation (`> llm.log`, copytruncate)                -> restart from offset 0;
* rotation (llm.log renamed to llm.log.1, new llm.log)  -> drain the old file,
  then switch to the new one from its start (like `tail -F`);
* a line written in pieces                              -> held until its terminator;
* tqdm progress bars that redraw with `\\r`             -> one line per line of the
  file, holding what a terminal shows once the line ends (the last redraw);
  the bar being drawn right now is `partial`. So line numbers are the file's
  (`less -N`, `parse-log`, the dashboard agree);
* ANSI colour codes                                     -> stripped;
* invalid UTF-8                                         -> decoded with U+FFFD;
* one enormous line (a 10 MB dict dump)                 -> kept up to `max_line`
  bytes plus CUT_MARKER, the rest discarded as it streams past, so memory
  stays bounded by `max_line` + one read chunk.

Pure stdlib; never imports Textual or Rich.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["CUT_MARKER", "LogTailer", "split_block", "strip_ansi"]

# Appended to a line that was longer than max_line; what follows it was dropped.
CUT_MARKER = " [...line cut]"

# CSI sequences (colours, cursor moves, erase-line), OSC sequences (titles,
# hyperlinks) and the remaining two-byte escapes. Anything else starting with
# ESC is rare enough to leave the ESC alone rather than guess.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Line terminators: CRLF counts once, a lone CR is a progress-bar redraw.
_TERM = re.compile(rb"(\r\n|\r|\n)")

_READ_CHUNK = 1 << 16


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences (cheap when there are none)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class LogTailer:
    """Poll-based follower of one log path.

    `from_start=False` skips what the file holds when the tailer is created
    (a file created later is read from its beginning, since all of it is new).
    `max_line` caps a single line in bytes; `max_read` bounds the bytes one
    `read_new()` call consumes so a huge backlog is delivered in slices
    instead of one giant list (call again until it returns [] to drain).
    `offset` (a byte offset where a line begins) starts there instead, in
    the file the path names now: what came before it was read another way
    (engine_ctl.logopen reads a big log's head and tail, then follows).
    """

    def __init__(self, path: str | os.PathLike[str], from_start: bool = True, max_line: int = 65536,
                 max_read: int = 8 << 20, *, offset: int | None = None) -> None:
        self.path = Path(path)
        self.max_line = max(1, int(max_line))
        self.max_read = max(_READ_CHUNK, int(max_read))
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._pos = 0
        self._buf = bytearray()  # the current unterminated line (capped)
        self._cut = 0  # bytes of the current line dropped past max_line
        self._after_cr = False  # last byte seen was \r: a following \n belongs to it
        # The last non-empty redraw of the current line (a segment ended by a
        # bare \r), with its bytes cut past max_line: what the line shows if
        # nothing else is drawn before its newline.
        self._redraw: tuple[bytes, int] | None = None
        self._skip_to_eol = False  # started mid-line (from_start=False): drop the fragment
        self._closed = False
        self.lines_cut = 0  # how many lines were capped (for a status line, tests)
        self.rotations = 0
        self.truncations = 0
        self._since_term = 0  # bytes read since the last \n: the line being assembled
        self._start_offset: int | None = 0
        if offset is not None:
            try:
                st = os.stat(self.path)
            except OSError:
                self._start_offset = 0
            else:
                self._start_offset = max(0, int(offset))
                self._ident = (st.st_dev, st.st_ino)
        elif not from_start:
            try:
                st = os.stat(self.path)
            except OSError:
                self._start_offset = 0  # created later: everything in it is new
            else:
                self._start_offset = st.st_size
                self._ident = (st.st_dev, st.st_ino)

    # -- public API ---------------------------------------------------------

    @property
    def partial(self) -> str:
        """The line being written right now, not yet returned: the text after
        its last \\r, or the last redraw (the live tqdm bar) when nothing
        follows it yet."""
        raw = bytes(self._buf) if self._buf or self._redraw is None else self._redraw[0]
        return strip_ansi(raw.decode("utf-8", errors="replace"))

    @property
    def next_line_offset(self) -> int:
        """Byte offset, in the file being read, where the next line that
        read_new() returns begins (the start of the line held so far)."""
        return self._pos - self._since_term

    def read_new(self) -> list[str]:
        """Return complete lines added since the last call; never blocks."""
        out: list[str] = []
        if self._closed:
            return out
        budget = self.max_read
        if self._fd is None and not self._open(first=True):
            return out
        fd = self._fd
        if fd is None:  # not opened after all: nothing to read
            return out
        # Truncated in place? (size below what we already read)
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = self._pos
        if size < self._pos:
            self.truncations += 1
            self._flush_partial(out)
            self._pos = self._since_term = 0
            os.lseek(fd, 0, os.SEEK_SET)
        budget = self._drain(out, budget)
        if budget <= 0:
            return out  # more to read; the caller polls again
        # At EOF of the open file: has the path been rotated to a new file?
        if self._rotated():
            self._drain(out, 1 << 62)  # whatever the old writer added before the swap
            self._flush_partial(out)  # the old file has ended: its last line is complete
            self._close_fd()
            self.rotations += 1
            if self._open(first=False):
                self._drain(out, budget)
        return out

    def close(self) -> None:
        self._close_fd()
        self._closed = True

    def __enter__(self) -> LogTailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- file handling ------------------------------------------------------

    def _open(self, first: bool) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        offset = 0
        if first and self._start_offset:
            # from_start=False: skip the old content, but only of the file we
            # measured; a replacement created since then is read whole.
            if ident == self._ident and st.st_size >= self._start_offset:
                offset = self._start_offset
                self._skip_to_eol = not self._ends_line(fd, offset)
        self._start_offset = None
        self._fd, self._ident, self._pos = fd, ident, offset
        self._since_term = 0
        os.lseek(fd, offset, os.SEEK_SET)
        return True

    @staticmethod
    def _ends_line(fd: int, offset: int) -> bool:
        if offset == 0:
            return True
        try:
            return os.pread(fd, 1, offset - 1) in (b"\n", b"\r")
        except OSError:
            return True

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # renamed away and not recreated yet: keep the old file open
        return (st.st_dev, st.st_ino) != self._ident

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    def _drain(self, out: list[str], budget: int) -> int:
        fd = self._fd
        if fd is None:
            return budget
        while budget > 0:
            try:
                data = os.read(fd, min(_READ_CHUNK, budget))
            except OSError:
                break
            if not data:
                break
            self._pos += len(data)
            budget -= len(data)
            self._split(data, out)
            k = data.rfind(b"\n")
            self._since_term = len(data) - k - 1 if k >= 0 else self._since_term + len(data)
        return budget

    # -- line assembly ------------------------------------------------------

    def _split(self, data: bytes, out: list[str]) -> None:
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":  # the \n of a \r\n split across two reads:
                data = data[1:]  # the segment before the \r ended the line
                self._end_line(b"", out)
        if not data:
            return
        if b"\r" not in data:  # the common case: plain \n lines
            parts = data.split(b"\n")
            for seg in parts[:-1]:
                self._end_line(seg, out)
            self._append(parts[-1])
            return
        self._after_cr = data.endswith(b"\r")
        pieces = _TERM.split(data)  # [seg, term, seg, term, ..., tail]
        for i in range(0, len(pieces) - 1, 2):
            if pieces[i + 1] == b"\r":
                self._redrawn(pieces[i])
            else:  # \n or \r\n
                self._end_line(pieces[i], out)
        self._append(pieces[-1])

    def _append(self, seg: bytes) -> None:
        if not seg:
            return
        room = self.max_line - len(self._buf)
        if len(seg) <= room:
            self._buf += seg
        else:
            if room > 0:
                self._buf += seg[:room]
            self._cut += len(seg) - max(room, 0)

    def _take(self, seg: bytes) -> tuple[bytes, int]:
        """The current segment: what is buffered plus `seg`, capped."""
        if self._buf or self._cut:
            self._append(seg)
            raw, cut = bytes(self._buf), self._cut
            self._buf.clear()
            self._cut = 0
            return raw, cut
        if len(seg) > self.max_line:
            return seg[: self.max_line], len(seg) - self.max_line
        return seg, 0

    def _redrawn(self, seg: bytes) -> None:
        """A segment ended by a bare \\r: a redraw, not a line. Keep the latest
        one that drew something ("\\r\\r" and a bar's leading \\r draw nothing)."""
        raw, cut = self._take(seg)
        if raw or cut:
            self._redraw = (raw, cut)

    def _end_line(self, seg: bytes, out: list[str]) -> None:
        raw, cut = self._take(seg)
        if not raw and not cut and self._redraw is not None:
            raw, cut = self._redraw  # "bar 100%\\r\\n": the line shows the last redraw
        self._redraw = None
        if self._skip_to_eol:  # tail of a line that began before we started
            self._skip_to_eol = False
            return
        self._emit(raw, cut, out)

    def _flush_partial(self, out: list[str]) -> None:
        """The file ended (rotation, truncation) inside a line: it is complete."""
        if self._buf or self._cut or self._redraw is not None:
            self._end_line(b"", out)
        self._after_cr = False

    def _emit(self, raw: bytes, cut: int, out: list[str]) -> None:
        text = raw.decode("utf-8", errors="replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        if cut:
            self.lines_cut += 1
            text += CUT_MARKER
        out.append(text)


def split_block(data: bytes, max_line: int = 65536) -> list[str]:
    """The lines of `data`, a run of whole lines read from a log (its last
    line may lack its newline), exactly as a LogTailer reading them returns
    them: \\r redraws, the cap, ANSI codes and bad UTF-8 handled the same."""
    splitter = LogTailer(os.devnull, max_line=max_line)  # never opened: used for its line assembly only
    out: list[str] = []
    splitter._split(data, out)
    splitter._flush_partial(out)
    return out
