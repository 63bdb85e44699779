"""Notices that a presets file changed under an open dashboard.

`ernie-tui tune` (another process) writes BASE-tuned into the user's file
while a dashboard may be open; so may an editor, or another dashboard's fix.
The dashboard asks `changed()` on a timer and reloads its presets when a file
it reads was written, created or removed since. A stat per file is all it
costs, so no file-watching library (inotify is Linux-only, and a rename onto
the file, which is how the store writes, is easy to miss there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

# Checked this often (seconds): an operator switching to the terminal after a
# tune finished sees the new preset within about that long.
INTERVAL_S = 2.0

Stamp = tuple[int, int, int] | None  # (inode, size, mtime_ns); None: no such file


def _stamp(path: Path) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    # The inode too: the store replaces the file by a rename (os.replace), and
    # two writes within the file system's mtime granularity with the same size
    # would otherwise look alike.
    return st.st_ino, st.st_size, st.st_mtime_ns


class PresetFilesWatch:
    """The stamps of the presets files, as last seen."""

    def __init__(self, files: Iterable[str | Path]) -> None:
        self.files = [Path(f) for f in files]
        self._seen = self._stamps()

    def _stamps(self) -> list[Stamp]:
        return [_stamp(f) for f in self.files]

    def changed(self) -> bool:
        """True once for each change since the last call (or sync)."""
        now = self._stamps()
        if now == self._seen:
            return False
        self._seen = now
        return True

    def sync(self) -> None:
        """The files as they are now count as seen: the dashboard calls it
        before reloading for a reason of its own (`e`, the fix), so the timer
        does not reload the same change again."""
        self._seen = self._stamps()
