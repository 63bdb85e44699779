"""`--ray [ADDRESS]` and `--ray-resources JSON`, shared by `tune` and `sweep`
(and `--storage URL`, tune's only): trials on a Ray cluster
(engine_ctl/control/ray_trials.py). Ray itself is imported only when --ray
is given."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ernie_tui.cli.errors import CliError

AUTO = "auto"


def add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const=AUTO, metavar="ADDRESS",
                   help="run each trial on a node of a Ray cluster (pip install 'ernie-tui[ray]'): ADDRESS is "
                        "the head's HOST:PORT or ray://HOST:PORT; without it, RAY_ADDRESS or the cluster "
                        "started on this machine. A trial reserves on one node the GPUs its preset needs "
                        "(tensor x pipeline x local data parallel, one placement group), or on a CPU cluster "
                        "one CPU or --ray-resources; its server and its load run there, its record and log "
                        "come back here. A trial whose node is lost runs again on another one")
    p.add_argument("--ray-resources", metavar="JSON",
                   help="what each trial reserves on its node besides GPUs, as JSON, like '{\"trial_slot\": 1}' "
                        "with nodes started with --resources '{\"trial_slot\": 1}': one trial a node "
                        "(default: one CPU)")


def ray_trials(args: argparse.Namespace, presets: list) -> Any:
    """The connected RayTrials for --ray (None without it), every preset
    checked to fit a node; mistakes as CliError before anything starts."""
    if args.ray is None:
        if args.ray_resources:
            raise CliError("--ray-resources belongs to --ray")
        return None
    from ernie_tui.engine_ctl.control import RayTrials, RayTrialsError, parse_resources  # lazy: --help start-up

    try:
        trials = RayTrials(None if args.ray == AUTO else args.ray, parse_resources(args.ray_resources)).connect()
        trials.check(presets)
    except RayTrialsError as exc:
        raise CliError(str(exc)) from None
    nodes = trials.nodes()
    print(f"ray: {len(nodes)} node(s) ({', '.join(str(n['ip']) for n in nodes)}); "
          f"{max(trials.slots(p) for p in presets)} trial(s) at once", file=sys.stderr)
    return trials
