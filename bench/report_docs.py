"""Render the docs' pictures from run records: docs/img/NAME.png (and, with
--per-run, one picture per run: docs/img/NAME-PRESET[-rN].png).

The GPU runs' records are not in the repository; copy them (the run store's
JSON files, or a sweep's JSON export) next to this checkout and point at them:

    python bench/report_docs.py --name capacity-h200 --runs-dir ~/h200-runs SWEEP_ID
    python bench/report_docs.py --name capacity-h200 --per-run --runs-dir ~/h200-runs capacity-h200.json

then embed `![...](img/capacity-h200.png)` in the doc. The picture shown in
README.md (docs/img/report-standin-capacity.png) was made from a stand-in run
kept with the tests:

    python bench/report_docs.py --name report-standin-capacity \
        tests/fixtures/runs/20261201T110427-capacity-55ef31.json

Needs the report extra (pip install 'ernie-tui[report]').
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ernie_tui.engine_ctl.report import ReportData, ReportError, load_report_data, write_report

ROOT = Path(__file__).resolve().parent.parent


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run ids, run-record files or a sweep's JSON export")
    ap.add_argument("--name", required=True, help="picture name: docs/img/NAME.png")
    ap.add_argument("--runs-dir", metavar="DIR", help="where the run ids are (default: the run store)")
    ap.add_argument("--out-dir", metavar="DIR", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--per-run", action="store_true", help="also one picture per run")
    ap.add_argument("--dpi", type=float, default=70.0, help="PNG resolution (70: small enough for a repo)")
    ap.add_argument("--svg", action="store_true", help="SVG instead of PNG")
    args = ap.parse_args(argv)
    ext = ".svg" if args.svg else ".png"
    out_dir = Path(args.out_dir)
    try:
        data = load_report_data(args.runs, args.runs_dir)
        written = [write_report(data, out_dir / f"{args.name}{ext}", dpi=args.dpi)]
        if args.per_run:
            for curve in data.curves:
                rep = curve.repeat.removeprefix("sweep repeat ")
                tail = f"-r{int(rep) + 1}" if rep.isdigit() and rep != curve.repeat else ""
                one = ReportData(curves=[curve], sources=data.sources)
                written.append(write_report(one, out_dir / f"{args.name}-{_slug(curve.name)}{tail}{ext}",
                                            dpi=args.dpi))
    except ReportError as exc:
        print(f"report_docs: {exc}", file=sys.stderr)
        return 1
    for p in written:
        print(f"wrote {p} ({p.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
