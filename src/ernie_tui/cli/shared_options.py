"""Options the main parser and the subcommands share, declared once.

`--presets FILE` and `--model DIR` may come before the command's name
(`ernie-tui --presets F presets list`) or after it (`ernie-tui presets list
--presets F`): both land in one dest, `args.presets` / `args.model`.

argparse parses a subcommand's options into a fresh namespace and copies it
over the main one, so (1) the subcommand's copy of an option has no default
(SUPPRESS), else it would wipe a value given before the command's name, and
(2) SubcommandsAction adds up --presets given on both sides.
"""

from __future__ import annotations

import argparse

PRESETS_HELP = "extra presets TOML file (may repeat); overrides built-ins and the user file"
MODEL_HELP = ("model directory for presets that name none (check, sweep and presets show use it "
              "for every preset)")


def shared_options(*, top_level: bool) -> argparse.ArgumentParser:
    """The parent parser holding --presets and --model. top_level: for the
    main parser (with defaults); otherwise for a subcommand (none)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--presets", metavar="FILE", action="append",
                   default=[] if top_level else argparse.SUPPRESS, help=PRESETS_HELP)
    p.add_argument("--model", metavar="DIR", default=None if top_level else argparse.SUPPRESS, help=MODEL_HELP)
    return p


class SubcommandsAction(argparse._SubParsersAction):
    """The main parser's subcommand action: --presets files given before and
    after the command's name add up (argparse alone keeps the later ones)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, "presets", None)
        super().__call__(parser, namespace, values, option_string)
        after = getattr(namespace, "presets", None)
        if before and after is not before:
            namespace.presets = [*before, *after]
