"""`T`: the traffic view of the server the dashboard watches (started or attached).

What the server serves, from its /metrics over a window (from the first
scrape the dashboard took of it, or from `n`): the length histograms vLLM
keeps (prompt tokens, generation tokens, max_tokens asked), the requests
finished per second, the prefix-cache hit rate; and the profile captured so
far beside the synthetic default load that every figure is measured on
without --traffic, so an operator sees how far that default is from their
traffic. `a` switches to all the server served since it started (vLLM's
counters and histograms run from its start: last night's traffic, from a
dashboard attached this morning) and back; `o` lays a profile file or a
ready-made shape beside them; ctrl+s saves the captured profile for
`--traffic PATH`.

The data lives in the app's TrafficWatch (tui/traffic_watch.py), fed by the
sampler; the app hands this screen each new state (show_traffic), and the
widgets only draw.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Input, Static

from ernie_tui import paths
from ernie_tui.engine_ctl.load import TrafficError, TrafficProfile, load_profile, save_profile
from ernie_tui.tui.failures import show_failure
from ernie_tui.tui.lifecycle import tearing_down
from ernie_tui.tui.traffic_watch import DefaultLoad, TrafficState, TrafficWatch, comparison, how_far
from ernie_tui.tui.widgets.footer import KeyFooter
from ernie_tui.tui.widgets.traffic_charts import ArrivalChart, LengthHistogram

# Below this many columns, three columns of figures leave no room for the rate chart beside them.
WIDE_TABLE_WIDTH = 100


def saved_profiles_dir() -> Path:
    """Where ctrl+s writes captured profiles (the app's data folder, private)."""
    return paths.data_dir() / "traffic"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s} s"


class TrafficScreen(Screen[None]):
    AUTO_FOCUS = ""  # none: the profile box (hidden until o) would take the keys
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+s", "save", "Save profile"),
        Binding("n", "new_window", "New window"),
        Binding("a", "scope", "Since start"),
        Binding("o", "compare", "Compare"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, state: TrafficState, *, url: str | None = None, watch: TrafficWatch | None = None,
                 default: DefaultLoad | None = None, save_dir: Path | None = None) -> None:
        super().__init__()
        self.state = state
        self.url = url or state.url
        self.traffic_watch = watch  # the app's: n and a change its window, and the view reads it again at once
        self.default = default or DefaultLoad.from_config()
        self.save_dir = save_dir
        self.loaded: TrafficProfile | None = None  # a file or a shape laid beside the capture (o)
        self.loaded_ref = ""

    def compose(self) -> ComposeResult:
        yield Static(id="tr-head")
        with Horizontal(id="tr-hists"):
            yield LengthHistogram("Prompt tokens", id="tr-prompt")
            yield LengthHistogram("Output tokens", id="tr-output")
            yield LengthHistogram("max_tokens asked", id="tr-max")
        with Horizontal(id="tr-lower"):
            yield ArrivalChart(id="tr-rate")
            yield Static(id="tr-table")
        yield Input(placeholder="a profile file, or chat · long-doc-qa · batch-summarise; enter lays it beside; "
                                "empty: none", id="tr-open")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#tr-table").border_title = "Beside the default load"
        self._draw()

    # -- what the app hands us ----------------------------------------------------------
    def show_traffic(self, state: TrafficState) -> None:
        """The newest state; drawn once the widgets exist (a state that comes
        as the screen is pushed is drawn by on_mount) and while they do."""
        self.state = state
        self.url = state.url or self.url
        if self.is_mounted and not tearing_down(self):
            self._draw()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Narrow, with a profile laid beside: the table takes the row (its
        arrivals row says the rate the chart draws); the footer compact. `a`
        is named for the scope it switches to."""
        narrow = self.size.width < WIDE_TABLE_WIDTH
        self.set_class(self.loaded is not None and narrow, "-table-only")
        self.query_one(KeyFooter).set_layout(
            narrow=narrow, labels={"scope": "Window" if self.state.scope == "start" else "Since start"})

    def _draw(self) -> None:
        self._fit()
        s, d = self.state, self.default
        self.query_one("#tr-head", Static).update(self._head())
        empty = s.problem or "no requests in the window yet"
        self.query_one("#tr-prompt", LengthHistogram).show(
            s.prompt, d.prompt_quantile(0.5), f"default {d.min_tokens}–{d.max_tokens_in}", empty)
        self.query_one("#tr-output", LengthHistogram).show(s.output, d.max_tokens, f"default {d.max_tokens}", empty)
        self.query_one("#tr-max", LengthHistogram).show(s.max_tokens, d.max_tokens, f"default {d.max_tokens}", empty)
        self.query_one("#tr-rate", ArrivalChart).show(s.rates, s.watched_s, self._rate_summary(), empty)
        self.query_one("#tr-table", Static).update(self._table())

    def _head(self) -> Text:
        s = self.state
        head = Text.assemble(("Traffic ", "bold"), self.url or "no server")
        if s.scope == "start" and s.window_s > 0:
            head.append(f" · since it started {_duration(s.window_s)} ago · {s.requests:,.0f} requests")
        elif s.scrapes >= 2:
            head.append(f" · window {_duration(s.window_s)} · {s.requests:,.0f} requests")
        if s.hit_rate is not None:
            head.append(f" · prefix-cache hits {s.hit_rate * 100:.1f} %")
        if s.problem:
            head.append(f" · {s.problem}", "dim")
        if s.scope == "window" and s.served and s.served > s.requests:
            head.append(f" · a: all {s.served:,.0f} since it started", "dim")
        return head

    def _rate_summary(self) -> str:
        p = self.state.profile
        if p is None:
            return ""
        a = p.arrivals
        cv = f"gap CV {a.cv:.1f}" if a.cv_measured else "gap CV not seen yet"
        return f"mean {a.rate_per_s:.3g}/s · {cv}"

    def _table(self) -> Table | Text:
        columns: list[tuple[str, TrafficProfile | None]] = [("captured", self.state.profile)]
        if self.loaded is not None:
            columns.append((self.loaded.name, self.loaded))
        header, rows = comparison(columns, self.default)
        table = Table(box=None, show_header=True, header_style="bold", padding=(0, 1, 0, 0), expand=False)
        table.add_column(header[0], style="bold", no_wrap=True)
        for name in header[1:]:
            table.add_column(name, no_wrap=True, justify="right", overflow="ellipsis", max_width=18)
        for row in rows:
            table.add_row(*row)
        against = self.loaded or self.state.profile
        far = how_far(against, self.default) if against is not None else ""
        if far:
            table.caption = far
            table.caption_justify = "left"
            table.caption_style = "yellow"
        return table

    # -- keys ------------------------------------------------------------------------------
    def action_save(self) -> Path | None:
        """The captured profile to a file, with the command line that replays it."""
        profile = self.state.profile
        if profile is None:
            self.notify(f"nothing captured yet: {self.state.problem or 'no request finished'}",
                        severity="warning", timeout=5)
            return None
        folder = self.save_dir or saved_profiles_dir()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = folder / f"traffic-{stamp}.json"
        try:
            paths.private_dir(folder)
            # Named for its file: the name run records give it. 0600 when it
            # holds prompt text (a capture from /metrics holds none).
            path = save_profile(replace(profile, name=target.stem), target)
        except OSError as exc:
            self.notify(f"cannot write {target}: {exc.strerror or exc}", severity="error", timeout=8)
            return None
        url = self.url or "URL"
        self.notify(f"saved {path}\nreplay it: ernie-tui probe --url {url} --burst 20 --traffic {path}\n"
                    "(sweep and tune take --traffic too)", title="traffic profile", timeout=15)
        return path

    def action_new_window(self) -> None:
        if self.traffic_watch is not None:
            self.traffic_watch.restart()
            self._read_again(self.traffic_watch)
        self.notify("a new window begins at the next /metrics scrape", timeout=3)

    def action_scope(self) -> None:
        """All the server served since it started, or the window watched (again)."""
        if self.traffic_watch is None:
            return
        self.traffic_watch.set_scope("window" if self.traffic_watch.scope == "start" else "start")
        self._read_again(self.traffic_watch)

    def _read_again(self, watch: TrafficWatch) -> None:
        """The watch read now (a few ms), not at the sampler's next scrape."""
        try:
            state = watch.state()
        except Exception as exc:  # noqa: BLE001  a bug in reading it: shown, the view stays as it was
            show_failure(self.app, "the traffic view", exc)
            return
        self.show_traffic(state)

    def action_compare(self) -> None:
        box = self.query_one("#tr-open", Input)
        box.add_class("-visible")
        box.value = self.loaded_ref
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        box = self.query_one("#tr-open", Input)
        ref = event.value.strip()
        if ref:
            try:
                self.loaded = load_profile(ref)
            except (TrafficError, ValueError) as exc:
                self.notify(str(exc), title="cannot compare", severity="error", timeout=8)
                return
        else:
            self.loaded = None
        self.loaded_ref = ref
        box.remove_class("-visible")
        self.set_focus(None)
        self._draw()

    def action_help(self) -> None:
        open_help = getattr(self.app, "open_help", None)
        if open_help is not None:
            open_help()

    def action_close(self) -> None:
        box = self.query_one("#tr-open", Input)
        if box.has_class("-visible"):
            box.remove_class("-visible")
            self.set_focus(None)
            return
        self.app.pop_screen()
