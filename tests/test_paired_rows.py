"""A paired sweep's table: rank and vs best from the pairs beyond noise only
(control/paired_rows.py), never from the one round-0 search per preset."""

import math
from dataclasses import dataclass

from ernie_tui.engine_ctl.control.paired_rows import mark_paired, paired_ranks, vs_best_text


def _pair(a: str, b: str, mean_pct: float, low_pct: float, high_pct: float) -> dict:
    """A pair as PairedResult.to_dict() writes it: ln(B/A), its interval, the verdict."""
    mean, low, high = (math.log1p(x / 100) for x in (mean_pct, low_pct, high_pct))
    beyond = low > 0 or high < 0
    better = (b if mean > 0 else a) if beyond else None
    return {"a": a, "b": b, "mean": mean, "low": low, "high": high, "beyond_noise": beyond, "better": better}


@dataclass
class Row:
    preset: str
    rank: int | None = 99
    vs_best: str = "stale"
    paired: bool = False


def test_only_presets_in_a_win_are_ranked_and_the_gap_is_read_from_either_side():
    # The 24th GPU run's shape: C beats B and D; A and E are in no win.
    paired = {"pairs": [_pair("A", "B", 1, -16, 22), _pair("B", "C", 18, 4, 33), _pair("D", "C", 27, 5, 54),
                        _pair("A", "E", -2, -18, 16)]}
    rows = [Row(n) for n in "ABCDE"]
    mark_paired(rows, paired)
    table = {r.preset: (r.rank, r.vs_best) for r in rows}
    assert table["C"] == (1, "best")
    # B/C was measured as C over B (+18 %): B is 1/1.18 - 1 = -15 % of C, interval likewise inverted.
    assert table["B"] == (2, "-15 % (-25 to -4 %) vs C")
    assert table["D"] == (2, "-21 % (-35 to -5 %) vs C")
    assert table["A"] == (None, "within noise") and table["E"] == (None, "within noise")
    assert all(r.paired for r in rows)


def test_a_chain_counts_every_preset_above_and_a_cycle_places_none_of_its_members():
    chain = {"pairs": [_pair("B", "A", 10, 3, 18), _pair("C", "B", 10, 3, 18), _pair("A", "C", 1, -5, 8)]}
    assert paired_ranks(chain) == {"A": 1, "B": 2, "C": 3}
    # C is below A only through B: its own pair with A is within noise, and says so.
    assert vs_best_text(chain, "C", paired_ranks(chain)) == "within noise"
    cycle = {"pairs": [_pair("A", "B", 10, 3, 18), _pair("B", "C", 10, 3, 18), _pair("A", "C", -9, -15, -3),
                       _pair("C", "D", -9, -15, -3)]}
    # B beats A, C beats B, A beats C: a cycle, none of them placed; D is below all three.
    ranks = paired_ranks(cycle)
    assert "A" not in ranks and "B" not in ranks and "C" not in ranks
    assert ranks == {"D": 4}


def test_no_pair_beyond_noise_ranks_nobody():
    paired = {"pairs": [_pair("A", "B", 5, -10, 20)]}
    rows = [Row("A"), Row("B")]
    mark_paired(rows, paired)
    assert [(r.rank, r.vs_best) for r in rows] == [(None, "within noise"), (None, "within noise")]


def test_the_wins_come_from_the_pairs_so_an_export_without_ranking_wins_still_ranks():
    # Exports before 2026-12-06 (the 22nd GPU run's) have a ranking without "wins".
    paired = {"pairs": [_pair("long-doc", "seqs128", 39, 12, 72)], "ranking": {"tiers": [["seqs128"], ["long-doc"]]}}
    assert paired_ranks(paired) == {"seqs128": 1, "long-doc": 2}


def test_a_pair_held_back_by_a_knee_check_reads_undecided_in_the_table():
    from ernie_tui.engine_ctl.control.paired_rows import paired_ranks, vs_best_text

    paired = {"pairs": [{"a": "x", "b": "y", "mean": 0.2, "low": 0.1, "high": 0.3, "beyond_noise": False,
                         "better": None, "held_back": "x's knee uncertain (round 0 search: ...)"}]}
    ranks = paired_ranks(paired)
    assert ranks == {}
    assert vs_best_text(paired, "x", ranks) == "undecided: knee uncertain"
    paired["pairs"][0]["held_back"] = None
    assert vs_best_text(paired, "x", ranks) == "within noise"
