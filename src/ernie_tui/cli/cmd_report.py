"""`ernie-tui report RUN... --out FILE.{html,png,svg} [--csv FILE.csv]`."""

from __future__ import annotations

import argparse
import sys

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.out_paths import check_out_files


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="draw saved runs (capacity searches, sweeps, bursts, tunes) into an HTML page, PNG or SVG",
        description="Make one file a colleague opens without the terminal: per run, output tok/s against "
                    "TTFT p99 and ITL p99 (each level a point with its verdict, the SLO limits as lines, the "
                    "capacity ringed) and each level's SLO attainment with its interval; across presets, the "
                    "ranking with the spread of repeats, 'within noise' where ranges overlap, and the Pareto "
                    "front; and what each run ran on (engine arguments, vLLM version, platform, workload, "
                    "SLO) with vLLM's own histogram figures beside ours. FILE.html is self-contained (pictures "
                    "inline, no script, nothing fetched from the network) and links the CSV of every level; "
                    "FILE.png / FILE.svg put every picture on one canvas. A sweep brings its trials' runs from "
                    "the run store. A tune shows its answer (the best setting against BASE, the verdict), "
                    "goodput per trial, the trials' Pareto front, each parameter's effect, every trial, and the "
                    "capacity curves of the best, BASE and a few more trials. Needs matplotlib: "
                    "pip install 'ernie-tui[report]'.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a run id (see `ernie-tui runs list`), a run-record file, or a sweep's JSON export")
    p.add_argument("--out", metavar="FILE", action="append", default=[],
                   help="FILE.html, FILE.png or FILE.svg (may repeat)")
    p.add_argument("--csv", metavar="FILE", help="also write every level as CSV, for a spreadsheet")
    p.add_argument("--title", metavar="TEXT", help="the page's title")
    p.add_argument("--runs-dir", metavar="DIR", help="the run store to look ids up in (default: ernie-tui's own)")
    p.set_defaults(run=_report)


def check_out(paths: list[str], option: str = "--out") -> None:
    """Refuse a bad suffix or a missing folder before anything runs (CliError)."""
    from pathlib import Path

    from ernie_tui.engine_ctl.report import FORMATS  # lazy: --help start-up

    for out in paths:
        if Path(out).suffix.lower() not in FORMATS:
            raise CliError(f"a report must end in .html, .png or .svg, got {out}")
    check_out_files(option, paths)
    if paths:  # every format draws: find out now, not after a sweep's hours
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            from ernie_tui.engine_ctl.report import INSTALL_HINT  # lazy: --help start-up

            raise CliError(INSTALL_HINT) from None


def write_from_refs(refs: list[str], outs: list[str], csv_path: str | None = None, title: str | None = None,
                    runs_dir: str | None = None) -> list[str]:
    """Load the runs and write each file; the paths written. CliError on failure."""
    from ernie_tui.engine_ctl.report import (  # lazy: --help start-up
        ReportError,
        load_report_data,
        write_csv,
        write_report,
    )

    try:
        data = load_report_data(refs, runs_dir)
        written = [str(write_report(data, out, title)) for out in outs]
        if csv_path:
            written.append(str(write_csv(data, csv_path)))
    except ReportError as exc:
        raise CliError(str(exc)) from None
    return written


def _report(args) -> int:

    if not args.out and not args.csv:
        raise CliError("say where: --out FILE.html (or .png/.svg) and/or --csv FILE.csv")
    check_out(args.out)
    check_out_files("--csv", [args.csv] if args.csv else [])
    written = write_from_refs(args.runs, args.out, args.csv, args.title, args.runs_dir)
    print(f"wrote {', '.join(written)}", file=sys.stderr)
    return 0
