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
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Input, Label, ProgressBar, SelectionList, Static
from textual.widgets.selection_list import Selection

from ernie_tui import paths
from ernie_tui.engine_ctl.control import (
    CAPACITY_COLUMNS,
    COLUMNS,
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
    sweep_meta,
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
    verdict_text,
)
from ernie_tui.presets import PresetError
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import SweepFinished, SweepLevelDone, SweepProgress, SweepRunDone
from ernie_tui.tui.widgets.capacity_form import CapacityForm
from ernie_tui.tui.widgets.capacity_view import describe_load, describe_progress
from ernie_tui.tui.widgets.charts import FRONT_MARKER, CapacityChart, CapacityCurve
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.form import read_int

EXPORT_SUFFIXES = (".md", ".csv", ".json")

# The table on screen leads with what a person compares; the exports keep
# sweep.COLUMNS' order (the articles' table).
_FIRST = ("preset", "status", "output_tps", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "peak_memory_gib",
          "kv_usage_peak_pct", "vs_best")
TABLE_COLUMNS = [c for key in _FIRST for c in COLUMNS if c[0] == key] + [c for c in COLUMNS if c[0] not in _FIRST]

# Capacity mode: the capacity, goodput and latency there first, then the
# Pareto front column ("front"), then the rest of sweep.CAPACITY_COLUMNS.
_CAP_FIRST = ("preset", "status", "capacity_concurrency", "goodput_output_tps", "goodput_rps", "ttft_p99_ms",
              "itl_p99_ms", "rank", "vs_best")
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


def describe_event(ev: dict[str, Any], repeat: int) -> str:
    """'[2/3] cpu-a (round 1/2): burst 40/100'."""
    where = f"[{ev.get('index', 0) + 1}/{ev.get('total', '?')}] {ev.get('preset', '?')}"
    if repeat > 1:
        where += f" (round {ev.get('repeat', 0) + 1}/{repeat})"
    phase = str(ev.get("phase", ""))
    if phase == "burst" and ev.get("burst_total"):
        phase = f"burst {ev.get('burst_done', 0)}/{ev['burst_total']} requests"
    elif phase == "capacity" and ev.get("capacity_event"):
        ce = ev["capacity_event"]
        if ce.get("event") == "level_done":
            lv = ce["level"]
            load = f"rate {lv.rate:g} req/s" if lv.rate is not None else f"concurrency {lv.concurrency}"
            phase = f"capacity search: {load} {verdict_text(lv)}, {lv.requests} requests"
        elif ce.get("event") == "level_progress":
            rate = ce.get("rate") is not None
            load = describe_load(ce["rate"] if rate else ce.get("concurrency"), rate)
            phase = "capacity search: " + describe_progress(ce, load=load).plain.removeprefix("level · ")
        else:
            rate = ce.get("rate") is not None
            phase = f"capacity search: {describe_load(ce['rate'] if rate else ce.get('concurrency'), rate)} …"
    elif phase == "done":
        phase = f"done: {ev.get('status', '?')}"
    return f"{where}: {phase}"


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


PAIRED_ROUNDS = 3  # a paired sweep's duel rounds when the repeat field asks for fewer than 2 (no interval)


def paired_rounds(capacity: CapacitySweep | None, names: list[str], repeat: int) -> int | None:
    """A capacity sweep of several presets is paired, as `sweep --capacity`
    is: its duel rounds (the repeat field, at least 2). None: sequential."""
    if capacity is None or len(names) < 2:
        return None
    return repeat if repeat >= 2 else PAIRED_ROUNDS


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
        self._cancel: threading.Event | None = None
        self._eta_at: float | None = None
        self._table_capacity = False
        self._t0: float | None = None
        self._last_event: dict[str, Any] = {}

    # -- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(Content.assemble(("Preset sweep ", "bold"),
                                      ("each preset: preflight → start → ready → burst or capacity search → "
                                       "stop; the sweep runs its own servers", "dim")), id="sw-head")
        yield Static("", id="sw-refuse")
        with Horizontal(id="sw-top"):
            with Vertical(id="sw-left"):
                yield SelectionList[str](*self._selections(), id="sw-presets", compact=True)
                yield Static("", id="sw-desc")
            with Vertical(id="sw-right"):
                with Horizontal(classes="sw-row"):
                    yield self._field("N requests", "sw-n", "100", "-burst-only")
                    yield self._field("L_min tok", "sw-lmin", "30")
                    yield self._field("L_max tok", "sw-lmax", "300")
                    yield self._field("conc. C", "sw-c", "4", "-burst-only")
                    yield self._field("max_tokens", "sw-max", "128")
                    yield self._field("repeat R", "sw-repeat", "1")
                yield CapacityForm("sw-cap", id="sw-cap-form", classes="-capacity-only")
                yield Checkbox("capacity search (SLO) per preset, ranked by goodput", False, id="sw-capacity",
                               compact=True)
                with Horizontal(classes="sw-buttons"):
                    yield Button("Start (ctrl+r)", id="sw-start", variant="primary", compact=True)
                    yield Button("Cancel (x)", id="sw-cancel", compact=True, disabled=True)
                yield Static(Content.styled("choose presets (space), then ctrl+r", "dim"), id="sw-phase")
                with Horizontal(classes="sw-bar", id="sw-overall-row"):
                    yield Label("presets")
                    yield ProgressBar(total=None, id="sw-overall", show_eta=False)
                with Horizontal(classes="sw-bar", id="sw-burst-row"):
                    yield Label("burst")
                    yield ProgressBar(total=None, id="sw-burst", show_eta=False)
        with Horizontal(id="sw-results"):
            yield DataTable(id="sw-table", cursor_type="row", zebra_stripes=True)
            yield CapacityChart(id="sw-chart", classes="-capacity-only")
        yield Static("", id="sw-notes")
        with Horizontal(id="sw-export"):
            yield Label("export to (.md .csv .json)")
            yield Input(default_export_path(), id="sw-path", compact=True)
            yield Button("Export (ctrl+s)", id="sw-export-btn", compact=True)
        yield KeyFooter()

    @staticmethod
    def _field(label: str, wid: str, value: str, classes: str = "", kind: str = "integer") -> Vertical:
        return Vertical(Label(label), Input(value, type=kind, id=wid, compact=True), classes=f"sw-field {classes}")

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
        self.query_one("#sw-left").border_title = "presets (space selects)"
        table = self.query_one("#sw-table", DataTable)
        table.border_title = "results"
        self._columns(capacity=False)
        self.query_one("#sw-chart", CapacityChart).show([], empty="the curves appear as levels finish")
        for row in self.query(".sw-bar"):
            row.display = False
        self.query_one("#sw-presets", SelectionList).focus()
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
        repeat = read_int(q("#sw-repeat", Input), "repeat R")
        if repeat < 1:
            raise ValueError("repeat R must be at least 1")
        return config, repeat

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
        self.call_after_refresh(self._hint_columns)

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
        self.names, self.repeat, self.config, self.capacity = names, repeat, config, capacity
        self.runs, self.rows, self.record = [], [], None
        self.curves, self.front = {}, set()
        self._cancel = threading.Event()
        self.running, self.cancelling = True, False
        self._t0 = time.monotonic()
        self._eta_at = None
        self.rounds = paired_rounds(capacity, names, repeat)
        self.paired = None
        steps = len(names) + self.rounds * (len(names) + 1) if self.rounds else len(names) * repeat
        self._last_event = {"phase": "preflight", "index": 0, "total": steps, "preset": names[0]}
        self._columns(capacity=capacity is not None)
        self._redraw_chart()
        for row in self.query(".sw-bar"):
            row.display = True
        self.query_one("#sw-burst-row").display = capacity is None  # a search's levels are in the phase line
        self.query_one("#sw-overall", ProgressBar).update(total=steps, progress=0)
        self.query_one("#sw-burst", ProgressBar).update(total=config.n, progress=0)
        self._buttons()
        self._show_phase()
        self._worker(SweepPlan(presets, repeat), config, self._cancel, capacity, self.rounds)
        return True

    @work(thread=True, group="sweep", exit_on_error=False)
    def _worker(self, plan: SweepPlan, config: BurstConfig, cancel: threading.Event,
                capacity: CapacitySweep | None = None, rounds: int | None = None) -> None:
        log_dir = paths.state_dir() / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S")
        done: list[SweepRun] = []

        def progress(ev: dict[str, Any]) -> None:
            if ev.get("phase") == "done" and ev.get("run") is not None:
                done.append(ev["run"])
                self.post_message(SweepRunDone(ev["run"], {k: v for k, v in ev.items() if k != "run"}))
                return
            ce = ev.get("capacity_event") or {}
            if ce.get("event") == "level_done":  # a point of the preset's curve: never coalesced away
                self.post_message(SweepLevelDone(ev["preset"], ev.get("repeat", 0), ce["level"]))
            self.post_message(SweepProgress(dict(ev)))

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
            body: dict[str, Any] = {"meta": sweep_meta([p.name for p in plan.presets], plan.repeat, config, runs,
                                                       capacity=capacity), "runs": runs}
            if paired is not None:
                body["paired"] = paired.to_dict()
            try:
                rec = save_run("sweep", body, notes=" ".join(p.name for p in plan.presets))
                record = rec.id
            except (RunStoreError, OSError) as exc:
                error = (error + "; " if error else "") + f"the sweep's run record was not saved: {exc}"
        self.post_message(SweepFinished(runs, cancel.is_set(), error, record, str(log_dir), paired))

    def _meta(self) -> dict:
        return sweep_meta(self.names, self.repeat, self.config or BurstConfig(), self.runs, capacity=self.capacity)

    # -- progress ------------------------------------------------------------------------------
    @on(SweepProgress)
    @drop_when_torn_down
    def _progress(self, message: SweepProgress) -> None:
        if not self.running:
            return
        ev = message.event
        self._last_event = ev
        if ev.get("phase") == "preflight":
            eta = ev.get("eta_s")
            self._eta_at = time.monotonic() + eta if eta else None
            self.query_one("#sw-burst", ProgressBar).update(progress=0)
        if ev.get("phase") == "burst" and ev.get("burst_total"):
            self.query_one("#sw-burst", ProgressBar).update(total=ev["burst_total"], progress=ev.get("burst_done", 0))
        self.query_one("#sw-overall", ProgressBar).update(progress=ev.get("index", 0))
        self._show_phase()

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
        curves = [CapacityCurve(name if self.repeat == 1 else f"{name} r{repeat + 1}", levels,
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
        self._last_event = {**message.event, "phase": "done", "status": message.run.status}
        self.query_one("#sw-overall", ProgressBar).update(progress=message.event.get("index", 0) + 1)
        self._refresh_table()
        self._show_phase()

    @on(SweepFinished)
    @drop_when_torn_down
    def _finished(self, message: SweepFinished) -> None:
        self.running = False
        self.cancelling = False
        self.runs = list(message.runs)
        self.record = message.record
        self.paired = message.paired
        self._refresh_table()
        self._buttons()
        self._update_refusal()
        elapsed = short_duration(time.monotonic() - self._t0) if self._t0 else "–"
        measured = sum(1 for r in self.runs if r.status == "ok")
        head = ("Cancelled: the server was stopped; " if message.cancelled else "Done: ") + \
            f"{len(self.runs)} run(s), {measured} measured, in {elapsed}."
        parts = [Content.styled(head, "bold $warning" if message.cancelled else "bold $success")]
        if message.error:
            parts.append(Content.styled(message.error, "$error"))
        if message.record:
            parts.append(Content.assemble(("saved as run record ", "dim"), message.record,
                                          ("; server logs in ", "dim"), message.log_dir or "–"))
        parts.append(Content.styled("ctrl+s exports the table", "dim"))
        self._say(Content("\n").join(parts))
        self.query_one("#sw-burst-row").display = False

    def _show_phase(self) -> None:
        if not self.running:
            return
        line = describe_event(self._last_event, self.repeat)
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
                text = cell(row, key)
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
            notes = [Content.styled(line, "bold" if i == 0 else "") for i, line in enumerate(self.paired.lines())
                     ] + notes
        self.query_one("#sw-notes", Static).update(Content("\n").join(notes))
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
        return True

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
