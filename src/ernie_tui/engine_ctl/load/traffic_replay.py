"""Replay a traffic profile: requests drawn from its shape, seeded.

What a burst or a capacity search sends with --traffic PROFILE:
- each request's prompt length is drawn from the profile's prompt-length
  table (the inverse of its distribution at a seeded uniform draw), so a
  seed gives the same lengths and many draws keep its quantiles;
- how outputs end, two ways (OUTPUTS):
  "lengths" (the default): each request's output length is drawn from the
  profile's output-length table and asked for as max_tokens with
  ignore_eos, so the server generates exactly that many tokens. This keeps
  the output lengths whatever the model: a random-weight model's EOS
  cannot be steered, and a real one's answers to built prompts are not the
  operator's answers;
  "eos": max_tokens drawn from the profile's max_tokens table and sent
  without ignore_eos, so a real model stops where it stops (the profile's
  eos_share is then what its own answers should show);
- the shared prefix: the profile's share of the requests start with one
  common prefix of its length (its words fixed by the profile, so the
  prefix cache sees one system prompt across levels and runs), taken among
  the prompts longer than it (prefix_flags);
- arrivals (ARRIVAL_MODES): "curve" (the default, where the profile carries
  a rate per window): its rate window by window, the whole curve scaled so
  its mean is the rate asked for ("how much more of this traffic fits"),
  with gamma gaps inside each window (RateCurve); "mean", or a profile of
  one window: gamma gaps of its CV at its mean rate or at whatever rate the
  search sets (arrivals.arrival_stream's `burstiness` is the gamma shape
  1 / CV^2).
Prompt and output lengths are drawn independently: a profile keeps no
joint distribution of the two.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ernie_tui.engine_ctl.load.arrivals import arrival_stream
from ernie_tui.engine_ctl.load.prompts import BuiltPrompt, PromptBuilder
from ernie_tui.engine_ctl.load.traffic import TrafficProfile

OUTPUTS = ("lengths", "eos")
DEFAULT_OUTPUTS = "lengths"
ARRIVAL_MODES = ("curve", "mean")
DEFAULT_ARRIVAL_MODE = "curve"
# The least gap CV inside a window: a curve that explains all of a profile's
# burstiness still does not send like a metronome.
MIN_WINDOW_CV = 0.2


def draw_lengths(profile: TrafficProfile, n: int, seed: int = 0,
                 outputs: str = DEFAULT_OUTPUTS) -> tuple[list[int], list[int]]:
    """n prompt lengths and n max_tokens, from `seed`: all prompt draws, then
    all output draws, then (prefix_flags) the prefix draws, each from its own
    stream so that one does not shift another."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUTS)}")
    rng_in = random.Random(f"traffic-prompt-{seed}")
    rng_out = random.Random(f"traffic-output-{seed}")
    ins = [profile.prompt_tokens.draw(u) for u in _stratified(rng_in, n)]
    table = (profile.max_tokens or profile.output_tokens) if outputs == "eos" else profile.output_tokens
    outs = [table.draw(u) for u in _stratified(rng_out, n)]
    return ins, outs


def _stratified(rng: random.Random, n: int) -> list[float]:
    """n uniforms, one in each n-th of [0, 1), in a seeded random order: a
    batch of n then holds the profile's quantiles as closely as n allows
    (60 plain draws put a p10 tens of percent off), and its order is still
    random."""
    slots = list(range(n))
    rng.shuffle(slots)
    return [(k + rng.random()) / n for k in slots]


def prefix_flags(profile: TrafficProfile, lengths: list[int], seed: int = 0) -> list[bool]:
    """Which requests open with the shared prefix: the profile's share of
    them, taken among the prompts longer than the prefix (a system prompt
    sits in front of a question, so a prompt that carries it is longer than
    it); only where those are too few do shorter ones carry as much of it
    as fits. Seeded."""
    p = profile.prefix
    if p.tokens <= 0 or p.share <= 0:
        return [False] * len(lengths)
    rng = random.Random(f"traffic-prefix-{seed}")
    longer = 1.0 - profile.prompt_tokens.cdf(p.tokens + 1)
    q_long = min(1.0, p.share / longer) if longer > 0 else 0.0
    q_short = max(0.0, (p.share - longer) / (1.0 - longer)) if longer < 1 else 0.0
    return [rng.random() < (q_long if n > p.tokens + 1 else q_short) for n in lengths]


def prefix_seed(profile: TrafficProfile) -> int:
    """The shared prefix's words: fixed by the profile's content."""
    return int(profile.digest[:8], 16)


def build_prompts(profile: TrafficProfile, lengths: list[int], seed: int, word_seed: int,
                  tokenizer: Any) -> list[BuiltPrompt]:
    """Prompts of the drawn lengths; the flagged ones open with the shared
    prefix. Each is counted by re-encoding its text, as PromptBuilder
    counts (decode and encode are not always inverse)."""
    flags = prefix_flags(profile, lengths, seed)
    maker = _Maker(tokenizer, word_seed)
    head: list[int] = []
    if any(flags):
        head = random.Random(prefix_seed(profile)).choices(maker.pool, k=profile.prefix.tokens)
    return [maker.build(n, head if f else []) for n, f in zip(lengths, flags, strict=True)]


class _Maker:
    """PromptBuilder's trim-or-top-up loop, with a fixed head of ids that
    is kept while the tail is fitted."""

    def __init__(self, tokenizer: Any, word_seed: int) -> None:
        self.tok = tokenizer
        self._b = PromptBuilder(tokenizer, seed=word_seed)
        self.rng = self._b.rng
        self.pool = self._b.pool
        self.overhead = self._b.overhead

    def build(self, n: int, head: list[int], max_rounds: int = 12) -> BuiltPrompt:
        if not head:
            return self._b.build(n)
        want = max(1, n - self.overhead)
        keep = head[:max(0, want - 1)]  # at least one token of its own, so prompts differ
        ids = keep + [self.rng.choice(self.pool) for _ in range(want - len(keep))]
        best: BuiltPrompt | None = None
        for _ in range(max_rounds):
            text = self.tok.decode(ids)
            count = len(self.tok.encode(text))
            cand = BuiltPrompt(text, count, n)
            if best is None or abs(count - n) < abs(best.tokens - n):
                best = cand
            if count == n:
                return cand
            if count > n:
                ids = ids[: max(len(keep) + 1, len(ids) - (count - n))]
            else:
                ids = ids + [self.rng.choice(self.pool) for _ in range(n - count)]
        assert best is not None
        return best


def replay_settings(profile: TrafficProfile, outputs: str = DEFAULT_OUTPUTS,
                    arrivals: str = DEFAULT_ARRIVAL_MODE) -> dict[str, Any]:
    """The BurstConfig fields a replay sets: the profile itself (recorded
    with the run), how outputs end, the longest max_tokens (for the
    max_model_len check), the arrivals' burstiness and how they are
    replayed (a rate curve or a mean rate)."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUTS)}")
    if arrivals not in ARRIVAL_MODES:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_MODES)}")
    table = (profile.max_tokens or profile.output_tokens) if outputs == "eos" else profile.output_tokens
    return {"traffic": profile.to_dict(), "traffic_outputs": outputs, "ignore_eos": outputs == "lengths",
            "max_tokens": table.high, "min_output_tokens": None, "arrivals": "poisson",
            "burstiness": profile.arrivals.gamma_shape, "traffic_arrivals": arrivals,
            "min_tokens": profile.prompt_tokens.low, "max_tokens_in": profile.prompt_tokens.high}


def describe(profile: TrafficProfile, outputs: str = DEFAULT_OUTPUTS,
             arrivals: str = DEFAULT_ARRIVAL_MODE) -> str:
    """What a run record's workload source says: the traffic by name and
    digest, how its outputs end and (for an open loop) how it arrives."""
    how = "output lengths as max_tokens with ignore_eos" if outputs == "lengths" else \
        "max_tokens drawn, stopping at EOS"
    curve = curve_of(profile, arrivals)
    when = f"open-loop arrivals along its rate curve ({len(curve.rates)} windows of {curve.window_s:g} s)" \
        if curve is not None else "open-loop arrivals at a mean rate"
    return f"traffic {profile.label()}, {how}, {when}"


# -- arrivals: the rate curve ---------------------------------------------------

@dataclass(frozen=True)
class RateCurve:
    """A profile's rate over time: `rates` (req/s) in windows of `window_s`,
    and the gamma shape of the gaps inside a window (`shape`, 1 / CV^2)."""

    window_s: float
    rates: tuple[float, ...]
    shape: float

    @property
    def mean(self) -> float:
        return math.fsum(self.rates) / len(self.rates)


def curve_of(profile: TrafficProfile, mode: str = DEFAULT_ARRIVAL_MODE) -> RateCurve | None:
    """The profile's rate curve, or None where arrivals go at a mean rate
    (mode "mean", or a profile without two windows of rates: the built-in
    shapes, older captures of one window).

    The profile's gap CV was measured over the whole capture, so it already
    holds the swings of rate between windows. Gaps of that CV inside every
    window, on top of the curve, would send a burstier load than the source.
    So the gaps inside a window get the CV c that, mixed over the curve's
    windows, gives the profile's CV back: gaps from a window of rate r have
    mean 1/r and second moment (1 + c^2)/r^2, and weighting each window by
    its r gives 1 + CV^2 = (1 + c^2) * sum(1/r) * sum(r) / K^2 over the K
    windows that had arrivals (an empty window has no gaps of its own). At
    least MIN_WINDOW_CV."""
    if mode not in ARRIVAL_MODES:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_MODES)}")
    a = profile.arrivals
    rates = [max(0.0, float(r)) for r in a.rate_series]
    if mode == "mean" or not a.window_s or a.window_s <= 0 or len(rates) < 2 or not any(rates):
        return None
    busy = [r for r in rates if r > 0]
    spread = math.fsum(busy) * math.fsum(1 / r for r in busy) / len(busy) ** 2  # >= 1; 1 when all equal
    c2 = (1.0 + a.cv ** 2) / spread - 1.0
    cv = max(MIN_WINDOW_CV, math.sqrt(c2) if c2 > 0 else 0.0)
    return RateCurve(window_s=float(a.window_s), rates=tuple(rates), shape=1.0 / cv ** 2)


def _inverse(curve: RateCurve, rate: float) -> Any:
    """The map from a unit-rate process's times to the curve's: the
    inverse of the expected arrivals by time t, the curve scaled to a mean
    of `rate` and repeated past its end."""
    if not rate > 0:
        raise ValueError(f"the rate must be > 0 requests/s, got {rate}")
    scale = rate / curve.mean
    per = [scale * r * curve.window_s for r in curve.rates]  # expected arrivals per window
    cum = [0.0]
    for x in per:
        cum.append(cum[-1] + x)
    cycle, span = cum[-1], curve.window_s * len(per)

    def at(u: float) -> float:
        laps, rest = divmod(u, cycle)
        # The first window whose end reaches `rest` (an empty window's end is
        # its start: it is stepped over).
        k = min(len(per) - 1, max(0, bisect.bisect_left(cum, rest) - 1))
        while per[k] <= 0 and k < len(per) - 1:
            k += 1
        return laps * span + k * curve.window_s + (rest - cum[k]) / (scale * curve.rates[k])

    return at


def curve_offsets(curve: RateCurve, n: int, rate: float, *, seed: int = 0) -> list[float]:
    """n send times along the curve at a mean of `rate`: a unit-rate gamma
    process of the curve's shape (seeded, rescaled so its n-th arrival is
    at n exactly, as arrival_offsets does) mapped through the curve. So the
    n requests take the time the curve gives n arrivals at that rate."""
    if n <= 0:
        return []
    units = list(islice(arrival_stream(1.0, "poisson", seed=seed, burstiness=curve.shape), n))
    k = n / units[-1] if units[-1] > 0 else 1.0
    at = _inverse(curve, rate)
    return [at(u * k) for u in units]


def curve_stream(curve: RateCurve, rate: float, *, seed: int = 0) -> Iterator[float]:
    """Send times along the curve, endless (a capacity level): the curve
    from its start, repeated past its end."""
    at = _inverse(curve, rate)
    for u in arrival_stream(1.0, "poisson", seed=seed, burstiness=curve.shape):
        yield at(u)
