"""`p`: the probe pane. One prompt, streamed and timed; or a load burst.

Two tabs:
- Probe: a prompt editor with the ready-made prompts (short English, the
  articles' Chinese question, a ~1,500-token prompt built with the served
  model's own tokenizer), sampling settings, completions or chat. The reply
  streams in as it arrives; then TTFT, inter-token latency mean/p90, output
  tok/s, the server's usage tokens and finish_reason. Errors (prompt too
  long with vLLM's message and the model's limit, 5xx, refused, timeouts,
  a server that dies mid-stream) are shown in plain words.
- Burst: N prompts of exact lengths in [L_min, L_max] at concurrency C, with
  a progress bar, a cancel key and the result, stored as a run record.

Threads: each probe or burst runs in a thread worker with its own event
loop (so the UI's rendering never sits between two timestamps of the
stream). Workers only compute and post the Messages below to this screen;
the handlers update the widgets on the UI thread. Streamed text is batched
in the worker (at most one message per TEXT_INTERVAL_S) and coalesced again
by `can_replace` if the UI is behind, so a fast stream cannot flood the UI.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import (
    Button,
    Checkbox,
    Footer,
    Input,
    Label,
    ProgressBar,
    Static,
    TabbedContent,
    TabPane,
    TextArea,
)

from ernie_tui.engine_ctl.burst import BurstConfig, BurstResult
from ernie_tui.engine_ctl.http_client import ServedModel
from ernie_tui.engine_ctl.http_errors import ProbeError
from ernie_tui.engine_ctl.prompts import CHINESE_PROMPT, LONG_PROMPT_TOKENS, SHORT_PROMPT
from ernie_tui.engine_ctl.stream_timing import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    ProbeRequest,
    ProbeResult,
)
from ernie_tui.tui.lifecycle import drop_when_torn_down

# The worker posts streamed text at most this often.
TEXT_INTERVAL_S = 0.05

PROMPT_CHOICES = {"short": SHORT_PROMPT, "chinese": CHINESE_PROMPT}

ERROR_TITLES = {
    "prompt_too_long": "Prompt too long",
    "bad_request": "Bad request",
    "unauthorized": "Not authorized",
    "not_found": "Not found",
    "server_error": "Server error",
    "http_error": "HTTP error",
    "connection_refused": "Connection refused",
    "connect_error": "Cannot connect",
    "timeout": "Timed out",
    "disconnected": "The server went away",
    "stream_error": "Error in the stream",
    "bad_response": "Unexpected answer",
    "cancelled": "Cancelled",
}


# -- messages (worker -> screen) ---------------------------------------------------

@dataclass
class ModelInfo(Message):
    """What /v1/models says (or why it could not be read)."""

    model: ServedModel | None
    error: str | None = None


@dataclass
class LongPromptReady(Message):
    text: str | None
    tokens: int | None = None
    target: int | None = None
    error: str | None = None


@dataclass
class ProbeText(Message):
    """Text streamed since the previous ProbeText of the same run. When the
    UI is behind, an older one hands its text forward to the next."""

    run: int
    text: str

    def can_replace(self, message: Message) -> bool:
        if isinstance(message, ProbeText) and message.run == self.run:
            message.text = self.text + message.text
            return True
        return False


@dataclass
class ProbeDone(Message):
    run: int
    result: ProbeResult


@dataclass
class BurstProgress(Message):
    """Requests finished so far (latest wins)."""

    run: int
    done: int
    total: int
    ok: int = 0
    failed: int = 0

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BurstProgress) and message.run == self.run


@dataclass
class BurstDone(Message):
    run: int
    result: BurstResult | None
    record: str | None = None  # the run record's id
    record_path: str | None = None
    error: str | None = None


# -- plain-words rendering (pure; also used by tests) ---------------------------------

def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def describe_error(err: ProbeError, max_model_len: int | None = None) -> Content:
    """An error for people: a bold title, vLLM's own words, and for a
    too-long prompt the model's limit."""
    title = ERROR_TITLES.get(err.kind, err.kind.replace("_", " ").capitalize())
    if err.status:
        title += f" (HTTP {err.status})"
    if err.kind == "cancelled":
        return Content.assemble(("Cancelled", "bold $warning"), (" · the text so far is kept above", "dim"))
    lines = [Content.styled(title, "bold $error"), Content(err.message)]
    if err.kind == "prompt_too_long":
        limit = err.max_model_len or max_model_len
        if limit:
            text = f"The model's limit (max_model_len) is {limit:,} tokens"
            if err.prompt_tokens:
                text += f"; this prompt has {err.prompt_tokens:,}"
            lines.append(Content.styled(text + ". Prompt tokens plus max_tokens must fit in it.", "bold"))
    elif err.kind == "connection_refused":
        lines.append(Content.styled("Nothing listens on that port: is the server running?", "dim"))
    elif err.kind == "disconnected":
        lines.append(Content.styled("The server closed the stream: look at the log for a crash.", "dim"))
    return Content("\n").join(lines)


def describe_probe(r: ProbeResult) -> Content:
    """The figures of a finished probe."""
    def num(v: float | None, unit: str = "") -> str:
        return "–" if v is None else f"{v:.1f}{unit}"

    def tok(v: int | None) -> str:
        return "–" if v is None else f"{v:,}"

    lines = [
        Content.assemble(("TTFT ", "dim"), (ms(r.ttft_s), "bold"), ("   latency ", "dim"), ms(r.latency_s)),
        Content.assemble(("ITL mean ", "dim"), (ms(r.itl_mean_s), "bold"), ("   p90 ", "dim"),
                         (ms(r.itl_p90_s), "bold")),
        Content.assemble(("output ", "dim"), (num(r.output_tps, " tok/s"), "bold"),
                         ("   decode ", "dim"), num(r.decode_tps, " tok/s")),
        Content.assemble(("tokens  prompt ", "dim"), (tok(r.prompt_tokens), "bold"),
                         ("  completion ", "dim"), (tok(r.completion_tokens), "bold"), ("  (server usage)", "dim")),
        Content.assemble(("finish_reason ", "dim"), (r.finish_reason or "–", "bold"),
                         ("   ", "dim"), r.endpoint, (" · ", "dim"), r.model or "–"),
    ]
    if r.malformed_lines:
        lines.append(Content.styled(f"{r.malformed_lines} malformed stream line(s) skipped", "$warning"))
    return Content("\n").join(lines)


def describe_burst(r: BurstResult) -> Content:
    """The figures of a finished burst, the CLI's wording."""
    from ernie_tui.engine_ctl.burst import format_result

    head = f"{r.completed} of {r.total} ok · {r.failed} failed · {r.not_sent} not sent"
    if r.cancelled:
        head += " · cancelled"
    style = "bold $success" if r.completed == r.total else "bold $warning" if r.completed else "bold $error"
    body = format_result(r)
    if r.peak_memory_bytes is None:
        body += "\npeak memory: not sampled (no engine processes known to this pane)"
    return Content("\n").join([Content.styled(head, style), Content(body)])


def parse_int_list(text: str) -> list[int] | None:
    parts = [p for p in text.replace(",", " ").split() if p]
    return [int(p) for p in parts] if parts else None


class _EngineMemory:
    """Adapts a ResourceSampler bound to the engine's pids to the burst's
    memory_sampler callable (GPU memory with NVML, else the engine's RSS)."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        from ernie_tui.engine_ctl.resources import ResourceSampler

        self.sampler = ResourceSampler(pids)
        self.source = "GPU memory (NVML)" if self.sampler.nvml else "engine RSS"

    def __call__(self) -> float | None:
        return self.sampler.sample().shown_bytes

    def close(self) -> None:
        self.sampler.close()


class _TextPump:
    """Runs in the probe's thread: collects streamed text and posts it at
    most every TEXT_INTERVAL_S."""

    def __init__(self, post: Callable[[Message], Any], run: int) -> None:
        self.post = post
        self.run = run
        self.parts: list[str] = []
        self.last = 0.0

    def __call__(self, text: str) -> None:
        self.parts.append(text)
        now = time.monotonic()
        if now - self.last >= TEXT_INTERVAL_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.parts:
            self.post(ProbeText(self.run, "".join(self.parts)))
            self.parts.clear()
        self.last = time.monotonic() if now is None else now


def _field(label: str, widget) -> Vertical:
    box = Vertical(Label(label), widget, classes="pf-field")
    return box


class ProbeScreen(Screen[None]):
    """The probe pane. `url` is the server; `engine_pids` (optional) returns
    the engine's process ids so a burst can report its peak memory;
    `preset` and `engine_report` (optional) tag the burst's run record. Any
    of the three left out is looked up on the app when it offers it."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+r", "run", "Send / run"),
        Binding("ctrl+c", "cancel", "Cancel", priority=True),
        Binding("x", "cancel", "Cancel", show=False),
        Binding("ctrl+b", "switch_tab", "Probe/Burst"),
    ]

    DEFAULT_CSS = """
    ProbeScreen {
        layout: vertical;
        background: $background;
    }
    ProbeScreen #pf-head {
        height: 1;
        background: $panel;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    ProbeScreen TabbedContent { height: 1fr; }
    ProbeScreen TabPane { padding: 0 0; height: 1fr; }
    ProbeScreen #pf-probe-body { height: 1fr; }
    ProbeScreen #pf-left { width: 1fr; min-width: 40; padding: 0 1 0 0; }
    ProbeScreen #pf-right { width: 1fr; min-width: 30; }
    ProbeScreen #pf-ready { height: 1; margin: 0 0 1 0; }
    ProbeScreen #pf-prompt { height: 1fr; min-height: 4; border: round $primary 60%; }
    ProbeScreen #pf-prompt:focus { border: round $primary; }
    ProbeScreen .pf-row { height: auto; margin: 1 0 0 0; }
    ProbeScreen .pf-field { width: auto; height: 2; margin: 0 2 0 0; }
    ProbeScreen .pf-field Label { color: $text-muted; }
    ProbeScreen .pf-field Input { width: 11; }
    ProbeScreen .pf-field Input.-wide { width: 16; }
    ProbeScreen .pf-row Checkbox { margin: 1 2 0 0; }
    ProbeScreen TabPane > .pf-row Checkbox { margin: 0 2 0 0; }
    ProbeScreen .pf-buttons Checkbox { margin: 0 0 0 2; }
    ProbeScreen .pf-buttons { height: 1; margin: 1 0 0 0; }
    ProbeScreen Button { width: auto; min-width: 0; margin: 0 1 0 0; }
    ProbeScreen #pf-output-box {
        height: 1fr;
        border: round $secondary 60%;
        border-title-color: $secondary;
        padding: 0 1;
    }
    ProbeScreen #pf-stats, ProbeScreen #pf-burst-status {
        height: auto;
        min-height: 3;
        padding: 0 1;
        border: round $accent 50%;
        border-title-color: $accent;
    }
    ProbeScreen #pf-stats.-error, ProbeScreen #pf-burst-result.-error {
        border: heavy $error;
        background: $error 10%;
    }
    ProbeScreen #pf-note { height: auto; color: $text-muted; padding: 0 1; }
    ProbeScreen #pf-burst-progress { margin: 1 0 0 0; height: 1; }
    ProbeScreen #pf-burst-box {
        height: 1fr;
        border: round $accent 50%;
        border-title-color: $accent;
        padding: 0 1;
    }
    """

    def __init__(self, url: str, api_key: str | None = None, *,
                 engine_pids: Callable[[], list[int]] | None = None,
                 preset: Any = None, engine_report: Any = None,
                 name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.url = url
        self.api_key = api_key
        self._engine_pids = engine_pids
        self._preset = preset
        self._engine_report = engine_report
        self.served: ServedModel | None = None
        self._tokenizer: Any = None
        self._probe_run = 0  # ids that let late messages of an earlier probe/burst be ignored
        self._burst_run = 0
        self._probe_cancel: threading.Event | None = None
        self._burst_cancel: threading.Event | None = None
        self.probe_running = False
        self.burst_running = False
        self.streamed_text = ""  # what the stream showed, before the final result replaced it
        self.stream_updates = 0
        self.last_probe: ProbeResult | None = None
        self.last_burst: BurstResult | None = None
        self.last_record: str | None = None

    # -- layout ---------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(Content.assemble(("Probe ", "bold"), self.url, ("  · reading /v1/models …", "dim")),
                     id="pf-head")
        with TabbedContent(initial="pf-tab-probe"):
            with TabPane("Probe", id="pf-tab-probe"):
                with Horizontal(id="pf-probe-body"):
                    with Vertical(id="pf-left"):
                        with Horizontal(id="pf-ready"):
                            yield Button("Short", id="pf-ready-short", compact=True,
                                         tooltip="a short English question")
                            yield Button("Chinese", id="pf-ready-chinese", compact=True, tooltip=CHINESE_PROMPT)
                            yield Button(f"Long {LONG_PROMPT_TOKENS:,} tok", id="pf-ready-long", compact=True,
                                         tooltip="built with the served model's tokenizer")
                        yield TextArea(SHORT_PROMPT, id="pf-prompt", soft_wrap=True)
                        with Horizontal(classes="pf-row"):
                            yield _field("max_tokens", Input(str(DEFAULT_MAX_TOKENS), type="integer",
                                                             id="pf-max-tokens", compact=True))
                            yield _field("temperature", Input(str(DEFAULT_TEMPERATURE), type="number",
                                                              id="pf-temperature", compact=True))
                            yield _field("top_p", Input(str(DEFAULT_TOP_P), type="number", id="pf-top-p",
                                                        compact=True))
                        with Horizontal(classes="pf-row"):
                            yield _field("stop_token_ids", Input("", placeholder="e.g. 2, 100", id="pf-stop",
                                                                 compact=True, classes="-wide"))
                            yield Checkbox("chat endpoint", False, id="pf-chat", compact=True)
                        with Horizontal(classes="pf-buttons"):
                            yield Button("Send (ctrl+r)", id="pf-send", variant="primary", compact=True)
                            yield Button("Cancel (ctrl+c)", id="pf-cancel", compact=True, disabled=True)
                    with Vertical(id="pf-right"):
                        with VerticalScroll(id="pf-output-box"):
                            yield Static("", id="pf-output", markup=False)
                        yield Static(Content.styled("ctrl+r sends the prompt", "dim"), id="pf-stats")
            with TabPane("Burst", id="pf-tab-burst"):
                with Horizontal(classes="pf-row"):
                    yield _field("N requests", Input("100", type="integer", id="pf-b-n", compact=True))
                    yield _field("L_min tokens", Input("30", type="integer", id="pf-b-lmin", compact=True))
                    yield _field("L_max tokens", Input("300", type="integer", id="pf-b-lmax", compact=True))
                    yield _field("concurrency C", Input("4", type="integer", id="pf-b-c", compact=True))
                    yield _field("max_tokens", Input("128", type="integer", id="pf-b-max", compact=True))
                with Horizontal(classes="pf-row"):
                    yield Checkbox("ignore_eos", True, id="pf-b-ignore-eos", compact=True)
                    yield Checkbox("chat endpoint", False, id="pf-b-chat", compact=True)
                with Horizontal(classes="pf-buttons"):
                    yield Button("Run burst (ctrl+r)", id="pf-b-run", variant="primary", compact=True)
                    yield Button("Cancel (ctrl+c)", id="pf-b-cancel", compact=True, disabled=True)
                progress = ProgressBar(total=None, id="pf-burst-progress", show_eta=True)
                progress.display = False
                yield progress
                yield Static("", id="pf-note")
                with VerticalScroll(id="pf-burst-box"):
                    yield Static(Content.styled(
                        "Prompt lengths are exact (built with the served model's tokenizer); ignore_eos makes "
                        "every request produce max_tokens tokens. ctrl+r runs the burst.", "dim"),
                        id="pf-burst-result")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#pf-prompt").border_title = "prompt"
        self.query_one("#pf-output-box").border_title = "reply"
        self.query_one("#pf-stats").border_title = "figures"
        self.query_one("#pf-burst-box").border_title = "result"
        self.query_one("#pf-prompt", TextArea).focus()
        self._fetch_model()

    def on_unmount(self) -> None:
        for ev in (self._probe_cancel, self._burst_cancel):
            if ev is not None:
                ev.set()

    # -- model info ------------------------------------------------------------------
    @work(thread=True, group="pf-model", exit_on_error=False)
    def _fetch_model(self) -> None:
        from ernie_tui.engine_ctl.http_client import resolve_model
        from ernie_tui.engine_ctl.http_errors import ProbeFailure

        try:
            served = resolve_model(self.url, None, self.api_key)
        except ProbeFailure as exc:
            self.post_message(ModelInfo(None, exc.error.message))
            return
        except Exception as exc:  # never let a lookup kill the pane
            self.post_message(ModelInfo(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ModelInfo(served))

    @on(ModelInfo)
    @drop_when_torn_down
    def _model_info(self, message: ModelInfo) -> None:
        head = self.query_one("#pf-head", Static)
        if message.model is None:
            self.served = None
            head.update(Content.assemble(("Probe ", "bold"), self.url, "  · ",
                                         (f"cannot read /v1/models: {message.error}", "$error")))
            return
        self.served = message.model
        limit = f"{message.model.max_model_len:,}" if message.model.max_model_len else "?"
        head.update(Content.assemble(("Probe ", "bold"), self.url, ("  · model ", "dim"), (message.model.id, "bold"),
                                     ("  · max_model_len ", "dim"), (limit, "bold")))

    # -- ready-made prompts ---------------------------------------------------------------
    @on(Button.Pressed, "#pf-ready-short, #pf-ready-chinese")
    def _ready_plain(self, event: Button.Pressed) -> None:
        key = (event.button.id or "").removeprefix("pf-ready-")
        self.set_prompt(PROMPT_CHOICES[key])

    @on(Button.Pressed, "#pf-ready-long")
    def _ready_long(self) -> None:
        self.query_one("#pf-ready-long", Button).disabled = True
        self._set_stats(Content.styled("building the long prompt with the served model's tokenizer …", "dim"))
        self._build_long()

    @work(thread=True, group="pf-long", exit_on_error=False)
    def _build_long(self) -> None:
        from ernie_tui.engine_ctl.http_errors import ProbeFailure
        from ernie_tui.engine_ctl.prompts import find_tokenizer, long_prompt

        try:
            if self._tokenizer is None:
                self._tokenizer = find_tokenizer(url=self.url, api_key=self.api_key)
            built = long_prompt(self._tokenizer)
        except ProbeFailure as exc:
            self.post_message(LongPromptReady(None, error=exc.error.message))
            return
        except Exception as exc:
            self.post_message(LongPromptReady(None, error=f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(LongPromptReady(built.text, built.tokens, built.target))

    @on(LongPromptReady)
    @drop_when_torn_down
    def _long_ready(self, message: LongPromptReady) -> None:
        self.query_one("#pf-ready-long", Button).disabled = False
        if message.text is None:
            self._set_stats(Content.assemble(("Cannot build the long prompt: ", "bold $error"), message.error or ""),
                            error=True)
            return
        self.set_prompt(message.text)
        exact = "exactly" if message.tokens == message.target else "about"
        self._set_stats(Content.styled(f"long prompt: {exact} {message.tokens:,} tokens by the served model's "
                                       "tokenizer", "dim"))

    def set_prompt(self, text: str) -> None:
        area = self.query_one("#pf-prompt", TextArea)
        area.load_text(text)
        area.focus()

    # -- probe -------------------------------------------------------------------------------
    def _read_request(self) -> ProbeRequest:
        """The editor's prompt and settings. Raises ValueError in plain words."""
        prompt = self.query_one("#pf-prompt", TextArea).text
        if not prompt.strip():
            raise ValueError("the prompt is empty")

        def number(wid: str, kind, what: str, lo: float | None = None, hi: float | None = None):
            raw = self.query_one(wid, Input).value.strip()
            if not raw:
                return None
            try:
                v = kind(raw)
            except ValueError:
                raise ValueError(f"{what} must be a number, got {raw!r}") from None
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise ValueError(f"{what} must be between {lo:g} and {hi:g}, got {raw}")
            return v

        max_tokens = number("#pf-max-tokens", int, "max_tokens", 1, 10**7)
        temperature = number("#pf-temperature", float, "temperature", 0, 100)
        top_p = number("#pf-top-p", float, "top_p", 0, 1)
        try:
            stop = parse_int_list(self.query_one("#pf-stop", Input).value)
        except ValueError:
            raise ValueError("stop_token_ids must be whole numbers separated by commas or spaces") from None
        return ProbeRequest(prompt=prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            stop_token_ids=stop, chat=self.query_one("#pf-chat", Checkbox).value,
                            model=self.served.id if self.served else None)

    def send_probe(self) -> None:
        if self.probe_running:
            self.notify("a probe is running: ctrl+c cancels it", timeout=3)
            return
        if self.burst_running:
            self.notify("a burst is running: its figures would include this probe; wait or cancel it",
                        severity="warning", timeout=4)
            return
        try:
            request = self._read_request()
        except ValueError as exc:
            self._set_stats(Content.assemble(("Cannot send: ", "bold $error"), str(exc)), error=True)
            return
        self._probe_run += 1
        self._probe_cancel = threading.Event()
        self.probe_running = True
        self.streamed_text = ""
        self.stream_updates = 0
        self.last_probe = None
        self.query_one("#pf-output", Static).update("")
        self.query_one("#pf-output-box").border_title = f"reply · streaming from {request.path}"
        self._set_stats(Content.styled("waiting for the first token …", "$warning"))
        self._buttons()
        self._probe_worker(self._probe_run, request, self._probe_cancel)

    @work(thread=True, group="pf-probe", exit_on_error=False)
    def _probe_worker(self, run: int, request: ProbeRequest, cancel: threading.Event) -> None:
        from ernie_tui.engine_ctl.probe import run_probe

        pump = _TextPump(self.post_message, run)
        try:
            result = run_probe(self.url, request=request, api_key=self.api_key, on_text=pump, cancel=cancel)
        except Exception as exc:  # the probe functions should not raise; be safe anyway
            result = ProbeResult(ok=False, model=request.model, endpoint=request.path,
                                 error=ProbeError("stream_error", f"{type(exc).__name__}: {exc}"))
        pump.flush()
        self.post_message(ProbeDone(run, result))

    @on(ProbeText)
    @drop_when_torn_down
    def _probe_text(self, message: ProbeText) -> None:
        if message.run != self._probe_run or not self.probe_running:
            return
        self.streamed_text += message.text
        self.stream_updates += 1
        self.query_one("#pf-output", Static).update(Content(self.streamed_text))
        self.query_one("#pf-output-box", VerticalScroll).scroll_end(animate=False)

    @on(ProbeDone)
    @drop_when_torn_down
    def _probe_done(self, message: ProbeDone) -> None:
        if message.run != self._probe_run:
            return
        r = message.result
        self.probe_running = False
        self.last_probe = r
        self._buttons()
        box = self.query_one("#pf-output-box")
        tokens = f" · {r.completion_tokens} tokens" if r.completion_tokens else ""
        box.border_title = f"reply · {r.endpoint}{tokens}"
        if r.text:
            self.query_one("#pf-output", Static).update(Content(r.text))
        if r.error is not None:
            body = describe_error(r.error, self.served.max_model_len if self.served else None)
            if r.chunks:
                body = Content("\n").join([body, describe_probe(r)])
            self._set_stats(body, error=r.error.kind != "cancelled")
            return
        self._set_stats(describe_probe(r))

    def _set_stats(self, content: Content, error: bool = False) -> None:
        stats = self.query_one("#pf-stats", Static)
        stats.update(content)
        stats.set_class(error, "-error")
        stats.border_title = "error" if error else "figures"

    # -- burst ---------------------------------------------------------------------------------
    def _read_burst(self) -> BurstConfig:
        def integer(wid: str, what: str) -> int:
            raw = self.query_one(wid, Input).value.strip()
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{what} must be a whole number, got {raw!r}") from None

        config = BurstConfig(n=integer("#pf-b-n", "N"), min_tokens=integer("#pf-b-lmin", "L_min"),
                             max_tokens_in=integer("#pf-b-lmax", "L_max"),
                             concurrency=integer("#pf-b-c", "C"), max_tokens=integer("#pf-b-max", "max_tokens"),
                             ignore_eos=self.query_one("#pf-b-ignore-eos", Checkbox).value,
                             chat=self.query_one("#pf-b-chat", Checkbox).value)
        config.validate()
        limit = self.served.max_model_len if self.served else None
        if limit and config.max_tokens_in + config.max_tokens > limit:
            raise ValueError(f"L_max + max_tokens ({config.max_tokens_in + config.max_tokens:,}) is more than the "
                             f"model's max_model_len ({limit:,}): those requests would be refused")
        return config

    def run_burst(self) -> None:
        if self.burst_running:
            self.notify("a burst is running: ctrl+c cancels it", timeout=3)
            return
        if self.probe_running:
            self.notify("a probe is running: wait for it or cancel it first", severity="warning", timeout=4)
            return
        result_box = self.query_one("#pf-burst-result", Static)
        try:
            config = self._read_burst()
        except ValueError as exc:
            result_box.update(Content.assemble(("Cannot run: ", "bold $error"), str(exc)))
            result_box.set_class(True, "-error")
            return
        self._burst_run += 1
        self._burst_cancel = threading.Event()
        self.burst_running = True
        self.last_burst = None
        self.last_record = None
        result_box.set_class(False, "-error")
        result_box.update(Content.styled("building exact-length prompts with the served model's tokenizer, "
                                         "then opening the connections …", "$warning"))
        bar = self.query_one("#pf-burst-progress", ProgressBar)
        bar.display = True
        bar.update(total=config.n, progress=0)
        self.query_one("#pf-note", Static).update(f"0 / {config.n} requests")
        self._buttons()
        pids = self._pids_source()
        preset, report = self._record_tags()
        self._burst_worker(self._burst_run, config, self._burst_cancel, pids, preset, report)

    @work(thread=True, group="pf-burst", exit_on_error=False)
    def _burst_worker(self, run: int, config: BurstConfig, cancel: threading.Event,
                      pids: Callable[[], list[int]] | None, preset: Any, report: Any) -> None:
        from ernie_tui.engine_ctl.burst import run_burst

        counts = {"ok": 0, "failed": 0}

        def on_request(rec) -> None:
            counts["ok" if rec.ok else "failed"] += 1

        def progress(done: int, total: int) -> None:
            self.post_message(BurstProgress(run, done, total, counts["ok"], counts["failed"]))

        memory = None
        try:
            if pids is not None:
                try:
                    memory = _EngineMemory(pids)
                except Exception:
                    memory = None
            result = run_burst(self.url, config, api_key=self.api_key, model=self.served.id if self.served else None,
                               tokenizer=self._tokenizer, progress=progress, on_request=on_request,
                               cancel=cancel, memory_sampler=memory)
        except Exception as exc:
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
            except Exception as exc:
                error = f"the run record was not saved: {exc}"
        self.post_message(BurstDone(run, result, record_id, record_path, error))

    @on(BurstProgress)
    @drop_when_torn_down
    def _burst_progress(self, message: BurstProgress) -> None:
        if message.run != self._burst_run or not self.burst_running:
            return
        self.query_one("#pf-burst-progress", ProgressBar).update(total=message.total, progress=message.done)
        failed = f" · {message.failed} failed" if message.failed else ""
        self.query_one("#pf-note", Static).update(f"{message.done} / {message.total} requests{failed}")
        if message.done == 0:
            self.query_one("#pf-burst-result", Static).update(Content.styled("running …", "$warning"))

    @on(BurstDone)
    @drop_when_torn_down
    def _burst_done(self, message: BurstDone) -> None:
        if message.run != self._burst_run:
            return
        self.burst_running = False
        self._buttons()
        box = self.query_one("#pf-burst-result", Static)
        r = message.result
        if r is None:
            box.update(Content.assemble(("The burst failed: ", "bold $error"), message.error or "?"))
            box.set_class(True, "-error")
            return
        self.last_burst = r
        self.last_record = message.record
        bar = self.query_one("#pf-burst-progress", ProgressBar)
        bar.update(total=r.total, progress=r.completed + r.failed)
        self.query_one("#pf-note", Static).update(
            f"{r.completed + r.failed} / {r.total} requests" + (f" · {r.failed} failed" if r.failed else ""))
        parts = [describe_burst(r)]
        if message.record:
            parts.append(Content.assemble(("saved as run record ", "dim"), (message.record, "bold"),
                                          ("  ", "dim"), (message.record_path or "", "dim")))
        if message.error:
            parts.append(Content.styled(message.error, "$warning"))
        box.update(Content("\n").join(parts))
        box.set_class(r.completed == 0, "-error")

    def _pids_source(self) -> Callable[[], list[int]] | None:
        if self._engine_pids is not None:
            return self._engine_pids
        server = getattr(self.app, "server", None)
        fn = getattr(server, "engine_pids", None)
        return fn if callable(fn) else None

    def _record_tags(self) -> tuple[Any, Any]:
        """The preset and engine report to tag the run record with: given to
        the screen, or the app's when it serves this URL."""
        preset, report = self._preset, self._engine_report
        app = self.app
        try:
            status = getattr(app, "status", None)
            if status is not None and getattr(status, "url", None) and \
                    status.url.rstrip("/") != self.url.rstrip("/"):
                return preset, report
            if preset is None and status is not None and status.preset_name:
                book = getattr(app, "book", None)
                preset = book.get(status.preset_name) if book is not None and status.preset_name in book \
                    else status.preset_name
            if report is None:
                report = getattr(app, "report", None)
        except Exception:
            pass
        return preset, report

    # -- keys and buttons ------------------------------------------------------------------------
    def _buttons(self) -> None:
        self.query_one("#pf-send", Button).disabled = self.probe_running
        self.query_one("#pf-cancel", Button).disabled = not self.probe_running
        self.query_one("#pf-b-run", Button).disabled = self.burst_running
        self.query_one("#pf-b-cancel", Button).disabled = not self.burst_running
        self.refresh_bindings()

    @property
    def on_burst_tab(self) -> bool:
        return self.query_one(TabbedContent).active == "pf-tab-burst"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.probe_running or self.burst_running
        return True

    def action_run(self) -> None:
        if self.on_burst_tab:
            self.run_burst()
        else:
            self.send_probe()

    def action_cancel(self) -> None:
        # The tab in view first; else whatever runs.
        targets = ([self._burst_cancel, self._probe_cancel] if self.on_burst_tab
                   else [self._probe_cancel, self._burst_cancel])
        running = [self.burst_running, self.probe_running] if self.on_burst_tab else [self.probe_running,
                                                                                       self.burst_running]
        for ev, busy in zip(targets, running):
            if busy and ev is not None:
                ev.set()
                self.notify("cancelling …", timeout=2)
                return

    def action_switch_tab(self) -> None:
        tabs = self.query_one(TabbedContent)
        tabs.active = "pf-tab-probe" if tabs.active == "pf-tab-burst" else "pf-tab-burst"

    def action_close(self) -> None:
        self.on_unmount()  # cancel whatever runs; the threads end on their own
        self.dismiss(None)

    @on(Button.Pressed, "#pf-send")
    def _send_pressed(self) -> None:
        self.send_probe()

    @on(Button.Pressed, "#pf-b-run")
    def _burst_pressed(self) -> None:
        self.run_burst()

    @on(Button.Pressed, "#pf-cancel, #pf-b-cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
