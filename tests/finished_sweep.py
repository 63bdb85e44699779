"""A finished paired capacity sweep as the sweep screen receives it
(SweepFinished): two presets measured, their searches and three duel rounds
made of the figures of the 2 am walkthrough's kind (issue 59), the verdicts
computed by PairedResult.analyse() itself; and a third preset that preflight
skipped, never measured. The tests feed it as the sweep's worker does."""

from __future__ import annotations

from ernie_tui.engine_ctl.control import PairedResult, SweepRun
from ernie_tui.engine_ctl.control.paired_sweep import DuelLevel, PresetRound, adjust, duel_order

MEASURED = ("cpu-demo", "cpu-demo-b64")
SKIPPED = "seed-A"
ROUNDS = 3
# Each preset's output tok/s at its capacity, per duel round: the second
# carries about 30 % more, and the host drifts a few % between rounds.
TPS = {"cpu-demo": (3550.0, 3610.0, 3480.0), "cpu-demo-b64": (4620.0, 4707.3, 4540.0)}


def _run(name: str, capacity: int, goodput: float) -> SweepRun:
    return SweepRun(name, 0, "ok", key_args="block 32", mode="capacity", capacity_concurrency=capacity,
                    goodput_output_tps=goodput, goodput_rps=goodput / 128, ttft_p99_ms=410.0, itl_p99_ms=38.0,
                    levels=6, ready_s=41.0, vllm_version="0.32.0", platform="cpu")


def finished_sweep(rounds: int = ROUNDS) -> tuple[list[SweepRun], PairedResult]:
    runs = [_run("cpu-demo", 24, 2353.6), _run("cpu-demo-b64", 32, 4707.3),
            SweepRun(SKIPPED, 0, "skipped: insufficient_free_memory",
                     message="preflight: 6.1 GiB free, the preset needs 9.8 GiB", mode="capacity")]
    result = PairedResult(presets=list(MEASURED), co_residency="every server up at once, each on its own port "
                                                                "with its own log (no GPU shared)")
    result.searches = [PresetRound(r.preset, 0, capacity=r.capacity_concurrency,
                                   goodput_output_tps=r.goodput_output_tps, stop="bracketed", levels=6,
                                   duel_load=r.capacity_concurrency) for r in runs[:2]]
    at = 1_764_480_000.0
    for r in range(1, rounds + 1):
        levels = []
        order = duel_order(list(MEASURED), r)
        for k, name in enumerate(order):
            at += 10.0
            tps = TPS[name][(r - 1) % len(TPS[name])] * (1.0 + 0.01 * k)  # the host speeds up within a round
            levels.append(DuelLevel(name, r, 24.0 if name == "cpu-demo" else 32.0, at, 8.0, tps, tps, True,
                                    reference=k in (0, len(order) - 1)))
        adjust(levels)
        result.duels += levels
    result.analyse()
    result.seconds = 434.0
    return runs, result
