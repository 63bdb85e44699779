"""The sweep screen's progress: how many steps its sweep takes, how many are
done, and the phase line, read from run_sweep's and run_paired_sweep's
progress events (engine_ctl/control/sweep.py, paired_sweep.py).

The two sweeps do different things, so they count differently:

- one after another (run_sweep): a step is one run, a preset measured once.
  Its events carry the run's `index` of `total`; a run is done at its
  "done" event.
- paired (run_paired_sweep, a capacity sweep of two or more presets): every
  server starts at once (no event until the first search reports), then
  every preset's search runs at once (their events interleave, `index` is
  the preset's), then R duel rounds of one level per preset plus the
  round's reference measured again. Its steps here: 1 (the servers up) + n
  (the searches) + R x (m + 1) (the duel levels, m the presets that found a
  capacity to duel at), each counted when its event says it ended, so the
  bar only moves forward.

Why not the events' own index/total: with two presets they read
"[1/11] cpu-demo: preflight" the whole time the servers started (the paired
sweep has no preflight event), and the last duel level's index is total - 1,
so at "Done" the bar stayed at 91 % (issue 59). `finish()` fills the bar
when the sweep ended of itself; a cancelled one keeps what was done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ernie_tui.engine_ctl.load import verdict_text
from ernie_tui.tui.widgets.capacity_view import describe_load, describe_progress

DUEL = "duel round"  # how run_paired_sweep's duel level events begin their phase


def phase_text(ev: dict[str, Any]) -> str:
    """What one event says is happening: 'burst 40/100 requests',
    'capacity search: concurrency 8 pass, 40 requests', ..."""
    phase = str(ev.get("phase", ""))
    if phase == "burst" and ev.get("burst_total"):
        return f"burst {ev.get('burst_done', 0)}/{ev['burst_total']} requests"
    if phase == "capacity" and ev.get("capacity_event"):
        ce = ev["capacity_event"]
        if ce.get("event") == "level_done":
            lv = ce["level"]
            load = f"rate {lv.rate:g} req/s" if lv.rate is not None else f"concurrency {lv.concurrency}"
            return f"capacity search: {load} {verdict_text(lv)}, {lv.requests} requests"
        rate = ce.get("rate") is not None
        load = describe_load(ce["rate"] if rate else ce.get("concurrency"), rate)
        if ce.get("event") == "level_progress":
            return "capacity search: " + describe_progress(ce, load=load).plain.removeprefix("level · ")
        return f"capacity search: {load} …"
    if phase == "done":
        return f"done: {ev.get('status', '?')}"
    return phase


def describe_event(ev: dict[str, Any], repeat: int) -> str:
    """A sweep-one-after-another event: '[2/3] cpu-a (round 1/2): burst 40/100 requests'."""
    where = f"[{ev.get('index', 0) + 1}/{ev.get('total', '?')}] {ev.get('preset', '?')}"
    if repeat > 1:
        where += f" (round {ev.get('repeat', 0) + 1}/{repeat})"
    return f"{where}: {phase_text(ev)}"


@dataclass
class SweepSteps:
    """The steps of one sweep on the screen. `rounds`: a paired sweep's duel
    rounds (None: one preset after another, `repeat` times)."""

    presets: list[str]
    repeat: int = 1
    rounds: int | None = None
    last: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    _runs_total: int = 0  # one after another: the events' total
    _runs_done: int = 0
    _started: bool = False  # paired: a search reported, so the servers are up
    _searched: dict[str, bool] = field(default_factory=dict)  # paired: preset -> its search found a capacity
    _duels: list[int] = field(default_factory=list)  # paired: the round of each duel level done

    def __post_init__(self) -> None:
        self._runs_total = len(self.presets) * self.repeat

    @property
    def paired(self) -> bool:
        return self.rounds is not None

    def _dueling(self) -> int:
        """The presets that duel: all of them until every search has ended,
        then those whose search found a capacity (none when fewer than 2)."""
        n = len(self.presets)
        if len(self._searched) < n and not self._duels:
            return n
        m = sum(self._searched.values())
        return m if m >= 2 else 0

    @property
    def total(self) -> int:
        if self.rounds is None:
            return self._runs_total
        m = self._dueling()
        searches = len(self._searched) if self._duels else len(self.presets)
        return 1 + searches + (self.rounds * (m + 1) if m else 0)

    @property
    def done(self) -> int:
        if self.finished:
            return self.total
        if self.rounds is None:
            return self._runs_done
        return min(self.total, int(self._started) + len(self._searched) + len(self._duels))

    def feed(self, ev: dict[str, Any], found: bool | None = None) -> None:
        """One progress event; `found`, with a paired search's "done": it
        found a capacity (so its preset duels)."""
        phase = str(ev.get("phase", ""))
        if self.rounds is not None and phase == "preflight":
            self.rounds = None  # the paired sweep was refused (no room side by side): one after another now
        self.last = ev
        if self.rounds is None:
            self._runs_total = int(ev.get("total") or self._runs_total)
            index = int(ev.get("index", 0))
            self._runs_done = max(self._runs_done, index + 1 if phase == "done" else index)
            return
        self._started = True
        if phase == "done":
            self._searched[str(ev.get("preset"))] = bool(found)
        elif phase.startswith(DUEL):
            self._duels.append(int(ev.get("repeat", 0)))

    def finish(self, cancelled: bool) -> None:
        """The sweep ended: the bar full, unless it was cancelled."""
        self.finished = not cancelled

    def line(self) -> str:
        """The phase line: where the sweep is, in words."""
        ev = self.last
        if self.rounds is None:
            if not ev:
                return describe_event({"phase": "preflight", "index": 0, "total": self.total,
                                       "preset": self.presets[0] if self.presets else "?"}, self.repeat)
            return describe_event(ev, self.repeat)
        n = len(self.presets)
        if not self._started:
            return f"starting {n} servers side by side: preflight, launch, wait until each is ready"
        phase = str(ev.get("phase", ""))
        if phase.startswith(DUEL):  # a duel level ended
            r = int(ev.get("repeat", 0))
            level = sum(1 for x in self._duels if x == r)
            what = phase.split(": ", 1)[1] if ": " in phase else phase
            return f"duel round {r}/{self.rounds}, level {level} done: {ev.get('preset', '?')} at {what}"
        what = phase_text(ev).removeprefix("capacity search: ")
        m = self._dueling()
        if m and (self._duels or len(self._searched) >= n):
            # A duel level under way: it runs through its preset's search runner, whose events read as the
            # search's (repeat 0); which round and level it is comes from the levels done.
            per = m + 1
            r, k = min(len(self._duels) // per + 1, self.rounds), len(self._duels) % per + 1
            return f"duel round {r}/{self.rounds}, level {k} of {per}: {ev.get('preset', '?')}: {what}"
        return f"searches ({len(self._searched)}/{n} done, levels taking turns): {ev.get('preset', '?')}: {what}"


def rounds_run(paired: Any) -> int:
    """The duel rounds a paired sweep's result measured (its PairedResult)."""
    return max((d.round for d in getattr(paired, "duels", None) or []), default=0)
