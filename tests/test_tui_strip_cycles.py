"""Drawn lines are freed by their reference count, not left for a full
collection (the log flood's key-press tail, docs/lab/benchmarks/tui-overhead.md)."""

from __future__ import annotations

import gc

from rich.segment import Segment
from textual.strip import Strip

from ernie_tui.tui.strip_cycles import stop_strip_self_cycles
from ernie_tui.tui.widgets.log_view import _StripCache


def _freed_without_collector(make) -> bool:
    """make() builds objects and drops them; were they all freed by their
    reference counts (nothing left in a cycle for the collector)?"""
    gc.collect()
    gc.disable()
    try:
        make()
        return gc.collect() == 0
    finally:
        gc.enable()


def _drawn_strip() -> None:
    strip = Strip([Segment("INFO 03:35:58 Engine 000: Avg prompt throughput")])
    width = strip.cell_length
    assert strip.divide([width]) == [strip]  # what the compositor does to a line cut at its width
    assert strip.crop_extend(0, width, None) is strip
    assert [s.text for s in strip.divide([5, width])] == ["INFO ", "03:35:58 Engine 000: Avg prompt throughput"]


def test_a_drawn_strip_is_freed_by_its_reference_count():
    stop_strip_self_cycles()
    assert _freed_without_collector(_drawn_strip)


def _cleared_cache() -> None:
    cache = _StripCache(4)
    for n in range(8):
        cache[(n, 0)] = Strip([Segment(f"line {n}")])
    cache.get((6, 0))
    cache.clear()


def test_the_log_panes_line_cache_leaves_no_cycle_when_cleared():
    assert _freed_without_collector(_cleared_cache)


def test_the_log_panes_line_cache_drops_the_least_recently_used():
    cache = _StripCache(2)
    a, b, c = (Strip([Segment(t)]) for t in "abc")
    cache[(1, 0)] = a
    cache[(2, 0)] = b
    assert cache.get((1, 0)) is a  # 1 is now newer than 2
    cache[(3, 0)] = c
    assert cache.get((2, 0)) is None
    assert cache.get((1, 0)) is a and cache.get((3, 0)) is c
