"""Two paired sweeps' verdicts, pair by pair: does a ranking hold on a second run or machine?

    python bench/compare_rankings.py FIRST.json SECOND.json [--json]

Each FILE is a paired `ernie-tui sweep --capacity ... --out FILE.json` export (its
"paired" section), e.g. one from each of two H200 hosts (bench/rank_h200.sh).
For every pair of presets measured in both runs it prints the two verdicts and
how they relate:
- same: beyond noise on both, the same preset better;
- OPPOSITE: beyond noise on both, different presets better (the ranking does
  not reproduce: the exit status is 1);
- one only: beyond noise on one run, within noise on the other;
- neither: within noise on both.
The gaps (with their intervals) are printed side by side, so a pair can agree
in direction while its size differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def load_pairs(path: Path) -> dict[frozenset[str], dict[str, Any]]:
    """The export's pair verdicts keyed by the unordered pair of names."""
    data = json.loads(path.read_text(encoding="utf-8"))
    paired = data.get("paired")
    if not paired:
        raise SystemExit(f"{path}: no 'paired' section: not a paired sweep's JSON export")
    return {frozenset((p["a"], p["b"])): p for p in paired.get("pairs", [])}


def relation(one: dict[str, Any], two: dict[str, Any]) -> str:
    """How two verdicts on the same pair relate (see the module's docstring)."""
    b1, b2 = one.get("better"), two.get("better")
    if b1 and b2:
        return "same" if b1 == b2 else "OPPOSITE"
    if b1 or b2:
        return "one only"
    return "neither"


def gap_text(verdict: dict[str, Any]) -> str:
    gap = verdict.get("gap_pct")
    if not gap:
        return "–"
    g, lo, hi = gap
    who = verdict.get("better") or f"{verdict['b']} vs {verdict['a']}"
    return f"{who} {g:+.0f} % ({lo:+.0f}..{hi:+.0f})"


def compare(first: Path, second: Path) -> list[dict[str, Any]]:
    p1, p2 = load_pairs(first), load_pairs(second)
    rows = []
    for key in sorted(set(p1) & set(p2), key=sorted):
        one, two = p1[key], p2[key]
        rows.append({"pair": sorted(key), "relation": relation(one, two), "first": gap_text(one),
                     "second": gap_text(two), "first_text": one.get("text"), "second_text": two.get("text")})
    for key in sorted(set(p1) ^ set(p2), key=sorted):
        rows.append({"pair": sorted(key), "relation": "in one run only", "first": gap_text(p1[key]) if key in p1
                     else "–", "second": gap_text(p2[key]) if key in p2 else "–"})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = compare(args.first, args.second)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"| pair | {args.first.name} | {args.second.name} | relation |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {' / '.join(r['pair'])} | {r['first']} | {r['second']} | {r['relation']} |")
        counts = {k: sum(1 for r in rows if r["relation"] == k) for k in ("same", "OPPOSITE", "one only", "neither")}
        print("\n" + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    return 1 if any(r["relation"] == "OPPOSITE" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
