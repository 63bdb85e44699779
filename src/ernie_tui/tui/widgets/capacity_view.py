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

from ernie_tui.engine_ctl.load import no_capacity_words, second_look, verdict_text
from ernie_tui.tui.widgets.charts import CapacityChart, CapacityCurve

# The level table's columns, in the order they stand: (key, header). The
# SLO's figures stand each beside vLLM's own (its histogram over the level's
# window), the verdict right after the load.
LEVEL_COLUMNS = (("concurrency", "conc."), ("verdict", "verdict"), ("ttft_p99_ms", "TTFT p99"),
                 ("vllm_ttft_p99_ms", "(vLLM's)"), ("itl_p99_ms", "ITL p99"), ("vllm_itl_p99_ms", "(vLLM's)"),
                 ("attainment", "attain"), ("goodput_output_tps", "good tok/s"), ("requests_per_s", "req/s"),
                 ("output_tps", "tok/s"), ("requests", "reqs"), ("stop", "stop"), ("ttft_p50_ms", "TTFT p50"),
                 ("itl_p50_ms", "ITL p50"))
# Which columns a narrow table keeps, first first: the load, the verdict and
# the judged p99s, then the goodput; an 80-column terminal shows these six
# (the level table used to show `conc. TTFT p99 (vLLM's) ITL p9` there).
COLUMN_PRIORITY = ("concurrency", "verdict", "ttft_p99_ms", "itl_p99_ms", "goodput_output_tps",
                   "vllm_ttft_p99_ms", "attainment", "requests_per_s", "output_tps", "vllm_itl_p99_ms",
                   "requests", "stop", "ttft_p50_ms", "itl_p50_ms")
CAPACITY_MARK = "▸"  # before the load of the row whose figures the answer reports

# Our client-side figure over vLLM's own (its histogram over the same
# window) by more than this is flagged, and the screen says why it can be.
GAP_FACTOR = 1.5
GAP_WHY = ("Ours is timed at this client; vLLM's from when its engine takes the request. The gap is time "
           "outside the engine: the client's CPU (shared with vLLM on one box), the network, vLLM's API server "
           "process. The SLO judges ours, what users see.")
# The same in two lines of an 80-column terminal: the note under the level
# table and the cause beside the answer (the long form was cut mid-sentence there).
GAP_WHY_SHORT = ("The gap is time outside vLLM's engine (its API server process, the network, the client's CPU); "
                 "the SLO judges ours.")


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


def verdict_style(lv: Any) -> str:
    """Green for a pass, red for a fail, yellow for a level the search had to
    take on its estimates (undecided at a cap), dim for a cancelled one."""
    words = verdict_text(lv)
    if words == "pass":
        return "bold green"
    if words.startswith("undecided"):
        return "bold yellow"
    return "dim" if words == "cancelled" else "bold red"


def capacity_row(levels: Sequence[Any], capacity: float | None) -> int | None:
    """The index of the level whose figures the answer reports: at the
    capacity's load, the last that passed (as CapacityResult.capacity_level
    picks it: its confirmation when it had one)."""
    if capacity is None:
        return None
    return next((i for i in range(len(levels) - 1, -1, -1)
                 if level_load(levels[i]) == float(capacity) and levels[i].passed and levels[i].stop != "cancelled"),
                None)


def row_order(levels: Sequence[Any]) -> list[int]:
    """The table's rows by load, a second look (confirmation, remeasure)
    right under the first: the headline's level stands beside every other
    measurement of its load, never a fold away from it."""
    return sorted(range(len(levels)), key=lambda i: (level_load(levels[i]), i))


def level_cells(lv: Any, capacity: bool = False) -> dict[str, Any]:
    """One row of the level table, by column key; `capacity`: the row the
    answer reports (marked, bold)."""
    att = "–" if lv.attainment is None else f"{lv.attainment * 100:.1f}%"
    v = lv.vllm or {}
    gaps = {metric: r for metric, _, _, r in level_gaps(lv)}
    look = second_look(lv)
    load = Text(f"{CAPACITY_MARK if capacity else ' '}{load_cell(lv)}{' ' + look if look else ''}",
                style="bold" if capacity else "")

    def theirs(value: float | None, metric: str) -> Text:
        r = gaps.get(metric)
        if r is None:
            return Text(_num(value))
        return Text(f"{_num(value)} ({r:.1f}×)", style="bold yellow")  # ours is r times vLLM's

    return {"concurrency": load, "verdict": Text(verdict_text(lv), style=verdict_style(lv)),
            "ttft_p99_ms": _num(lv.ttft_p99_ms), "vllm_ttft_p99_ms": theirs(v.get("ttft_p99_ms"), "TTFT p99"),
            "itl_p99_ms": _num(lv.itl_p99_ms), "vllm_itl_p99_ms": theirs(v.get("itl_p99_ms"), "ITL p99"),
            "attainment": att, "goodput_output_tps": _num(getattr(lv, "goodput_output_tps", None)),
            "requests_per_s": _num(lv.requests_per_s, ".2f"), "output_tps": _num(lv.output_tps),
            "requests": str(lv.requests), "stop": lv.stop or "–", "ttft_p50_ms": _num(lv.ttft_p50_ms),
            "itl_p50_ms": _num(lv.itl_p50_ms)}


def column_width(key: str, labels: dict[str, str], rows: Sequence[dict[str, Any]]) -> int:
    """A column's width in cells: its header's or its widest cell's."""
    cells = [row[key] for row in rows]
    return max([cell_len(labels[key])] + [cell_len(c.plain if isinstance(c, Text) else str(c)) for c in cells])


def fit_columns(width: int, labels: dict[str, str], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The columns (keys, in LEVEL_COLUMNS' order) that fit `width` cells
    side by side, taken in COLUMN_PRIORITY's order; each as wide as its
    header or its widest cell, plus a cell's padding either side."""
    chosen: set[str] = set()
    used = 0
    for key in COLUMN_PRIORITY:
        w = column_width(key, labels, rows) + 2
        if used + w > width and chosen:
            break
        chosen.add(key)
        used += w
    return [key for key, _ in LEVEL_COLUMNS if key in chosen]


def _gaps_by_load(levels: Sequence[Any]) -> list[tuple[str, tuple[str, float, float, float]]]:
    """(where, gap) for every flagged p99, the lowest load first."""
    return [(f"rate {lv.rate:g} req/s" if getattr(lv, "rate", None) is not None else f"conc. {lv.concurrency}", gap)
            for lv in sorted(levels, key=level_load) for gap in level_gaps(lv)]


def _gap_words(found: Sequence[tuple[str, tuple[str, float, float, float]]], limit: int) -> str:
    more = len(found) - limit
    return "; ".join(f"{c}: {metric} ours {ours:.0f} ms, vLLM's {theirs:.0f} ms ({r:.1f}×)"
                     for c, (metric, ours, theirs, r) in found[:limit]) + (f"; {more} more" if more > 0 else "")


# Kept on every page of columns: which row it is, and its verdict.
PINNED = ("concurrency", "verdict")
# vLLM's figure on a page without ours beside it: named in full.
THEIRS = {"vllm_ttft_p99_ms": ("ttft_p99_ms", "vLLM's TTFT p99"), "vllm_itl_p99_ms": ("itl_p99_ms", "vLLM's ITL p99")}


def page_labels(keys: Sequence[str], labels: dict[str, str]) -> dict[str, str]:
    """The headers of one page of columns: "(vLLM's)" where ours stands to
    its left, else "vLLM's ITL p99"."""
    out = dict(labels)
    for key, (ours, full) in THEIRS.items():
        if key in keys and ours not in keys:
            out[key] = full
    return out


def column_pages(width: int, labels: dict[str, str], rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The level table's columns in pages that each fit `width` cells: the
    first is fit_columns' choice; each next page keeps the load and the
    verdict and takes the hidden columns that fit, in COLUMN_PRIORITY's
    order. An 80-column terminal reached 6 of the 14 columns, and "8 more
    column(s) on a wider terminal" had no way to them (issue 59, 9)."""
    first = fit_columns(width, labels, rows)
    pages = [first]
    rest = [key for key in COLUMN_PRIORITY if key not in first]
    pinned = [key for key in PINNED if key in first]
    while rest:
        taken: list[str] = []
        used = sum(column_width(key, labels, rows) + 2 for key in pinned)
        for key in rest:
            w = column_width(key, page_labels([*pinned, *taken, key], labels), rows) + 2
            if used + w > width and taken:
                break
            taken.append(key)
            used += w
        pages.append([key for key, _ in LEVEL_COLUMNS if key in pinned or key in taken])
        rest = rest[len(taken):]
    return pages


def describe_gaps(levels: Sequence[Any], short: bool = False) -> Content | None:
    """Where our p99s and vLLM's differ by more than GAP_FACTOR, and why
    that can happen; None when they agree (or vLLM's are not there).
    `short`: the first place and the short why, for an 80-column terminal,
    where the whole note did not fit under the table."""
    found = _gaps_by_load(levels)
    if not found:
        return None
    return Content.assemble((f"ours and vLLM's differ by more than {GAP_FACTOR:g}× · ", "bold $warning"),
                            (_gap_words(found, 1 if short else 3), "$warning"), "\n",
                            (GAP_WHY_SHORT if short else GAP_WHY, "dim"))


def gap_cause(result: Any) -> Content | None:
    """The line beside the answer when ours and vLLM's differ: under a
    starved client a "none" answer's cause is there (ours 535 ms, vLLM's
    39 ms), and it was only at the bottom of the pane, below the table."""
    found = _gaps_by_load(getattr(result, "levels", None) or [])
    if not found:
        return None
    at = getattr(result, "capacity_level", None) if result.capacity else None
    if at is not None and level_gaps(at):  # a capacity: the gap of the level it reports first
        found = _gaps_by_load([at]) + [f for f in found if f[1] not in level_gaps(at)]
    c, (metric, ours, theirs, r) = found[0]
    more = len(found) - 1
    lead = "why none: " if not result.capacity else "ours and vLLM's differ: "
    return Content.assemble((lead, "bold $warning"),
                            (f"at {c} {metric} ours {ours:.0f} ms, vLLM's {theirs:.0f} ms ({r:.1f}×)"
                             + (f" (and {more} more level(s))" if more > 0 else "") + ".", "$warning"), " ",
                            (GAP_WHY_SHORT, "dim"))


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
            ("  · goodput ", "dim"), (f"{_num(c['goodput_rps'], '.2f')} req/s", "bold"),
            (", ", "dim"), (f"{_num(c['goodput_output_tps'])} output tok/s", "bold"),
            ("  · TTFT p99 ", "dim"), f"{_num(c['ttft_p99_ms'])} ms", ("  · ITL p99 ", "dim"),
            f"{_num(c['itl_p99_ms'])} ms")
    else:
        head = Content.styled(f"capacity: {no_capacity_words(result.stop_reason)}", "bold $error")
    lines = [head]
    cause = gap_cause(result)
    if cause is not None:  # beside the answer, in view at 80x24 (issue 59, 9)
        lines.append(cause)
    if c:
        lines += _capacity_level_words(result)
    lines += [Content.assemble(("stopped: ", "dim"), (result.stop_reason, "bold"),
                                    (f" ({result.stop_message}) · {result.seconds:.1f} s · SLO "
                                     f"{' '.join(result.slo)}", "dim"))]
    lines += [Content.styled(f"warning: {w}", "$warning") for w in result.warnings]
    return Content("\n").join(lines)


def _capacity_level_words(result: Any) -> list[Content]:
    """The verdict of the level the answer reports, in the table's words,
    when it is not a plain pass: the headline once said "undecided at a cap"
    while the row in view said "pass" (the undecided row was below the fold)."""
    lv = getattr(result, "capacity_level", None)
    if lv is not None:
        words = verdict_text(lv)
    else:  # a result without its levels: the summary's flag
        words = "pass" if (result.capacity or {}).get("decided", True) else "undecided: pass"
    if words == "pass":
        return []
    return [Content.assemble((f"its row {CAPACITY_MARK} reads ", "dim"), (f"“{words}”", "bold $warning"),
                             (": a cap came before its windows agreed; judged on its estimates", "dim"))]


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


class LevelTable(DataTable):
    """The level table; it picks its columns again when its width changes.
    Its rows are its cursor, so → and ← (a horizontal scroll of a table that
    fits) turn its pages of columns instead, where there are more."""

    @property
    def view(self) -> CapacityView | None:
        return next((a for a in self.ancestors if isinstance(a, CapacityView)), None)

    def on_resize(self) -> None:
        if self.view is not None:
            self.view.fit_table()

    def action_cursor_right(self) -> None:
        if self.view is None or not self.view.turn_page(1):
            super().action_cursor_right()

    def action_cursor_left(self) -> None:
        if self.view is None or not self.view.turn_page(-1):
            super().action_cursor_left()


# Below this many columns the chart and the table take turns (ctrl+t): the
# table needs the whole width of an 80-column terminal for its verdict and goodput.
NARROW_VIEW = 116


class CapacityView(Vertical):
    """The answer on top (the capacity first, where an 80x24 terminal shows
    it without scrolling), then the running level, then the chart beside the
    table of levels (ours beside vLLM's own p99s; narrow, one or the other),
    and a note where ours and vLLM's differ."""

    _percentile = 99
    _limit_ms: float | None = None
    rate = False  # the levels are request rates (open loop)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.levels: list[Any] = []
        self.capacity: float | None = None
        self.columns: list[str] = []
        self._widths: dict[str, int] = {}
        self.pages: list[list[str]] = []  # the columns, in pages that fit the table's width
        self.page = 0
        self.final = False  # the answer is in: its box carries the gap's cause, not the note below

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="pf-cap-result-box"):
            yield Static("", id="pf-cap-result")
        yield Static("", id="pf-cap-progress")
        with Horizontal(id="pf-cap-body"):
            yield CapacityChart(id="pf-cap-chart")
            yield LevelTable(id="pf-cap-levels", cursor_type="row", zebra_stripes=True)
        yield Static("", id="pf-cap-gap")

    def on_mount(self) -> None:
        self.query_one("#pf-cap-result-box").border_title = "capacity"
        self._title()
        self.fit_table()
        self.show_progress(None)

    def on_resize(self) -> None:
        narrow = self.size.width < NARROW_VIEW
        if narrow != self.narrow:
            self.set_class(narrow, "-narrow")
            self._show_gaps(self.levels)  # the note's short form, or its long one
        self._size_answer()

    def _size_answer(self) -> None:
        """The answer box as tall as the pane allows once the level table has
        room for its rows (up to 8): at 160x48 the answer's record line sat
        under a scroll bar in a 6-line box, with the screen's lower half free."""
        table = max(6, min(len(self.levels), 8) + 3)  # its rows, a header, a border
        below = (2 if self.query_one("#pf-cap-progress").has_class("-visible") else 0) + (
            6 if self.query_one("#pf-cap-gap").has_class("-visible") else 0)
        self.query_one("#pf-cap-result-box").styles.max_height = max(8, self.size.height - table - below)

    @property
    def narrow(self) -> bool:
        return self.has_class("-narrow")

    def toggle_chart(self) -> None:
        """Narrow: the chart in the table's place, or back."""
        self.toggle_class("-show-chart")

    def _title(self) -> None:
        table = self.query_one("#pf-cap-levels", DataTable)
        table.border_title = f"levels by load · {CAPACITY_MARK} the answer's"
        hidden = len(LEVEL_COLUMNS) - len(self.columns)
        if len(self.pages) < 2:
            table.border_subtitle = ""
        elif self.page == 0:
            table.border_subtitle = f"→ {hidden} more column(s)"
        else:
            table.border_subtitle = f"columns {self.page + 1}/{len(self.pages)} · ← →"

    def turn_page(self, step: int) -> bool:
        """The next (or previous) page of columns; False where there is none."""
        page = self.page + step
        if not 0 <= page < len(self.pages):
            return False
        table = self.query_one("#pf-cap-levels", DataTable)
        row = table.cursor_row
        self.page = page
        self.fit_table()
        table.move_cursor(row=row, animate=False)  # the row read stays under the cursor
        return True

    def _labels(self) -> dict[str, str]:
        return {key: ("req/s sent" if key == "concurrency" and self.rate else label) for key, label in LEVEL_COLUMNS}

    def fit_table(self, force: bool = False) -> None:
        """Pick the columns that fit the table's width (those of the rows
        shown), and fill it."""
        table = self.query_one("#pf-cap-levels", DataTable)
        width = table.size.width - 4  # its border, and room for its scroll bar
        mark = capacity_row(self.levels, self.capacity)
        rows = [level_cells(lv, i == mark) for i, lv in enumerate(self.levels)]
        self.pages = column_pages(width, self._labels(), rows) if width > 0 else [[LEVEL_COLUMNS[0][0]]]
        self.page = min(self.page, len(self.pages) - 1)
        columns = self.pages[self.page]
        labels = page_labels(columns, self._labels())
        # Each column as wide as its label and its widest cell, set here rather than measured by the DataTable
        # on its next idle pass: a frame drawn before that pass kept its rows cut at the labels' widths
        # (Textual caches the rendered rows), so a busy box showed "76.0 (9.4×)" as "76.0 (9." until the next level.
        widths = {key: column_width(key, labels, rows) for key in columns}
        if columns != self.columns or widths != self._widths or force:
            self.columns, self._widths = columns, widths
            table.clear(columns=True)
            for key in columns:
                table.add_column(labels[key], key=key, width=widths[key])
        self._title()
        self._fill(rows)

    def _fill(self, rows: list[dict[str, Any]]) -> None:
        table = self.query_one("#pf-cap-levels", DataTable)
        table.clear()
        order = row_order(self.levels)
        for i in order:  # keyed by order: a rate search's levels have no concurrency
            table.add_row(*(rows[i][key] for key in self.columns), key=f"level-{i}")
        mark = capacity_row(self.levels, self.capacity)
        if mark is not None:  # the answer's row in view, with the other looks at its load beside it
            table.move_cursor(row=order.index(mark), animate=False)

    def reset(self, slo: Sequence[Any], note: Content | str, rate: bool = False) -> None:
        """A new search under `slo` (slo.Objective): an empty chart whose
        TTFT axis is the percentile the SLO judges, with its limit; `rate`:
        its levels are request rates (req/s), not concurrencies."""
        ttft = next((o for o in slo if o.metric == "ttft"), None)
        self._percentile = ttft.percentile if ttft else 99
        self._limit_ms = ttft.limit_s * 1000.0 if ttft else None
        self.rate = rate
        self.levels, self.capacity = [], None
        self.page, self.final = 0, False
        self.fit_table(force=True)
        self.show_progress(None)
        self._show_gaps([])
        self.query_one(CapacityChart).show([], self._limit_ms, self._percentile, empty="waiting for the first level")
        self.say(note)

    def show_levels(self, levels: Sequence[Any], capacity: float | None = None, final: bool = False) -> None:
        """Redraw the curve and the table from the levels measured so far;
        `capacity`: the load (concurrency, or rate) settled on so far;
        `final`: the search's answer (whose box says where ours and vLLM's differ)."""
        self.levels, self.capacity, self.final = list(levels), capacity, final
        self.query_one(CapacityChart).show([CapacityCurve("this server", list(levels), capacity)],
                                           self._limit_ms, self._percentile)
        self.fit_table()
        self._show_gaps(levels)
        self._size_answer()

    def show_progress(self, event: dict[str, Any] | None, level: int | None = None, load: str = "") -> None:
        """The running level's progress line (hidden when `level` is None:
        no level runs)."""
        box = self.query_one("#pf-cap-progress", Static)
        box.set_class(level is not None, "-visible")
        box.update(describe_progress(event, level, load) if level is not None else "")

    def _show_gaps(self, levels: Sequence[Any]) -> None:
        note = None if self.final else describe_gaps(levels, short=self.narrow)
        box = self.query_one("#pf-cap-gap", Static)
        box.update(note or "")
        box.set_class(note is not None, "-visible")

    def say(self, content: Content | str, error: bool = False) -> None:
        """The answer box: its first line (the capacity) in view."""
        box = self.query_one("#pf-cap-result", Static)
        box.update(content)
        box.set_class(error, "-error")
        self.query_one("#pf-cap-result-box", VerticalScroll).scroll_home(animate=False)
