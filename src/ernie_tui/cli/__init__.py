"""The `ernie-tui` command line.

With no subcommand it opens the dashboard. Each subcommand lives in its own
`cmd_*.py` module here exposing `register(subparsers)`; modules are found by
name so adding a command touches no shared file. Heavy imports (Textual,
httpx, vLLM helpers) happen inside each command's run function, so `--help`
stays fast.

Errors meant for people are raised as CliError (or PresetError) and printed
as one line with exit status 1, never a traceback. Output piped into a
reader that stops early (`| head`) ends quietly with status 141, as a
process ended by SIGPIPE (`ls`, `git`) reports in the shell.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ernie_tui import __version__
from ernie_tui.cli.dashboard import run_dashboard
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.shared_options import SubcommandsAction, shared_options
from ernie_tui.cli.stdout import end_quietly_on_closed_stdout, stdout_reader_gone

__all__ = ["CliError", "build_parser", "main"]


def _command_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("cmd_"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ernie-tui", parents=[shared_options(top_level=True)],
        description=(
            "Terminal dashboard for tuning a vLLM server live. With no command it opens the "
            "dashboard in control mode (start/stop/restart a server from a preset), or monitors "
            "a running server (--attach), several at once (--attach repeated, or --fleet), "
            "or replays a captured llm.log (--replay)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"ernie-tui {__version__}")
    parser.add_argument("--preset", metavar="NAME", help="preset to select (control mode)")
    parser.add_argument("--attach", metavar="URL", action="append", default=[],
                        help="monitor a server this tool did not start; never stops it. May repeat: "
                             "several open the fleet view, one row per server")
    parser.add_argument("--fleet", metavar="FILE",
                        help="fleet view of the servers a TOML file names ([servers.NAME] url, log, preset)")
    parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                        help="fleet view with a Ray panel: the nodes of the cluster (address, resources, alive or "
                             "lost) and the trials of `tune --ray` / `sweep --ray` running on them, each with its "
                             "node and its server's URL, one run again after a node loss marked so. ADDRESS as "
                             "tune's --ray (without it, RAY_ADDRESS or the cluster started here); alone, without "
                             "--attach or --fleet, the view holds just the cluster")
    parser.add_argument("--log", metavar="PATH",
                        help="with one --attach: the server's llm.log to tail (a big one opens on its last start "
                             "and its end)")
    parser.add_argument("--replay", metavar="LOG",
                        help="open a captured llm.log offline (no server; a big one opens on its last start and "
                             "its end, earlier lines load as the log pane scrolls up)")
    parser.add_argument("--start", action="store_true", help="control mode: start the selected preset at once")
    parser.add_argument("--on-exit", choices=["ask", "stop", "leave"], default="ask",
                        help="control mode: on quit, stop the server, leave it running, or ask (default); "
                             "a lost SSH session (SIGHUP) stops it unless this is 'leave'")
    parser.register("action", "parsers", SubcommandsAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules():
        importlib.import_module(f"ernie_tui.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ernie_tui.presets import PresetError  # lazy: presets pull in pydantic; --help stays fast

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            return run_dashboard(args)
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # here, not at the interpreter's exit: a reader gone is met below
        return code
    except BrokenPipeError:
        # `ernie-tui runs show ID --json | head -c 10`: end as `ls` and `git`
        # do, without a word. A broken pipe that is not stdout's is a fault.
        if not stdout_reader_gone():
            raise
        return end_quietly_on_closed_stdout()
    except (CliError, PresetError) as exc:
        print(f"ernie-tui: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ernie-tui: interrupted", file=sys.stderr)
        return 130
