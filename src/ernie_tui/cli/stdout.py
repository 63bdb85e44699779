"""Printing a command's result so that all of it arrives.

On the H200 a burst's `--json` (~150 KB) reached the agreement bench with a
hole at 64 KiB and exit status 0. Reproduced here: once a uvloop event loop
has run in the process, a write to a pipe that the reader has not drained can
return short (65,536 of 146,561 bytes), blocking mode or not, and print()
dropped the rest without an error; a pipe whose O_NONBLOCK flag is set (the
flag belongs to the pipe, shared by every process holding it) loses the same
way. So the result is written with os.write until every byte is taken.
"""

from __future__ import annotations

import os
import select
import sys


def print_whole(text: str) -> None:
    """print(text) to stdout, every byte of it, however the pipe behaves."""
    out = sys.stdout
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO (tests, captured output): print is whole there
        print(text)
        return
    out.flush()  # anything printed before goes first
    if not os.get_blocking(fd):
        os.set_blocking(fd, True)
    data = memoryview((text + "\n").encode(out.encoding or "utf-8", out.errors or "strict"))
    while data:
        try:
            n = os.write(fd, data)  # EINTR is retried by os.write itself
        except BlockingIOError:  # set non-blocking again behind our back: wait for room
            select.select([], [fd], [])
            continue
        data = data[n:]
