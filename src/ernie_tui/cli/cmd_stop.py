"""`ernie-tui stop [--preset NAME]`: stop the server a dashboard left running."""

from __future__ import annotations

import argparse
import sys

from ernie_tui.cli.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stop", help="stop the server you left running (quit -> leave)",
        description="Stop the vLLM server a dashboard left running when you quit with 'leave' (or lost the "
                    "terminal with --on-exit leave). It is found by the record it left (server.json in the "
                    "state dir); its whole process group gets SIGINT, then SIGTERM, then SIGKILL, as the "
                    "dashboard's x does, and the record is removed. A record whose server is gone is just "
                    "cleared. Plain `ernie-tui` takes the server back instead.")
    p.add_argument("--preset", metavar="NAME", dest="stop_preset", default=None,
                   help="stop it only if it runs this preset")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from ernie_tui.engine_ctl.control import ServerError, stop_detached  # lazy: --help start-up

    def say(text: str) -> None:
        print(f"ernie-tui: {text}", file=sys.stderr, flush=True)

    try:
        info = stop_detached(args.stop_preset, say=say)
    except ServerError as exc:
        raise CliError(str(exc)) from None
    if info is None:
        print("ernie-tui: no server left running (no live server.json record); nothing to stop")
        return 0
    print(f"stopped {info.get('preset') or 'the server'} (pid {info.get('pid')}) at {info.get('url')}")
    return 0
