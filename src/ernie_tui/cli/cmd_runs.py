"""`ernie-tui runs list [--kind K]` / `ernie-tui runs show ID [--json]`: the run store."""

from __future__ import annotations

import argparse
import json

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.stdout import print_whole


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list and show saved run records (what `report` draws)",
                       description="Bursts, capacity searches and sweeps are saved as run records; list them "
                                   "(newest first) to find what to report, or show one.")
    verbs = p.add_subparsers(dest="runs_command", metavar="list|show", required=True)
    ls = verbs.add_parser("list", help="one line per record, newest first")
    ls.add_argument("--kind", choices=["burst", "capacity", "sweep", "probe", "tune"], help="only this kind")
    ls.add_argument("--preset", metavar="NAME", help="only this preset's runs")
    ls.add_argument("--limit", type=int, default=50, metavar="N", help="at most N lines (50; 0 for all)")
    ls.add_argument("--runs-dir", metavar="DIR", help="the run store (default: ernie-tui's own)")
    ls.set_defaults(run=_list)
    show = verbs.add_parser("show", help="one record: where it came from and what it found")
    show.add_argument("id", metavar="ID", help="a run id or a run-record file")
    show.add_argument("--json", action="store_true", help="print the whole record as JSON")
    show.add_argument("--runs-dir", metavar="DIR", help="the run store (default: ernie-tui's own)")
    show.set_defaults(run=_show)


def _list(args) -> int:
    from ernie_tui.engine_ctl.load import list_runs  # lazy: --help start-up
    from ernie_tui.engine_ctl.report import list_line

    runs = list_runs(kind=args.kind, preset=args.preset, directory=args.runs_dir)
    if not runs:
        print("no run records" + (f" of kind {args.kind}" if args.kind else ""))
        return 0
    shown = runs if args.limit <= 0 else runs[:args.limit]
    print(f"{'ID':<32} {'KIND':<9} {'PRESET':<20} RESULT")
    for rec in shown:
        print(list_line(rec))
    if len(shown) < len(runs):
        print(f"... {len(runs) - len(shown)} older (--limit 0 lists all)")
    return 0


def _show(args) -> int:
    from ernie_tui.engine_ctl.load import RunStoreError, load_run  # lazy: --help start-up
    from ernie_tui.engine_ctl.report import describe

    try:
        rec = load_run(args.id, args.runs_dir)
    except RunStoreError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print_whole(json.dumps(rec.to_dict(), indent=1, ensure_ascii=False))
    else:
        print(describe(rec))
    return 0
