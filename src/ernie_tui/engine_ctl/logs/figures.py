"""Numbers read from log text, checked against what the quantity can be."""

from __future__ import annotations

import math
import re
from typing import Any

# Every number the parser takes from a log goes through _figure(), the one
# place that converts text to a number and checks it against what the
# quantity can physically be. A log is text anyone (or a broken build) can
# write: a 400-digit "took ... seconds" overflows a float to inf, which is not
# JSON, and 10^26 KV tokens or port -1 describe no machine. Such a figure is
# dropped and the report's `notes` say so. unit -> (lowest, highest, integral, label)
_UNITS: dict[str, tuple[float, float, bool, str]] = {
    "seconds": (0.0, 1e7, False, "s"),  # ~4 months: load, compile, capture times
    "gib": (-float(1 << 20), float(1 << 20), False, "GiB"),  # 1 PiB; a graph pool can give memory back
    "bytes": (0, 1 << 50, True, "bytes"),  # 1 PiB
    "tokens": (0, 10**12, True, "tokens"),  # 1 PiB of KV cache at 1 KiB per token
    "count": (0, 10**12, True, ""),  # requests, blocks, heads, GPUs, progress-bar steps
    "ratio": (0.0, 1e12, False, "x"),  # max concurrency
    "tps": (0.0, 1e9, False, "tokens/s"),
    "percent": (0.0, 100.0, False, "%"),
    "fraction": (0.0, 1.0, False, ""),
    "port": (1, 65535, True, ""),
    "pid": (1, 1 << 22, True, ""),  # Linux PID_MAX_LIMIT
}
# Plain decimal figures as vLLM prints them; "inf", "nan" and exponents are not figures.
_RE_FIGURE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MAX_NOTES = 50  # a log full of bad figures does not grow the report without bound


def _note(notes: list[str] | None, text: str) -> None:
    if notes is None:
        return
    if len(notes) < MAX_NOTES:
        notes.append(text)
    elif len(notes) == MAX_NOTES:
        notes.append("more figures were dropped; not listed")


def _figure(raw: str | float | None, unit: str, what: str, notes: list[str] | None = None,
            line_no: int | None = None) -> int | float | None:
    """`raw` (log text such as "1,234" or "0.06", or a number already parsed,
    e.g. from the args dict) as a number of `unit`, or None: None when it is
    not a figure at all, and when it lies outside the unit's physical range,
    in which case a note is added to `notes`."""
    if raw is None or isinstance(raw, bool):
        return None
    lo, hi, integral, label = _UNITS[unit]
    if isinstance(raw, (int, float)):
        value: int | float = raw
        shown = repr(raw)
    else:
        text = raw.strip().replace(",", "")
        if not _RE_FIGURE.fullmatch(text):
            return None
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        try:
            value = int(text) if integral and "." not in text else float(text)
        except ValueError:  # more digits than int() converts
            value = math.inf
    if not (lo <= value <= hi):  # also False for nan; inf is outside every range
        where = f"line {line_no}: " if line_no else ""
        _note(notes, f"{where}{what} {shown}{' ' + label if label else ''} is outside any physical range "
                     f"({lo:g} to {hi:g}); dropped")
        return None
    return int(value) if integral else float(value)


def _finite(value: Any) -> bool:
    """No inf or nan anywhere inside (the args dict's literals can hold 1e999)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, complex):
        return math.isfinite(value.real) and math.isfinite(value.imag)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_finite(v) for v in value)
    return True

