"""A level's verdict in words: one wording for every place that shows it
(the probe pane's level table and its headline, `runs show`).

A level ends pass, fail or undecided (a cap reached before its windows
agreed). An undecided level still counts for the search as its point
estimates say, so its words carry both: "undecided: pass". They used to read
"pass (undecided)" on screen and "undecided" in `runs show` for the same
level. Works on a LevelResult and on a run record's level dict alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Stops that end a level before its figures could judge it: said instead of a verdict's reason.
_STOP_WORDS = {"errors": "errors", "server_down": "server down"}


def _field(level: Any, name: str) -> Any:
    return level.get(name) if isinstance(level, Mapping) else getattr(level, name, None)


def verdict_text(level: Any) -> str:
    """'pass', 'fail', 'undecided: pass', 'undecided: fail', 'cancelled',
    'fail: errors' or 'fail: server down'. Records made before levels had a
    `verdict` field give it by `decided` and `passed`."""
    passed, stop = bool(_field(level, "passed")), _field(level, "stop") or ""
    verdict = _field(level, "verdict") or ("undecided" if not _field(level, "decided")
                                           else "pass" if passed else "fail")
    if stop == "cancelled" and verdict != "fail":
        return "cancelled"
    if verdict == "undecided":
        return f"undecided: {'pass' if passed else 'fail'}"
    if verdict == "fail" and stop in _STOP_WORDS:
        return f"fail: {_STOP_WORDS[stop]}"
    return str(verdict)


def second_look(level: Any) -> str:
    """How a level measured again is named beside its load: 'conf.' (the
    search's closing confirmation), 'again' (a remeasure or a recheck), or ''
    for a first look."""
    if _field(level, "confirmation"):
        return "conf."
    return "again" if _field(level, "measured_again") else ""
