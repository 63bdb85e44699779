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
- arrivals keep the profile's burstiness: gamma gaps of its CV, at its mean
  rate or at whatever rate the search sets (arrivals.arrival_stream's
  `burstiness` is the gamma shape 1 / CV^2).
Prompt and output lengths are drawn independently: a profile keeps no
joint distribution of the two.
"""

from __future__ import annotations

import random
from typing import Any

from ernie_tui.engine_ctl.load.prompts import BuiltPrompt, PromptBuilder
from ernie_tui.engine_ctl.load.traffic import TrafficProfile

OUTPUTS = ("lengths", "eos")
DEFAULT_OUTPUTS = "lengths"


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


def replay_settings(profile: TrafficProfile, outputs: str = DEFAULT_OUTPUTS) -> dict[str, Any]:
    """The BurstConfig fields a replay sets: the profile itself (recorded
    with the run), how outputs end, the longest max_tokens (for the
    max_model_len check) and the arrivals' burstiness."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUTS)}")
    table = (profile.max_tokens or profile.output_tokens) if outputs == "eos" else profile.output_tokens
    return {"traffic": profile.to_dict(), "traffic_outputs": outputs, "ignore_eos": outputs == "lengths",
            "max_tokens": table.high, "min_output_tokens": None, "arrivals": "poisson",
            "burstiness": profile.arrivals.gamma_shape,
            "min_tokens": profile.prompt_tokens.low, "max_tokens_in": profile.prompt_tokens.high}


def describe(profile: TrafficProfile, outputs: str = DEFAULT_OUTPUTS) -> str:
    """What a run record's workload source says: the traffic by name and digest."""
    how = "output lengths as max_tokens with ignore_eos" if outputs == "lengths" else \
        "max_tokens drawn, stopping at EOS"
    return f"traffic {profile.label()}, {how}"
