"""Small formatting helpers shared by the widgets (no Textual here)."""

from __future__ import annotations


def duration(seconds: float | None, precise: bool = False) -> str:
    if seconds is None:
        return "–"
    if seconds < 0:
        seconds = 0.0
    if precise and seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}:{m:02d}:{sec:02d}"
    return f"{m}:{sec:02d}"


def gib(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 10:  # negatives too (vLLM's "-0.52 GiB" of KV memory)
        return f"{value:.2f} GiB"
    return f"{value:.1f} GiB"


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 10:
        return f"{value:.2f} s"
    return f"{value:.1f} s"


def integer(value: int | float | None) -> str:
    if value is None:
        return "–"
    return f"{int(value):,}"


def size_arg(value) -> str:
    """Engine-arg values for one line: 67108864 -> 64M, True -> on."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        mib = value >> 20
        return f"{mib >> 10}G" if mib % 1024 == 0 else f"{mib}M"
    if isinstance(value, list) and len(value) == 1:
        return str(value[0])
    return str(value)
