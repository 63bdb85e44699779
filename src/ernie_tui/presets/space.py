"""A tune's search space: which engine arguments `ernie-tui tune` may change, and how.

The space file is TOML, one key per engine argument, named as in a preset:

    max_num_seqs = [64, 128, 256]                                  # choices
    max_num_batched_tokens = {min = 2048, max = 16384, log = true}  # an integer range
    block_size = {min = 16, max = 64, step = 16}                    # a range on a step
    enable_prefix_caching = [true, false]                           # booleans are choices

(the keys may also sit under a `[space]` table). Each key must be an engine
argument the preset model knows (presets/schema.py's typed fields), and
every value it can take must be one a preset accepts there, so a space that
could produce a preset nobody can load is refused before any trial runs.
Pure: no search library and no I/O beyond reading the file.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ernie_tui.presets.model import TOOL_KEYS, Preset, PresetError
from ernie_tui.presets.schema import PresetTable, check_table

_RANGE_KEYS = {"min", "max", "log", "step"}


def tunable_fields() -> list[str]:
    """The engine arguments a space may name: the preset model's typed ones."""
    return sorted(k for k in PresetTable.model_fields if k not in TOOL_KEYS)


@dataclass(frozen=True)
class Param:
    """One engine argument's part of the space: `choices`, or an integer range."""

    name: str
    choices: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | None = None
    log: bool = False
    step: int | None = None

    def describe(self) -> str:
        if self.choices is not None:
            return f"{self.name} in {list(self.choices)}"
        how = " (log)" if self.log else f" step {self.step}" if self.step else ""
        return f"{self.name} {self.low}..{self.high}{how}"

    def size(self) -> int:
        """How many values it can take."""
        if self.choices is not None:
            return len(self.choices)
        assert self.low is not None and self.high is not None
        return (self.high - self.low) // (self.step or 1) + 1


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    source: str = "<space>"

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def size(self) -> int:
        """The number of settings in the space (a grid's trial count)."""
        n = 1
        for p in self.params:
            n *= p.size()
        return n

    def digest(self) -> str:
        """A stable hash of what the space allows (not of the file's layout)."""
        text = json.dumps([[p.name, p.choices, p.low, p.high, p.log, p.step] for p in self.params])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def candidate(self, base: Preset, values: dict[str, Any], name: str) -> Preset:
        """BASE with the trial's values: the derived preset a trial runs."""
        unknown = set(values) - set(self.names())
        if unknown:
            raise PresetError(f"values for {sorted(unknown)} are not in the space {self.source}")
        return base.with_changes(name=name, **values)


def _error(source: str, key: str | None, reason: str) -> PresetError:
    return PresetError(reason, file=source, key=key)


def _check_value(source: str, key: str, value: Any) -> None:
    """Each value the space can give must be one a preset accepts for `key`."""
    problem = check_table({key: value})
    if problem:
        raise _error(source, key, f"{value!r}: {problem[1]}")


def _choices(source: str, key: str, values: list[Any]) -> Param:
    if not values:
        raise _error(source, key, "an empty list of choices")
    if len({json.dumps(v) for v in values}) != len(values):
        raise _error(source, key, f"a choice is listed twice in {values!r}")
    for v in values:
        if isinstance(v, (dict, list)):
            raise _error(source, key, f"choices are numbers, strings or booleans, got {v!r}")
        _check_value(source, key, v)
    return Param(key, choices=tuple(values))


def _range(source: str, key: str, spec: dict[str, Any]) -> Param:
    extra = set(spec) - _RANGE_KEYS
    if extra or "min" not in spec or "max" not in spec:
        raise _error(source, key, "a range is {min = A, max = B} with optional log = true or step = N"
                                  + (f"; unknown keys {sorted(extra)}" if extra else ""))
    low, high, log, step = spec["min"], spec["max"], spec.get("log", False), spec.get("step")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)):
        raise _error(source, key, f"a range's min and max are integers, got {low!r} and {high!r} "
                                  "(list the choices instead for other values)")
    if not isinstance(log, bool):
        raise _error(source, key, f"log is true or false, got {log!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise _error(source, key, f"step is a positive integer, got {step!r}")
    if log and step not in (None, 1):
        raise _error(source, key, "a range is either log or on a step, not both")
    if low > high:
        raise _error(source, key, f"min {low} is above max {high}")
    if log and low < 1:
        raise _error(source, key, f"a log range starts at 1 or more, got min {low}")
    if step and (high - low) % step:
        raise _error(source, key, f"max {high} is not min {low} plus a whole number of steps of {step}")
    for v in (low, high):
        _check_value(source, key, v)
    return Param(key, low=low, high=high, log=log, step=None if log else step)


def parse_space(data: dict[str, Any], source: str = "<space>") -> SearchSpace:
    """The space from a parsed TOML document; PresetError saying which key and why."""
    if set(data) == {"space"} and isinstance(data["space"], dict):
        data = data["space"]
    known = tunable_fields()
    params = []
    for key, spec in data.items():
        if key not in known:
            raise _error(source, key, f"not an engine argument a preset knows; a space may name: {', '.join(known)}")
        if isinstance(spec, list):
            params.append(_choices(source, key, spec))
        elif isinstance(spec, dict):
            params.append(_range(source, key, spec))
        else:
            raise _error(source, key, f"expected a list of choices or a range {{min = A, max = B}}, got {spec!r}")
    if not params:
        raise _error(source, None, "the space names no engine argument to tune")
    return SearchSpace(tuple(params), source)


def load_space(path: str | Path) -> SearchSpace:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PresetError(f"cannot read the space file: {exc}", file=str(p)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"does not parse as TOML: {exc}", file=str(p)) from None
    return parse_space(data, str(p))


__all__ = ["Param", "SearchSpace", "load_space", "parse_space", "tunable_fields"]
