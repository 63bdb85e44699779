"""Where ernie-tui keeps its files (platformdirs), overridable for tests.

ERNIE_TUI_HOME, when set, puts config, data and state under one folder: the
tests and the tmux test use it so they never touch the user's real dirs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP = "ernie-tui"


def _home() -> Path | None:
    value = os.environ.get("ERNIE_TUI_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def state_dir() -> Path:
    """Logs of servers we start, pid files of detached servers."""
    home = _home()
    return home / "state" if home else Path(platformdirs.user_state_dir(APP))


def user_presets_file() -> Path:
    return config_dir() / "presets.toml"


def demo_model_dir() -> Path:
    return data_dir() / "models" / "tiny-ernie"


def runs_dir() -> Path:
    """Run records (bursts, sweeps) as JSON files."""
    return data_dir() / "runs"


# -- private files ---------------------------------------------------------
# What ernie-tui writes can hold secrets: a server's log echoes prompts and
# whatever a preset's `env` carries, run records keep the preset. Its own
# dirs are 0700 and its files 0600, whatever the umask; every writer goes
# through these helpers.

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def _app_dirs() -> list[Path]:
    return [config_dir(), data_dir(), state_dir()]


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and missing parents) readable by its owner only; return it.

    A folder that already exists is tightened to 0700 when it is one of
    ernie-tui's own (config, data, state, or a folder in them, as an older
    version left them 0755); a folder elsewhere that the user named (a
    --log-dir) keeps its mode, the files written into it are private anyway."""
    target = Path(path)
    missing = []
    p = target
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile by another writer
        _chmod(d, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask
    resolved = target.resolve()
    for root in _app_dirs():
        root = root.resolve()
        if resolved == root or root in resolved.parents:
            for d in [root, *reversed([q for q in resolved.parents if root in q.parents]), resolved]:
                _chmod(d, PRIVATE_DIR_MODE)
            break
    return target


def private_opener(path: str | os.PathLike[str], flags: int) -> int:
    """For open(..., opener=private_opener): the file is created 0600, and one
    that already exists (an older version's llm.log) is tightened to 0600."""
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    except OSError:
        pass  # not ours to change (a file the user points us at)
    return fd


def write_private_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8", *,
                       durable: bool = False) -> Path:
    """Replace `path` with `text` atomically (a reader never sees half a
    file), mode 0600, its folder made with private_dir(). `durable` also
    fsyncs the file and the rename (a file the user edits by hand, whose loss
    after a power cut would hurt: presets.toml)."""
    target = Path(path)
    private_dir(target.parent)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(target.parent)
    return target


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # a file system that cannot sync a folder: the replace is still atomic


class OutPathError(ValueError):
    """A file the user asked for cannot be written where they said (message for people)."""


def out_file(path: str | os.PathLike[str]) -> Path:
    """`path` as a file to write where the user named it (--out, --csv,
    --report, the sweep screen's export), once its folder is known to be
    there. A missing folder is refused, as `cp` refuses one, rather than
    made: a typo'd path would otherwise grow folders (0755, at the root even)
    and the file land where nobody looks. OutPathError says what is wrong."""
    target = Path(path).expanduser()
    folder = target.parent
    if not folder.exists():
        raise OutPathError(f"{path}: no such directory {folder} (make it first, or name another)")
    if not folder.is_dir():
        raise OutPathError(f"{path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutPathError(f"{path}: cannot write into {folder}: permission denied")
    if target.is_dir():
        raise OutPathError(f"{path}: is a directory; name a file in it")
    return target


def _chmod(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except OSError:
        pass  # not ours (a shared parent): leave it
