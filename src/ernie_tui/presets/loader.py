"""Loading presets from TOML: built-ins, then the user's file, then --presets.

Later sources override earlier ones by name. `extends` is resolved after all
sources are merged, so a user preset may extend a built-in and vice versa.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator

from ernie_tui import paths
from ernie_tui.presets import locate
from ernie_tui.presets.model import TOOL_KEYS, Preset, PresetError
from ernie_tui.presets.schema import check_table

BUILTIN_SOURCE = "built-in"


def _builtin_text() -> str:
    return resources.files("ernie_tui.presets").joinpath("builtin.toml").read_text("utf-8")


@dataclass(frozen=True)
class _Source:
    """One presets file's name and text, kept to point errors at lines."""

    name: str
    text: str

    def error(self, reason: str, preset: str | None = None, *path: str) -> PresetError:
        line = locate.line_of(self.text, "presets", preset, *path) if preset is not None else (
            locate.line_of(self.text, *path) if path else None)
        return PresetError(reason, file=self.name, line=line, preset=preset,
                           key=".".join(path) if path else None)


def _parse_toml(src: _Source) -> dict[str, Any]:
    try:
        return tomllib.loads(src.text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says "... (at line 3, column 7)"; people want file:line first.
        line, column, reason = toml_error_position(exc, src.text)
        raise PresetError(f"TOML syntax error: {reason}" + (f" (column {column})" if column else ""),
                          file=src.name, line=line, preset=locate.preset_at(src.text, line) if line else None) from None


def toml_error_position(exc: tomllib.TOMLDecodeError, text: str) -> tuple[int | None, int | None, str]:
    """(line, column, reason) of a tomllib error. tomllib puts the place in
    the message: "(at line 3, column 7)", or "(at end of document)" for an
    unclosed array or string, which is the file's last line."""
    msg = str(exc)
    m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
    if m:
        return int(m.group(1)), int(m.group(2)), msg[: m.start()].strip()
    m = re.search(r"\(at end of document\)", msg)
    if m:
        return max(1, len(text.splitlines())), None, msg[: m.start()].strip() + " at the end of the file"
    return None, None, msg


def _build(name: str, table: dict[str, Any], source: str) -> Preset:
    engine_args = {k: v for k, v in table.items() if k not in TOOL_KEYS}
    return Preset(
        name=name,
        engine_args=engine_args,
        description=table.get("description", ""),
        model=table.get("model"),
        served_model_name=table.get("served_model_name"),
        host=table.get("host", "127.0.0.1"),
        port=table.get("port", 8000),
        env={k: str(v) for k, v in table.get("env", {}).items()},
        launcher=table.get("launcher"),
        api_key_env=table.get("api_key_env"),
        source=source,
    )


@dataclass
class PresetBook:
    """All presets by name, in display order (built-ins first)."""

    presets: dict[str, Preset] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    # Each source's own names in its file's order (built-ins, the user's
    # file, each --presets file), for key_order; a name may be in several.
    defined: dict[str, list[str]] = field(default_factory=dict)
    user_file: str | None = None  # the user's presets file, where it was read

    def names(self) -> list[str]:
        return list(self.presets)

    def key_order(self) -> list[str]:
        """The dashboard's order, which its 1-9 keys follow: the presets of the
        --presets files first (in the order given: the same command line gives
        the same keys), then the built-ins, then the user's own file, last.
        That file is the one tools write into behind the operator's back
        (`tune`'s BASE-tuned, the fix's NAME-fixed), so whatever it gains goes
        after every key already learned: the store appends a new table at its
        end, and a table there that overrides a built-in (`e`) keeps the
        built-in's place. A name defined in several sources takes the first
        place it has in this order."""
        extra = [s for s in self.sources if s not in (BUILTIN_SOURCE, self.user_file)]
        groups = [*extra, BUILTIN_SOURCE, *([self.user_file] if self.user_file else [])]
        order = dict.fromkeys(n for g in groups for n in self.defined.get(g, []) if n in self.presets)
        return [*order, *(n for n in self.presets if n not in order)]

    def __contains__(self, name: str) -> bool:
        return name in self.presets

    def __iter__(self) -> Iterator[Preset]:
        return iter(self.presets.values())

    def __len__(self) -> int:
        return len(self.presets)

    def get(self, name: str) -> Preset:
        try:
            return self.presets[name]
        except KeyError:
            known = ", ".join(self.presets) or "none"
            raise PresetError(f"unknown preset {name!r}; known presets: {known}") from None


def _raw_tables(src: _Source) -> dict[str, dict[str, Any]]:
    doc = _parse_toml(src)
    for key in doc:
        if key != "presets":
            raise src.error("unexpected top-level key; presets go in [presets.NAME] tables", None, key)
    tables = doc.get("presets", {})
    if not isinstance(tables, dict):
        raise src.error("'presets' must be a table of [presets.NAME] tables", None, "presets")
    for name, table in tables.items():
        problem = check_table(table)
        if problem:
            path, reason = problem
            raise src.error(reason, name, *path)
    return tables


def _resolve_extends(raw: dict[str, tuple[dict[str, Any], _Source]]) -> dict[str, Preset]:
    resolved: dict[str, dict[str, Any]] = {}

    def resolve(name: str, chain: list[str]) -> dict[str, Any]:
        if name in resolved:
            return resolved[name]
        if name in chain:
            cycle = " -> ".join([*chain[chain.index(name):], name])
            raise raw[chain[-1]][1].error(f"`extends` cycle: {cycle}", chain[-1], "extends")
        table, source = raw[name]
        parent_name = table.get("extends")
        if parent_name is None:
            merged = dict(table)
        else:
            if parent_name not in raw:
                raise source.error(f"no preset named {parent_name!r} to extend", name, "extends")
            parent = resolve(parent_name, [*chain, name])
            merged = {k: v for k, v in parent.items() if k not in ("description", "extends")}
            for key, value in table.items():
                if key == "env":
                    merged["env"] = {**parent.get("env", {}), **value}
                else:
                    merged[key] = value
        resolved[name] = merged
        return merged

    return {name: _build(name, resolve(name, []), raw[name][1].name) for name in raw}


def load_presets(extra_files: Iterable[str | Path] = (), include_user: bool = True) -> PresetBook:
    """Built-ins, then the user's presets.toml (if any), then each extra file."""
    raw: dict[str, tuple[dict[str, Any], _Source]] = {}
    sources = [BUILTIN_SOURCE]
    builtin = _Source(BUILTIN_SOURCE, _builtin_text())
    builtin_tables = _raw_tables(builtin)
    defined = {BUILTIN_SOURCE: list(builtin_tables)}
    for name, table in builtin_tables.items():
        raw[name] = (table, builtin)
    files: list[Path] = []
    user_file = None
    if include_user and paths.user_presets_file().is_file():
        files.append(paths.user_presets_file())
        user_file = str(paths.user_presets_file())
    files.extend(Path(f) for f in extra_files)
    for path in files:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PresetError("no such presets file", file=str(path)) from None
        except OSError as exc:
            raise PresetError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            # Like every other preset error: the line first, so an editor can jump there.
            line_start = data.rfind(b"\n", 0, exc.start) + 1
            raise PresetError(f"not UTF-8 text ({exc.reason} at column {exc.start - line_start + 1})",
                              file=str(path), line=data.count(b"\n", 0, exc.start) + 1) from None
        sources.append(str(path))
        src = _Source(str(path), text)
        tables = _raw_tables(src)
        defined.setdefault(str(path), []).extend(tables)
        for name, table in tables.items():
            raw[name] = (table, src)
    return PresetBook(presets=_resolve_extends(raw), sources=sources, defined=defined, user_file=user_file)
