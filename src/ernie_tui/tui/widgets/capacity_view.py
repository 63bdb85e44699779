"""A capacity search on screen: its curve, its levels, its answer.

CapacityView only shows what it is handed (the levels measured so far, the
result at the end); the search runs in the Burst tab's worker, which keeps
the levels. The chart is a CapacityChart (widgets/charts.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Static

from ernie_tui.tui.widgets.charts import CapacityChart, CapacityCurve

# The figures the SLO judges first, each beside vLLM's own (its histogram
# over the level's window): a narrow table still shows them side by side.
LEVEL_COLUMNS = (("concurrency", "conc."), ("ttft_p99_ms", "TTFT p99"), ("vllm_ttft_p99_ms", "(vLLM's)"),
                 ("itl_p99_ms", "ITL p99"), ("vllm_itl_p99_ms", "(vLLM's)"), ("attainment", "attain"),
                 ("verdict", "verdict"), ("requests", "reqs"), ("requests_per_s", "req/s"),
                 ("output_tps", "out tok/s"), ("ttft_p50_ms", "TTFT p50"), ("itl_p50_ms", "ITL p50"))

# Our client-side figure over vLLM's own (its histogram over the same
# window) by more than this is flagged, and the screen says why it can be.
GAP_FACTOR = 1.5
GAP_WHY = ("Ours is timed at this client; vLLM's from when its engine takes the request. The gap is time "
           "outside the engine: the client's CPU (shared with vLLM on one box), the network, vLLM's API server "
           "process. The SLO judges ours, what users see.")


def level_load(lv: Any) -> float:
    """A level's load: its request rate (open loop) or its concurrency."""
    rate = getattr(lv, "rate", None)
    return float(rate if rate is not None else (lv.concurrency or 0))


def describe_load(load: float | None, rate: bool) -> str:
    """'concurrency 8' or 'rate 2.5 req/s'."""
    if load is None:
        return "rate ?" if rate else "concurrency ?"
    return f"rate {load:g} req/s" if rate else f"concurrency {int(load)}"


def load_cell(lv: Any) -> str:
    """The level table's first cell: '8' or '2.5/s'."""
    rate = getattr(lv, "rate", None)
    return f"{rate:g}/s" if rate is not None else str(lv.concurrency)


def capacity_load(result: Any) -> float | None:
    """A finished search's capacity as a load (a rate in rate mode)."""
    c = result.capacity
    if not c:
        return None
    v = c.get("rate") if getattr(result, "mode", "concurrency") == "rate" else c.get("concurrency")
    return None if v is None else float(v)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / vLLM's, when both are there and vLLM's is above zero."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def level_gaps(lv: Any) -> list[tuple[str, float, float, float]]:
    """(metric, ours ms, vLLM's ms, ratio) for the p99s of a level that
    differ from vLLM's by more than GAP_FACTOR either way."""
    v = lv.vllm or {}
    out = []
    for metric, ours, theirs in (("TTFT p99", lv.ttft_p99_ms, v.get("ttft_p99_ms")),
                                 ("ITL p99", lv.itl_p99_ms, v.get("itl_p99_ms"))):
        if ours is None or theirs is None:
            continue
        r = ratio(ours, theirs)
        if r is not None and (r > GAP_FACTOR or r < 1 / GAP_FACTOR):
            out.append((metric, float(ours), float(theirs), r))
    return out


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def level_verdict(lv: Any) -> str:
    """'pass', 'fail (undecided)', ... with why the level stopped."""
    return ("confirmed: " if getattr(lv, "confirmation", False) else "") + ("pass" if lv.passed else "fail") \
        + ("" if lv.decided else " (undecided)") + f", {lv.stop}"


def level_cells(lv: Any) -> list[Any]:
    """One row of the level table."""
    att = "–" if lv.attainment is None else f"{lv.attainment * 100:.1f}%"
    verdict = Text(level_verdict(lv), style="bold green" if lv.passed else "bold red")
    v = lv.vllm or {}
    load = load_cell(lv)
    gaps = {metric: r for metric, _, _, r in level_gaps(lv)}

    def theirs(value: float | None, metric: str) -> Text:
        r = gaps.get(metric)
        if r is None:
            return Text(_num(value))
        return Text(f"{_num(value)} ({r:.1f}×)", style="bold yellow")  # ours is r times vLLM's

    return [load, _num(lv.ttft_p99_ms), theirs(v.get("ttft_p99_ms"), "TTFT p99"),
            _num(lv.itl_p99_ms), theirs(v.get("itl_p99_ms"), "ITL p99"), att, verdict, str(lv.requests),
            _num(lv.requests_per_s, ".2f"), _num(lv.output_tps), _num(lv.ttft_p50_ms), _num(lv.itl_p50_ms)]


def describe_gaps(levels: Sequence[Any]) -> Content | None:
    """Where our p99s and vLLM's differ by more than GAP_FACTOR, and why
    that can happen; None when they agree (or vLLM's are not there)."""
    found = [(f"rate {lv.rate:g} req/s" if getattr(lv, "rate", None) is not None else f"conc. {lv.concurrency}", gap)
             for lv in levels for gap in level_gaps(lv)]
    if not found:
        return None
    where = "; ".join(f"{c}: {metric} ours {ours:.0f} ms, vLLM's {theirs:.0f} ms ({r:.1f}×)"
                      for c, (metric, ours, theirs, r) in found[:3]) + ("; …" if len(found) > 3 else "")
    return Content.assemble((f"ours and vLLM's differ by more than {GAP_FACTOR:g}× · ", "bold $warning"),
                            (where, "$warning"), "\n", (GAP_WHY, "dim"))


def describe_capacity(result: Any) -> Content:
    """The answer of a finished search: the capacity and goodput there, why
    it stopped, and its warnings."""
    c = result.capacity
    if c:
        rate = c.get("rate") if getattr(result, "mode", "concurrency") == "rate" else None
        # At the search's ceiling every level passed: a lower bound (raise max C / max req/s).
        at_least = "≥ " if getattr(result, "at_ceiling", False) else ""
        head = Content.assemble(
            ("capacity: " if rate is not None else "capacity: concurrency ", "dim"),
            (at_least + (f"{rate:g} req/s" if rate is not None else str(c["concurrency"])), "bold $success"),
            (" (a lower bound: raise the highest load allowed)" if at_least else "", "$warning"),
            ("" if c.get("decided", True) else " (its level was undecided at a cap)", "$warning"),
            ("  · goodput ", "dim"), (f"{_num(c['goodput_rps'], '.2f')} req/s", "bold"),
            (", ", "dim"), (f"{_num(c['goodput_output_tps'])} output tok/s", "bold"),
            ("  · TTFT p99 ", "dim"), f"{_num(c['ttft_p99_ms'])} ms", ("  · ITL p99 ", "dim"),
            f"{_num(c['itl_p99_ms'])} ms")
    else:
        head = Content.styled("capacity: none (no level met the SLO)", "bold $error")
    lines = [head, Content.assemble(("stopped: ", "dim"), (result.stop_reason, "bold"),
                                    (f" ({result.stop_message}) · {result.seconds:.1f} s · SLO "
                                     f"{' '.join(result.slo)}", "dim"))]
    lines += [Content.styled(f"warning: {w}", "$warning") for w in result.warnings]
    return Content("\n").join(lines)


def describe_progress(ev: dict[str, Any] | None, level: int | None = None, load: str = "") -> Content:
    """The running level, from its newest level_progress event: the phase,
    requests counted of those sent, the time, and the provisional p99s and
    verdict once windows have closed."""
    where = Content.assemble((f"level {level}" if level else "level", "bold"), (f" · {load}" if load else "", "bold"))
    if not ev:
        return Content.assemble(where, (" · starting …", "$warning"))
    phase = str(ev.get("phase") or "?")
    counted, sent = ev.get("counted", 0), ev.get("sent", ev.get("requests", 0))
    parts: list[Content | str | tuple[str, str]] = [
        where, " · ", (phase, "bold $warning" if phase == "warm-up" else "bold"),
        (f" · {counted} counted of {sent} sent · {ev.get('in_flight', 0)} in flight · "
         f"{ev.get('elapsed_s', 0.0):.1f} s · {ev.get('windows', 0)} window(s)", "dim")]
    if phase != "warm-up":
        att = ev.get("attainment")
        parts.append((f" · TTFT p99 {_num(ev.get('ttft_p99_ms'), '.0f')} ms · ITL p99 "
                      f"{_num(ev.get('itl_p99_ms'), '.0f')} ms · attain "
                      f"{'–' if att is None else f'{att * 100:.0f}%'}", ""))
        verdict = ev.get("verdict")
        style = "bold $success" if verdict == "pass" else "bold $error" if verdict == "fail" else "$warning"
        parts += [(" · so far: ", "dim"), (str(verdict or "undecided"), style)]
    return Content.assemble(*parts)


class CapacityView(Vertical):
    """The chart beside the table of levels (ours beside vLLM's own p99s),
    a note where the two differ, the answer below."""

    _percentile = 99
    _limit_ms: float | None = None
    rate = False  # the levels are request rates (open loop)

    def compose(self) -> ComposeResult:
        with Horizontal(id="pf-cap-body"):
            yield CapacityChart(id="pf-cap-chart")
            yield DataTable(id="pf-cap-levels", cursor_type="row", zebra_stripes=True)
        yield Static("", id="pf-cap-progress")
        yield Static("", id="pf-cap-gap")
        with VerticalScroll(id="pf-cap-result-box"):
            yield Static("", id="pf-cap-result")

    def on_mount(self) -> None:
        table = self.query_one("#pf-cap-levels", DataTable)
        table.border_title = "levels, as they finish"
        self._columns()
        self.query_one("#pf-cap-result-box").border_title = "capacity"
        self.show_progress(None)

    def _columns(self, rows: Sequence[list[Any]] = ()) -> None:
        """The table's columns, each as wide as its label and its widest cell
        in `rows`. Set here rather than measured by the DataTable on its next
        idle pass: a frame drawn before that pass kept its rows cut at the
        labels' widths (Textual caches the rendered rows), so a busy box showed
        the flagged "76.0 (9.4×)" as "76.0 (9." until the next level."""
        table = self.query_one("#pf-cap-levels", DataTable)
        table.clear(columns=True)
        for j, (key, label) in enumerate(LEVEL_COLUMNS):
            label = "req/s sent" if key == "concurrency" and self.rate else label
            width = max([cell_len(label)] + [cell_len(str(row[j])) for row in rows])
            table.add_column(label, key=key, width=width)

    def reset(self, slo: Sequence[Any], note: Content | str, rate: bool = False) -> None:
        """A new search under `slo` (slo.Objective): an empty chart whose
        TTFT axis is the percentile the SLO judges, with its limit; `rate`:
        its levels are request rates (req/s), not concurrencies."""
        ttft = next((o for o in slo if o.metric == "ttft"), None)
        self._percentile = ttft.percentile if ttft else 99
        self._limit_ms = ttft.limit_s * 1000.0 if ttft else None
        self.rate = rate
        self._columns()
        self.show_progress(None)
        self._show_gaps([])
        self.query_one(CapacityChart).show([], self._limit_ms, self._percentile, empty="waiting for the first level")
        self.say(note)

    def show_levels(self, levels: Sequence[Any], capacity: float | None = None) -> None:
        """Redraw the curve and the table from the levels measured so far;
        `capacity`: the load (concurrency, or rate) settled on so far."""
        self.query_one(CapacityChart).show([CapacityCurve("this server", list(levels), capacity)],
                                           self._limit_ms, self._percentile)
        table = self.query_one("#pf-cap-levels", DataTable)
        rows = [level_cells(lv) for lv in levels]
        self._columns(rows)
        for i, cells in enumerate(rows):  # keyed by order: a rate search's levels have no concurrency
            table.add_row(*cells, key=f"level-{i}")
        self._show_gaps(levels)

    def show_progress(self, event: dict[str, Any] | None, level: int | None = None, load: str = "") -> None:
        """The running level's progress line (hidden when `level` is None:
        no level runs)."""
        box = self.query_one("#pf-cap-progress", Static)
        box.set_class(level is not None, "-visible")
        box.update(describe_progress(event, level, load) if level is not None else "")

    def _show_gaps(self, levels: Sequence[Any]) -> None:
        note = describe_gaps(levels)
        box = self.query_one("#pf-cap-gap", Static)
        box.update(note or "")
        box.set_class(note is not None, "-visible")

    def say(self, content: Content | str, error: bool = False) -> None:
        box = self.query_one("#pf-cap-result", Static)
        box.update(content)
        box.set_class(error, "-error")
