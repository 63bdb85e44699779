"""The probe pane's Probe tab: one prompt, streamed and timed.

A prompt editor with the ready-made prompts (short English, the articles'
Chinese question, a ~1,500-token prompt built with the served model's own
tokenizer), sampling settings, completions or chat. The reply streams in as
it arrives; then TTFT, inter-token latency mean/p90, output tok/s, the
server's usage tokens and finish_reason. Errors (prompt too long with vLLM's
message and the model's limit, 5xx, refused, timeouts, a server that dies
mid-stream) are shown in plain words.

The probe runs in a thread worker with its own event loop (so the UI's
rendering never sits between two timestamps of the stream); it only posts
messages (tui/messages.py) to this widget. Streamed text is batched in the
worker (at most one message per TEXT_INTERVAL_S) and coalesced again by
`can_replace` if the UI is behind, so a fast stream cannot flood the UI.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Checkbox, Input, Static, TextArea

from ernie_tui.engine_ctl.load import (
    CHINESE_PROMPT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    LONG_PROMPT_TOKENS,
    SHORT_PROMPT,
    ProbeError,
    ProbeErrorKind,
    ProbeFailure,
    ProbeRequest,
    ProbeResult,
    ServedModel,
    find_tokenizer,
    long_prompt,
    run_probe,
)
from ernie_tui.tui.failures import ShowsWorkerFailures
from ernie_tui.tui.lifecycle import drop_when_torn_down
from ernie_tui.tui.messages import LongPromptReady, ProbeDone, ProbeText
from ernie_tui.tui.widgets.form import labelled

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


@dataclass
class ProbeTarget:
    """The server both tabs talk to, and what the pane learnt about it:
    the served model (from /v1/models) and its tokenizer once built."""

    url: str
    api_key: str | None = None
    served: ServedModel | None = None
    tokenizer: Any = None


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


def parse_int_list(text: str) -> list[int] | None:
    parts = [p for p in text.replace(",", " ").split() if p]
    return [int(p) for p in parts] if parts else None


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


class ProbeTab(ShowsWorkerFailures, Vertical):
    """The Probe tab. `send()` starts a probe (the screen decides whether it
    may), `cancel()` ends the running one."""

    def __init__(self, target: ProbeTarget, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.target = target
        self._run = 0  # ids that let late messages of an earlier probe be ignored
        self._cancel: threading.Event | None = None
        self.running = False
        self.streamed_text = ""  # what the stream showed, before the final result replaced it
        self.stream_updates = 0
        self.last_probe: ProbeResult | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="pf-probe-body"):
            with Vertical(id="pf-left"):
                with Horizontal(id="pf-ready"):
                    yield Button("Short", id="pf-ready-short", compact=True, tooltip="a short English question")
                    yield Button("Chinese", id="pf-ready-chinese", compact=True, tooltip=CHINESE_PROMPT)
                    yield Button(f"Long {LONG_PROMPT_TOKENS:,} tok", id="pf-ready-long", compact=True,
                                 tooltip="built with the served model's tokenizer")
                yield TextArea(SHORT_PROMPT, id="pf-prompt", soft_wrap=True)
                with Horizontal(classes="pf-row"):
                    yield labelled("max_tokens", Input(str(DEFAULT_MAX_TOKENS), type="integer", id="pf-max-tokens",
                                                       compact=True))
                    yield labelled("temperature", Input(str(DEFAULT_TEMPERATURE), type="number",
                                                        id="pf-temperature", compact=True))
                    yield labelled("top_p", Input(str(DEFAULT_TOP_P), type="number", id="pf-top-p", compact=True))
                with Horizontal(classes="pf-row"):
                    yield labelled("stop_token_ids", Input("", placeholder="e.g. 2, 100", id="pf-stop",
                                                           compact=True, classes="-wide"))
                    yield Checkbox("chat endpoint", False, id="pf-chat", compact=True)
                with Horizontal(classes="pf-buttons"):
                    yield Button("Send (ctrl+r)", id="pf-send", variant="primary", compact=True)
                    yield Button("Cancel (ctrl+c)", id="pf-cancel", compact=True, disabled=True)
            with Vertical(id="pf-right"):
                with VerticalScroll(id="pf-output-box"):
                    yield Static("", id="pf-output", markup=False)
                yield Static(Content.styled("ctrl+r sends the prompt", "dim"), id="pf-stats")

    def on_mount(self) -> None:
        self.query_one("#pf-prompt").border_title = "prompt"
        self.query_one("#pf-output-box").border_title = "reply"
        self.query_one("#pf-stats").border_title = "figures"

    def on_unmount(self) -> None:
        self.cancel()

    # -- ready-made prompts ---------------------------------------------------------------
    @on(Button.Pressed, "#pf-ready-short, #pf-ready-chinese")
    def _ready_plain(self, event: Button.Pressed) -> None:
        event.stop()
        key = (event.button.id or "").removeprefix("pf-ready-")
        self.set_prompt(PROMPT_CHOICES[key])

    @on(Button.Pressed, "#pf-ready-long")
    def _ready_long(self, event: Button.Pressed) -> None:
        event.stop()
        self.query_one("#pf-ready-long", Button).disabled = True
        self.set_stats(Content.styled("building the long prompt with the served model's tokenizer …", "dim"))
        self._build_long()

    @work(thread=True, group="pf-long", exit_on_error=False)
    def _build_long(self) -> None:
        t = self.target
        try:
            if t.tokenizer is None:
                t.tokenizer = find_tokenizer(url=t.url, api_key=t.api_key)
            built = long_prompt(t.tokenizer)
        except ProbeFailure as exc:
            self.post_message(LongPromptReady(None, error=exc.error.message))
            return
        except (OSError, ValueError) as exc:  # an unreadable or odd tokenizer file
            self.post_message(LongPromptReady(None, error=f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(LongPromptReady(built.text, built.tokens, built.target))

    @on(LongPromptReady)
    @drop_when_torn_down
    def _long_ready(self, message: LongPromptReady) -> None:
        self.query_one("#pf-ready-long", Button).disabled = False
        if message.text is None:
            self.set_stats(Content.assemble(("Cannot build the long prompt: ", "bold $error"), message.error or ""),
                           error=True)
            return
        self.set_prompt(message.text)
        exact = "exactly" if message.tokens == message.target else "about"
        self.set_stats(Content.styled(f"long prompt: {exact} {message.tokens:,} tokens by the served model's "
                                      "tokenizer", "dim"))

    def set_prompt(self, text: str) -> None:
        area = self.query_one("#pf-prompt", TextArea)
        area.load_text(text)
        area.focus()

    # -- the probe ---------------------------------------------------------------------------
    def read_request(self) -> ProbeRequest:
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
        served = self.target.served
        return ProbeRequest(prompt=prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            stop_token_ids=stop, chat=self.query_one("#pf-chat", Checkbox).value,
                            model=served.id if served else None)

    def send(self) -> None:
        if self.running:
            self.notify("a probe is running: ctrl+c cancels it", timeout=3)
            return
        try:
            request = self.read_request()
        except ValueError as exc:
            self.set_stats(Content.assemble(("Cannot send: ", "bold $error"), str(exc)), error=True)
            return
        self._run += 1
        self._cancel = threading.Event()
        self.running = True
        self.streamed_text = ""
        self.stream_updates = 0
        self.last_probe = None
        self.query_one("#pf-output", Static).update("")
        self.query_one("#pf-output-box").border_title = f"reply · streaming from {request.path}"
        self.set_stats(Content.styled("waiting for the first token …", "$warning"))
        self._buttons()
        self._worker(self._run, request, self._cancel)

    def cancel(self) -> bool:
        """Ask the running probe to stop; False when none runs."""
        if self.running and self._cancel is not None:
            self._cancel.set()
            return True
        return False

    @work(thread=True, group="pf-probe", exit_on_error=False)
    def _worker(self, run: int, request: ProbeRequest, cancel: threading.Event) -> None:
        pump = _TextPump(self.post_message, run)
        try:
            result = run_probe(self.target.url, request=request, api_key=self.target.api_key, on_text=pump,
                               cancel=cancel)
        except Exception as exc:  # noqa: BLE001  run_probe reports failures in its result; a bug shows in the pane
            result = ProbeResult(ok=False, model=request.model, endpoint=request.path,
                                 error=ProbeError(ProbeErrorKind.STREAM_ERROR, f"{type(exc).__name__}: {exc}"))
        pump.flush()
        self.post_message(ProbeDone(run, result))

    @on(ProbeText)
    @drop_when_torn_down
    def _text(self, message: ProbeText) -> None:
        message.stop()
        if message.run != self._run or not self.running:
            return
        self.streamed_text += message.text
        self.stream_updates += 1
        self.query_one("#pf-output", Static).update(Content(self.streamed_text))
        self.query_one("#pf-output-box", VerticalScroll).scroll_end(animate=False)

    @on(ProbeDone)
    @drop_when_torn_down
    def _done(self, message: ProbeDone) -> None:
        message.stop()
        if message.run != self._run:
            return
        self.running = False
        self._buttons()
        self.show_result(message.result)

    def show_result(self, r: ProbeResult) -> None:
        """A finished probe: its reply and figures, or its error in plain words."""
        self.last_probe = r
        box = self.query_one("#pf-output-box")
        tokens = f" · {r.completion_tokens} tokens" if r.completion_tokens else ""
        box.border_title = f"reply · {r.endpoint}{tokens}"
        if r.text:
            self.query_one("#pf-output", Static).update(Content(r.text))
        if r.error is not None:
            served = self.target.served
            body = describe_error(r.error, served.max_model_len if served else None)
            if r.chunks:
                body = Content("\n").join([body, describe_probe(r)])
            self.set_stats(body, error=r.error.kind != "cancelled")
            return
        self.set_stats(describe_probe(r))

    def set_stats(self, content: Content, error: bool = False) -> None:
        stats = self.query_one("#pf-stats", Static)
        stats.update(content)
        stats.set_class(error, "-error")
        stats.border_title = "error" if error else "figures"

    def _buttons(self) -> None:
        self.query_one("#pf-send", Button).disabled = self.running
        self.query_one("#pf-cancel", Button).disabled = not self.running
        self.screen.refresh_bindings()
