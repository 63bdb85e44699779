"""One streaming request against a vLLM server, timed token by token.

The probe sends a completions or chat request with ``stream: true`` and
``stream_options: {"include_usage": true, "continuous_usage_stats": true}``.
The second option is vLLM's: every chunk then carries the running token
count, so we know exactly how many tokens each chunk holds even when vLLM
merges several into one chunk (it does when the client reads slower than the
engine produces). Servers that ignore it still work; each content chunk is
then counted as one token and the final usage chunk corrects the total.

Errors never raise out of the probe functions: they come back as a
ProbeResult whose ``error`` says what happened in plain words (prompt too
long with the model's limit, 5xx, refused connection, timeout, server gone
mid-stream, an answer that is not HTTP or not an event stream, a stream of
only malformed events). Reads have a timeout and the whole request a deadline, so a
wedged server cannot hang the caller.

The parts live in their own modules: http_client (URLs, clients, model
list), http_errors (ProbeError and the classifiers), sse (the event
parser), stream_chunk (the one check of an event's shape), stream_timing
(StreamState, ProbeRequest, ProbeResult) and
prompts (ready-made and exact-length prompts). This module sends the timed
request and re-exports the public names of those parts, so
`from ernie_tui.engine_ctl.load.probe import ...` keeps working.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from ernie_tui.engine_ctl.load.http_client import (
    _JSON_HEADERS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_TOTAL_TIMEOUT_S,
    TRANSPORTS,
    WARM_TIMEOUT_S,
    ServedModel,
    base_url,
    fast_loop_factory,
    list_models,
    new_async_client,
    resolve_model,
    warm_client,
)
from ernie_tui.engine_ctl.load.http_errors import (
    ProbeError,
    ProbeErrorKind,
    ProbeFailure,
    _is_aiohttp_error,
    classify_exception,
    error_from_response,
    not_an_event_stream,
    parse_too_long,
)
from ernie_tui.engine_ctl.load.prompts import (
    CHINESE_PROMPT,
    LONG_PROMPT_TOKENS,
    READY_PROMPTS,
    SHORT_PROMPT,
    BuiltPrompt,
    LocalTokenizer,
    PromptBuilder,
    ServerTokenizer,
    find_tokenizer,
    long_prompt,
    ready_prompt,
)
from ernie_tui.engine_ctl.load.sse import DONE, SSEEvent, SSEParser, decode_payload
from ernie_tui.engine_ctl.load.stream_timing import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    ProbeRequest,
    ProbeResult,
    StreamState,
    _finish,
)

# A response body we read for an error message; bigger bodies are cut.
_MAX_ERROR_BODY = 64 * 1024
# After [DONE] the rest of the body (the chunked encoding's last, empty chunk)
# is read, for at most this long, so the connection can carry the next
# request: one given back half read is closed, and the next request then pays
# a new connection on the client and on vLLM's API server (the process that
# streams every token; at 100+ requests/s that load is not the bench client's,
# which reads every body to its end).
_DRAIN_AFTER_DONE_S = 1.0


async def _rest(parts: Any) -> None:
    async for _ in parts:
        pass


async def _drain(rest: Any) -> None:
    """Read what follows [DONE] (see _DRAIN_AFTER_DONE_S); a server that
    keeps the stream open past it only costs its connection."""
    try:
        await asyncio.wait_for(rest, _DRAIN_AFTER_DONE_S)
    except (asyncio.TimeoutError, httpx.HTTPError, OSError):
        pass
    except Exception as exc:  # aiohttp's own errors, without importing it here
        if not _is_aiohttp_error(exc):
            raise


async def stream_request(client: Any, url: str, request: ProbeRequest, model: str,
                         *, on_text: Callable[[str], None] | None = None,
                         read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                         total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT_S) -> ProbeResult:
    """Send one streaming request on `client` (from new_async_client: an
    httpx.AsyncClient or an aiohttp.ClientSession) and time it. Never raises
    for server or network trouble (asyncio.CancelledError does propagate).

    The timed span starts when the request is handed to the connection (the
    body is encoded before), so a warm client on an open connection times
    the server, not our set-up."""
    target = base_url(url) + request.path
    payload = json.dumps(request.body(model)).encode()
    state = StreamState(t_start=time.perf_counter(), chat=request.chat, on_text=on_text)
    call = _StreamCall(client, target, payload, state, read_timeout)
    try:
        if total_timeout:
            await asyncio.wait_for(call.send(), total_timeout)
        else:
            await call.send()
    except asyncio.TimeoutError:
        call.error = ProbeError(ProbeErrorKind.TIMEOUT, f"the request did not finish within {total_timeout:g} s")
    t_end = time.perf_counter()
    for ev in call.parser.close():
        state.handle(decode_payload(ev.data), t_end)
    state.non_sse_lines = call.parser.non_sse_lines
    state.oversized_lines = call.parser.oversized_lines
    return _finish(state, request, model, t_end, call.error, call.started_at)


class _StreamCall:
    """One streamed request's exchange with the server (httpx or aiohttp):
    the clock started as the request goes out, each read's events handed to
    the StreamState with the read's time, an error answer or a transport
    failure kept as `error`."""

    def __init__(self, client: Any, target: str, payload: bytes, state: StreamState, read_timeout: float) -> None:
        self.client, self.target, self.payload = client, target, payload
        self.state = state
        self.read_timeout = read_timeout
        self.started_at = time.time()
        self.error: ProbeError | None = None
        self.answered = False  # the server's status line arrived
        self.parser = SSEParser()

    def take(self, part: bytes, t: float) -> None:
        events = self.parser.feed(part)
        if events:
            self.state.handle_read([decode_payload(ev.data) for ev in events], t)

    def start_clock(self) -> None:
        self.state.t_start = time.perf_counter()
        self.started_at = time.time()

    async def send(self) -> None:
        run = self.run_httpx if isinstance(self.client, httpx.AsyncClient) else self.run_aiohttp
        for attempt in range(2):
            try:
                await run()
                return
            except Exception as exc:
                self.error = self.transport_error(exc)
                if self.error is None:
                    raise
            # A kept-alive connection that the server closed as the request
            # went out on it fails before any answer (a keep-alive timeout
            # racing the request, or a server that closes without saying so).
            # Nothing was answered, so the request goes out again, once, on a
            # new connection; a server that really dropped it fails again.
            if self.answered or self.error.kind is not ProbeErrorKind.DISCONNECTED or attempt == 1:
                return
            self.error = None

    def transport_error(self, exc: Exception) -> ProbeError | None:
        # aiohttp's read/connect timeouts are TimeoutErrors, and TimeoutError is an OSError
        if isinstance(exc, (httpx.HTTPError, OSError)) or _is_aiohttp_error(exc):
            return classify_exception(exc, self.target, self.state.tokens_seen, self.read_timeout)
        return None

    async def run_httpx(self) -> None:
        req = self.client.build_request("POST", self.target, content=self.payload, headers=_JSON_HEADERS)
        self.start_clock()
        resp = await self.client.send(req, stream=True)
        self.answered = True
        try:
            if resp.status_code != 200:
                raw = b""
                async for part in resp.aiter_raw():
                    raw += part
                    if len(raw) > _MAX_ERROR_BODY:
                        break
                self.error = error_from_response(resp.status_code, raw.decode("utf-8", "replace"), self.target)
                return
            self.error = not_an_event_stream(resp.status_code, resp.headers.get("content-type"))
            if self.error is not None:
                return
            parts = resp.aiter_raw()
            async for part in parts:
                self.take(part, time.perf_counter())
                if self.state.done:
                    break
            if self.state.done:
                await _drain(_rest(parts))
        finally:
            await resp.aclose()

    async def run_aiohttp(self) -> None:
        self.start_clock()
        async with self.client.post(self.target, data=self.payload, headers=_JSON_HEADERS) as resp:
            self.answered = True
            if resp.status != 200:
                raw = await resp.content.read(_MAX_ERROR_BODY)
                self.error = error_from_response(resp.status, raw.decode("utf-8", "replace"), self.target)
                return
            self.error = not_an_event_stream(resp.status, resp.headers.get("Content-Type"))
            if self.error is not None:
                return
            # iter_any: whatever arrived in one read, so a read's events share its time
            async for part in resp.content.iter_any():
                self.take(part, time.perf_counter())
                if self.state.done:
                    break
            if self.state.done and not resp.content.at_eof():
                await _drain(resp.content.read())


async def probe_async(url: str, request: ProbeRequest, *, api_key: str | None = None,
                      on_text: Callable[[str], None] | None = None,
                      cancel: threading.Event | None = None,
                      read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                      total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT_S) -> ProbeResult:
    """One probe from inside an event loop (e.g. a Textual worker).

    The client is warmed first (warm_client, which also finds the model when
    none is named), so the timed request goes out on an open connection."""
    model = request.model
    async with new_async_client(api_key, read_timeout, max_connections=2) as client:
        async def measured() -> ProbeResult:
            try:
                served = await warm_client(client, url, model, timeout=min(read_timeout, WARM_TIMEOUT_S))
            except ProbeFailure as exc:
                return ProbeResult(ok=False, model=None, endpoint=request.path, error=exc.error)
            assert served is not None
            return await stream_request(client, url, request, served.id, on_text=on_text,
                                        read_timeout=read_timeout, total_timeout=total_timeout)

        task = asyncio.ensure_future(measured())
        if cancel is None:
            return await task
        while not task.done():
            if cancel.is_set():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                return ProbeResult(ok=False, model=model, endpoint=request.path,
                                   error=ProbeError(ProbeErrorKind.CANCELLED, "cancelled"))
            await asyncio.wait({task}, timeout=0.05)
        return task.result()


def run_probe(url: str, prompt: str | None = None, *, request: ProbeRequest | None = None,
              api_key: str | None = None, on_text: Callable[[str], None] | None = None,
              cancel: threading.Event | None = None,
              read_timeout: float = DEFAULT_READ_TIMEOUT_S,
              total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT_S, **settings: Any) -> ProbeResult:
    """Blocking probe, for the CLI and for worker threads (not for a thread
    that already runs an event loop: use probe_async there).

    settings: max_tokens, temperature, top_p, stop_token_ids, chat, model,
    ignore_eos, extra — as ProbeRequest.
    """
    if request is None:
        if prompt is None:
            raise ValueError("give a prompt or a ProbeRequest")
        request = ProbeRequest(prompt=prompt, **settings)
    with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
        return runner.run(probe_async(url, request, api_key=api_key, on_text=on_text, cancel=cancel,
                                      read_timeout=read_timeout, total_timeout=total_timeout))


def probe_error_lines(r: ProbeResult) -> list[str]:
    """What went wrong, its kind first ("connection_refused: connection
    refused by ..."), and the model's limit for a prompt too long; [] when
    nothing did. The CLI prints them as its errors (`ernie-tui: error: ...`)."""
    if not r.error:
        return []
    lines = [f"{r.error.kind}: {r.error.message}"]
    if r.error.kind is ProbeErrorKind.PROMPT_TOO_LONG and r.error.max_model_len:
        extra = f"; the prompt has {r.error.prompt_tokens}" if r.error.prompt_tokens else ""
        lines.append(f"the model's limit (max_model_len) is {r.error.max_model_len} tokens{extra}")
    return lines


def format_probe(r: ProbeResult, errors: bool = True) -> str:
    """A few plain lines for a terminal; `errors=False` leaves out the
    error lines (probe_error_lines), for a caller that prints them apart."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    def num(v: float | None, unit: str = "") -> str:
        return "-" if v is None else f"{v:.1f}{unit}"

    said = probe_error_lines(r) if errors else []
    lines = [f"error: {said[0]}", *said[1:]] if said else []
    if r.error and r.chunks == 0:
        return "\n".join(lines)  # nothing was measured; figures of dashes only add noise
    lines.append(f"model {r.model}  endpoint {r.endpoint}  finish_reason {r.finish_reason or '-'}")
    lines.append(f"TTFT {ms(r.ttft_s)}  ITL mean {ms(r.itl_mean_s)}  p90 {ms(r.itl_p90_s)}  "
                 f"latency {ms(r.latency_s)}")
    lines.append(f"tokens prompt {r.prompt_tokens if r.prompt_tokens is not None else '-'}  "
                 f"completion {r.completion_tokens if r.completion_tokens is not None else '-'}  "
                 f"output {num(r.output_tps, ' tok/s')}  decode {num(r.decode_tps, ' tok/s')}")
    if r.malformed_lines:
        lines.append(f"{r.malformed_lines} malformed stream line(s) skipped")
    return "\n".join(lines)


__all__ = [
    "BuiltPrompt", "CHINESE_PROMPT", "DEFAULT_MAX_TOKENS", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_P", "DONE",
    "LONG_PROMPT_TOKENS", "LocalTokenizer", "ProbeError", "ProbeFailure", "ProbeRequest", "ProbeResult",
    "PromptBuilder", "READY_PROMPTS", "SHORT_PROMPT", "SSEEvent", "SSEParser", "ServedModel",
    "ServerTokenizer", "StreamState", "base_url", "decode_payload", "error_from_response", "find_tokenizer",
    "format_probe", "list_models", "long_prompt", "parse_too_long", "probe_async", "probe_error_lines",
    "ready_prompt",
    "resolve_model", "run_probe", "stream_request", "new_async_client", "warm_client", "fast_loop_factory",
    "TRANSPORTS",
]


