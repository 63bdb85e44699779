"""Run records: what a probe, burst or sweep measured, kept as JSON files.

One file per run under ``paths.runs_dir()`` (ERNIE_TUI_HOME-aware), named
``<UTC time>-<kind>-<short id>.json`` so a plain `ls` lists them in time
order. Each record carries the preset (name + engine args) and the engine's
startup report when the caller has them, so a later comparison knows which
configuration produced which figures.

Files are written to a temp name and renamed, so a crash never leaves a
half-written record; unreadable files are skipped by list_runs, not fatal.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ernie_tui import paths

SCHEMA_VERSION = 1
KINDS = ("probe", "burst", "sweep", "capacity", "tune")


class RunStoreError(Exception):
    """A run record that cannot be written or read; the message is for humans."""


@dataclass
class RunRecord:
    id: str
    kind: str
    timestamp: str  # ISO 8601, UTC
    created: float  # epoch seconds
    results: dict[str, Any]
    preset: dict[str, Any] | None = None  # {"name", "engine_args", ...}
    engine_report: dict[str, Any] | None = None
    url: str | None = None
    model: str | None = None
    notes: str | None = None
    schema_version: int = SCHEMA_VERSION
    path: Path | None = field(default=None, compare=False)

    @property
    def preset_name(self) -> str | None:
        return (self.preset or {}).get("name")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("path", None)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: Path | None = None) -> "RunRecord":
        try:
            return cls(
                id=str(data["id"]), kind=str(data["kind"]), timestamp=str(data["timestamp"]),
                created=float(data.get("created", 0.0)), results=dict(data.get("results") or {}),
                preset=data.get("preset"), engine_report=data.get("engine_report"), url=data.get("url"),
                model=data.get("model"), notes=data.get("notes"),
                schema_version=int(data.get("schema_version", SCHEMA_VERSION)), path=path,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunStoreError(f"{path or 'run record'} is not a run record: {exc}") from exc


def _jsonable(obj: Any) -> Any:
    """Dataclasses (BurstResult, EngineReport, Preset, ...), enums, paths and
    sets into plain JSON; objects with to_dict() use it."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
            return None  # NaN/inf are not JSON
        return obj
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    value = getattr(obj, "value", None)  # Enum
    if value is not None and isinstance(value, (str, int)):
        return value
    return str(obj)


def preset_info(preset: Any) -> dict[str, Any] | None:
    """A Preset (or a dict, or just a name) as the record keeps it."""
    if preset is None:
        return None
    if isinstance(preset, str):
        return {"name": preset, "engine_args": None}
    if isinstance(preset, dict):
        return _jsonable(preset)
    return {
        "name": getattr(preset, "name", None),
        "engine_args": _jsonable(getattr(preset, "engine_args", None)),
        "description": getattr(preset, "description", None),
        "model": getattr(preset, "model", None),
        "source": getattr(preset, "source", None),
    }


def save_run(kind: str, results: Any, *, preset: Any = None, engine_report: Any = None,
             url: str | None = None, model: str | None = None, notes: str | None = None,
             directory: str | Path | None = None) -> RunRecord:
    """Write a run record and return it (with .path set)."""
    if kind not in KINDS:
        raise RunStoreError(f"unknown run kind {kind!r}; one of {', '.join(KINDS)}")
    created = time.time()
    stamp = datetime.fromtimestamp(created, tz=timezone.utc)
    rid = stamp.strftime("%Y%m%dT%H%M%S") + f"-{kind}-" + secrets.token_hex(3)
    record = RunRecord(
        id=rid, kind=kind, timestamp=stamp.isoformat(timespec="seconds"), created=created,
        results=_jsonable(results), preset=preset_info(preset),
        engine_report=_jsonable(engine_report) if engine_report is not None else None,
        url=url, model=model, notes=notes,
    )
    folder = Path(directory) if directory else paths.runs_dir()
    try:
        target = paths.write_private_text(folder / f"{rid}.json",
                                          json.dumps(record.to_dict(), indent=1, ensure_ascii=False))
    except OSError as exc:
        raise RunStoreError(f"cannot write the run record in {folder}: {exc}") from exc
    record.path = target
    return record


def load_run(ref: str | Path, directory: str | Path | None = None) -> RunRecord:
    """A record by path, file name or id."""
    p = Path(ref)
    if not p.is_file():
        folder = Path(directory) if directory else paths.runs_dir()
        name = p.name if p.name.endswith(".json") else f"{p.name}.json"
        p = folder / name
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RunStoreError(f"no run record {ref!s}") from exc
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"cannot read run record {p}: {exc}") from exc
    if not isinstance(data, dict):
        raise RunStoreError(f"{p} is not a run record")
    return RunRecord.from_dict(data, p)


def list_runs(kind: str | None = None, preset: str | None = None,
              directory: str | Path | None = None) -> list[RunRecord]:
    """Records, newest first; optionally only one kind or one preset name.
    Files that cannot be read are skipped."""
    folder = Path(directory) if directory else paths.runs_dir()
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob("*.json"):
        if p.name.startswith("."):
            continue
        try:
            rec = load_run(p)
        except RunStoreError:
            continue
        if kind is not None and rec.kind != kind:
            continue
        if preset is not None and rec.preset_name != preset:
            continue
        out.append(rec)
    out.sort(key=lambda r: (r.created, r.id), reverse=True)
    return out
