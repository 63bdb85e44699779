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
it before the schedule). Here a `RandomState(seed)` of our own gives the same
stream without touching numpy's global one. So a burst and a bench client
run given one seed send one arrival sequence, and an agreement run between
them at a rate compares the clients, not two draws of a Poisson process.

The prompt and output lengths follow the same idea (`drawn_lengths`): vLLM's
random dataset draws them with `np.random.default_rng(seed).integers`, all
prompt lengths first, then all output lengths; the same seed gives ours.
"""

from __future__ import annotations

import math
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
    if kind == "constant":
        i = 0
        while True:
            i += 1
            yield i / rate  # no float drift over a long level
    import numpy as np  # lazy: 0.2 s of import that only open-loop loads pay

    # numpy's legacy seeding takes 32 bits; our seeds may be wider.
    draw = np.random.RandomState(seed & 0xFFFFFFFF)
    theta = 1.0 / (rate * burstiness)
    t = 0.0
    while True:
        # Drawn in chunks: the legacy sampler takes the stream element by
        # element (and keeps its spare normal across calls), so chunks of any
        # size give the numbers one long draw of the bench client gives.
        for gap in draw.gamma(burstiness, theta, size=_CHUNK).tolist():
            t += gap
            yield t


_CHUNK = 256  # gaps drawn at a time by an endless stream


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


def drawn_lengths(n: int, prompt: tuple[int, int], output: tuple[int, int],
                  seed: int = 0) -> tuple[list[int], list[int]]:
    """n prompt lengths uniform in prompt=(low, high) and n output lengths
    (max_tokens) uniform in output=(low, high), bounds inclusive, drawn as
    vLLM's random dataset draws them for `vllm bench serve --seed S`:
    `np.random.default_rng(S).integers`, all prompt lengths, then all
    output lengths (its get_sampling_params). A range of one value draws
    nothing, as numpy's own. So a burst with --seed S asks for the bench
    client's lengths, request by request, when the ranges are its ranges
    (vllm_bench_ranges)."""
    for name, (low, high) in (("prompt", prompt), ("output", output)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} lengths need 1 <= low ({low}) <= high ({high})")
    import numpy as np  # lazy, see arrival_stream

    rng = np.random.default_rng(seed)
    ins = rng.integers(prompt[0], prompt[1] + 1, size=n).tolist()
    outs = rng.integers(output[0], output[1] + 1, size=n).tolist()
    return ins, outs


def vllm_bench_ranges(input_len: int, output_len: int, range_ratio: float,
                      num_special_tokens: int = 0) -> tuple[int, int, int, int]:
    """The prompt and output length ranges vLLM's bench client draws with
    `--dataset-name random --random-input-len I --random-output-len O
    --random-range-ratio R`: (input_low, input_high, output_low, output_high),
    each uniform and inclusive. The ratio applies to the output too: O=128
    with R=0.8182 asks for 23..233 tokens, not 128 each."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("range_ratio must be in [0, 1)")
    real_in = max(0, input_len - num_special_tokens)
    in_lo = math.floor(real_in * (1 - range_ratio))
    in_hi = math.ceil(real_in * (1 + range_ratio))
    out_lo = max(1, math.floor(output_len * (1 - range_ratio)))
    out_hi = max(1, math.ceil(output_len * (1 + range_ratio)))
    return in_lo + num_special_tokens, in_hi + num_special_tokens, out_lo, out_hi
