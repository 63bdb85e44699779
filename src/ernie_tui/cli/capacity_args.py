"""Options of the capacity search, shared by `probe --capacity` and `sweep --capacity`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ernie_tui.cli.errors import CliError
from ernie_tui.engine_ctl.load import (
    ARRIVALS,
    DEFAULT_ARRIVALS,
    DEFAULT_ATTAINMENT,
    DEFAULT_CONFIDENCE,
    DEFAULT_CONFIRM_WAVES,
    DEFAULT_LEVEL_TIME_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RATE,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_MIN_WINDOWS,
    DEFAULT_RESOLUTION,
    DEFAULT_SLO,
    DEFAULT_STABILITY,
    DEFAULT_START,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    RequestSettings,
)

# `--rate` given without a value: search rates (with --capacity). A burst's --rate R is > 0.
RATE_SEARCH = 0.0


# The group's description in --help: how the search goes, from the first level to the confirmation.
_SEARCH_HELP = (
    "Concurrency (or, with --rate, the request rate) doubles from its start until a level misses the SLO, "
    "then bisects between the highest pass and the lowest fail until they are within --tolerance. Each "
    "level is measured in its steady state: a warm-up, not counted, until every request sent before the "
    "first answer came back has ended; then windows of time (each as long as the warm-up, at least 1 s), "
    "every request counted in the window it was sent in, to its end. A verdict needs --min-windows "
    "windows whose median latencies agree within --stability, and confidence from batch means over the "
    "windows (requests of one window share its batches, so they are not independent); a grossly "
    "failing level stops at once; a percentile near its limit is decided to --resolution. A level "
    "still open at --max-requests or --level-time goes by its "
    "point estimates and is marked undecided, and passes only if its last --min-windows windows' point "
    "estimates meet the SLO too, or miss it by no more than --stability beyond the level's pooled figure "
    "(a level that drifted is judged where it ended; one at a limit is not failed by its end's sampling). "
    "The SLO, as vLLM's bench client reports it: ttft and e2e percentiles over requests (a failed request "
    "counts as infinitely slow), itl percentiles over every token gap of every request. A level passes "
    "when every objective holds and its attainment - the share of good requests, as vLLM's --goodput "
    "and DistServe count them (TTFT <= the ttft limit, TPOT = mean gap after the first token <= the itl "
    "limit, E2E <= the e2e limit) - is at least --attainment; the capacity is never a level below it. "
    "When the bracket closes, its lowest fail is measured once more (unless it was already measured "
    "twice; not with --confirm-waves 0); the later measurement decides. "
    "The capacity found is measured once more, for --confirm-waves turnovers of its requests in flight "
    "(8 x concurrency requests: vLLM's bench client's 8 waves), and that longer run's figures are the "
    "ones reported; if it fails, the next lower pass is confirmed instead (three confirmations at most: "
    "after three failures the capacity is reported as not confirmed, with a warning). A failing level in which "
    "this client's own event loop stood still for 0.5 s or more is measured once more."
)


def add_capacity_args(p: argparse.ArgumentParser) -> None:
    """The capacity search's options, one group of --help, in this order."""
    g = p.add_argument_group("capacity search (--capacity)", _SEARCH_HELP)
    _add_objectives(g)
    _add_levels(g)
    _add_verdict_rules(g)
    _add_confirmation(g)


def _add_objectives(g: argparse._ArgumentGroup) -> None:
    """What a level must meet, and the prompts it is sent."""
    g.add_argument("--slo", action="append", default=[], metavar="METRIC_pNN=LIMIT",
                   help="an objective, e.g. ttft_p99=500ms or itl_p99=50ms or e2e_p90=2s (metric ttft, itl or "
                        f"e2e; p50, p90, p95 or p99); repeat for several (default, as the dashboard's: {DEFAULT_SLO})")
    g.add_argument("--workload", metavar="FILE.jsonl",
                   help='replay real prompts: one JSON object a line, {"prompt": "...", "max_tokens": 128} '
                        "(max_tokens optional, else --max-tokens); default: built prompts of "
                        "--min-tokens..--max-tokens-in tokens")


def _add_levels(g: argparse._ArgumentGroup) -> None:
    """Which levels are tried: concurrency, or request rate with --rate."""
    g.add_argument("--start-concurrency", type=int, default=DEFAULT_START, metavar="C",
                   help=f"first level (default {DEFAULT_START})")
    g.add_argument("--max-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY, metavar="C",
                   help=f"highest level tried (default {DEFAULT_MAX_CONCURRENCY}); a search that passes it "
                        "stops there (stopped: max_concurrency) with a lower bound, which a sweep's table and "
                        "a report show as '≥ C'")
    g.add_argument("--rate", type=float, nargs="?", const=RATE_SEARCH, default=None, metavar="R",
                   help="open loop, requests sent on schedule whether or not earlier ones finished (late sends "
                        "are counted): with --capacity (no value) search the highest request rate (req/s) meeting "
                        "the SLO; with --burst N, --rate R sends the burst at R requests a second (as vLLM's "
                        "bench client --request-rate)")
    g.add_argument("--start-rate", type=float, default=DEFAULT_START_RATE, metavar="R",
                   help=f"--rate: first level in req/s (default {DEFAULT_START_RATE:g})")
    g.add_argument("--max-rate", type=float, default=DEFAULT_MAX_RATE, metavar="R",
                   help=f"--rate: highest rate tried (default {DEFAULT_MAX_RATE:g})")
    g.add_argument("--arrivals", choices=ARRIVALS, default=DEFAULT_ARRIVALS,
                   help=f"with --rate: Poisson arrivals (exponential gaps, as vLLM's bench client) or evenly spaced "
                        f"(default {DEFAULT_ARRIVALS})")


def _add_verdict_rules(g: argparse._ArgumentGroup) -> None:
    """When the search stops, and how much one level is measured before its verdict."""
    g.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="F",
                   help=f"stop when (lowest fail - highest pass) / highest pass <= F (default {DEFAULT_TOLERANCE:g})")
    g.add_argument("--attainment", type=float, default=DEFAULT_ATTAINMENT, metavar="F",
                   help=f"share of requests that must meet the SLO one by one (vLLM's goodput) for a level to pass "
                        f"(default {DEFAULT_ATTAINMENT:g}; 0 turns it off)")
    g.add_argument("--min-requests", type=int, default=DEFAULT_MIN_REQUESTS, metavar="N",
                   help=f"counted requests per level before a verdict (default {DEFAULT_MIN_REQUESTS})")
    g.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS, metavar="N",
                   help=f"counted requests per level at most, once its windows are in (default "
                        f"{DEFAULT_MAX_REQUESTS}; a closed loop at least 8 x concurrency)")
    g.add_argument("--level-time", type=float, default=DEFAULT_LEVEL_TIME_S, metavar="S",
                   help=f"seconds per level at most (default {DEFAULT_LEVEL_TIME_S:g})")
    g.add_argument("--min-windows", type=int, default=DEFAULT_MIN_WINDOWS, metavar="N",
                   help=f"windows that must agree before a verdict (default {DEFAULT_MIN_WINDOWS})")
    g.add_argument("--stability", type=float, default=DEFAULT_STABILITY, metavar="F",
                   help=f"the windows' median E2E each within F of their average (default {DEFAULT_STABILITY:g})")
    g.add_argument("--resolution", type=float, default=DEFAULT_RESOLUTION, metavar="F",
                   help="how close to each limit a percentile is worth resolving, as a share of the limit: a "
                        "level whose percentile reads within the limit also passes once the bound says it is "
                        "within limit x (1 + F), and one reading past it also fails once the bound says it is "
                        f"past limit x (1 - F) (default {DEFAULT_RESOLUTION:g}; 0: the exact limit only, which "
                        "leaves levels at the limit undecided until --max-requests)")


def _add_confirmation(g: argparse._ArgumentGroup) -> None:
    """The capacity measured again, the bounds' confidence, and the client's processes."""
    g.add_argument("--confirm-waves", type=int, default=DEFAULT_CONFIRM_WAVES, metavar="N",
                   help=f"measure the capacity again for N turnovers of its in-flight requests and report that run "
                        f"(default {DEFAULT_CONFIRM_WAVES}; 0: no confirmation)")
    g.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, metavar="P",
                   help=f"confidence of each bound (default {DEFAULT_CONFIDENCE:g})")
    g.add_argument("--client-procs", default="auto", metavar="N",
                   help="spread each level's streams over N processes of this machine, the search judging in its "
                        "own: one Python process timing 400+ streams at 15-20 k tokens/s reads token gaps longer "
                        "than the server made them. Each process wants a core of its own. With --rate each "
                        "process sends R/N req/s (default auto: one for every 4 usable cores, 1 to 4; "
                        "1: the search's own process)")


@dataclass
class CapacityOptions:
    """The capacity search as the command line asked for it."""

    slo: list
    search: Any
    rules: Any
    workload_path: str | None
    client_procs: int = 1

    def describe(self) -> str:
        return " ".join(str(o) for o in self.slo)


def capacity_options(args: argparse.Namespace, searches_at_once: int = 1) -> CapacityOptions:
    """Parse and check the capacity options; CliError with a plain message.
    searches_at_once: searches that will share this machine's cores (a
    parallel sweep's trials), for --client-procs auto."""
    from ernie_tui.engine_ctl.load import make_search  # lazy: --help start-up

    if args.rate not in (None, RATE_SEARCH):
        raise CliError("--capacity --rate takes no value: the first level is --start-rate")
    try:
        slo, search, rules = make_search(args.slo or DEFAULT_SLO, start=args.start_concurrency,
                                         max_concurrency=args.max_concurrency, tolerance=args.tolerance,
                                         min_requests=args.min_requests, max_requests=args.max_requests,
                                         level_time_s=args.level_time, confidence=args.confidence,
                                         attainment=args.attainment, rate=args.rate is not None,
                                         start_rate=args.start_rate, max_rate=args.max_rate, arrivals=args.arrivals,
                                         stability=args.stability, min_windows=args.min_windows,
                                         confirm_waves=args.confirm_waves, resolution=args.resolution)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return CapacityOptions(slo, search, rules, args.workload,
                           client_procs(getattr(args, "client_procs", "auto"), searches_at_once))


def client_procs(value: str | int, searches_at_once: int = 1) -> int:
    """--client-procs: "auto" (level_procs.auto_procs) or a count of 1 or more."""
    from ernie_tui.engine_ctl.load import auto_procs  # lazy: --help start-up

    if value == "auto":
        return auto_procs(searches_at_once=searches_at_once)
    try:
        procs = int(value)
    except ValueError:
        raise CliError(f"--client-procs takes auto or a count, not {value!r}") from None
    if procs < 1:
        raise CliError("--client-procs must be 1 or more")
    return procs


def load_workload(path: str | None, default_max_tokens: int):
    """The JSONL workload, or None for built prompts."""
    if not path:
        return None
    from ernie_tui.engine_ctl.load import load_jsonl  # lazy: --help start-up

    try:
        return load_jsonl(path, default_max_tokens)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def trials_at_once(gpu_ids: list[str] | None, gpus_per_trial: int | str | None) -> int:
    """How many of a sweep's trials run side by side (their searches share
    this machine's cores, for --client-procs auto): one without GPU ids (a
    sequential sweep), else the GPUs over each trial's share ("auto": at
    least one GPU a trial)."""
    if gpu_ids is None:
        return 1
    per = gpus_per_trial if isinstance(gpus_per_trial, int) else 1
    return max(1, len(gpu_ids) // per)


def capacity_sweep(args: argparse.Namespace, searches_at_once: int = 1):
    """The sweep's CapacitySweep from the capacity options (the CLI's sweep and
    bench/parallel_sweep.py share it); searches_at_once: its trials that run
    side by side."""
    from ernie_tui.engine_ctl.control import CapacitySweep  # lazy: --help start-up

    opts = capacity_options(args, searches_at_once)
    workload = load_workload(args.workload, args.max_tokens)
    return CapacitySweep(slo=opts.slo, search=opts.search, rules=opts.rules,
                         settings=RequestSettings(client_procs=opts.client_procs) if opts.client_procs > 1 else None,
                         workload_items=workload.items if workload else None)
