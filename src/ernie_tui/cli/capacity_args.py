"""Options of the capacity search, shared by `probe --capacity` and `sweep --capacity`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ernie_tui.cli.errors import CliError


def add_capacity_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "capacity search (--capacity)",
        "Concurrency doubles from --start-concurrency until a level misses the SLO, then bisects between the "
        "highest pass and the lowest fail until they are within --tolerance. Each level stops as soon as a "
        "distribution-free confidence bound puts every percentile on one side of its limit (or pins it "
        "within 5 % of it), after --min-requests and at most --max-requests or --level-time seconds; a level "
        "still open then is marked undecided and goes by its sample percentiles. p99 objectives need about "
        "300 requests per level to pass with confidence.")
    g.add_argument("--slo", action="append", default=[], metavar="METRIC_pNN=LIMIT",
                   help="an objective, e.g. ttft_p99=500ms or itl_p99=50ms or e2e_p90=2s (metric ttft, itl or "
                        "e2e; p50, p90, p95 or p99); repeat for several")
    g.add_argument("--workload", metavar="FILE.jsonl",
                   help='replay real prompts: one JSON object a line, {"prompt": "...", "max_tokens": 128} '
                        "(max_tokens optional, else --max-tokens); default: built prompts of "
                        "--min-tokens..--max-tokens-in tokens")
    g.add_argument("--start-concurrency", type=int, default=1, metavar="C", help="first level (default 1)")
    g.add_argument("--max-concurrency", type=int, default=256, metavar="C", help="highest level tried (default 256)")
    g.add_argument("--tolerance", type=float, default=0.10, metavar="F",
                   help="stop when (lowest fail - highest pass) / highest pass <= F (default 0.10)")
    g.add_argument("--min-requests", type=int, default=20, metavar="N",
                   help="requests per level before a verdict (default 20; at least 2 x concurrency)")
    g.add_argument("--max-requests", type=int, default=400, metavar="N", help="requests per level at most (400)")
    g.add_argument("--level-time", type=float, default=60.0, metavar="S", help="seconds per level at most (60)")
    g.add_argument("--confidence", type=float, default=0.95, metavar="P",
                   help="confidence of each percentile bound and of the attainment interval (default 0.95)")


@dataclass
class CapacityOptions:
    """The capacity search as the command line asked for it."""

    slo: list
    search: Any
    rules: Any
    workload_path: str | None

    def describe(self) -> str:
        return " ".join(str(o) for o in self.slo)


def capacity_options(args: argparse.Namespace) -> CapacityOptions:
    """Parse and check the capacity options; CliError with a plain message."""
    from ernie_tui.engine_ctl.load import make_search  # lazy: --help start-up

    try:
        slo, search, rules = make_search(args.slo, start=args.start_concurrency,
                                         max_concurrency=args.max_concurrency, tolerance=args.tolerance,
                                         min_requests=args.min_requests, max_requests=args.max_requests,
                                         level_time_s=args.level_time, confidence=args.confidence)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return CapacityOptions(slo, search, rules, args.workload)


def load_workload(path: str | None, default_max_tokens: int):
    """The JSONL workload, or None for built prompts."""
    if not path:
        return None
    from ernie_tui.engine_ctl.load import load_jsonl  # lazy: --help start-up

    try:
        return load_jsonl(path, default_max_tokens)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def capacity_sweep(args: argparse.Namespace):
    """The sweep's CapacitySweep from the capacity options (the CLI's sweep and
    bench/parallel_sweep.py share it)."""
    from ernie_tui.engine_ctl.control import CapacitySweep  # lazy: --help start-up

    opts = capacity_options(args)
    workload = load_workload(args.workload, args.max_tokens)
    return CapacitySweep(slo=opts.slo, search=opts.search, rules=opts.rules,
                         workload_items=workload.items if workload else None)
