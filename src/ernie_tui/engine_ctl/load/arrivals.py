"""When the requests of an open-loop load go out: a seeded arrival schedule.

An open loop sends each request at its scheduled time whether or not the
earlier ones have finished, as production traffic does and as vLLM's bench
client does with `--request-rate R` (its default burstiness 1: a Poisson
process, exponential gaps of mean 1/R). A closed loop (a fixed concurrency)
waits for a slot instead, and so hides the queue a server builds when it
cannot keep up.

The schedule is a list of offsets in seconds from the start, made once, up
front, from a seed: the same seed gives the same schedule, so two presets
(or two rounds) see the same arrivals. Like vLLM's bench client, the gaps
are rescaled so the last request goes out at exactly n / rate: the figures
of a short run then do not depend on the seed's luck in its total length
(vLLM: "would have 1-2% gap from target_total_delay_s"). The capacity search
can reuse `arrival_offsets` for its rate levels.

The gaps are drawn as vLLM's bench client draws them, number for number:
numpy's legacy `np.random.gamma` after `np.random.seed(seed)` (the client
seeds numpy's global generator with its `--seed` and draws nothing else from
it before the schedule). So a burst and a bench client run given one seed
send one arrival sequence, and an agreement run between them at a rate
compares the clients, not two draws of a Poisson process. Pure Python: both
are a Mersenne Twister with the same doubles; only the seeding (numpy's
init_genrand) and the gamma sampler (numpy's legacy one) are written here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from ernie_tui.engine_ctl.load import stats

ARRIVALS = ("poisson", "constant")
DEFAULT_ARRIVALS = "poisson"  # as vLLM's bench client (burstiness 1)


def _check(rate: float, kind: str, burstiness: float) -> None:
    if not rate > 0:
        raise ValueError(f"the rate must be > 0 requests/s, got {rate}")
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrivals {kind!r}; choose one of {', '.join(ARRIVALS)}")
    if not burstiness > 0:
        raise ValueError("burstiness must be > 0")


def arrival_stream(rate: float, kind: str = "poisson", *, seed: int = 0,
                   burstiness: float = 1.0) -> Iterator[float]:
    """Send times (seconds from the start, non-decreasing), endless, of an
    open loop at `rate` requests per second: for a load whose length is not
    known in advance (a capacity level runs until it is decided).

    kind "poisson": gaps drawn from a gamma distribution of shape
    `burstiness` and mean 1/rate (burstiness 1: exponential, a Poisson
    process; below 1 burstier, above 1 more even), as vLLM's bench client
    draws them; "constant": every gap 1/rate. The first request goes out
    after one gap, as in vLLM's client (whose first sleep is the first gap).
    """
    _check(rate, kind, burstiness)
    draw = LegacyGamma(seed)
    theta = 1.0 / (rate * burstiness)
    t = 0.0
    i = 0
    while True:
        i += 1
        if kind == "constant":
            t = i / rate  # no float drift over a long level
        else:
            t += draw.gamma(burstiness, theta)
        yield t


class LegacyGamma:
    """numpy.random.RandomState(seed).gamma(shape, scale), one value a call,
    the same numbers (see the module's docstring for why). The seed is taken
    modulo 2**32, as numpy's legacy seeding takes 32 bits."""

    def __init__(self, seed: int) -> None:
        # numpy's mt19937_seed (Knuth's init_genrand), as Python's random.setstate takes a state.
        key = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            key.append((1812433253 * (key[-1] ^ (key[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._rng = random.Random()
        self._rng.setstate((3, (*key, 624), None))  # 624: regenerate before the first number
        self._gauss: float | None = None  # the polar method's second value, kept as numpy keeps it

    def _double(self) -> float:
        return self._rng.random()  # both: (a >> 5, b >> 6) of two 32-bit outputs, 53 bits

    def _exponential(self) -> float:
        return -math.log(1.0 - self._double())

    def _normal(self) -> float:
        if self._gauss is not None:
            g, self._gauss = self._gauss, None
            return g
        while True:
            x1 = 2.0 * self._double() - 1.0
            x2 = 2.0 * self._double() - 1.0
            r2 = x1 * x1 + x2 * x2
            if 0.0 < r2 < 1.0:
                break
        f = math.sqrt(-2.0 * math.log(r2) / r2)
        self._gauss = f * x1
        return f * x2

    def standard_gamma(self, shape: float) -> float:
        if shape == 1.0:
            return self._exponential()
        if shape < 1.0:  # Johnk-type rejection, as numpy's legacy sampler
            while True:
                u = self._double()
                v = self._exponential()
                if u <= 1.0 - shape:
                    x = u ** (1.0 / shape)
                    if x <= v:
                        return x
                else:
                    y = -math.log((1.0 - u) / shape)
                    x = (1.0 - shape + shape * y) ** (1.0 / shape)
                    if x <= v + y:
                        return x
        b = shape - 1.0 / 3.0  # Marsaglia and Tsang
        c = 1.0 / math.sqrt(9.0 * b)
        while True:
            while True:
                x = self._normal()
                v = 1.0 + c * x
                if v > 0.0:
                    break
            v = v * v * v
            u = self._double()
            if u < 1.0 - 0.0331 * (x * x) * (x * x):
                return b * v
            if math.log(u) < 0.5 * x * x + b * (1.0 - v + math.log(v)):
                return b * v

    def gamma(self, shape: float, scale: float) -> float:
        return scale * self.standard_gamma(shape)


def arrival_offsets(n: int, rate: float, kind: str = "poisson", *, seed: int = 0,
                    burstiness: float = 1.0, normalize: bool = True) -> list[float]:
    """The first n send times of arrival_stream, for a burst of n requests.
    normalize: rescale so the last offset is n / rate exactly (as vLLM's
    bench client does), so a short burst lasts what its rate says."""
    if n < 0:
        raise ValueError("n must be >= 0")
    _check(rate, kind, burstiness)
    if n == 0:
        return []
    out = list(islice(arrival_stream(rate, kind, seed=seed, burstiness=burstiness), n))
    if normalize and kind != "constant" and out[-1] > 0:
        k = (n / rate) / out[-1]
        out = [x * k for x in out]
    return out


@dataclass(frozen=True)
class SendLag:
    """How late the sends went out against their schedule."""

    count: int  # sends measured
    late: int  # sends more than `threshold_s` after their scheduled time
    threshold_s: float
    mean_s: float | None
    p50_s: float | None
    p99_s: float | None
    max_s: float | None

    def to_dict(self) -> dict:
        return {"count": self.count, "late": self.late, "threshold_s": self.threshold_s, "mean_s": self.mean_s,
                "p50_s": self.p50_s, "p99_s": self.p99_s, "max_s": self.max_s}


def send_lag(scheduled: list[float], actual: list[float | None], threshold_s: float = 0.010) -> SendLag:
    """Compare the actual send offsets with the schedule (same origin).
    A request never sent (None) is left out of the lag figures."""
    lags = [max(0.0, a - s) for s, a in zip(scheduled, actual, strict=True) if a is not None]
    return SendLag(count=len(lags), late=sum(1 for x in lags if x > threshold_s), threshold_s=threshold_s,
                   mean_s=stats.mean(lags), p50_s=stats.percentile(lags, 50), p99_s=stats.percentile(lags, 99),
                   max_s=max(lags) if lags else None)


def output_lengths(n: int, low: int, high: int, seed: int = 0) -> list[int]:
    """n output lengths (max_tokens) uniform in [low, high], from a seed."""
    if not 1 <= low <= high:
        raise ValueError(f"output lengths need 1 <= low ({low}) <= high ({high})")
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def vllm_bench_ranges(input_len: int, output_len: int, range_ratio: float,
                      num_special_tokens: int = 0) -> tuple[int, int, int, int]:
    """The prompt and output length ranges vLLM's bench client draws with
    `--dataset-name random --random-input-len I --random-output-len O
    --random-range-ratio R`: (input_low, input_high, output_low, output_high),
    each uniform and inclusive. The ratio applies to the output too: O=128
    with R=0.8182 asks for 23..233 tokens, not 128 each."""
    import math

    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("range_ratio must be in [0, 1)")
    real_in = max(0, input_len - num_special_tokens)
    in_lo = math.floor(real_in * (1 - range_ratio))
    in_hi = math.ceil(real_in * (1 + range_ratio))
    out_lo = max(1, math.floor(output_len * (1 - range_ratio)))
    out_hi = max(1, math.ceil(output_len * (1 + range_ratio)))
    return in_lo + num_special_tokens, in_hi + num_special_tokens, out_lo, out_hi
