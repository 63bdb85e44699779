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


# 128 + SIGPIPE: what a shell reports for `ls | head` or `git log | head`,
# whose writer the kernel ends with SIGPIPE. The same status here lets a
# `set -o pipefail` script treat ernie-tui as it treats them; 0 would claim
# the whole output was delivered, and it was not.
EXIT_READER_GONE = 141


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has closed it: the
    kernel flags a write end with no reader as an error (POLLERR) at once.
    Tells a `| head` that stopped reading from a broken pipe elsewhere (a
    child's stdin, a socket), which is a real failure and is not hidden."""
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def end_quietly_on_closed_stdout() -> int:
    """The reader of stdout left (`| head -c 10`): stop writing, say nothing,
    and point stdout at /dev/null so the interpreter's last flush of what is
    still buffered does not raise again at exit. Returns the exit status."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_READER_GONE
