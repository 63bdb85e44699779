"""--traffic PROFILE for the commands that send load (probe --burst and
--capacity; sweep and tune pass it through): the profile read once, and the
BurstConfig fields its replay sets (engine_ctl/load/traffic_replay.py)."""

from __future__ import annotations

import argparse
from typing import Any

from ernie_tui.cli.errors import CliError


def add_traffic_args(p: argparse.ArgumentParser | Any) -> None:
    p.add_argument("--traffic", metavar="PROFILE",
                   help="replay a traffic profile: a file from `ernie-tui traffic capture`, or a built-in shape "
                        "(chat, long-doc-qa, batch-summarise): prompt and output lengths drawn from it (from "
                        "--seed), its shared prefix, its arrivals' burstiness (a burst goes out at its mean "
                        "rate unless --rate or --concurrency says otherwise); it replaces the length options")
    p.add_argument("--traffic-outputs", choices=["lengths", "eos"], default="lengths",
                   help="with --traffic: 'lengths' (default) asks for each drawn output length as max_tokens "
                        "with ignore_eos, so the server generates exactly the profile's lengths whatever the "
                        "model; 'eos' draws max_tokens and lets the model stop at EOS (a real model's own "
                        "answers)")
    p.add_argument("--traffic-arrivals", choices=["curve", "mean"], default="curve",
                   help="with --traffic: 'curve' (default) sends along the profile's rate window by window "
                        "(a captured burst and lull), the whole curve scaled to the rate asked for; 'mean' "
                        "sends at one mean rate with the profile's burstiness. A profile of one window (the "
                        "built-in shapes) goes at its mean either way")


def traffic_fields(args: Any) -> tuple[Any, dict[str, Any]] | None:
    """(the profile, the BurstConfig fields its replay sets), or None
    without --traffic. CliError in plain words for a bad profile."""
    ref = getattr(args, "traffic", None)
    if not ref:
        return None
    from ernie_tui.engine_ctl.load import TrafficError, load_profile, replay_settings  # lazy: --help start-up

    try:
        profile = load_profile(ref)
        return profile, replay_settings(profile, getattr(args, "traffic_outputs", "lengths"),
                                        getattr(args, "traffic_arrivals", "curve"))
    except (TrafficError, ValueError) as exc:
        raise CliError(f"--traffic: {exc}") from exc


def with_traffic(args: Any, config: Any, capacity: Any = None) -> Any:
    """`config` (a BurstConfig) replaying --traffic, if given; a capacity
    sweep's request settings told how its outputs end. For sweep and tune,
    which pass --traffic through to every preset's load."""
    traffic = traffic_fields(args)
    if traffic is None:
        return config
    from dataclasses import replace

    config = replace(config, **traffic[1])
    if capacity is not None and not config.ignore_eos:
        from ernie_tui.engine_ctl.load import RequestSettings  # lazy: --help start-up

        capacity.settings = replace(capacity.settings or RequestSettings(), ignore_eos=False)
    return config
