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
from typing import Any, Iterable

from ernie_tui import paths
from ernie_tui.presets.model import ENGINE_ARG_TYPES, TOOL_KEYS, Preset, PresetError, parse_size

BUILTIN_SOURCE = "built-in"


def _builtin_text() -> str:
    return resources.files("ernie_tui.presets").joinpath("builtin.toml").read_text("utf-8")


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says "... (at line 3, column 7)"; people want file:line first.
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = m.group(1)
            msg = msg[: m.start()].strip()
            raise PresetError(f"{source}:{line}: TOML syntax error: {msg}") from None
        raise PresetError(f"{source}: TOML syntax error: {msg}") from None


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _check_raw(name: str, table: Any, source: str) -> dict[str, Any]:
    where = f"{source}: preset {name!r}"
    if not isinstance(table, dict):
        raise PresetError(f"{where}: expected a table [presets.{name}], got {type(table).__name__}")
    for key, value in table.items():
        if key in ("description", "model", "served_model_name", "host", "extends", "api_key_env"):
            if not isinstance(value, str):
                raise PresetError(f"{where}: {key} must be a string, got {value!r}")
        elif key == "port":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise PresetError(f"{where}: port must be an integer 1-65535, got {value!r}")
        elif key == "env":
            if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
                raise PresetError(f"{where}: env must be a table of strings")
        elif key == "launcher":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise PresetError(f"{where}: launcher must be a non-empty list of strings (an argv prefix)")
        elif key in ENGINE_ARG_TYPES:
            expected = ENGINE_ARG_TYPES[key]
            ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool
                                                       and bool not in (expected if isinstance(expected, tuple) else (expected,)))
            if not ok:
                raise PresetError(f"{where}: {key} must be {_type_name(expected)}, got {value!r}")
            if key == "kv_cache_memory_bytes":
                parse_size(value)
            if key == "gpu_memory_utilization" and not 0 < float(value) <= 1:
                raise PresetError(f"{where}: gpu_memory_utilization must be in (0, 1], got {value}")
            if key in ("block_size", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size",
                       "max_num_seqs") and value <= 0:
                raise PresetError(f"{where}: {key} must be positive, got {value}")
        else:
            # Unknown engine arguments pass through; preflight judges them
            # against the installed vLLM. Values must still map to argv.
            if not isinstance(value, (str, int, float, bool, list, dict)):
                raise PresetError(f"{where}: {key} has an unsupported value {value!r}")
    return table


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

    def names(self) -> list[str]:
        return list(self.presets)

    def __contains__(self, name: str) -> bool:
        return name in self.presets

    def __iter__(self):
        return iter(self.presets.values())

    def __len__(self) -> int:
        return len(self.presets)

    def get(self, name: str) -> Preset:
        try:
            return self.presets[name]
        except KeyError:
            known = ", ".join(self.presets) or "none"
            raise PresetError(f"unknown preset {name!r}; known presets: {known}") from None


def _raw_tables(text: str, source: str) -> dict[str, dict[str, Any]]:
    doc = _parse_toml(text, source)
    unknown_top = [k for k in doc if k != "presets"]
    if unknown_top:
        raise PresetError(f"{source}: unexpected top-level key(s) {unknown_top}; presets go in [presets.NAME] tables")
    tables = doc.get("presets", {})
    if not isinstance(tables, dict):
        raise PresetError(f"{source}: 'presets' must be a table of [presets.NAME] tables")
    return {name: _check_raw(name, table, source) for name, table in tables.items()}


def _resolve_extends(raw: dict[str, tuple[dict[str, Any], str]]) -> dict[str, Preset]:
    resolved: dict[str, dict[str, Any]] = {}

    def resolve(name: str, chain: list[str]) -> dict[str, Any]:
        if name in resolved:
            return resolved[name]
        if name in chain:
            cycle = " -> ".join([*chain[chain.index(name):], name])
            raise PresetError(f"{raw[chain[-1]][1]}: `extends` cycle: {cycle}")
        table, source = raw[name]
        parent_name = table.get("extends")
        if parent_name is None:
            merged = dict(table)
        else:
            if parent_name not in raw:
                raise PresetError(f"{source}: preset {name!r} extends unknown preset {parent_name!r}")
            parent = resolve(parent_name, [*chain, name])
            merged = {k: v for k, v in parent.items() if k not in ("description", "extends")}
            for key, value in table.items():
                if key == "env":
                    merged["env"] = {**parent.get("env", {}), **value}
                else:
                    merged[key] = value
        resolved[name] = merged
        return merged

    return {name: _build(name, resolve(name, []), raw[name][1]) for name in raw}


def load_presets(extra_files: Iterable[str | Path] = (), include_user: bool = True) -> PresetBook:
    """Built-ins, then the user's presets.toml (if any), then each extra file."""
    raw: dict[str, tuple[dict[str, Any], str]] = {}
    sources = [BUILTIN_SOURCE]
    for name, table in _raw_tables(_builtin_text(), BUILTIN_SOURCE).items():
        raw[name] = (table, BUILTIN_SOURCE)
    files: list[Path] = []
    if include_user and paths.user_presets_file().is_file():
        files.append(paths.user_presets_file())
    files.extend(Path(f) for f in extra_files)
    for path in files:
        try:
            text = path.read_text("utf-8")
        except FileNotFoundError:
            raise PresetError(f"{path}: no such presets file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise PresetError(f"{path}: cannot read: {exc}") from None
        sources.append(str(path))
        for name, table in _raw_tables(text, str(path)).items():
            raw[name] = (table, str(path))
    return PresetBook(presets=_resolve_extends(raw), sources=sources)
