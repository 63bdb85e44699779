"""What judging a capacity level costs the loop that times the streams.

A level's monitor (load/capacity.py LevelMonitor) is fed a simulated busy
level (concurrency 160, 150 answers a second, 23-233 token gaps each, as on
the H200 at the seed-A capacity) and judged two ways, side by side in one
run: at every answer (the runner before 2026-12-01) and at a 0.1 s tick (the
runner now; it also runs each judgement in a worker thread, which this pure
script does not). Prints the judgements' count, total and largest cost:
every ms a judgement holds the event loop is a ms added to the next token gap
of every stream in flight.

    PYTHONPATH=src .venv/bin/python bench/judge_cost.py [--answers 1400] [--rounds 3] [--live 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from ernie_tui.engine_ctl.load import capacity as C
from ernie_tui.engine_ctl.load import slo as S


def one_level(answers: int, tick_s: float | None, seed: int) -> dict[str, float]:
    slo = S.parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    mon = C.LevelMonitor(160, slo, C.LevelRules(max_requests=1200))
    rng = random.Random(seed)
    for i in range(answers):
        mon.started(i / 150.0)
    costs: list[float] = []
    next_tick = 0.0
    for i in range(answers):
        s = i / 150.0
        itls = [rng.uniform(0.01, 0.03) for _ in range(rng.randint(23, 233))]
        mon.add(S.RequestOutcome(ok=True, ttft_s=0.3, latency_s=0.3 + sum(itls), itls=itls,
                                 completion_tokens=len(itls) + 1, prompt_tokens=100, start_s=s, end_s=s + 1.0))
        now = s + 1.0
        if tick_s is not None and now < next_tick:
            continue
        next_tick = now + (tick_s or 0.0)
        t0 = time.perf_counter()
        r = mon.stop_reason(now)
        costs.append(time.perf_counter() - t0)
        if r:
            break
    return {"judgements": len(costs), "total_ms": sum(costs) * 1000, "max_ms": max(costs) * 1000,
            "p90_ms": sorted(costs)[int(0.9 * len(costs))] * 1000, "answers": i + 1}


async def live_level(seconds: float, in_thread: bool | None, seed: int) -> dict[str, float]:
    """The same level fed in real time (150 answers a second) on an event
    loop, judged at a 0.1 s tick on the loop or in a worker thread, with a
    10 ms timer measuring how late the loop gets to it (what a stream's next
    token waits)."""
    import asyncio

    slo = S.parse_slo(["ttft_p99=1000ms", "itl_p99=50ms"])
    mon = C.LevelMonitor(160, slo, C.LevelRules(max_requests=100_000, time_cap_s=seconds + 60))
    rng = random.Random(seed)
    lags: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.010)
            lags.append(time.perf_counter() - t - 0.010)

    async def feed() -> None:
        t0 = time.perf_counter()
        i = 0
        while (now := time.perf_counter() - t0) < seconds:
            while i < now * 150:
                s = i / 150.0
                itls = [rng.uniform(0.01, 0.03) for _ in range(rng.randint(23, 233))]
                sent = max(0.0, s - 1.0)  # each answer took a second
                mon.started(sent)
                mon.add(S.RequestOutcome(ok=True, ttft_s=0.3, latency_s=0.3 + sum(itls), itls=itls,
                                         completion_tokens=len(itls) + 1, prompt_tokens=100, start_s=sent,
                                         end_s=s + 0.001))
                i += 1
            await asyncio.sleep(0.005)

    async def judge() -> None:
        t0 = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter() - t0
            if in_thread is None:  # the baseline: feeding alone (building the answers costs the loop too)
                pass
            elif in_thread:
                await asyncio.to_thread(mon.progress, now)  # (the monitor's own fields only: no feeding races here
                await asyncio.to_thread(mon.stop_reason, now)  # that the runner's hold-and-feed would not avoid)
            else:
                mon.progress(now)
                mon.stop_reason(now)
            await asyncio.sleep(0.1)

    w = asyncio.ensure_future(watch())
    j = asyncio.ensure_future(judge())
    await feed()
    stop.set()
    await asyncio.gather(w, j)
    lags.sort()
    return {"lag_p99_ms": lags[int(0.99 * len(lags))] * 1000, "lag_max_ms": lags[-1] * 1000,
            "windows": mon.windows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=1400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--live", type=float, default=8.0, metavar="S",
                   help="also feed a level in real time for S seconds, judged on the loop and in a thread (0: off)")
    args = p.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"every answer": [], "0.1 s tick": []}
    for k in range(args.rounds):  # interleaved: the box's noise falls on both
        rows["every answer"].append(one_level(args.answers, None, k))
        rows["0.1 s tick"].append(one_level(args.answers, 0.1, k))
    print(f"{'judged at':14} {'judgements':>10} {'total ms':>9} {'p90 ms':>7} {'max ms':>7}  (median of {args.rounds})")
    for name, runs in rows.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)
        print(f"{name:14} {med('judgements'):>10.0f} {med('total_ms'):>9.0f} {med('p90_ms'):>7.1f} "
              f"{med('max_ms'):>7.1f}")
    if args.live:
        import asyncio

        live: dict[str, list[dict[str, float]]] = {"not judged": [], "on the loop": [], "in a thread": []}
        for k in range(args.rounds):
            live["not judged"].append(asyncio.run(live_level(args.live, None, k)))
            live["on the loop"].append(asyncio.run(live_level(args.live, False, k)))
            live["in a thread"].append(asyncio.run(live_level(args.live, True, k)))
        print(f"\nlive, {args.live:g} s at 150 answers/s, judged every 0.1 s: the loop's lateness "
              f"(a 10 ms timer), median of {args.rounds}")
        print(f"{'judged':14} {'lag p99 ms':>10} {'lag max ms':>10}")
        for name, runs in live.items():
            print(f"{name:14} {statistics.median(r['lag_p99_ms'] for r in runs):>10.1f} "
                  f"{statistics.median(r['lag_max_ms'] for r in runs):>10.1f}")


if __name__ == "__main__":
    main()
