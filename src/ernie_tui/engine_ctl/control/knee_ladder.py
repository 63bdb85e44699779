"""Each preset's knee, measured again in every duel round, and how far its evidence can be trusted.

Before 2026-12-07 the paired sweep searched each preset's knee once (round
0) and its duels compared tok/s at that one load. One noisy search fixed the
result: on the drifting 2-core box a stronger stand-in's first level read ITL
p99 23.6 ms against 20 ms from the box's scheduling jitter, its search ended
at 7 where its knee was near 18, and three duel rounds called the weaker one
better "beyond noise" (issue #56). The duels' interval said how repeatable
the duels were, not whether 7 was the knee.

So each duel round now climbs a short ladder around each preset's current
knee (paired_sweep.ladder_round): its knee (the level whose tok/s the pairs
compare, measured between the reference's two looks), then one step above
where that passed, or the knee once more and then a step below where it
failed. The round's knee reading is the highest load that passed; the next
round starts there, or further up where the top of the ladder passed with
its tail far under the limit (climb()). Round 0's knee, too, starts higher
where it passed far under the limit (start_knee()). A knee found too low is
thus corrected round by round, and the rounds' spread lands in the interval.
Only decided levels move a knee (next_after()).

The evidence checks name what a reading cannot be trusted for:
- search_doubts(): round 0's levels contradict each other: a fail at or below
  a load that passed; a pass with its tail far under the limit beside a fail
  one step up by a little (a spike, not a knee). knee_doubts() lifts them
  where two ladder rounds read the knee cleanly;
- read_round(): a level near the limit whose percentile rests on a few
  requests, measured twice and still thin;
- mark_lower_bounds(): a round whose figure of a preset was measured far
  under its knee while another preset was at its own (only a lower bound of
  its goodput at capacity).
ranking.paired_verdict() holds back a verdict beyond noise that rests on an
uncertain knee, or on a lower bound of the preset it calls weaker.

Pure: the levels are measured through a function handed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

# A pass whose every objective reads this share or more under its limit has
# wide headroom: it is not at the knee (on the stand-ins' ITL knees a step of
# 10 % moves the p99 by about 10 %).
WIDE_HEADROOM = 0.30
# A fail by at most this share over the limit is a fail "by a little": one
# that a tail spike can make (the 23.6 ms against 20 ms, 18 % over).
# A queueing knee fails its TTFT by several times the limit instead.
SMALL_MISS = 0.30
# A percentile rests on few requests when fewer than this many samples lie
# beyond it (a p99 of 40 requests is their slowest one).
THIN_TAIL_SAMPLES = 5
# ... and that matters only near the limit: within this share of it.
NEAR_LIMIT = 0.15
# A round's figure of a preset is only a lower bound where its level's
# reading over its limit is under (1 - this) x the highest of the round's
# presets: it was measured far under its knee while another was at its own.
# Relative, not absolute: a host's drift moves every knee alike (on the
# simulated stand-in drifting +-30 % over 2 min, tests/knee_sim.py, an
# absolute test at 30 % held back 10 of 20 runs at a true 25 %).
LOWER_BOUND_HEADROOM = 0.40
# ... or under (1 - this) x the highest where its ladder climbed with wide
# headroom and another's did not (mark_lower_bounds). Without the tail's
# share, a host that sped up while one preset's rung ran and slowed for the
# other's marked rounds alike (on the simulated stand-in, +-30 % over 2 min,
# excluding lower bounds then, the right verdicts at 25 % fell from 72 to 52
# of 100).
CLIMB_TAIL_SHARE = 0.15
# The most a ladder goes down within a round, in steps.
MAX_CLIMB_STEPS = 4
# The most a knee climbs between rounds: a doubling, as the search's own steps.
MAX_CLIMB = 2.0
# A decided pass or fail binds the knee (Bracket) for this many rounds after
# the one that saw it: a host that sped up or slowed moves the knee, and
# evidence older than that no longer says where it is.
BRACKET_ROUNDS = 2


@dataclass
class Look:
    """One ladder level as this module needs it (from a LevelResult)."""

    load: float
    passed: bool
    decided: bool
    objectives: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, level: Any) -> Look:
        return cls(float(level.load), bool(level.passed), bool(level.decided), list(level.objectives or []))


def _ratio(o: dict[str, Any]) -> float | None:
    """An objective's reading over its limit (inf: no value, e.g. failed requests)."""
    limit = o.get("limit_ms")
    if not limit:
        return None
    value = o.get("value_ms")
    return math.inf if value is None else float(value) / float(limit)


def headroom(look: Look) -> float | None:
    """How far under its limit the level's tightest objective read: 1 - value / limit (None: no objectives)."""
    ratios = [r for o in look.objectives if (r := _ratio(o)) is not None]
    return None if not ratios else 1.0 - max(ratios)


def wide(look: Look) -> bool:
    h = headroom(look)
    return look.passed and h is not None and h >= WIDE_HEADROOM


def missed_by_little(look: Look) -> bool:
    """A fail whose every objective over its limit is over it by SMALL_MISS or less."""
    over = [r for o in look.objectives if (r := _ratio(o)) is not None and r > 1.0]
    return not look.passed and bool(over) and max(over) <= 1.0 + SMALL_MISS


def thin_near_limit(look: Look) -> str | None:
    """Where the level's verdict rests on a percentile of few samples near its limit: which, in words."""
    for o in look.objectives:
        r, n, p = _ratio(o), o.get("samples") or 0, o.get("percentile") or 50
        if r is None or not math.isfinite(r) or abs(r - 1.0) > NEAR_LIMIT:
            continue
        beyond = n * (1.0 - p / 100.0)
        if beyond < THIN_TAIL_SAMPLES:
            return (f"{o.get('objective', o.get('metric'))} read {o.get('value_ms', 0):.0f} ms against "
                    f"{o.get('limit_ms', 0):g} from {n} samples ({beyond:.1f} beyond the percentile)")
    return None


def _fmt(x: float) -> str:
    return f"{x:g}"


def contradictions(looks: Sequence[Look]) -> list[str]:
    """Levels that contradict each other (decided ones): a fail at or below a
    load that passed; a pass with wide headroom beside a fail by a little at
    the next load measured above it."""
    decided = [lk for lk in looks if lk.decided]
    out: list[str] = []
    passes = [lk for lk in decided if lk.passed]
    for f in (lk for lk in decided if not lk.passed):
        above = [p.load for p in passes if p.load >= f.load]
        if above:
            out.append(f"failed at {_fmt(f.load)} yet passed at {_fmt(max(above))}")
            break
    loads = sorted({lk.load for lk in decided})
    for p in passes:
        nxt = [x for x in loads if x > p.load]
        if not nxt or not wide(p):
            continue
        spikes = [f for f in decided if f.load == nxt[0] and missed_by_little(f)]
        if spikes:
            h = headroom(p) or 0.0
            out.append(f"passed {_fmt(p.load)} {h:.0%} under its limit, yet failed {_fmt(nxt[0])}, one step up, "
                       f"by a little: a tail spike, not a knee")
            break
    return out


def search_doubts(levels: Sequence[Any]) -> list[str]:
    """Round 0's evidence checks over a search's levels (LevelResults; cancelled ones left out)."""
    looks = [Look.of(lv) for lv in levels if getattr(lv, "stop", "") != "cancelled"]
    return contradictions(looks)


# -- the ladder of one round --------------------------------------------------------

def step_up(load: float, step: float, rate: bool, steps: float = 1.0) -> float:
    up = load * (1.0 + step) ** steps
    return round(up, 3) if rate else float(max(int(load) + 1, round(up)))


def step_down(load: float, step: float, rate: bool, steps: float = 1.0) -> float | None:
    down = load / (1.0 + step) ** steps
    if rate:
        return round(down, 3)
    low = min(int(load) - 1, round(down))
    return float(low) if low >= 1 else None


@dataclass
class KneeRound:
    """A preset's reading in one duel round: the highest load of its ladder
    that passed (None: none did) and its tok/s there (adjusted: over the
    round's reference at the same moment), whether that is only a lower bound
    of its knee, what throws doubt on it, and where the next round starts."""

    preset: str
    round: int
    knee: float | None
    output_tps: float | None = None
    adjusted: float | None = None
    goodput_output_tps: float | None = None
    lower_bound: bool = False
    climbing: bool = False  # the top of its ladder, above its knee, passed with wide headroom
    tail: float | None = None  # the figure's level: its tightest objective over its limit
    doubts: list[str] = field(default_factory=list)
    next_knee: float | None = None
    loads: list[float] = field(default_factory=list)  # the ladder's loads, in the order measured
    edge: bool = False  # read at an undecided level, nothing passed (edge_load)

    @property
    def clean(self) -> bool:
        """A knee read (a load passed) with nothing against it. A lower
        bound's figure is weighed apart (ranking.paired_verdict): its knee
        reading still stands."""
        return self.knee is not None and not self.doubts


def down_steps(failed: Look, step: float) -> float:
    """How many steps below a failed level the next rung goes: as far as its
    tail read over the limit (as if the tail grew with the load), one step
    at least, MAX_CLIMB_STEPS at most: a host that slowed by a quarter moves
    a knee by three steps, and two rungs of one step each found nothing."""
    h = headroom(failed)
    over = math.log(1.0 / (1.0 - h)) if h is not None and -1e9 < h < 0 else 0.0
    return min(float(MAX_CLIMB_STEPS), max(1.0, math.ceil(abs(over) / math.log1p(step) - 1e-9)))


def climb(top: Look, step: float) -> float:
    """How far above a level that passed under its limit the knee likely
    is, as a factor: as far as its tail read under the limit (as if the tail
    grew with the load, as a token gap does past the batch a step holds),
    one step at least, MAX_CLIMB at most: issue #56's knee found at 7, its
    ITL p99 at 60 % of the limit, and near 18 then takes two rounds, not ten.
    A tail that grows faster overshoots: that round's knee fails and the
    ladder goes down by down_steps()."""
    h = headroom(top)
    room = 1.0 / (1.0 - h) if h is not None and 0 < h < 1 else 1.0
    return min(MAX_CLIMB, max(1.0 + step, room))


def start_knee(load: float | None, levels: Sequence[Any], step: float, rate: bool) -> float | None:
    """Where a preset's ladder starts after round 0: the highest load that
    passed there (paired_sweep.duel_load), climbed (climb()) where that level
    passed with wide headroom: a search that failed the level above it by a
    spike (search_doubts) leaves its knee far too low."""
    if load is None:
        return None
    at = [Look.of(lv) for lv in levels
          if float(lv.load) == load and lv.passed and getattr(lv, "stop", "") != "cancelled"]
    if not at or not wide(at[-1]):
        return load
    f = climb(at[-1], step)
    start = round(load * f, 3) if rate else float(max(int(load) + 1, round(load * f)))
    # Never above a level the search failed by more than a spike makes: that
    # fail is the knee's other side, and the search's bracket already holds
    # the knee. A wide pass says little about a queueing knee, where the
    # tail stays flat and then jumps (the GPU run of 2026-12-07: seed-A passed
    # 280 with its ITL p99 37 % under the limit and failed 350 with its TTFT
    # p99 45 % over; the ladder started at 444 and spent its first round on
    # loads that failed, then on rungs below that never decided).
    hard = [float(lv.load) for lv in levels
            if float(lv.load) > load and lv.decided and not lv.passed and getattr(lv, "stop", "") != "cancelled"
            and not missed_by_little(Look.of(lv))]
    if hard:
        below = step_down(min(hard), step, rate)
        start = min(start, max(load, below if below is not None else load))
    # Nor past a level the search could not pass: one whose fail stayed
    # undecided (its p99's bounds straddled the limit: the knee is there, as
    # near as the search can tell), or one that failed at every look, two or
    # more. The ladder may start at it, not above. Why: on the H100 run of
    # 2026-12-07 (the 27th) seed-C passed 280 with its ITL p99 29 ms against
    # 50 and failed 350 twice, undecided (TTFT p99 1,111 and 1,104 ms against
    # 1 s, from 3,000 requests each); climbed by its ITL headroom its ladder
    # started at 486 and spent round 1 failing there and stepping down.
    looks: dict[float, list[Any]] = {}
    for lv in levels:
        if float(lv.load) > load and getattr(lv, "stop", "") != "cancelled":
            looks.setdefault(float(lv.load), []).append(lv)
    held = [at_load for at_load, seen in looks.items()
            if not any(lv.passed for lv in seen) and (len(seen) >= 2 or any(not lv.decided for lv in seen))]
    if held:
        start = min(start, max(load, min(held)))
    return start


@dataclass
class Bracket:
    """A preset's decided evidence across rounds (round 0's search levels,
    then every ladder level): where its knee cannot be. Why: on a real GPU
    (vLLM 0.26, H100, 2026-12-07) the knee is a queueing knee, the TTFT p99
    flat at 30-60 % of its limit and then 45-180 % over it one step up, so a
    pass's headroom says nothing of how far up the knee is and a fail's
    overshoot nothing of how far down. long-doc passed 320 and failed 400 in
    round 0; its ladder climbed to 490 (failed), stepped down four steps to
    201, climbed from 251 to 502 (failed), and read 201, 251, 206. Each
    round forgot what the earlier ones had seen.

    So the next knee is clamped: never above the lowest live decided fail
    (retested at most: the cap is its load), never below the highest live
    decided pass. Evidence is live for BRACKET_ROUNDS rounds
    after the one that saw it, and newer evidence overrules older: a pass at
    or above an older fail's load removes that fail, a fail at or below an
    older pass's load removes that pass (levels taken in the order measured),
    so a host that sped up or slowed moves the bracket within a round or two."""

    passes: list[tuple[float, int]] = field(default_factory=list)  # (load, round seen)
    fails: list[tuple[float, int]] = field(default_factory=list)  # (load, round seen)

    def add(self, r: int, looks: Sequence[Look]) -> None:
        for lk in looks:
            if not lk.decided:
                continue  # an undecided level straddles the limit: no side of the knee
            if lk.passed:
                self.fails = [f for f in self.fails if f[0] > lk.load]
                self.passes.append((lk.load, r))
            else:
                self.passes = [p for p in self.passes if p[0] < lk.load]
                self.fails.append((lk.load, r))

    def live(self, r: int) -> tuple[float | None, float | None]:
        """The highest live pass and the lowest live fail for round r's knee."""
        passes = [p[0] for p in self.passes if r - p[1] <= BRACKET_ROUNDS]
        fails = [f[0] for f in self.fails if r - f[1] <= BRACKET_ROUNDS]
        return max(passes, default=None), min(fails, default=None)

    def clamp(self, knee: float, r: int) -> float:
        """Round r's knee, `knee` held inside the live bracket (the class's docstring)."""
        low, fail = self.live(r)
        if fail is not None:
            # At most a retest of the fail: a tail spike fails a level by a
            # little, and a host that sped up since moves the knee over a
            # fail by far. (Capped one step under a fail by more than a
            # little, on the simulated queueing knee drifting +-30 % over 2
            # min, an A/A pair was called beyond noise in 4 of 1000 runs, a
            # knee held under a host that had sped up; at the fail, 1.)
            knee = min(knee, fail)
        if low is not None:
            knee = max(knee, low)
        return knee


def edge_load(looks: Sequence[Look]) -> float | None:
    """The highest undecided level under every decided fail: where a
    round's knee is read when no level passed. Why: an undecided level's
    bounds straddle the limit at its cap, so the limit lies within the
    level's own noise: its load is the knee, as near as the round can tell.
    On the GPU run of 2026-12-07 seed-A's duel levels at 350 (passed in
    round 0's longer level) ended undecided in every round, no round read a
    knee ("-, -, -"), and its verdicts stayed within noise at -35..+188 %.
    Its tok/s there is the preset's at its capacity; the next round stays
    at it (next_after: undecided is no evidence to move on)."""
    fails = [lk.load for lk in looks if lk.decided and not lk.passed]
    edge = [lk.load for lk in looks if not lk.decided and all(lk.load < f for f in fails)]
    return max(edge, default=None)


def next_after(at: float, looks: Sequence[Look], step: float, rate: bool) -> float:
    """The next round's knee, moved only on decided levels: the highest
    decided pass, or further up where it topped the ladder above the knee it
    started at (climb()); below the lowest decided fail when nothing passed
    at all (down_steps()); else where it was. An undecided level (its windows
    never agreed, or its bounds straddled the limit at the cap) is no
    evidence to move a knee on: on the loaded 2-core box (load average 8-12)
    a stand-in's duel levels ended undecided by the dozen, their point
    estimates failing at concurrency 1, and knees moved on them fell from 5
    to 1 within two rounds."""
    decided = [lk for lk in looks if lk.decided]
    passes = [lk for lk in decided if lk.passed]
    if passes:
        top = max(passes, key=lambda lk: lk.load)
        if top.load >= max(lk.load for lk in looks) and top.load > at:
            f = climb(top, step)
            return round(top.load * f, 3) if rate else float(max(int(top.load) + 1, round(top.load * f)))
        if top.load >= at or all(not lk.passed for lk in looks if lk.load > top.load and lk.decided):
            return top.load
    fails = [lk for lk in decided if not lk.passed]
    # Only a decided pass holds a knee up: a knee that failed, decided, and a
    # rung below whose point estimate passed undecided kept the failed knee for
    # the next round (the GPU run of 2026-12-07: long-doc at 515 failed twice,
    # 211 undecided, and round 2 measured 515 again).
    if fails and not passes:
        low = min(fails, key=lambda lk: lk.load)
        if low.load > at:
            # Only a rung above failed; the knee itself ended undecided (no
            # decided pass, no decided fail at it): the knee is at its edge,
            # and a fail above it says nothing new (edge_load).
            return at
        return step_down(low.load, step, rate, down_steps(low, step)) or low.load
    return at


def read_round(preset: str, r: int, at: float, looks: Sequence[Look], step: float, rate: bool,
               thin: Sequence[str] = (), counted: Look | None = None) -> KneeRound:
    """A preset's reading from its ladder levels of round r (the knee it
    started at, `at`; the levels in the order measured); `thin`: what stayed
    thin near the limit after a second look; `counted`: the level whose tok/s
    the round compares (the knee it started at): its tail is kept for
    mark_lower_bounds(). Contradictions between a round's levels are not
    looked for: its rungs lie on one side of the first (above it where it
    passed, below where it failed), and they are measured after the other
    presets' knees, tens of seconds apart on a drifting host, where a knee
    may move by the drift's amplitude; round 0's search (search_doubts) and
    each level's thin tail are checked."""
    passes = [lk for lk in looks if lk.passed]
    knee = max((lk.load for lk in passes), default=None)
    edge = edge_load(looks) if knee is None else None
    reading = KneeRound(preset, r, knee if edge is None else edge, loads=[lk.load for lk in looks],
                        edge=edge is not None)
    reading.doubts = [f"near its limit on few requests, twice: {t}" for t in thin]
    h = headroom(counted) if counted is not None else None
    reading.tail = None if h is None else 1.0 - h
    if knee is not None and edge is None:
        top = next(lk for lk in passes if lk.load == knee)
        reading.climbing = knee > at and knee >= max(lk.load for lk in looks) and wide(top) and top.decided
    reading.next_knee = next_after(at, looks, step, rate)
    return reading


def mark_lower_bounds(readings: Sequence[KneeRound]) -> None:
    """Mark the round's readings whose figure's tail (over its limit) is
    under (1 - LOWER_BOUND_HEADROOM) x the highest of the round's: measured
    far under its knee while another preset was at its own (issue #56's
    stronger preset at 7, its ITL p99 at 60 % of the limit, beside the weaker
    at 95 %). Only a lower bound of its goodput at capacity: left out of the
    pairs (PairedResult.verdict). Also one whose ladder climbed with wide
    headroom (the rung above its knee passed far under the limit) where not
    every preset's did and its tail read CLIMB_TAIL_SHARE under the highest:
    below the stand-ins' batch knee a token gap no longer
    shrinks with the load, so a tail read there says little of how far under
    its knee a level is (the issue's stronger preset at 7 read 48 % of its
    limit beside the weaker at 78 %, its tok/s 12.5 % short). Where every
    preset climbed, the host sped up under all of them alike."""
    tails = [k.tail for k in readings if k.tail is not None and math.isfinite(k.tail)]
    if len(tails) < 2:
        return
    top = min(1.0, max(tails))  # (a level over its limit is at most at its knee: past it is no nearer)
    alike = all(k.climbing for k in readings)
    for k in readings:
        low = k.tail is not None and k.tail < (1.0 - LOWER_BOUND_HEADROOM) * top
        lagging = k.climbing and not alike and k.tail is not None and k.tail < (1.0 - CLIMB_TAIL_SHARE) * top
        k.lower_bound = low or lagging


def knee_doubts(round0: Sequence[str], readings: Sequence[KneeRound]) -> list[str]:
    """What holds a preset's knee uncertain over the whole run: each round's
    doubts; round 0's unless lifted by two clean ladder rounds (round 0's
    knee is only where the ladder starts: the pairs compare the ladder's).
    Before 2026-12-07 the last round had to be one of them too: on the
    drifting simulated host (+-30 % over 2 min) that held back 15 of 100
    right verdicts at a true 25 %.
    A reading that is only a lower bound is no doubt here: it cannot make a
    preset look better than it is, so ranking.paired_verdict() holds back
    only a verdict that calls that preset the weaker one."""
    out = [f"round {k.round}: {d}" for k in readings for d in k.doubts]
    clean = [k for k in readings if k.clean]
    if round0 and len(clean) < 2:
        out += [f"round 0 search: {d}" for d in round0]
    read = [k for k in readings if k.knee is not None]
    if readings and len(read) < min(2, len(readings)):
        # Nothing passed at or around its knee in most rounds (every level
        # undecided, or failed): its figures are at round 0's load, which may
        # be far from its knee. On the loaded 2-core box (load average 20),
        # tune's A/A check compared a copy of BASE at 6 with BASE at 1, the
        # round-0 searches' loads, and wrote the copy as 263 % better: every
        # ladder level had ended undecided, so no other check had a reading.
        out.append(f"its ladder read no knee in {len(readings) - len(read)} of {len(readings)} rounds (no level "
                   "at or around it passed): its figures may compare loads, not presets")
    return out
