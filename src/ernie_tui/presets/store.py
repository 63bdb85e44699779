"""Saving a preset into the user's presets file, without ever corrupting it.

The file is the user's: it may hold comments and hand-written tables. So:
- a file that does not parse is never overwritten (PresetError instead);
- a new table is appended to the existing text, leaving everything else
  byte-for-byte as it was; a table of the same name is cut out first;
- the result is parsed again and compared with what we meant to write
  before anything touches the disk (else: a full, comment-less rewrite);
- the write goes to a temp file in the same directory, is fsynced, and
  replaces the file with os.replace (atomic on POSIX), so a crash leaves
  either the old file or the new one;
- an flock on a side file serialises the dashboard and the sweep.

No Textual or Rich here (tests/test_import_contract.py).
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import tomli_w

from ernie_tui import paths
from ernie_tui.presets.model import Preset, PresetError

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def preset_table(preset: Preset) -> dict[str, Any]:
    """The `[presets.NAME]` table that loads back as `preset`, self-contained
    (no `extends`: the preset is already resolved)."""
    t: dict[str, Any] = {}
    if preset.description:
        t["description"] = preset.description
    if preset.model:
        t["model"] = preset.model
    if preset.served_model_name:
        t["served_model_name"] = preset.served_model_name
    if preset.host != "127.0.0.1":
        t["host"] = preset.host
    t["port"] = preset.port
    if preset.launcher:
        t["launcher"] = list(preset.launcher)
    if preset.api_key_env:
        t["api_key_env"] = preset.api_key_env
    for key, value in preset.engine_args.items():
        if value is not None:
            t[key] = value
    if preset.env:
        t["env"] = dict(preset.env)
    return t


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else tomli_w.dumps({name: 0}).split("=")[0].strip()


def _table_text(name: str, table: dict[str, Any]) -> str:
    return tomli_w.dumps({"presets": {name: table}})


def _cut_table(text: str, name: str) -> str:
    """Remove `[presets.NAME]` and its sub-tables (`[presets.NAME.env]`) from
    the text; everything else stays as written."""
    key = re.escape(_key(name))
    header = re.compile(r"^\s*\[\s*presets\s*\.\s*(?:\"" + re.escape(name) + r"\"|" + key + r")\s*(\.[^\]]*)?\]\s*(#.*)?$")
    any_header = re.compile(r"^\s*\[")
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if any_header.match(line):
            skipping = bool(header.match(line))
        if not skipping:
            out.append(line)
    return "".join(out)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: the atomic replace still protects the file
            pass
        yield
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save_preset(preset: Preset, path: str | Path | None = None, name: str | None = None) -> Path:
    """Add or replace `[presets.NAME]` (NAME = `name` or preset.name) in the
    user presets file (or `path`); returns the file's path."""
    path = Path(path) if path is not None else paths.user_presets_file()
    name = name or preset.name
    if not name:
        raise PresetError("cannot save a preset without a name")
    table = preset_table(preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        try:
            old_text = path.read_text("utf-8")
        except FileNotFoundError:
            old_text = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise PresetError(f"{path}: cannot read: {exc}; not saving {name!r}") from None
        try:
            doc = tomllib.loads(old_text)
        except tomllib.TOMLDecodeError as exc:
            raise PresetError(f"{path}: does not parse as TOML ({exc}); refusing to overwrite it. "
                              f"Fix the file by hand, then save {name!r} again") from None
        presets = doc.get("presets", {})
        if not isinstance(presets, dict):
            raise PresetError(f"{path}: 'presets' is not a table; refusing to overwrite it")
        expected = dict(doc)
        expected["presets"] = {**presets, name: table}

        kept = _cut_table(old_text, name) if name in presets else old_text
        if kept and not kept.endswith("\n"):
            kept += "\n"
        new_text = kept + ("\n" if kept.strip() else "") + _table_text(name, table)
        try:
            ok = tomllib.loads(new_text) == expected
        except tomllib.TOMLDecodeError:
            ok = False
        if not ok:
            # The text surgery could not keep the file's meaning (an inline
            # `presets = {...}` table, say): write the whole document anew.
            new_text = tomli_w.dumps(expected)
        _atomic_write(path, new_text)
    return path


def delete_preset(name: str, path: str | Path | None = None) -> bool:
    """Remove `[presets.NAME]` from the user file; False if it was not there."""
    path = Path(path) if path is not None else paths.user_presets_file()
    with _locked(path) if path.parent.exists() else _nullcontext():
        try:
            old_text = path.read_text("utf-8")
        except FileNotFoundError:
            return False
        try:
            doc = tomllib.loads(old_text)
        except tomllib.TOMLDecodeError as exc:
            raise PresetError(f"{path}: does not parse as TOML ({exc}); refusing to change it") from None
        if name not in doc.get("presets", {}):
            return False
        expected = dict(doc)
        expected["presets"] = {k: v for k, v in doc["presets"].items() if k != name}
        new_text = _cut_table(old_text, name)
        try:
            if tomllib.loads(new_text) != expected:
                new_text = tomli_w.dumps(expected)
        except tomllib.TOMLDecodeError:
            new_text = tomli_w.dumps(expected)
        _atomic_write(path, new_text)
    return True


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


__all__ = ["save_preset", "delete_preset", "preset_table"]
