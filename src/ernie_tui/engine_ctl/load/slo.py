"""Service-level objectives: parsing, percentile verdicts and attainment.

An objective is ``METRIC_pNN=LIMIT``: METRIC is ``ttft`` (time to first
token), ``itl`` (inter-token latency) or ``e2e`` (request latency); NN is 50,
90, 95 or 99; LIMIT is a number with ``ms`` or ``s``. A set of requests meets
the objective when the NN-th percentile of the metric over them is within the
limit: ttft and e2e take one value per request, itl takes every token gap of
every request.

How sure a verdict is: the percentile of a sample is only an estimate. The
interval for it here is distribution-free (order statistics: the number of
samples below the true percentile is binomial), so it holds whatever the
latency distribution looks like. Each end is a one-sided bound at the given
confidence: "pass" means even the upper bound is within the limit, "fail"
means even the lower bound is past it. Token gaps of one request are not
independent (they share that request's batch), so for itl the interval is
sized by the number of requests, not of gaps: a request with 128 gaps is not
128 independent observations.

A request that failed (error, timeout) never got its tokens in time: it
counts as infinitely slow for ttft and e2e and as missing every objective
for attainment.

Two meanings, one each (as vLLM's bench client and its `--goodput` use them):
- the percentile objectives: TTFT and E2E one value per request, ITL over
  every token gap of every request (vLLM's "ITL" percentiles);
- goodput and attainment, per request, as vLLM's `--goodput` and DistServe:
  a request is good when its TTFT, its TPOT (mean gap after the first token,
  (e2e - ttft) / (tokens - 1)) and its E2E are each within the limit given
  for that metric (the tightest, when several percentiles name one metric;
  the itl limit stands for tpot). Attainment = good requests / requests.

Confidence over a level measured in time windows (evaluate_blocks): latency
of requests running together is correlated (they share a batch), so the
bound comes from batch means: the share of values within the limit, taken
per window, and a Student-t interval over the windows. The order-statistic
bound above, which treats samples as independent, is only a floor.

All pure functions: no clocks, no I/O. Times are seconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, cast

from ernie_tui.engine_ctl.load import stats

METRICS = ("ttft", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)

_OBJECTIVE_RE = re.compile(r"^\s*(ttft|itl|e2e)_p(\d+)\s*(?:=|<=|<)\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*$", re.I)

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
# A capacity level that ran out of time with fewer answered requests than a
# verdict needs (LevelRules.judged_floor): not judged at all, neither pass nor fail.
TOO_FEW = "too few requests"


@dataclass(frozen=True)
class Objective:
    metric: str  # ttft | itl | e2e
    percentile: int  # 50, 90, 95 or 99
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile}"

    def __str__(self) -> str:
        ms = self.limit_s * 1000.0
        limit = f"{ms:g}ms" if ms < 1000 or ms % 1000 else f"{self.limit_s:g}s"
        return f"{self.name}={limit}"


def parse_objective(text: str) -> Objective:
    """'ttft_p99=500ms' -> Objective('ttft', 99, 0.5). ValueError with a
    plain message otherwise."""
    m = _OBJECTIVE_RE.match(text or "")
    if not m:
        raise ValueError(f"an objective looks like ttft_p99=500ms (metric ttft, itl or e2e; percentile "
                         f"{', '.join(map(str, PERCENTILES))}; limit in ms or s), got {text!r}")
    metric, pct, value, unit = m.group(1).lower(), int(m.group(2)), float(m.group(3)), m.group(4).lower()
    if pct not in PERCENTILES:
        raise ValueError(f"percentile p{pct} in {text!r}: use one of "
                         + ", ".join(f"p{p}" for p in PERCENTILES))
    limit = value / 1000.0 if unit == "ms" else value
    if limit <= 0:
        raise ValueError(f"the limit in {text!r} must be more than zero")
    return Objective(metric, pct, limit)


def parse_slo(texts: Sequence[str]) -> list[Objective]:
    """Several objectives; one per metric and percentile (a repeat is an error)."""
    out: list[Objective] = []
    for t in texts:
        o = parse_objective(t)
        if any(x.name == o.name for x in out):
            raise ValueError(f"{o.name} is given twice")
        out.append(o)
    if not out:
        raise ValueError("give at least one objective, e.g. --slo ttft_p99=500ms")
    return out


@dataclass
class RequestOutcome:
    """What one request measured, as the SLO needs it."""

    ok: bool
    ttft_s: float | None = None
    latency_s: float | None = None
    itls: Sequence[float] = ()
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error_kind: str | None = None
    # When it was sent and when it ended, seconds from the level's start
    # (the windows of a steady-state level; None where nobody timed it).
    start_s: float | None = None
    end_s: float | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT); None for one token."""
        if not self.ok or self.latency_s is None or self.ttft_s is None:
            return None
        n = self.completion_tokens if self.completion_tokens is not None else len(self.itls) + 1
        if n <= 1:
            return None
        return max(0.0, self.latency_s - self.ttft_s) / (n - 1)


def itl_gaps(outcomes: Sequence[RequestOutcome]) -> list[float]:
    """Every token gap of every answered request: what an itl percentile is over."""
    return [g for o in outcomes if o.ok for g in o.itls]


def ms(x: float | None) -> float | None:
    """Seconds to ms; None for none, infinite or NaN (nothing to show)."""
    if x is None or math.isinf(x) or math.isnan(x):
        return None
    return x * 1000.0


# -- order statistics ---------------------------------------------------------

def _binom_cdf_table(n: int, q: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, q), computed in log space so
    large n and q near 1 neither underflow nor overflow."""
    if q <= 0.0:
        return [1.0] * (n + 1)
    if q >= 1.0:
        return [0.0] * n + [1.0]
    lq, l1q = math.log(q), math.log1p(-q)
    lgn = math.lgamma(n + 1)
    cdf, acc = [], 0.0
    for k in range(n + 1):
        acc += math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q)
        cdf.append(min(acc, 1.0))
    return cdf


def quantile_rank_bounds(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) of the order statistics that bound the q-quantile:
    P(x_(l) <= Q_q) >= confidence and P(x_(u) >= Q_q) >= confidence. None
    where the sample is too small for that end (e.g. no upper bound for p99
    from fewer than ~300 values at 95 %)."""
    if n <= 0:
        return None, None
    cdf = _binom_cdf_table(n, q)
    # x_(l) <= Q  <=>  at least l samples are <= Q  <=>  B >= l, B ~ Bin(n, q).
    lower = None
    for k in range(n, 0, -1):
        if 1.0 - cdf[k - 1] >= confidence:
            lower = k
            break
    # x_(u) >= Q  <=>  fewer than u samples are below Q  <=>  B <= u - 1.
    upper = None
    for u in range(1, n + 1):
        if cdf[u - 1] >= confidence:
            upper = u
            break
    return lower, upper


def quantile_interval(values: Sequence[float], q: float, confidence: float,
                      n_eff: int | None = None, presorted: bool = False) -> tuple[float, float]:
    """(low, high) bounds for the q-quantile of `values`' distribution; -inf
    or +inf where the sample cannot bound that end. With n_eff (fewer
    independent units than values, e.g. requests behind token gaps) the ranks
    are found for n_eff and mapped onto the values proportionally."""
    xs = values if presorted else sorted(values)
    n = len(xs)
    if n == 0:
        return -math.inf, math.inf
    m = n if n_eff is None else max(1, min(n_eff, n))
    lo_r, hi_r = quantile_rank_bounds(m, q, confidence)
    lo = -math.inf if lo_r is None else float(xs[max(0, math.floor(lo_r * n / m) - 1)])
    hi = math.inf if hi_r is None else float(xs[min(n - 1, math.ceil(hi_r * n / m) - 1)])
    return lo, hi


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Wilson score interval (two-sided) for a proportion; (None, None) if n == 0."""
    if n <= 0:
        return None, None
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# -- evaluation ---------------------------------------------------------------

@dataclass
class ObjectiveResult:
    objective: str  # "ttft_p99=500ms"
    metric: str
    percentile: int
    limit_ms: float
    # The judged percentile: over every request, a failed one counted as
    # infinitely slow (None: no samples, or infinite). LevelResult's
    # ttft_p99_ms etc. are the displayed ones, over answered requests only,
    # as vLLM's bench client reports them.
    value_ms: float | None
    low_ms: float | None  # bounds at the confidence (None: unbounded on that side)
    high_ms: float | None
    samples: int
    verdict: str  # pass | fail | undecided
    how: str  # "bounds" (interval on one side), "precision" (narrow interval), "estimate" (neither),
    #          "batch means" (the share within the limit, bounded over time windows),
    #          "resolution" (bounded within the resolution band: judge_blocks)
    # Over windows (evaluate_blocks): the share of values within the limit and its bounds.
    share_within: float | None = None
    share_low: float | None = None
    share_high: float | None = None
    blocks: int | None = None
    # Decided within the resolution band (judge_blocks): the band's edge, and
    # the bound on the share of values within it that decided.
    band_ms: float | None = None
    band_share_bound: float | None = None


@dataclass
class Evaluation:
    verdict: str  # pass | fail | undecided
    objectives: list[ObjectiveResult] = field(default_factory=list)
    requests: int = 0
    met: int = 0  # requests meeting every objective
    attainment: float | None = None
    attainment_low: float | None = None
    attainment_high: float | None = None
    attainment_target: float | None = None
    attainment_verdict: str | None = None

    @property
    def point_pass(self) -> bool:
        """Every objective's sample percentile within its limit."""
        return bool(self.objectives) and all(
            (o.value_ms is not None and o.value_ms <= o.limit_ms) or o.how == "no gaps" for o in self.objectives)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def metric_values(objective: Objective, outcomes: Sequence[RequestOutcome]) -> tuple[list[float], int]:
    """The values an objective's percentile is taken over, and how many
    independent units they come from."""
    if objective.metric == "itl":
        gaps = itl_gaps(outcomes)
        return gaps, sum(1 for o in outcomes if o.ok and o.itls)
    attr = "ttft_s" if objective.metric == "ttft" else "latency_s"
    vals = []
    for o in outcomes:
        v = getattr(o, attr)
        vals.append(math.inf if not o.ok or v is None else float(v))
    return vals, len(vals)


# Past this many values a sort goes to numpy: a busy level's token gaps
# (100,000+) are judged while the level runs, in a thread beside the event
# loop that timestamps the streams, and numpy sorts them several times
# faster, without holding the GIL that loop needs.
_NUMPY_SORT_FROM = 4096


def _sorted(values: list[float]) -> Sequence[float]:
    """`values` sorted, once, for a percentile and its interval."""
    if len(values) < _NUMPY_SORT_FROM:
        values.sort()
        return values
    import numpy as np  # (numpy costs an import of 0.2 s: only the levels that need it pay it)

    arr: Any = np.sort(np.fromiter(values, dtype=float, count=len(values)))  # indexes and len()s as a list does
    return cast(Sequence[float], arr)


def percentile_fast(values: list[float], p: float) -> float | None:
    """stats.percentile for many values (a level's token gaps), by numpy's
    sort, which lets go of the GIL: the loop that times the streams runs
    meanwhile. The values hold no None or NaN; `values` may be reordered."""
    v = _percentile_of_sorted(_sorted(values), p)
    return None if v is None or math.isinf(v) else v


def _percentile_of_sorted(xs: Sequence[float], p: float) -> float | None:
    """The p-th percentile of values already sorted (metric values hold no
    None or NaN; a failed request's is inf)."""
    if len(xs) == 0:
        return None
    v = stats._percentile_sorted(xs, p)
    return math.inf if v is None or math.isnan(v) else float(v)


def judge(objective: Objective, outcomes: Sequence[RequestOutcome], confidence: float,
          precision: float) -> ObjectiveResult:
    """One objective over a set of requests. Decided when the interval is on
    one side of the limit, or narrower than `precision` x limit (then the
    sample percentile decides: the truth is that close to the limit)."""
    raw, units = metric_values(objective, outcomes)
    values = _sorted(raw)
    q = objective.percentile / 100.0
    value = _percentile_of_sorted(values, objective.percentile)
    lo, hi = quantile_interval(values, q, confidence, n_eff=units if objective.metric == "itl" else None,
                               presorted=True)
    limit = objective.limit_s
    if value is None and objective.metric == "itl" and any(o.ok for o in outcomes):
        # Every answer came in one read (or was one token): no gap was seen, and
        # none can miss the limit (as in attainment). Seen on vLLM CPU at C=2 with
        # 8-token answers; before, the level failed and the search stopped at 1.
        verdict, how = PASS, "no gaps"
    elif value is None:
        verdict, how = UNDECIDED, "estimate"
    elif hi <= limit:
        verdict, how = PASS, "bounds"
    elif lo > limit:
        verdict, how = FAIL, "bounds"
    elif math.isfinite(lo) and math.isfinite(hi) and hi - lo <= precision * limit:
        verdict, how = (PASS if value <= limit else FAIL), "precision"
    else:
        verdict, how = UNDECIDED, "estimate"
    return ObjectiveResult(objective=str(objective), metric=objective.metric, percentile=objective.percentile,
                           limit_ms=limit * 1000.0, value_ms=ms(value) if value is not None else None,
                           low_ms=ms(lo), high_ms=ms(hi), samples=len(values), verdict=verdict, how=how)


def goodput_limits(slo: Sequence[Objective]) -> dict[str, float]:
    """The per-request limits of goodput (vLLM's --goodput ttft:MS tpot:MS
    e2el:MS): one per metric, the tightest where several percentiles name it;
    the itl objective's limit is the tpot limit."""
    out: dict[str, float] = {}
    for o in slo:
        key = {"ttft": "ttft", "itl": "tpot", "e2e": "e2el"}[o.metric]
        out[key] = min(out.get(key, math.inf), o.limit_s)
    return out


def request_meets(outcome: RequestOutcome, slo: Sequence[Objective]) -> bool:
    """One request is good (vLLM's --goodput, DistServe): its TTFT, its TPOT
    and its E2E each within that metric's limit. A failed request is not; a
    one-token answer has no TPOT and cannot miss a tpot limit."""
    if not outcome.ok:
        return False
    for key, limit in goodput_limits(slo).items():
        if key == "ttft":
            v = outcome.ttft_s
        elif key == "e2el":
            v = outcome.latency_s
        else:
            v = outcome.tpot_s
            if v is None:
                continue
        if v is None or v > limit:
            return False
    return True


def evaluate(outcomes: Sequence[RequestOutcome], slo: Sequence[Objective], confidence: float = 0.95,
             precision: float = 0.05) -> Evaluation:
    """Every objective over the requests, and the level's verdict: fail as
    soon as one objective is decided failed, pass once all are decided
    passed, else undecided."""
    results = [judge(o, outcomes, confidence, precision) for o in slo]
    verdicts = {r.verdict for r in results}
    verdict = FAIL if FAIL in verdicts else (PASS if verdicts == {PASS} else UNDECIDED)
    met = sum(1 for o in outcomes if request_meets(o, slo))
    n = len(outcomes)
    lo, hi = wilson_interval(met, n, confidence)
    return Evaluation(verdict=verdict, objectives=results, requests=n, met=met,
                      attainment=(met / n) if n else None, attainment_low=lo, attainment_high=hi)


def parse_slo_text(text: str) -> list[Objective]:
    """Objectives written on one line, separated by spaces or commas
    ('ttft_p99=500ms itl_p99=50ms'), as a form field takes them."""
    parts = [p for p in re.split(r"[\s,]+", text or "") if p]
    if not parts:
        raise ValueError("give at least one objective, e.g. ttft_p99=500ms itl_p99=50ms")
    return parse_slo(parts)


def limit_ms(slo: Sequence[Objective], metric: str, percentile: int) -> float | None:
    """The limit, in ms, of the objective on that metric and percentile (None: the SLO has none)."""
    return next((o.limit_s * 1000.0 for o in slo if o.metric == metric and o.percentile == percentile), None)


def describe(slo: Sequence[Objective]) -> list[str]:
    return [str(o) for o in slo]


# -- batch means over time windows -------------------------------------------------

def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (Cornish-Fisher expansion of the normal one: within
    about 1 % of the exact value from 2 degrees of freedom on)."""
    z = NormalDist().inv_cdf(p)
    if df <= 0:
        return math.inf
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v * v)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


def share_bounds(hits: Sequence[int], counts: Sequence[int], confidence: float
                 ) -> tuple[float | None, float | None, float | None]:
    """(share, low, high) of a proportion measured in blocks: the ratio
    estimator sum(hits) / sum(counts), its one-sided bounds at `confidence`
    from the spread between blocks (batch means, Student-t with blocks - 1
    degrees of freedom). Blocks with no values are left out; with fewer than
    two blocks the bounds are (0, 1)."""
    pairs = [(h, n) for h, n in zip(hits, counts, strict=True) if n > 0]
    total = sum(n for _, n in pairs)
    if not total:
        return None, None, None
    share = sum(h for h, _ in pairs) / total
    b = len(pairs)
    if b < 2:
        return share, 0.0, 1.0
    nbar = total / b
    var = sum((h - share * n) ** 2 for h, n in pairs) / ((b - 1) * b * nbar * nbar)
    half = t_quantile(confidence, b - 1) * math.sqrt(var)
    return share, max(0.0, share - half), min(1.0, share + half)


def _within(values: list[float], limit: float) -> int:
    """How many values are within the limit (numpy for a window's many token gaps)."""
    if len(values) < _NUMPY_SORT_FROM:
        return sum(1 for v in values if v <= limit)
    import numpy as np  # (see _sorted)

    return int(np.count_nonzero(np.fromiter(values, dtype=float, count=len(values)) <= limit))


def _block_values(objective: Objective, block: Sequence[RequestOutcome]) -> list[float]:
    return metric_values(objective, block)[0]


def judge_blocks(objective: Objective, blocks: Sequence[Sequence[RequestOutcome]], confidence: float,
                 resolution: float = 0.0) -> ObjectiveResult:
    """One objective over a level measured in windows. "pNN within the limit"
    is "at least NN % of values within it": that share is bounded by batch
    means over the windows (valid when requests of one window are
    correlated). Pass: the share's lower bound reaches NN % and the sample
    percentile is within the limit (windows in which every value is within
    it have no spread: the level passes once its windows are in, as a level
    far below its limit should). Fail: the share's upper bound is below
    NN %, or even the order-statistic lower bound is past twice the limit.

    `resolution` (a share of the limit): how close to the limit the level's
    percentile is worth resolving. A sample percentile within the limit
    also passes once the bound says the true one is within limit x (1 +
    resolution); one past it also fails once the bound says the true one is
    past limit x (1 - resolution). Why: at a limit the share within it sits
    at NN %, and windows that share batches spread it wider than the gap,
    so the exact test needs many windows, or ends undecided. On an H200 the
    levels nearest the limit ran 37-46 s each and ended undecided with ITL
    p99s of 44.7-57.3 ms (limit 50 ms), while one load read 42 and 51 ms a
    minute apart: the server's own spread, wider than the band."""
    q = objective.percentile / 100.0
    limit = objective.limit_s
    flat = [o for blk in blocks for o in blk]
    base = judge(objective, flat, confidence, 0.0)
    per = [_block_values(objective, blk) for blk in blocks]
    hits = [_within(vals, limit) for vals in per]
    counts = [len(vals) for vals in per]
    share, low, high = share_bounds(hits, counts, confidence)
    if base.how == "no gaps":
        return base
    if share is None:
        verdict, how = UNDECIDED, "estimate"
    elif high is not None and high < q:
        verdict, how = FAIL, "batch means"
    elif base.verdict == FAIL and base.low_ms is not None and base.low_ms > 2 * base.limit_ms:
        verdict, how = FAIL, "bounds"
    elif low is not None and low >= q and base.value_ms is not None and base.value_ms <= base.limit_ms:
        verdict, how = PASS, "batch means"
    elif resolution > 0 and base.value_ms is not None and math.isfinite(base.value_ms):
        verdict, how = _judge_band(base, per, counts, q, limit, confidence, resolution)
    else:
        verdict, how = UNDECIDED, "estimate"
    base.verdict, base.how = verdict, how
    base.share_within, base.share_low, base.share_high = share, low, high
    base.blocks = sum(1 for n in counts if n)
    return base


def _judge_band(base: ObjectiveResult, per: list[list[float]], counts: list[int], q: float, limit: float,
                confidence: float, resolution: float) -> tuple[str, str]:
    """judge_blocks' verdict within the resolution band: the side of the
    limit the sample percentile is on, where the bound on the share of
    values within the band's far edge backs it; else undecided. Records the
    edge and the bound on `base`."""
    if base.value_ms is not None and base.value_ms <= base.limit_ms:
        edge = limit * (1.0 + resolution)
        _share, bound, _high = share_bounds([_within(vals, edge) for vals in per], counts, confidence)
        decided = bound is not None and bound >= q  # surely within limit x (1 + resolution)
        verdict = PASS
    else:
        edge = limit * (1.0 - resolution)
        _share, _low, bound = share_bounds([_within(vals, edge) for vals in per], counts, confidence)
        decided = bound is not None and bound < q  # surely past limit x (1 - resolution)
        verdict = FAIL
    base.band_ms, base.band_share_bound = ms(edge), bound
    return (verdict, "resolution") if decided else (UNDECIDED, "estimate")


def evaluate_blocks(blocks: Sequence[Sequence[RequestOutcome]], slo: Sequence[Objective],
                    confidence: float = 0.95, attainment_target: float = 0.0,
                    resolution: float = 0.0) -> Evaluation:
    """evaluate() for a level measured in windows (see judge_blocks, and its
    `resolution`), with attainment bounded the same way and judged against
    `attainment_target`: the level fails once attainment is surely below
    it, passes only when every objective passes and attainment is surely at
    or above it."""
    results = [judge_blocks(o, blocks, confidence, resolution) for o in slo]
    flat = [o for blk in blocks for o in blk]
    met_per = [sum(1 for o in blk if request_meets(o, slo)) for blk in blocks]
    n_per = [len(blk) for blk in blocks]
    att, lo, hi = share_bounds(met_per, n_per, confidence)
    verdicts = {r.verdict for r in results}
    att_verdict = PASS
    if attainment_target > 0 and att is not None:
        if hi is not None and hi < attainment_target:
            att_verdict = FAIL
        elif lo is not None and lo >= attainment_target:
            att_verdict = PASS
        elif met_per and all(m == n for m, n in zip(met_per, n_per, strict=True)):
            att_verdict = PASS  # every request met the SLO in every window
        else:
            att_verdict = UNDECIDED
    verdicts.add(att_verdict)
    verdict = FAIL if FAIL in verdicts else (PASS if verdicts == {PASS} else UNDECIDED)
    met = sum(met_per)
    n = len(flat)
    return Evaluation(verdict=verdict, objectives=results, requests=n, met=met,
                      attainment=(met / n) if n else None, attainment_low=lo, attainment_high=hi,
                      attainment_target=attainment_target or None, attainment_verdict=att_verdict)
