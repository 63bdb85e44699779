"""`?`: every key, the commands the keys do not reach (tune among them), and one
line on what each figure on the screen means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Label, Static

KEYS: tuple[tuple[str, str], ...] = (
    ("1–9", "switch to that preset and restart the server (asks first while it serves)"),
    ("s / x / r", "start / stop / restart the server with the active preset"),
    ("enter", "switch to the preset highlighted in the presets panel"),
    ("e", "edit the preset file in $EDITOR, then reload presets"),
    ("c", "show the exact command line of the highlighted preset (y copies it)"),
    ("f", "apply the diagnosis' fix to a copy NAME-fixed and relaunch (after a crash)"),
    ("p", "probe pane: one streamed prompt, a load burst, or the capacity search (its Burst tab, ctrl+b)"),
    ("k", "capacity search: the highest concurrency (or req/s) whose requests meet an SLO; opens the probe "
          "pane on it, ctrl+r runs it; → and ← turn its level table's columns where they do not all fit"),
    ("w", "sweep: pick presets and measure each, a table to compare. A burst: one preset at a time (started, "
          "burst, stopped), in turn. Its capacity-search box: each preset's capacity under an SLO, ranked by "
          "goodput; two or more are paired where they fit side by side (all served at once, their levels taking "
          "turns, then duel rounds: each pair's verdict with its interval), else one after another"),
    ("  in the sweep", "ctrl+r starts it; x or ctrl+c cancels it (its servers are stopped); ctrl+s exports the "
                       "table; once a sweep has run, ctrl+f brings the form back above the results (again: away), "
                       "and ctrl+t puts a capacity sweep's chart in the table's place (again: back) where the "
                       "terminal has the rows for it but not the columns to show both; escape closes"),
    ("T", "traffic: what the server serves, from /metrics since the dashboard began watching it (prompt, output "
          "and max_tokens histograms, requests/s, prefix-cache hits) and the profile captured so far beside the "
          "default load (uniform prompts, 128 tokens that never stop early); red lines mark the default"),
    ("  in traffic", "ctrl+s saves the captured profile and names the command that replays it (--traffic PATH); "
                     "a switches to all the server served since it started (and back); o lays a profile file or a "
                     "shape (chat, long-doc-qa, batch-summarise) beside it; n starts a new window; escape closes"),
    ("t", "chart window: 1 / 5 / 15 minutes"),
    ("/  n  N", "search the log; next / previous match; escape closes the search"),
    ("l / end", "follow the log again (scrolling up pauses it)"),
    ("j", "jump to the root-cause line of the error"),
    ("v", "log: whole vLLM prefixes (pid, date, file:line) or the short form"),
    ("a", "log: show or fold the GET /metrics and /health access lines (the title counts them)"),
    ("g", "small terminals: show charts instead of the log"),
    ("ctrl+p", "command palette: start, stop, restart, switch preset, quit"),
    ("q", "quit (control mode asks: stop the server or leave it running; plain `ernie-tui` takes a "
          "left-running server back, `ernie-tui stop` stops it)"),
)

# What the keys do not reach: the commands a shell runs (`ernie-tui CMD --help` says more).
COMMANDS: tuple[tuple[str, str], ...] = (
    ("tune BASE", "search engine settings (--space FILE.toml) for the most goodput under --slo; the best is "
                  "written to your presets file as BASE-tuned (--tui: its trials on a screen)"),
    ("sweep NAME...", "the sweep from a shell: a burst per preset in turn, or --capacity paired (all served at "
                      "once); --out FILE.md / .csv / .json"),
    ("probe --url URL", "one streamed prompt, a burst (--burst N), or a capacity search (--capacity --slo ...)"),
    ("check NAME", "preflight a preset: what vLLM would refuse, why, the fix, a KV-cache estimate"),
    ("runs / report", "the saved run records (runs list, runs show ID); report draws them into HTML, PNG or SVG"),
    ("--attach URL", "watch a server this tool did not start; --log PATH, its log, gives the startup report "
                     "and the log pane"),
    ("stop", "stop the server a dashboard left running"),
)

FIGURES: tuple[tuple[str, str], ...] = (
    ("state", "stopped → starting (phase) → ready → stopping; or crashed: exit code, root cause"),
    ("up / ready in", "time since launch; how long the start took until /health answered"),
    ("args", "the engine arguments vLLM reports as non-default (what really applied)"),
    ("block · len", "KV block size in tokens · max_model_len, the longest request allowed"),
    ("attention", "the attention backend vLLM picked (FLASH_ATTN, TRITON_ATTN, …); on CPU vLLM logs none: "
                  "CPU_ATTN, its CPU attention, marked implied"),
    ("weights", "GiB the model weights take in memory, and how long loading them took"),
    ("KV cache", "memory for the KV cache after weights and activations = tokens that fit"),
    ("concurrency", "how many requests of full max_model_len fit in the KV cache at once"),
    ("CUDA graphs", "time and memory spent capturing CUDA graphs (GPU only)"),
    ("phases", "weights → torch.compile → KV profiling → CUDA graphs → ready, seconds each"),
    ("memory chart", "GPU memory used per GPU (NVML); on CPU the engine's RSS, labelled so"),
    ("tokens/s chart", "prompt and generation tokens per second, from /metrics counters"),
    ("KV % chart", "KV-cache use % (left axis), running / waiting requests (right axis)"),
    ("capacity", "the highest load meeting the SLO, measured level by level; ▸ marks the level it reports, "
                 "\"undecided: pass\" a level a cap ended before its windows agreed (judged on its estimates)"),
    ("traffic", "lengths within one of vLLM's 1-2-5 buckets; requests/s counted as they finish; CV: the gaps' "
                "burstiness (1 Poisson, above 1 bursty; ? where too few scrapes to read it)"),
    ("log", "live llm.log: INFO green, WARNING yellow, errors red, root-cause line inverted"),
)


class HelpScreen(Screen[None]):
    """Opaque and installed once (see ErnieApp): opening it repaints only
    itself, not the dashboard underneath, so `?` stays instant under a log flood."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help", classes="dialog -wide"):
            yield Label("ernie-tui — keys and figures", classes="dialog-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(self._table("Keys", KEYS), classes="help-section")
                yield Static(self._table("Commands (ernie-tui CMD, in a shell)", COMMANDS), classes="help-section")
                yield Static(self._table("What the figures mean", FIGURES), classes="help-section")
            yield Label("? or escape closes", classes="dialog-hint")

    def _table(self, title: str, rows: tuple[tuple[str, str], ...]):
        """Two columns: a description that wraps (an 80-column terminal)
        continues under itself, not at column 0 under the keys."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        accent = getattr(getattr(self.app, "current_theme", None), "accent", None) or "cyan"
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
        table.add_column(no_wrap=True, style="bold")
        table.add_column(ratio=1, overflow="fold")
        for key, text in rows:
            table.add_row(key, text)
        return Group(Text(title, style=f"bold {accent}"), table)

    def action_close(self) -> None:
        self.app.pop_screen()
