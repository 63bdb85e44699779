"""Figures as the records hold them, read leniently: a number that may be
missing, null, a string or NaN; an SLO as its objectives' text or dicts.
Shared by every reader of records (inputs, tune_inputs); no I/O."""

from __future__ import annotations

import re
from typing import Any


def num(value: Any) -> float | None:
    """A float, or None for a missing, boolean, non-numeric or NaN value."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


_SLO_RE = re.compile(r"^\s*(ttft|itl|e2e|tpot)_(p\d+(?:\.\d+)?)\s*[=<]+\s*([\d.]+)\s*(ms|s)?\s*$", re.I)


def slo_limits(slo: list[Any]) -> dict[str, float]:
    """"ttft_p99<=500ms" / "ttft_p99=0.5s" (or the objectives' dicts) -> {"ttft_p99": 500.0} in ms."""
    out: dict[str, float] = {}
    for item in slo or []:
        if isinstance(item, dict):
            metric, pct = item.get("metric"), item.get("percentile")
            limit = num(item.get("limit_s"))
            if metric and pct is not None and limit is not None:
                out[f"{metric}_p{num(pct):g}"] = limit * 1000.0
            continue
        m = _SLO_RE.match(str(item))
        if m:
            value = float(m.group(3)) * (1000.0 if (m.group(4) or "ms").lower() == "s" else 1.0)
            out[f"{m.group(1).lower()}_{m.group(2).lower()}"] = value
    return out
