"""The probe pane's Burst tab: a load burst, or a capacity search.

- Burst: N prompts of exact lengths in [L_min, L_max] at concurrency C, with
  a progress bar, a cancel key and the result, stored as a run record.
- Capacity (the "capacity search" box): the highest concurrency whose
  requests meet the SLO typed in (e.g. `ttft_p99=500ms itl_p99=50ms`),
  searched as `ernie-tui probe --capacity` searches it (engine_ctl.capacity,
  capacity_run): the curve of output tok/s against TTFT p99 is drawn and
  the level table grows as levels finish; ctrl+c ends it at any time (the
  running level stops, the levels measured are kept). The result is stored
  as a 'capacity' run record, as the command line stores it.

Both run in a thread worker that only posts messages (tui/messages.py) to
this widget; the handlers update the widgets on the UI thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import psutil
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Checkbox, Input, ProgressBar, Static

from ernie_tui.engine_ctl.control import EngineMemory
from ernie_tui.engine_ctl.load import (
    BurstConfig,
    BurstResult,
    MetricsFeed,
    RunStoreError,
    auto_procs,
    format_burst,
    parse_slo,
    request_setup,
    run_burst,
    run_capacity,
)
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import (
    BurstDone,
    BurstProgress,
    CapacityDone,
    CapacityLevelDone,
    CapacityLevelProgress,
    CapacityLevelStart,
)
from ernie_tui.tui.widgets.capacity_form import CapacityForm
from ernie_tui.tui.widgets.capacity_view import (
    GAP_FACTOR,
    GAP_WHY,
    CapacityView,
    capacity_load,
    describe_capacity,
    describe_load,
    ratio,
)
from ernie_tui.tui.widgets.form import labelled, read_int
from ernie_tui.tui.widgets.probe_tab import ProbeTarget

# The dashboard's scrape stands for the load's own while it is younger than
# this many sampling intervals: one or two missed ticks are a busy box, more
# is a sampler that stopped (another server now, or the app closing).
FEED_AGE_INTERVALS = 2.5


@dataclass
class Shown:
    """A finished burst or search as the tab shows it."""

    result: Any
    record: str | None = None
    record_path: str | None = None
    error: str | None = None


def describe_burst(r: BurstResult) -> Content:
    """The figures of a finished burst, the CLI's wording."""
    head = f"{r.completed} of {r.total} ok · {r.failed} failed · {r.not_sent} not sent"
    if r.cancelled:
        head += " · cancelled"
    style = "bold $success" if r.completed == r.total else "bold $warning" if r.completed else "bold $error"
    body = format_burst(r)
    if r.peak_memory_bytes is None:
        body += "\npeak memory: not sampled (no engine processes known to this pane)"
    lines = [Content.styled(head, style), Content(body)]
    ours, theirs = (r.comparison or {}).get("ttft_mean_ours_s"), (r.comparison or {}).get("ttft_mean_vllm_s")
    gap = ratio(ours, theirs)
    if gap is not None and (gap > GAP_FACTOR or gap < 1 / GAP_FACTOR):
        lines.append(Content.styled(f"TTFT: ours {gap:.1f}× vLLM's (flagged beyond {GAP_FACTOR:g}×). {GAP_WHY}",
                                    "$warning"))
    return Content("\n").join(lines)


def _int_field(label: str, wid: str, value: str, classes: str = "pf-field") -> Vertical:
    return labelled(label, Input(value, type="integer", id=wid, compact=True), classes)


class BurstTab(ShowsWorkerFailures, Vertical):
    """The Burst tab. `pids()` returns the engine's process ids (peak memory
    of a burst), `tags()` the (preset, engine report) its run record is
    tagged with; either may be None."""

    def __init__(self, target: ProbeTarget, *, pids: Callable[[], Callable[[], list[int]] | None] | None = None,
                 tags: Callable[[], tuple[Any, Any]] | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.target = target
        self._pids = pids or (lambda: None)
        self._tags = tags or (lambda: (None, None))
        self._run = 0  # ids that let late messages of an earlier run be ignored
        self._cancel: threading.Event | None = None
        self.running = False
        self.running_capacity = False
        self.last_burst: BurstResult | None = None
        self.last_record: str | None = None
        # The capacity search: the levels measured so far (the view draws them).
        self.levels: list[Any] = []
        self.level_starts: list[float] = []
        self.last_capacity: Any = None
        self._capacity_at: float | None = None
        # What each mode shows last: (result, record id, record path, error),
        # for the pane to keep when it closes (tui/probe_memory.py).
        self.shown_burst: Shown | None = None
        self.shown_capacity: Shown | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(classes="pf-row"):
            yield _int_field("N requests", "pf-b-n", "100", "pf-field -burst-only")
            yield _int_field("L_min tokens", "pf-b-lmin", "30")
            yield _int_field("L_max tokens", "pf-b-lmax", "300")
            yield _int_field("concurrency C", "pf-b-c", "4", "pf-field -burst-only")
            yield _int_field("max_tokens", "pf-b-max", "128")
        yield CapacityForm("pf-cap", id="pf-cap-form", classes="pf-row -capacity-only")
        with Horizontal(classes="pf-row"):
            yield Checkbox("ignore_eos", True, id="pf-b-ignore-eos", compact=True)
            yield Checkbox("chat endpoint", False, id="pf-b-chat", compact=True)
            yield Checkbox("capacity search (SLO)", False, id="pf-b-capacity", compact=True,
                           tooltip="find the highest concurrency (or request rate) whose requests meet the SLO")
        with Horizontal(classes="pf-buttons"):
            yield Button("Run burst (ctrl+r)", id="pf-b-run", variant="primary", compact=True)
            yield Button("Cancel (ctrl+c)", id="pf-b-cancel", compact=True, disabled=True)
            yield Button("Fields (ctrl+e)", id="pf-b-fields", compact=True, classes="-capacity-only",
                         tooltip="show or fold the search's fields (folded while a search runs and after it)")
        progress = ProgressBar(total=None, id="pf-burst-progress", show_eta=True)
        progress.display = False
        yield progress
        yield Static("", id="pf-note")
        with VerticalScroll(id="pf-burst-box", classes="-burst-only"):
            yield Static(Content.styled(
                "Prompt lengths are exact (built with the served model's tokenizer); ignore_eos makes "
                "every request produce max_tokens tokens. ctrl+r runs the burst.", "dim"),
                id="pf-burst-result")
        yield CapacityView(id="pf-cap-view", classes="-capacity-only")

    def on_mount(self) -> None:
        self.query_one("#pf-burst-box").border_title = "result"

    def on_unmount(self) -> None:
        self.cancel()

    # -- the mode ----------------------------------------------------------------------------
    @property
    def capacity_mode(self) -> bool:
        return self.query_one("#pf-b-capacity", Checkbox).value

    @on(Checkbox.Changed, "#pf-b-capacity")
    def _mode_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        if self.running:  # the mode of a running search or burst stays what it is
            with event.checkbox.prevent(Checkbox.Changed):
                event.checkbox.value = self.running_capacity
            self.notify("wait for the run to end (or ctrl+c) before switching", timeout=3)
            return
        self.set_mode(event.value)

    def set_mode(self, capacity: bool) -> None:
        """Show the capacity search's fields and view, or the burst's."""
        self.set_class(capacity, "-capacity")
        button = self.query_one("#pf-b-run", Button)
        button.label = "Search capacity (ctrl+r)" if capacity else "Run burst (ctrl+r)"
        button.refresh(layout=True)  # its width follows the label
        self.query_one("#pf-burst-progress").display = False
        self.query_one("#pf-note", Static).update("")

    # -- folding the fields: a search's answer and levels take the tab ------------------------
    @property
    def folded(self) -> bool:
        return self.has_class("-folded")

    def fold(self, folded: bool = True) -> None:
        """Fold the fields away (a search runs, or its answer is shown) so
        the answer and the level table have the tab, at 80x24 too; the level
        table takes the focus (arrows, PageUp/PageDown). Unfolded: the fields
        again, the SLO's first."""
        self.set_class(folded, "-folded")
        if self.parent is not None and not self.parent.display:
            return  # its tab is not in view: the focus stays where it is
        if folded:
            self.query_one("#pf-cap-levels").focus()
        elif self.capacity_mode:
            self.query_one(CapacityForm).query_one(Input).focus()

    def run(self) -> None:
        """Run what the mode says: a burst or a capacity search."""
        if self.running:
            self.notify("a run is going: ctrl+c cancels it", timeout=3)
            return
        if self.capacity_mode:
            self.run_capacity()
        else:
            self.run_burst()

    def cancel(self) -> bool:
        """Ask the running burst or search to stop; False when none runs."""
        if self.running and self._cancel is not None:
            self._cancel.set()
            return True
        return False

    def _begin(self, capacity: bool) -> threading.Event:
        self._run += 1
        self._cancel = threading.Event()
        self.running, self.running_capacity = True, capacity
        self._buttons()
        return self._cancel

    def _end(self) -> None:
        self.running = False
        self._buttons()

    # -- burst -------------------------------------------------------------------------------------
    def read_burst(self) -> BurstConfig:
        q = self.query_one
        config = BurstConfig(n=read_int(q("#pf-b-n", Input), "N"), min_tokens=read_int(q("#pf-b-lmin", Input), "L_min"),
                             max_tokens_in=read_int(q("#pf-b-lmax", Input), "L_max"),
                             concurrency=read_int(q("#pf-b-c", Input), "C"),
                             max_tokens=read_int(q("#pf-b-max", Input), "max_tokens"),
                             ignore_eos=q("#pf-b-ignore-eos", Checkbox).value, chat=q("#pf-b-chat", Checkbox).value)
        config.validate()
        self._check_fits(config.max_tokens_in, config.max_tokens)
        return config

    def _check_fits(self, longest_prompt: int, max_tokens: int) -> None:
        served = self.target.served
        limit = served.max_model_len if served else None
        if limit and longest_prompt + max_tokens > limit:
            raise ValueError(f"L_max + max_tokens ({longest_prompt + max_tokens:,}) is more than the "
                             f"model's max_model_len ({limit:,}): those requests would be refused")

    def run_burst(self) -> None:
        result_box = self.query_one("#pf-burst-result", Static)
        try:
            config = self.read_burst()
        except ValueError as exc:
            result_box.update(Content.assemble(("Cannot run: ", "bold $error"), str(exc)))
            result_box.set_class(True, "-error")
            return
        cancel = self._begin(capacity=False)
        self.last_burst = None
        self.last_record = None
        result_box.set_class(False, "-error")
        result_box.update(Content.styled("building exact-length prompts with the served model's tokenizer, "
                                         "then opening the connections …", "$warning"))
        bar = self.query_one("#pf-burst-progress", ProgressBar)
        bar.display = True
        bar.update(total=config.n, progress=0)
        self.query_one("#pf-note", Static).update(f"0 / {config.n} requests")
        preset, report = self._tags()
        self._burst_worker(self._run, config, cancel, self._pids(), preset, report, self._metrics_feed())

    def _metrics_feed(self) -> MetricsFeed | None:
        """The dashboard's own once-a-second scrapes of this server, for the
        load to read instead of scraping it a second time (vLLM renders every
        scrape in the process that streams the tokens being timed). None
        where the app keeps none; the feed itself answers None for another
        server or a stale scrape, and the load then scrapes for itself."""
        latest = getattr(self.app, "latest_scrape", None)
        if latest is None:
            return None
        interval = getattr(getattr(self.app, "config", None), "sample_interval", 1.0)
        return latest.feed(self.target.url, max_age_s=FEED_AGE_INTERVALS * interval)

    @work(thread=True, group="pf-burst", exit_on_error=False)
    def _burst_worker(self, run: int, config: BurstConfig, cancel: threading.Event,
                      pids: Callable[[], list[int]] | None, preset: Any, report: Any,
                      metrics_feed: MetricsFeed | None = None) -> None:
        counts = {"ok": 0, "failed": 0}

        def on_request(rec) -> None:
            counts["ok" if rec.ok else "failed"] += 1

        def progress(done: int, total: int) -> None:
            self.post_message(BurstProgress(run, done, total, counts["ok"], counts["failed"]))

        memory = None
        t = self.target
        try:
            if pids is not None:
                try:
                    memory = EngineMemory(pids)
                except (OSError, psutil.Error):
                    memory = None
            result = run_burst(t.url, config, api_key=t.api_key, model=t.served.id if t.served else None,
                               tokenizer=t.tokenizer, progress=progress, on_request=on_request,
                               cancel=cancel, memory_sampler=memory, metrics_feed=metrics_feed)
        except Exception as exc:  # noqa: BLE001  run_burst reports server trouble in its result; a bug shows in the pane
            self.post_message(BurstDone(run, None, error=f"{type(exc).__name__}: {exc}"))
            return
        finally:
            if memory is not None:
                memory.close()
        record_id = record_path = error = None
        if result.completed or result.failed:  # a burst that never started is not worth a record
            try:
                rec = result.save(preset, report)
                record_id, record_path = rec.id, str(rec.path)
            except (RunStoreError, OSError) as exc:
                error = f"the run record was not saved: {exc}"
        self.post_message(BurstDone(run, result, record_id, record_path, error))

    @on(BurstProgress)
    @drop_when_torn_down
    def _burst_progress(self, message: BurstProgress) -> None:
        message.stop()
        if message.run != self._run or not self.running:
            return
        self.query_one("#pf-burst-progress", ProgressBar).update(total=message.total, progress=message.done)
        failed = f" · {message.failed} failed" if message.failed else ""
        self.query_one("#pf-note", Static).update(f"{message.done} / {message.total} requests{failed}")
        if message.done == 0:
            self.query_one("#pf-burst-result", Static).update(Content.styled("running …", "$warning"))

    @on(BurstDone)
    @drop_when_torn_down
    def _burst_done(self, message: BurstDone) -> None:
        message.stop()
        if message.run != self._run:
            return
        self._end()
        self.show_burst(message.result, message.record, message.record_path, message.error)

    def show_burst(self, r: BurstResult | None, record: str | None = None, record_path: str | None = None,
                   error: str | None = None) -> None:
        """A finished burst (None: it failed, `error` says why) with its run record."""
        box = self.query_one("#pf-burst-result", Static)
        self.shown_burst = Shown(r, record, record_path, error)
        if r is None:
            box.update(Content.assemble(("The burst failed: ", "bold $error"), error or "?"))
            box.set_class(True, "-error")
            return
        self.last_burst = r
        self.last_record = record
        bar = self.query_one("#pf-burst-progress", ProgressBar)
        bar.display = True
        bar.update(total=r.total, progress=r.completed + r.failed)
        self.query_one("#pf-note", Static).update(
            f"{r.completed + r.failed} / {r.total} requests" + (f" · {r.failed} failed" if r.failed else ""))
        parts = [describe_burst(r)]
        if record:
            parts.append(Content.assemble(("saved as run record ", "dim"), (record, "bold"),
                                          ("  ", "dim"), (record_path or "", "dim")))
        if error:
            parts.append(Content.styled(error, "$warning"))
        box.update(Content("\n").join(parts))
        box.set_class(r.completed == 0, "-error")

    # -- capacity search -------------------------------------------------------------------------
    def read_capacity(self) -> tuple[list, Any, Any, BurstConfig, Any]:
        """(objectives, SearchConfig, LevelRules, prompt shape, RequestSettings)
        from the fields, checked by the same functions as the command line's
        options. ValueError in plain words."""
        q = self.query_one
        slo, search, rules = q(CapacityForm).search()
        cfg, settings = request_setup(min_tokens=read_int(q("#pf-b-lmin", Input), "L_min"),
                                      max_tokens_in=read_int(q("#pf-b-lmax", Input), "L_max"),
                                      max_tokens=read_int(q("#pf-b-max", Input), "max_tokens"),
                                      ignore_eos=q("#pf-b-ignore-eos", Checkbox).value,
                                      chat=q("#pf-b-chat", Checkbox).value)
        settings.client_procs = auto_procs()  # as the command line's --client-procs auto
        self._check_fits(cfg.max_tokens_in, cfg.max_tokens)
        return slo, search, rules, cfg, settings

    def run_capacity(self) -> None:
        view = self.query_one(CapacityView)
        try:
            slo, search, rules, cfg, settings = self.read_capacity()
        except ValueError as exc:
            view.say(Content.assemble(("Cannot search: ", "bold $error"), str(exc)), error=True)
            # the answer box can be below a short terminal while the fields show: say it where it is seen
            self.notify(f"Cannot search: {exc}", severity="error", timeout=8)
            return
        cancel = self._begin(capacity=True)
        self.fold()
        self.levels, self.level_starts, self.last_capacity, self.last_record = [], [], None, None
        self._capacity_at = None
        what = "request rate" if search.rate else "concurrency"
        view.reset(slo, Content.styled(
            f"searching under {' '.join(str(o) for o in slo)}: building prompts, then doubling the "
            f"{what} from the start until a level misses the SLO …", "$warning"), rate=search.rate)
        self.query_one("#pf-note", Static).update("")
        preset, report = self._tags()
        self._capacity_worker(self._run, slo, search, rules, cfg, settings, cancel, preset, report,
                              self._metrics_feed())

    @work(thread=True, group="pf-capacity", exit_on_error=False)
    def _capacity_worker(self, run: int, slo: list, search: Any, rules: Any, cfg: BurstConfig, settings: Any,
                         cancel: threading.Event, preset: Any, report: Any,
                         metrics_feed: MetricsFeed | None = None) -> None:
        def progress(ev: dict[str, Any]) -> None:
            kind = ev.get("event")
            rate = ev.get("rate") is not None  # open loop: the load is a rate in req/s
            load: Any = ev["rate"] if rate else ev.get("concurrency")
            if kind == "level_start":
                self.post_message(CapacityLevelStart(run, load, ev["index"], rate=rate))
            elif kind == "level_progress":
                self.post_message(CapacityLevelProgress(run, load, ev.get("requests", 0), ev.get("elapsed_s", 0.0),
                                                        rate=rate, event=dict(ev)))
            elif kind == "level_done":
                self.post_message(CapacityLevelDone(run, ev["level"], ev.get("low_pass"), ev.get("high_fail")))

        t = self.target
        try:
            result = run_capacity(t.url, slo, search_config=search, rules=rules, settings=settings, burst_config=cfg,
                                  tokenizer=t.tokenizer, model=t.served.id if t.served else None,
                                  api_key=t.api_key, progress=progress, cancel=cancel, metrics_feed=metrics_feed)
        except Exception as exc:  # noqa: BLE001  run_capacity reports server trouble in its result; a bug shows in the pane
            self.post_message(CapacityDone(run, None, error=f"{type(exc).__name__}: {exc}"))
            return
        record_id = record_path = error = None
        if result.levels:  # as the command line: a search that measured nothing is not worth a record
            try:
                rec = result.save(preset, report)
                record_id, record_path = rec.id, str(rec.path)
            except (RunStoreError, OSError) as exc:
                error = f"the run record was not saved: {exc}"
        self.post_message(CapacityDone(run, result, record_id, record_path, error))

    @on(CapacityLevelStart)
    @drop_when_torn_down
    def _level_start(self, message: CapacityLevelStart) -> None:
        message.stop()
        if message.run != self._run or not self.running:
            return
        self.level_starts.append(message.concurrency)
        load = describe_load(message.concurrency, message.rate)
        self.query_one("#pf-note", Static).update(f"level {message.index + 1}: {load} …")
        self.query_one(CapacityView).show_progress(None, level=message.index + 1, load=load)

    @on(CapacityLevelProgress)
    @drop_when_torn_down
    def _level_progress(self, message: CapacityLevelProgress) -> None:
        message.stop()
        if message.run != self._run or not self.running:
            return
        load = describe_load(message.concurrency, message.rate)
        self.query_one("#pf-note", Static).update(
            f"level {len(self.level_starts)}: {load} · {message.requests} requests in {message.elapsed_s:.1f} s")
        self.query_one(CapacityView).show_progress(message.event, level=len(self.level_starts), load=load)

    @on(CapacityLevelDone)
    @drop_when_torn_down
    def _level_done(self, message: CapacityLevelDone) -> None:
        message.stop()
        if message.run != self._run:
            return
        self.levels.append(message.level)
        self._capacity_at = message.low_pass
        view = self.query_one(CapacityView)
        view.show_progress(None)
        view.show_levels(self.levels, self._capacity_at)
        bounds = (f"highest pass {message.low_pass if message.low_pass is not None else '–'}, lowest fail "
                  f"{message.high_fail if message.high_fail is not None else '–'}")
        self.query_one("#pf-note", Static).update(f"{len(self.levels)} level(s) measured · {bounds}")

    @on(CapacityDone)
    @drop_when_torn_down
    def _capacity_done(self, message: CapacityDone) -> None:
        message.stop()
        if message.run != self._run:
            return
        self._end()
        self.show_capacity(message.result, message.record, message.record_path, message.error)

    def show_capacity(self, r: Any, record: str | None = None, record_path: str | None = None,
                      error: str | None = None) -> None:
        """A finished search (a CapacityResult; None: it failed, `error` says
        why) with its run record: the answer, the curve, the levels."""
        view = self.query_one(CapacityView)
        self.shown_capacity = Shown(r, record, record_path, error)
        if r is None:
            view.say(Content.assemble(("The search failed: ", "bold $error"), error or "?"), error=True)
            return
        self.fold()  # the answer and the levels in view once a search ends, at 80x24 too
        try:  # the chart's SLO line and percentile, for a result shown again in a new pane
            view.reset(parse_slo(list(r.slo)), "", rate=r.mode == "rate")
        except ValueError:
            pass
        self.last_capacity = r
        self.last_record = record
        self.levels = list(r.levels)
        view.show_progress(None)
        view.show_levels(self.levels, capacity_load(r), final=True)
        parts = [describe_capacity(r)]
        if record:
            parts.append(Content.assemble(("saved as run record ", "dim"), (record, "bold"),
                                          ("  ", "dim"), (record_path or "", "dim")))
        if error:
            parts.append(Content.styled(error, "$warning"))
        view.say(Content("\n").join(parts), error=not r.levels)
        self.query_one("#pf-note", Static).update(f"{len(r.levels)} level(s) measured")

    def _buttons(self) -> None:
        self.query_one("#pf-b-run", Button).disabled = self.running
        self.query_one("#pf-b-cancel", Button).disabled = not self.running
        self.screen.refresh_bindings()
