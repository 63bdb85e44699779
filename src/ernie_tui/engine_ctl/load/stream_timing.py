"""What a streamed completions/chat answer says, and when: the timing.

Timing definitions (all client-side, time.perf_counter):
- TTFT: request sent -> arrival of the first chunk that carries a generated
  token (the chat endpoint's opening role-only chunk does not count). A
  probe first warms its client (warm_client: a GET /v1/models on the same
  connection), so connecting and first-use costs are outside the span.
- Inter-token latency (ITL): one gap per event that brings tokens, from the
  previous such event, as vLLM's bench client (`vllm bench serve`) measures
  it: the issue's one meaning of an ITL objective is the bench client's. An
  event that holds several tokens (vLLM merges them when its API server falls
  behind) is one gap, and events that arrived in the same read are 0 apart
  (the bench client stamps each after parsing it: microseconds apart). The
  gaps of a request sum to (last token - first token). The per-token figure
  is TPOT: (latency - TTFT) / (tokens - 1), per request.
- Latency: request sent -> the read that held `[DONE]` (the end of the
  stream where the server sent none).
- output_tps: completion tokens / latency (what a caller waits for);
  decode_tps: (completion tokens - 1) / (last token - first token).

StreamState takes the decoded events of each read (transport-independent,
so it can be tested with canned chunks); _finish turns it into a ProbeResult.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ernie_tui.engine_ctl.load import stats
from ernie_tui.engine_ctl.load.http_errors import ProbeError, ProbeErrorKind, _looks_too_long, parse_too_long
from ernie_tui.engine_ctl.load.sse import DONE
from ernie_tui.engine_ctl.load.stream_chunk import ErrorEvent, read_chunk

log = logging.getLogger(__name__)

# The source articles' Chainlit page used these sampling settings.
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9


@dataclass
class StreamState:
    """Accumulates what a completions/chat stream told us, independent of any
    transport, so it can be tested with canned chunks."""

    t_start: float
    chat: bool = False
    on_text: Callable[[str], None] | None = None
    text_parts: list[str] = field(default_factory=list)
    t_first: float | None = None
    t_last: float | None = None
    itls: list[float] = field(default_factory=list)
    tokens_seen: int = 0  # generated tokens counted from the chunks
    token_events: int = 0  # events that brought a token
    reads: int = 0  # network reads that brought a token
    t_done: float | None = None  # the read that held [DONE]
    chunks: int = 0
    malformed: int = 0  # events that are not a chunk of ours (stream_chunk.read_chunk)
    # From the SSE parser, set by the transport at the end: lines that are no
    # SSE field, and lines dropped for their size.
    non_sse_lines: int = 0
    oversized_lines: int = 0
    done: bool = False
    finish_reason: str | None = None
    stop_reason: Any = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    stream_error: ProbeError | None = None
    server_metrics: dict | None = None

    def handle(self, payload: Any, t: float) -> None:
        """One event that arrived at time t (alone in its read)."""
        self.handle_read((payload,), t)

    def handle_read(self, payloads: Sequence[Any], t: float) -> None:
        """All the events of one read, which arrived together at time t.

        Each event that brings a token is one inter-token gap, as the bench
        client counts them (module docstring); the reads that carried them
        are counted too (`reads`), so a client that falls behind its streams
        shows as events per read above 1."""
        took = False
        for payload in payloads:
            if self._absorb(payload) <= 0:
                if payload is DONE and self.t_done is None:
                    self.t_done = t
                continue
            took = True
            if self.t_first is None:
                self.t_first = t
            elif self.t_last is not None:
                self.itls.append(t - self.t_last)
            self.t_last = t
            self.token_events += 1
        if took:
            self.reads += 1

    def _absorb(self, payload: Any) -> int:
        """Take in one event; return how many generated tokens it brought."""
        if payload is DONE:
            self.done = True
            return 0
        chunk = read_chunk(payload, self.chat)
        if chunk is None:
            self.malformed += 1
            return 0
        if isinstance(chunk, ErrorEvent):
            msg = chunk.message
            if chunk.status == 400 and _looks_too_long(msg):
                limit, prompt = parse_too_long(msg)
                self.stream_error = ProbeError(ProbeErrorKind.PROMPT_TOO_LONG, msg, 400, limit, prompt)
            else:
                self.stream_error = ProbeError(ProbeErrorKind.STREAM_ERROR,
                                               f"the server reported an error mid-stream: {msg}", chunk.status)
            return 0
        self.chunks += 1
        if chunk.prompt_tokens is not None:
            self.usage_prompt_tokens = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            self.usage_completion_tokens = chunk.completion_tokens
        if chunk.metrics is not None:
            self.server_metrics = chunk.metrics
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.stop_reason = chunk.stop_reason
        if not chunk.has_choice:
            return 0  # the final usage-only chunk: no new token
        text = chunk.text
        # How many tokens this chunk brought: exact with continuous usage stats,
        # otherwise one per non-empty chunk (the usage chunk fixes the total).
        if chunk.completion_tokens is not None:
            new = max(0, chunk.completion_tokens - self.tokens_seen)
        else:
            new = 1 if text else 0
        if text:
            self.text_parts.append(text)
            if self.on_text is not None:
                try:
                    self.on_text(text)
                except Exception:  # noqa: BLE001  a display callback must not kill the measurement
                    log.exception("probe on_text callback failed")
        self.tokens_seen += new
        return new

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


# ---------------------------------------------------------------------------
# Requests and results

@dataclass
class ProbeRequest:
    prompt: str
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = DEFAULT_TEMPERATURE
    top_p: float | None = DEFAULT_TOP_P
    stop_token_ids: list[int] | None = None
    chat: bool = False
    model: str | None = None
    ignore_eos: bool = False
    # Usage in every chunk gives each read's exact token count (exact ITL when
    # vLLM merges tokens into one chunk), but vLLM pays for it: on an H200 at
    # concurrency 256 it served 11-17 % fewer tokens/s with it than without
    # (docs/lab/benchmarks/client-cpu.md). A single probe keeps it; load (bursts, capacity
    # levels) asks for usage only at the end, as vLLM's bench client does, and
    # counts one token per non-empty chunk, the final usage fixing the total.
    continuous_usage: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the JSON body last

    def body(self, model: str) -> dict[str, Any]:
        options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            options["continuous_usage_stats"] = True
        body: dict[str, Any] = {"model": model, "stream": True, "stream_options": options}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra)
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"


@dataclass
class ProbeResult:
    ok: bool
    model: str | None
    endpoint: str
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from the server's usage
    completion_tokens: int | None = None  # from the server's usage (else counted chunks)
    ttft_s: float | None = None
    itl_mean_s: float | None = None
    itl_p90_s: float | None = None
    latency_s: float | None = None
    output_tps: float | None = None
    decode_tps: float | None = None
    chunks: int = 0
    token_events: int = 0  # events that brought a token (one ITL gap each after the first)
    reads: int = 0  # the network reads that carried them
    malformed_lines: int = 0
    got_done: bool = False
    error: ProbeError | None = None
    itls: list[float] = field(default_factory=list, repr=False)
    started_at: float | None = None  # wall clock
    t_start: float | None = None  # perf_counter at send, for ordering within a burst
    server_metrics: dict | None = None  # vLLM's per-request metrics when it is configured to send them

    def to_dict(self, with_itls: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["error"] = self.error.to_dict() if self.error else None
        if not with_itls:
            d.pop("itls", None)
        return d


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _junk_held(state: StreamState) -> str:
    """What a stream held besides tokens, in words ('' when nothing)."""
    parts = []
    if state.malformed:
        parts.append(_plural(state.malformed, "malformed event", "malformed events"))
    if state.non_sse_lines:
        parts.append(_plural(state.non_sse_lines, "line that is not a server-sent event",
                             "lines that are not server-sent events"))
    if state.oversized_lines:
        parts.append(_plural(state.oversized_lines, "line over the size limit", "lines over the size limit"))
    return ", ".join(parts)


def _unfinished_stream_error(state: StreamState) -> ProbeError:
    """A stream that ended cleanly with no finish_reason, or with [DONE] but
    no token: say what it held rather than guess that the server died."""
    junk = _junk_held(state)
    if state.tokens_seen == 0 and junk:
        return ProbeError(ProbeErrorKind.BAD_RESPONSE,
                          f"the stream ended without a token; it held {junk}: is this URL a vLLM server?")
    if state.tokens_seen == 0 and state.done:
        return ProbeError(ProbeErrorKind.BAD_RESPONSE, "the server ended the stream ([DONE]) without a token")
    where = "before any token" if state.tokens_seen == 0 else f"after {state.tokens_seen} tokens"
    also = f"; it also held {junk}" if junk else ""
    return ProbeError(ProbeErrorKind.DISCONNECTED,
                      f"the stream ended {where} without finishing (did the server die?){also}")


def _finish(state: StreamState, request: ProbeRequest, model: str, t_end: float,
            error: ProbeError | None, started_at: float) -> ProbeResult:
    completion = state.usage_completion_tokens if state.usage_completion_tokens is not None else (
        state.tokens_seen if state.chunks else None)
    # The stream's end is the read that held [DONE], not the end of draining
    # the body after it (probe.py reads on so the connection can be reused).
    latency = (state.t_done if state.t_done is not None else t_end) - state.t_start
    ttft = None if state.t_first is None else state.t_first - state.t_start
    decode = None
    if completion and completion > 1 and state.t_first is not None and state.t_last is not None \
            and state.t_last > state.t_first:
        decode = (completion - 1) / (state.t_last - state.t_first)
    if error is None and state.stream_error is not None:
        error = state.stream_error
    if error is None and state.finish_reason is None and (not state.done or state.tokens_seen == 0):
        error = _unfinished_stream_error(state)
    return ProbeResult(
        ok=error is None,
        model=model,
        endpoint=request.path,
        text=state.text,
        finish_reason=state.finish_reason,
        prompt_tokens=state.usage_prompt_tokens,
        completion_tokens=completion,
        ttft_s=ttft,
        itl_mean_s=stats.mean(state.itls),
        itl_p90_s=stats.percentile(state.itls, 90),
        latency_s=latency,
        output_tps=stats.rate(completion, latency) if completion else None,
        decode_tps=decode,
        chunks=state.chunks,
        token_events=state.token_events,
        reads=state.reads,
        malformed_lines=state.malformed + state.non_sse_lines + state.oversized_lines,
        got_done=state.done,
        error=error,
        itls=state.itls,
        started_at=started_at,
        t_start=state.t_start,
        server_metrics=state.server_metrics,
    )

