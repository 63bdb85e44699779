"""One streaming request against a vLLM server, timed token by token.

The probe sends a completions or chat request with ``stream: true`` and
``stream_options: {"include_usage": true, "continuous_usage_stats": true}``.
The second option is vLLM's: every chunk then carries the running token
count, so we know exactly how many tokens each chunk holds even when vLLM
merges several into one chunk (it does when the client reads slower than the
engine produces). Servers that ignore it still work; each content chunk is
then counted as one token and the final usage chunk corrects the total.

Timing definitions (all client-side, time.perf_counter):
- TTFT: request sent -> arrival of the first chunk that carries a generated
  token (the chat endpoint's opening role-only chunk does not count). A
  probe first warms its client (warm_client: a GET /v1/models on the same
  connection), so connecting and first-use costs are outside the span.
- Inter-token latency (ITL): the gap between two reads, split evenly over
  all the tokens the later read delivered (however many events they came
  in), so the ITLs of a request always sum to (last token - first token),
  as vLLM's own histogram does. Tokens that arrive in the *first* read get
  no ITL (their times are unknown).
- Latency: request sent -> end of stream.
- output_tps: completion tokens / latency (what a caller waits for);
  decode_tps: (completion tokens - 1) / (last token - first token).

Errors never raise out of the probe functions: they come back as a
ProbeResult whose ``error`` says what happened in plain words (prompt too
long with the model's limit, 5xx, refused connection, timeout, server gone
mid-stream). Reads have a timeout and the whole request a deadline, so a
wedged server cannot hang the caller.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ernie_tui.engine_ctl import stats

# The source articles' Chainlit page used these sampling settings.
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9

DEFAULT_CONNECT_TIMEOUT_S = 5.0
# vLLM sends nothing while a request waits in its queue or is prefilled, so
# the read timeout must cover the longest expected wait for the first token.
DEFAULT_READ_TIMEOUT_S = 60.0
DEFAULT_TOTAL_TIMEOUT_S = 600.0

SHORT_PROMPT = "Explain in two sentences what the KV cache of a large language model is for."
CHINESE_PROMPT = "请用一句话介绍ERNIE系列模型的特点。"
LONG_PROMPT_TOKENS = 1500

# Readable filler for long prompts; whatever of it the tokenizer keeps as
# clean word tokens is cycled to the wanted length.
_FILLER = (
    "the model reads a long prompt and the engine splits it into blocks of the cache so that each "
    "request can share memory with other requests in the same batch while the server keeps the "
    "queue short and the latency low for every question that arrives before the answer is ready "
    "please write a short summary of the story about the river the mountain and the city at night "
    "and explain how the speed of the first token depends on the length of the prompt and the size "
    "of the batch when many requests stream their answers at the same time"
)

# A response body we read for an error message; bigger bodies are cut.
_MAX_ERROR_BODY = 64 * 1024
# A single SSE line larger than this is not something vLLM sends; drop it
# rather than grow memory without bound.
MAX_SSE_LINE = 16 * 1024 * 1024


# ---------------------------------------------------------------------------
# URLs and the model list

def base_url(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000' (we add the paths ourselves)."""
    u = url.strip().rstrip("/")
    for suffix in ("/v1/completions", "/v1/chat/completions", "/metrics", "/v1"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    if "://" not in u:
        u = "http://" + u
    return u


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None = None  # vLLM: the --model argument (a local dir or a hub id)
    max_model_len: int | None = None


def list_models(url: str, api_key: str | None = None, timeout: float = 5.0) -> list[ServedModel]:
    """The server's /v1/models. Raises ProbeFailure with a plain message."""
    target = base_url(url) + "/v1/models"
    try:
        r = httpx.get(target, headers=auth_headers(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise ProbeFailure(classify_exception(exc, target)) from exc
    return _models_from_response(r.status_code, r.text, target)


def _models_from_response(status: int, body: str, target: str) -> list[ServedModel]:
    if status != 200:
        raise ProbeFailure(error_from_response(status, body, target))
    try:
        data = json.loads(body).get("data") or []
    except (ValueError, AttributeError) as exc:
        raise ProbeFailure(ProbeError("bad_response", f"{target} did not return JSON")) from exc
    out = []
    for m in data:
        if isinstance(m, dict) and m.get("id"):
            mml = m.get("max_model_len")
            out.append(ServedModel(str(m["id"]), m.get("root"), int(mml) if isinstance(mml, int) else None))
    return out


# A warm-up GET that takes longer than this is given up (the timed request
# then opens its own connection, as before).
WARM_TIMEOUT_S = 2.0


async def warm_client(client: Any, url: str, model: str | None = None, *,
                      timeout: float = WARM_TIMEOUT_S) -> ServedModel | None:
    """Open a connection on `client` (from new_async_client) and pay its
    first-use costs with a cheap GET /v1/models, so that a timed request
    that follows goes out on an open, warm connection: a cold client reads
    TTFT 20-30 ms late on localhost (connect, the HTTP stack's first-request
    set-up). Returns the model to use: `model` as the server lists it (or
    as given), else the first one listed. Raises ProbeFailure only when no
    model was named and the list cannot be had."""
    target = base_url(url) + "/v1/models"

    async def get() -> tuple[int, str]:
        if isinstance(client, httpx.AsyncClient):
            r = await client.get(target)
            return r.status_code, r.text
        async with client.get(target) as r:
            return r.status, await r.text(errors="replace")

    try:
        status, body = await asyncio.wait_for(get(), timeout)
        models = _models_from_response(status, body, target)
    except ProbeFailure:
        if model:
            return ServedModel(model)
        raise
    except asyncio.TimeoutError as exc:
        if model:
            return ServedModel(model)
        raise ProbeFailure(ProbeError("timeout", f"{target} did not answer within {timeout:g} s")) from exc
    except Exception as exc:  # httpx, aiohttp or OSError; CancelledError is not an Exception
        if model:
            return ServedModel(model)
        raise ProbeFailure(classify_exception(exc, target)) from exc
    if model:
        return next((m for m in models if m.id == model), ServedModel(model))
    if not models:
        raise ProbeFailure(ProbeError("bad_response", f"{target} lists no model"))
    return models[0]


def resolve_model(url: str, model: str | None = None, api_key: str | None = None,
                  timeout: float = 5.0) -> ServedModel:
    """The model to talk to: `model` if given (looked up for its root), else
    the first one the server serves."""
    try:
        models = list_models(url, api_key, timeout)
    except ProbeFailure:
        if model:
            return ServedModel(model)  # the request itself will report the problem
        raise
    if model:
        for m in models:
            if m.id == model:
                return m
        return ServedModel(model)
    if not models:
        raise ProbeFailure(ProbeError("bad_response", f"{base_url(url)}/v1/models lists no model"))
    return models[0]


# ---------------------------------------------------------------------------
# Errors

@dataclass
class ProbeError:
    """What went wrong, for people. `kind` is one of: prompt_too_long,
    bad_request, unauthorized, not_found, server_error, http_error,
    connection_refused, connect_error, timeout, disconnected, stream_error,
    bad_response, cancelled."""

    kind: str
    message: str
    status: int | None = None
    max_model_len: int | None = None  # prompt_too_long: the model's limit, from vLLM's message
    prompt_tokens: int | None = None  # prompt_too_long: the prompt's size as vLLM counted it

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ProbeFailure(Exception):
    """Raised only by the helpers (model lookup, prompt building); the probe
    and burst functions turn it into a ProbeResult error."""

    def __init__(self, error: ProbeError) -> None:
        super().__init__(error.message)
        self.error = error


_LIMIT_PATTERNS = [
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"maximum model length (?:is |of )?(\d+)", re.I),
    re.compile(r"exceeds? (?:the )?limit of (\d+)", re.I),
    re.compile(r"max_model_len[^\d]{0,20}(\d+)", re.I),
]
_PROMPT_PATTERNS = [
    re.compile(r"prompt contains (?:at least )?(\d+) (?:input )?tokens", re.I),
    re.compile(r"\((\d+) in the messages", re.I),
    re.compile(r"prompt \(length (\d+)\)", re.I),
    re.compile(r"input prompt \((\d+) tokens\)", re.I),
    re.compile(r"parameter=input_tokens, value=(\d+)", re.I),
]


def parse_too_long(message: str) -> tuple[int | None, int | None]:
    """(max_model_len, prompt_tokens) from vLLM's 'too long' messages, across
    the wordings vLLM has used (None where a figure is not in the text)."""
    limit = next((int(m.group(1)) for p in _LIMIT_PATTERNS if (m := p.search(message))), None)
    prompt = next((int(m.group(1)) for p in _PROMPT_PATTERNS if (m := p.search(message))), None)
    return limit, prompt


def _looks_too_long(message: str) -> bool:
    m = message.lower()
    return ("context length" in m or "too long" in m or "maximum model length" in m
            or "max_model_len" in m or "reduce the length" in m)


def _error_message_from_body(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return str(msg)
        elif isinstance(err, str):
            return err
        if "detail" in data:
            return str(data["detail"])
    return body.strip()[:500]


def error_from_response(status: int, body: str, target: str = "") -> ProbeError:
    msg = _error_message_from_body(body)
    if status == 400 and _looks_too_long(msg):
        limit, prompt = parse_too_long(msg)
        return ProbeError("prompt_too_long", msg, status, max_model_len=limit, prompt_tokens=prompt)
    if status == 400 or status == 422:
        return ProbeError("bad_request", f"HTTP {status}: {msg}", status)
    if status in (401, 403):
        return ProbeError("unauthorized", f"HTTP {status}: {msg} (set the API key's environment variable)", status)
    if status == 404:
        return ProbeError("not_found", f"HTTP 404: {msg}", status)
    if status >= 500:
        return ProbeError("server_error", f"HTTP {status} from the server: {msg}", status)
    return ProbeError("http_error", f"HTTP {status}: {msg}", status)


def _refused(exc: BaseException) -> bool:
    # The async transport words it "All connection attempts failed" and keeps
    # the ConnectionRefusedError (or an OSError group holding it) as the cause.
    seen = 0
    todo: list[BaseException | None] = [exc]
    while todo and seen < 20:
        e = todo.pop()
        if e is None:
            continue
        seen += 1
        if isinstance(e, ConnectionRefusedError) or "refused" in str(e).lower() or "errno 111" in str(e).lower():
            return True
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
    return False


def _is_aiohttp_error(exc: BaseException) -> bool:
    aiohttp = sys.modules.get("aiohttp")  # only loaded when a burst made a session
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _classify_aiohttp(exc: BaseException, target: str, tokens_so_far: int,
                      read_timeout: float | None) -> ProbeError | None:
    """The same kinds as for httpx, from aiohttp's exception classes."""
    import aiohttp

    text = str(exc) or type(exc).__name__
    where = "before answering" if tokens_so_far == 0 else f"mid-stream after {tokens_so_far} tokens"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ProbeError("timeout", f"connecting to {target} timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):
        if _refused(exc):
            return ProbeError("connection_refused",
                              f"connection refused by {target} (is the server running on that port?)")
        return ProbeError("connect_error", f"cannot connect to {target}: {text}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        waited = f" for {read_timeout:g} s" if read_timeout else ""
        first = "before the first token" if tokens_so_far == 0 else f"after {tokens_so_far} tokens"
        return ProbeError("timeout", f"the server sent nothing{waited} {first}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return ProbeError("disconnected", f"the server closed the connection {where} (did it die?): {text}")
    if isinstance(exc, aiohttp.ClientError):
        return ProbeError("connect_error", f"request to {target} failed: {text}")
    return None


def classify_exception(exc: BaseException, target: str, tokens_so_far: int = 0,
                       read_timeout: float | None = None) -> ProbeError:
    text = str(exc) or type(exc).__name__
    if _is_aiohttp_error(exc):
        err = _classify_aiohttp(exc, target, tokens_so_far, read_timeout)
        if err is not None:
            return err
    if isinstance(exc, ConnectionRefusedError):
        return ProbeError("connection_refused",
                          f"connection refused by {target} (is the server running on that port?)")
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        where = "before answering" if tokens_so_far == 0 else f"mid-stream after {tokens_so_far} tokens"
        return ProbeError("disconnected", f"the server closed the connection {where} (did it die?): {text}")
    if isinstance(exc, OSError):
        return ProbeError("connect_error", f"request to {target} failed: {text}")
    if isinstance(exc, httpx.ConnectTimeout):
        return ProbeError("timeout", f"connecting to {target} timed out")
    if isinstance(exc, httpx.ConnectError):
        if _refused(exc):
            return ProbeError("connection_refused",
                              f"connection refused by {target} (is the server running on that port?)")
        return ProbeError("connect_error", f"cannot connect to {target}: {text}")
    if isinstance(exc, httpx.TimeoutException):
        waited = f" for {read_timeout:g} s" if read_timeout else ""
        where = "before the first token" if tokens_so_far == 0 else f"after {tokens_so_far} tokens"
        return ProbeError("timeout", f"the server sent nothing{waited} {where}")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        where = "before answering" if tokens_so_far == 0 else f"mid-stream after {tokens_so_far} tokens"
        return ProbeError("disconnected", f"the server closed the connection {where} (did it die?): {text}")
    if isinstance(exc, httpx.HTTPError):
        return ProbeError("connect_error", f"request to {target} failed: {text}")
    return ProbeError("stream_error", f"{type(exc).__name__}: {text}")


# ---------------------------------------------------------------------------
# SSE parsing

@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    """Incremental Server-Sent Events parser (the WHATWG rules, tolerant).

    Feed it bytes as they arrive; it returns complete events. Lines may end
    in \\n, \\r\\n or \\r and may be split anywhere across feeds (also inside
    a UTF-8 sequence: lines are decoded only once complete). Comment lines
    (':' keep-alives) are counted and skipped, unknown fields ignored, bytes
    that are not UTF-8 replaced. A line longer than `max_line` is dropped and
    counted as malformed instead of growing memory.
    """

    def __init__(self, max_line: int = MAX_SSE_LINE) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._skip_to_eol = False
        self._pending_cr = False
        self.max_line = max_line
        self.comments = 0
        self.oversized_lines = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        if self._pending_cr:
            # A \r ended the previous feed; a \n starting this one belongs to it.
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        if b"\r" not in buf:
            return self._feed_lf(events)
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl != -1 else n)
            if cr != -1:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt:nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif nl != -1:
                end, nxt = nl, nl + 1
            else:
                break
            line = bytes(buf[start:end])
            start = nxt
            if self._skip_to_eol:
                self._skip_to_eol = False
                continue
            ev = self._line(line.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        del buf[:start]
        if len(buf) > self.max_line:
            buf.clear()
            self._skip_to_eol = True
            self.oversized_lines += 1
        return events

    def _feed_lf(self, events: list[SSEEvent]) -> list[SSEEvent]:
        """The common case, \n line ends only (what vLLM sends): one split
        instead of a search per line; a third of the parser's CPU per event."""
        lines = self._buf.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if self._skip_to_eol:
                self._skip_to_eol = False
                continue
            ev = self._line(line.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        if len(rest) > self.max_line:
            rest = b""
            self._skip_to_eol = True
            self.oversized_lines += 1
        self._buf = bytearray(rest)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event not followed by a blank line still counts
        (some proxies drop the final blank line)."""
        events: list[SSEEvent] = []
        if self._buf and not self._skip_to_eol:
            ev = self._line(self._buf.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
        self._buf.clear()
        ev = self._dispatch()
        if ev is not None:
            events.append(ev)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        # 'retry' and unknown fields: nothing to do for a one-shot stream.
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = None
            return None
        ev = SSEEvent("\n".join(self._data), self._event, self._id)
        self._data = []
        self._event = None
        return ev


DONE = object()  # the `data: [DONE]` sentinel


def decode_payload(data: str) -> dict | object | None:
    """JSON object of one event, DONE for `[DONE]`, None if malformed."""
    s = data.strip()
    if s == "[DONE]":
        return DONE
    if not s:
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


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
    chunks: int = 0
    malformed: int = 0
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

        Their tokens are counted first and the gap since the previous read is
        then spread over all of them: giving the whole gap to the first event
        and 0 to the others (they were merged by the network, the server or a
        busy client, not generated at once) would read ITL percentiles as 0
        and as a multiple of the true gap."""
        new = 0
        for payload in payloads:
            new += self._absorb(payload)
        if new <= 0:
            return
        if self.t_first is None:
            self.t_first = t
        elif self.t_last is not None:
            gap = (t - self.t_last) / new
            self.itls.extend([gap] * new)
        self.t_last = t

    def _absorb(self, payload: Any) -> int:
        """Take in one event; return how many generated tokens it brought."""
        if payload is DONE:
            self.done = True
            return 0
        if not isinstance(payload, dict):
            self.malformed += 1
            return 0
        if "error" in payload and not payload.get("choices"):
            err = payload["error"]
            msg = err.get("message") if isinstance(err, dict) else str(err)
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) else None
            if status == 400 and msg and _looks_too_long(msg):
                limit, prompt = parse_too_long(msg)
                self.stream_error = ProbeError("prompt_too_long", msg, 400, limit, prompt)
            else:
                self.stream_error = ProbeError("stream_error", f"the server reported an error mid-stream: {msg}",
                                               status)
            return 0
        self.chunks += 1
        usage = payload.get("usage")
        completion_total = None
        if isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int):
                self.usage_prompt_tokens = pt
            if isinstance(ct, int):
                self.usage_completion_tokens = ct
                completion_total = ct
        if isinstance(payload.get("metrics"), dict):
            self.server_metrics = payload["metrics"]
        choices = payload.get("choices")
        text = ""
        has_choice = False
        if isinstance(choices, list) and choices:
            ch = choices[0] if isinstance(choices[0], dict) else {}
            has_choice = True
            if self.chat:
                delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
                text = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
            else:
                text = ch.get("text") or ""
            if ch.get("finish_reason") is not None:
                self.finish_reason = ch.get("finish_reason")
                self.stop_reason = ch.get("stop_reason")
        if not has_choice:
            return 0  # the final usage-only chunk: no new token
        # How many tokens this chunk brought: exact with continuous usage stats,
        # otherwise one per non-empty chunk (the usage chunk fixes the total).
        if completion_total is not None:
            new = max(0, completion_total - self.tokens_seen)
        else:
            new = 1 if text else 0
        if text:
            self.text_parts.append(text)
            if self.on_text is not None:
                try:
                    self.on_text(text)
                except Exception:
                    pass  # a display callback must not kill the measurement
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
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the JSON body last

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "stream": True,
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
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


def _finish(state: StreamState, request: ProbeRequest, model: str, t_end: float,
            error: ProbeError | None, started_at: float) -> ProbeResult:
    completion = state.usage_completion_tokens if state.usage_completion_tokens is not None else (
        state.tokens_seen if state.chunks else None)
    latency = t_end - state.t_start
    ttft = None if state.t_first is None else state.t_first - state.t_start
    decode = None
    if completion and completion > 1 and state.t_first is not None and state.t_last is not None \
            and state.t_last > state.t_first:
        decode = (completion - 1) / (state.t_last - state.t_first)
    if error is None and state.stream_error is not None:
        error = state.stream_error
    if error is None and not state.done and state.finish_reason is None:
        where = "before any token" if state.tokens_seen == 0 else f"after {state.tokens_seen} tokens"
        error = ProbeError("disconnected", f"the stream ended {where} without finishing (did the server die?)")
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
        malformed_lines=state.malformed,
        got_done=state.done,
        error=error,
        itls=state.itls,
        started_at=started_at,
        t_start=state.t_start,
        server_metrics=state.server_metrics,
    )


def make_timeout(read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> httpx.Timeout:
    return httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=read_timeout)


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
    started_at = time.time()
    error: ProbeError | None = None
    parser = SSEParser()

    def take(part: bytes, t: float) -> None:
        events = parser.feed(part)
        if events:
            state.handle_read([decode_payload(ev.data) for ev in events], t)

    def start_clock() -> None:
        nonlocal started_at
        state.t_start = time.perf_counter()
        started_at = time.time()

    async def run_httpx() -> None:
        nonlocal error
        req = client.build_request("POST", target, content=payload, headers=_JSON_HEADERS)
        start_clock()
        resp = await client.send(req, stream=True)
        try:
            if resp.status_code != 200:
                raw = b""
                async for part in resp.aiter_raw():
                    raw += part
                    if len(raw) > _MAX_ERROR_BODY:
                        break
                error = error_from_response(resp.status_code, raw.decode("utf-8", "replace"), target)
                return
            async for part in resp.aiter_raw():
                take(part, time.perf_counter())
                if state.done:
                    break
        finally:
            await resp.aclose()

    async def run_aiohttp() -> None:
        nonlocal error
        start_clock()
        async with client.post(target, data=payload, headers=_JSON_HEADERS) as resp:
            if resp.status != 200:
                raw = await resp.content.read(_MAX_ERROR_BODY)
                error = error_from_response(resp.status, raw.decode("utf-8", "replace"), target)
                return
            # iter_any: whatever arrived in one read, so a read's events share its time
            async for part in resp.content.iter_any():
                take(part, time.perf_counter())
                if state.done:
                    break

    run = run_httpx if isinstance(client, httpx.AsyncClient) else run_aiohttp
    try:
        if total_timeout:
            await asyncio.wait_for(run(), total_timeout)
        else:
            await run()
    except asyncio.TimeoutError as exc:
        if _is_aiohttp_error(exc):  # aiohttp's read/connect timeouts are TimeoutErrors too
            error = classify_exception(exc, target, state.tokens_seen, read_timeout)
        else:
            error = ProbeError("timeout", f"the request did not finish within {total_timeout:g} s")
    except httpx.HTTPError as exc:
        error = classify_exception(exc, target, state.tokens_seen, read_timeout)
    except OSError as exc:
        error = classify_exception(exc, target, state.tokens_seen, read_timeout)
    except Exception as exc:
        if not _is_aiohttp_error(exc):
            raise
        error = classify_exception(exc, target, state.tokens_seen, read_timeout)
    t_end = time.perf_counter()
    for ev in parser.close():
        state.handle(decode_payload(ev.data), t_end)
    result = _finish(state, request, model, t_end, error, started_at)
    result.malformed_lines = state.malformed + parser.oversized_lines
    return result


_JSON_HEADERS = {"Content-Type": "application/json"}

TRANSPORTS = ("httpx", "aiohttp")


def new_async_client(api_key: str | None = None, read_timeout: float = DEFAULT_READ_TIMEOUT_S,
                     connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                     max_connections: int = 16, *, transport: str = "aiohttp") -> Any:
    """A client for stream_request and warm_client, used as
    `async with new_async_client(...) as c` inside a running event loop.

    transport "aiohttp" (the default; an aiohttp.ClientSession): its C HTTP
    parser costs about a third of httpx's CPU per streamed token
    (bench/client_cpu.py, docs/benchmarks.md), and one read of it hands over
    everything that arrived, so the events of one read share one timestamp
    and their gap is spread over their tokens. "httpx" (an
    httpx.AsyncClient, the client before) hands over one HTTP chunk at a
    time: chunks that arrived together get timestamps microseconds apart,
    which reads as near-zero ITLs after any stall of the client.
    """
    # No proxies from the environment: a probe measures this server, and an
    # HTTP(S)_PROXY meant for the internet would distort or break it.
    if transport == "aiohttp":
        import aiohttp

        return aiohttp.ClientSession(
            headers=auth_headers(api_key), trust_env=False,
            # total=None: stream_request applies its own deadline per request
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout),
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=60))
    if transport != "httpx":
        raise ValueError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    return httpx.AsyncClient(timeout=make_timeout(read_timeout, connect_timeout),
                             headers=auth_headers(api_key), trust_env=False,
                             limits=httpx.Limits(max_connections=max_connections,
                                                 max_keepalive_connections=max_connections))


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
                                   error=ProbeError("cancelled", "cancelled"))
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


def fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop if installed (about a quarter less client CPU per
    streamed token than asyncio's, bench/client_cpu.py), else None: asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# ---------------------------------------------------------------------------
# Prompts of an exact token length

class LocalTokenizer:
    """The served model's own tokenizer.json, via the `tokenizers` library."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        self.path = p
        self._tok = Tokenizer.from_file(str(p))

    def encode(self, text: str) -> list[int]:
        # add_special_tokens=True: vLLM's completions endpoint adds them too
        # (e.g. a BOS), and the server's count is the one that matters.
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def special_ids(self) -> set[int]:
        try:
            return set(self._tok.get_added_tokens_decoder().keys())
        except AttributeError:  # very old tokenizers
            return set()

    def candidate_ids(self, limit: int = 4000) -> list[int]:
        """Ids whose token decodes to a plain word (letters/digits), so built
        prompts read as words and re-tokenize predictably."""
        special = self.special_ids()
        vocab = self._tok.get_vocab(with_added_tokens=False)
        out = []
        for _tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            if i in special:
                continue
            word = self._tok.decode([i], skip_special_tokens=True).strip()
            if len(word) >= 2 and word.isascii() and word.isalnum():
                out.append(i)
                if len(out) >= limit:
                    break
        return out


class ServerTokenizer:
    """vLLM's /tokenize and /detokenize: exact for whatever the server runs,
    for when its tokenizer.json is not on this machine."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        self.url = base_url(url)
        self.model = model
        self._client = httpx.Client(timeout=timeout, headers=auth_headers(api_key), trust_env=False)

    def _post(self, path: str, body: dict) -> dict:
        try:
            r = self._client.post(self.url + path, json={"model": self.model, **body})
        except httpx.HTTPError as exc:
            raise ProbeFailure(classify_exception(exc, self.url + path)) from exc
        if r.status_code != 200:
            raise ProbeFailure(error_from_response(r.status_code, r.text, self.url + path))
        return r.json()

    def encode(self, text: str) -> list[int]:
        return list(self._post("/tokenize", {"prompt": text, "add_special_tokens": True})["tokens"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._post("/detokenize", {"tokens": list(ids)})["prompt"])

    def candidate_ids(self, limit: int = 4000) -> list[int]:
        ids = []
        for word in set(_FILLER.split()):
            toks = self.encode(" " + word)
            if len(toks) == 1:  # a whole word that is one token, and no BOS added
                ids.append(toks[0])
        return sorted(set(ids))[:limit]

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class BuiltPrompt:
    text: str
    tokens: int  # as the tokenizer counts it (special tokens included)
    target: int

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


class PromptBuilder:
    """Builds prompts of an exact token count for a given tokenizer.

    Start from word tokens (random ones, or a readable filler), decode to
    text, re-encode, and trim or top up until the re-encoded text has exactly
    the target length: decoding and re-encoding is not always an identity
    (merges across word borders, an added BOS), so the count is always taken
    from the re-encoded text, never assumed.
    """

    def __init__(self, tokenizer: Any, seed: int = 0) -> None:
        import random

        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self._pool: list[int] | None = None
        self._overhead: int | None = None

    @property
    def pool(self) -> list[int]:
        if self._pool is None:
            self._pool = self.tokenizer.candidate_ids()
            if not self._pool:
                raise ProbeFailure(ProbeError("bad_response", "the tokenizer has no plain word tokens to build prompts from"))
        return self._pool

    @property
    def overhead(self) -> int:
        """Tokens the tokenizer adds to any text (BOS etc.)."""
        if self._overhead is None:
            self._overhead = len(self.tokenizer.encode(""))
        return self._overhead

    def build(self, n_tokens: int, filler: str | None = None, max_rounds: int = 12) -> BuiltPrompt:
        if n_tokens < 1:
            raise ValueError("a prompt needs at least one token")
        want = max(1, n_tokens - self.overhead)
        if filler:
            pool = set(self.pool)
            src = [i for i in self.tokenizer.encode(filler) if i in pool] or self.pool
            ids = [src[k % len(src)] for k in range(want)]
        else:
            ids = [self.rng.choice(self.pool) for _ in range(want)]
        best: BuiltPrompt | None = None
        for _ in range(max_rounds):
            text = self.tokenizer.decode(ids)
            count = len(self.tokenizer.encode(text))
            cand = BuiltPrompt(text, count, n_tokens)
            if best is None or abs(count - n_tokens) < abs(best.tokens - n_tokens):
                best = cand
            if count == n_tokens:
                return cand
            if count > n_tokens:
                drop = count - n_tokens
                ids = ids[: max(1, len(ids) - drop)]
            else:
                ids = ids + [self.rng.choice(self.pool) for _ in range(n_tokens - count)]
        assert best is not None
        return best


def find_tokenizer(model_dir: str | Path | None = None, tokenizer_path: str | Path | None = None,
                   url: str | None = None, model: str | None = None,
                   api_key: str | None = None) -> Any:
    """The best tokenizer we can get: an explicit tokenizer.json or model dir,
    else the server's own (/v1/models `root` if it is a local dir, else the
    /tokenize endpoint). Raises ProbeFailure if none works."""
    for p in (tokenizer_path, model_dir):
        if p:
            path = Path(p).expanduser()
            if path.is_dir():
                path = path / "tokenizer.json"
            if path.is_file():
                return LocalTokenizer(path)
            raise ProbeFailure(ProbeError("bad_request", f"no tokenizer.json at {path}"))
    if url:
        served = resolve_model(url, model, api_key)
        if served.root:
            cand = Path(served.root).expanduser() / "tokenizer.json"
            if cand.is_file():
                return LocalTokenizer(cand)
        return ServerTokenizer(url, served.id, api_key)
    raise ProbeFailure(ProbeError("bad_request", "no tokenizer: give a model dir, a tokenizer.json or a server URL"))


def long_prompt(tokenizer: Any, n_tokens: int = LONG_PROMPT_TOKENS) -> BuiltPrompt:
    """The ready-made long prompt: readable filler, exactly n_tokens long."""
    return PromptBuilder(tokenizer, seed=0).build(n_tokens, filler=_FILLER)


READY_PROMPTS = ("short", "chinese", "long")


def ready_prompt(name: str, tokenizer: Any = None) -> str:
    """'short', 'chinese' or 'long' (the long one needs the served model's
    tokenizer, see find_tokenizer)."""
    if name == "short":
        return SHORT_PROMPT
    if name == "chinese":
        return CHINESE_PROMPT
    if name == "long":
        if tokenizer is None:
            raise ValueError("the long prompt is built with the served model's tokenizer; pass one")
        return long_prompt(tokenizer).text
    raise ValueError(f"unknown ready-made prompt {name!r}; choose one of {', '.join(READY_PROMPTS)}")


def format_result(r: ProbeResult) -> str:
    """A few plain lines for a terminal."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    def num(v: float | None, unit: str = "") -> str:
        return "-" if v is None else f"{v:.1f}{unit}"

    lines = []
    if r.error:
        lines.append(f"error ({r.error.kind}): {r.error.message}")
        if r.error.kind == "prompt_too_long" and r.error.max_model_len:
            extra = f"; the prompt has {r.error.prompt_tokens}" if r.error.prompt_tokens else ""
            lines.append(f"the model's limit (max_model_len) is {r.error.max_model_len} tokens{extra}")
        if r.chunks == 0:
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
    "format_result", "list_models", "long_prompt", "parse_too_long", "probe_async", "ready_prompt",
    "resolve_model", "run_probe", "stream_request", "new_async_client", "warm_client", "fast_loop_factory",
    "TRANSPORTS",
]

