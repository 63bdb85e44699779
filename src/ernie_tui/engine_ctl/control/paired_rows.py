"""A paired sweep's table columns "rank" and "vs best", from its duels.

A paired sweep's table rows hold one round-0 search per preset. Ranking those
single searches against each other (what `sweep._mark_noise` does for a
sequential sweep) ranks the host's minute as much as the preset: on an H100
the 24th GPU run's table put seed-C first and seed-A 28 % behind, while eight
paired rounds found the two within noise (-18 to +16 %). So in a paired sweep
the two columns say only what the pairs beyond noise say:

- rank: 1 + the number of presets that beat this one through a chain of wins
  beyond noise; none ("–") for a preset in no such win, or in a cycle of wins;
- vs best: "best" for a placed preset that nothing beats; for another, its
  measured gap to a best one with the interval ("-15 % (-25 to -4 %)"), or
  "within noise" where that pair is ("undecided: knee uncertain" where a
  pair of it beyond noise was held back by its knee checks); "not compared
  (why)" where no pair of it was measured: its search found no capacity to
  duel at, or its duels never ran (a sweep cancelled first). The sweep
  screen's table shows these same cells (it folds its rows through here), so
  the two never word it apart.

Pure functions over `PairedResult.to_dict()`, so a live sweep, its JSON export
and the report read it alike.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

from ernie_tui.engine_ctl.control.ranking import win_closure


class RankedRow(Protocol):
    preset: str
    rank: int | None
    vs_best: str
    paired: bool


def _wins(paired: dict[str, Any]) -> list[tuple[str, str]]:
    """(better, worse) of every pair beyond noise. Read from the pairs, not
    the ranking's "wins", which exports before 2026-12-06 lack."""
    wins = []
    for p in paired.get("pairs") or []:
        if isinstance(p, dict) and p.get("beyond_noise") and p.get("better") in (p.get("a"), p.get("b")):
            better = str(p["better"])
            wins.append((better, str(p["b"] if better == p["a"] else p["a"])))
    return wins


def paired_ranks(paired: dict[str, Any]) -> dict[str, int]:
    """Preset -> rank, for the presets a win beyond noise places (none in a cycle)."""
    beats = win_closure(_wins(paired))
    placed = {n for pair in beats for n in pair}
    above = {n: {x for x, y in beats if y == n} for n in placed}
    return {n: 1 + len(ups) for n, ups in above.items() if not any((n, x) in beats for x in ups)}


# A measured preset in no measured pair, in the vs-best column: compared with
# nothing, so never "within noise" (issue 59). Why, in the words of the paired
# sweep's own note ("no capacity to duel at for X: not compared").
NO_CAPACITY = "not compared (no capacity to duel at)"
NO_DUEL = "not compared (no duel measured)"


def not_compared(paired: dict[str, Any], name: str) -> str:
    """Why `name` has no pair with an interval: its search found no load to
    duel at (the usual case), or it had one and its duels were not measured."""
    searches = [s for s in paired.get("searches") or [] if isinstance(s, dict) and s.get("preset") == name]
    if searches and not any(s.get("duel_load") for s in searches):
        return NO_CAPACITY
    return NO_DUEL


def _log_gap(pair: dict[str, Any], name: str, best: str) -> tuple[float, float, float] | None:
    """ln(name / best) and its interval, from a pair measured either way round."""
    mean, low, high = pair.get("mean"), pair.get("low"), pair.get("high")
    if mean is None or low is None or high is None:
        return None
    if pair.get("a") == best and pair.get("b") == name:
        return float(mean), float(low), float(high)
    if pair.get("a") == name and pair.get("b") == best:
        return -float(mean), -float(high), -float(low)
    return None


def _pct(x: float) -> float:
    return (math.exp(x) - 1.0) * 100.0


def vs_best_text(paired: dict[str, Any], name: str, ranks: dict[str, int]) -> str:
    """The table cell: "best", a gap to a best preset with its interval, "within noise", or
    "not compared (why)"."""
    bests = [n for n, r in ranks.items() if r == 1]
    if name in bests:
        return "best"
    pairs = [p for p in paired.get("pairs") or [] if isinstance(p, dict)]
    for best in bests:
        for pair in pairs:
            gap = _log_gap(pair, name, best)
            if gap is not None and pair.get("beyond_noise"):
                g, lo, hi = (_pct(x) for x in gap)
                return f"{g:+.0f} % ({lo:+.0f} to {hi:+.0f} %) vs {best}"
    if not any(p.get("mean") is not None for p in pairs if name in (p.get("a"), p.get("b"))):
        return not_compared(paired, name)  # no interval at all: nothing to call noise
    if any(p.get("held_back") and name in (p.get("a"), p.get("b")) for p in pairs):
        return "undecided: knee uncertain"  # an interval beyond noise held back (ranking.paired_verdict)
    return "within noise"


def mark_paired(rows: Sequence[RankedRow], paired: dict[str, Any]) -> None:
    """Set each row's rank and vs best from the paired sweep's verdicts."""
    ranks = paired_ranks(paired)
    for row in rows:
        row.paired = True
        row.rank = ranks.get(row.preset)
        row.vs_best = vs_best_text(paired, row.preset, ranks)


PAIRED_TABLE_NOTE = ("rank and vs best come from the paired duels (the pairs below): a rank only where a pair is "
                     "beyond noise, counting the presets above it; the capacity and goodput columns are each "
                     "preset's one round-0 search, which ranks its minute as much as the preset")
