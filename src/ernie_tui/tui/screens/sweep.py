"""`w`: the preset sweep. The articles' comparison table, measured by the tool.

Choose presets and the burst; the sweep then, for each preset, runs
preflight (a preset that fails it is recorded and never launched), starts
the server, waits until it is ready, runs the burst, stops it and waits until
the engine is gone, then the next one. With repeat R the presets run in
rotated order R times and each figure is the median with its min–max range.

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
from dataclasses import dataclass, field
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
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar, SelectionList, Static
from textual.widgets.selection_list import Selection

from ernie_tui.engine_ctl.burst import BurstConfig
from ernie_tui.engine_ctl.sweep import COLUMNS, SweepOptions, SweepPlan, SweepRow, SweepRun, cell, fold
from ernie_tui.tui.lifecycle import drop_when_torn_down

EXPORT_SUFFIXES = (".md", ".csv", ".json")

# The table on screen leads with what a person compares; the exports keep
# sweep.COLUMNS' order (the articles' table).
_FIRST = ("preset", "status", "output_tps", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "peak_memory_gib",
          "kv_usage_peak_pct", "vs_best")
TABLE_COLUMNS = [c for key in _FIRST for c in COLUMNS if c[0] == key] + [c for c in COLUMNS if c[0] not in _FIRST]


# -- messages (worker -> screen) ----------------------------------------------------

@dataclass
class SweepProgress(Message):
    """A phase change or burst progress (latest wins)."""

    event: dict[str, Any]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SweepProgress)


@dataclass
class SweepRunDone(Message):
    """One preset measured once (never dropped)."""

    run: SweepRun
    event: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepFinished(Message):
    runs: list[SweepRun]
    cancelled: bool = False
    error: str | None = None
    record: str | None = None  # the sweep's run record id
    log_dir: str | None = None


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
    elif phase == "done":
        phase = f"done: {ev.get('status', '?')}"
    return f"{where}: {phase}"


def status_text(status: str) -> Text:
    style = "bold green" if status == "ok" else "yellow" if status.startswith(("ok ", "cancelled")) else "bold red"
    return Text(status, style=style)


def default_export_path() -> str:
    return f"sweep-{time.strftime('%Y%m%d-%H%M')}.md"


class SweepScreen(Screen[None]):
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

    DEFAULT_CSS = """
    SweepScreen {
        layout: vertical;
        background: $background;
    }
    SweepScreen #sw-head {
        height: 1;
        background: $panel;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    SweepScreen #sw-refuse {
        display: none;
        height: auto;
        border: heavy $error;
        background: $error 15%;
        padding: 0 1;
    }
    SweepScreen #sw-refuse.-visible { display: block; }
    SweepScreen #sw-top { height: auto; max-height: 50%; }
    SweepScreen #sw-left {
        width: 40;
        height: auto;
        max-height: 100%;
        border: round $primary 60%;
        border-title-color: $primary;
    }
    SweepScreen #sw-left:focus-within { border: round $primary; }
    SweepScreen #sw-presets { height: auto; max-height: 10; border: none; padding: 0 0; }
    SweepScreen #sw-desc { height: auto; max-height: 3; color: $text-muted; padding: 0 1; }
    SweepScreen #sw-right { width: 1fr; height: auto; padding: 0 0 0 1; }
    SweepScreen .sw-row { height: auto; }
    SweepScreen .sw-field { width: auto; height: 2; margin: 0 2 0 0; }
    SweepScreen .sw-field Label { color: $text-muted; }
    SweepScreen .sw-field Input { width: 10; }
    SweepScreen .sw-field { width: 12; }
    SweepScreen .sw-buttons { height: 1; margin: 1 0 0 0; }
    SweepScreen Button { width: auto; min-width: 0; margin: 0 1 0 0; }
    SweepScreen #sw-phase { height: auto; margin: 1 0 0 0; }
    SweepScreen .sw-bar { height: 1; }
    SweepScreen .sw-bar Label { width: 10; color: $text-muted; }
    SweepScreen #sw-table {
        height: 1fr;
        border: round $secondary 60%;
        border-title-color: $secondary;
    }
    SweepScreen #sw-notes { height: auto; max-height: 5; padding: 0 1; color: $text-muted; }
    SweepScreen #sw-export { height: 1; }
    SweepScreen #sw-export Label { padding: 0 1; color: $text-muted; }
    SweepScreen #sw-path { width: 1fr; }
    """

    def __init__(self, book, model: str | None = None, api_key: str | None = None, *,
                 is_serving: Callable[[], bool] | None = None,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.book = book
        self.model = model
        self.api_key = api_key
        self.is_serving = is_serving or (lambda: False)
        self.running = False
        self.cancelling = False
        self.runs: list[SweepRun] = []
        self.rows: list[SweepRow] = []
        self.names: list[str] = []
        self.repeat = 1
        self.config: BurstConfig | None = None
        self.last_error: str | None = None
        self.record: str | None = None
        self._cancel: threading.Event | None = None
        self._eta_at: float | None = None
        self._t0: float | None = None
        self._last_event: dict[str, Any] = {}

    # -- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(Content.assemble(("Preset sweep ", "bold"),
                                      ("each preset: preflight → start → ready → burst → stop; "
                                       "the sweep runs its own servers", "dim")), id="sw-head")
        yield Static("", id="sw-refuse")
        with Horizontal(id="sw-top"):
            with Vertical(id="sw-left"):
                yield SelectionList[str](*self._selections(), id="sw-presets", compact=True)
                yield Static("", id="sw-desc")
            with Vertical(id="sw-right"):
                with Horizontal(classes="sw-row"):
                    yield self._field("N requests", "sw-n", "100")
                    yield self._field("L_min tok", "sw-lmin", "30")
                    yield self._field("L_max tok", "sw-lmax", "300")
                with Horizontal(classes="sw-row"):
                    yield self._field("conc. C", "sw-c", "4")
                    yield self._field("max_tokens", "sw-max", "128")
                    yield self._field("repeat R", "sw-repeat", "1")
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
        yield DataTable(id="sw-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="sw-notes")
        with Horizontal(id="sw-export"):
            yield Label("export to (.md .csv .json)")
            yield Input(default_export_path(), id="sw-path", compact=True)
            yield Button("Export (ctrl+s)", id="sw-export-btn", compact=True)
        yield Footer()

    @staticmethod
    def _field(label: str, wid: str, value: str) -> Vertical:
        return Vertical(Label(label), Input(value, type="integer", id=wid, compact=True), classes="sw-field")

    def _selections(self) -> list[Selection[str]]:
        out = []
        for name in self.book.names():
            preset = self.book.get(name)
            args = preset.key_args()
            out.append(Selection(f"{name}  {args}" if args else name, name, False))
        return out

    def on_mount(self) -> None:
        self.query_one("#sw-left").border_title = "presets (space selects)"
        table = self.query_one("#sw-table", DataTable)
        table.border_title = "results"
        for key, label in TABLE_COLUMNS:
            table.add_column(label, key=key)
        table.add_column("note", key="note")
        for row in self.query(".sw-bar"):
            row.display = False
        self.query_one("#sw-presets", SelectionList).focus()
        self._update_refusal()
        self.set_interval(1.0, self._tick)

    def on_unmount(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    @on(SelectionList.SelectionHighlighted, "#sw-presets")
    def _highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        name = event.selection.value
        try:
            desc = self.book.get(name).description
        except Exception:
            desc = ""
        self.query_one("#sw-desc", Static).update(Content(desc or ""))

    # -- refusing while the dashboard serves --------------------------------------------------
    def _serving(self) -> bool:
        try:
            return bool(self.is_serving())
        except Exception:
            return False

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
        def integer(wid: str, what: str) -> int:
            raw = self.query_one(wid, Input).value.strip()
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{what} must be a whole number, got {raw!r}") from None

        config = BurstConfig(n=integer("#sw-n", "N"), min_tokens=integer("#sw-lmin", "L_min"),
                             max_tokens_in=integer("#sw-lmax", "L_max"), concurrency=integer("#sw-c", "C"),
                             max_tokens=integer("#sw-max", "max_tokens"))
        config.validate()
        repeat = integer("#sw-repeat", "repeat R")
        if repeat < 1:
            raise ValueError("repeat R must be at least 1")
        return config, repeat

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
            presets = [self.book.get(n) for n in names]
            for p in presets:
                p.resolve_model(self.model)  # a preset without a model is an error now, not mid-sweep
        except Exception as exc:  # ValueError, PresetError
            self._say(f"Not started: {exc}", error=True)
            self.last_error = str(exc)
            return False
        self.last_error = None
        self.names, self.repeat, self.config = names, repeat, config
        self.runs, self.rows, self.record = [], [], None
        self._cancel = threading.Event()
        self.running, self.cancelling = True, False
        self._t0 = time.monotonic()
        self._eta_at = None
        self._last_event = {"phase": "preflight", "index": 0, "total": len(names) * repeat, "preset": names[0]}
        self.query_one("#sw-table", DataTable).clear()
        for row in self.query(".sw-bar"):
            row.display = True
        self.query_one("#sw-overall", ProgressBar).update(total=len(names) * repeat, progress=0)
        self.query_one("#sw-burst", ProgressBar).update(total=config.n, progress=0)
        self._buttons()
        self._show_phase()
        self._worker(SweepPlan(presets, repeat), config, self._cancel)
        return True

    @work(thread=True, group="sweep", exit_on_error=False)
    def _worker(self, plan: SweepPlan, config: BurstConfig, cancel: threading.Event) -> None:
        from ernie_tui import paths
        from ernie_tui.engine_ctl.sweep import run_sweep

        log_dir = paths.state_dir() / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S")
        done: list[SweepRun] = []

        def progress(ev: dict[str, Any]) -> None:
            if ev.get("phase") == "done" and ev.get("run") is not None:
                done.append(ev["run"])
                self.post_message(SweepRunDone(ev["run"], {k: v for k, v in ev.items() if k != "run"}))
            else:
                self.post_message(SweepProgress(dict(ev)))

        error = None
        try:
            runs = run_sweep(plan, config, SweepOptions(model=self.model, log_dir=log_dir), progress, cancel)
        except Exception as exc:  # run_sweep stops its server in `finally`; report what broke
            runs = done
            error = f"{type(exc).__name__}: {exc}"
        record = None
        if runs:
            try:
                from ernie_tui.engine_ctl.runstore import save_run

                rec = save_run("sweep", {"meta": self._meta(runs, plan, config), "runs": runs},
                               notes=" ".join(p.name for p in plan.presets))
                record = rec.id
            except Exception as exc:
                error = (error + "; " if error else "") + f"the sweep's run record was not saved: {exc}"
        self.post_message(SweepFinished(runs, cancel.is_set(), error, record, str(log_dir)))

    def _meta(self, runs: list[SweepRun], plan: SweepPlan | None = None, config: BurstConfig | None = None) -> dict:
        config = config or self.config or BurstConfig()
        names = [p.name for p in plan.presets] if plan else self.names
        repeat = plan.repeat if plan else self.repeat
        return {"date": time.strftime("%Y-%m-%d"), "presets": " ".join(names),
                "burst": f"N={config.n}, C={config.concurrency}, prompts {config.min_tokens}-"
                         f"{config.max_tokens_in} tokens, max_tokens {config.max_tokens}, ignore_eos",
                "repeat": repeat,
                "vllm": ", ".join(sorted({f"{r.vllm_version} ({r.platform})" for r in runs if r.vllm_version}))
                        or "-"}

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
        self.rows = fold(self.runs, self.names or [r.preset for r in self.runs])
        table = self.query_one("#sw-table", DataTable)
        table.clear()
        for row in self.rows:
            cells: list[Any] = []
            for key, _ in TABLE_COLUMNS:
                text = cell(row, key)
                cells.append(status_text(text) if key == "status" else text)
            cells.append(row.message)
            table.add_row(*cells, key=row.preset)
        notes = [Content.assemble((row.preset, "bold"), ": ", row.message)
                 for row in self.rows if row.status != "ok" and row.message]
        self.query_one("#sw-notes", Static).update(Content("\n").join(notes))

    # -- export -----------------------------------------------------------------------------------
    def export(self, path: str | None = None) -> Path | None:
        from ernie_tui.engine_ctl.sweep import export

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
            export(self.rows, target, self._meta(self.runs))
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
