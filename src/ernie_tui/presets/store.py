"""The one path that writes presets files: the dashboard's fix (NAME-fixed),
its `e` edit (a copy of a built-in to edit) and `ernie-tui presets delete`.

The file is the user's: it may hold comments and hand-written tables. So:
- a file that does not parse is never overwritten (PresetError instead);
- changes go through tomlkit, which keeps every comment, blank line and table
  it is not told to change; a table that is replaced is updated key by key,
  so comments on keys that keep their value stay too;
- a table is checked against the preset schema before it is written, and the
  new text must read back (tomllib) as exactly what was meant, else nothing
  is written;
- the write goes to a temp file in the same directory, is fsynced, and
  replaces the file with os.replace (atomic on POSIX), so a crash leaves
  either the old file or the new one;
- an flock on a side file serialises the dashboard and the sweep;
- the user's file is private: 0600, in a 0700 config dir (it may carry env
  values).

No Textual or Rich here (tests/test_import_contract.py).
"""

from __future__ import annotations

import os
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable, Table

from ernie_tui import paths
from ernie_tui.presets import locate
from ernie_tui.presets.loader import toml_error_position
from ernie_tui.presets.model import Preset, PresetError
from ernie_tui.presets.schema import check_table

NEW_FILE_HEADER = "ernie-tui user presets: a table here overrides the built-in of the same name."


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


# -- tomlkit editing -------------------------------------------------------------------
def _same(old: Any, new: Any) -> bool:
    """Equal as TOML values: 1, 1.0 and true are three different values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(_same(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    return type(old) is type(new) and old == new


def _inline(value: Any) -> Any:
    """Nested tables as inline tables: what an inline table may hold."""
    if isinstance(value, dict):
        t = tomlkit.inline_table()
        for k, v in value.items():
            t[k] = _inline(v)
        return t
    return value


def _update_table(current: Table | InlineTable, new: dict[str, Any]) -> None:
    """Make `current` hold exactly `new`, key by key, so that the comments
    and order of the keys that stay are kept."""
    for key in [k for k in current if k not in new]:
        del current[key]
    for key, value in new.items():
        old = current.get(key)
        if isinstance(value, dict) and isinstance(old, (Table, InlineTable)):
            _update_table(old, value)
        elif old is None or not _same(old.unwrap() if hasattr(old, "unwrap") else old, value):
            current[key] = _inline(value) if isinstance(current, InlineTable) else value


def _new_table(new: dict[str, Any], note: str | None) -> Table:
    t = tomlkit.table()
    if note:
        t.add(tomlkit.comment(note))
    for key, value in new.items():
        t[key] = value
    return t


def _presets_container(doc: tomlkit.TOMLDocument) -> Table | InlineTable:
    presets = doc.get("presets")
    if presets is None:
        presets = tomlkit.table(is_super_table=True)  # [presets.NAME] headers, no bare [presets]
        doc["presets"] = presets
    return presets  # a table: _edit has checked that before any change


def _set_preset(doc: tomlkit.TOMLDocument, name: str, table: dict[str, Any], note: str | None) -> None:
    presets = _presets_container(doc)
    current = presets.get(name)
    if isinstance(current, (Table, InlineTable)) and not (isinstance(current, Table) and current.is_super_table()):
        _update_table(current, table)
    elif isinstance(presets, InlineTable):
        presets[name] = _inline(table)
    else:
        if current is not None:
            del presets[name]
        presets[name] = _new_table(table, note)


def _edit(path: Path, what: str, change: Callable[[tomlkit.TOMLDocument, dict[str, Any]], bool]) -> bool:
    """Read, change and write the presets file under the lock. `change` edits
    the tomlkit document and the plain dict alike (the dict is what the file
    must read back as) and says whether there is anything to write."""
    paths.private_dir(path.parent)
    with _locked(path):
        try:
            old_text = path.read_text("utf-8")
        except FileNotFoundError:
            old_text = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise PresetError(f"cannot read it: {exc}; not going to {what}", file=str(path)) from None
        try:
            expected = tomllib.loads(old_text)
        except tomllib.TOMLDecodeError as exc:
            line, _, reason = toml_error_position(exc, old_text)
            raise PresetError(f"does not parse as TOML ({reason}); refusing to overwrite it. "
                              f"Fix the file by hand, then {what} again", file=str(path), line=line,
                              preset=locate.preset_at(old_text, line) if line else None) from None
        try:
            doc = tomlkit.parse(old_text)
        except TOMLKitError as exc:
            raise PresetError(f"cannot be edited safely ({exc}); refusing to overwrite it", file=str(path)) from None
        if not old_text.strip():
            doc.add(tomlkit.comment(NEW_FILE_HEADER))
        if not isinstance(expected.get("presets", {}), dict):
            raise PresetError("'presets' is not a table; refusing to overwrite it", file=str(path))
        if not change(doc, expected):
            return False
        new_text = tomlkit.dumps(doc)
        try:
            ok = tomllib.loads(new_text) == expected
        except tomllib.TOMLDecodeError:
            ok = False
        if not ok:
            # A layout tomlkit could not edit faithfully: better no write than a wrong one.
            raise PresetError(f"could not {what} without changing other parts of the file; "
                              "left it as it was (edit it by hand)", file=str(path))
        paths.write_private_text(path, new_text, durable=True)
    return True


def _checked_table(preset: Preset, name: str) -> dict[str, Any]:
    table = preset_table(preset)
    problem = check_table(table)
    if problem:
        key, reason = problem
        raise PresetError(reason, preset=name, key=".".join(key) or None)
    return table


def _target(path: str | Path | None) -> Path:
    return Path(path) if path is not None else paths.user_presets_file()


# -- the public write path ---------------------------------------------------------------------
def save_preset(preset: Preset, path: str | Path | None = None, name: str | None = None, *,
                note: str | None = None) -> Path:
    """Add or replace `[presets.NAME]` (NAME = `name` or preset.name) in the
    user presets file (or `path`); returns the file's path. `note` becomes a
    comment at the top of a newly added table."""
    path = _target(path)
    name = name or preset.name
    if not name:
        raise PresetError("cannot save a preset without a name")
    table = _checked_table(preset, name)

    def change(doc: tomlkit.TOMLDocument, expected: dict[str, Any]) -> bool:
        _set_preset(doc, name, table, note)
        expected.setdefault("presets", {})[name] = table
        return True

    _edit(path, f"save {name!r}", change)
    return path


def ensure_preset(preset: Preset, path: str | Path | None = None, *, note: str | None = None) -> bool:
    """Add `[presets.NAME]` for `preset` unless the file has that table
    already (the dashboard's `e`: a built-in is copied to the user's file, so
    that the edit overrides it). True if the table was added."""
    path = _target(path)
    table = _checked_table(preset, preset.name)

    def change(doc: tomlkit.TOMLDocument, expected: dict[str, Any]) -> bool:
        if preset.name in expected.get("presets", {}):
            return False
        _set_preset(doc, preset.name, table, note)
        expected.setdefault("presets", {})[preset.name] = table
        return True

    return _edit(path, f"copy {preset.name!r}", change)


def delete_preset(name: str, path: str | Path | None = None) -> bool:
    """Remove `[presets.NAME]` (and its sub-tables) from the user file; False
    if it was not there (`ernie-tui presets delete`)."""
    path = _target(path)
    if not path.is_file():
        return False

    def change(doc: tomlkit.TOMLDocument, expected: dict[str, Any]) -> bool:
        if name not in expected.get("presets", {}):
            return False
        del _presets_container(doc)[name]
        del expected["presets"][name]
        if not expected["presets"]:  # the last one: tomlkit drops the empty table
            del expected["presets"]
            doc.pop("presets", None)
        return True

    return _edit(path, f"delete {name!r}", change)


__all__ = ["save_preset", "ensure_preset", "delete_preset", "preset_table"]
