"""Which preset carries more: paired comparisons that hold while the host drifts.

A sweep that measures one preset, then the next, ranks the host's moment as
much as the preset: one H200's speed rose from 16 k to 26.5 k tok/s within ten
minutes with nothing changed, more than presets differ. The paired sweep
(paired_sweep.py) therefore measures every preset in each round within the
same minutes, their levels alternating, so that a round's drift hits each
member of a pair alike. The statistics here then work on each round's
difference, not on each preset's own figures:

- d_r = ln(B_r / A_r) for round r (goodput at the SLO, or the capacity);
- the mean of the d_r with a Student-t interval over the rounds (R - 1
  degrees of freedom). The host's drift moves A_r and B_r together and
  cancels in d_r, so the interval is valid under drift: it holds what is left,
  the measurement's own noise and the little drift within a round;
- a verdict per pair: "B carries 18 % more than A (11-25 %)" when the interval
  excludes 0, else "within noise";
- a ranking built only from the pairs beyond noise: a partial order, in
  tiers, with the pairs it cannot order named as ties.

unpaired_interval() is the comparison a sequential sweep can make (each
preset's rounds as a sample of its own): drift between the rounds widens it,
which is why a gap the paired one finds can be "noise" there.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

DEFAULT_CONFIDENCE = 0.95
# The smallest difference a verdict names (a share: 0.02 = 2 %): --min-difference.
DEFAULT_MIN_DIFFERENCE = 0.02


def t_two_sided(confidence: float, df: int) -> float:
    """The Student-t quantile for a two-sided interval of `confidence`.
    Exact for 1 and 2 degrees of freedom (the few rounds a ranking has; the
    series expansion is 12 % low at 2), the expansion from 3 on."""
    p = 0.5 + confidence / 2.0
    if df <= 0:
        return math.inf
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        q = 2.0 * p - 1.0
        return q * math.sqrt(2.0 / (1.0 - q * q))
    # Cornish-Fisher expansion of the normal quantile (as load.slo's
    # t_quantile: control may not import load's files): within about 1 %
    # from 3 degrees of freedom on.
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v * v)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


def log_ratios(a_values: Sequence[float | None], b_values: Sequence[float | None]) -> list[float]:
    """ln(B_r / A_r) for each round where both were measured above zero."""
    return [math.log(b / a) for a, b in zip(a_values, b_values, strict=False)
            if a is not None and b is not None and a > 0 and b > 0]


def paired_interval(diffs: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
                    ) -> tuple[float, float, float] | None:
    """(mean, low, high) of the paired log differences: Student t with
    n - 1 degrees of freedom. None with fewer than two rounds (no spread to
    judge by: one round's difference may be all noise)."""
    n = len(diffs)
    if n < 2:
        return None
    mean = statistics.fmean(diffs)
    half = t_two_sided(confidence, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return mean, mean - half, mean + half


def unpaired_interval(a_values: Sequence[float | None], b_values: Sequence[float | None],
                      confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float] | None:
    """(mean, low, high) of ln(B) - ln(A) treating each preset's rounds as a
    sample of its own (Welch): what a sweep without pairing can say."""
    la = [math.log(v) for v in a_values if v is not None and v > 0]
    lb = [math.log(v) for v in b_values if v is not None and v > 0]
    if len(la) < 2 or len(lb) < 2:
        return None
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    mean = statistics.fmean(lb) - statistics.fmean(la)
    se2 = va + vb
    if se2 <= 0:
        return mean, mean, mean
    df = se2 ** 2 / ((va ** 2 / (len(la) - 1)) + (vb ** 2 / (len(lb) - 1)))
    half = t_two_sided(confidence, max(1, int(df))) * math.sqrt(se2)
    return mean, mean - half, mean + half


def _pct(log_ratio: float) -> float:
    """A log ratio as a percentage: ln(1.18) -> 18.0."""
    return (math.exp(log_ratio) - 1.0) * 100.0


METRIC_WORDS = {"goodput_output_tps": "goodput", "output_tps_at_capacity": "output tok/s at capacity",
                "capacity": "capacity"}


def pct_span(*xs: float) -> str:
    """Percentages to the digit they need: "+0.01 to +0.03" where all are
    under 1 % (a floor of 2 % said of "+0 to +0" reads as nothing), one
    decimal under 10 %, whole percents from there on."""
    top = max(abs(x) for x in xs)
    d = 2 if top < 1 else 1 if top < 10 else 0
    return " to ".join(f"{x:+.{d}f}" for x in xs)


def floor_words(min_difference: float) -> str:
    """The floor (--min-difference, a share) in the words every surface shows it."""
    if min_difference <= 0:
        return "any difference that excludes 0 named (no floor)"
    return f"a difference named only where its whole interval is {100 * min_difference:g} % or more"


def floor_reason(v: PairVerdict) -> str:
    """Why a pair whose interval clears no floor is within noise, in the
    words every surface uses: no difference as large as the floor (the whole
    interval inside +-it), or one too small to name (it excludes 0 but not
    the floor)."""
    floor = f"{100 * v.min_difference:g} %"
    return f"no difference of {floor} or more" if v.within_floor else f"less than the {floor} worth naming"


@dataclass
class PairVerdict:
    """One pair's comparison over the rounds: B against A."""

    a: str
    b: str
    metric: str  # what was compared: "goodput_output_tps" or "capacity"
    diffs: list[float]  # ln(B_r / A_r), one per round measured on both
    confidence: float
    mean: float | None = None  # the mean log ratio
    low: float | None = None  # its interval's ends
    high: float | None = None
    # Why an interval that excludes 0 is still no verdict (paired_verdict():
    # a knee it rests on is uncertain); None: nothing held it back.
    held_back: str | None = None
    # The capacities' comparison beside it (paired_verdict(): mean, low, high
    # of ln(B/A) over the rounds' knees, widened by a ladder step; rounds).
    capacity: dict[str, Any] | None = None
    # The smallest difference worth naming, a share (0.02: the better must
    # carry 2 % more; --min-difference); 0: any that excludes 0.
    min_difference: float = 0.0

    @property
    def rounds(self) -> int:
        return len(self.diffs)

    @property
    def interval_excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    @property
    def clears_floor(self) -> bool:
        """The interval excludes 0 and the difference is one worth naming:
        clears_floor() below says by which rule."""
        return (self.interval_excludes_zero and self.mean is not None and self.low is not None
                and self.high is not None and clears_floor(self.mean, self.low, self.high, self.min_difference))

    @property
    def within_floor(self) -> bool:
        """The whole interval inside +-the floor: no difference that large,
        a positive finding of its own (not merely "not shown")."""
        f = math.log1p(self.min_difference)
        return (self.min_difference > 0 and self.low is not None and self.high is not None
                and -f < self.low and self.high < f)

    @property
    def beyond_noise(self) -> bool:
        """The interval excludes 0, the difference clears the floor
        (clears_floor), and nothing held it back."""
        return self.clears_floor and not self.held_back

    @property
    def better(self) -> str | None:
        """The preset that carries more, when beyond noise."""
        if not self.beyond_noise or self.mean is None:
            return None
        return self.b if self.mean > 0 else self.a

    @property
    def worse(self) -> str | None:
        better = self.better
        return None if better is None else (self.a if better == self.b else self.b)

    def gap_pct(self) -> tuple[float, float, float] | None:
        """(gap, low, high) in % of how much more the better one carries
        (of B over A when within noise)."""
        if self.mean is None or self.low is None or self.high is None:
            return None
        if self.better == self.a:
            return _pct(-self.mean), _pct(-self.high), _pct(-self.low)
        return _pct(self.mean), _pct(self.low), _pct(self.high)

    def text(self) -> str:
        """'B carries 18 % more than A (11-25 %)', or the same pair within
        noise (why: no difference of the floor or more; one that excludes 0
        but is smaller than the floor; held back; or the interval too wide)."""
        what = METRIC_WORDS.get(self.metric, self.metric)
        gap = self.gap_pct()
        if gap is None:
            return f"{self.a} vs {self.b}: not enough rounds measured on both to compare ({self.rounds})"
        g, lo, hi = gap
        if self.beyond_noise:
            return f"{self.better} carries {g:.0f} % more {what} than {self.worse} ({lo:.0f}-{hi:.0f} %)"
        if self.held_back:
            return (f"{self.a} vs {self.b}: within noise / undecided: {self.held_back} ({self.b} {g:+.0f} % {what}, "
                    f"interval {lo:+.0f} to {hi:+.0f} %)")
        if self.within_floor or self.interval_excludes_zero:  # (with a floor of 0 the latter is beyond noise)
            return (f"{self.a} vs {self.b}: within noise: {floor_reason(self)} ({self.b} {pct_span(g)} % {what}, "
                    f"interval {pct_span(lo, hi)} %)")
        return f"{self.a} vs {self.b}: within noise ({self.b} {g:+.0f} % {what}, interval {lo:+.0f} to {hi:+.0f} %)"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        gap = self.gap_pct()
        out.update(rounds=self.rounds, beyond_noise=self.beyond_noise, better=self.better, text=self.text(),
                   gap_pct=None if gap is None else [round(x, 1) for x in gap],
                   min_difference_pct=round(100 * self.min_difference, 3))
        return out


def clears_floor(mean: float, low: float, high: float, min_difference: float) -> bool:
    """Whether an interval (log ratios) that excludes 0 names a difference
    worth naming, `min_difference` a share (0.02 = 2 %).

    The rule: THE WHOLE INTERVAL beyond the floor (low > ln(1 + floor), or
    high < -ln(1 + floor)): a test of "the difference is smaller than the
    floor" at the interval's own level, so that a gap smaller than the floor,
    a bias the pairing leaves included, is called beyond noise at most as
    often as a true 0 was before. The weaker rule (the estimate beyond the
    floor, the interval excluding 0) controls that only at a gap of exactly
    0: a bias of 1.5 % the rounds agree on is called 2 % or more about half
    the time. What the strict rule costs, on the simulated host
    (bench/verdict_calibration.py --runs 100 --seed 1000, 2 % floor, before
    the shorter rungs): an A/A pair called apart 1 of 300 times without it,
    0 with; a true 25 % gap called right 75, 87 and 28 times of 100 at the
    three drifts (76, 88, 37 with the weaker rule, the same as no floor),
    10 % 20, 48 and 1 (30, 57, 1). A preset written as better than BASE
    claims the gain: the strict rule is what makes that claim true at the
    interval's level, and the power it costs is at gaps near the floor or
    under drift too fast for the rounds (+-30 % a minute)."""
    f = math.log1p(min_difference)
    return low > f or high < -f


def compare_pair(a: str, b: str, a_values: Sequence[float | None], b_values: Sequence[float | None], *,
                 metric: str = "goodput_output_tps", confidence: float = DEFAULT_CONFIDENCE,
                 min_difference: float = 0.0) -> PairVerdict:
    """B against A over the rounds, paired round by round (no floor unless
    given: paired_verdict() gives the sweep's and tune's)."""
    diffs = log_ratios(a_values, b_values)
    verdict = PairVerdict(a, b, metric, diffs, confidence, min_difference=min_difference)
    interval = paired_interval(diffs, confidence)
    if interval is not None:
        verdict.mean, verdict.low, verdict.high = interval
    return verdict


def quantised_interval(diffs: Sequence[float], step_log: float, confidence: float = DEFAULT_CONFIDENCE
                       ) -> tuple[float, float, float] | None:
    """paired_interval() of knees known to a ladder step: a knee lies between
    the highest pass and one step above it, so each ratio of two knees may be
    off by up to a step either way whatever the rounds (the same knee reads
    the same load every round): the interval is widened by `step_log` on
    each side. Without it two presets whose knees read 9 and 8 in every round
    would differ "beyond noise" by an interval of zero width."""
    interval = paired_interval(diffs, confidence)
    if interval is None:
        return None
    mean, low, high = interval
    # (rounded: knees 9 and 8 at a step of 1/8 touch 0 exactly, not by a last digit)
    return mean, round(low - step_log, 12), round(high + step_log, 12)


# The share of the reference's move within a round that the linear drift
# correction (paired_sweep.adjust) may leave in a pair's ratio, alike in
# every round: a drift's curvature over the round does not cancel, and with
# three rounds the t-interval cannot see a bias they share. On the drifting
# simulated host (+-30 % over 2 min; bench/verdict_calibration.py) A/A runs
# were called 1-6 % apart "beyond noise" in 3 of 20 with intervals of a few
# points, where the reference moved 20-30 % within each round.
DRIFT_RESIDUAL = 0.15


def paired_verdict(a: str, b: str, a_values: Sequence[float | None], b_values: Sequence[float | None], *,
                   metric: str = "output_tps_at_capacity", confidence: float = DEFAULT_CONFIDENCE,
                   a_knees: Sequence[float | None] = (), b_knees: Sequence[float | None] = (),
                   step: float = 0.0, a_doubts: Sequence[str] = (), b_doubts: Sequence[str] = (),
                   a_lower: Sequence[bool] = (), b_lower: Sequence[bool] = (), drift_floor: float = 0.0,
                   min_difference: float = DEFAULT_MIN_DIFFERENCE) -> PairVerdict:
    """The one verdict of B against A that the paired sweep and tune's
    --confirm give: the rounds' figures at each preset's knee (a_values,
    b_values: tok/s adjusted for drift, None where not measured), paired
    round by round (compare_pair), with the rounds' knees compared beside
    (capacity, quantised_interval at `step`). An interval that excludes 0 is
    held back (held_back says why: "within noise / undecided") when
    - a knee it rests on is uncertain (a_doubts / b_doubts: what contradicts
      its evidence: knee_ladder.knee_doubts);
    - the preset it calls weaker read only a lower bound of its knee in a
      round compared (a_lower / b_lower per round: its figure there may be
      too low; the other way is safe), and without those rounds the
      interval no longer excludes 0 the same way;
    - the capacities differ beyond noise the other way.
    `drift_floor` (a log ratio) widens the tok/s interval on each side: what
    the drift correction may leave in every round alike (DRIFT_RESIDUAL).
    `min_difference` (a share, 0.02 = 2 %): the smallest difference the
    verdict names (clears_floor: the whole interval beyond it); an interval
    inside +-it reads "no difference of 2 % or more". On a near-deterministic
    stand-in three rounds agreed to hundredths of a percent and an A/A pair
    read +0.014 % (+0.004 to +0.025 %) "beyond noise" (tune-confirm-aa.md):
    true of the measurement, worth nothing to an operator."""
    v = compare_pair(a, b, a_values, b_values, metric=metric, confidence=confidence, min_difference=min_difference)
    if drift_floor > 0 and v.low is not None and v.high is not None:
        v.low, v.high = v.low - drift_floor, v.high + drift_floor
    knees = [(x, y) for x, y in zip(a_knees, b_knees, strict=False)]
    cap_diffs = log_ratios([x for x, _ in knees], [y for _, y in knees])
    cap = quantised_interval(cap_diffs, math.log1p(step), confidence) if knees else None
    if cap is not None:
        v.capacity = {"mean": cap[0], "low": cap[1], "high": cap[2], "rounds": len(cap_diffs),
                      "gap_pct": [round(_pct(x), 1) for x in cap], "step": step}
    if not v.clears_floor or v.mean is None:
        return v  # nothing to hold back
    b_better = v.mean > 0
    worse, worse_lower = (a, a_lower) if b_better else (b, b_lower)
    paired_rounds = [i for i, (x, y) in enumerate(zip(a_values, b_values, strict=False))
                     if x is not None and y is not None and x > 0 and y > 0]
    why: list[str] = []
    for name, doubts in ((a, a_doubts), (b, b_doubts)):
        if doubts:
            why.append(f"{name}'s knee uncertain ({doubts[0]}{f'; {len(doubts) - 1} more' if len(doubts) > 1 else ''})")
    low_rounds = [i + 1 for i in paired_rounds if i < len(worse_lower) and worse_lower[i]]
    if low_rounds:  # does the verdict rest on them? Not where it holds without them.
        keep = [None if i + 1 in low_rounds else x for i, x in enumerate(a_values)]
        rest = compare_pair(a, b, keep, b_values, metric=metric, confidence=confidence,
                            min_difference=min_difference)
        if rest.low is not None and rest.high is not None:
            rest.low, rest.high = rest.low - drift_floor, rest.high + drift_floor
        if not (rest.clears_floor and rest.mean is not None and (rest.mean > 0) == b_better):
            why.append(f"{worse}'s knee uncertain (round {', '.join(map(str, low_rounds))} read only a lower bound: "
                       "measured far under its knee while the other was at its own; without "
                       f"{'it' if len(low_rounds) == 1 else 'them'} no verdict)")
    if cap is not None and ((b_better and cap[2] < 0) or (not b_better and cap[1] > 0)):
        why.append("the capacities differ the other way")
    v.held_back = "; ".join(why) or None
    return v


def compare_all(names: Sequence[str], values: Mapping[str, Sequence[float | None]], *,
                metric: str = "goodput_output_tps", confidence: float = DEFAULT_CONFIDENCE) -> list[PairVerdict]:
    """Every pair (in the order given: each later name as B against each earlier as A)."""
    return [compare_pair(a, b, values.get(a, []), values.get(b, []), metric=metric, confidence=confidence)
            for i, a in enumerate(names) for b in names[i + 1:]]


@dataclass
class Ranking:
    """The order the pairs beyond noise give: tiers, best first (a preset is
    in the tier after the lowest tier of any preset that beats it), the pairs
    left unordered (within noise, or too few rounds), and the wins beyond
    noise, (better, worse), that the tiers come from."""

    tiers: list[list[str]]
    ties: list[tuple[str, str]] = field(default_factory=list)
    wins: list[tuple[str, str]] = field(default_factory=list)

    def text(self) -> str:
        """What the wins say and no more. 'C > A = B' when every preset of a
        higher tier beats every one of a lower tier (directly or through
        others) and no wins form a cycle (possible by chance only); otherwise
        the wins themselves, 'A > B; C > D', since tiers would read as wins
        that were never measured (a GPU run's 'seed-A = seed-C > long-doc'
        came from one win, seqs128 over long-doc, and seed-A and seed-C sat in
        the top tier only for never being beaten). Presets in no win are named
        last as not placed."""
        placed = {n for w in self.wins for n in w}
        unplaced = [n for t in self.tiers for n in t if n not in placed]
        tail = f"not placed (no pair beyond noise): {', '.join(unplaced)}" if unplaced else ""
        if not placed:
            return "no pair beyond noise" + (f" ({', '.join(unplaced)})" if unplaced else "")
        beats = win_closure(self.wins)
        tiers = [[n for n in t if n in placed] for t in self.tiers]
        tiers = [t for t in tiers if t]
        cyclic = any((y, x) in beats for x, y in beats)
        whole = not cyclic and all((x, y) in beats for i, t in enumerate(tiers) for u in tiers[i + 1:]
                                   for x in t for y in u)
        if whole:
            head = " > ".join(" = ".join(t) for t in tiers)
        else:  # the wins no others imply (in a cycle every win is implied: all are shown)
            head = "; ".join(f"{x} > {y}" for x, y in self.wins if cyclic
                             or not any((x, z) in beats and (z, y) in beats for z in placed - {x, y}))
        return head + (f"; {tail}" if tail else "")

    def to_dict(self) -> dict[str, Any]:
        return {"tiers": self.tiers, "ties": [list(t) for t in self.ties], "wins": [list(w) for w in self.wins],
                "text": self.text()}


def win_closure(wins: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (x, y) with a chain of wins from x down to y."""
    beats = set(wins)
    while True:
        more = {(x, w) for x, y in beats for v, w in beats if y == v and x != w} - beats
        if not more:
            return beats
        beats |= more


def rank(names: Sequence[str], verdicts: Sequence[PairVerdict]) -> Ranking:
    """The partial order from the verdicts beyond noise (see Ranking). A
    cycle (A over B over C over A: possible only by chance) puts the presets
    in it in one tier."""
    beaten_by: dict[str, set[str]] = {n: set() for n in names}
    ties: list[tuple[str, str]] = []
    wins: list[tuple[str, str]] = []
    for v in verdicts:
        if v.better is not None and v.worse is not None:
            beaten_by[v.worse].add(v.better)
            wins.append((v.better, v.worse))
        else:
            ties.append((v.a, v.b))
    depth: dict[str, int] = {}

    def level(n: str, path: frozenset[str]) -> int:
        if n in depth:
            return depth[n]
        above = [level(m, path | {n}) for m in beaten_by[n] if m not in path]
        depth[n] = 1 + max(above) if above else 0
        return depth[n]

    for n in names:
        level(n, frozenset())
    tiers = [[n for n in names if depth[n] == d] for d in range(max(depth.values(), default=-1) + 1)]
    return Ranking([t for t in tiers if t], ties, wins)


def drift_seen(names: Sequence[str], values: Mapping[str, Sequence[float | None]]) -> dict[str, Any]:
    """How far the host moved the figures in this run, so a reader sees that
    the presets moved together:
    - own_range_pct: each preset's own figure across rounds, max / min - 1 (%);
    - host_index: per round, the presets' figures over their own means
      (geometric), averaged: 1.2 = that round ran 20 % faster than the run's mean;
    - pair_range_pct: each pair's ratio B/A across rounds, max / min - 1 (%):
      what the pairing had to live with. Much smaller than the own ranges:
      the presets moved together."""
    logs = {n: [math.log(v) if v is not None and v > 0 else None for v in values.get(n, [])] for n in names}
    own: dict[str, float | None] = {}
    centred: dict[str, list[float | None]] = {}
    for n, xs in logs.items():
        got = [x for x in xs if x is not None]
        own[n] = round(_pct(max(got) - min(got)), 1) if len(got) >= 2 else None
        mean = statistics.fmean(got) if got else 0.0
        centred[n] = [None if x is None else x - mean for x in xs]
    rounds = max((len(xs) for xs in logs.values()), default=0)
    index: list[float | None] = []
    for r in range(rounds):
        now = [x for xs in centred.values() if r < len(xs) and (x := xs[r]) is not None]
        index.append(round(math.exp(statistics.fmean(now)), 3) if now else None)
    pairs: dict[str, float | None] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            d = log_ratios(values.get(a, []), values.get(b, []))
            pairs[f"{a}/{b}"] = round(_pct(max(d) - min(d)), 1) if len(d) >= 2 else None
    return {"own_range_pct": own, "host_index": index, "pair_range_pct": pairs}
