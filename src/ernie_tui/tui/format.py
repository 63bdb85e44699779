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


def age(seconds: float) -> str:
    """How long something has lasted, in words: '12 s', '3 min 4 s', '2 h 5 min'."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def since(reason: str, start: float, now: float) -> tuple[str, str, str]:
    """('/metrics: HTTP 500', '14:02:11', '12 s') for a /metrics problem that
    began at `start` (epoch seconds) and still holds at `now`."""
    import time

    return f"/metrics: {reason}", time.strftime("%H:%M:%S", time.localtime(start)), age(now - start)


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
