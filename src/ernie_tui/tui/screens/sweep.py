"""`w`: the preset sweep. The articles' comparison table, measured by the tool.

Choose presets and the burst; the sweep then, for each preset, runs
preflight (a preset that fails it is recorded and never launched), starts
the server, waits until it is ready, runs the burst, stops it and waits until
the engine is gone, then the next one. With repeat R the presets run in
rotated order R times and each figure is the median with its min–max range.

Capacity mode (the "capacity search (SLO)" box, `ernie-tui sweep --capacity`):
each preset gets a capacity search under the SLO typed in instead of a
burst, the table ranks presets by goodput at the SLO, and a chart draws every
preset's curve (output tok/s against TTFT p99, a point per level, as levels
finish) with the Pareto front marked: the presets whose goodput and TTFT p99
no other preset beats on both (engine_ctl.pareto).

A capacity sweep of two or more presets is paired (control/paired_sweep.py),
as `sweep --capacity` is: the repeat field is then its duel rounds (3 by
default, at least 2), and its record's repeat is the rounds it ran. The bar
and the phase line count what the sweep does (tui/sweep_progress.py).

The layout (issue 59: at 80x24 the form had the screen and the answer was
under it): before the first sweep the form has the screen; once one starts
the form goes (ctrl+f brings it back) and from the top come the phase line
(then the Done line), the bar, the notes (a paired sweep's ranking first,
then its verdicts, the drift), then the table; the chart stands beside the
table where there are the columns and rows for an axis that reads, in its
place on ctrl+t where only the rows are there, and is hidden below that.

The sweep starts and stops its own servers, so it refuses to start while
the dashboard's own server runs (`is_serving`). `run_sweep` is blocking: it
runs in a thread worker that only posts the Messages below; rows appear in
the table as each preset finishes. x or ctrl+c cancels: the server being
measured is stopped and the rows measured so far are kept (and can be
exported). The screen cannot be closed while a sweep runs, so no server is
left behind unwatched; if the app quits anyway, unmounting the screen
cancels the sweep and its thread stops the server before the process ends.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.css.scalar import Scalar
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Checkbox, DataTable, Input, Label, ProgressBar, SelectionList, Static
from textual.widgets.selection_list import Selection

from ernie_tui import paths
from ernie_tui.engine_ctl.control import (
    CAPACITY_COLUMNS,
    COLUMNS,
    DEFAULT_ROUNDS,
    CapacitySweep,
    SweepOptions,
    SweepPlan,
    SweepRow,
    SweepRun,
    cell,
    export_sweep,
    fold,
    run_paired_sweep,
    run_sweep,
    speed_moved_note,
)
from ernie_tui.engine_ctl.launch import detect_machine, gpus_needed
from ernie_tui.engine_ctl.load import (
    BurstConfig,
    RequestSettings,
    RunStoreError,
    auto_procs,
    front_of_rows,
    limit_ms,
    save_run,
)
from ernie_tui.presets import PresetError
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import SweepFinished, SweepLevelDone, SweepProgress, SweepRunDone
from ernie_tui.tui.sweep_progress import SweepSteps
from ernie_tui.tui.sweep_results import done_line, home_short, measured, record_meta, verdict_lines
from ernie_tui.tui.widgets.capacity_form import CapacityForm
from ernie_tui.tui.widgets.charts import FRONT_MARKER, CapacityChart, CapacityCurve
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.form import read_int

EXPORT_SUFFIXES = (".md", ".csv", ".json")

HEAD = Content.assemble(("Preset sweep ", "bold"), ("each preset: preflight → start → ready → burst or capacity "
                                                    "search → stop; the sweep runs its own servers", "dim"))
REPEAT_LABEL, ROUNDS_LABEL = "repeat R", "duel rounds"
# The chart beside the table needs this many columns (the table keeps 64
# for its first columns) and, beside it or in its place (ctrl+t), this many
# rows: squeezed to a few rows its y-axis came out inverted, 2353.6 above
# 4707.3, with no curve (issue 59); below them it is hidden.
CHART_BESIDE_WIDTH = 120
CHART_MIN_HEIGHT = 12
# From this many rows the form (ctrl+f, after a sweep) shares the screen with
# the results; below, it has the screen to itself until ctrl+f again.
ROOMY_HEIGHT = 40

# The table on screen leads with what a person compares; the exports keep
# sweep.COLUMNS' order (the articles' table).
_FIRST = ("preset", "status", "output_tps", "vs_best", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "peak_memory_gib",
          "kv_usage_peak_pct")
TABLE_COLUMNS = [c for key in _FIRST for c in COLUMNS if c[0] == key] + [c for c in COLUMNS if c[0] not in _FIRST]

# Capacity mode: the capacity, goodput and latency there first, then the
# Pareto front column ("front"), then the rest of sweep.CAPACITY_COLUMNS.
# The rank and vs best right after the status: they are the sweep's answer (a paired sweep's from its duels),
# and an 80-column terminal shows them beside the capacity; ← → scrolls to the rest.
_CAP_FIRST = ("preset", "status", "rank", "vs_best", "capacity_concurrency", "goodput_output_tps", "ttft_p99_ms",
              "itl_p99_ms", "goodput_rps")
CAPACITY_TABLE_COLUMNS = ([c for key in _CAP_FIRST for c in CAPACITY_COLUMNS if c[0] == key] + [("front", "Pareto")]
                          + [c for c in CAPACITY_COLUMNS if c[0] not in _CAP_FIRST])
# A rate search (open loop): the capacity is a request rate.
RATE_TABLE_COLUMNS = [("capacity_rate", "capacity (req/s)") if key == "capacity_concurrency" else (key, label)
                      for key, label in CAPACITY_TABLE_COLUMNS]



# -- pure helpers ----------------------------------------------------------------------

def short_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def cannot_run_here(preset, machine) -> str | None:
    """Why `preset` cannot run on `machine` (preflight's machine facts), in a
    few words, or None: a preset written for more GPUs than there are."""
    if machine is None:
        return None
    try:
        need = gpus_needed(preset)
    except (TypeError, ValueError):
        return None
    if need <= 1:
        return None
    if machine.platform == "cpu":
        return f"needs {need} GPUs: this machine has none (CPU)"
    if machine.gpu_count < need:
        return f"needs {need} GPUs: this machine has {machine.gpu_count}"
    return None


class MachineFacts(Message):
    """The machine the sweep would run on (detected in a thread: ~1 s the first time)."""

    def __init__(self, machine) -> None:
        super().__init__()
        self.machine = machine


# The repeat field of a paired sweep is its duel rounds: by default as many as
# `sweep --capacity` runs, and at least 2, as the guide says (one round gives
# a pair no interval). The field used to show 1 while the sweep ran 3 rounds
# and its record said "repeat 1" (issue 59).
PAIRED_ROUNDS = DEFAULT_ROUNDS
MIN_PAIRED_ROUNDS = 2


def is_paired(capacity: bool, chosen: int) -> bool:
    """A capacity sweep of several presets is paired, as `sweep --capacity` is."""
    return capacity and chosen >= 2


def paired_rounds(capacity: CapacitySweep | None, names: list[str], repeat: int) -> int | None:
    """A paired sweep's duel rounds (the repeat field); None: one preset after another."""
    return repeat if is_paired(capacity is not None, len(names)) else None


def status_text(status: str) -> Text:
    style = "bold green" if status == "ok" else "yellow" if status.startswith(("ok ", "cancelled")) else "bold red"
    return Text(status, style=style)


def default_export_path() -> str:
    return f"sweep-{time.strftime('%Y%m%d-%H%M')}.md"


class SweepScreen(ShowsWorkerFailures, Screen[None]):
    """`book`: the presets to choose from; `model`: the model dir for presets
    that name none; `is_serving()`: True while the dashboard's own server
    runs (the sweep then refuses to start); `api_key` is kept for symmetry
    with the probe pane: each preset's server gets its own key from the
    preset's api_key_env, which run_sweep reads."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+r", "start", "Start"),
        Binding("ctrl+c", "cancel", "Cancel", priority=True),
        Binding("x", "cancel", "Cancel"),
        Binding("ctrl+s", "export", "Export"),
        Binding("ctrl+f", "toggle_form", "Form"),
        Binding("ctrl+t", "toggle_chart", "Chart"),
    ]

    def __init__(self, book, model: str | None = None, api_key: str | None = None, *,
                 is_serving: Callable[[], bool] | None = None, machine: Any = None,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.book = book
        self.model = model
        self.api_key = api_key
        self.is_serving = is_serving or (lambda: False)
        self.machine = machine  # launch.Machine; None: detected when the screen mounts
        self.running = False
        self.cancelling = False
        self.runs: list[SweepRun] = []
        self.rows: list[SweepRow] = []
        self.names: list[str] = []
        self.repeat = 1
        self.config: BurstConfig | None = None
        self.capacity: CapacitySweep | None = None  # the capacity search of the sweep running or shown
        self.rounds: int | None = None  # a paired sweep's duel rounds; None: sequential
        self.paired: Any = None  # its PairedResult once it ends (the verdicts shown and exported)
        self.curves: dict[tuple[str, int], list[Any]] = {}  # (preset, repeat) -> its levels, as they finish
        self.front: set[str] = set()  # presets on the Pareto front
        self.last_error: str | None = None
        self.record: str | None = None
        self.log_dir: str | None = None  # the finished sweep's server logs
        self._cancel: threading.Event | None = None
        self._eta_at: float | None = None
        self._table_capacity = False
        self._t0: float | None = None
        self.steps: SweepSteps | None = None  # the sweep's steps, done and to do (the bar, the phase line)
        self._snap: tuple[int, int, str] = (0, 0, "")  # its latest (done, total, phase line)
        self._repeat_default = "1"  # what the screen last put in the repeat field (the sweep's default)

    # -- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(HEAD, id="sw-head")
        yield Static("", id="sw-refuse")
        with Horizontal(id="sw-top"):
            with Vertical(id="sw-left"):
                yield SelectionList[str](*self._selections(), id="sw-presets", compact=True)
                yield Static("", id="sw-desc")
            with VerticalScroll(id="sw-right"):  # scrolls where the form is taller than its room (80x24)
                with Container(classes="sw-row"):  # a grid: its fields wrap where the form is narrow
                    yield self._field("N requests", "sw-n", "100", "-burst-only")
                    yield self._field("L_min tok", "sw-lmin", "30")
                    yield self._field("L_max tok", "sw-lmax", "300")
                    yield self._field("conc. C", "sw-c", "4", "-burst-only")
                    yield self._field("max_tokens", "sw-max", "128")
                    yield self._field(REPEAT_LABEL, "sw-repeat", "1")
                yield CapacityForm("sw-cap", id="sw-cap-form", classes="-capacity-only")
                yield Checkbox("capacity search (SLO) per preset, ranked by goodput", False, id="sw-capacity",
                               compact=True)
                with Horizontal(classes="sw-buttons"):
                    yield Button("Start (ctrl+r)", id="sw-start", variant="primary", compact=True)
                    yield Button("Cancel (x)", id="sw-cancel", compact=True, disabled=True)
        # Where the sweep is, then its answer, then the table: in that order from the top, so that an 80x24
        # terminal shows the Done line, the verdict and the ranking without scrolling (issue 59).
        with Vertical(id="sw-state"):
            yield Static(Content.styled("choose presets (space), then ctrl+r", "dim"), id="sw-phase")
            with Horizontal(classes="sw-bar", id="sw-overall-row"):
                yield Label("runs", id="sw-overall-label")
                yield ProgressBar(total=None, id="sw-overall", show_eta=False)
            with Horizontal(classes="sw-bar", id="sw-burst-row"):
                yield Label("burst")
                yield ProgressBar(total=None, id="sw-burst", show_eta=False)
        with VerticalScroll(id="sw-notes-box"):
            yield Static("", id="sw-notes")
        with Horizontal(id="sw-results"):
            yield DataTable(id="sw-table", cursor_type="row", zebra_stripes=True)
            yield CapacityChart(id="sw-chart")
        with Horizontal(id="sw-export"):
            yield Label("export to (.md .csv .json)")
            yield Input(default_export_path(), id="sw-path", compact=True)
            yield Button("Export (ctrl+s)", id="sw-export-btn", compact=True)
        yield KeyFooter()

    @staticmethod
    def _field(label: str, wid: str, value: str, classes: str = "", kind: str = "integer") -> Vertical:
        return Vertical(Label(label, id=f"{wid}-label"), Input(value, type=kind, id=wid, compact=True),
                        classes=f"sw-field {classes}")

    def _selections(self) -> list[Selection[str]]:
        out = []
        for name in self.book.names():
            preset = self.book.get(name)
            args = preset.key_args()
            why = cannot_run_here(preset, self.machine)
            prompt = Text.assemble(name, (f"  {args}" if args else "", "dim"),
                                   (f"  ✖ {why}" if why else "", "bold red"))
            out.append(Selection(prompt, name, False))
        return out

    @work(thread=True, group="sweep-machine", exit_on_error=False)
    def _detect_machine(self) -> None:
        self.post_message(MachineFacts(detect_machine()))

    @on(MachineFacts)
    @drop_when_torn_down
    def _machine_known(self, message: MachineFacts) -> None:
        self.machine = message.machine
        self._relist()

    def _relist(self) -> None:
        """The preset list again, now saying which cannot run on this machine
        (the selection kept)."""
        presets = self.query_one("#sw-presets", SelectionList)
        chosen = set(presets.selected)
        highlighted = presets.highlighted
        presets.clear_options()
        presets.add_options(self._selections())
        for name in chosen:
            presets.select(name)
        if highlighted is not None:
            presets.highlighted = highlighted

    def on_mount(self) -> None:
        self.call_after_refresh(self._fit)
        self.query_one("#sw-left").border_title = "presets (space selects)"
        table = self.query_one("#sw-table", DataTable)
        table.border_title = "results"
        self._columns(capacity=False)
        self.query_one("#sw-chart", CapacityChart).show([], empty="the curves appear as levels finish")
        for row in self.query(".sw-bar"):
            row.display = False
        self.query_one("#sw-presets", SelectionList).focus()
        self._show_notes()
        if self.machine is None:
            self._detect_machine()
        self._update_refusal()
        self.set_interval(1.0, self._tick)

    def on_unmount(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    @on(SelectionList.SelectionHighlighted, "#sw-presets")
    def _highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        name = event.selection.value
        try:
            preset = self.book.get(name)
        except PresetError:
            self.query_one("#sw-desc", Static).update("")
            return
        why = cannot_run_here(preset, self.machine)
        self.query_one("#sw-desc", Static).update(Content.assemble(
            (f"Cannot run here: {why}. " if why else "", "bold $error"), preset.description or ""))

    # -- refusing while the dashboard serves --------------------------------------------------
    def _serving(self) -> bool:
        return bool(self.is_serving())

    def _update_refusal(self) -> bool:
        serving = self._serving() and not self.running
        banner = self.query_one("#sw-refuse", Static)
        banner.set_class(serving, "-visible")
        if serving:
            banner.update(Content.assemble(
                ("The dashboard's server is running. ", "bold"),
                "The sweep starts and stops its own servers, one preset after another, and would compete "
                "with it for memory and ports: stop it first (escape, then x on the main screen)."))
        return serving

    @drop_when_torn_down
    def _tick(self) -> None:
        self._update_refusal()
        if self.running:
            self._show_phase()

    # -- starting -------------------------------------------------------------------------------
    def _read_config(self) -> tuple[BurstConfig, int]:
        q = self.query_one
        config = BurstConfig(n=read_int(q("#sw-n", Input), "N"), min_tokens=read_int(q("#sw-lmin", Input), "L_min"),
                             max_tokens_in=read_int(q("#sw-lmax", Input), "L_max"),
                             concurrency=read_int(q("#sw-c", Input), "C"),
                             max_tokens=read_int(q("#sw-max", Input), "max_tokens"))
        config.validate()
        if self._paired_form():
            repeat = read_int(q("#sw-repeat", Input), ROUNDS_LABEL)
            if repeat < MIN_PAIRED_ROUNDS:
                raise ValueError(f"duel rounds must be at least {MIN_PAIRED_ROUNDS}: one round gives a pair's "
                                 f"verdict no interval ({PAIRED_ROUNDS} is `sweep --capacity`'s default)")
        else:
            repeat = read_int(q("#sw-repeat", Input), REPEAT_LABEL)
            if repeat < 1:
                raise ValueError("repeat R must be at least 1")
        return config, repeat

    # -- the repeat field: the rounds of one after another, or a paired sweep's duel rounds ------------
    def _paired_form(self) -> bool:
        """The form, as filled in, asks for a paired sweep."""
        return is_paired(self.query_one("#sw-capacity", Checkbox).value,
                         len(self.query_one("#sw-presets", SelectionList).selected))

    def _repeat_mode(self) -> None:
        """Name the repeat field for the sweep the form asks for, and give it
        that sweep's default where it still holds the other's untouched."""
        paired = self._paired_form()
        self.query_one("#sw-repeat-label", Label).update(ROUNDS_LABEL if paired else REPEAT_LABEL)
        field = self.query_one("#sw-repeat", Input)
        default = str(PAIRED_ROUNDS) if paired else "1"
        if field.value.strip() == self._repeat_default:  # not typed over: the sweep's own default
            field.value = self._repeat_default = default

    @on(SelectionList.SelectedChanged, "#sw-presets")
    def _chosen_changed(self) -> None:
        if not self.running:
            self._repeat_mode()

    def _read_capacity(self) -> CapacitySweep | None:
        """The capacity search of each preset when capacity mode is on,
        checked as `sweep --capacity` checks its options (ValueError)."""
        if not self.query_one("#sw-capacity", Checkbox).value:
            return None
        slo, search, rules = self.query_one(CapacityForm).search()
        procs = auto_procs()  # as the command line's --client-procs auto
        return CapacitySweep(slo=slo, search=search, rules=rules,
                             settings=RequestSettings(client_procs=procs) if procs > 1 else None)

    @on(Checkbox.Changed, "#sw-capacity")
    def _mode_changed(self, event: Checkbox.Changed) -> None:
        if self.running:  # the sweep under way keeps its mode
            with event.checkbox.prevent(Checkbox.Changed):
                event.checkbox.value = self.capacity is not None
            self.notify("wait for the sweep to end (or x) before switching", timeout=3)
            return
        self.set_class(event.value, "-capacity")
        self._repeat_mode()
        self.refresh_bindings()
        if not self.runs:
            self._columns(capacity=event.value)

    def _table_columns(self, capacity: bool) -> list[tuple[str, str]]:
        if not capacity:
            return TABLE_COLUMNS
        search = self.capacity.search if self.capacity is not None else None
        return RATE_TABLE_COLUMNS if search is not None and search.rate else CAPACITY_TABLE_COLUMNS

    def _columns(self, capacity: bool) -> None:
        table = self.query_one("#sw-table", DataTable)
        table.clear(columns=True)
        for key, label in self._table_columns(capacity):
            table.add_column(label, key=key)
        table.add_column("note", key="note")
        self._table_capacity = capacity
        self.call_after_refresh(self._hint_columns)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self, passes: int = 4) -> None:
        """The rows shared between the notes and the table; the chart beside
        the table where there is room for both, else hidden (ctrl+t puts it
        in the table's place where it has the rows); then the table's hint
        of columns past its edge. Read from the sizes of the last layout,
        which a change here (or a message just handled) makes stale: so it
        runs again after the next one, until nothing changes."""
        if not self.is_mounted:
            return
        before = (self.classes, self.query_one("#sw-notes-box").styles.max_height)
        row = self.query_one(".sw-row")
        columns = max(2, (row.size.width + 1) // 15)  # 14 a field, 1 between, as the capacity form's
        if row.size.width and row.styles.grid_size_columns != columns:
            row.styles.grid_size_columns = columns
        results = self.query_one("#sw-results")
        self._share_rows(results)
        tall = results.size.height >= CHART_MIN_HEIGHT
        beside = tall and self.size.width >= CHART_BESIDE_WIDTH
        self.set_class(tall, "-chart-room")
        self.set_class(self.size.height >= ROOMY_HEIGHT, "-roomy")
        self.set_class(beside, "-chart-beside")
        if beside or not tall:
            self.set_class(False, "-chart-only")
        self.refresh_bindings()
        if passes > 1 and (self.classes, self.query_one("#sw-notes-box").styles.max_height) != before:
            self.call_after_refresh(self._fit, passes - 1)
        else:
            self.call_after_refresh(self._hint_columns)

    def _share_rows(self, results: Widget) -> None:
        """The rows under the Done line, shared: the table keeps its rows
        (and the chart's, where it stands beside it), the notes (the
        answer) get the rest and scroll past that."""
        box = self.query_one("#sw-notes-box")
        if not (box.display and results.display and self.has_class("-ran")):
            return
        room = box.outer_size.height + results.outer_size.height
        table = self.query_one("#sw-table", DataTable)
        keep = max(5, table.row_count + 4)  # its border, header and horizontal scroll bar
        if self.has_class("-capacity") and self.size.width >= CHART_BESIDE_WIDTH:
            keep = max(keep, CHART_MIN_HEIGHT)
        rows = max(3, room - keep)
        if box.styles.max_height != Scalar.parse(str(rows)):
            box.styles.max_height = rows

    def _hint_columns(self) -> None:
        """Name the columns right of the table's edge (a wide table was cut
        at '… KV tokens  max' with nothing saying more were there)."""
        if not self.is_mounted:
            return
        table = self.query_one("#sw-table", DataTable)
        room = table.scrollable_content_region.width + int(table.scroll_x)
        x, hidden = 0, []
        for column in table.columns.values():
            x += column.get_render_width(table)
            if x > room:
                hidden.append(str(column.label))
        names = ", ".join(hidden[:3]) + (", …" if len(hidden) > 3 else "")
        table.border_subtitle = f"← → shows {len(hidden)} more: {names}" if hidden else ""

    def _say(self, content: Content | str, error: bool = False) -> None:
        phase = self.query_one("#sw-phase", Static)
        if error and isinstance(content, str):
            content = Content.styled(content, "bold $error")
        phase.update(content)

    def start(self) -> bool:
        """Start the sweep with the chosen presets. False (and the reason on
        screen) when it cannot."""
        if self.running:
            self.notify("a sweep is running: x cancels it", timeout=3)
            return False
        if self._update_refusal():
            self._say("Not started: the dashboard's own server is running (see above).", error=True)
            self.last_error = "serving"
            return False
        names = list(self.query_one("#sw-presets", SelectionList).selected)
        if not names:
            self._say("Choose at least one preset (space in the list).", error=True)
            self.last_error = "no presets"
            return False
        try:
            config, repeat = self._read_config()
            capacity = self._read_capacity()
            presets = [self.book.get(n) for n in names]
            for p in presets:
                p.resolve_model(self.model)  # a preset without a model is an error now, not mid-sweep
        except (ValueError, PresetError) as exc:
            self._say(f"Not started: {exc}", error=True)
            self.last_error = str(exc)
            return False
        self.last_error = None
        self._cancel = threading.Event()
        self.begin(names, repeat, config, capacity)
        self._worker(SweepPlan(presets, repeat), config, self._cancel, capacity, self.rounds, self.steps)
        return True

    def begin(self, names: list[str], repeat: int, config: BurstConfig, capacity: CapacitySweep | None) -> None:
        """The screen as a sweep of `names` starts: its steps, an empty
        table, the bars, the form away. (start() then runs its worker; a
        test hands the worker's messages to a screen begun so.)"""
        self.names, self.repeat, self.config, self.capacity = names, repeat, config, capacity
        self.runs, self.rows, self.record, self.log_dir = [], [], None, None
        self.curves, self.front = {}, set()
        self.running, self.cancelling = True, False
        self._t0 = time.monotonic()
        self._eta_at = None
        self.rounds = paired_rounds(capacity, names, repeat)
        self.paired = None
        self.steps = SweepSteps(names, repeat, self.rounds)
        self._snap = self._snapshot(self.steps)
        self._columns(capacity=capacity is not None)
        self._redraw_chart()
        for row in self.query(".sw-bar"):
            row.display = True
        self.query_one("#sw-burst-row").display = capacity is None  # a search's levels are in the phase line
        self.query_one("#sw-overall-label", Label).update("steps" if self.rounds else "runs")
        self.query_one("#sw-overall", ProgressBar).update(total=self.steps.total, progress=0)
        self.query_one("#sw-burst", ProgressBar).update(total=config.n, progress=0)
        self.query_one("#sw-notes", Static).update("")
        self._show_notes()
        # The form gives its room to the results while the sweep runs and after (ctrl+f brings it back).
        self.add_class("-ran")
        self.set_class(False, "-form")
        self._brief()
        self.query_one("#sw-table", DataTable).focus()
        self.call_after_refresh(self._fit)
        self._buttons()
        self._show_phase()

    @staticmethod
    def _snapshot(steps: SweepSteps) -> tuple[int, int, str]:
        """(steps done, steps in all, the phase line): taken where the events
        are fed, so a coalesced SweepProgress only drops an older snapshot."""
        return steps.done, steps.total, steps.line()

    @work(thread=True, group="sweep", exit_on_error=False)
    def _worker(self, plan: SweepPlan, config: BurstConfig, cancel: threading.Event,
                capacity: CapacitySweep | None = None, rounds: int | None = None,
                steps: SweepSteps | None = None) -> None:
        log_dir = paths.state_dir() / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S")
        done: list[SweepRun] = []
        steps = steps or SweepSteps([p.name for p in plan.presets], plan.repeat, rounds)

        def progress(ev: dict[str, Any]) -> None:
            # The sweeps call this one event at a time (the paired sweep under its lock): the steps are fed here.
            run = ev.get("run")
            steps.feed(ev, found=bool(run and (run.capacity_concurrency or run.capacity_rate)))
            snap = self._snapshot(steps)
            if ev.get("phase") == "done" and run is not None:
                done.append(run)
                self.post_message(SweepRunDone(run, {**{k: v for k, v in ev.items() if k != "run"}, "steps": snap}))
                return
            ce = ev.get("capacity_event") or {}
            if ce.get("event") == "level_done":  # a point of the preset's curve: never coalesced away
                self.post_message(SweepLevelDone(ev["preset"], ev.get("repeat", 0), ce["level"]))
            self.post_message(SweepProgress({**ev, "steps": snap}))

        error, paired = None, None
        options = SweepOptions(model=self.model, log_dir=log_dir)
        try:
            if rounds and capacity is not None:
                runs, paired = run_paired_sweep(plan.presets, config, options, capacity, rounds, progress, cancel)
                if paired.refused:  # they cannot share the machine: one after another, and the screen says why
                    error, paired = f"not paired: {paired.refused}; measured one preset after another", None
                    runs = run_sweep(plan, config, options, progress, cancel, capacity=capacity)
            else:
                runs = run_sweep(plan, config, options, progress, cancel, capacity=capacity)
        except Exception as exc:  # noqa: BLE001  run_sweep stops its server in `finally`; the pane shows what broke
            runs = done
            error = f"{type(exc).__name__}: {exc}"
        record = None
        if runs:
            body: dict[str, Any] = {"meta": record_meta([p.name for p in plan.presets], plan.repeat, config, runs,
                                                        capacity, paired), "runs": runs}
            if paired is not None:
                body["paired"] = paired.to_dict()
            try:
                rec = save_run("sweep", body, notes=" ".join(p.name for p in plan.presets))
                record = rec.id
            except (RunStoreError, OSError) as exc:
                error = (error + "; " if error else "") + f"the sweep's run record was not saved: {exc}"
        self.post_message(SweepFinished(runs, cancel.is_set(), error, record, str(log_dir), paired))

    def _meta(self) -> dict:
        return record_meta(self.names, self.repeat, self.config or BurstConfig(), self.runs, self.capacity,
                           self.paired)

    # -- progress ------------------------------------------------------------------------------
    @on(SweepProgress)
    @drop_when_torn_down
    def _progress(self, message: SweepProgress) -> None:
        if not self.running:
            return
        ev = message.event
        self._snap = ev.get("steps", self._snap)
        if ev.get("phase") == "preflight":
            eta = ev.get("eta_s")
            self._eta_at = time.monotonic() + eta if eta else None
            self.query_one("#sw-burst", ProgressBar).update(progress=0)
        if ev.get("phase") == "burst" and ev.get("burst_total"):
            self.query_one("#sw-burst", ProgressBar).update(total=ev["burst_total"], progress=ev.get("burst_done", 0))
        self._show_steps()
        self._show_phase()

    def _show_steps(self) -> None:
        done, total, _ = self._snap
        self.query_one("#sw-overall", ProgressBar).update(total=max(total, 1), progress=done)

    @on(SweepLevelDone)
    @drop_when_torn_down
    def _level_done(self, message: SweepLevelDone) -> None:
        if not self.running:
            return
        self.curves.setdefault((message.preset, message.repeat), []).append(message.level)
        self._redraw_chart()

    def _redraw_chart(self) -> None:
        """Every preset's curve (one per repeat), the Pareto front's marked."""
        capacity_at = {(r.preset, r.repeat): float(r.capacity_rate if r.capacity_rate is not None
                                                   else r.capacity_concurrency or 0) for r in self.runs
                       if r.capacity_rate or r.capacity_concurrency}
        rounds = self.repeat > 1 and self.rounds is None  # a paired sweep has one search per preset
        curves = [CapacityCurve(f"{name} r{repeat + 1}" if rounds else name, levels,
                                capacity_at.get((name, repeat)), front=name in self.front)
                  for (name, repeat), levels in self.curves.items()]
        limit = limit_ms(self.capacity.slo, "ttft", 99) if self.capacity else None
        chart = self.query_one("#sw-chart", CapacityChart)
        note = f" · {FRONT_MARKER} Pareto front: {', '.join(sorted(self.front))}" if self.front else ""
        chart.show(curves, limit, 99, empty="the curves appear as levels finish", note=note)

    @on(SweepRunDone)
    @drop_when_torn_down
    def _run_done(self, message: SweepRunDone) -> None:
        self.runs.append(message.run)
        self._snap = message.event.get("steps", self._snap)
        self._show_steps()
        self._refresh_table()
        self._show_phase()

    @on(SweepFinished)
    @drop_when_torn_down
    def _finished(self, message: SweepFinished) -> None:
        self.running = False
        self.cancelling = False
        self.runs = list(message.runs)
        self.record = message.record
        self.log_dir = message.log_dir
        self.paired = message.paired
        if self.paired is None:
            self.rounds = None  # not paired after all (refused, or it broke): one preset after another
        self._refresh_table()
        self.call_after_refresh(self._fit)
        self._buttons()
        self._update_refusal()
        if self.steps is not None:  # the worker has ended: its steps are read here alone now
            self.steps.finish(message.cancelled)
            self._snap = self._snapshot(self.steps)
        self._show_steps()
        self._say(done_line(self.runs, message, short_duration(time.monotonic() - self._t0) if self._t0 else "–"))
        self.query_one("#sw-burst-row").display = False
        self._brief()

    def _show_phase(self) -> None:
        if not self.running:
            return
        line = self._snap[2]
        extra = []
        if self._t0 is not None:
            extra.append(f"elapsed {short_duration(time.monotonic() - self._t0)}")
        if self._eta_at is not None:
            extra.append(f"ETA {short_duration(self._eta_at - time.monotonic())}")
        text = Content.assemble(("cancelling: stopping the server …  " if self.cancelling else "", "bold $warning"),
                                (line, "bold"), ("   " + " · ".join(extra) if extra else "", "dim"))
        self._say(text)

    def _refresh_table(self) -> None:
        paired = self.paired.to_dict() if self.paired is not None else None
        self.rows = fold(self.runs, self.names or [r.preset for r in self.runs], paired=paired)
        capacity = self._table_capacity
        self.front = front_of_rows(self.rows) if capacity else set()
        table = self.query_one("#sw-table", DataTable)
        table.clear()
        moved = {row.preset: speed_moved_note(row) for row in self.rows}
        for row in self.rows:
            cells: list[Any] = []
            for key, _ in self._table_columns(capacity):
                if key == "front":
                    cells.append(Text(FRONT_MARKER, style="bold green") if row.preset in self.front else "")
                    continue
                # vs best as the exported table words it (fold): "not measured (why)" for a preset
                # compared with nothing, "not compared (why)" for one measured but in no pair.
                text = cell(row, key)
                if not measured(row) and key in ("status", "rank"):
                    # Compared with nothing: the status in a word (the notes say more), no rank.
                    text = row.status.split(":", 1)[0] if key == "status" else "–"
                cells.append(status_text(text) if key == "status" else text)
            cells.append(row.message or (Text("speed moved", style="bold yellow") if moved[row.preset] else ""))
            table.add_row(*cells, key=row.preset)
        self.call_after_refresh(self._hint_columns)
        notes = [Content.assemble((row.preset, "bold"), ": ", row.message)
                 for row in self.rows if row.status != "ok" and row.message]
        # A search that saw its server's speed move is that server's in its own minutes: said here as the
        # exported table says it, not only in each trial's record.
        notes += [Content.assemble((row.preset, "bold"), ": ", (note, "$warning"))
                  for row in self.rows if (note := moved[row.preset]) is not None]
        if self.paired is not None:  # the verdicts first: they are the answer a paired sweep gives
            notes = verdict_lines(self.paired.lines()) + notes
        if self.log_dir and not self.running:
            notes.append(Content.assemble(("Server logs: ", "dim"), home_short(self.log_dir)))
        self.query_one("#sw-notes", Static).update(Content("\n").join(notes))
        self._show_notes()
        if capacity:
            self._redraw_chart()

    # -- export -----------------------------------------------------------------------------------
    def export(self, path: str | None = None) -> Path | None:
        raw = (path or self.query_one("#sw-path", Input).value).strip()
        if not self.rows:
            self.notify("nothing to export yet: run a sweep first", severity="warning", timeout=4)
            return None
        if not raw:
            self.notify("type a path ending in .md, .csv or .json", severity="warning", timeout=4)
            return None
        target = Path(raw).expanduser()
        if target.suffix.lower() not in EXPORT_SUFFIXES:
            self.notify(f"the path must end in .md, .csv or .json, not {target.suffix or '(nothing)'}",
                        severity="error", timeout=6)
            return None
        try:
            export_sweep(self.rows, target, self._meta(), paired=self.paired)
        except (OSError, ValueError) as exc:
            self.notify(f"cannot write {target}: {exc}", severity="error", timeout=8)
            return None
        self.notify(f"wrote {target.resolve()}", timeout=5)
        return target

    # -- keys and buttons ------------------------------------------------------------------------------
    def _buttons(self) -> None:
        self.query_one("#sw-start", Button).disabled = self.running
        self.query_one("#sw-cancel", Button).disabled = not self.running
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.running
        if action == "toggle_form":
            return self.has_class("-ran")  # before the first sweep the form is all there is
        if action == "toggle_chart":
            return (self.has_class("-capacity", "-ran", "-chart-room") and not self.has_class("-chart-beside")
                    or self.has_class("-chart-only"))
        return True

    def action_toggle_form(self) -> None:
        """The form back above the results (to change it and run again), or away."""
        self.toggle_class("-form")
        self._brief()
        if self.has_class("-form"):
            self.query_one("#sw-presets", SelectionList).focus()
        else:
            self.query_one("#sw-table", DataTable).focus()
        self.call_after_refresh(self._fit)

    def action_toggle_chart(self) -> None:
        """The chart in the table's place, or back; only where it has the rows
        to draw an axis that reads."""
        if self.query_one("#sw-results").size.height < CHART_MIN_HEIGHT and not self.has_class("-chart-only"):
            self.notify(f"the chart needs {CHART_MIN_HEIGHT} rows for the results: a taller terminal",
                        severity="warning", timeout=4)
            return
        self.toggle_class("-chart-only")

    def _brief(self) -> None:
        """The head line: what the sweep is, while the form is away; else
        what a sweep does."""
        head = self.query_one("#sw-head", Static)
        if not self.has_class("-ran") or self.has_class("-form"):
            head.update(HEAD)
            return
        if self.capacity is not None:
            how = f"capacity under {' '.join(str(o) for o in self.capacity.slo)}"
        else:
            c = self.config or BurstConfig()
            how = f"burst N={c.n} C={c.concurrency}"
        rounds = f"{self.rounds} duel rounds (paired)" if self.rounds else (
            f"repeat {self.repeat}" if self.repeat > 1 else "")
        head.update(Content.assemble(("Preset sweep ", "bold"), (", ".join(self.names), "bold"),
                                     (" · " + " · ".join(x for x in (how, rounds) if x), "dim"),
                                     ("  ctrl+f: the form", "dim")))

    def _show_notes(self) -> None:
        """The notes box only where there are notes."""
        notes = self.query_one("#sw-notes", Static)
        self.query_one("#sw-notes-box").set_class(not str(notes.content), "-empty")

    def action_start(self) -> None:
        self.start()

    def action_cancel(self) -> None:
        if self.running and self._cancel is not None and not self.cancelling:
            self._cancel.set()
            self.cancelling = True
            self._show_phase()

    def action_export(self) -> None:
        self.export()

    def action_close(self) -> None:
        if self.running:
            self.notify("a sweep is running: x cancels it (its server is stopped first), then escape closes",
                        severity="warning", timeout=5)
            return
        self.dismiss(None)

    @on(Button.Pressed, "#sw-start")
    def _start_pressed(self) -> None:
        self.start()

    @on(Button.Pressed, "#sw-cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    @on(Button.Pressed, "#sw-export-btn")
    def _export_pressed(self) -> None:
        self.export()

    @on(Input.Submitted, "#sw-path")
    def _path_submitted(self) -> None:
        self.export()
