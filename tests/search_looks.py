"""What a capacity search decided, whatever the box did to it.

A search measures a level once more when the first look failed in a way
that says little of the server: it ended undecided, or our own client
stood still for half a second or more (capacity.py, _Search.run_at). On a
2-core CI box running four pytest workers beside a real vLLM that happens
(one CI run read rates [4, 8, 8, 8] where [4, 8, 8] was asserted: the
confirmation's last windows answered nothing while the box stood still,
and it was measured again). Freezing a test's processes for 10 s
(scripts/freeze_test.py) does the same on demand. The search is right to
look again, so the stand-in tests hold it to this: a calm search takes
exactly the path written down; a search that measured a level again
reaches the same verdict at every load it visits and confirms the same
capacity (a remeasure of the bracket's fail stands for its recheck, so
the path itself may be shorter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SearchPath = list[tuple[float, bool]]  # (load, passed) per level, the last one the confirmation


def search_path(levels: Sequence[Any]) -> SearchPath:
    return [(lv.load, lv.passed) for lv in levels]


def remeasured(levels: Sequence[Any]) -> bool:
    """Whether the search measured a level again because its first look said little."""
    return any(lv.measured_again == "remeasure" for lv in levels)


def last_verdicts(path: SearchPath, confirmations: Sequence[bool]) -> dict[float, bool]:
    """Each load's last verdict, confirmations apart."""
    return {load: passed for (load, passed), conf in zip(path, confirmations, strict=True) if not conf}


def assert_search_path(levels: Sequence[Any], calm: SearchPath) -> None:
    """`levels` took the calm path exactly or, measuring a level again, came
    to the same verdicts and the same confirmed capacity (calm's last entry
    is its confirmation)."""
    said = levels_said(levels)
    got = search_path(levels)
    assert levels and levels[-1].confirmation and got[-1] == calm[-1], said
    if not remeasured(levels):
        assert got == calm, said
        return
    calm_confirms = [False] * (len(calm) - 1) + [True]
    assert last_verdicts(got, [lv.confirmation for lv in levels]) == last_verdicts(calm, calm_confirms), said


def levels_said(levels: Sequence[Any]) -> str:
    """A search's levels, one line each, for a failed assertion to show what
    the search measured and why it measured a load again."""
    return "\n".join(f"{lv.load:g} {lv.verdict} stop={lv.stop} again={lv.measured_again} conf={lv.confirmation} "
                     f"n={lv.requests} failed={lv.failed} errors={lv.errors} ttft_p99={lv.ttft_p99_ms} "
                     f"lag_max={lv.client_lag_max_ms} elapsed={lv.elapsed_s} windows={lv.windows} "
                     f"stable={lv.stable} end_missed={lv.end_missed}" for lv in levels)
